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
//!   [`LockClient::from_client`]) with the cargo feature `tls` (rustls). The [`redis`] crate
//!   (1.8) is re-exported.
//! - Owners of the caller's choice per request ([`Acquire::owner`]) or per client
//!   ([`OwnerIdentity`]: a prefix or one fixed owner), for re-entry and deadlock detection;
//!   [`LockClient::info`] reads `LOCK.INFO`, [`LockGuard::hold_count`] the guard's count.
//! - [`Acquire::min_replicas`]: a grant counts only once that many replicas acknowledged it.
//! - Several keys at once ([`LockClient::acquire_all`], [`Redlock::acquire_all`]: a
//!   [`MultiGuard`]), taken in one global order so that two such requests never deadlock.
//!
//! The user guide is `docs/client.md` in the repository.
//!
//! Both hand out a [`LockGuard`]: its fencing token(s), its remaining validity, `extend`,
//! `release`, release on drop, and an optional [`Watchdog`] that keeps extending the lease and
//! reports a lost lock. A lost lock is never reported as a success: its release, extend and
//! `using` fail with [`LockError::Lost`], and the client notices a loss within about a
//! millisecond, without polling: see [loss](#loss). A hold can also be bound to a connection of
//! the guard's own ([`Acquire::bind`]) and carry a lock-delay ([`Acquire::lock_delay`]): see
//! [bound holds](#bound-holds). Failures are [`LockError`]s: see [errors](#errors); limits on
//! connections and ttls: see [limits](#limits).
//!
//! # Connections
//!
//! Per server, a client keeps:
//!
//! - **One link for short commands** (try-acquire, extend, release, `LOCK.INFO`: the server
//!   answers at once): a plain socket in RESP3 with the [loss](#loss) watcher's tracking on it,
//!   on which every thread's short commands are pipelined. A writer puts its reply slot in line
//!   and writes under a mutex held only for that; one reader thread per server (named
//!   `redis-lock-watch`) hands each reply to its caller and reads the server's pushes. The link
//!   is opened in the background, never inside a request: until it is up, and where there is
//!   none (a TLS server, a server that refuses `CLIENT TRACKING`), short commands use pooled
//!   connections, one per request in flight.
//! - **Connections for blocking waits** (an acquire with `WAIT`): one per wait in progress,
//!   kept in a small pool afterwards, at most [`LockClient::max_wait_connections`] of them
//!   (see [limits](#limits)).
//!
//! No lock is held across I/O, and short commands never share a connection with a wait: so
//! renewals and releases never wait behind a blocking acquire of the same [`LockClient`] or
//! [`Redlock`], and one client can be shared by all threads of a process. (Short commands on
//! the link are answered in order, as on any pipelined connection.)
//!
//! Each server's `timeout` bounds connecting and every reply of a short command, so a paused or
//! dead server costs at most about that much per call (two timeouts when a pooled connection
//! must be opened first). A blocking acquire's reply may take its wait plus the timeout plus a
//! margin of one second: a read timeout never cuts a long wait short. After an I/O failure the
//! connection is dropped (it may still carry a late reply) and a new one is opened next time; a
//! link that closes while guards are held is reopened at once and re-reads their keys.
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
//!   also for a waiting acquire; it is never pooled nor shared (count one connection per bound
//!   guard and server against the server's `maxclients`: the cost of crash safety). The guard
//!   keeps the ones its
//!   grants came on; its extends (the watchdog's too) and its release go over them (while the
//!   watchdog's extend is using one, another request of the guard goes over a pooled connection
//!   instead, so nothing waits for it). Release and drop send `LOCK.RELEASE ... ALL` on each and
//!   then close it: the release comes first, so a lock-delay does not start. A connection whose
//!   acquire was not granted is closed; if its reply did not come in time, a release is written
//!   behind it first (a late grant is then released, and a wait still queued ends with the
//!   close). A Redlock attempt that fails releases over its connections and keeps them for the
//!   next attempt, which uses a new owner.
//! - **Plain sockets.** Bound connections are TCP or Unix sockets: on a TLS server a bound
//!   acquire fails ([`LockError::Unreachable`]); nothing is sent in clear. (The async client's
//!   bound connections are the `redis` crate's and speak TLS.)
//! - **A slow server does not cost the hold.** A reply that times out on a bound connection is
//!   not a reason to close it (which would end the hold): the late reply is skipped when it
//!   comes. Such an extend counts as unanswered, as on a pooled connection.
//! - **Loss.** A bound guard is lost once fewer than a quorum of its connections are open (one
//!   for [`LockClient`], N/2+1 for [`Redlock`]), with [`LossCause::ConnectionClosed`]: a
//!   connection is found closed when the server has closed it (end of stream, reset, or
//!   anything it sends unasked) or a request on it fails. Every [`LockGuard::is_lost`] and
//!   [`LockGuard::validity`] checks the idle connections without blocking and without sending
//!   anything (the socket is read in non-blocking mode), so it sees a closing within moments of
//!   its arrival, without a watchdog. The server's change of the key also reaches the loss
//!   watcher, which then checks the connections. A watchdog checks them every 100 ms between
//!   extends and reports the loss ([`LostLock::causes`] names the closed connections). A closing that never reaches this
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
//! Every public operation, constructors included, fails with the one [`LockError`]
//! (`#[non_exhaustive]`: a `match` needs a catch-all arm). It tells apart: `Held` (enough
//! servers answered and the lock, or every permit, is taken; also a wait that ran out),
//! `Unreachable` (too few answered), `Lost` (the guard's lock was lost before its release,
//! extend or `using` ended: [`LostLock`] says how and when, see [loss](#loss)), `Expired` (a
//! Redlock's grants came too late to leave any validity), `WaitLimit` (no wait connection came
//! free in time, see [limits](#limits)), `InvalidRequest` (refused before anything was sent),
//! `Config` (a client could not be built: a malformed URL, a Redlock with no server), and the
//! server's refusals, each with every server's answer (typed per server: [`Outcome`]):
//! `ModuleMissing` (a server answered `unknown command` to a `LOCK.*` command: the module is
//! not loaded there), `Deadlock` (any `-DEADLOCK` reply: an owner that
//! reads the lock asked to write it, or a wait that would close a cycle of waiting owners on
//! that server; only requests with an explicit [`Acquire::owner`] can meet one, since a random
//! owner holds nothing when it asks), `WrongKind` (`-WRONGKIND`), `CapacityMismatch` (the
//! semaphore has another capacity), `MaxWaiters` (`-MAXWAITERS`: the wait queue is full),
//! `NotOwner` (`-NOTOWNER` outside a guard; a guard reports `Lost`) and `Refused` (any other
//! error reply, such as `-WRONGTYPE`). A refusal is never retried: the request itself is at
//! fault. `ReplicasNotAcknowledged` is a grant that too few replicas acknowledged
//! ([`Acquire::min_replicas`]; released again). The sync and the async clients give the same
//! variant, with the same cause texts, for the same situation (a reply that did not come in
//! time reads `no reply in time` in both).
//!
//! # Validity and loss
//!
//! A guard's *validity* ends at the lease's ttl counted from when the granting (or the last
//! confirmed extending) request was **sent**, less the clock drift allowance ([`drift`]; for
//! a waited single-server grant, from when the grant's reply arrived, less a transit margin):
//! the latest moment at which the lock is certainly still held. [`LockGuard::is_lost`] is true
//! from the moment validity runs out without a confirmed extend, whether or not a watchdog
//! runs and even while the watchdog's own extend is still waiting for an answer; it is also true
//! once the client found that a majority no longer holds the lock for this owner (see
//! [loss](#loss)). Once true it stays true: an extend confirmed after validity ran out does not
//! revive the guard (the lock may have been free in between), it fails with
//! [`LockError::Lost`] ([`LossCause::Expired`]). So check `is_lost()` (or
//! [`LockGuard::validity`]) right before acting on the lock's protection, and prefer fencing
//! tokens where the protected resource can check them. The watchdog reports a loss once, through
//! its `on_lost` callback and `notify` channel, as soon as the guard is found lost (by the loss
//! watcher, an extend, or the validity running out).
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
//!
//! # Loss
//!
//! A lock can end while its guard lives: its key deleted (`DEL`, `FLUSHALL`, eviction), its ttl
//! passed on the server, taken by another owner (after a failover that lost the grant), its
//! key overwritten, its bound connection closed. The guard then reports it, and never as a
//! success:
//!
//! - [`LockGuard::is_lost`] turns true, [`LockGuard::loss`] gives the [`LostLock`]: the key,
//!   the [`LossCause`] (`Expired`, `Deleted`, `Overwritten`, `Taken`, `Ended`,
//!   `ConnectionClosed`), when the client noticed (`noticed_at`), and what the servers
//!   answered. A watchdog reports it once, the async [`aio::LostSignal`] fires.
//! - [`LockGuard::release`], [`MultiGuard::release`] and [`LockClient::using`] (and their
//!   async and Redlock forms) return [`LockError::Lost`]. A release succeeds only if the lock
//!   was held until it. A release that a quorum of servers confirms (they released a hold of
//!   the guard's own random owner) is a success even if the local validity had run out:
//!   nobody else can have been granted that owner's hold, so it was never broken. With an
//!   explicit owner ([`Acquire::owner`]) it proves nothing, and such a late release is `Lost`.
//!   `using` returns the closure's value only if the lock was held until the release; a
//!   release that too few servers answered while the lease was still valid keeps the value
//!   (the lock was held while the closure ran; the hold ends at its ttl).
//! - [`LockGuard::extend`] and [`LockGuard::extend_for`] of a lost guard return
//!   [`LockError::Lost`].
//!
//! **Noticed within about a millisecond, without polling.** Each client's short commands go
//! over one connection per server in RESP3 with `CLIENT TRACKING on BCAST NOLOOP PREFIX <key>`
//! for the keys its guards hold (sync: the link, see [connections](#connections); async: the
//! shared multiplexed connection). When anyone else changes a held key, the server pushes an
//! invalidation; the client reads `LOCK.INFO key OWNER owner` for each owner among the key's
//! guards (that owner's entry alone: O(1) on the server whatever the number of holders; the
//! plain `LOCK.INFO key` on a server whose module predates `OWNER`) and those guards decide
//! whether their owner still holds it. The client's short commands (try-acquires, extends, releases) go
//! over that connection and, with `NOLOOP`, push nothing, so a held lock costs the server no
//! more than its extends (a bound guard's extends, over its own connection, cost a re-read
//! each); each key's re-reads are at least 5 ms apart, changes in between coalesced into the
//! next. A key is registered once a guard of it is granted (then re-read once, to cover the
//! moment in between), not before: a request that is not granted registers nothing, so
//! waiting or polling clients get no pushes, and a key locked again and again is registered
//! once. Keys no longer held stop being pushed after a few pushes (the registered set is
//! replaced by the held keys' in one `MULTI`/`EXEC`). Measured
//! on a development machine (loopback), a `DEL` fired the async [`aio::LostSignal`] after 0.4 ms
//! (median; at most 0.6 ms), and `is_lost()` polled every millisecond was true at the first
//! poll; `docs/benchmarks.md` has the other events. A lone holder whose ttl runs out on
//! the server is pushed when Redis deletes the expired key (active expiry, up to about 100 ms
//! after the deadline at the default `hz`); the guard's validity ends before the server's
//! deadline anyway.
//!
//! **Without the watcher** a loss is found by extends (a watchdog's, every third of the ttl by
//! default) and by the validity only. That is the case for a cluster client
//! ([`aio::AsyncLockClient::cluster`]), for the sync client on a TLS server (its link is a plain
//! socket), and for a server or ACL user that refuses `CLIENT TRACKING`: the watcher needs
//! `+client|tracking` (in `@connection` on Redis 7.0 and Valkey 8; `HELLO` is allowed to every
//! user). The client then turns the watcher off for that server and carries on.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{Acquire, LockClient, LockError, LossCause};
//!
//! let client = LockClient::new("redis://127.0.0.1:6379/", Duration::from_millis(500))?;
//! let outcome = client.using("reports:daily", Acquire::write(Duration::from_secs(10)), |guard| {
//!     for step in ["gather", "render", "store"] {
//!         if guard.is_lost() {
//!             break; // the result will be LockError::Lost: stop early
//!         }
//!         println!("{step}");
//!     }
//!     "report"
//! });
//! match outcome {
//!     Ok(report) => println!("{report} written under the lock"),
//!     Err(LockError::Lost(lost)) if lost.cause == LossCause::Taken => {
//!         println!("someone else took it: {lost}")
//!     }
//!     Err(LockError::Lost(lost)) => println!("not done under the lock: {lost}"),
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Several keys
//!
//! [`LockClient::acquire_all`] and [`Redlock::acquire_all`] take several keys, each with its
//! own request, into one [`MultiGuard`]. The keys are taken in byte order of the key, whatever
//! order they are named in, so two multi-key acquires over overlapping keys never deadlock;
//! each key waits at most what is left of its own wait; if one cannot be had, those taken are
//! released and its error returned. No keys, more than 1024, a key named twice, an explicit
//! owner or `min_replicas` are refused with [`LockError::InvalidRequest`].
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{Acquire, LockClient};
//!
//! let client = LockClient::new("redis://127.0.0.1:6379/", Duration::from_millis(500))?;
//! let ttl = Duration::from_secs(10);
//! let wait = Duration::from_secs(2);
//! let both = client.acquire_all(&[
//!     ("accounts:7", Acquire::write(ttl).wait(wait)),
//!     ("accounts:3", Acquire::write(ttl).wait(wait)),
//! ])?;
//! // ... move money; check both.is_lost() before committing ...
//! both.release()?; // fails with LockError::Lost if either key was lost
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Limits
//!
//! - **Wait connections.** At most [`LockClient::max_wait_connections`] waiting acquires per
//!   server have a connection at a time (default [`DEFAULT_WAIT_CONNECTIONS`], 64; the same on
//!   [`aio::AsyncLockClient::max_wait_connections`]). Further waits queue in the client, in
//!   arrival order, for what is left of their wait, and fail with [`LockError::WaitLimit`] if
//!   none came free in time.
//! - **ttl.** Checked before anything is sent: at least [`MIN_TTL`] (10 ms), at most 2^47 ms
//!   (else [`LockError::InvalidRequest`]); the same for [`LockGuard::extend_for`], which sets a
//!   new ttl for this and the later extends.
//! - **Redlock release.** Answered once a quorum of servers released; the slower ones finish in
//!   the background.

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

pub use blocking::{LockClient, LockGuard, MultiGuard, Redlock, BOUND_CLIENT_NAME};
pub use proto::{
    drift, Acquire, Holder, LockError, LockInfo, LossCause, LostLock, Mode, Outcome, OwnerIdentity,
    WaitStrategy, Waiter, Watchdog, DEFAULT_WAIT_CONNECTIONS, MAX_CAPACITY, MIN_TTL,
};
