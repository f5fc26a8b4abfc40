//! The module data type `redislock`: how a lock value is saved, loaded, rewritten into the
//! AOF, digested, measured, copied and freed, and what happens when it leaves its key.
//!
//! RDB encoding, version 2 (waiters are connections and are never saved):
//! `fence` (unsigned), `holder count` (unsigned), then per holder `owner` (string),
//! `mode` (unsigned: 0 write, 1 read, 2 semaphore permit), `count`, `expires_at` (absolute
//! Unix ms), `token`, `bound` (0, or 1 followed by the connection id), `lock_delay`,
//! `capacity` (the semaphore's, 0 for a lock); then `delay_until` (the pending lock-delay's
//! end, absolute Unix ms, 0 for none).
//! Version 1, written before BIND, LOCKDELAY and semaphores, is version 2 without the
//! per-holder `bound`, `lock_delay` and `capacity` and without `delay_until`, modes 0 and 1
//! only; it is still read.
//! The module-wide fencing counter is saved as aux data before the keys.
//!
//! Bound holds are saved with their connection id: a replica that loads its master's RDB keeps
//! them (they end on promotion); a master that loads them ends them once loading is over
//! (`events`), since their connections are gone.

use redis_lock_core::{HoldOptions, Holder, Lock, Mode, PackedOptions, MAX_DURATION};

use crate::sys::context::log_warning;
use crate::sys::datatype::{AofWriter, Digest, RdbReader, RdbWriter, TypeHandler};
use crate::value::{LockType, LockValue, ENCODING_VERSION};
use crate::{moving, replication, settle, stats};

impl TypeHandler for LockType {
    type Value = LockValue;

    fn rdb_load(rdb: &mut RdbReader<'_>, encver: i32, db: i32, key: &[u8]) -> Option<LockValue> {
        let value = load(rdb, encver)?;
        // A loaded value has no timer yet: settle the key once loading is done.
        settle::mark_dirty(db, key);
        Some(value)
    }

    fn rdb_save(rdb: &mut RdbWriter<'_>, value: &LockValue) {
        // A MIGRATE serializes the value before it deletes it: see `moving`.
        moving::note_serialized(value);
        let lock = value.view();
        rdb.unsigned(lock.fence());
        rdb.unsigned(lock.holders().len() as u64);
        for (owner, h) in lock.holders().iter() {
            rdb.bytes(owner);
            rdb.unsigned(mode_code(h.mode));
            rdb.unsigned(h.count);
            rdb.unsigned(h.expires_at);
            rdb.unsigned(h.token);
            let options = h.options.get();
            match options.bound_to {
                Some(conn) => {
                    rdb.unsigned(1);
                    rdb.unsigned(conn);
                }
                None => rdb.unsigned(0),
            }
            rdb.unsigned(options.lock_delay);
            rdb.unsigned(u64::from(h.capacity));
        }
        rdb.unsigned(lock.delay_until());
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

    fn aux_save(rdb: &mut RdbWriter<'_>) {
        rdb.unsigned(stats::last_token());
    }

    fn aux_load(rdb: &mut RdbReader<'_>) -> bool {
        match rdb.unsigned() {
            Ok(last) => {
                stats::with_fences(|f| f.observe(last));
                true
            }
            Err(_) => false,
        }
    }
}

/// Reads a value in the RDB encoding; `None` (and a log line) on anything malformed, which
/// makes Redis fail the load instead of starting with a corrupt lock.
fn load(rdb: &mut RdbReader<'_>, encver: i32) -> Option<LockValue> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        log_warning(&format!(
            "lock module: cannot load lock encoding version {encver} (this build reads 1 to {ENCODING_VERSION})"
        ));
        return None;
    }
    let with_options = encver >= 2;
    let result = (|| -> Result<LockValue, String> {
        let fence = rdb.unsigned()?;
        let n = rdb.unsigned()?;
        let mut lock = Lock::new();
        stats::with_fences(|fences| -> Result<(), String> {
            lock.restore_fence(fence, fences);
            for _ in 0..n {
                let owner = rdb.bytes()?;
                let mode = match rdb.unsigned()? {
                    0 => Mode::Write,
                    1 => Mode::Read,
                    2 if with_options => Mode::Permit,
                    m => return Err(format!("unknown mode {m}")),
                };
                let count = rdb.unsigned()?;
                let expires_at = rdb.unsigned()?;
                let token = rdb.unsigned()?;
                let mut options = HoldOptions::default();
                if with_options {
                    options.bound_to = match rdb.unsigned()? {
                        0 => None,
                        1 => Some(rdb.unsigned()?),
                        b => return Err(format!("unknown bound flag {b}")),
                    };
                    options.lock_delay = rdb.unsigned()?;
                    if options.lock_delay > MAX_DURATION {
                        return Err("lock-delay out of range".into());
                    }
                }
                let capacity = if with_options {
                    u32::try_from(rdb.unsigned()?).map_err(|_| "capacity out of range")?
                } else {
                    0
                };
                if lock.holders().get(&owner).is_some() {
                    return Err("duplicate owner".into());
                }
                let holder = Holder {
                    mode,
                    capacity,
                    count,
                    expires_at,
                    token,
                    granted_at: 0,
                    options: PackedOptions::new(options),
                };
                lock.check_restorable(&owner, &holder)
                    .map_err(|e| e.message().to_string())?;
                lock.restore_holder(&owner, holder, fences);
            }
            Ok(())
        })?;
        if with_options {
            let delay_until = rdb.unsigned()?;
            if delay_until != 0 && !lock.holders().is_empty() {
                return Err("a lock-delay beside holders".into());
            }
            lock.restore_delay(delay_until);
        }
        Ok(LockValue::new(lock))
    })();
    match result {
        Ok(v) => Some(v),
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
