//! Client helper for the `redis-lock` module.
//!
//! - [`LockClient`]: one Redis server. Exclusive and read locks, with a try or a
//!   wait-with-timeout acquire (the server queues the waiter natively, in FIFO order).
//! - [`Redlock`]: N independent Redis servers, each with the module. A lock is held when a
//!   majority (N/2+1) granted it; requests go to all servers in parallel, each bounded by a
//!   per-instance timeout.
//!
//! Both hand out a [`LockGuard`]: its fencing token(s), its remaining validity, `extend`,
//! `release`, release on drop (best effort), and an optional [`Watchdog`] that keeps extending
//! the lease and reports a lost lock. A hold can also be bound to a connection of the guard's
//! own ([`Acquire::bind`]) and carry a lock-delay ([`Acquire::lock_delay`]): see
//! [bound holds](#bound-holds).
//!
//! # Connections
//!
//! Per server, a client keeps **one connection for short commands** (try-acquire, extend,
//! release: the server answers at once) and **connections for blocking waits** (an acquire
//! with `WAIT`: one connection per wait in progress, kept in a small pool afterwards). A request
//! holds its connection alone from sending to reading the reply, and no lock is held across
//! I/O: when a second short command runs while the first is still out (for instance a
//! watchdog's extend during a try-acquire of another thread) it opens a further connection
//! rather than queue. So renewals and releases never wait behind a blocking acquire, or behind
//! any other request, of the same [`LockClient`] or [`Redlock`]: one client can be shared by
//! all threads of a process.
//!
//! Each server's `timeout` bounds connecting and every reply of a short command, so a paused or
//! dead server costs at most about that much per call (two timeouts when a connection must be
//! opened first). A blocking acquire's reply may take its wait plus the timeout plus a margin
//! of one second: a read timeout never cuts a long wait short. After an I/O failure the
//! connection is dropped (it may still carry a late reply) and a new one is opened next time.
//!
//! A bound acquire ([`Acquire::bind`]) uses none of these: see below.
//!
//! # Bound holds
//!
//! With [`Acquire::bind`] the acquire is sent with `BIND`, and the server ends the hold the
//! moment the connection that sent it closes (as by `LOCK.RELEASE key owner ALL`), instead of
//! leaving it until its ttl. So a guard whose process dies, or whose connection the server kills
//! or times out, frees the lock at once; the ttl still applies too.
//!
//! - **One connection per bound guard and server.** The acquire opens a new connection to each
//!   server (named [`BOUND_CLIENT_NAME`] with `CLIENT SETNAME`, so `CLIENT LIST` shows it),
//!   also for a waiting acquire; it is never pooled nor shared. The guard keeps the ones its
//!   grants came on; its extends (the watchdog's too) and its release go over them (while the
//!   watchdog's extend is using one, another request of the guard goes over a pooled connection
//!   instead, so nothing waits for it). Release and drop send `LOCK.RELEASE ... ALL` on each and
//!   then close it: the release comes first, so a lock-delay does not start. A connection whose
//!   acquire was not granted is closed; if its reply did not come in time, a release is written
//!   behind it first (a late grant is then released, and a wait still queued ends with the
//!   close). A Redlock attempt that fails releases over its connections and keeps them for the
//!   next attempt, which uses a new owner.
//! - **A slow server does not cost the hold.** A reply that times out on a bound connection is
//!   not a reason to close it (which would end the hold): the late reply is skipped when it
//!   comes. Such an extend counts as unanswered, as on a pooled connection.
//! - **Loss.** A bound guard is lost once fewer than a quorum of its connections are open (one
//!   for [`LockClient`], N/2+1 for [`Redlock`]): a connection is found closed when the server
//!   has closed it (end of stream, reset, or anything it sends unasked) or a request on it
//!   fails. Every [`LockGuard::is_lost`] and [`LockGuard::validity`] checks the idle
//!   connections without blocking and without sending anything (the socket is read in
//!   non-blocking mode), so it sees a closing within moments of its arrival, without a
//!   watchdog. A watchdog checks them the same way every 100 ms between extends and reports the
//!   loss ([`LostLock::causes`] names the closed connections). A closing that never reaches this
//!   machine (a network partition) is not seen: the lease's validity still bounds that case,
//!   as for any lease. Note Redis's `timeout` setting (idle clients): it closes a bound
//!   connection that carried nothing for that long, so keep it 0 (the default), or longer than
//!   the extend period of a watchdog (whose extends use the connection).
//! - **Lock-delay.** [`Acquire::lock_delay`] (write locks only; a read request with it fails
//!   with [`LockError::InvalidRequest`] before anything is sent) makes the server grant the lock
//!   to nobody for that long after the hold ends other than by a release: ttl run out, bound
//!   connection closed. A holder that was paused past its loss cannot then overlap with the next
//!   one, provided it is back within the delay.
//!
//! # Validity and loss
//!
//! A guard's *validity* ends at the lease's ttl counted from when the granting (or the last
//! confirmed extending) request was **sent**, less the clock drift allowance ([`drift`]; for
//! a waited single-server grant, from when the grant's reply arrived, less a transit margin):
//! the latest moment at which the lock is certainly still held. [`LockGuard::is_lost`] is true
//! from the moment validity runs out without a confirmed extend, whether or not a watchdog
//! runs and even while the watchdog's own extend is still waiting for an answer; it is also true
//! once the watchdog found that a majority no longer holds the lock for this owner. Once true it
//! stays true: an extend confirmed after validity ran out does not revive the guard (the lock may
//! have been free in between), it fails with [`LockError::Expired`]. So check `is_lost()` (or
//! [`LockGuard::validity`]) right before acting on the lock's protection, and prefer fencing
//! tokens where the protected resource can check them. The watchdog reports a loss once, through
//! its `on_lost` callback and `notify` channel, as soon as it notices it (at the latest when
//! its pending extend times out).
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{Acquire, LockClient};
//!
//! let client = LockClient::new("redis://127.0.0.1:6379/", Duration::from_millis(500))?;
//! // Wait up to 2 s for the lock; hold it for 10 s unless extended.
//! let guard = client.acquire("orders:42", Acquire::write(Duration::from_secs(10)).wait(Duration::from_secs(2)))?;
//! let token = guard.fencing_token().expect("one instance: one token");
//! // ... pass `token` to the storage you protect, so it can refuse stale writers ...
//! guard.release()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Quorum across five servers, with a watchdog:
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{Acquire, Redlock, Watchdog};
//!
//! let urls = ["redis://10.0.0.1:6379/", "redis://10.0.0.2:6379/", "redis://10.0.0.3:6379/",
//!             "redis://10.0.0.4:6379/", "redis://10.0.0.5:6379/"];
//! let redlock = Redlock::new(&urls, Duration::from_millis(50))?;
//! let (lost_tx, lost_rx) = std::sync::mpsc::channel();
//! let guard = redlock.acquire(
//!     "jobs:nightly",
//!     Acquire::write(Duration::from_secs(30))
//!         .wait(Duration::from_secs(5))
//!         .watchdog(Watchdog::new().notify(lost_tx)),
//! )?;
//! // ... long work; check guard.is_lost() (or lost_rx) before committing results ...
//! # drop(lost_rx);
//! drop(guard); // stops the watchdog and releases everywhere
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bound;
mod guard;
mod instance;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use redis::{Cmd, Value};

use crate::bound::BoundLink;
use crate::instance::millis;
pub use bound::BOUND_CLIENT_NAME;
pub use guard::{LockGuard, LostLock, Watchdog};
pub use instance::{Instance, Outcome};

/// Exclusive (write) or shared (read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Write,
    Read,
}

/// What to acquire: mode, lease, how long to wait, and the options: a watchdog, a hold bound to
/// a connection ([`Acquire::bind`]), a lock-delay ([`Acquire::lock_delay`]).
#[derive(Clone)]
pub struct Acquire {
    pub(crate) mode: Mode,
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) watchdog: Option<Watchdog>,
    pub(crate) bind: bool,
    pub(crate) lock_delay: Option<Duration>,
}

/// The largest lock-delay the module accepts: 2^47 ms.
const MAX_LOCK_DELAY_MS: u128 = 1 << 47;

impl Acquire {
    /// An exclusive lock held for `ttl` unless extended.
    pub fn write(ttl: Duration) -> Self {
        Acquire {
            mode: Mode::Write,
            ttl,
            wait: None,
            watchdog: None,
            bind: false,
            lock_delay: None,
        }
    }

    /// A shared lock held for `ttl` unless extended.
    pub fn read(ttl: Duration) -> Self {
        Acquire {
            mode: Mode::Read,
            ..Self::write(ttl)
        }
    }

    /// Wait up to `wait` for the lock instead of failing at once.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Keep the lease alive in the background until the guard drops.
    pub fn watchdog(mut self, watchdog: Watchdog) -> Self {
        self.watchdog = Some(watchdog);
        self
    }

    /// Binds the hold to a connection (`BIND`): the guard opens a connection of its own to each
    /// server for this acquire (also for a waiting one), keeps it for as long as it lives and
    /// closes it when released or dropped; if the connection closes first (the process dies, the
    /// server kills or times out the connection, the network resets it), the server ends the hold
    /// at once instead of at its ttl, and the guard is lost. The ttl still applies. See the
    /// [crate documentation](crate#bound-holds).
    pub fn bind(mut self) -> Self {
        self.bind = true;
        self
    }

    /// Lock-delay (`LOCKDELAY`), for write locks only: when this hold ends *other than by a
    /// release* (its ttl passes, its bound connection closes), the server grants the lock to
    /// nobody until `delay` later, so a holder that was paused and wakes up late cannot overlap
    /// with the next one. Rounded up to whole milliseconds; zero means none. Asking it of a read
    /// lock, or more than 2^47 ms, fails with [`LockError::InvalidRequest`] before anything is
    /// sent.
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = Some(delay);
        self
    }

    /// Refuses, before anything is sent, what the server would refuse.
    fn check(&self) -> Result<(), LockError> {
        if let Some(delay) = self.lock_delay {
            if self.mode == Mode::Read {
                return Err(LockError::InvalidRequest {
                    reason: "lock_delay applies to write locks only, not to read locks".into(),
                });
            }
            if delay.as_nanos().div_ceil(1_000_000) > MAX_LOCK_DELAY_MS {
                return Err(LockError::InvalidRequest {
                    reason: format!("lock_delay {delay:?} is over 2^47 ms"),
                });
            }
        }
        Ok(())
    }

    /// LOCK.ACQUIRE / LOCK.RWREAD with its options; `wait` is the server-side WAIT.
    fn command(&self, key: &str, owner: &str, wait: Option<Duration>) -> Cmd {
        let mut cmd = redis::cmd(match self.mode {
            Mode::Write => "LOCK.ACQUIRE",
            Mode::Read => "LOCK.RWREAD",
        });
        cmd.arg(key).arg(owner).arg(millis(self.ttl));
        if let Some(w) = wait {
            cmd.arg("WAIT").arg(millis(w));
        }
        if self.bind {
            cmd.arg("BIND");
        }
        if let Some(delay) = self.lock_delay.filter(|d| !d.is_zero()) {
            let ms = u64::try_from(delay.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
            cmd.arg("LOCKDELAY").arg(ms);
        }
        cmd
    }
}

/// Why a lock was not acquired. Every variant lists what each instance answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockError {
    /// Enough instances answered, but the lock is held by someone else (on too many of them).
    Held { causes: Vec<(String, Outcome)> },
    /// Too few instances answered to reach a quorum.
    Unreachable { causes: Vec<(String, Outcome)> },
    /// An instance refused the request (for example `DEADLOCK`: a reader asking to write).
    Refused { causes: Vec<(String, Outcome)> },
    /// The lock's validity ran out while acquiring it (the instances were too slow), or before
    /// an extend of it was confirmed.
    Expired { causes: Vec<(String, Outcome)> },
    /// A bound lock: its connections to too many instances closed, which ended the hold there
    /// (the causes name them).
    Disconnected { causes: Vec<(String, Outcome)> },
    /// The request was refused before anything was sent (for example a lock-delay on a read
    /// lock).
    InvalidRequest { reason: String },
}

impl LockError {
    /// What each instance answered.
    pub fn causes(&self) -> &[(String, Outcome)] {
        match self {
            LockError::Held { causes }
            | LockError::Unreachable { causes }
            | LockError::Refused { causes }
            | LockError::Expired { causes }
            | LockError::Disconnected { causes } => causes,
            LockError::InvalidRequest { .. } => &[],
        }
    }
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            LockError::Held { .. } => "lock held by someone else",
            LockError::Unreachable { .. } => "too few lock instances reachable",
            LockError::Refused { .. } => "lock request refused",
            LockError::Expired { .. } => "lock validity ran out",
            LockError::Disconnected { .. } => "bound lock's connections closed",
            LockError::InvalidRequest { reason } => {
                return write!(f, "invalid lock request: {reason}");
            }
        };
        write!(f, "{what}:")?;
        for (name, outcome) in self.causes() {
            write!(f, " [{name}: {outcome:?}]")?;
        }
        Ok(())
    }
}

impl std::error::Error for LockError {}

/// The servers a lock lives on, and how many must agree.
pub(crate) struct Servers {
    pub(crate) instances: Vec<Instance>,
    pub(crate) quorum: usize,
}

impl Servers {
    /// The same command to every server at once; `wait` for a blocking request (see
    /// [`instance::scatter_gather`]).
    fn run(&self, cmd: &Cmd, wait: Option<Duration>) -> Vec<Result<Value, Outcome>> {
        let cmds = vec![Some(cmd.clone()); self.instances.len()];
        instance::scatter_gather(&self.instances, &cmds, wait)
    }

    /// LOCK.ACQUIRE / LOCK.RWREAD everywhere over pooled connections, with server-side WAIT
    /// when `wait` is set.
    pub(crate) fn acquire(
        &self,
        key: &str,
        owner: &str,
        request: &Acquire,
        wait: Option<Duration>,
    ) -> Vec<Outcome> {
        self.run(&request.command(key, owner, wait), wait)
            .into_iter()
            .map(acquire_outcome)
            .collect()
    }

    /// The same over bound connections: `links[i]` is used for server i, opened when `None`.
    /// On return `links[i]` holds the connections that can carry more requests: the one a
    /// grant came on, and also one whose reply timed out (it may still grant).
    pub(crate) fn acquire_bound(
        &self,
        links: &mut [Option<BoundLink>],
        key: &str,
        owner: &str,
        request: &Acquire,
        wait: Option<Duration>,
    ) -> Vec<Outcome> {
        let cmds = vec![Some(request.command(key, owner, wait)); self.instances.len()];
        instance::exchange(&self.instances, links, &cmds, wait)
            .into_iter()
            .map(acquire_outcome)
            .collect()
    }

    /// After a bound acquire that is not used (or for the servers that did not grant): closes
    /// the connections, each behind a `LOCK.RELEASE ... ALL` where it granted or may still grant
    /// (its reply timed out), so that no hold is left and no lock-delay starts. Does not wait.
    pub(crate) fn discard(
        &self,
        links: Vec<Option<BoundLink>>,
        outcomes: &[Outcome],
        key: &str,
        owner: &str,
    ) {
        let release = release_cmd(key, owner);
        for (link, outcome) in links.into_iter().zip(outcomes) {
            if let Some(link) = link {
                if matches!(outcome, Outcome::Granted(_) | Outcome::Unreachable(_)) {
                    link.abandon(&release);
                }
            }
        }
    }

    /// After a failed bound attempt (Redlock): `LOCK.RELEASE ... ALL` over the bound connection
    /// of every server that granted or may still grant, waiting for the replies, so the
    /// connections can carry the next attempt (a release on the same connection is answered
    /// before anything sent after it).
    pub(crate) fn release_bound(
        &self,
        links: &mut [Option<BoundLink>],
        outcomes: &[Outcome],
        key: &str,
        owner: &str,
    ) {
        let release = release_cmd(key, owner);
        let cmds: Vec<Option<Cmd>> = links
            .iter()
            .zip(outcomes)
            .map(|(l, o)| {
                (l.is_some() && matches!(o, Outcome::Granted(_) | Outcome::Unreachable(_)))
                    .then(|| release.clone())
            })
            .collect();
        if cmds.iter().any(Option::is_some) {
            instance::exchange(&self.instances, links, &cmds, None);
        }
    }

    /// LOCK.EXTEND everywhere: Granted where the owner still holds the lock.
    pub(crate) fn extend(&self, key: &str, owner: &str, ttl: Duration) -> Vec<Outcome> {
        self.run(&extend_cmd(key, owner, ttl), None)
            .into_iter()
            .map(extend_outcome)
            .collect()
    }

    /// LOCK.RELEASE ... ALL everywhere (NOTOWNER counts as done: the hold is gone either way).
    pub(crate) fn release(&self, key: &str, owner: &str) -> Vec<Outcome> {
        self.run(&release_cmd(key, owner), None)
            .into_iter()
            .map(release_outcome)
            .collect()
    }

    pub(crate) fn named(&self, outcomes: Vec<Outcome>) -> Vec<(String, Outcome)> {
        self.instances
            .iter()
            .map(|i| i.name().to_string())
            .zip(outcomes)
            .collect()
    }
}

fn acquire_outcome(r: Result<Value, Outcome>) -> Outcome {
    match r {
        Ok(Value::Int(t)) => Outcome::Granted(u64::try_from(t).unwrap_or(0)),
        Ok(Value::Nil) => Outcome::Held,
        Ok(other) => Outcome::Refused(format!("unexpected reply {other:?}")),
        Err(o) => o,
    }
}

pub(crate) fn extend_cmd(key: &str, owner: &str, ttl: Duration) -> Cmd {
    let mut cmd = redis::cmd("LOCK.EXTEND");
    cmd.arg(key).arg(owner).arg(millis(ttl));
    cmd
}

pub(crate) fn extend_outcome(r: Result<Value, Outcome>) -> Outcome {
    match r {
        Ok(Value::Int(_)) => Outcome::Granted(0),
        Ok(other) => Outcome::Refused(format!("unexpected reply {other:?}")),
        Err(o) => o,
    }
}

pub(crate) fn release_cmd(key: &str, owner: &str) -> Cmd {
    let mut cmd = redis::cmd("LOCK.RELEASE");
    cmd.arg(key).arg(owner).arg("ALL");
    cmd
}

/// NOTOWNER counts as done: the hold is gone either way.
pub(crate) fn release_outcome(r: Result<Value, Outcome>) -> Outcome {
    match r {
        Err(Outcome::Unreachable(e)) => Outcome::Unreachable(e),
        _ => Outcome::Granted(0),
    }
}

/// `n` empty bound-connection slots.
fn no_links(n: usize) -> Vec<Option<BoundLink>> {
    (0..n).map(|_| None).collect()
}

/// Clock drift allowance for a lease of `ttl`: 1% of it plus 2 ms (as Redlock specifies).
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

fn random_owner() -> String {
    format!("{:032x}", rand::thread_rng().gen::<u128>())
}

/// A lock client for one Redis server with the module loaded.
///
/// One `LockClient` can be shared by any number of threads (it is `Send + Sync`; wrap it in an
/// `Arc` or borrow it in scoped threads): short commands go through one connection (a further
/// one only while two run at the same moment) and every waiting acquire through a connection
/// of its own, so a wait never delays another thread's request, nor the extends and releases of
/// this client's guards. A bound acquire has a connection of its own for the guard's whole
/// life. See the [crate documentation](crate#connections).
pub struct LockClient {
    servers: Arc<Servers>,
}

impl LockClient {
    /// `timeout` bounds connecting and each reply (a waiting acquire's reply may also take its
    /// wait and a one-second margin).
    pub fn new(url: &str, timeout: Duration) -> redis::RedisResult<Self> {
        Ok(LockClient {
            servers: Arc::new(Servers {
                instances: vec![Instance::new(url, timeout)?],
                quorum: 1,
            }),
        })
    }

    /// Acquires a lock as `request` says. Waiting is done by the server (FIFO queue).
    pub fn acquire(&self, key: &str, request: Acquire) -> Result<LockGuard, LockError> {
        request.check()?;
        let owner = random_owner();
        let started = Instant::now();
        let mut links = request.bind.then(|| no_links(1));
        let outcomes = match links.as_mut() {
            Some(links) => self
                .servers
                .acquire_bound(links, key, &owner, &request, request.wait),
            None => self.servers.acquire(key, &owner, &request, request.wait),
        };
        let token = match outcomes.first() {
            Some(Outcome::Granted(t)) => *t,
            _ => {
                if let Some(links) = links {
                    self.servers.discard(links, &outcomes, key, &owner);
                }
                let causes = self.servers.named(outcomes);
                return Err(classify(&causes, 1));
            }
        };
        // The server starts the lease when it grants. Without WAIT that is after `started`,
        // so `started + ttl` is a safe lower bound of the expiry. With WAIT the grant is
        // replied the moment it happens, so it is the reply's arrival less the reply's transit,
        // allowed for by a margin.
        let deadline = match request.wait {
            None => started + request.ttl,
            Some(_) => Instant::now() + request.ttl.saturating_sub(WAITED_GRANT_MARGIN),
        };
        let deadline = deadline
            .checked_sub(SINGLE_SERVER_MARGIN)
            .unwrap_or_else(Instant::now);
        Ok(LockGuard::new(
            Arc::clone(&self.servers),
            key,
            owner,
            request,
            vec![(0, token)],
            deadline,
            links,
        ))
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
}

/// With one server there is no cross-server drift, but the client's and the server's clocks
/// still run separately: a margin kept off every single-server lease.
const SINGLE_SERVER_MARGIN: Duration = Duration::from_millis(2);
/// Allowance for the transit of a waited grant's reply (see `LockClient::acquire`).
const WAITED_GRANT_MARGIN: Duration = Duration::from_millis(5);

/// Names the failure from what the instances answered, given the quorum needed.
fn classify(causes: &[(String, Outcome)], quorum: usize) -> LockError {
    let reachable = causes
        .iter()
        .filter(|(_, o)| !matches!(o, Outcome::Unreachable(_)))
        .count();
    let refused = causes.iter().any(|(_, o)| matches!(o, Outcome::Refused(_)));
    let causes = causes.to_vec();
    if reachable < quorum {
        LockError::Unreachable { causes }
    } else if refused {
        LockError::Refused { causes }
    } else {
        LockError::Held { causes }
    }
}

/// Redlock: one lock over N independent servers (N/2+1 must grant it).
///
/// A `Redlock` can be shared by threads: every request takes its own connection to each
/// server (pooled, or a bound guard's own: see the [crate documentation](crate#connections)),
/// so concurrent requests
/// never wait for one another. Its acquire never blocks on a server (waiting on one server
/// while holding another could deadlock): with `wait` it retries client-side, after a random
/// delay.
pub struct Redlock {
    servers: Arc<Servers>,
    retry_delay: (Duration, Duration),
}

impl Redlock {
    /// `per_instance_timeout` bounds connecting to and each reply from one server; a slow or
    /// dead server costs at most that, and the others are asked at the same time.
    pub fn new<S: AsRef<str>>(
        urls: &[S],
        per_instance_timeout: Duration,
    ) -> redis::RedisResult<Self> {
        let instances = urls
            .iter()
            .map(|u| Instance::new(u.as_ref(), per_instance_timeout))
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let quorum = instances.len() / 2 + 1;
        Ok(Redlock {
            servers: Arc::new(Servers { instances, quorum }),
            retry_delay: (Duration::from_millis(1), Duration::from_millis(20)),
        })
    }

    /// How long to sleep between attempts: a random delay in `[min, max)` (default 1 to 20 ms),
    /// so that competing clients stop colliding.
    pub fn retry_delay(mut self, min: Duration, max: Duration) -> Self {
        self.retry_delay = (min, max.max(min + Duration::from_micros(1)));
        self
    }

    /// How many instances must grant a lock.
    pub fn quorum(&self) -> usize {
        self.servers.quorum
    }

    /// Acquires the lock on a majority. Without `wait`, one attempt; with it, attempts repeat
    /// (after a random delay) until the wait is over. A failed attempt is released everywhere.
    pub fn acquire(&self, key: &str, request: Acquire) -> Result<LockGuard, LockError> {
        request.check()?;
        let same_owner = random_owner();
        let give_up = Instant::now() + request.wait.unwrap_or_default();
        let quorum = self.servers.quorum;
        // A bound request's connections, kept from one attempt to the next.
        let mut links = request.bind.then(|| no_links(self.servers.instances.len()));
        loop {
            // A bound request takes a new owner for each attempt: a hold of an earlier attempt
            // that is still bound to a connection we gave up on is then never re-entered (a
            // re-entry would keep that connection's binding).
            let owner = if request.bind {
                random_owner()
            } else {
                same_owner.clone()
            };
            let started = Instant::now();
            // Never block on a server: waiting on one while holding another could deadlock.
            let outcomes = match links.as_mut() {
                Some(links) => self
                    .servers
                    .acquire_bound(links, key, &owner, &request, None),
                None => self.servers.acquire(key, &owner, &request, None),
            };
            let elapsed = started.elapsed();
            let tokens: Vec<(usize, u64)> = outcomes
                .iter()
                .enumerate()
                .filter_map(|(i, o)| match o {
                    Outcome::Granted(t) => Some((i, *t)),
                    _ => None,
                })
                .collect();
            let validity = request.ttl.checked_sub(elapsed + drift(request.ttl));
            if tokens.len() >= quorum {
                if let Some(validity) = validity.filter(|v| !v.is_zero()) {
                    // The guard keeps the connections of the servers that granted; the others
                    // are closed (behind a release where a late grant may still come).
                    let links = links.take().map(|all| {
                        let (kept, others): (Vec<_>, Vec<_>) = all
                            .into_iter()
                            .zip(&outcomes)
                            .map(|(l, o)| match o {
                                Outcome::Granted(_) => (l, None),
                                _ => (None, l),
                            })
                            .unzip();
                        self.servers.discard(others, &outcomes, key, &owner);
                        kept
                    });
                    return Ok(LockGuard::new(
                        Arc::clone(&self.servers),
                        key,
                        owner,
                        request,
                        tokens,
                        started + elapsed + validity,
                        links,
                    ));
                }
            }
            // Not a usable majority: give back what we got (and whatever a slow server may
            // still grant later), then decide whether to try again.
            match links.as_mut() {
                Some(links) => self.servers.release_bound(links, &outcomes, key, &owner),
                None => {
                    if !tokens.is_empty()
                        || outcomes
                            .iter()
                            .any(|o| matches!(o, Outcome::Unreachable(_)))
                    {
                        self.servers.release(key, &owner);
                    }
                }
            }
            let causes = self.servers.named(outcomes);
            let error = if tokens.len() >= quorum {
                LockError::Expired { causes }
            } else {
                classify(&causes, quorum)
            };
            let now = Instant::now();
            if now >= give_up || matches!(error, LockError::Refused { .. }) {
                return Err(error);
            }
            let (min, max) = self.retry_delay;
            let delay = rand::thread_rng().gen_range(min..max);
            std::thread::sleep(delay.min(give_up - now));
        }
    }
}
