//! The sync face: blocking sockets and threads carrying out the protocol of [`crate::proto`].

mod bound;
mod client;
mod guard;
mod instance;
mod multi;
mod redlock;
mod servers;
mod slots;
mod watch;

pub use bound::BOUND_CLIENT_NAME;
pub use client::LockClient;
pub use guard::LockGuard;
pub use multi::MultiGuard;
pub use redlock::Redlock;
pub use slots::DEFAULT_WAIT_CONNECTIONS;

use crate::LockError;

/// What a `using` returns once its work ran and its guard was released: the work's value only
/// if the lock was held until the release. A release that could not be confirmed (servers
/// unreachable) while the lease was still valid leaves the work's value standing: the lock was
/// certainly held while it ran, and the hold ends at its ttl.
pub(crate) fn finish_using<T>(released: Result<(), LockError>, out: T) -> Result<T, LockError> {
    match released {
        Err(lost @ LockError::Lost(_)) => Err(lost),
        _ => Ok(out),
    }
}
