//! What one lock key holds: the lock and the Redis-side bookkeeping for it (its timer), the
//! INFO figures a value adds while it exists, and the data type that keys of it have (its
//! methods, such as the RDB codec, are in `datatype`).

use redis_lock_core::{Lock, Millis};
use redis_module::RedisModuleTimerID;

use crate::stats::{self, Gauges};
use crate::sys::datatype::ValueType;

/// The module data type `redislock`, whose values are [`LockValue`]s. Its behaviour (the
/// `TypeHandler` implementation) is in `datatype`.
pub struct LockType;

/// Encoding version of the RDB format (described in `datatype`).
pub const ENCODING_VERSION: i32 = 2;

/// The registered type.
pub static LOCK_TYPE: ValueType<LockType> = ValueType::new("redislock", ENCODING_VERSION);

/// The timer a value has armed, and where it will look for the value (the key by hash: a value
/// that moved to another name needs a new timer).
#[derive(Debug)]
pub struct ArmedTimer {
    pub id: RedisModuleTimerID,
    pub at: Millis,
    pub db: i32,
    pub key_hash: u64,
}

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
