//! Calls about the current context that the crate's `Context` does not wrap: the clock,
//! databases, the client's id, replication, keyspace notifications, the module's long-lived
//! context and its log.

use std::ffi::{c_int, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::{raw, Context, RedisString};

thread_local! {
    /// The time [`now_ms`] answers while [`with_now_frozen`] runs (0: read the clock).
    static FROZEN_NOW: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Current Unix time in ms, as Redis's own `mstime()` (the clock key expiry uses).
pub fn now_ms() -> u64 {
    let frozen = FROZEN_NOW.with(|f| f.get());
    if frozen != 0 {
        return frozen;
    }
    // SAFETY: RedisModule_Milliseconds takes no arguments and only reads the clock.
    let ms = unsafe { raw::RedisModule_Milliseconds.map_or(0, |f| f()) };
    u64::try_from(ms).unwrap_or(0)
}

/// Runs `f` with [`now_ms`] reading the time once, at the start: for a pass over many keys
/// that lasts a fraction of a millisecond (a settle slice), where a clock read per key was 3 %
/// of the work. A time read inside is at most that slice old.
pub fn with_now_frozen<R>(f: impl FnOnce() -> R) -> R {
    /// Thaws the clock when dropped, so a panic inside `f` (caught by the guard around the
    /// callback) cannot leave every later [`now_ms`] answering this slice's time.
    struct Thaw;
    impl Drop for Thaw {
        fn drop(&mut self) {
            FROZEN_NOW.with(|c| c.set(0));
        }
    }
    let now = now_ms();
    FROZEN_NOW.with(|c| c.set(now));
    let _thaw = Thaw;
    f()
}

/// Current Unix time in µs, from the same wall clock as [`now_ms`] (CLOCK_REALTIME); read only
/// when the fencing counter jumps to its floor, never per command. 0 if the clock reads before
/// 1970.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Ends the process with status 1, as Redis does itself when its AOF cannot be loaded: called
/// when a load refused a lock value, so the server never serves a data set missing keys.
pub fn exit_after_refused_load() -> ! {
    std::process::exit(1)
}

/// Is the server loading a data set (RDB, AOF, full resynchronisation) right now?
pub fn server_is_loading() -> bool {
    detached_context().is_some_and(|ctx| {
        ctx.get_flags()
            .contains(redis_module::ContextFlags::LOADING)
    })
}

/// The database the context works on.
pub fn selected_db(ctx: &Context) -> i32 {
    // SAFETY: ctx.ctx is the live context Redis handed to the current callback.
    unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx.ctx)) }
}

/// Switches the context to database `db`. False if the index does not exist.
pub fn select_db(ctx: &Context, db: i32) -> bool {
    // SAFETY: as above; Redis validates the index and answers ERR when out of range.
    unsafe { raw::RedisModule_SelectDb.map_or(1, |f| f(ctx.ctx, db)) == 0 }
}

/// Redis's id of the client running the current command.
pub fn client_id(ctx: &Context) -> u64 {
    // SAFETY: ctx is the live context of the current command.
    unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx)) }
}

/// The bytes of a string Redis handed to a callback, lent to `f` only: the borrow cannot
/// outlive the callback that received the string.
pub(crate) fn with_bytes<R>(s: *const raw::RedisModuleString, f: impl FnOnce(&[u8]) -> R) -> R {
    if s.is_null() {
        return f(&[]);
    }
    let mut len: usize = 0;
    // SAFETY: s is a live RedisModuleString for the duration of the callback that received
    // it, which outlasts this call; StringPtrLen returns its buffer and length, and the slice
    // is only lent to `f`.
    unsafe {
        let p = raw::RedisModule_StringPtrLen.map_or(ptr::null(), |g| g(s as *mut _, &mut len));
        if p.is_null() {
            f(&[])
        } else {
            f(std::slice::from_raw_parts(p as *const u8, len))
        }
    }
}

/// Propagates `command a` (one binary-safe argument) to replicas and the AOF.
pub fn replicate1(ctx: &Context, command: &CStr, arg: &[u8]) {
    // SAFETY: as in `replicate3`, with one argument.
    unsafe {
        if let Some(replicate) = raw::RedisModule_Replicate {
            replicate(
                ctx.ctx,
                command.as_ptr(),
                c"b".as_ptr(),
                arg.as_ptr(),
                arg.len(),
            );
        }
    }
}

/// Propagates `command a b c` (three binary-safe arguments) to replicas and the AOF.
pub fn replicate3(ctx: &Context, command: &CStr, args: [&[u8]; 3]) {
    let [a, b, c] = args;
    // SAFETY: ctx is live; the format matches the arguments (b = pointer + length) and the
    // buffers outlive the call (Redis copies them into its own objects).
    unsafe {
        if let Some(replicate) = raw::RedisModule_Replicate {
            replicate(
                ctx.ctx,
                command.as_ptr(),
                c"bbb".as_ptr(),
                a.as_ptr(),
                a.len(),
                b.as_ptr(),
                b.len(),
                c.as_ptr(),
                c.len(),
            );
        }
    }
}

/// Sends a keyspace notification of the module class (`d`) for `key`. The event name is a
/// static C string, so nothing is allocated when notifications are off.
pub fn notify_module_event(ctx: &Context, event: &CStr, key: &RedisString) {
    // SAFETY: ctx and key are live for this call; event is NUL-terminated.
    unsafe {
        if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
            notify(
                ctx.ctx,
                raw::REDISMODULE_NOTIFY_MODULE as c_int,
                event.as_ptr(),
                key.inner,
            );
        }
    }
}

static DETACHED_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(ptr::null_mut());

/// Creates the module's long-lived context (at load). It is used from the main thread only,
/// for calls that need a context where Redis gives none (creating a timer from inside a
/// data-type callback); it never takes the GIL.
pub fn init_detached_context(ctx: &Context) {
    // SAFETY: called once from OnLoad with its live ctx; the returned context lives until the
    // process exits.
    let d = unsafe {
        raw::RedisModule_GetDetachedThreadSafeContext.map_or(ptr::null_mut(), |f| f(ctx.ctx))
    };
    DETACHED_CTX.store(d, Ordering::Relaxed);
}

/// The module's long-lived context, for timer creation outside any callback context.
pub fn detached_context() -> Option<Context> {
    let p = DETACHED_CTX.load(Ordering::Relaxed);
    (!p.is_null()).then(|| Context::new(p))
}

/// Writes a warning to the Redis log (for failures that have no client to tell).
pub fn log_warning(message: &str) {
    if let Some(ctx) = detached_context() {
        ctx.log_warning(message);
    }
}

/// Can the server evict keys now: `maxmemory` is set, `maxmemory-policy` is not
/// `noeviction`, and this is not a replica that ignores `maxmemory`. The server's own answer
/// (its context flags), so it needs no CONFIG GET and is safe inside any callback.
pub fn server_can_evict() -> bool {
    // SAFETY: RedisModule_GetContextFlags accepts a NULL context (it then skips the
    // client-specific flags) and only reads server state.
    let flags = unsafe { raw::RedisModule_GetContextFlags.map_or(0, |f| f(ptr::null_mut())) };
    flags_can_evict(flags)
}

/// Do context flags (`RedisModule_GetContextFlags`) say that the server can evict keys?
pub fn flags_can_evict(flags: c_int) -> bool {
    let both = (raw::REDISMODULE_CTX_FLAGS_MAXMEMORY | raw::REDISMODULE_CTX_FLAGS_EVICT) as c_int;
    flags & both == both
}

/// Are clients paused (CLIENT PAUSE, or a failover in progress)? The server then keeps the
/// dataset constant: it neither deletes expired keys nor lets them be written, so a key whose
/// TTL has passed reads as absent although it is still there (and creating it anew would
/// fail an assertion in the server).
pub fn writes_paused() -> bool {
    // SAFETY: RedisModule_AvoidReplicaTraffic takes no arguments and reads (and, if the
    // pause's end time has passed, ends) the server's pause state, which is what key
    // expiry consults too (Redis 7.0 and Valkey 8 alike).
    unsafe { raw::RedisModule_AvoidReplicaTraffic.map_or(0, |f| f()) != 0 }
}
