//! The async API, on tokio (cargo feature `tokio`): [`AsyncLockClient`] and
//! [`AsyncLockGuard`], with the same [`Acquire`](crate::Acquire) requests,
//! [`Watchdog`](crate::Watchdog)s and [`LockError`](crate::LockError)s as the sync client.
//!
//! # Connections
//!
//! An [`AsyncLockClient`] is cheap to clone and can be shared by any number of tasks and
//! threads: clones share one multiplexed connection (opened on first use, reopened after an
//! I/O failure) for every request the server answers at once: try-acquires, extends, releases,
//! `LOCK.INFO`. On one server that connection speaks RESP3 with
//! `CLIENT TRACKING on BCAST NOLOOP PREFIX <key>` for the keys the client's guards hold: when
//! anyone else changes such a key the server pushes an invalidation, one task per client reads
//! it, re-reads the key (`LOCK.INFO key OWNER owner` per owner among its guards) and the key's
//! guards decide whether they lost their hold,
//! within about a millisecond (see [loss](crate#loss)). The client's commands on that
//! connection push nothing (`NOLOOP`), so a held lock costs no more than its extends. A key is
//! registered once a guard of it is granted (by one task per client, in the order decided, then
//! a re-read of the key), so a request never waits for a registration and a request that is not
//! granted registers nothing. A cluster client has no
//! such watcher, nor has a server or ACL user that refuses `CLIENT TRACKING` (the client then
//! carries on without it; the ACL grant is `+client|tracking`).
//!
//! A request that makes the server wait (an acquire with [`Acquire::wait`](crate::Acquire::wait),
//! or with [`Acquire::min_replicas`](crate::Acquire::min_replicas), whose `WAIT` blocks its
//! connection) never goes over the shared connection, where it would hold up every other
//! request behind it: it takes a dedicated connection from a small pool of idle ones (or opens
//! one), and puts it back after a complete reply. At most
//! [`AsyncLockClient::max_wait_connections`] of them (default
//! [`DEFAULT_WAIT_CONNECTIONS`](crate::DEFAULT_WAIT_CONNECTIONS), 64) are in use at a time:
//! further waits queue in the client, in FIFO order, for what is left of their wait, and fail
//! with [`LockError::WaitLimit`](crate::LockError::WaitLimit) if none comes free in time. A
//! dedicated connection whose reply did not come in time is closed, which also takes its
//! waiter out of the server's queue. One whose request was cancelled (the acquire future
//! dropped) gets a release behind the request and a `CLIENT UNBLOCK` of its wait (over the
//! shared connection), from a task spawned on the runtime, and is closed once the release is
//! answered: the waiter leaves the queue at once, and a grant that was already on its way is
//! released rather than left to its ttl (see [`AsyncLockClient::acquire`]). A bound hold
//! ([`Acquire::bind`](crate::Acquire::bind)) has a connection of its own for the guard's life.
//!
//! [`AsyncRedlock`] is the quorum lock over N independent servers, one [`AsyncLockClient`]
//! per server, with queued waits as [`crate::Redlock`] has them; its release is answered once
//! a quorum of servers released.
//!
//! With the cargo feature `cluster`, [`AsyncLockClient::cluster`] speaks to a Redis Cluster
//! through the `redis` crate's cluster client (slot routing by key, `MOVED` and `ASK`
//! followed): the same API, with dedicated cluster connections for waits.
//!
//! # Guards
//!
//! An [`AsyncLockGuard`] releases its hold on [`AsyncLockGuard::release`], or when dropped: the
//! drop never blocks, it spawns the release on the runtime it is dropped in. If that runtime
//! drops the task before it ran (it is shutting down: a guard still alive at the end of
//! `#[tokio::main]` or of a `#[tokio::test]`), the release is done then, during the shutdown,
//! over a blocking connection bounded by the client's timeout, so the hold does not outlive
//! the process; a guard dropped outside any runtime is released the same way, at once.
//! [`AsyncLockGuard::release`] succeeds only if the lock was held until the release: a lost
//! lock gives [`LockError::Lost`](crate::LockError::Lost), which says how and when.
//!
//! A [`Watchdog`](crate::Watchdog) runs as a task that extends the lease and reports a loss.
//! [`AsyncLockGuard::lost_signal`] hands out a [`LostSignal`], a future-based signal that fires
//! once the lock is lost (the watcher or an extend found the owner no longer holds it, or its
//! validity ran out), for a `select!` next to the work the lock protects;
//! [`AsyncLockClient::using`] wraps all of this around a closure, and returns the closure's
//! value only if the lock was held until the release. [`AsyncLockClient::acquire_all`] and
//! [`AsyncRedlock::acquire_all`] take several keys into one [`AsyncMultiGuard`].
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{aio::AsyncLockClient, Acquire};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = AsyncLockClient::new("redis://127.0.0.1:6379/", Duration::from_millis(500))?;
//! let report = client
//!     .using("reports:daily", Acquire::write(Duration::from_secs(10)).wait(Duration::from_secs(5)),
//!         |lost| async move {
//!             tokio::select! {
//!                 _ = lost.lost() => Err("lock lost: stopped early"),
//!                 _ = tokio::time::sleep(Duration::from_secs(1)) => Ok("report written"),
//!             }
//!         })
//!     .await?; // LockError::Lost if the lock was lost before the release
//! # let _ = report;
//! # Ok(())
//! # }
//! ```

mod client;
mod conn;
mod guard;
mod multi;
mod redlock;
mod watch;

pub use client::AsyncLockClient;
pub use guard::{AsyncLockGuard, LostSignal};
pub use multi::AsyncMultiGuard;
pub use redlock::AsyncRedlock;

/// `using`: the guard (with a watchdog) from `acquired`, `work` run with its lost signal, then
/// the release; `work`'s value only if the lock was held until the release.
pub(crate) async fn run_using<T, F, Fut>(
    acquired: Result<AsyncLockGuard, crate::LockError>,
    work: F,
) -> Result<T, crate::LockError>
where
    F: FnOnce(LostSignal) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let guard = acquired?;
    let out = work(guard.lost_signal()).await;
    crate::proto::lease::using_result(guard.release().await, out)
}
