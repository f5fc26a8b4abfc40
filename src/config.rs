//! Module configuration (`CONFIG GET/SET lock.<name>`, or `loadmodule ... <name> <value>`).

use std::sync::atomic::{AtomicI64, Ordering};

/// `lock.max-waiters`: how many clients may queue on one lock. A request that would queue
/// beyond it gets an error instead of blocking.
pub static MAX_WAITERS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS);
pub const DEFAULT_MAX_WAITERS: i64 = 100_000;
pub const MAX_MAX_WAITERS: i64 = 1 << 31;

pub fn max_waiters() -> usize {
    usize::try_from(MAX_WAITERS.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
}

/// `lock.max-total-waiters`: how many clients may wait on all locks together (each blocked
/// client costs Redis tens of KB; this bounds what a misbehaving client fleet can pin).
pub static MAX_TOTAL_WAITERS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_TOTAL_WAITERS);
pub const DEFAULT_MAX_TOTAL_WAITERS: i64 = 1_000_000;

pub fn max_total_waiters() -> usize {
    usize::try_from(MAX_TOTAL_WAITERS.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
}

/// `lock.max-waiters-per-user`: how many clients one ACL user may have waiting on all locks
/// together; 0 (the default) = no limit of its own, only `lock.max-total-waiters`. On a
/// server shared by tenants (one ACL user each) it keeps one tenant from using up the
/// server-wide limit; a server with one application user needs none.
pub static MAX_WAITERS_PER_USER: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS_PER_USER);
pub const DEFAULT_MAX_WAITERS_PER_USER: i64 = 0;

/// The per-user waiter limit, `None` when there is none.
pub fn max_waiters_per_user() -> Option<usize> {
    let n = MAX_WAITERS_PER_USER.load(Ordering::Relaxed);
    (n > 0).then(|| usize::try_from(n).unwrap_or(usize::MAX))
}

/// `lock.deadlock-budget`: the most holders, waiters and keys one deadlock check may visit. A
/// check that would need more lets the request wait as if no cycle were found (counted in
/// `INFO lock` as `deadlock_checks_cut_total`). The default keeps a check at or under about
/// 1 ms of server time (docs/operations.md has the measurement).
pub static DEADLOCK_BUDGET: AtomicI64 = AtomicI64::new(DEFAULT_DEADLOCK_BUDGET);
pub const DEFAULT_DEADLOCK_BUDGET: i64 = 500;
pub const MAX_DEADLOCK_BUDGET: i64 = 1 << 40;

pub fn deadlock_budget() -> usize {
    usize::try_from(DEADLOCK_BUDGET.load(Ordering::Relaxed)).unwrap_or(0)
}

/// Applies `loadmodule <path> [max-waiters N] [max-total-waiters N]` arguments. (In
/// redis.conf, `lock.max-waiters N` lines after the loadmodule line work too, through Redis's
/// own module config loading.)
pub fn apply_load_args(args: &[&[u8]]) -> Result<(), String> {
    let mut rest = args;
    while let [name, value, tail @ ..] = rest {
        let (label, target) = if name.eq_ignore_ascii_case(b"max-waiters") {
            ("max-waiters", &MAX_WAITERS)
        } else if name.eq_ignore_ascii_case(b"max-total-waiters") {
            ("max-total-waiters", &MAX_TOTAL_WAITERS)
        } else {
            return Err(format!(
                "unknown module argument {:?}",
                String::from_utf8_lossy(name)
            ));
        };
        let n = redis_lock_core::parse::parse_i64(value)
            .filter(|n| (1..=MAX_MAX_WAITERS).contains(n))
            .ok_or_else(|| format!("{label} must be an integer from 1 to {MAX_MAX_WAITERS}"))?;
        target.store(n, Ordering::Relaxed);
        rest = tail;
    }
    if !rest.is_empty() {
        return Err("module arguments come in name value pairs".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_arguments_are_validated() {
        assert!(apply_load_args(&[]).is_ok());
        assert!(apply_load_args(&[b"max-waiters", b"0"]).is_err());
        assert!(apply_load_args(&[b"max-waiters"]).is_err());
        assert!(apply_load_args(&[b"other", b"1"]).is_err());
        assert!(apply_load_args(&[b"max-waiters", b"12"]).is_ok());
        assert_eq!(max_waiters(), 12);
        MAX_WAITERS.store(DEFAULT_MAX_WAITERS, Ordering::Relaxed);
    }
}
