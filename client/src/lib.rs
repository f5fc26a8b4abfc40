//! Client helper for the `redis-lock` module.
//!
//! - [`LockClient`]: one Redis server. Exclusive and read locks, with a try or a
//!   wait-with-timeout acquire (the server queues the waiter natively, in FIFO order).
//!   Also counting semaphores: one permit per guard ([`Acquire::permit`], see
//!   [semaphores](#semaphores)).
//! - [`Redlock`]: N independent Redis servers, each with the module. A lock is held when a
//!   majority (N/2+1) granted it; requests go to all servers in parallel, each bounded by a
//!   per-instance timeout. Locks only: it refuses semaphore permits.
//!
//! - [`aio::AsyncLockClient`] and [`aio::AsyncRedlock`] (cargo feature `tokio`, on by
//!   default): the same on tokio, cheap
//!   to clone and share across tasks, over one multiplexed connection plus dedicated ones for
//!   waits; a Redis Cluster with the feature `cluster` (on by default); `using` with a
//!   lost-lock signal. See [`aio`].
//! - TLS (`rediss://`, or a `redis::Client` built with certificates, see
//!   [`LockClient::from_client`]) with the cargo feature `tls` (rustls).
//! - Owners of the caller's choice per request ([`Acquire::owner`]) or per client
//!   ([`OwnerIdentity`]: a prefix or one fixed owner), for re-entry and deadlock detection;
//!   [`LockClient::info`] reads `LOCK.INFO`, [`LockGuard::hold_count`] the guard's count.
//! - [`Acquire::min_replicas`]: a grant counts only once that many replicas acknowledged it.
//!
//! The user guide is `docs/client.md` in the repository.
//!
//! Both hand out a [`LockGuard`]: its fencing token(s), its remaining validity, `extend`,
//! `release`, release on drop (best effort), and an optional [`Watchdog`] that keeps extending
//! the lease and reports a lost lock. A hold can also be bound to a connection of the guard's
//! own ([`Acquire::bind`]) and carry a lock-delay ([`Acquire::lock_delay`]): see
//! [bound holds](#bound-holds). Failures are [`LockError`]s: see [errors](#errors).
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
//! # Semaphores
//!
//! [`Acquire::permit`]`(capacity, ttl)` asks one permit of the counting semaphore in the key
//! (`LOCK.SEMACQUIRE`): at most `capacity` permits of the key are held at a time, and waiters
//! ([`Acquire::wait`]) are granted in FIFO order as permits come back. [`LockClient::try_permit`]
//! and [`LockClient::permit`] are the short forms.
//!
//! - **One guard, one permit, one owner.** Each guard asks under a fresh random owner, so it
//!   holds exactly one permit of its own: [`LockGuard::release`] and drop give that permit back
//!   (to the head waiter at once), [`LockGuard::extend`] and a [`Watchdog`] renew its expiry,
//!   [`LockGuard::fencing_token`] is its grant's token, and a permit's ttl, [`Acquire::bind`]
//!   and loss work as for a lock. To take several permits, take several guards. (With an
//!   explicit [`Acquire::owner`], each guard is one more permit of that owner and drops one.)
//! - **Capacity.** A key keeps the capacity it was created with while it has holders or
//!   waiters: another capacity fails with [`LockError::CapacityMismatch`]; a permit of a lock
//!   key, or a lock of a semaphore key, with [`LockError::WrongKind`]. A lock-delay does not
//!   apply to permits ([`LockError::InvalidRequest`]).
//! - **One server only.** [`Redlock`] refuses permits with [`LockError::InvalidRequest`],
//!   before anything is sent. A majority is what makes a Redlock *lock* exclusive: two
//!   majorities share a server, which grants one of them. Permits have no such intersection
//!   argument: each server counts only its own permits, so N/2+1 grants of a capacity-C
//!   semaphore do not bound the holders to C. With 3 servers and capacity 2, three owners can
//!   hold permits on servers {1,2}, {2,3} and {1,3}: every server is within its capacity and
//!   every owner has a majority, yet 3 hold at once. (The only sound bound for a majority is
//!   `floor(N*C / (N/2+1))` holders, more than C in general; demanding all N servers would
//!   bound it to C but lose all fault tolerance.) For capacity 1, a Redlock write lock is the
//!   same thing.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{Acquire, LockClient, Watchdog};
//!
//! let client = LockClient::new("redis://127.0.0.1:6379/", Duration::from_millis(500))?;
//! // At most 4 exports run at a time; wait up to 30 s for a slot, keep it while we work.
//! let permit = client.acquire(
//!     "exports:slots",
//!     Acquire::permit(4, Duration::from_secs(10))
//!         .wait(Duration::from_secs(30))
//!         .watchdog(Watchdog::new()),
//! )?;
//! // ... export; check permit.is_lost() before publishing ...
//! permit.release()?; // the next waiter gets the slot at once
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Errors
//!
//! [`LockError`] tells apart: `Held` (enough servers answered and the lock, or every permit, is
//! taken; also a wait that ran out), `Unreachable` (too few answered), `Expired` (granted too
//! late to be valid, or an extend confirmed too late), `Disconnected` (a bound guard's
//! connections closed), `InvalidRequest` (refused before anything was sent), and the server's
//! refusals, each with every server's answer (typed per server: [`Outcome`]): `Deadlock` (any
//! `-DEADLOCK` reply: an owner that
//! reads the lock asked to write it, or a wait that would close a cycle of waiting owners on
//! that server; only requests with an explicit [`Acquire::owner`] can meet one, since a random
//! owner holds nothing when it asks), `WrongKind` (`-WRONGKIND`), `CapacityMismatch` (the
//! semaphore has another capacity), `MaxWaiters` (`-MAXWAITERS`: the wait queue is full),
//! `NotOwner` (`-NOTOWNER`, from the async guard's extend) and `Refused` (any other error
//! reply, such as `-WRONGTYPE`). A refusal is never retried: the request itself is at fault.
//! `ReplicasNotAcknowledged` is a grant that too few replicas acknowledged
//! ([`Acquire::min_replicas`]; released again).
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

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The `redis` crate this one is built on: the public API takes and returns its types
/// (`redis::Client`, `ConnectionInfo`, `RedisError`, `Value`), so use them from here to get the
/// same version.
pub use redis;

// The README's examples, compiled as doctests (the crate docs above are their own).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub mod aio;
mod bound;
mod guard;
mod info;
mod instance;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use redis::{Cmd, Value};

use crate::bound::BoundLink;
use crate::instance::millis;
pub use bound::BOUND_CLIENT_NAME;
pub use guard::{LockGuard, LostLock, Watchdog};
pub use info::{Holder, LockInfo, OwnerIdentity, Waiter};
pub use instance::{Instance, Outcome};

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

/// The largest lock-delay the module accepts: 2^47 ms.
const MAX_LOCK_DELAY_MS: u128 = 1 << 47;
/// The largest semaphore capacity the module accepts: 2^31 - 1.
pub const MAX_CAPACITY: u32 = (1 << 31) - 1;
/// The longest owner the module accepts, in bytes.
pub(crate) const MAX_OWNER_LEN: usize = 1024;

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
    /// For one server only ([`LockClient`]): [`Redlock`] refuses permits (see
    /// [semaphores](crate#semaphores)). A capacity of 0 or over [`MAX_CAPACITY`], or a
    /// lock-delay, fails with [`LockError::InvalidRequest`] before anything is sent.
    pub fn permit(capacity: u32, ttl: Duration) -> Self {
        Acquire {
            mode: Mode::Permit { capacity },
            ..Self::write(ttl)
        }
    }

    /// Acquires under `owner` instead of a fresh random owner: for several guards of one
    /// logical owner (a job, a transaction), on one server ([`LockClient`]).
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
    /// the one its hold ends with), and [`Redlock`] refuses it (a failed attempt's cleanup could
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
    /// would otherwise hand the lock out twice. One server only ([`LockClient`] and the async
    /// single-server client); [`Redlock`], a bound request and a cluster client refuse it with
    /// [`LockError::InvalidRequest`].
    pub fn min_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.min_replicas = Some((replicas, timeout));
        self
    }

    /// Wait up to `wait` for the lock instead of failing at once. The server takes waits of up
    /// to 2^47 ms (longer ones are refused); a [`Redlock`] counts a longer one (such as
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

    /// Refuses, before anything is sent, what the server would refuse.
    fn check(&self) -> Result<(), LockError> {
        let invalid = |reason: String| Err(LockError::InvalidRequest { reason });
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
            if delay.as_nanos().div_ceil(1_000_000) > MAX_LOCK_DELAY_MS {
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

/// Why a lock (or permit) was not acquired, or a guard's extend or release failed. Every
/// variant but `InvalidRequest` lists what each instance answered.
///
/// When enough instances answered but some refused the request with an error, the variant is
/// the most specific refusal any of them gave: `Deadlock`, then `WrongKind`, then
/// `CapacityMismatch`, then `MaxWaiters`, then `NotOwner`, then `Refused` for any other error
/// (`WRONGTYPE`, ...).
/// None of these is retried by [`Redlock`]: the request itself is at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockError {
    /// Enough instances answered, but the lock is held by someone else (on too many of them):
    /// for a semaphore, every permit is taken (or others queue first). Also the answer to a
    /// wait that ran out.
    Held {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// Too few instances answered to reach a quorum.
    Unreachable {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// An instance refused the request with an error not named by a variant of its own (for
    /// example `WRONGTYPE`: the key holds another Redis type).
    Refused {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The server refused the request because it would deadlock (`-DEADLOCK`): its owner holds
    /// the lock shared and asked for it exclusively (an upgrade: release the read hold first),
    /// or, with a wait, queueing would close a cycle of owners waiting for one another across
    /// keys of that server. Nothing changed; the request did not queue. Only requests with an
    /// explicit owner ([`Acquire::owner`]) can get it: a random owner holds nothing when it asks.
    Deadlock {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The key is the other kind (`-WRONGKIND`): a semaphore permit was asked of a lock key, or
    /// a lock of a semaphore key. Nothing changed.
    WrongKind {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The semaphore key exists with another capacity than the one asked for (a key keeps its
    /// capacity while it has holders or waiters; `LOCK.INFO` shows it). Nothing changed.
    CapacityMismatch {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The lock's validity ran out while acquiring it (the instances were too slow), or before
    /// an extend of it was confirmed.
    Expired {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// A bound lock: its connections to too many instances closed, which ended the hold there
    /// (the causes name them).
    Disconnected {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The server refused to queue the waiting request (`-MAXWAITERS`): the key's wait queue
    /// (`lock.max-waiters`) or the server's waiter limit is full. Retry later.
    MaxWaiters {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The owner does not hold the lock (`-NOTOWNER`): an extend or release of a hold that
    /// expired, was released, or whose key was deleted. The async guard reports a lost lock
    /// with it; the sync guard reports it as `Held` (as before this variant existed).
    NotOwner {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The lock was granted but fewer replicas than asked ([`Acquire::min_replicas`])
    /// acknowledged it within the timeout: the grant was released again.
    ReplicasNotAcknowledged {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that acknowledged the grant in time.
        acknowledged: u32,
        /// The server.
        causes: Vec<(String, Outcome)>,
    },
    /// The request was refused before anything was sent (for example a lock-delay on a read
    /// lock).
    InvalidRequest {
        /// What is wrong with the request.
        reason: String,
    },
}

impl LockError {
    /// What each instance answered.
    pub fn causes(&self) -> &[(String, Outcome)] {
        match self {
            LockError::Held { causes }
            | LockError::Unreachable { causes }
            | LockError::Refused { causes }
            | LockError::Deadlock { causes }
            | LockError::WrongKind { causes }
            | LockError::CapacityMismatch { causes }
            | LockError::Expired { causes }
            | LockError::Disconnected { causes }
            | LockError::MaxWaiters { causes }
            | LockError::NotOwner { causes }
            | LockError::ReplicasNotAcknowledged { causes, .. } => causes,
            LockError::InvalidRequest { .. } => &[],
        }
    }

    /// The request itself was refused (by a server, or before anything was sent): trying it
    /// again unchanged gets the same answer (`MaxWaiters` may pass later, once the queue
    /// shrinks).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            LockError::Refused { .. }
                | LockError::Deadlock { .. }
                | LockError::WrongKind { .. }
                | LockError::CapacityMismatch { .. }
                | LockError::MaxWaiters { .. }
                | LockError::NotOwner { .. }
                | LockError::InvalidRequest { .. }
        )
    }
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            LockError::Held { .. } => "lock (or every permit) held by someone else",
            LockError::Unreachable { .. } => "too few lock instances reachable",
            LockError::Refused { .. } => "lock request refused",
            LockError::Deadlock { .. } => "lock request refused: it would deadlock",
            LockError::WrongKind { .. } => {
                "lock request refused: the key is a lock and a permit was asked, or the reverse"
            }
            LockError::CapacityMismatch { .. } => {
                "permit request refused: the semaphore has another capacity"
            }
            LockError::Expired { .. } => "lock validity ran out",
            LockError::Disconnected { .. } => "bound lock's connections closed",
            LockError::MaxWaiters { .. } => "lock request refused: the wait queue is full",
            LockError::NotOwner { .. } => "the owner does not hold the lock",
            LockError::ReplicasNotAcknowledged {
                wanted,
                acknowledged,
                ..
            } => {
                write!(
                    f,
                    "lock granted but only {acknowledged} of {wanted} replicas acknowledged it \
                     in time (released):"
                )?;
                for (name, outcome) in self.causes() {
                    write!(f, " [{name}: {outcome:?}]")?;
                }
                return Ok(());
            }
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

    /// LOCK.ACQUIRE / LOCK.RWREAD / LOCK.SEMACQUIRE everywhere over pooled connections, with
    /// server-side WAIT when `wait` is set.
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

    /// `LOCK.INFO key` on server `i`.
    pub(crate) fn info(&self, i: usize, key: &str) -> Result<Option<LockInfo>, LockError> {
        let mut cmd = redis::cmd("LOCK.INFO");
        cmd.arg(key);
        let cmds: Vec<Option<Cmd>> = (0..self.instances.len())
            .map(|j| (j == i).then(|| cmd.clone()))
            .collect();
        let name = self
            .instances
            .get(i)
            .map(|s| s.name().to_string())
            .unwrap_or_default();
        let reply = instance::scatter_gather(&self.instances, &cmds, None)
            .into_iter()
            .nth(i)
            .unwrap_or_else(|| Err(Outcome::Unreachable("no such server".into())));
        match reply {
            Ok(v) => LockInfo::from_reply(&v).map_err(|e| LockError::Refused {
                causes: vec![(name, Outcome::Refused(e))],
            }),
            Err(o) => Err(classify(&[(name, o)], 1)),
        }
    }

    /// LOCK.EXTEND everywhere: Granted where the owner still holds the lock.
    pub(crate) fn extend(&self, key: &str, owner: &str, ttl: Duration) -> Vec<Outcome> {
        self.run(&extend_cmd(key, owner, ttl), None)
            .into_iter()
            .map(extend_outcome)
            .collect()
    }

    /// LOCK.RELEASE ... ALL everywhere (NOTOWNER counts as done: the hold is gone either way);
    /// without `all`, one hold.
    pub(crate) fn release(&self, key: &str, owner: &str, all: bool) -> Vec<Outcome> {
        let cmd = if all {
            release_cmd(key, owner)
        } else {
            release_one_cmd(key, owner)
        };
        self.run(&cmd, None)
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

pub(crate) fn acquire_outcome(r: Result<Value, Outcome>) -> Outcome {
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

/// LOCK.RELEASE without ALL: one hold of an owner that may hold the key through other guards.
pub(crate) fn release_one_cmd(key: &str, owner: &str) -> Cmd {
    let mut cmd = redis::cmd("LOCK.RELEASE");
    cmd.arg(key).arg(owner);
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

/// The request with a default [`Watchdog`] when it has none (for the `using` helpers).
pub(crate) fn with_watchdog(request: Acquire) -> Acquire {
    if request.watchdog.is_none() {
        request.watchdog(Watchdog::new())
    } else {
        request
    }
}

/// Clock drift allowance for a lease of `ttl`: 1% of it plus 2 ms (as Redlock specifies).
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

fn random_owner() -> String {
    info::random_hex()
}

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
    pub fn new(url: &str, timeout: Duration) -> redis::RedisResult<Self> {
        Ok(LockClient {
            servers: Arc::new(Servers {
                instances: vec![Instance::new(url, timeout)?],
                quorum: 1,
            }),
            owner: OwnerIdentity::Random,
        })
    }

    /// A client for the server an existing `redis::Client` connects to (its address, login,
    /// database and TLS settings); the lock client opens connections of its own.
    pub fn from_client(client: &redis::Client, timeout: Duration) -> redis::RedisResult<Self> {
        Ok(LockClient {
            servers: Arc::new(Servers {
                instances: vec![Instance::from_info(
                    client.get_connection_info().clone(),
                    timeout,
                )?],
                quorum: 1,
            }),
            owner: OwnerIdentity::Random,
        })
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
        if request.min_replicas.is_some() {
            return self.acquire_replicated(key, owner, request, started);
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
            _ => {
                if let Some(links) = links {
                    self.servers.discard(links, &outcomes, key, &owner);
                }
                let causes = self.servers.named(outcomes);
                return Err(classify(&causes, 1));
            }
        };
        Ok(self.guard(key, owner, request, token, started, links))
    }

    /// The guard of a grant; `started` is when the request was sent.
    fn guard(
        &self,
        key: &str,
        owner: String,
        request: Acquire,
        token: u64,
        started: Instant,
        links: Option<Vec<Option<BoundLink>>>,
    ) -> LockGuard {
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
        LockGuard::new(
            Arc::clone(&self.servers),
            key,
            owner,
            request,
            vec![(0, token)],
            deadline,
            links,
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
    ) -> Result<LockGuard, LockError> {
        let (replicas, timeout) = request.min_replicas.unwrap_or_default();
        let instance = &self.servers.instances[0];
        let name = instance.name().to_string();
        let unreachable = |e: String| LockError::Unreachable {
            causes: vec![(name.clone(), Outcome::Unreachable(e))],
        };
        let mut conn = instance.connect().map_err(|e| unreachable(e.to_string()))?;
        let margin = instance.timeout() + instance::WAIT_REPLY_MARGIN;
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
                instance::error_outcome(&e)
            }
        }));
        let Outcome::Granted(token) = outcome else {
            return Err(classify(&[(name, outcome)], 1));
        };
        let guard = self.guard(key, owner, request, token, started, None);
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

    /// Acquires as `request` says (with a [`Watchdog`] added when it has none), runs `work`
    /// with the guard, then releases it and returns what `work` returned. `work` should check
    /// [`LockGuard::is_lost`] before each step that needs the lock's protection: it turns true
    /// once the watchdog finds the lock gone (its key deleted, its lease ended). If `work`
    /// panics, the guard's drop releases the hold.
    pub fn using<T>(
        &self,
        key: &str,
        request: Acquire,
        work: impl FnOnce(&LockGuard) -> T,
    ) -> Result<T, LockError> {
        let guard = self.acquire(key, with_watchdog(request))?;
        let out = work(&guard);
        // A release that fails leaves the hold to its ttl; `work`'s result stands.
        let _ = guard.release();
        Ok(out)
    }
}

/// With one server there is no cross-server drift, but the client's and the server's clocks
/// still run separately: a margin kept off every single-server lease.
pub(crate) const SINGLE_SERVER_MARGIN: Duration = Duration::from_millis(2);
/// Allowance for the transit of a waited grant's reply (see `LockClient::acquire`).
pub(crate) const WAITED_GRANT_MARGIN: Duration = Duration::from_millis(5);

/// What an error reply of a server means to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Refusal {
    // In order of precedence, most specific first.
    Deadlock,
    WrongKind,
    CapacityMismatch,
    MaxWaiters,
    NotOwner,
    Other,
}

/// The kind of an error answer (typed, or read from the text of an untyped `Refused`).
fn refusal(outcome: &Outcome) -> Option<Refusal> {
    Some(match outcome {
        Outcome::Deadlock(_) => Refusal::Deadlock,
        Outcome::WrongKind(_) => Refusal::WrongKind,
        Outcome::CapacityMismatch(_) => Refusal::CapacityMismatch,
        Outcome::MaxWaiters(_) => Refusal::MaxWaiters,
        Outcome::NotOwner(_) => Refusal::NotOwner,
        Outcome::Refused(text) => match Outcome::from_error_text(text.as_str()) {
            Outcome::Refused(_) => Refusal::Other,
            typed => return refusal(&typed),
        },
        Outcome::Granted(_) | Outcome::Held | Outcome::Unreachable(_) => return None,
    })
}

/// Names the failure from what the instances answered, given the quorum needed.
pub(crate) fn classify(causes: &[(String, Outcome)], quorum: usize) -> LockError {
    let reachable = causes
        .iter()
        .filter(|(_, o)| !matches!(o, Outcome::Unreachable(_)))
        .count();
    let refused = causes.iter().filter_map(|(_, o)| refusal(o)).min();
    let causes = causes.to_vec();
    if reachable < quorum {
        return LockError::Unreachable { causes };
    }
    match refused {
        Some(Refusal::Deadlock) => LockError::Deadlock { causes },
        Some(Refusal::WrongKind) => LockError::WrongKind { causes },
        Some(Refusal::CapacityMismatch) => LockError::CapacityMismatch { causes },
        Some(Refusal::MaxWaiters) => LockError::MaxWaiters { causes },
        Some(Refusal::NotOwner) => LockError::NotOwner { causes },
        Some(Refusal::Other) => LockError::Refused { causes },
        None => LockError::Held { causes },
    }
}

/// Why [`Redlock`] refuses semaphore permits (see the [crate documentation](crate#semaphores)).
const REDLOCK_NO_PERMITS: &str = "Redlock does not take semaphore permits: the servers' \
    semaphores are independent, so grants from a majority do not bound the holders to the \
    capacity (capacity 2 on 3 servers: three owners can each hold a permit on a different pair \
    of servers); take permits from one server with LockClient (for capacity 1, a Redlock write \
    lock is the same thing)";

/// Why [`Redlock`] refuses an explicit owner.
const REDLOCK_NO_OWNER: &str = "Redlock does not take an explicit owner: a failed attempt is \
    released on every server, which could not tell this attempt's holds from the owner's other \
    ones; use LockClient (one server) for owners of your own";

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
    retry_delay: (Duration, Duration),
    strategy: WaitStrategy,
    /// An owner prefix (see [`Redlock::owner_prefix`]), empty for none.
    prefix: String,
}

/// How a [`Redlock`] acquire with [`Acquire::wait`] waits for a held lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WaitStrategy {
    /// The default: after a failed attempt (released everywhere, so nothing is held), queue on
    /// one server with the module's `WAIT` (the same server for every waiter of a key, chosen
    /// by the key, skipping servers that did not answer), in slices of at most a second and a
    /// quarter of the ttl (the validity of a lock got this way counts from the start of the
    /// slice, the earliest moment its grant can have started). When that server grants, ask
    /// the others at once (without waiting, retrying a few times over
    /// some milliseconds while the previous holder's releases arrive); without a majority,
    /// release and back off (randomly, growing to a second). A waiter then costs each server
    /// about one or two commands per second, and a released lock passes to the head waiter in
    /// about two round trips. A bound request ([`Acquire::bind`]) always polls.
    #[default]
    Queue,
    /// Retry the whole attempt after a random delay in [`Redlock::retry_delay`] (1 to 20 ms by
    /// default): every waiter costs every server about a hundred commands per second.
    Poll,
}

/// When a Redlock acquire waiting `wait` gives up. A wait too long for the clock (such as
/// `Duration::MAX`, for "as long as it takes") is cut to about a century rather than overflow
/// (an `Instant` plus a huge `Duration` panics).
pub(crate) fn give_up_after(wait: Option<Duration>) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let now = Instant::now();
    let wait = wait.unwrap_or_default().min(CENTURY);
    now.checked_add(wait).unwrap_or(now)
}

/// The longest server-side wait of one [`WaitStrategy::Queue`] slice.
pub(crate) const QUEUE_SLICE: Duration = Duration::from_secs(1);

/// The server a [`WaitStrategy::Queue`] waiter of `key` queues on: the same for every waiter
/// of the key (so they queue in one FIFO), chosen from the key's bytes, skipping servers that
/// did not answer the last attempt (`answered[i]` false).
pub(crate) fn designated_server(key: &str, answered: &[bool], n: usize) -> usize {
    let home = key.bytes().fold(0usize, |h, b| {
        h.wrapping_mul(31).wrapping_add(usize::from(b))
    }) % n.max(1);
    (0..n)
        .map(|k| (home + k) % n)
        .find(|&i| answered.get(i).copied().unwrap_or(true))
        .unwrap_or(home)
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
        Ok(Self::of(instances))
    }

    /// The same over the servers existing `redis::Client`s connect to (their address, login,
    /// database and TLS settings); the Redlock opens connections of its own.
    pub fn from_clients(
        clients: &[redis::Client],
        per_instance_timeout: Duration,
    ) -> redis::RedisResult<Self> {
        let instances = clients
            .iter()
            .map(|c| Instance::from_info(c.get_connection_info().clone(), per_instance_timeout))
            .collect::<redis::RedisResult<Vec<_>>>()?;
        Ok(Self::of(instances))
    }

    fn of(instances: Vec<Instance>) -> Self {
        let quorum = instances.len() / 2 + 1;
        Redlock {
            servers: Arc::new(Servers { instances, quorum }),
            retry_delay: (Duration::from_millis(1), Duration::from_millis(20)),
            strategy: WaitStrategy::Queue,
            prefix: String::new(),
        }
    }

    /// Owners of this Redlock's guards start with `prefix` (then 32 random hex digits), so
    /// `LOCK.INFO` shows whose holds they are. Each guard still has an owner of its own
    /// (Redlock takes no fixed owner: see [`Acquire::owner`]). At most 992 bytes.
    pub fn owner_prefix(mut self, prefix: impl Into<String>) -> Result<Self, LockError> {
        let prefix = prefix.into();
        OwnerIdentity::Prefix(prefix.clone()).check()?;
        self.prefix = prefix;
        Ok(self)
    }

    fn new_owner(&self) -> String {
        format!("{}{}", self.prefix, random_owner())
    }

    /// How an acquire with `wait` waits ([`WaitStrategy::Queue`] by default).
    pub fn wait_strategy(mut self, strategy: WaitStrategy) -> Self {
        self.strategy = strategy;
        self
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

    /// `LOCK.INFO key` on every server, in order: (server, what it said).
    pub fn info(&self, key: &str) -> Vec<(String, Result<Option<LockInfo>, LockError>)> {
        self.servers
            .instances
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name().to_string(), self.servers.info(i, key)))
            .collect()
    }

    /// Acquires as `request` says (with a [`Watchdog`] added when it has none), runs `work`
    /// with the guard, then releases it and returns what `work` returned. `work` should check
    /// [`LockGuard::is_lost`] before each step that needs the lock's protection: it turns true
    /// once the watchdog finds the lock gone (its key deleted, its lease ended). If `work`
    /// panics, the guard's drop releases the hold.
    pub fn using<T>(
        &self,
        key: &str,
        request: Acquire,
        work: impl FnOnce(&LockGuard) -> T,
    ) -> Result<T, LockError> {
        let guard = self.acquire(key, with_watchdog(request))?;
        let out = work(&guard);
        // A release that fails leaves the hold to its ttl; `work`'s result stands.
        let _ = guard.release();
        Ok(out)
    }

    /// Acquires the lock on a majority. Without `wait`, one attempt; with it, attempts repeat
    /// until the wait is over, waiting in between as the [`WaitStrategy`] says. A failed attempt is released everywhere.
    /// A refusal (`Refused`, `Deadlock`, `WrongKind`, `CapacityMismatch`) ends the attempts at
    /// once.
    ///
    /// Semaphore permits ([`Acquire::permit`]) and explicit owners ([`Acquire::owner`]) are
    /// refused with [`LockError::InvalidRequest`] before anything is sent: a majority of
    /// independent semaphores does not bound the holders to the capacity (see
    /// [semaphores](crate#semaphores)).
    pub fn acquire(&self, key: &str, request: Acquire) -> Result<LockGuard, LockError> {
        request.check()?;
        if matches!(request.mode, Mode::Permit { .. }) {
            return Err(LockError::InvalidRequest {
                reason: REDLOCK_NO_PERMITS.into(),
            });
        }
        if request.owner.is_some() {
            return Err(LockError::InvalidRequest {
                reason: REDLOCK_NO_OWNER.into(),
            });
        }
        if request.min_replicas.is_some() {
            return Err(LockError::InvalidRequest {
                reason: "Redlock does not take min_replicas: its safety comes from a majority of \
                         independent servers, not from replication"
                    .into(),
            });
        }
        let same_owner = self.new_owner();
        let give_up = give_up_after(request.wait);
        let mut backoff = Duration::ZERO;
        let quorum = self.servers.quorum;
        // A bound request's connections, kept from one attempt to the next.
        let mut links = request.bind.then(|| no_links(self.servers.instances.len()));
        loop {
            // A bound request takes a new owner for each attempt: a hold of an earlier attempt
            // that is still bound to a connection we gave up on is then never re-entered (a
            // re-entry would keep that connection's binding).
            let owner = if request.bind {
                self.new_owner()
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
                        self.servers.release(key, &owner, true);
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
            if now >= give_up || error.is_refusal() {
                return Err(error);
            }
            if self.strategy == WaitStrategy::Queue && !request.bind {
                let answered: Vec<bool> = error
                    .causes()
                    .iter()
                    .map(|(_, o)| !matches!(o, Outcome::Unreachable(_)))
                    .collect();
                match self.queue_once(key, &owner, &request, give_up, &answered, &mut backoff) {
                    Some(Ok(guard)) => return Ok(guard),
                    Some(Err(e)) => return Err(e),
                    None => continue,
                }
            }
            let (min, max) = self.retry_delay;
            let delay = rand::thread_rng().gen_range(min..max);
            std::thread::sleep(delay.min(give_up - now));
        }
    }

    /// One [`WaitStrategy::Queue`] round: waits on the key's designated server for at most a
    /// slice; when it grants, asks the others. `Some` ends the acquire (a guard, or a refusal);
    /// `None` means try again (after any backoff it slept).
    fn queue_once(
        &self,
        key: &str,
        owner: &str,
        request: &Acquire,
        give_up: Instant,
        answered: &[bool],
        backoff: &mut Duration,
    ) -> Option<Result<LockGuard, LockError>> {
        let n = self.servers.instances.len();
        let quorum = self.servers.quorum;
        let designated = designated_server(key, answered, n);
        let slice = give_up
            .saturating_duration_since(Instant::now())
            .min(QUEUE_SLICE)
            .min(request.ttl / 4);
        if slice < Duration::from_millis(1) {
            return None;
        }
        let one = |i: usize, wait: Option<Duration>| -> Vec<Option<Cmd>> {
            (0..n)
                .map(|j| (j == i).then(|| request.command(key, owner, wait)))
                .collect()
        };
        // The grant may come at any moment of the slice, and the lease starts then: the
        // validity is counted from the slice's start, the earliest moment it can have started.
        let sent_at = Instant::now();
        let waited = instance::scatter_gather(
            &self.servers.instances,
            &one(designated, Some(slice)),
            Some(slice),
        );
        let first = waited
            .into_iter()
            .nth(designated)
            .map(acquire_outcome)
            .unwrap_or(Outcome::Unreachable("not sent".into()));
        match first {
            Outcome::Granted(token) => {
                let mut tokens = vec![(designated, token)];
                let others: Vec<Option<Cmd>> = (0..n)
                    .map(|j| (j != designated).then(|| request.command(key, owner, None)))
                    .collect();
                let mut outcomes = Vec::new();
                // The previous holder's releases may still be on their way: a few quick tries.
                for pause in [0u64, 1, 2, 4, 8] {
                    std::thread::sleep(Duration::from_millis(pause));
                    let missing: Vec<Option<Cmd>> = others
                        .iter()
                        .enumerate()
                        .map(|(j, c)| c.clone().filter(|_| !tokens.iter().any(|(i, _)| *i == j)))
                        .collect();
                    outcomes = instance::scatter_gather(&self.servers.instances, &missing, None)
                        .into_iter()
                        .map(acquire_outcome)
                        .collect();
                    for (j, o) in outcomes.iter().enumerate() {
                        if let (Outcome::Granted(t), Some(_)) = (o, &missing[j]) {
                            tokens.push((j, *t));
                        }
                    }
                    if tokens.len() >= quorum
                        || outcomes.iter().any(|o| o.is_refusal())
                        || Instant::now() >= give_up
                    {
                        break;
                    }
                }
                let validity = request
                    .ttl
                    .checked_sub(sent_at.elapsed() + drift(request.ttl))
                    .filter(|v| !v.is_zero());
                if tokens.len() >= quorum {
                    if let Some(validity) = validity {
                        tokens.sort_unstable();
                        return Some(Ok(LockGuard::new(
                            Arc::clone(&self.servers),
                            key,
                            owner.to_string(),
                            request.clone(),
                            tokens,
                            Instant::now() + validity,
                            None,
                        )));
                    }
                }
                self.servers.release(key, owner, true);
                let causes = self.servers.named(outcomes);
                let error = classify(&causes, quorum);
                if error.is_refusal() {
                    return Some(Err(error));
                }
                // The designated server was free but the others were not (a holder without
                // it): back off, growing, so such a round stays rare.
                let (min, _) = self.retry_delay;
                *backoff = (*backoff * 2).clamp(min.max(Duration::from_millis(20)), QUEUE_SLICE);
                let delay = rand::thread_rng().gen_range(*backoff / 2..=*backoff);
                std::thread::sleep(delay.min(give_up.saturating_duration_since(Instant::now())));
                None
            }
            // The slice ran out: the next round's attempt asks everyone again.
            Outcome::Held => None,
            // A full queue on that server: wait outside it, backing off.
            Outcome::MaxWaiters(_) => {
                *backoff = (*backoff * 2).clamp(Duration::from_millis(20), QUEUE_SLICE);
                let delay = rand::thread_rng().gen_range(*backoff / 2..=*backoff);
                std::thread::sleep(delay.min(give_up.saturating_duration_since(Instant::now())));
                None
            }
            Outcome::Unreachable(_) => {
                // Whatever it may still grant late is released by the next failed attempt.
                let (min, max) = self.retry_delay;
                let delay = rand::thread_rng().gen_range(min..max);
                std::thread::sleep(delay.min(give_up.saturating_duration_since(Instant::now())));
                None
            }
            refused => {
                let causes = self.servers.named(
                    (0..n)
                        .map(|i| {
                            if i == designated {
                                refused.clone()
                            } else {
                                Outcome::Unreachable("not asked".into())
                            }
                        })
                        .collect(),
                );
                // A refusal of the waiting request (MAXWAITERS, WRONGTYPE, ...): typed as the
                // server said it, whatever the quorum.
                Some(Err(classify(&causes, 1)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> LockError {
        classify(&[("s1".into(), Outcome::Refused(text.into()))], 1)
    }

    #[test]
    fn error_replies_map_to_their_variants() {
        // As the pooled path (`CODE detail`), the bound path (the line after `-`) and the
        // `redis` crate's Display (`CODE: detail`) carry them.
        for text in [
            "DEADLOCK the owner holds this lock shared and asked for it exclusively",
            "-DEADLOCK waiting would close a cycle",
            "DEADLOCK: a cycle",
        ] {
            assert!(matches!(one(text), LockError::Deadlock { .. }), "{text}");
        }
        for text in [
            "WRONGKIND the key holds a lock, not a semaphore",
            "WRONGKIND: the key holds a semaphore, not a lock",
        ] {
            assert!(matches!(one(text), LockError::WrongKind { .. }), "{text}");
        }
        assert!(matches!(
            one("ERR the semaphore has another capacity (LOCK.INFO shows it)"),
            LockError::CapacityMismatch { .. }
        ));
        for text in [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "ERR capacity must be between 1 and 2147483647",
            "DEADLOCKED not our code",
        ] {
            assert!(matches!(one(text), LockError::Refused { .. }), "{text}");
        }
        assert!(matches!(
            one("MAXWAITERS the lock's wait queue is full"),
            LockError::MaxWaiters { .. }
        ));
        assert!(matches!(
            one("NOTOWNER the owner does not hold this lock"),
            LockError::NotOwner { .. }
        ));
        assert_eq!(
            Outcome::from_error_text("MAXWAITERS: full"),
            Outcome::MaxWaiters("MAXWAITERS: full".into())
        );
        let e = one("DEADLOCK x");
        assert_eq!(e.causes().len(), 1);
        assert!(e.to_string().contains("deadlock"), "{e}");
        assert!(e.to_string().contains("DEADLOCK x"), "{e}");
    }

    #[test]
    fn the_redis_crates_errors_map_by_their_code_not_their_display() {
        // How the `redis` crate hands over `-ERR the semaphore has another capacity ...`: its
        // Display starts with a description, not with `ERR`.
        let e = redis::RedisError::from((
            redis::ServerErrorKind::ResponseError.into(),
            "An error was signalled by the server",
            "the semaphore has another capacity (LOCK.INFO shows it)".to_string(),
        ));
        assert!(e.to_string().starts_with("An error"), "{e}");
        assert!(matches!(
            instance::error_outcome(&e),
            Outcome::CapacityMismatch(_)
        ));
        let e = redis::RedisError::from((
            redis::ServerErrorKind::ResponseError.into(),
            "An error was signalled by the server",
            "ttl must be between 1 and 140737488355328 milliseconds".to_string(),
        ));
        assert!(
            matches!(instance::error_outcome(&e), Outcome::Refused(t) if t.starts_with("ERR ttl"))
        );
    }

    #[test]
    fn the_most_specific_refusal_wins_and_too_few_answers_are_unreachable() {
        let causes = vec![
            ("a".to_string(), Outcome::Refused("WRONGTYPE x".into())),
            ("b".to_string(), Outcome::Refused("DEADLOCK y".into())),
            ("c".to_string(), Outcome::Held),
        ];
        assert!(matches!(
            classify(&causes, 2),
            LockError::Deadlock { causes } if causes.len() == 3
        ));
        let causes = vec![
            ("a".to_string(), Outcome::Refused("DEADLOCK y".into())),
            ("b".to_string(), Outcome::Unreachable("down".into())),
            ("c".to_string(), Outcome::Unreachable("down".into())),
        ];
        assert!(matches!(
            classify(&causes, 2),
            LockError::Unreachable { .. }
        ));
        assert!(matches!(
            classify(&[("a".into(), Outcome::Held)], 1),
            LockError::Held { .. }
        ));
    }

    #[test]
    fn permit_requests_are_checked_and_spelled_as_the_module_wants() {
        let ttl = Duration::from_millis(1500);
        let cmd = Acquire::permit(3, ttl)
            .wait(Duration::from_secs(2))
            .bind()
            .command("k", "o", Some(Duration::from_secs(2)));
        let words: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        let expected: Vec<&[u8]> = vec![
            b"LOCK.SEMACQUIRE",
            b"k",
            b"o",
            b"3",
            b"1500",
            b"WAIT",
            b"2000",
            b"BIND",
        ];
        assert_eq!(words, expected);
        for bad in [0, MAX_CAPACITY + 1, u32::MAX] {
            assert!(matches!(
                Acquire::permit(bad, ttl).check(),
                Err(LockError::InvalidRequest { .. })
            ));
        }
        assert!(Acquire::permit(1, ttl).check().is_ok());
        assert!(Acquire::permit(MAX_CAPACITY, ttl).check().is_ok());
        let e = Acquire::permit(2, ttl)
            .lock_delay(Duration::from_secs(1))
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("semaphore permits"), "{e}");
        assert!(Acquire::permit(2, ttl).release_all());
        assert!(!Acquire::permit(2, ttl).owner("o").release_all());
    }

    #[test]
    fn explicit_owners_are_checked() {
        let ttl = Duration::from_secs(1);
        assert!(Acquire::write(ttl).owner("o").check().is_ok());
        assert!(Acquire::write(ttl).owner("o".repeat(1024)).check().is_ok());
        for bad in [String::new(), "o".repeat(1025)] {
            assert!(matches!(
                Acquire::write(ttl).owner(bad).check(),
                Err(LockError::InvalidRequest { .. })
            ));
        }
        let e = Acquire::read(ttl).owner("o").bind().check().unwrap_err();
        assert!(e.to_string().contains("bind"), "{e}");
    }
}
