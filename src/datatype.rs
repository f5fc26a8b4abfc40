//! The module data type `redislock`: how a lock value is saved, loaded, rewritten into the
//! AOF, digested, measured, copied and freed, and what happens when it leaves its key.
//!
//! The RDB encoding, and what a stored value must satisfy to be accepted, are
//! `redis_lock_core::stored`: the same code reads an RDB file, a `RESTORE` payload and a full
//! resynchronisation, and the fuzz target drives it from plain bytes. This file lends it
//! Redis's RDB handles. The module-wide fencing counter is saved as aux data before the keys.
//!
//! Bound holds are saved with their connection id: a replica that loads its master's RDB keeps
//! them (they end on promotion); a master that loads them ends them once loading is over
//! (`events`), since their connections are gone. A value that arrives by `RESTORE` (MIGRATE,
//! resharding) keeps its holds but not their bindings: the connections are on another server.

use redis_lock_core::stored::{self, FieldSink, FieldSource};
use redis_lock_core::{Mode, MAX_EXACT_TOKEN, MAX_TOKEN};

use crate::sys::context::{log_warning, server_is_loading};
use crate::sys::datatype::{AofWriter, Digest, RdbReader, RdbWriter, TypeHandler};
use crate::sys::defrag::Mover;
use crate::value::{LockType, LockValue};
use crate::{moving, replication, settle, stats};

impl FieldSource for RdbReader<'_> {
    fn unsigned(&mut self) -> Result<u64, String> {
        RdbReader::unsigned(self)
    }

    fn bytes(&mut self, max: usize) -> Result<Vec<u8>, String> {
        RdbReader::bytes(self, max)
    }
}

impl FieldSink for RdbWriter<'_> {
    fn unsigned(&mut self, v: u64) {
        RdbWriter::unsigned(self, v);
    }

    fn bytes(&mut self, b: &[u8]) {
        RdbWriter::bytes(self, b);
    }
}

impl TypeHandler for LockType {
    type Value = LockValue;

    fn rdb_load(rdb: &mut RdbReader<'_>, encver: i32, db: i32, key: &[u8]) -> Option<LockValue> {
        let value = load(rdb, encver, db, key)?;
        // A loaded value has no timer yet: settle the key once loading is done.
        settle::mark_dirty(db, key);
        Some(value)
    }

    fn rdb_save(rdb: &mut RdbWriter<'_>, value: &LockValue) {
        // A MIGRATE serializes the value before it deletes it: see `moving`.
        moving::note_serialized(value);
        stored::encode(rdb, &value.view());
    }

    fn aof_rewrite(aof: &mut AofWriter<'_>, key: &[u8], value: &LockValue) {
        replication::rewrite(aof, key, &value.view());
    }

    /// Each holder (sorted by owner) with its mode, count, expiry and token, then the key's
    /// fence. Waiters and timers are connection state, not data.
    fn digest(value: &LockValue, digest: &mut Digest<'_>) {
        for (owner, numbers) in digest_items(value) {
            digest.bytes(&owner);
            for n in numbers {
                digest.number(i64::try_from(n).unwrap_or(i64::MAX));
            }
            digest.end_element();
        }
    }

    fn mem_usage(value: &LockValue) -> usize {
        value.memory()
    }

    fn unlink(db: i32, key: &[u8], value: &mut LockValue) {
        settle::on_unlink(db, key, value);
    }

    /// The same holders, no waiters (they wait on the source key), no timer.
    fn copy(value: &LockValue) -> LockValue {
        let mut lock = value.view().into_owned();
        drop(lock.take_waiters());
        LockValue::new(lock)
    }

    fn defrag(value: &mut LockValue, mover: &mut Mover<'_>) {
        value.defrag(mover);
    }

    fn aux_save(rdb: &mut RdbWriter<'_>) {
        rdb.unsigned(stats::last_token());
    }

    /// A counter beyond the RESP integer range cannot come from any build, and one above
    /// 2^53 - 1 is refused without `lock.legacy-tokens`: the load fails.
    fn aux_load(rdb: &mut RdbReader<'_>) -> bool {
        match rdb.unsigned() {
            Ok(last) if last <= MAX_TOKEN => {
                // Refused, the load still goes on to the keys (aux data comes first), so the
                // log names the key that carries such a token; the load then fails there, or at
                // its end if no key does (`stats::stop_if_load_refused`).
                if !stats::accept_stored_token(last, "the RDB's module-wide fencing counter") {
                    return true;
                }
                stats::observe_token(last, "the RDB's fencing counter");
                true
            }
            Ok(last) => {
                log_warning(&format!(
                    "lock module: bad fencing counter in RDB: {last} is above 2^63-1"
                ));
                false
            }
            Err(_) => false,
        }
    }
}

/// Reads and checks a value (`redis_lock_core::stored`); `None` (and a log line) on anything
/// malformed or inconsistent, which makes Redis fail the load, or `RESTORE` reply an error,
/// instead of keeping a corrupt lock. Only an accepted value moves the fencing counter.
fn load(rdb: &mut RdbReader<'_>, encver: i32, db: i32, key: &[u8]) -> Option<LockValue> {
    // Outside a load this is a RESTORE: MIGRATE and resharding bring values from another
    // server, whose connection ids mean nothing here (`stored::Bindings::Drop`).
    let bindings = if server_is_loading() {
        stored::Bindings::Keep
    } else {
        stored::Bindings::Drop
    };
    match stored::decode_with(rdb, encver, bindings) {
        Ok(decoded) => {
            // The fence is at least every token of the value (`stored` checks).
            let what = format!(
                "lock key {:?} (db {db})",
                String::from_utf8_lossy(key).escape_debug().to_string()
            );
            if !stats::accept_stored_token(decoded.max_token, &what) {
                return None;
            }
            // A RESTORE (not a load, which reports once when it ends) of a key with a token
            // from a pre-release build says so each time.
            stats::with_fences(|f| f.observe(decoded.max_token));
            if decoded.max_token > MAX_EXACT_TOKEN && !server_is_loading() {
                stats::warn_beyond_exact("RESTORE of a lock value", decoded.max_token);
            }
            Some(LockValue::new(decoded.lock))
        }
        Err(e) => {
            log_warning(&format!("lock module: bad lock value in RDB: {e}"));
            None
        }
    }
}

/// What DEBUG DIGEST covers (see [`LockType::digest`]).
fn digest_items(value: &LockValue) -> Vec<(Vec<u8>, Vec<u64>)> {
    let lock = value.view();
    let mut items: Vec<(Vec<u8>, Vec<u64>)> = lock
        .holders()
        .iter()
        .map(|(o, h)| {
            let mut numbers = vec![mode_code(h.mode), h.count, h.expires_at, h.token];
            if h.mode == Mode::Permit {
                numbers.push(u64::from(h.capacity));
            }
            // Options only when there are some, so values without them digest as before.
            if !h.options.is_none() {
                let options = h.options.get();
                numbers.extend([
                    options.bound_to.map_or(0, |c| c.saturating_add(1)),
                    options.lock_delay,
                ]);
            }
            (o.to_vec(), numbers)
        })
        .collect();
    items.sort();
    items.push((b"fence".to_vec(), vec![lock.fence(), 0, 0, 0]));
    if lock.delay_until() != 0 {
        items.push((b"delay".to_vec(), vec![lock.delay_until()]));
    }
    items
}

fn mode_code(mode: Mode) -> u64 {
    match mode {
        Mode::Write => 0,
        Mode::Read => 1,
        Mode::Permit => 2,
    }
}
