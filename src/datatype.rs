//! The module data type: what a lock key holds, and how it is saved, loaded, copied, measured
//! and freed.
//!
//! RDB encoding, version 1 (waiters are connections and are never saved):
//! `fence` (unsigned), `holder count` (unsigned), then per holder `owner` (string),
//! `mode` (unsigned: 0 write, 1 read), `count`, `expires_at` (absolute Unix ms), `token`.
//! The module-wide fencing counter is saved as aux data before the keys.

use std::ffi::c_void;

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::expiry::ArmedTimer;
use crate::stats::{self, Gauges};
use redis_lock_core::{Holder, Lock, Mode};

/// Encoding version of the RDB format above.
pub const ENCODING_VERSION: i32 = 1;

/// What one lock key holds: the lock itself and the Redis-side bookkeeping for it.
#[derive(Debug, Default)]
pub struct LockValue {
    pub lock: Lock,
    /// The expiry timer armed for this value, if any.
    pub timer: Option<Box<ArmedTimer>>,
}

impl LockValue {
    pub fn new(lock: Lock) -> Self {
        // INFO figures: every change to a live value is counted as the difference between
        // its figures before and after (see `LockKey`), so a value adds its own when it is
        // created and takes them back when it is freed.
        stats::update_gauges(Gauges::default(), Gauges::of(&lock));
        LockValue { lock, timer: None }
    }

    /// Approximate bytes used, for MEMORY USAGE.
    pub fn memory(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.lock.holders().heap_size()
            + self.lock.queue().heap_size()
    }
}

impl Drop for LockValue {
    fn drop(&mut self) {
        stats::update_gauges(Gauges::of(&self.lock), Gauges::default());
    }
}

pub static LOCK_TYPE: RedisType = RedisType::new(
    "redislock",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(crate::ffi::type_rdb_load),
        rdb_save: Some(crate::ffi::type_rdb_save),
        aof_rewrite: Some(crate::ffi::type_aof_rewrite),
        mem_usage: Some(crate::ffi::type_mem_usage),
        digest: Some(crate::ffi::type_digest),
        free: Some(crate::ffi::type_free),
        aux_load: Some(crate::ffi::type_aux_load),
        aux_save: Some(crate::ffi::type_aux_save),
        aux_save_triggers: raw::Aux::Before as i32,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: Some(crate::ffi::type_unlink),
        copy2: Some(crate::ffi::type_copy),
        aux_save2: None,
    },
);

/// The registered type, for comparing against a key's type.
pub fn lock_type() -> *mut raw::RedisModuleType {
    *LOCK_TYPE.raw_type.borrow()
}

/// Writes a value in the RDB encoding.
pub fn save(io: *mut raw::RedisModuleIO, value: &LockValue) {
    raw::save_unsigned(io, value.lock.fence());
    raw::save_unsigned(io, value.lock.holders().len() as u64);
    for (owner, h) in value.lock.holders().iter() {
        raw::save_slice(io, owner);
        raw::save_unsigned(io, mode_code(h.mode));
        raw::save_unsigned(io, h.count);
        raw::save_unsigned(io, h.expires_at);
        raw::save_unsigned(io, h.token);
    }
}

/// Reads a value in the RDB encoding; `None` (and a log line) on anything malformed, which
/// makes Redis fail the load instead of starting with a corrupt lock.
pub fn load(io: *mut raw::RedisModuleIO, encver: i32) -> Option<LockValue> {
    if encver != ENCODING_VERSION {
        crate::ffi::log_warning(&format!(
            "lock module: cannot load lock encoding version {encver} (this build reads {ENCODING_VERSION})"
        ));
        return None;
    }
    let result = (|| -> Result<LockValue, String> {
        let err = |e: redis_module::error::Error| e.to_string();
        let fence = raw::load_unsigned(io).map_err(err)?;
        let n = raw::load_unsigned(io).map_err(err)?;
        let mut lock = Lock::new();
        stats::with_fences(|fences| -> Result<(), String> {
            lock.restore_fence(fence, fences);
            for _ in 0..n {
                let owner = raw::load_string_buffer(io).map_err(err)?;
                let owner = owner.as_ref().to_vec();
                let mode = match raw::load_unsigned(io).map_err(err)? {
                    0 => Mode::Write,
                    1 => Mode::Read,
                    m => return Err(format!("unknown mode {m}")),
                };
                let count = raw::load_unsigned(io).map_err(err)?;
                let expires_at = raw::load_unsigned(io).map_err(err)?;
                let token = raw::load_unsigned(io).map_err(err)?;
                if lock.holders().get(&owner).is_some() {
                    return Err("duplicate owner".into());
                }
                let holder = Holder {
                    mode,
                    count,
                    expires_at,
                    token,
                };
                lock.check_restorable(&owner, &holder)
                    .map_err(|e| e.message().to_string())?;
                lock.restore_holder(&owner, holder, fences);
            }
            Ok(())
        })?;
        Ok(LockValue::new(lock))
    })();
    match result {
        Ok(v) => Some(v),
        Err(e) => {
            crate::ffi::log_warning(&format!("lock module: bad lock value in RDB: {e}"));
            None
        }
    }
}

/// A copy for COPY: the same holders, no waiters (they wait on the source key), no timer.
pub fn copy(value: &LockValue) -> LockValue {
    let mut lock = value.lock.clone();
    drop(lock.take_waiters());
    LockValue::new(lock)
}

/// What DEBUG DIGEST covers: each holder (sorted by owner) with its mode, count, expiry and
/// token, then the key's fence. Waiters and timers are connection state, not data.
pub fn digest_items(value: &LockValue) -> Vec<(Vec<u8>, [u64; 4])> {
    let mut items: Vec<(Vec<u8>, [u64; 4])> = value
        .lock
        .holders()
        .iter()
        .map(|(o, h)| {
            (
                o.to_vec(),
                [mode_code(h.mode), h.count, h.expires_at, h.token],
            )
        })
        .collect();
    items.sort();
    items.push((b"fence".to_vec(), [value.lock.fence(), 0, 0, 0]));
    items
}

pub fn mode_code(mode: Mode) -> u64 {
    match mode {
        Mode::Write => 0,
        Mode::Read => 1,
    }
}

/// Frees a value Redis no longer needs.
///
/// # Safety
/// `value` must be a pointer created by `Box::into_raw(Box<LockValue>)` that Redis hands back
/// exactly once.
pub unsafe fn free(value: *mut c_void) {
    if !value.is_null() {
        // SAFETY: per the contract above.
        drop(unsafe { Box::from_raw(value as *mut LockValue) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory per lock is a published figure (docs/benchmarks.md); this keeps the value from
    /// growing back by accident. 80 bytes is one jemalloc size class.
    #[test]
    fn a_lock_value_fits_in_80_bytes() {
        assert!(
            std::mem::size_of::<LockValue>() <= 80,
            "{}",
            std::mem::size_of::<LockValue>()
        );
    }
}
