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
//! the lease and reports a lost lock.
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

mod guard;
mod instance;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use redis::{Cmd, Value};

use crate::instance::millis;
pub use guard::{LockGuard, LostLock, Watchdog};
pub use instance::{Instance, Outcome};

/// Exclusive (write) or shared (read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Write,
    Read,
}

/// What to acquire: mode, lease, how long to wait, and an optional watchdog.
#[derive(Clone)]
pub struct Acquire {
    pub(crate) mode: Mode,
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) watchdog: Option<Watchdog>,
}

impl Acquire {
    /// An exclusive lock held for `ttl` unless extended.
    pub fn write(ttl: Duration) -> Self {
        Acquire {
            mode: Mode::Write,
            ttl,
            wait: None,
            watchdog: None,
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
}

impl LockError {
    /// What each instance answered.
    pub fn causes(&self) -> &[(String, Outcome)] {
        match self {
            LockError::Held { causes }
            | LockError::Unreachable { causes }
            | LockError::Refused { causes }
            | LockError::Expired { causes } => causes,
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
        let cmds = vec![cmd.clone(); self.instances.len()];
        instance::scatter_gather(&self.instances, &cmds, wait)
    }

    /// LOCK.ACQUIRE / LOCK.RWREAD everywhere, with server-side WAIT when `wait` is set.
    pub(crate) fn acquire(
        &self,
        key: &str,
        owner: &str,
        mode: Mode,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Vec<Outcome> {
        let mut cmd = redis::cmd(match mode {
            Mode::Write => "LOCK.ACQUIRE",
            Mode::Read => "LOCK.RWREAD",
        });
        cmd.arg(key).arg(owner).arg(millis(ttl));
        if let Some(w) = wait {
            cmd.arg("WAIT").arg(millis(w));
        }
        self.run(&cmd, wait)
            .into_iter()
            .map(|r| match r {
                Ok(Value::Int(t)) => Outcome::Granted(u64::try_from(t).unwrap_or(0)),
                Ok(Value::Nil) => Outcome::Held,
                Ok(other) => Outcome::Refused(format!("unexpected reply {other:?}")),
                Err(o) => o,
            })
            .collect()
    }

    /// LOCK.EXTEND everywhere: Granted where the owner still holds the lock.
    pub(crate) fn extend(&self, key: &str, owner: &str, ttl: Duration) -> Vec<Outcome> {
        let mut cmd = redis::cmd("LOCK.EXTEND");
        cmd.arg(key).arg(owner).arg(millis(ttl));
        self.run(&cmd, None)
            .into_iter()
            .map(|r| match r {
                Ok(Value::Int(_)) => Outcome::Granted(0),
                Ok(other) => Outcome::Refused(format!("unexpected reply {other:?}")),
                Err(o) => o,
            })
            .collect()
    }

    /// LOCK.RELEASE ... ALL everywhere (NOTOWNER counts as done: the hold is gone either way).
    pub(crate) fn release(&self, key: &str, owner: &str) -> Vec<Outcome> {
        let mut cmd = redis::cmd("LOCK.RELEASE");
        cmd.arg(key).arg(owner).arg("ALL");
        self.run(&cmd, None)
            .into_iter()
            .map(|r| match r {
                Err(Outcome::Unreachable(e)) => Outcome::Unreachable(e),
                _ => Outcome::Granted(0),
            })
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
/// this client's guards. See the [crate documentation](crate#connections).
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
        let owner = random_owner();
        let started = Instant::now();
        let outcomes = self
            .servers
            .acquire(key, &owner, request.mode, request.ttl, request.wait);
        let token = match outcomes.first() {
            Some(Outcome::Granted(t)) => *t,
            _ => {
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
/// server (pooled, see the [crate documentation](crate#connections)), so concurrent requests
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
        let owner = random_owner();
        let give_up = Instant::now() + request.wait.unwrap_or_default();
        let quorum = self.servers.quorum;
        loop {
            let started = Instant::now();
            // Never block on a server: waiting on one while holding another could deadlock.
            let outcomes = self
                .servers
                .acquire(key, &owner, request.mode, request.ttl, None);
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
                    return Ok(LockGuard::new(
                        Arc::clone(&self.servers),
                        key,
                        owner,
                        request,
                        tokens,
                        started + elapsed + validity,
                    ));
                }
            }
            // Not a usable majority: give back what we got (and whatever a slow server may
            // still grant later), then decide whether to try again.
            if !tokens.is_empty()
                || outcomes
                    .iter()
                    .any(|o| matches!(o, Outcome::Unreachable(_)))
            {
                self.servers.release(key, &owner);
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
