//! Test kit for redis-lock: a real redis-server with the module loaded, on a free loopback port,
//! killed when the handle drops (no mocks); helpers for commands, `LOCK.INFO`, `INFO` sections
//! and blocked waiters. Used by the integration tests (tests/), the client's tests and the
//! benchmark's server launcher.

mod commands;
mod info;
mod server;
mod waiter;

use std::time::{Duration, Instant};

pub use redis::{Connection, Value};

pub use commands::*;
pub use info::*;
pub use server::*;
pub use waiter::*;

/// Generous bound for "eventually" conditions on a shared 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Polls `cond` until it holds, failing after [`PATIENCE`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("timed out waiting for: {what}");
}
