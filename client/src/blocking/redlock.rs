//! The sync face's quorum lock: [`Redlock`] carries out the rounds of
//! [`crate::proto::redlock::Attempts`] over blocking sockets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::guard::LockGuard;
use super::instance::{self, Instance};
use super::multi::{acquire_all, MultiGuard};
use super::servers::{no_links, Servers};
use crate::proto::redlock::{no_servers, Sending, Settings, Step};
use crate::proto::watchdog::with_watchdog;
use crate::{Acquire, LockError, LockInfo, Outcome, WaitStrategy};

/// Redlock: one lock over N independent servers (N/2+1 must grant it).
///
/// A `Redlock` can be shared by threads: every request takes its own connection to each
/// server (pooled, or a bound guard's own: see the [crate documentation](crate#connections)),
/// so concurrent requests
/// never wait for one another. It never blocks on a server while it holds the lock anywhere
/// (that could deadlock); how it waits is its [`WaitStrategy`].
#[derive(Clone)]
pub struct Redlock {
    servers: Arc<Servers>,
    settings: Settings,
}

impl Redlock {
    /// `per_instance_timeout` bounds connecting to and each reply from one server; a slow or
    /// dead server costs at most that, and the others are asked at the same time.
    pub fn new<S: AsRef<str>>(
        urls: &[S],
        per_instance_timeout: Duration,
    ) -> Result<Self, LockError> {
        let instances = urls
            .iter()
            .map(|u| Instance::new(u.as_ref(), per_instance_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        Self::of(instances)
    }

    /// The same over the servers existing `redis::Client`s connect to (their address, login,
    /// database and TLS settings); the Redlock opens connections of its own.
    pub fn from_clients(
        clients: &[redis::Client],
        per_instance_timeout: Duration,
    ) -> Result<Self, LockError> {
        let instances = clients
            .iter()
            .map(|c| Instance::from_info(c.get_connection_info().clone(), per_instance_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        Self::of(instances)
    }

    fn of(instances: Vec<Instance>) -> Result<Self, LockError> {
        if instances.is_empty() {
            return Err(no_servers());
        }
        Ok(Redlock {
            servers: Arc::new(Servers::new(instances)),
            settings: Settings::default(),
        })
    }

    /// Owners of this Redlock's guards start with `prefix` (then 32 random hex digits), so
    /// `LOCK.INFO` shows whose holds they are. Each guard still has an owner of its own
    /// (Redlock takes no fixed owner: see [`Acquire::owner`]). At most 992 bytes.
    pub fn owner_prefix(mut self, prefix: impl Into<String>) -> Result<Self, LockError> {
        self.settings.set_prefix(prefix.into())?;
        Ok(self)
    }

    /// How an acquire with `wait` waits ([`WaitStrategy::Queue`] by default).
    pub fn wait_strategy(mut self, strategy: WaitStrategy) -> Self {
        self.settings.strategy = strategy;
        self
    }

    /// How long to sleep between attempts: a random delay in `[min, max)` (default 1 to 20 ms),
    /// so that competing clients stop colliding.
    pub fn retry_delay(mut self, min: Duration, max: Duration) -> Self {
        self.settings.set_retry_delay(min, max);
        self
    }

    /// How many instances must grant a lock.
    pub fn quorum(&self) -> usize {
        self.servers.quorum
    }

    /// `LOCK.INFO key` on every server, in order: (server, what it said).
    pub fn info(&self, key: &str) -> Vec<(String, Result<Option<LockInfo>, LockError>)> {
        self.servers
            .instances
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name().to_string(), self.servers.info(i, key)))
            .collect()
    }

    /// As [`LockClient::using`](super::LockClient::using), over the quorum lock: `work`'s
    /// value only if a majority held the lock until the release, else [`LockError::Lost`].
    pub fn using<T>(
        &self,
        key: &str,
        request: Acquire,
        work: impl FnOnce(&LockGuard) -> T,
    ) -> Result<T, LockError> {
        super::run_using(self.acquire(key, with_watchdog(request)), work)
    }

    /// Acquires the lock on a majority. Without `wait`, one attempt; with it, attempts repeat
    /// until the wait is over, waiting in between as the [`WaitStrategy`] says. A failed
    /// attempt is released everywhere. A refusal (`Refused`, `Deadlock`, `WrongKind`,
    /// `CapacityMismatch`) ends the attempts at once.
    ///
    /// Semaphore permits ([`Acquire::permit`]) and explicit owners ([`Acquire::owner`]) are
    /// refused with [`LockError::InvalidRequest`] before anything is sent: a majority of
    /// independent semaphores does not bound the holders to the capacity (see
    /// [semaphores](crate#semaphores)).
    pub fn acquire(&self, key: &str, request: Acquire) -> Result<LockGuard, LockError> {
        let mut attempts =
            self.settings
                .attempts(key, request, self.servers.names(), true, Instant::now())?;
        let bind = attempts.request().bind;
        // A bound request's connections, kept from one attempt to the next.
        let mut links = bind.then(|| no_links(self.servers.instances.len()));
        // The watchers' push counts before the round that grants (see `Servers::watch`).
        let mut since = self.servers.pushes();
        let mut step = attempts.start(Instant::now());
        loop {
            step = match step {
                Step::Send { cmds, wait, what } => {
                    if matches!(what, Sending::Attempt | Sending::QueueWait) {
                        since = self.servers.pushes();
                    }
                    let replies = match (links.as_mut(), what) {
                        // Only attempts and their releases go over bound connections (a bound
                        // request never queues).
                        (Some(links), Sending::Attempt | Sending::Release) => {
                            instance::exchange(&self.servers.instances, links, &cmds, None)
                        }
                        (_, Sending::QueueWait) => {
                            // One server waits: on a connection of the capped number.
                            let server = cmds.iter().position(Option::is_some).unwrap_or(0);
                            let _slot = match self.servers.instances.get(server) {
                                Some(i) => Some(i.wait_slots.take(wait.unwrap_or_default())?),
                                None => None,
                            };
                            instance::scatter_gather(&self.servers.instances, &cmds, wait)
                        }
                        _ => instance::scatter_gather(&self.servers.instances, &cmds, wait),
                    };
                    attempts.replied(replies, Instant::now())
                }
                Step::Sleep(d) => {
                    std::thread::sleep(d);
                    attempts.woke(Instant::now())
                }
                Step::Granted(grant) => {
                    // A bound guard keeps the connections of the servers that granted; the
                    // others are closed (behind a release where a late grant may still come).
                    let kept = links.take().map(|all| {
                        let (kept, others): (Vec<_>, Vec<_>) = all
                            .into_iter()
                            .zip(&grant.outcomes)
                            .map(|(l, o)| match o {
                                Outcome::Granted(_) => (l, None),
                                _ => (None, l),
                            })
                            .unzip();
                        self.servers
                            .discard(others, &grant.outcomes, key, &grant.owner);
                        kept
                    });
                    return Ok(LockGuard::new(
                        Arc::clone(&self.servers),
                        key,
                        grant.owner,
                        attempts.request().clone(),
                        grant.tokens,
                        grant.valid_until,
                        kept,
                        &since,
                    ));
                }
                // A bound request's connections close here; its failed attempts were released.
                Step::Failed(e) => return Err(e),
            };
        }
    }

    /// As [`LockClient::acquire_all`](super::LockClient::acquire_all), with each key a quorum
    /// lock: keys in the global order, released together.
    pub fn acquire_all<K: AsRef<str>>(
        &self,
        items: &[(K, Acquire)],
    ) -> Result<MultiGuard, LockError> {
        acquire_all(items, |key, request| self.acquire(key, request))
    }
}
