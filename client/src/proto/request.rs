//! What a caller asks for ([`Acquire`]): mode, lease, wait and options; checked before anything
//! is sent, and spelled as the module's command.

use std::time::Duration;

use redis::Cmd;

use super::error::LockError;
use super::reply::millis;
use crate::Watchdog;

/// What a guard holds: an exclusive (write) lock, a shared (read) lock, or one permit of a
/// counting semaphore of `capacity` permits ([`Acquire::permit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// An exclusive lock (`LOCK.ACQUIRE`).
    Write,
    /// A shared lock (`LOCK.RWREAD`).
    Read,
    /// One permit of a semaphore (`LOCK.SEMACQUIRE`) of this capacity.
    Permit {
        /// How many permits the semaphore has.
        capacity: u32,
    },
}

/// What to acquire: mode (write, read, or a semaphore permit), lease, how long to wait, and the
/// options: a watchdog, a hold bound to a connection ([`Acquire::bind`]), a lock-delay
/// ([`Acquire::lock_delay`]), an owner of the caller's choice ([`Acquire::owner`]).
#[derive(Clone)]
pub struct Acquire {
    pub(crate) mode: Mode,
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) watchdog: Option<Watchdog>,
    pub(crate) bind: bool,
    pub(crate) lock_delay: Option<Duration>,
    /// `None`: a fresh random owner per guard (the default).
    pub(crate) owner: Option<String>,
    /// `WAIT n timeout` after the grant ([`Acquire::min_replicas`]).
    pub(crate) min_replicas: Option<(u32, Duration)>,
}

/// The largest ttl, wait and lock-delay the module accepts: 2^47 ms.
const MAX_MS: u128 = 1 << 47;
/// How many connections for waits a client (sync or async) opens at most per server, unless
/// set with `max_wait_connections`.
pub const DEFAULT_WAIT_CONNECTIONS: usize = 64;

/// The shortest ttl a request may ask: a shorter lease would be spent (less the clock drift
/// allowance and the transit margin) before its grant could be used.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// The largest semaphore capacity the module accepts: 2^31 - 1.
pub const MAX_CAPACITY: u32 = (1 << 31) - 1;
/// The longest owner the module accepts, in bytes.
pub(crate) const MAX_OWNER_LEN: usize = 1024;

impl std::fmt::Debug for Acquire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("mode", &self.mode)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("watchdog", &self.watchdog.is_some())
            .field("bind", &self.bind)
            .field("lock_delay", &self.lock_delay)
            .field("owner", &self.owner)
            .field("min_replicas", &self.min_replicas)
            .finish()
    }
}

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
            owner: None,
            min_replicas: None,
        }
    }

    /// A shared lock held for `ttl` unless extended.
    pub fn read(ttl: Duration) -> Self {
        Acquire {
            mode: Mode::Read,
            ..Self::write(ttl)
        }
    }

    /// One permit of the counting semaphore in the key, of `capacity` permits
    /// (`LOCK.SEMACQUIRE`), held for `ttl` unless extended. At most `capacity` permits of the
    /// key are held at a time; they are granted in FIFO order (with [`Acquire::wait`]).
    ///
    /// Each guard is **one permit of an owner of its own** (a fresh random token, unless
    /// [`Acquire::owner`] names one): `release()` and drop give that one permit back, `extend()`
    /// and the watchdog extend it, and its fencing token is the one the grant replied. A key
    /// keeps the capacity it was created with while it exists: asking it with another capacity
    /// fails with [`LockError::CapacityMismatch`], and asking a permit of a lock key (or a lock
    /// of a semaphore key) with [`LockError::WrongKind`].
    ///
    /// For one server only ([`LockClient`](crate::LockClient)): [`Redlock`](crate::Redlock) refuses permits (see
    /// [semaphores](crate#semaphores)). A capacity of 0 or over [`MAX_CAPACITY`], or a
    /// lock-delay, fails with [`LockError::InvalidRequest`] before anything is sent.
    pub fn permit(capacity: u32, ttl: Duration) -> Self {
        Acquire {
            mode: Mode::Permit { capacity },
            ..Self::write(ttl)
        }
    }

    /// Acquires under `owner` instead of a fresh random owner: for several guards of one
    /// logical owner (a job, a transaction), on one server ([`LockClient`](crate::LockClient)).
    ///
    /// - **Re-entry.** A write lock the owner holds is re-entered (the same fencing token), a
    ///   read lock too, and a semaphore grants the owner one more permit; the holds of one owner
    ///   share one expiry on the server, so any of its guards' extends renews all of them.
    ///   **Give every guard of one owner and key the same ttl**: each grant and extend sets
    ///   that shared expiry to now + its own ttl, so a shorter ttl would cut the other guards'
    ///   leases short without their knowing (their validity is computed from their own ttl).
    /// - **Release.** Such a guard's release (and drop) drops *one* hold of the owner
    ///   (`LOCK.RELEASE key owner`, without `ALL`), so the owner's other guards of the key keep
    ///   theirs.
    /// - **Deadlocks.** The server knows which keys an owner holds and refuses, with
    ///   [`LockError::Deadlock`], a request that would deadlock: a write request of an owner that
    ///   holds the key shared (an upgrade), and a waiting request that would close a cycle of
    ///   owners waiting for one another across keys. A random owner per guard holds nothing
    ///   when it asks, so it can never be part of a deadlock: this option is what makes them
    ///   possible, and detected.
    ///
    /// `owner` must be 1 to 1024 bytes. It cannot be combined with [`Acquire::bind`] (a
    /// re-entry keeps the binding of the first hold, so this guard's connection would not be
    /// the one its hold ends with), and [`Redlock`](crate::Redlock) refuses it (a failed attempt's cleanup could
    /// not tell its own holds from the owner's others); both fail with
    /// [`LockError::InvalidRequest`] before anything is sent.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// After the grant, waits (Redis `WAIT replicas timeout`, on the connection that carried the
    /// grant) until at least `replicas` replicas acknowledged it, at most `timeout`. If fewer
    /// did, the hold is released and the acquire fails with
    /// [`LockError::ReplicasNotAcknowledged`]: a failover to a replica that never saw the grant
    /// would otherwise hand the lock out twice. One server only ([`LockClient`](crate::LockClient) and the async
    /// single-server client); [`Redlock`](crate::Redlock), a bound request and a cluster client refuse it with
    /// [`LockError::InvalidRequest`].
    pub fn min_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.min_replicas = Some((replicas, timeout));
        self
    }

    /// Wait up to `wait` for the lock instead of failing at once. The server takes waits of up
    /// to 2^47 ms (longer ones are refused); a [`Redlock`](crate::Redlock) counts a longer one (such as
    /// `Duration::MAX`) as about a century.
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
    /// lock or a semaphore permit, or more than 2^47 ms, fails with [`LockError::InvalidRequest`]
    /// before anything is sent.
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = Some(delay);
        self
    }

    /// Refuses, before anything is sent, what the server would refuse, and a ttl too short to
    /// be of use.
    pub(crate) fn check(&self) -> Result<(), LockError> {
        let invalid = |reason: String| Err(LockError::InvalidRequest { reason });
        check_ttl(self.ttl)?;
        if let Mode::Permit { capacity } = self.mode {
            if !(1..=MAX_CAPACITY).contains(&capacity) {
                return invalid(format!(
                    "semaphore capacity {capacity} is not between 1 and {MAX_CAPACITY}"
                ));
            }
        }
        if let Some(owner) = &self.owner {
            if owner.is_empty() || owner.len() > MAX_OWNER_LEN {
                return invalid(format!(
                    "an owner is 1 to {MAX_OWNER_LEN} bytes, not {}",
                    owner.len()
                ));
            }
            if self.bind {
                return invalid(
                    "an explicit owner cannot be combined with bind(): a re-entry keeps the \
                     binding of the owner's first hold, not this guard's connection"
                        .into(),
                );
            }
        }
        if self.min_replicas.is_some() && self.bind {
            return invalid(
                "min_replicas cannot be combined with bind(): it needs a connection of its own"
                    .into(),
            );
        }
        if let Some(delay) = self.lock_delay {
            match self.mode {
                Mode::Write => {}
                Mode::Read => {
                    return invalid(
                        "lock_delay applies to write locks only, not to read locks".into(),
                    )
                }
                Mode::Permit { .. } => {
                    return invalid(
                        "lock_delay applies to write locks only, not to semaphore permits".into(),
                    )
                }
            }
            if delay.as_nanos().div_ceil(1_000_000) > MAX_MS {
                return Err(LockError::InvalidRequest {
                    reason: format!("lock_delay {delay:?} is over 2^47 ms"),
                });
            }
        }
        Ok(())
    }

    /// The owner's release takes all of its holds (`ALL`) only when the owner is this guard's
    /// alone (random): an explicit owner may hold the key through other guards too.
    pub(crate) fn release_all(&self) -> bool {
        self.owner.is_none()
    }

    /// LOCK.ACQUIRE / LOCK.RWREAD / LOCK.SEMACQUIRE with its options; `wait` is the
    /// server-side WAIT.
    pub(crate) fn command(&self, key: &str, owner: &str, wait: Option<Duration>) -> Cmd {
        let mut cmd = match self.mode {
            Mode::Write => redis::cmd("LOCK.ACQUIRE"),
            Mode::Read => redis::cmd("LOCK.RWREAD"),
            Mode::Permit { .. } => redis::cmd("LOCK.SEMACQUIRE"),
        };
        cmd.arg(key).arg(owner);
        if let Mode::Permit { capacity } = self.mode {
            cmd.arg(capacity);
        }
        cmd.arg(millis(self.ttl));
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

/// A ttl the module takes and a guard can use: at least [`MIN_TTL`], at most 2^47 ms.
pub(crate) fn check_ttl(ttl: Duration) -> Result<(), LockError> {
    let invalid = |reason: String| Err(LockError::InvalidRequest { reason });
    if ttl < MIN_TTL {
        return invalid(format!(
            "a ttl of {ttl:?} is shorter than {MIN_TTL:?}: the lease would be over before the \
             grant could be used"
        ));
    }
    if ttl.as_nanos().div_ceil(1_000_000) > MAX_MS {
        return invalid(format!("a ttl of {ttl:?} is over 2^47 ms"));
    }
    Ok(())
}
