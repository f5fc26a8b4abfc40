//! The client's protocol with the lock module, written once and shared by the sync and the
//! async faces: what to send, what each reply means, the state of a held lease, and the
//! Redlock rounds. Nothing here opens a connection, sleeps or reads the clock: time comes in as
//! an argument and effects go out as values (commands to send, how long to sleep, a grant or
//! an error). The faces own sockets, threads, tasks and timers, and add no decision of their
//! own about the lock.

pub(crate) mod error;
pub(crate) mod hold;
pub(crate) mod info;
pub(crate) mod lease;
pub(crate) mod multi;
pub(crate) mod redlock;
pub(crate) mod reply;
pub(crate) mod request;
pub(crate) mod watch;
pub(crate) mod watchdog;

pub use error::{LockError, LossCause, LostLock};
pub use info::{Holder, LockInfo, OwnerIdentity, Waiter};
pub use lease::drift;
pub use redlock::WaitStrategy;
pub use reply::Outcome;
pub use request::{Acquire, Mode, DEFAULT_WAIT_CONNECTIONS, MAX_CAPACITY, MIN_TTL};
pub use watchdog::Watchdog;

#[cfg(test)]
mod tests;
