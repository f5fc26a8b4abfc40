//! A command filter used only as a clock: it tells the layer above that a new command is about
//! to run, so what the previous command did (see `moving`) can be forgotten.
//!
//! Redis calls a module's command filters before every command a client sends (in
//! `processCommand`, before the command is looked up), before every `redis.call` of a script or
//! function, and before every `RM_Call` of another module. It does not call them again for
//! the commands of a MULTI when EXEC runs them (they were filtered when queued). The filter
//! never looks at or changes the command: it runs for every command the server executes, so it
//! does as little as it can.

use redis_module::{raw, Context};

use super::guard::guard_silent;

/// Receives the start of each command. Called on the main thread before every command, so the
/// common case must cost next to nothing.
pub trait CommandStart: 'static {
    /// Is there anything to do? Called outside the panic guard (which costs a few dozen
    /// instructions per command): it must be a plain read that cannot panic.
    fn pending() -> bool;
    /// Does it, inside the panic guard.
    fn on_command_start();
    /// A command that can change which ACL user its connection runs as (`AUTH`, `HELLO`,
    /// `RESET`) is about to run, or to be queued in a MULTI.
    fn on_user_change();
}

/// Can the command named `name` change its connection's user? A length test first, so most
/// commands cost one comparison.
fn may_change_user(name: &[u8]) -> bool {
    match name.len() {
        4 => name.eq_ignore_ascii_case(b"auth"),
        5 => name.eq_ignore_ascii_case(b"hello") || name.eq_ignore_ascii_case(b"reset"),
        _ => false,
    }
}

extern "C" fn on_command<H: CommandStart>(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    if H::pending() {
        guard_silent("command filter", H::on_command_start);
    }
    let mut len: usize = 0;
    // SAFETY: fctx is the live filter context of this call; ArgGet returns its argument 0 (or
    // NULL), which lives as long as the call; StringPtrLen only reads it, and the slice is
    // used before the call returns.
    let changes_user = unsafe {
        let name =
            raw::RedisModule_CommandFilterArgGet.map_or(std::ptr::null_mut(), |f| f(fctx, 0));
        if name.is_null() {
            false
        } else {
            let p = raw::RedisModule_StringPtrLen.map_or(std::ptr::null(), |g| g(name, &mut len));
            !p.is_null() && may_change_user(std::slice::from_raw_parts(p.cast::<u8>(), len))
        }
    };
    if changes_user {
        guard_silent("command filter", H::on_user_change);
    }
}

/// Registers `H` as a command filter (OnLoad). `NOSELF`: the module's own `RM_Call`s, made
/// from inside a command, do not count as a new command.
pub fn register<H: CommandStart>(ctx: &Context) -> Result<(), String> {
    // SAFETY: ctx is OnLoad's; the callback is a 'static function that ignores its argument.
    let filter = unsafe {
        raw::RedisModule_RegisterCommandFilter.map_or(std::ptr::null_mut(), |f| {
            f(
                ctx.ctx,
                Some(on_command::<H>),
                raw::REDISMODULE_CMDFILTER_NOSELF as i32,
            )
        })
    };
    if filter.is_null() {
        Err("cannot register the command filter (RedisModule_RegisterCommandFilter)".into())
    } else {
        Ok(())
    }
}
