//! The one panic guard every entry point goes through.
//!
//! Nothing in `redis-module` catches unwinding, and a panic that reaches Redis aborts the whole
//! server. Every command handler and every callback runs its body inside [`guard`], which turns
//! a panic into an `ERR` reply (or a log line where there is nobody to reply to) and leaves the
//! server running.

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{RedisError, RedisResult};

/// Runs `body`, converting a panic into an error naming `what`.
pub fn guard(what: &str, body: impl FnOnce() -> RedisResult) -> RedisResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            crate::ffi::log_warning(&format!("lock module: internal error in {what}: {detail}"));
            Err(RedisError::String(format!(
                "ERR internal error in {what}; the lock module caught it and the server is fine"
            )))
        }
    }
}

/// Runs a callback body that has no reply (data-type and event callbacks): a panic is logged.
pub fn guard_silent(what: &str, body: impl FnOnce()) {
    let _ = guard(what, || {
        body();
        Ok(redis_module::RedisValue::NoReply)
    });
}
