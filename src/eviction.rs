//! Eviction: the server may remove lock keys to make room when `maxmemory` is set and
//! `maxmemory-policy` is not `noeviction` (`allkeys-*` evict any key, `volatile-*` any key
//! with a TTL, which every held lock key has). A module cannot veto that, so this file makes
//! it visible and, on request, avoidable:
//!
//! - a warning in the log at load and whenever CONFIG SET (or a promotion) leaves the server
//!   able to evict, and the `evictable` INFO field;
//! - an evicted lock key is counted (`evicted_total`) and notified (`lock.evicted`); its
//!   waiters are served as after DEL (`settle`, like any value that leaves its key);
//! - `lock.refuse-when-evictable` refuses new holds while the server can evict.
//!
//! Telling an eviction from a DEL: Redis 7.0 and Valkey 8 both remove the key first (the
//! data type's unlink callback, then its free) and send the `evicted` keyspace notification
//! right after, with no other module callback in between. So the unlink notes the key of every
//! non-empty lock value that leaves, and an `evicted` notification for that same key is an
//! eviction of it. A generic-class notification for the key (`del`, `rename_from`, ...)
//! forgets the note, so a later eviction of a key of another type under the same name is not
//! taken for a lock's; so does an `expired` notification (Redis expired the lock key), and the
//! next turn of the event loop (`forget_note`: the key was overwritten by another type's
//! command, a class the module does not follow, as that would cost a callback on every write).
//! A lock whose holders had all expired is counted as their expiration, not as an eviction,
//! however the server removes it.

use redis_module::{Context, ContextFlags};

use crate::errors::EVICTABLE_REFUSED;
use crate::state::with_eviction;
use crate::sys::context;
use crate::{config, stats};

/// Logged when the server can evict lock keys.
const WARNING: &str = "lock module: WARNING maxmemory is set and maxmemory-policy is not noeviction, so the server may evict lock keys: a held lock can vanish while its holder still uses it, and its waiters are then granted. Set maxmemory-policy to noeviction on servers that keep locks (see the lock module's docs, \"Memory and eviction\"); evictions are counted in INFO lock (evicted_total) and notified as lock.evicted.";

/// Logged when a change makes eviction impossible again.
const ALL_CLEAR: &str =
    "lock module: the server can no longer evict lock keys (maxmemory 0, noeviction, or a replica that ignores maxmemory)";

/// At load: the settings come from the config file (or the command line), read before modules
/// load. Warns if they allow eviction.
pub fn check_at_load() {
    let can_evict = context::server_can_evict();
    with_eviction(|e| e.could_evict = can_evict);
    if can_evict {
        context::log_warning(WARNING);
    }
}

/// After CONFIG SET changed `maxmemory`, `maxmemory-policy` or `replica-ignore-maxmemory`, or
/// the server's role changed (a replica may ignore maxmemory): warns when the server becomes
/// able to evict, notes when it no longer can.
pub fn recheck(ctx: &Context) {
    let can_evict = context::server_can_evict();
    let could_evict = with_eviction(|e| std::mem::replace(&mut e.could_evict, can_evict));
    if can_evict && !could_evict {
        ctx.log_warning(WARNING);
    } else if !can_evict && could_evict {
        ctx.log_notice(ALL_CLEAR);
    }
}

/// Are grants refused now (the option on and the server able to evict)? Asked by every
/// operation that may grant a queued waiter; one load of the option when it is off.
#[inline]
pub fn grants_refused() -> Option<redis_lock_core::Refusal> {
    (config::refuse_when_evictable() && context::server_can_evict())
        .then_some(redis_lock_core::Refusal::Evictable)
}

/// The refusal of a new hold while the option is on and the server can evict; `flags` are
/// the command's context flags, which the lock path reads anyway, so the check costs one
/// load of the option when it is off.
#[inline]
pub fn refusal(flags: &ContextFlags) -> Option<&'static str> {
    if config::refuse_when_evictable()
        && flags.contains(ContextFlags::MAXMEMORY)
        && flags.contains(ContextFlags::EVICTED)
    {
        Some(EVICTABLE_REFUSED)
    } else {
        None
    }
}

/// A non-empty lock value left (`db`, `key`): if the next notification for the key is
/// `evicted`, it was evicted.
pub fn note_unlinked(db: i32, key: &[u8]) {
    with_eviction(|e| e.last_unlinked = Some((db, key.into())));
}

/// The next turn of the event loop: the `evicted` notification of an unlinked key comes in the
/// same turn, so a note still there is of a key removed some other way (overwritten by another
/// type's command, a class the module does not follow).
pub fn forget_note() {
    with_eviction(|e| e.last_unlinked = None);
}

/// A keyspace notification for (`db`, `key`). Returns true if it reports the eviction of a
/// lock key: it is then counted, and `lock.evicted` is sent when the key is settled (the
/// caller marks it dirty).
pub fn on_notification(db: i32, event: &[u8], key: &[u8]) -> bool {
    let evicted = with_eviction(|e| {
        let noted = e
            .last_unlinked
            .as_ref()
            .is_some_and(|(d, k)| *d == db && **k == *key);
        if !noted {
            return false;
        }
        e.last_unlinked = None;
        if event == b"evicted" {
            *e.to_notify.entry((db, key.into())).or_default() += 1;
            true
        } else {
            false
        }
    });
    if evicted {
        stats::count_eviction();
    }
    evicted
}

/// How many evictions of (`db`, `key`) are waiting to be notified; forgets them.
pub fn take_to_notify(db: i32, key: &[u8]) -> usize {
    with_eviction(|e| {
        if e.to_notify.is_empty() {
            return 0;
        }
        e.to_notify
            .remove(&(db, Box::<[u8]>::from(key)))
            .unwrap_or(0)
    })
}

/// A replica notifies nothing (its master's DELs drive it); forgets what was pending.
pub fn forget_pending() {
    with_eviction(|e| e.to_notify.clear());
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn only_an_evicted_notification_right_after_the_unlink_is_an_eviction() {
        // A DEL: its own notification comes after the unlink and forgets it.
        note_unlinked(0, b"k");
        assert!(!on_notification(0, b"del", b"k"));
        assert!(
            !on_notification(0, b"evicted", b"k"),
            "a later string of that name"
        );
        // Another key, or the same name in another database, is not the lock's.
        note_unlinked(0, b"k");
        assert!(!on_notification(1, b"evicted", b"k"));
        assert!(!on_notification(0, b"evicted", b"other"));
        // The eviction itself, counted once and notified once.
        assert!(on_notification(0, b"evicted", b"k"));
        assert!(!on_notification(0, b"evicted", b"k"));
        assert_eq!(take_to_notify(0, b"k"), 1);
        assert_eq!(take_to_notify(0, b"k"), 0);
    }

    #[test]
    fn evictions_waiting_to_be_notified_are_kept_per_key() {
        // Many keys evicted in one go, then settled one by one (each lookup is by key, so
        // settling n keys costs O(n log n), not O(n^2)); the same key twice counts twice.
        for i in 0..20_000u32 {
            let key = i.to_be_bytes();
            note_unlinked(3, &key);
            assert!(on_notification(3, b"evicted", &key));
        }
        note_unlinked(3, b"again");
        assert!(on_notification(3, b"evicted", b"again"));
        note_unlinked(3, b"again");
        assert!(on_notification(3, b"evicted", b"again"));
        for i in (0..20_000u32).rev() {
            assert_eq!(take_to_notify(3, &i.to_be_bytes()), 1);
        }
        assert_eq!(take_to_notify(4, b"again"), 0);
        assert_eq!(take_to_notify(3, b"again"), 2);
        assert!(with_eviction(|e| e.to_notify.is_empty()));
    }

    #[test]
    fn the_refusal_needs_the_option_and_both_flags() {
        let evicting = ContextFlags::MAXMEMORY | ContextFlags::EVICTED;
        assert_eq!(refusal(&evicting), None, "off by default");
        config::REFUSE_WHEN_EVICTABLE.store(true, Ordering::Relaxed);
        assert_eq!(refusal(&evicting), Some(EVICTABLE_REFUSED));
        assert_eq!(refusal(&ContextFlags::MAXMEMORY), None, "noeviction");
        assert_eq!(refusal(&ContextFlags::EVICTED), None, "maxmemory 0");
        config::REFUSE_WHEN_EVICTABLE.store(false, Ordering::Relaxed);
    }
}
