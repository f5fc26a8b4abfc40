//! Test kit for redis-lock: a real redis-server with the module loaded, on a free loopback port,
//! killed when the handle drops (no mocks); helpers for commands, `LOCK.INFO`, `INFO` sections
//! and blocked waiters; Sentinels (same binary, without the module), replication links and
//! Redis Cluster creation and routing for failover tests; Prometheus's redis_exporter. Used by
//! the integration tests (tests/), the client's tests and the benchmark's server launcher.

mod commands;
mod daemon;
mod dump;
mod exporter;
mod info;
pub mod prometheus;
mod sentinel;
mod server;
mod topology;
mod waiter;

use std::time::{Duration, Instant};

pub use redis::{Connection, Value};

pub use commands::*;
pub use dump::*;
pub use exporter::*;
pub use info::*;
pub use sentinel::*;
pub use server::*;
pub use topology::*;
pub use waiter::*;

/// Generous bound for "eventually" conditions on a shared 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The environment variable holding the factor on the tests' time margins ([`time_factor`]).
pub const TIME_FACTOR_VAR: &str = "REDIS_LOCK_TEST_TIME_FACTOR";

/// The factor on the tests' upper time bounds and waits: `REDIS_LOCK_TEST_TIME_FACTOR` (a
/// number of at least 1; default 1). The defaults hold on a 2-core machine busy with a parallel
/// build; the factor is for slower runs (a server under valgrind, an emulated CPU). It only
/// lengthens: lower bounds ("not before") and the figures the tests print are never scaled, and
/// a value below 1 or not a number is refused with a panic naming the variable.
pub fn time_factor() -> f64 {
    match std::env::var(TIME_FACTOR_VAR) {
        Err(_) => 1.0,
        Ok(v) if v.trim().is_empty() => 1.0,
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(f) if f.is_finite() && f >= 1.0 => f,
            _ => panic!("{TIME_FACTOR_VAR}={v:?}: expected a number of at least 1 (e.g. 3)"),
        },
    }
}

/// `d` times [`time_factor`]: for upper bounds and waits.
pub fn scaled(d: Duration) -> Duration {
    d.mul_f64(time_factor())
}

/// How early the server may end a hold, by this process's clock. The server computes deadlines
/// on its millisecond wall clock (`now_ms + ttl`, with `now_ms` truncated), so a TTL or a lock
/// delay can end up to 1 ms before `sent + ttl` measured on this process's monotonic clock; one
/// more ms covers the two clocks drifting apart during a run (NTP slews the wall clock).
/// Lower bounds on "not before" times subtract it.
pub const CLOCK_MARGIN: Duration = Duration::from_millis(2);

/// A small deterministic generator (xorshift64*) for the randomized tests, so a failure can be
/// replayed from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index below `len` (0 when `len` is 0).
    pub fn index(&mut self, len: usize) -> usize {
        (self.next_u64() % len.max(1) as u64) as usize
    }
}

/// Polls `cond` until it holds, failing after [`PATIENCE`] (times [`time_factor`]).
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + scaled(PATIENCE);
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("timed out waiting for: {what}");
}

/// Polls `cond` every 50 ms until it holds, for up to `bound` (for slow events such as a
/// Sentinel or Cluster failover); returns how long it took, or `Err` with that time when it
/// never held, so the caller can add what it knows to the failure message.
pub fn poll_within(bound: Duration, mut cond: impl FnMut() -> bool) -> Result<Duration, Duration> {
    let start = Instant::now();
    loop {
        if cond() {
            return Ok(start.elapsed());
        }
        if start.elapsed() >= bound {
            return Err(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
