//! Keys that MIGRATE moves to another server (what Redis Cluster resharding does, slot by slot).
//!
//! The holders travel in the value's DUMP payload (`datatype`'s RDB encoding); the target loads
//! them like any RESTORE. What this file decides is what the *source* does with the waiters it
//! had queued on the key: they must not be served as after a DEL (the lock is held on the
//! target, so a grant here would be a second holder). They get `-TRYAGAIN`, and the key is not
//! created anew for them.
//!
//! Telling a MIGRATE from a DEL: on the source both end in the same `dbDelete` (the data
//! type's `unlink`) followed by a `del` keyspace event, and the module API of Redis 7.0 names
//! no command to a data-type callback. What only MIGRATE does is serialize the value first
//! (its `RESTORE` payload, through the type's `rdb_save`) and delete it later in the same
//! command, with nothing else running in between. So: a value serialized on the main thread
//! since the current command started, then unlinked, is one that MIGRATE moved. A command
//! filter (`sys::filter`) marks the start of each command and clears the record; it runs before
//! every command of a client, of a script (`redis.call`) and of another module (`RM_Call`),
//! and once for EXEC, whose commands then run as one: a MIGRATE queued in MULTI is still told
//! apart because its serialization and its deletion both happen inside that EXEC. The filter's
//! common case (nothing serialized) is one load of a static, outside the panic guard.
//! `MIGRATE ... COPY`, and a MIGRATE that fails (target down, target error), serialize but do
//! not delete: nothing happens on the source, and the record is cleared by the next command.
//!
//! What it can take for a move that is not one: a value serialized by DUMP, DEBUG OBJECT or a
//! SAVE and then deleted before the next command starts (both inside one MULTI, or an expiry or
//! eviction between two commands). Those waiters are answered TRYAGAIN too, which they retry;
//! no lock is granted twice either way. Only values that have waiters are recorded (a move
//! matters only to them), so the record stays as small as the number of queues.

use crate::state;
use crate::sys::filter::CommandStart;
use crate::value::LockValue;
use crate::{errors, waiters};

/// The value's identity during one command: its address. Values are boxed; active
/// defragmentation may move one, but only between commands (the server's cron, or between the
/// commands of a long script), and the record is cleared when each command starts.
fn address(value: &LockValue) -> usize {
    value as *const LockValue as usize
}

/// The type's `rdb_save` ran for `value` (on the main thread: DUMP or MIGRATE's payload, SAVE;
/// or in a fork child, whose record is its own and goes nowhere).
pub fn note_serialized(value: &LockValue) {
    if value.waiters() == 0 {
        return;
    }
    state::with_serialized(|s| s.insert(address(value)));
    state::set_any_serialized(true);
}

/// Forgets what was serialized: a new command starts, or values were freed without an unlink
/// (FLUSH, loading), whose addresses may be reused.
pub fn forget_serialized() {
    if state::any_serialized() {
        state::with_serialized(|s| s.clear());
        state::set_any_serialized(false);
    }
}

/// Is `value`, which is leaving its key, being moved away by MIGRATE (serialized earlier in
/// the same command)? One flag read when nothing was serialized, which is almost always.
pub fn is_moved_away(value: &LockValue) -> bool {
    state::any_serialized() && state::with_serialized(|s| s.remove(&address(value)))
}

/// (`db`, `key`) moved to another server: every waiter queued on it here gets TRYAGAIN, so
/// it asks again where the key now is. Counted in `INFO lock` (`migrated_waiters_total`).
pub fn refuse_waiters(db: i32, key: &[u8]) {
    let queued = waiters::queued_at(db, key);
    state::add_migrated_waiters(queued.len() as u64);
    for (id, _) in queued {
        waiters::refuse(id, errors::KEY_MOVED);
    }
}

/// How many hash slots a cluster has.
const SLOTS: usize = 16384;

/// The hash slot of `key`, as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of its
/// hash tag (what lies between the first `{` and the next `}`, when not empty), modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = key.get(open + 1..)?;
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| rest.get(..close)).flatten()
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS as u16
}

thread_local! {
    /// Slots that Valkey's atomic slot migration exported from this node, one bit each: their
    /// keys, deleted by the server after the export, moved (they were not lost). A slot's bit
    /// is cleared when an import of it starts here.
    static EXPORTED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn mark_slots(ranges: &[(u16, u16)], exported: bool) {
    EXPORTED.with(|e| {
        let mut bits = e.borrow_mut();
        if bits.is_empty() {
            bits.resize(SLOTS / 64, 0);
        }
        for &(start, end) in ranges {
            for slot in start..=end.min(SLOTS as u16 - 1) {
                if let Some(word) = bits.get_mut(usize::from(slot) / 64) {
                    let bit = 1u64 << (slot % 64);
                    if exported {
                        *word |= bit;
                    } else {
                        *word &= !bit;
                    }
                }
            }
        }
    });
}

/// An atomic slot migration exported these slots (Valkey 9, export completed).
pub fn note_slots_exported(ranges: &[(u16, u16)]) {
    mark_slots(ranges, true);
}

/// An atomic slot migration starts importing these slots here (Valkey 9).
pub fn note_slots_importing(ranges: &[(u16, u16)]) {
    mark_slots(ranges, false);
}

/// Was `key`'s slot exported by an atomic slot migration (its keys here moved away)?
pub fn was_exported(key: &[u8]) -> bool {
    EXPORTED.with(|e| {
        let bits = e.borrow();
        let slot = usize::from(key_slot(key));
        bits.get(slot / 64)
            .is_some_and(|w| w & (1u64 << (slot % 64)) != 0)
    })
}

/// Another node (or none) serves the slot of (`db`, `key`): every waiter queued on it here gets
/// TRYAGAIN (counted in `migrated_waiters_total`), and `value`, if the key still holds one
/// here, no longer lists them. Returns how many were sent away.
pub fn refuse_waiters_unserved(db: i32, key: &[u8], value: Option<&mut LockValue>) -> u64 {
    let queued = waiters::queued_at(db, key);
    let refused = queued.len() as u64;
    for (id, _) in queued {
        waiters::refuse(id, errors::SLOT_ELSEWHERE);
    }
    state::add_migrated_waiters(refused);
    if let Some(value) = value {
        if value.waiters() > 0 {
            let before = value.gauges();
            value
                .lock_mut()
                .retain_waiters(|id| waiters::is_queued_at(id, db, key));
            crate::stats::update_gauges(before, value.gauges());
        }
    }
    refused
}

/// The command filter's receiver: a new command starts.
pub struct CommandClock;

impl CommandStart for CommandClock {
    fn pending() -> bool {
        state::any_serialized()
    }

    fn on_command_start() {
        forget_serialized();
    }

    fn on_user_change() {
        crate::users::forget_connections();
    }
}

#[cfg(test)]
mod tests {
    use redis_lock_core::{FenceCounter, Lock, Mode, Step, WaiterId};

    use super::*;

    /// The "anything serialized" flag is one static for the process (the server has one main
    /// thread); the tests, which run on several threads, take turns.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn turn() -> std::sync::MutexGuard<'static, ()> {
        let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        forget_serialized();
        guard
    }

    /// A value held by "h" with `waiters` queued writers.
    fn value_with(waiters: u64) -> LockValue {
        let mut lock = Lock::new();
        let mut fences = FenceCounter::new_const();
        let mut events = Vec::new();
        let mut step = Step {
            now: 1_000,
            fences: &mut fences,
            events: &mut events,
            refuse: None,
        };
        lock.acquire(b"h", Mode::Write, 60_000, None, &mut step);
        for id in 1..=waiters {
            lock.acquire(b"w", Mode::Write, 60_000, Some(WaiterId(id)), &mut step);
        }
        LockValue::new(lock)
    }

    #[test]
    fn a_value_serialized_in_this_command_and_then_unlinked_is_a_move() {
        let _turn = turn();
        let (queued, other) = (value_with(1), value_with(1));
        note_serialized(&queued);
        assert!(!is_moved_away(&other), "only the serialized value");
        assert!(is_moved_away(&queued));
        assert!(!is_moved_away(&queued), "each unlink is seen once");
    }

    #[test]
    fn a_new_command_or_a_flush_forgets_what_was_serialized() {
        let _turn = turn();
        let v = value_with(2);
        note_serialized(&v);
        assert!(CommandClock::pending());
        CommandClock::on_command_start();
        assert!(!CommandClock::pending());
        assert!(
            !is_moved_away(&v),
            "DUMP then DEL as two commands: a delete"
        );
        note_serialized(&v);
        forget_serialized();
        assert!(!is_moved_away(&v));
        assert!(!state::any_serialized());
    }

    #[test]
    fn key_slots_match_redis_cluster() {
        // Figures from CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // An empty tag hashes the whole key; only the first tag counts; an unclosed one does
        // not count.
        assert_eq!(key_slot(b"foo{}{bar}"), 8363);
        assert_eq!(key_slot(b"{}x"), 10595);
        assert_eq!(key_slot(b"foo{bar}{zap}"), 5061);
        assert_eq!(key_slot(b"a{b"), 13340);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn exported_slots_are_remembered_until_an_import_starts() {
        assert!(!was_exported(b"foo"));
        note_slots_exported(&[(12180, 12190), (16383, 16383)]);
        assert!(was_exported(b"foo"));
        assert!(!was_exported(b"bar"));
        note_slots_importing(&[(12182, 12182)]);
        assert!(!was_exported(b"foo"));
        // Out-of-range ends are clipped, not a panic.
        note_slots_exported(&[(16000, u16::MAX)]);
    }

    #[test]
    fn values_without_waiters_are_not_recorded() {
        let _turn = turn();
        let v = value_with(0);
        note_serialized(&v);
        assert!(!state::any_serialized());
        assert!(!is_moved_away(&v));
    }
}
