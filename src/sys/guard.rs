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
    let run = || {
        #[cfg(feature = "test-hooks")]
        fault::trip(what);
        body()
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(result) => result,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            super::context::log_warning(&format!(
                "lock module: internal error in {what}: {detail}"
            ));
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

/// Test-only fault injection (`test-hooks` feature): `LOCK.DEBUG-PANIC <name>` arms a panic
/// that fires the next time the entry point called `<name>` (as passed to [`guard`]) runs,
/// inside its guard, so the tests can prove every kind of entry point survives a panic.
#[cfg(feature = "test-hooks")]
pub mod fault {
    use std::cell::RefCell;

    thread_local! {
        static ARMED: RefCell<Option<String>> = const { RefCell::new(None) };
    }

    pub fn arm(what: &str) {
        ARMED.with(|a| *a.borrow_mut() = Some(what.to_string()));
    }

    pub fn trip(what: &str) {
        let hit = ARMED.with(|a| {
            let mut a = a.borrow_mut();
            if a.as_deref() == Some(what) {
                *a = None;
                true
            } else {
                false
            }
        });
        if hit {
            panic!("injected fault in {what}");
        }
    }
}
