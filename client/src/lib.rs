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

// The protocol, once: requests, replies, errors, leases, quorum arithmetic and the Redlock
// rounds as plain code with no I/O (sans-IO); `blocking` (threads and sockets) and `aio`
// (tokio) are the two faces that carry it out.
mod proto;

mod blocking;

// The README's examples, compiled as doctests (the crate docs above are their own).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub mod aio;

/// The `redis` crate this client is built on (its `Client`, `Cmd`, `Value` and connection
/// settings appear in this crate's API), so callers need no dependency of their own on a
/// matching version.
pub use redis;

pub use blocking::{
    LockClient, LockGuard, MultiGuard, Redlock, BOUND_CLIENT_NAME, DEFAULT_WAIT_CONNECTIONS,
};
pub use proto::{
    drift, Acquire, Holder, LockError, LockInfo, LossCause, LostLock, Mode, Outcome, OwnerIdentity,
    WaitStrategy, Waiter, Watchdog, MAX_CAPACITY, MIN_TTL,
};
