//! The test-only commands (`test-hooks` builds only): LOCK.DEBUG-PANIC, LOCK.DEBUG-ALLOC and
//! LOCK.DEBUG-INDEX.

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use crate::sys::commands::{handler, register_keyless, Command};

/// - LOCK.DEBUG-PANIC [name]: panics on purpose, so the tests can check that the guard turns a
///   panic into an error reply and the server keeps running. With a name, arms a panic for the
///   next run of that entry point instead (see `sys::guard::fault`).
pub struct DebugPanic;

impl Command for DebugPanic {
    const NAME: &'static str = "LOCK.DEBUG-PANIC";
    fn run(_ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        if let [_, name] = &args[..] {
            crate::sys::guard::fault::arm(&name.to_string_lossy());
            return Ok(RedisValue::SimpleStringStatic("OK"));
        }
        panic!("deliberate panic from LOCK.DEBUG-PANIC")
    }
}

/// LOCK.DEBUG-ALLOC: `[live blocks, live bytes]` the module holds (see `sys::alloc`).
pub struct DebugAlloc;

impl Command for DebugAlloc {
    const NAME: &'static str = "LOCK.DEBUG-ALLOC";
    fn run(_ctx: &Context, _args: Vec<RedisString>) -> RedisResult {
        let (blocks, bytes) = crate::sys::alloc::live_allocations();
        Ok(RedisValue::Array(vec![
            RedisValue::Integer(blocks),
            RedisValue::Integer(bytes),
        ]))
    }
}

/// LOCK.DEBUG-INDEX: how many entries the deadlock index (`contention`) has added or removed
/// since the module loaded: the work a request or an event made it do.
pub struct DebugIndex;

impl Command for DebugIndex {
    const NAME: &'static str = "LOCK.DEBUG-INDEX";
    fn run(_ctx: &Context, _args: Vec<RedisString>) -> RedisResult {
        let writes = crate::contention::entry_writes();
        Ok(RedisValue::Integer(
            i64::try_from(writes).unwrap_or(i64::MAX),
        ))
    }
}

/// Registers them.
pub fn register(ctx: &Context) -> Result<(), String> {
    register_keyless(ctx, "lock.debug-panic", "fast", handler::<DebugPanic>())?;
    register_keyless(ctx, "lock.debug-index", "fast", handler::<DebugIndex>())?;
    register_keyless(ctx, "lock.debug-alloc", "fast", handler::<DebugAlloc>())
}
