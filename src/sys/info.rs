//! The module's INFO section, filled by an [`InfoSource`].

use std::ffi::{c_int, CString};
use std::ptr;

use redis_module::{raw, Context};

use super::guard::guard_silent;

/// Provides the fields of the module's default INFO section.
pub trait InfoSource: 'static {
    /// Calls `add` once per field, in display order.
    fn fields(add: &mut dyn FnMut(&'static str, u64));
}

/// `INFO <module>` (and `INFO modules` / `INFO everything`): Redis calls this with an info
/// context. A NULL section name gives the module's default section, `# <module>`; Redis
/// prefixes every field with the module name.
extern "C" fn on_info<S: InfoSource>(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    guard_silent("info", || {
        // SAFETY: ctx is the live info context of this call.
        let (Some(add_section), Some(add_field)) =
            (unsafe { raw::RedisModule_InfoAddSection }, unsafe {
                raw::RedisModule_InfoAddFieldULongLong
            })
        else {
            return;
        };
        // SAFETY: as above; NULL names the default section.
        if unsafe { add_section(ctx, ptr::null_mut()) } != 0 {
            return;
        }
        S::fields(&mut |name, value| {
            if let Ok(field) = CString::new(name) {
                // SAFETY: ctx is live; field is NUL-terminated and outlives the call.
                unsafe { add_field(ctx, field.as_ptr(), value) };
            }
        });
    });
}

/// Registers `S` as the module's INFO callback (replacing the crate's default one).
pub fn register<S: InfoSource>(ctx: &Context) {
    // SAFETY: ctx is OnLoad's; on_info is a 'static function.
    unsafe {
        if let Some(f) = raw::RedisModule_RegisterInfoFunc {
            f(ctx.ctx, Some(on_info::<S>));
        }
    }
}
