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

/// `using`: the guard (with a watchdog) from `acquire`, `work` run with it, then the release;
/// `work`'s value only if the lock was held until the release.
pub(crate) fn run_using<T>(
    acquired: Result<LockGuard, crate::LockError>,
    work: impl FnOnce(&LockGuard) -> T,
) -> Result<T, crate::LockError> {
    let guard = acquired?;
    let out = work(&guard);
    crate::proto::lease::using_result(guard.release(), out)
}
