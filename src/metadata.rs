//! What the module tells Redis about itself: its version, and for each command the arity, key,
//! flags, ACL categories and the documentation `COMMAND DOCS` shows. Plain data:
//! `sys::commands` turns it into the C structures of `RedisModule_SetCommandInfo`, and
//! `commands::TABLE` pairs each entry with its handler.

use crate::sys::commands::{ArgDoc, ArgKind, CommandDoc, KeyAccess};

/// The module version `MODULE LIST` shows, derived from the crate version the way Redis modules
/// encode theirs: major * 10000 + minor * 100 + patch (0.1.0 -> 100, 1.2.3 -> 10203).
pub const MODULE_VERSION: i32 = encode_version(
    parse_u32(env!("CARGO_PKG_VERSION_MAJOR")),
    parse_u32(env!("CARGO_PKG_VERSION_MINOR")),
    parse_u32(env!("CARGO_PKG_VERSION_PATCH")),
);

/// The version every command of this release was added in (`since` in COMMAND DOCS).
pub const SINCE: &str = "0.1.0";

/// The module's own ACL category (`+@lock`), added where the server can add categories (Redis
/// 7.4+, Valkey 8+). LOCK.SYNC is kept out of it: it is for the replication link only.
pub const ACL_CATEGORY: &str = "lock";

const fn parse_u32(s: &str) -> u32 {
    let bytes = s.as_bytes();
    let mut value: u32 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let digit = bytes[i];
        assert!(digit.is_ascii_digit(), "crate version part is not a number");
        value = value * 10 + (digit - b'0') as u32;
        i += 1;
    }
    value
}

const fn encode_version(major: u32, minor: u32, patch: u32) -> i32 {
    assert!(
        minor < 100 && patch < 100,
        "version part does not fit the encoding"
    );
    let v = major * 10_000 + minor * 100 + patch;
    assert!(v <= i32::MAX as u32);
    v as i32
}

const fn arg(name: &'static str, kind: ArgKind) -> ArgDoc {
    ArgDoc {
        name,
        kind,
        token: None,
        optional: false,
    }
}

const KEY: ArgDoc = arg("key", ArgKind::Key);
const OWNER: ArgDoc = arg("owner", ArgKind::String);
const TTL: ArgDoc = arg("ttl", ArgKind::Integer);
/// `[COUNT n]` of LOCK.INFO and LOCK.QUEUES.
const COUNT_OPTION: ArgDoc = ArgDoc {
    name: "count",
    kind: ArgKind::Integer,
    token: Some("COUNT"),
    optional: true,
};
const WAIT: ArgDoc = ArgDoc {
    name: "timeout",
    kind: ArgKind::Integer,
    token: Some("WAIT"),
    optional: true,
};

const BIND: ArgDoc = ArgDoc {
    name: "bind",
    kind: ArgKind::PureToken,
    token: Some("BIND"),
    optional: true,
};
const LOCKDELAY: ArgDoc = ArgDoc {
    name: "ms",
    kind: ArgKind::Integer,
    token: Some("LOCKDELAY"),
    optional: true,
};

pub const ACQUIRE: CommandDoc = CommandDoc {
    name: "lock.acquire",
    arity: -4,
    flags: "write deny-oom blocking",
    access: KeyAccess::ReadWrite,
    summary: "Takes an exclusive lock for `ttl` ms; with WAIT, queues in FIFO order until \
                  granted or `timeout` ms pass; BIND ends the hold when this connection closes; \
                  LOCKDELAY keeps the lock from anyone for `ms` after the hold ends without a \
                  release. Options in any order. Replies with the fencing token, or nil.",
    complexity: "O(log N) where N is the number of holders and waiters of the key",
    since: SINCE,
    acl_categories: "write slow blocking",
    in_module_category: true,
    args: &[KEY, OWNER, TTL, WAIT, BIND, LOCKDELAY],
};

pub const RWREAD: CommandDoc = CommandDoc {
    name: "lock.rwread",
    arity: -4,
    flags: "write deny-oom blocking",
    access: KeyAccess::ReadWrite,
    summary: "Takes a shared (read) lock for `ttl` ms; with WAIT, queues in FIFO order until \
                  granted or `timeout` ms pass; BIND ends the hold when this connection closes. \
                  Replies with the fencing token, or nil.",
    complexity: "O(log N) where N is the number of holders and waiters of the key",
    since: SINCE,
    acl_categories: "write slow blocking",
    in_module_category: true,
    args: &[KEY, OWNER, TTL, WAIT, BIND],
};

const CAPACITY: ArgDoc = arg("capacity", ArgKind::Integer);

pub const SEMACQUIRE: CommandDoc = CommandDoc {
    name: "lock.semacquire",
    arity: -5,
    flags: "write deny-oom blocking",
    access: KeyAccess::ReadWrite,
    summary: "Takes one permit of a counting semaphore of `capacity` permits for `ttl` ms; \
                  with WAIT, queues in FIFO order until a permit is free or `timeout` ms pass; \
                  BIND ends the owner's permits when this connection closes. Replies with the \
                  fencing token (the owner's own when it already holds permits), or nil.",
    complexity: "O(log N) where N is the number of holders and waiters of the key",
    since: SINCE,
    acl_categories: "write slow blocking",
    in_module_category: true,
    args: &[KEY, OWNER, CAPACITY, TTL, WAIT, BIND],
};

pub const RELEASE: CommandDoc = CommandDoc {
    name: "lock.release",
    arity: -3,
    flags: "write fast",
    access: KeyAccess::ReadWrite,
    summary: "Drops one hold of `owner` (all of them with ALL) and grants the lock to the \
                  next waiters. Replies with the owner's remaining count.",
    complexity: "O(log N + G) where N is the number of holders and waiters of the key and \
                     G the number of waiters granted",
    since: SINCE,
    acl_categories: "write fast",
    in_module_category: true,
    args: &[
        KEY,
        OWNER,
        ArgDoc {
            name: "all",
            kind: ArgKind::PureToken,
            token: Some("ALL"),
            optional: true,
        },
    ],
};

pub const EXTEND: CommandDoc = CommandDoc {
    name: "lock.extend",
    arity: 4,
    flags: "write fast",
    access: KeyAccess::ReadWrite,
    summary: "Sets the expiry of `owner`'s hold to now + `ttl` ms. Replies 1.",
    complexity: "O(log N) where N is the number of holders of the key",
    since: SINCE,
    acl_categories: "write fast",
    in_module_category: true,
    args: &[KEY, OWNER, TTL],
};

pub const INFO: CommandDoc = CommandDoc {
    name: "lock.info",
    arity: -2,
    flags: "readonly fast",
    access: KeyAccess::ReadOnly,
    summary: "Shows a lock's mode, last fencing token, holders with their counts and \
                  remaining ms, how many hold it, and its queue. Nil when the key does not \
                  exist. OWNER lists only that owner's holder entry, COUNT at most n entries \
                  (1 to 1000); either also lists at most 1000 queued clients.",
    complexity: "O(N) where N is the number of holders and waiters of the key; with OWNER or \
                 COUNT n, O(1) or O(n)",
    since: SINCE,
    acl_categories: "read fast",
    in_module_category: true,
    args: &[
        KEY,
        ArgDoc {
            name: "owner",
            kind: ArgKind::String,
            token: Some("OWNER"),
            optional: true,
        },
        COUNT_OPTION,
    ],
};

pub const SYNC: CommandDoc = CommandDoc {
    name: "lock.sync",
    arity: 4,
    flags: "write fast",
    access: KeyAccess::ReadWrite,
    summary: "Internal: applies one holder's state as the master decided it. Accepted only \
                  from the replication link and while loading the AOF.",
    complexity: "O(log N) where N is the number of holders of the key",
    since: SINCE,
    acl_categories: "admin dangerous",
    in_module_category: false,
    args: &[KEY, OWNER, arg("state", ArgKind::String)],
};

pub const QUEUES: CommandDoc = CommandDoc {
    name: "lock.queues",
    arity: -1,
    // deny-script: a script's client carries the caller's user in a way the module cannot read
    // safely (the server dereferences it), so the per-user filter could not be applied there.
    flags: "readonly deny-script",
    access: KeyAccess::None,
    summary: "Lists this server's lock queues, ranked by their longest-waiting client's wait \
                  (BY AGE, the default) or by their length (BY LENGTH): [key, db, waiting, \
                  oldest wait ms, holders, [[owner, held ms], ...]] each (up to 10 holders \
                  named), at most COUNT (default 10, at most 1000); PREFIX p: only keys \
                  starting with p, in key order. A reply that stopped looking early ends with \
                  the status TRUNCATED.",
    complexity: "O(C log W + S) where W is the number of keys with waiters, C the count and S \
                 the queues skipped for the caller (at most 500); keys without waiters cost \
                 nothing",
    since: SINCE,
    // `@read`, not `@admin`: it reports only keys the caller may read under its ACL key
    // patterns (SPEC.md, "Tenants (ACL)"), as SCAN is `@read`; `@slow` since its cost grows
    // with COUNT and with the queues it skips for the caller.
    acl_categories: "read slow",
    in_module_category: true,
    args: &[
        ArgDoc {
            name: "order",
            kind: ArgKind::String,
            token: Some("BY"),
            optional: true,
        },
        COUNT_OPTION,
        ArgDoc {
            name: "prefix",
            kind: ArgKind::String,
            token: Some("PREFIX"),
            optional: true,
        },
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Every version this module has reported, oldest first, with the RDB encoding version of
    /// lock keys it writes (a build reads every encoding up to its own). The module version
    /// changes with every release and with every encoding change, so an operator can tell from
    /// `MODULE LIST` or `INFO lock` which files a build can load (docs/operations.md, "Upgrading
    /// and removing the module", shows this table; a test keeps the two and the build in step).
    /// Builds before 0.3.0 all reported 100 whether they wrote encoding 1 or 2.
    const RELEASES: &[(&str, i32)] = &[("0.1.0", 2), ("0.3.0", 3), ("0.4.0", 3)];

    #[test]
    fn module_version_follows_the_crate_version() {
        assert_eq!(encode_version(0, 1, 0), 100);
        assert_eq!(encode_version(1, 2, 3), 10203);
        assert_eq!(parse_u32("42"), 42);
        let expected = env!("CARGO_PKG_VERSION")
            .split('.')
            .map(|p| p.parse::<i32>().expect("numeric version"))
            .fold(0, |acc, p| acc * 100 + p);
        assert_eq!(MODULE_VERSION, expected);
    }

    /// An encoding change needs a new version: this build is the table's last row, versions
    /// rise, and no two rows with the same encoding are needed (a release that keeps the
    /// encoding may share it, but a changed encoding is never listed under an old version).
    #[test]
    fn every_encoding_change_comes_with_a_new_module_version() {
        let (last_version, last_encoding) = RELEASES[RELEASES.len() - 1];
        assert_eq!(
            last_version,
            env!("CARGO_PKG_VERSION"),
            "add this version to RELEASES"
        );
        assert_eq!(
            last_encoding,
            redis_lock_core::stored::ENCODING_VERSION,
            "the encoding changed: bump the crate version and add a row to RELEASES"
        );
        for pair in RELEASES.windows(2) {
            assert!(
                numeric_version(pair[0].0) < numeric_version(pair[1].0),
                "{pair:?}"
            );
            assert!(pair[0].1 <= pair[1].1, "{pair:?}");
        }
    }

    /// docs/operations.md lists every release with its module version and encoding, and
    /// the encodings each reads.
    #[test]
    fn the_upgrade_docs_list_every_release() {
        let docs = include_str!("../docs/operations.md");
        for (version, encoding) in RELEASES {
            let row = format!(
                "| {version} | {} | {encoding} | 1 to {encoding} |",
                numeric_version(version)
            );
            assert!(
                docs.contains(&row),
                "docs/operations.md lacks the row {row}"
            );
        }
    }

    fn numeric_version(v: &str) -> i32 {
        v.split('.')
            .map(|p| p.parse::<i32>().expect("numeric version"))
            .fold(0, |acc, p| acc * 100 + p)
    }
}
