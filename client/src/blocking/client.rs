//! The sync face's client for one server: [`LockClient`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use super::bound::BoundLink;
use super::guard::LockGuard;
use super::instance::Instance;
use super::multi::{acquire_all, MultiGuard};
use super::servers::{no_links, Servers};
use crate::proto::error::classify;
use crate::proto::lease::single_server_valid_until;
use crate::proto::reply::{acquire_outcome, error_outcome, millis, release_cmd, WAIT_REPLY_MARGIN};
use crate::proto::watchdog::with_watchdog;
use crate::{Acquire, LockError, LockInfo, Outcome, OwnerIdentity};

/// A lock client for one Redis server with the module loaded.
///
/// One `LockClient` can be shared by any number of threads (it is `Send + Sync`, and cheap to
/// clone: clones share the connections): short commands go through one connection (a further
/// one only while two run at the same moment) and every waiting acquire through a connection
/// of its own, so a wait never delays another thread's request, nor the extends and releases of
/// this client's guards. A bound acquire has a connection of its own for the guard's whole
/// life. See the [crate documentation](crate#connections).
#[derive(Clone)]
pub struct LockClient {
    servers: Arc<Servers>,
    owner: OwnerIdentity,
}

impl LockClient {
    /// `timeout` bounds connecting and each reply (a waiting acquire's reply may also take its
    /// wait and a one-second margin).
    /// Fails ([`LockError::Config`]) only on a malformed URL: the server is contacted on
    /// first use.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, LockError> {
        Ok(Self::of(Instance::new(url, timeout)?))
    }

    /// At most `limit` connections for waiting acquires (default
    /// [`crate::DEFAULT_WAIT_CONNECTIONS`]): a waiting acquire holds one while its request is
    /// out. When all are in use, further waits queue in the client, in arrival order, for what
    /// is left of their wait; one that gets no connection in time fails with
    /// [`LockError::WaitLimit`]. Acquires without a wait and bound holds (which have a
    /// connection of their own) are not limited. Set it on a new client, before cloning it.
    pub fn max_wait_connections(mut self, limit: usize) -> Self {
        if let Some(servers) = Arc::get_mut(&mut self.servers) {
            for i in &mut servers.instances {
                i.wait_slots = super::slots::WaitSlots::new(limit);
            }
        }
        self
    }

    fn of(instance: Instance) -> Self {
        LockClient {
            servers: Arc::new(Servers::new(vec![instance])),
            owner: OwnerIdentity::Random,
        }
    }

    /// A client for the server an existing `redis::Client` connects to (its address, login,
    /// database and TLS settings); the lock client opens connections of its own.
    pub fn from_client(client: &redis::Client, timeout: Duration) -> Result<Self, LockError> {
        Ok(Self::of(Instance::from_info(
            client.get_connection_info().clone(),
            timeout,
        )?))
    }

    /// How this client names owners when a request names none (see [`OwnerIdentity`]); the
    /// clone returned shares the connections. Fails on an owner the server would refuse.
    pub fn with_owner(&self, owner: OwnerIdentity) -> Result<Self, LockError> {
        owner.check()?;
        Ok(LockClient {
            servers: Arc::clone(&self.servers),
            owner,
        })
    }

    /// `LOCK.INFO key`: holders (owner, hold count, ttl), mode, queue; `None` when the key
    /// does not exist.
    pub fn info(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        self.servers.info(0, key)
    }

    /// Acquires a lock, or a semaphore permit, as `request` says. Waiting is done by the server
    /// (FIFO queue).
    pub fn acquire(&self, key: &str, mut request: Acquire) -> Result<LockGuard, LockError> {
        let owner = self.owner.apply(&mut request);
        request.check()?;
        let started = Instant::now();
        // A wait connection of the client's capped number, taken (in arrival order) before the
        // request goes out; the time spent here comes off the server-side wait.
        let _slot = match (request.wait, request.bind) {
            (Some(wait), false) => {
                let slot = self.servers.instances[0].wait_slots.take(wait)?;
                if !wait.is_zero() {
                    let left = wait.saturating_sub(started.elapsed());
                    request.wait = Some(left.max(Duration::from_millis(1)));
                }
                Some(slot)
            }
            _ => None,
        };
        // The watcher's push counts before the request: a push in between is re-read for the
        // guard.
        let since = self.servers.pushes();
        if request.min_replicas.is_some() {
            return self.acquire_replicated(key, owner, request, started, &since);
        }
        let mut links = request.bind.then(|| no_links(1));
        let outcomes = match links.as_mut() {
            Some(links) => self
                .servers
                .acquire_bound(links, key, &owner, &request, request.wait),
            None => self.servers.acquire(key, &owner, &request, request.wait),
        };
        let token = match outcomes.first() {
            Some(Outcome::Granted(t)) => *t,
            Some(Outcome::Unreachable(_)) if links.is_none() && request.release_all() => {
                // The request may still be granted when the server gets to it: a release
                // written behind it on the same link undoes that (the owner is this request's
                // alone), rather than leave a hold nobody knows of until its ttl.
                if let Some(instance) = self.servers.instances.first() {
                    instance.link.send_and_forget(&release_cmd(key, &owner));
                }
                return Err(classify(&self.servers.named(outcomes), 1));
            }
            _ => {
                if let Some(links) = links {
                    self.servers.discard(links, &outcomes, key, &owner);
                }
                let causes = self.servers.named(outcomes);
                return Err(classify(&causes, 1));
            }
        };
        Ok(self.guard(key, owner, request, token, started, links, &since))
    }

    /// The guard of a grant; `started` is when the request was sent.
    // The parts of a grant, each from a different step of the acquire.
    #[allow(clippy::too_many_arguments)]
    fn guard(
        &self,
        key: &str,
        owner: String,
        request: Acquire,
        token: u64,
        started: Instant,
        links: Option<Vec<Option<BoundLink>>>,
        since: &[u64],
    ) -> LockGuard {
        let deadline =
            single_server_valid_until(started, request.wait.is_some(), request.ttl, Instant::now());
        LockGuard::new(
            Arc::clone(&self.servers),
            key,
            owner,
            request,
            vec![(0, token)],
            deadline,
            links,
            since,
        )
    }

    /// An acquire with [`Acquire::min_replicas`]: the grant and `WAIT` on one connection of
    /// their own (Redis's `WAIT` counts the writes of the connection it is sent on).
    fn acquire_replicated(
        &self,
        key: &str,
        owner: String,
        request: Acquire,
        started: Instant,
        since: &[u64],
    ) -> Result<LockGuard, LockError> {
        let (replicas, timeout) = request.min_replicas.unwrap_or_default();
        let instance = &self.servers.instances[0];
        let name = instance.name().to_string();
        let unreachable = |e: String| LockError::Unreachable {
            causes: vec![(name.clone(), Outcome::Unreachable(e))],
        };
        let mut conn = instance.connect().map_err(|e| unreachable(e.to_string()))?;
        let margin = instance.timeout() + WAIT_REPLY_MARGIN;
        let read = request.wait.map_or(margin, |w| w.saturating_add(margin));
        conn.set_read_timeout(Some(read))
            .map_err(|e| unreachable(e.to_string()))?;
        let reply = request
            .command(key, &owner, request.wait)
            .query::<Value>(&mut conn);
        let outcome = acquire_outcome(reply.map_err(|e| {
            if e.is_io_error() || e.is_timeout() {
                Outcome::Unreachable(e.to_string())
            } else {
                error_outcome(&e)
            }
        }));
        let Outcome::Granted(token) = outcome else {
            return Err(classify(&[(name, outcome)], 1));
        };
        let guard = self.guard(key, owner, request, token, started, None, since);
        let _ = conn.set_read_timeout(Some(timeout.saturating_add(margin)));
        let acked = redis::cmd("WAIT")
            .arg(replicas)
            .arg(millis(timeout))
            .query::<i64>(&mut conn);
        match acked {
            Ok(n) if n >= i64::from(replicas) => Ok(guard),
            Ok(n) => {
                let _ = guard.release();
                Err(LockError::ReplicasNotAcknowledged {
                    wanted: replicas,
                    acknowledged: u32::try_from(n).unwrap_or(0),
                    causes: vec![(name, Outcome::Granted(token))],
                })
            }
            Err(e) => {
                let _ = guard.release();
                Err(unreachable(format!("WAIT failed: {e}")))
            }
        }
    }

    /// Exclusive lock now, or `LockError::Held`.
    pub fn try_lock(&self, key: &str, ttl: Duration) -> Result<LockGuard, LockError> {
        self.acquire(key, Acquire::write(ttl))
    }

    /// Exclusive lock, waiting up to `wait`.
    pub fn lock(&self, key: &str, ttl: Duration, wait: Duration) -> Result<LockGuard, LockError> {
        self.acquire(key, Acquire::write(ttl).wait(wait))
    }

    /// Shared lock now, or `LockError::Held`.
    pub fn try_read(&self, key: &str, ttl: Duration) -> Result<LockGuard, LockError> {
        self.acquire(key, Acquire::read(ttl))
    }

    /// Shared lock, waiting up to `wait`.
    pub fn read(&self, key: &str, ttl: Duration, wait: Duration) -> Result<LockGuard, LockError> {
        self.acquire(key, Acquire::read(ttl).wait(wait))
    }

    /// One permit of the semaphore `key` of `capacity` permits now, or `LockError::Held` when
    /// all are taken ([`Acquire::permit`]).
    pub fn try_permit(
        &self,
        key: &str,
        capacity: u32,
        ttl: Duration,
    ) -> Result<LockGuard, LockError> {
        self.acquire(key, Acquire::permit(capacity, ttl))
    }

    /// One permit of the semaphore `key` of `capacity` permits, waiting up to `wait` (FIFO).
    pub fn permit(
        &self,
        key: &str,
        capacity: u32,
        ttl: Duration,
        wait: Duration,
    ) -> Result<LockGuard, LockError> {
        self.acquire(key, Acquire::permit(capacity, ttl).wait(wait))
    }

    /// Acquires as `request` says (with a [`crate::Watchdog`] added when it has none), runs
    /// `work` with the guard, then releases it and returns what `work` returned, **only if the
    /// lock was held until the release**: if it was lost meanwhile (deleted, taken, expired,
    /// its bound connection closed), the result is [`LockError::Lost`] and `work`'s value is
    /// dropped. `work` should check [`LockGuard::is_lost`] before each step that needs the
    /// lock's protection. If `work` panics, the guard's drop releases the hold.
    pub fn using<T>(
        &self,
        key: &str,
        request: Acquire,
        work: impl FnOnce(&LockGuard) -> T,
    ) -> Result<T, LockError> {
        super::run_using(self.acquire(key, with_watchdog(request)), work)
    }

    /// Acquires every key of `items` (each with its own request: mode, ttl, wait, options),
    /// taking them in one global order (by key bytes) whatever order they are named in, so
    /// two multi-key acquires over overlapping keys never deadlock. Each key waits at most
    /// what is left of its own wait when its turn comes. If one key cannot be had, the keys
    /// already taken are released and the error is that key's. See [`MultiGuard`].
    pub fn acquire_all<K: AsRef<str>>(
        &self,
        items: &[(K, Acquire)],
    ) -> Result<MultiGuard, LockError> {
        acquire_all(items, |key, request| self.acquire(key, request))
    }
}
