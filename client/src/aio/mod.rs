//! The async API, on tokio (cargo feature `tokio`): [`AsyncLockClient`] and
//! [`AsyncLockGuard`], with the same [`Acquire`] requests, [`Watchdog`]s and [`LockError`]s as
//! the sync client.
//!
//! # Connections
//!
//! An [`AsyncLockClient`] is cheap to clone and can be shared by any number of tasks and
//! threads: clones share one multiplexed connection (opened on first use, reopened after an
//! I/O failure) for every request the server answers at once: try-acquires, extends, releases,
//! `LOCK.INFO`. A request that makes the server wait (an acquire with [`Acquire::wait`], or
//! with [`Acquire::min_replicas`], whose `WAIT` blocks its connection) never goes over the
//! shared connection, where it would hold up every other request behind it: it takes a
//! dedicated connection from a small pool of idle ones (or opens one), and puts it back after
//! a complete reply. A dedicated connection whose reply did not come in time is closed, which
//! also takes its waiter out of the server's queue. One whose request was cancelled (the
//! acquire future dropped) gets a release behind the request and a `CLIENT UNBLOCK` of its
//! wait (over the shared connection), from a task spawned on the runtime, and is closed once
//! the release is answered: the waiter leaves the queue at once, and a grant that was already
//! on its way is released rather than left to its ttl (see [`AsyncLockClient::acquire`]).
//!
//! [`AsyncRedlock`] is the quorum lock over N independent servers, one [`AsyncLockClient`]
//! per server, with queued waits as [`crate::Redlock`] has them.
//!
//! With the cargo feature `cluster`, [`AsyncLockClient::cluster`] speaks to a Redis Cluster
//! through the `redis` crate's cluster client (slot routing by key, `MOVED` and `ASK`
//! followed): the same API, with dedicated cluster connections for waits.
//!
//! # Guards
//!
//! An [`AsyncLockGuard`] releases its hold on [`AsyncLockGuard::release`], or when dropped: the
//! drop never blocks the runtime, it spawns the release on the runtime the guard was acquired
//! on (best effort: a release that cannot run, for instance because the runtime is shutting
//! down, leaves the hold to its ttl). A [`Watchdog`] runs as a task that extends the lease and
//! reports a loss. [`AsyncLockGuard::lost_signal`] hands out a [`LostSignal`], a future-based
//! signal that fires once the lock is lost (the watchdog found the owner no longer holds it,
//! or its validity ran out), for a `select!` next to the work the lock protects;
//! [`AsyncLockClient::using`] wraps all of this around a closure.
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
//!     .await?;
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
