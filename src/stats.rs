//! Module-wide state that is not in any key: the fencing counter and the figures shown by
//! `INFO lock`.
//!
//! Redis runs module code on its main thread only (and in fork children, which get their own
//! copy), so thread-local cells are enough; no borrow is ever held across a call into Redis.

use std::cell::Cell;

use redis_lock_core::{FenceCounter, Lock, Mode};

thread_local! {
    static FENCES: Cell<FenceCounter> = const { Cell::new(FenceCounter::new_const()) };
    static COUNTERS: Counters = const { Counters::new() };
}

/// Runs `f` with the module's fencing counter.
pub fn with_fences<R>(f: impl FnOnce(&mut FenceCounter) -> R) -> R {
    FENCES.with(|cell| {
        let mut fences = cell.get();
        let r = f(&mut fences);
        cell.set(fences);
        r
    })
}

pub fn last_token() -> u64 {
    FENCES.with(|cell| cell.get().last())
}

/// The current-value figures one lock contributes to INFO: recomputed after each change and
/// applied as a difference, so the totals never need a scan of the keyspace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    pub locks_held: u32,
    pub readers: u32,
    pub writers: u32,
    pub waiters: u32,
}

impl Gauges {
    pub fn of(lock: &Lock) -> Self {
        let holders = u32::try_from(lock.holders().len()).unwrap_or(u32::MAX);
        let (readers, writers) = match lock.mode() {
            Some(Mode::Read) => (holders, 0),
            Some(Mode::Write) => (0, holders),
            None => (0, 0),
        };
        Gauges {
            locks_held: u32::from(holders > 0),
            readers,
            writers,
            waiters: u32::try_from(lock.queue().len()).unwrap_or(u32::MAX),
        }
    }
}

struct Counters {
    grants: Cell<u64>,
    timeouts: Cell<u64>,
    expirations: Cell<u64>,
    locks_held: Cell<u64>,
    readers: Cell<u64>,
    writers: Cell<u64>,
    waiters: Cell<u64>,
}

impl Counters {
    const fn new() -> Self {
        Counters {
            grants: Cell::new(0),
            timeouts: Cell::new(0),
            expirations: Cell::new(0),
            locks_held: Cell::new(0),
            readers: Cell::new(0),
            writers: Cell::new(0),
            waiters: Cell::new(0),
        }
    }
}

fn bump(cell: &Cell<u64>, by: u64) {
    cell.set(cell.get().saturating_add(by));
}

fn shift(cell: &Cell<u64>, old: u32, new: u32) {
    cell.set(
        cell.get()
            .saturating_sub(u64::from(old))
            .saturating_add(u64::from(new)),
    );
}

pub fn count_grant() {
    COUNTERS.with(|c| bump(&c.grants, 1));
}

pub fn count_timeout() {
    COUNTERS.with(|c| bump(&c.timeouts, 1));
}

pub fn count_expirations(n: u64) {
    COUNTERS.with(|c| bump(&c.expirations, n));
}

/// Replaces one lock's contribution `old` by `new`.
pub fn update_gauges(old: Gauges, new: Gauges) {
    if old == new {
        return;
    }
    COUNTERS.with(|c| {
        shift(&c.locks_held, old.locks_held, new.locks_held);
        shift(&c.readers, old.readers, new.readers);
        shift(&c.writers, old.writers, new.writers);
        shift(&c.waiters, old.waiters, new.waiters);
    });
}

/// The INFO figures, in the order SPEC.md names them.
pub fn snapshot() -> [(&'static str, u64); 7] {
    COUNTERS.with(|c| {
        [
            ("locks_held", c.locks_held.get()),
            ("readers", c.readers.get()),
            ("writers", c.writers.get()),
            ("waiters", c.waiters.get()),
            ("grants_total", c.grants.get()),
            ("timeouts_total", c.timeouts.get()),
            ("expirations_total", c.expirations.get()),
        ]
    })
}
