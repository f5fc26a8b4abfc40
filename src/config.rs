//! Module configuration (`CONFIG GET/SET lock.<name>`, `lock.<name>` config-file lines, or
//! `loadmodule ... <name> <value>`, which sets the default: see `LOAD_ARGS`).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

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

/// `lock.refuse-when-evictable` (default no): refuse new holds (LOCK.ACQUIRE, LOCK.RWREAD,
/// LOCK.SEMACQUIRE) while the server's maxmemory settings let it evict lock keys.
pub static REFUSE_WHEN_EVICTABLE: AtomicBool = AtomicBool::new(DEFAULT_REFUSE_WHEN_EVICTABLE);
pub const DEFAULT_REFUSE_WHEN_EVICTABLE: bool = false;

#[inline]
pub fn refuse_when_evictable() -> bool {
    REFUSE_WHEN_EVICTABLE.load(Ordering::Relaxed)
}

/// `lock.legacy-tokens` (default no): accept stored values (RDB, AOF, `RESTORE`, replication)
/// whose fencing tokens or counter are above 2^53 - 1, written by a pre-release build, and keep
/// issuing tokens above them (up to 2^63 - 1). Off, such values are refused where they are
/// loaded, and every token stays exact for clients that read integers as doubles.
///
/// Settable at runtime: turning it on lets an operator accept a refused `RESTORE` (MIGRATE of
/// a key from a pre-release server) without a restart; turning it off with the counter in the
/// legacy range never makes a token repeat or go back: new holds are then refused with an
/// error naming this setting. Replicas must have the same value as their master.
pub static LEGACY_TOKENS: AtomicBool = AtomicBool::new(DEFAULT_LEGACY_TOKENS);
pub const DEFAULT_LEGACY_TOKENS: bool = false;

#[inline]
pub fn legacy_tokens() -> bool {
    LEGACY_TOKENS.load(Ordering::Relaxed)
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

/// What a module argument on the `loadmodule` line may hold.
#[derive(Clone, Copy, Debug)]
pub enum ArgKind {
    /// An integer in `min..=max`.
    Integer { min: i64, max: i64 },
    /// `yes` or `no`.
    Bool,
}

/// Every module argument: a config's name without the `lock.` prefix.
///
/// The rule (the one `MODULE LOADEX ... CONFIG ... ARGS ...` follows): a load-line argument
/// sets the config's *default*; a `lock.<name>` line in the config file, `CONFIG SET` and
/// `MODULE LOADEX ... CONFIG` override it. So a value that `CONFIG SET` + `CONFIG REWRITE`
/// saved (REWRITE writes a `lock.<name>` line whenever the value differs from that default)
/// is the value after the next restart, although the load line is rewritten unchanged.
/// The crate applies the arguments as defaults (`module_args_as_configuration`); it matches
/// names exactly and does not check ranges, so `check_load_args` refuses every argument it
/// would read differently, and the load fails with the reason in the log.
pub const LOAD_ARGS: &[(&str, ArgKind)] = &[
    (
        "max-waiters",
        ArgKind::Integer {
            min: 1,
            max: MAX_MAX_WAITERS,
        },
    ),
    (
        "max-total-waiters",
        ArgKind::Integer {
            min: 1,
            max: MAX_MAX_WAITERS,
        },
    ),
    ("refuse-when-evictable", ArgKind::Bool),
    ("legacy-tokens", ArgKind::Bool),
    (
        "max-waiters-per-user",
        ArgKind::Integer {
            min: 0,
            max: MAX_MAX_WAITERS,
        },
    ),
    (
        "deadlock-budget",
        ArgKind::Integer {
            min: 0,
            max: MAX_DEADLOCK_BUDGET,
        },
    ),
];

/// Checks `loadmodule <path> [name value ...]` arguments against `LOAD_ARGS`: known names
/// (exactly as listed), each at most once, values of the right kind and range.
pub fn check_load_args(args: &[&[u8]]) -> Result<(), String> {
    let mut seen: Vec<&str> = Vec::new();
    let mut rest = args;
    while let [name, value, tail @ ..] = rest {
        let Some((label, kind)) = LOAD_ARGS.iter().find(|(n, _)| n.as_bytes() == *name) else {
            let shown = String::from_utf8_lossy(name);
            let hint = match LOAD_ARGS
                .iter()
                .find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name))
            {
                Some((n, _)) => format!(" (names are lowercase: {n})"),
                None => {
                    let known: Vec<&str> = LOAD_ARGS.iter().map(|(n, _)| *n).collect();
                    format!(" (known: {})", known.join(", "))
                }
            };
            return Err(format!("unknown module argument {shown:?}{hint}"));
        };
        if seen.contains(label) {
            return Err(format!("module argument {label} is given twice"));
        }
        seen.push(label);
        match *kind {
            ArgKind::Integer { min, max } => {
                redis_lock_core::parse::parse_i64(value)
                    .filter(|n| (min..=max).contains(n))
                    .ok_or_else(|| format!("{label} must be an integer from {min} to {max}"))?;
            }
            ArgKind::Bool => {
                if *value != b"yes" && *value != b"no" {
                    return Err(format!("{label} must be yes or no"));
                }
            }
        }
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
        assert!(check_load_args(&[]).is_ok());
        assert!(check_load_args(&[b"max-waiters", b"12"]).is_ok());
        assert!(check_load_args(&[b"max-waiters", b"12", b"max-total-waiters", b"9"]).is_ok());
        assert!(check_load_args(&[b"max-waiters", b"0"]).is_err());
        assert!(check_load_args(&[b"max-waiters", b"2147483649"]).is_err());
        assert!(check_load_args(&[b"max-waiters", b"x"]).is_err());
        assert!(check_load_args(&[b"max-waiters"]).is_err());
        assert!(check_load_args(&[b"other", b"1"]).is_err());
        assert!(check_load_args(&[b"max-waiters", b"1", b"max-waiters", b"2"]).is_err());
        let upper = check_load_args(&[b"MAX-WAITERS", b"5"]).unwrap_err();
        assert!(upper.contains("lowercase: max-waiters"), "{upper}");
    }

    #[test]
    fn every_load_argument_is_a_registered_name() {
        for (name, kind) in LOAD_ARGS {
            assert!(!name.starts_with("lock."), "{name}");
            if let ArgKind::Integer { min, max } = kind {
                assert!(min <= max, "{name}");
            }
        }
    }
}
