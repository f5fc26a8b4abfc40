//! The async face's quorum lock: [`AsyncRedlock`] carries out the rounds of
//! [`crate::proto::redlock::Attempts`] on tokio.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Cmd, Value};

use super::client::AsyncLockClient;
use super::conn::{on_all, on_dedicated, Behind, ReleaseOnCancel};
use super::guard::{AsyncLockGuard, LostSignal};
use super::multi::{acquire_all, AsyncMultiGuard};
use crate::proto::redlock::{no_servers, Attempts, Sending, Settings, Step};
use crate::proto::reply::WAIT_REPLY_MARGIN;
use crate::{Acquire, LockError, LockInfo, Outcome, WaitStrategy};

/// Redlock on tokio: one lock over N independent servers (N/2+1 must grant), each reached
/// through an [`AsyncLockClient`] of its own (one shared connection, dedicated ones for
/// waits). Cheap to clone. Waits as its [`WaitStrategy`] says: by default queued on one
/// server with the module's `WAIT` (see [`WaitStrategy::Queue`]). Locks only: it refuses
/// semaphore permits, explicit owners, [`Acquire::bind`] and [`Acquire::min_replicas`] with
/// [`LockError::InvalidRequest`], as the sync [`crate::Redlock`] does.
#[derive(Clone)]
pub struct AsyncRedlock {
    clients: Arc<[AsyncLockClient]>,
    settings: Settings,
}

impl AsyncRedlock {
    /// One server per URL; `per_instance_timeout` bounds connecting to and each reply from
    /// one server (the servers are asked at the same time).
    pub fn new<S: AsRef<str>>(
        urls: &[S],
        per_instance_timeout: Duration,
    ) -> Result<Self, LockError> {
        let clients = urls
            .iter()
            .map(|u| AsyncLockClient::new(u.as_ref(), per_instance_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        Self::of(clients)
    }

    /// The same over existing `redis::Client`s, one per server.
    pub fn from_clients(
        clients: Vec<redis::Client>,
        per_instance_timeout: Duration,
    ) -> Result<Self, LockError> {
        Self::of(
            clients
                .into_iter()
                .map(|c| AsyncLockClient::from_client(c, per_instance_timeout))
                .collect(),
        )
    }

    fn of(clients: Vec<AsyncLockClient>) -> Result<Self, LockError> {
        if clients.is_empty() {
            return Err(no_servers());
        }
        Ok(AsyncRedlock {
            clients: clients.into(),
            settings: Settings::default(),
        })
    }

    /// How an acquire with `wait` waits ([`WaitStrategy::Queue`] by default).
    pub fn wait_strategy(mut self, strategy: WaitStrategy) -> Self {
        self.settings.strategy = strategy;
        self
    }

    /// The random delay between polling attempts, in `[min, max)` (default 1 to 20 ms).
    pub fn retry_delay(mut self, min: Duration, max: Duration) -> Self {
        self.settings.set_retry_delay(min, max);
        self
    }

    /// Owners of this Redlock's guards start with `prefix` (then 32 random hex digits).
    pub fn owner_prefix(mut self, prefix: impl Into<String>) -> Result<Self, LockError> {
        self.settings.set_prefix(prefix.into())?;
        Ok(self)
    }

    /// How many servers must grant a lock.
    pub fn quorum(&self) -> usize {
        self.clients.len() / 2 + 1
    }

    /// `LOCK.INFO key` on every server, in order: (server, what it said).
    pub async fn info(&self, key: &str) -> Vec<(String, Result<Option<LockInfo>, LockError>)> {
        let mut out = Vec::with_capacity(self.clients.len());
        for c in self.clients.iter() {
            out.push((c.inner.name.clone(), c.info(key).await));
        }
        out
    }

    /// Acquires the lock on a majority. Without `wait`, one attempt; with it, attempts repeat
    /// until the wait is over, waiting in between as the [`WaitStrategy`] says. A failed
    /// attempt is released everywhere; a refusal ends the attempts at once. If this future is
    /// dropped midway, whatever the servers granted is released.
    pub async fn acquire(&self, key: &str, request: Acquire) -> Result<AsyncLockGuard, LockError> {
        let names = self.clients.iter().map(|c| c.inner.name.clone()).collect();
        let mut attempts = self
            .settings
            .attempts(key, request, names, false, Instant::now())?;
        let everywhere = self
            .clients
            .iter()
            .map(|c| (Behind::Shared(c.clone()), c.inner.timeout))
            .collect();
        let cancel = ReleaseOnCancel::new(everywhere, key, attempts.owner());
        let result = self.run(key, &mut attempts).await;
        cancel.disarm();
        result
    }

    /// Carries out the steps of `attempts` until a guard or a failure.
    async fn run(&self, key: &str, attempts: &mut Attempts) -> Result<AsyncLockGuard, LockError> {
        // The watchers' push counts before the round that grants.
        let pushes = || {
            self.clients
                .iter()
                .map(|c| c.inner.pushes())
                .collect::<Vec<u64>>()
        };
        let mut since = pushes();
        let mut step = attempts.start(Instant::now());
        loop {
            step = match step {
                Step::Send {
                    cmds,
                    wait: Some(slice),
                    what: Sending::QueueWait,
                } => {
                    since = pushes();
                    let replies = self.queue_wait(key, attempts.owner(), cmds, slice).await?;
                    attempts.replied(replies, Instant::now())
                }
                Step::Send { cmds, what, .. } => {
                    if what == Sending::Attempt {
                        since = pushes();
                    }
                    let replies = on_all(&self.clients, cmds, None).await;
                    attempts.replied(replies, Instant::now())
                }
                Step::Sleep(d) => {
                    tokio::time::sleep(d).await;
                    attempts.woke(Instant::now())
                }
                Step::Granted(grant) => {
                    return Ok(AsyncLockGuard::new(
                        Arc::clone(&self.clients),
                        key,
                        grant.owner,
                        attempts.request().clone(),
                        grant.tokens,
                        grant.valid_until,
                        None,
                        since,
                    ));
                }
                Step::Failed(e) => return Err(e),
            };
        }
    }

    /// A queued wait on the one server `cmds` names, over a dedicated connection (of the
    /// client's capped number), released behind the request if the acquire is cancelled.
    async fn queue_wait(
        &self,
        key: &str,
        owner: &str,
        cmds: Vec<Option<Cmd>>,
        slice: Duration,
    ) -> Result<Vec<Result<Value, Outcome>>, LockError> {
        let mut replies: Vec<Result<Value, Outcome>> = cmds
            .iter()
            .map(|_| Err(Outcome::Unreachable("not sent".into())))
            .collect();
        let Some((i, cmd)) = cmds
            .into_iter()
            .enumerate()
            .find_map(|(i, c)| c.map(|c| (i, c)))
        else {
            return Ok(replies);
        };
        let Some(client) = self.clients.get(i) else {
            return Ok(replies);
        };
        let _slot = client.inner.wait_slot(slice).await?;
        let reply = match client.inner.dedicated().await {
            Ok((conn, id)) => {
                let bound = slice.saturating_add(client.inner.timeout + WAIT_REPLY_MARGIN);
                // Cancelled during the wait: released behind it, on its connection.
                let behind = Behind::Waiting {
                    conn: conn.clone(),
                    id,
                    client: client.clone(),
                    route: Arc::default(),
                };
                let cancel = ReleaseOnCancel::new(vec![(behind, bound)], key, owner);
                let (conn, reply) = on_dedicated(conn, &cmd, bound).await;
                cancel.disarm();
                if let Some(conn) = conn {
                    client.inner.put_back(conn, id);
                }
                reply
            }
            Err(o) => Err(o),
        };
        if let Some(slot) = replies.get_mut(i) {
            *slot = reply;
        }
        Ok(replies)
    }

    /// As [`AsyncLockClient::using`], over the quorum lock: `work`'s value only if a majority
    /// held the lock until the release, else [`LockError::Lost`].
    pub async fn using<T, F, Fut>(
        &self,
        key: &str,
        request: Acquire,
        work: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(LostSignal) -> Fut,
        Fut: Future<Output = T>,
    {
        let acquired = self
            .acquire(key, crate::proto::watchdog::with_watchdog(request))
            .await;
        super::run_using(acquired, work).await
    }

    /// As [`AsyncLockClient::acquire_all`], with each key a quorum lock.
    pub async fn acquire_all<K: AsRef<str>>(
        &self,
        items: &[(K, Acquire)],
    ) -> Result<AsyncMultiGuard, LockError> {
        acquire_all(items, |key, request| async move {
            self.acquire(&key, request).await
        })
        .await
    }
}
