//! What reaches replicas and the AOF.
//!
//! Not done yet (issue 4): lock commands do not propagate their effects, and an AOF rewrite
//! emits nothing for lock keys, so AOF-only persistence and replicas do not see locks. RDB
//! snapshots do keep them (see `datatype`).

use redis_module::raw;

use crate::datatype::LockValue;

/// AOF rewrite of one lock key. Lock keys are left out of the rewritten AOF until effect
/// replication exists; a warning in the log says so instead of losing them silently.
pub fn rewrite(_io: *mut raw::RedisModuleIO, _key: &[u8], value: &LockValue) {
    if !value.lock.holders().is_empty() {
        crate::ffi::log_warning(
            "lock module: AOF rewrite does not include lock keys yet; use RDB persistence",
        );
    }
}
