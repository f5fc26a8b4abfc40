//! Every raw call into the Redis module API that the safe `redis-module` crate does not wrap,
//! and every `extern "C"` callback Redis calls into this module.
//!
//! Each callback does one thing: enter [`guard`] and call safe code elsewhere. A panic that
//! escaped a callback would abort redis-server, so none may escape.

use std::ffi::{c_int, c_void, CString};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::{raw, Context, RedisString};

use crate::guard::guard;
use crate::metadata::{self, ArgKind, CommandDoc, KeyAccess};

/// Current Unix time in ms, as Redis's own `mstime()` (the clock key expiry uses).
pub fn now_ms() -> u64 {
    // SAFETY: RedisModule_Milliseconds takes no arguments and only reads the clock.
    let ms = unsafe { raw::RedisModule_Milliseconds.map_or(0, |f| f()) };
    u64::try_from(ms).unwrap_or(0)
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

// ---------------------------------------------------------------------------------------------
// Keys

/// What an opened key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    Lock,
    Other,
}

/// A key opened for writing through the raw API, closed on drop. Gives absolute expiry and
/// direct access to this module's value, which the crate's key wrapper does not.
pub struct RawKey {
    key: *mut raw::RedisModuleKey,
    lock_type: *mut raw::RedisModuleType,
}

impl RawKey {
    pub fn open(
        ctx: &Context,
        name: &RedisString,
        lock_type: *mut raw::RedisModuleType,
        write: bool,
    ) -> Self {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        } as c_int;
        // SAFETY: ctx and name are live for this call; OpenKey returns a handle (NULL for a
        // missing key in read mode, which `kind` treats as empty) that we close once in Drop.
        let key = unsafe {
            raw::RedisModule_OpenKey.map_or(ptr::null_mut(), |f| f(ctx.ctx, name.inner, mode))
        };
        RawKey { key, lock_type }
    }

    pub fn kind(&self) -> KeyKind {
        if self.key.is_null() {
            return KeyKind::Empty;
        }
        // SAFETY: self.key is an open key handle.
        let t = unsafe { raw::RedisModule_KeyType.map_or(-1, |f| f(self.key)) } as isize;
        if t == raw::REDISMODULE_KEYTYPE_EMPTY {
            return KeyKind::Empty;
        }
        // SAFETY: as above; GetType returns NULL for keys that are not module types.
        let mt =
            unsafe { raw::RedisModule_ModuleTypeGetType.map_or(ptr::null_mut(), |f| f(self.key)) };
        if t == raw::REDISMODULE_KEYTYPE_MODULE && mt == self.lock_type {
            KeyKind::Lock
        } else {
            KeyKind::Other
        }
    }

    /// This module's value stored in the key, if the key holds one.
    pub fn value<T>(&mut self) -> Option<&mut T> {
        if self.kind() != KeyKind::Lock {
            return None;
        }
        // SAFETY: the key holds a value of our type, which we created as a Box<T> in
        // `set_value`; it stays valid while the key is open and we hand out one &mut at a time
        // (the borrow is tied to &mut self).
        unsafe {
            let v = raw::RedisModule_ModuleTypeGetValue.map_or(ptr::null_mut(), |f| f(self.key))
                as *mut T;
            v.as_mut()
        }
    }

    /// Stores `value` in the (empty) key. Redis owns it from now on and frees it through the
    /// type's free callback.
    pub fn set_value<T>(&mut self, value: Box<T>) -> bool {
        let p = Box::into_raw(value) as *mut c_void;
        // SAFETY: the key is open for writing; on success Redis takes ownership of p.
        let ok = unsafe {
            raw::RedisModule_ModuleTypeSetValue.map_or(1, |f| f(self.key, self.lock_type, p))
        } == 0;
        if !ok {
            // SAFETY: Redis refused the pointer, so it is still ours to free.
            drop(unsafe { Box::from_raw(p as *mut T) });
        }
        ok
    }

    /// Deletes the key (its value is freed through the free callback).
    pub fn delete(&mut self) {
        // SAFETY: the key is open for writing.
        unsafe {
            if let Some(f) = raw::RedisModule_DeleteKey {
                f(self.key);
            }
        }
    }

    /// Sets the key's absolute expiry, in Unix ms.
    pub fn set_abs_expire(&mut self, at: u64) {
        let at = i64::try_from(at).unwrap_or(i64::MAX);
        // SAFETY: the key is open for writing and not empty (callers set it after a value).
        unsafe {
            if let Some(f) = raw::RedisModule_SetAbsExpire {
                f(self.key, at);
            }
        }
    }
}

impl Drop for RawKey {
    fn drop(&mut self) {
        if !self.key.is_null() {
            // SAFETY: the handle came from OpenKey and is closed only here.
            unsafe {
                if let Some(f) = raw::RedisModule_CloseKey {
                    f(self.key);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Blocked clients

/// A blocked client handle. Valid from `block_client` until Redis processes our
/// `unblock_client` call for it; the blocking registry calls `unblock_client` exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockedClient(pub usize);

/// Blocks the client running the current command. `timeout_ms` 0 means no time limit.
pub fn block_client(ctx: &Context, timeout_ms: u64) -> Option<BlockedClient> {
    let timeout = i64::try_from(timeout_ms).unwrap_or(i64::MAX);
    // SAFETY: called from a command callback with its live ctx; no private data (so no free
    // callback); the callbacks are the guarded functions below.
    let bc = unsafe {
        raw::RedisModule_BlockClient?(
            ctx.ctx,
            Some(on_blocked_reply),
            Some(on_blocked_timeout),
            None,
            timeout,
        )
    };
    if bc.is_null() {
        return None;
    }
    // SAFETY: bc was just returned by BlockClient and is live.
    unsafe {
        if let Some(f) = raw::RedisModule_SetDisconnectCallback {
            f(bc, Some(on_blocked_disconnect));
        }
    }
    Some(BlockedClient(bc as usize))
}

/// Tells Redis the blocked client is done: its reply callback runs shortly (if the client is
/// still connected) and Redis frees the handle. Must be called exactly once per handle.
pub fn unblock_client(bc: BlockedClient) {
    // SAFETY: the registry guarantees bc is a live handle not yet unblocked.
    unsafe {
        if let Some(f) = raw::RedisModule_UnblockClient {
            f(bc.0 as *mut raw::RedisModuleBlockedClient, ptr::null_mut());
        }
    }
}

fn blocked_handle(ctx: *mut raw::RedisModuleCtx) -> BlockedClient {
    // SAFETY: only called from reply/timeout callbacks, whose ctx carries the handle.
    let bc = unsafe { raw::RedisModule_GetBlockedClientHandle.map_or(ptr::null_mut(), |f| f(ctx)) };
    BlockedClient(bc as usize)
}

/// Called by Redis (main thread) for a blocked client after `unblock_client`, if it is still
/// connected: sends the reply decided when it was unblocked.
extern "C" fn on_blocked_reply(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let reply = guard("blocked reply", || {
        crate::blocking::on_reply(blocked_handle(ctx))
    });
    context.reply(reply) as c_int
}

/// Called by Redis when a blocked client's WAIT timeout passes (or CLIENT UNBLOCK): the
/// waiter leaves the queue and gets nil. Not called once we have unblocked the client.
extern "C" fn on_blocked_timeout(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let bc = blocked_handle(ctx);
    let reply = guard("blocked timeout", || {
        crate::blocking::on_timeout(&context, bc);
        Ok(redis_module::RedisValue::Null)
    });
    context.reply(reply) as c_int
}

/// Called by Redis when a blocked client's connection closes before its reply was sent
/// (queued, or granted but not yet answered). The client context is going away; Redis frees
/// the handle after we unblock it.
extern "C" fn on_blocked_disconnect(
    ctx: *mut raw::RedisModuleCtx,
    bc: *mut raw::RedisModuleBlockedClient,
) {
    let context = Context::new(ctx);
    let _ = guard("blocked disconnect", || {
        crate::blocking::on_disconnect(&context, BlockedClient(bc as usize));
        Ok(redis_module::RedisValue::Null)
    });
}

// ---------------------------------------------------------------------------------------------
// Timers and the module's own context

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

// ---------------------------------------------------------------------------------------------
// Command metadata

/// Declares a command's arity, its one key (argument 1), its documentation (summary,
/// complexity, since, arguments: what COMMAND DOCS shows) through RedisModule_SetCommandInfo,
/// which Redis 7.0 has even though the crate's proc macro needs 7.2; then its ACL categories
/// where the server has them (see [`add_module_acl_category`]).
pub fn set_command_info(
    ctx: &Context,
    doc: &CommandDoc,
    module_category: Option<&str>,
) -> Result<(), String> {
    let name = doc.name;
    let cname = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: ctx is OnLoad's; GetCommand returns NULL for an unknown name, checked below.
    let command = unsafe {
        raw::RedisModule_GetCommand.map_or(ptr::null_mut(), |f| f(ctx.ctx, cname.as_ptr()))
    };
    if command.is_null() {
        return Err(format!("command {name} not found"));
    }
    let flags = match doc.access {
        KeyAccess::ReadOnly => raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
        // INSERT, UPDATE and DELETE are exclusive in Redis; a lock command may do any of the
        // three, which is what UPDATE (the general one) says.
        KeyAccess::ReadWrite => {
            raw::REDISMODULE_CMD_KEY_RW
                | raw::REDISMODULE_CMD_KEY_ACCESS
                | raw::REDISMODULE_CMD_KEY_UPDATE
        }
    };
    // A zeroed spec is the array terminator Redis looks for.
    // SAFETY: RedisModuleCommandKeySpec is plain C data for which all-zero is valid.
    let mut specs: [raw::RedisModuleCommandKeySpec; 2] = unsafe { std::mem::zeroed() };
    specs[0].flags = u64::from(flags);
    specs[0].begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    specs[0].bs.index = raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 };
    specs[0].find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    specs[0].fk.range = raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
        lastkey: 0,
        keystep: 1,
        limit: 0,
    };
    // Every string the structures point to lives in `strings` until after the call.
    let cstr = |s: &str| CString::new(s).map_err(|e| format!("{name}: {e}"));
    let summary = cstr(doc.summary)?;
    let complexity = cstr(doc.complexity)?;
    let since = cstr(metadata::SINCE)?;
    let mut strings: Vec<CString> = Vec::new();
    let mut args: Vec<raw::RedisModuleCommandArg> = Vec::with_capacity(doc.args.len() + 1);
    for a in doc.args {
        // SAFETY: plain C data for which all-zero is valid (NULL pointers, no flags).
        let mut arg: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
        let arg_name = cstr(a.name)?;
        arg.name = arg_name.as_ptr();
        strings.push(arg_name);
        (arg.type_, arg.key_spec_index) = match a.kind {
            ArgKind::Key => (raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY, 0),
            ArgKind::String => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                -1,
            ),
            ArgKind::Integer => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                -1,
            ),
            ArgKind::PureToken => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                -1,
            ),
        };
        if let Some(token) = a.token {
            let token = cstr(token)?;
            arg.token = token.as_ptr();
            strings.push(token);
        }
        if a.optional {
            arg.flags = raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int;
        }
        args.push(arg);
    }
    // The zeroed terminator (name NULL).
    // SAFETY: as above.
    args.push(unsafe { std::mem::zeroed() });
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: summary.as_ptr(),
        complexity: complexity.as_ptr(),
        since: since.as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: doc.arity,
        key_specs: specs.as_mut_ptr(),
        args: args.as_mut_ptr(),
    };
    // SAFETY: command is live; info and everything it points to (specs, args, the CStrings)
    // outlive the call, and Redis copies what it keeps (zstrdup / its own arrays).
    let rc = unsafe { raw::RedisModule_SetCommandInfo.map_or(1, |f| f(command, &info)) };
    drop(strings);
    if rc != 0 {
        return Err(format!("SetCommandInfo failed for {name}"));
    }
    set_acl_categories(command, doc, module_category)
}

/// Sets the command's ACL categories where the server supports them for module commands (Redis
/// 7.2+, Valkey 8+; looked up at load, since on 7.0 the function does not exist and module
/// commands belong to no category).
fn set_acl_categories(
    command: *mut raw::RedisModuleCommand,
    doc: &CommandDoc,
    module_category: Option<&str>,
) -> Result<(), String> {
    // SAFETY: reading a function pointer the API table filled in at load.
    let Some(set) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
        return Ok(());
    };
    let categories = match module_category {
        Some(own) if doc.in_module_category => format!("{} {own}", doc.acl_categories),
        _ => doc.acl_categories.to_string(),
    };
    let c = CString::new(categories.as_str()).map_err(|e| e.to_string())?;
    // SAFETY: command is a live handle from GetCommand during OnLoad; c outlives the call and
    // Redis parses it into flags without keeping the pointer.
    if unsafe { set(command, c.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(format!(
            "cannot set ACL categories '{categories}' on {}",
            doc.name
        ))
    }
}

/// Adds the module's own ACL category where the server can (Redis 7.4+, Valkey 8+). Returns
/// whether the category exists now; an older server simply has none.
pub fn add_module_acl_category(ctx: &Context, name: &str) -> Result<bool, String> {
    // SAFETY: reading a function pointer the API table filled in at load.
    let Some(add) = (unsafe { raw::RedisModule_AddACLCategory }) else {
        return Ok(false);
    };
    let c = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: ctx is OnLoad's (the only time Redis accepts new categories); c outlives the call
    // and Redis copies the name.
    if unsafe { add(ctx.ctx, c.as_ptr()) } == 0 {
        Ok(true)
    } else {
        Err(format!("cannot add the ACL category '{name}'"))
    }
}

/// Writes a warning to the Redis log (for failures that have no client to tell).
pub fn log_warning(message: &str) {
    if let Some(ctx) = detached_context() {
        ctx.log_warning(message);
    }
}

// ---------------------------------------------------------------------------------------------
// Data-type callbacks. Redis calls these on the main thread (rdb_save and aux_save also in a
// fork child during BGSAVE). Values are `Box<LockValue>` created by `RawKey::set_value` or by
// `type_rdb_load` / `type_copy`, and freed only by `type_free`.

fn string_bytes<'a>(s: *const raw::RedisModuleString) -> &'a [u8] {
    if s.is_null() {
        return &[];
    }
    let mut len: usize = 0;
    // SAFETY: s is a live RedisModuleString for the duration of the callback that received
    // it; StringPtrLen returns its buffer and length.
    unsafe {
        let p = raw::RedisModule_StringPtrLen.map_or(ptr::null(), |f| f(s as *mut _, &mut len));
        if p.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(p as *const u8, len)
        }
    }
}

/// RDB load (startup, DEBUG RELOAD, RESTORE, full sync): returns a new value or NULL, which
/// fails the load.
pub extern "C" fn type_rdb_load(io: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    let mut out: *mut c_void = ptr::null_mut();
    crate::guard::guard_silent("rdb load", || {
        if let Some(value) = crate::datatype::load(io, encver) {
            // SAFETY: io is the live loading handle; both calls only read from it.
            let (db, key) = unsafe {
                let key = raw::RedisModule_GetKeyNameFromIO.map_or(ptr::null(), |f| f(io));
                let db = raw::RedisModule_GetDbIdFromIO.map_or(0, |f| f(io));
                (db, string_bytes(key))
            };
            // A loaded value has no timer yet: settle the key once loading is done.
            crate::reconcile::mark_dirty(db, key);
            out = Box::into_raw(Box::new(value)) as *mut c_void;
        }
    });
    out
}

/// RDB save of one value (SAVE, BGSAVE in a child, replication full sync, DUMP).
pub extern "C" fn type_rdb_save(io: *mut raw::RedisModuleIO, value: *mut c_void) {
    crate::guard::guard_silent("rdb save", || {
        // SAFETY: value is one of our Box<LockValue> pointers, alive during the call.
        if let Some(v) = unsafe { (value as *const crate::datatype::LockValue).as_ref() } {
            crate::datatype::save(io, v);
        }
    });
}

/// AOF rewrite of one value: emits the commands that rebuild it.
pub extern "C" fn type_aof_rewrite(
    io: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    crate::guard::guard_silent("aof rewrite", || {
        // SAFETY: value is one of our Box<LockValue> pointers, alive during the call.
        if let Some(v) = unsafe { (value as *const crate::datatype::LockValue).as_ref() } {
            crate::replication::rewrite(io, string_bytes(key), v);
        }
    });
}

/// DEBUG DIGEST / DEBUG DIGEST-VALUE: feeds the value's holders to the digest.
pub extern "C" fn type_digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    crate::guard::guard_silent("digest", || {
        // SAFETY: value is one of our Box<LockValue> pointers, alive during the call.
        let Some(v) = (unsafe { (value as *const crate::datatype::LockValue).as_ref() }) else {
            return;
        };
        // SAFETY: md is the live digest handle; buffers outlive each call.
        unsafe {
            let (Some(add_buffer), Some(add_number), Some(end)) = (
                raw::RedisModule_DigestAddStringBuffer,
                raw::RedisModule_DigestAddLongLong,
                raw::RedisModule_DigestEndSequence,
            ) else {
                return;
            };
            for (owner, numbers) in crate::datatype::digest_items(v) {
                add_buffer(md, owner.as_ptr() as *const std::ffi::c_char, owner.len());
                for n in numbers {
                    add_number(md, i64::try_from(n).unwrap_or(i64::MAX));
                }
                end(md);
            }
        }
    });
}

/// MEMORY USAGE of one value.
pub extern "C" fn type_mem_usage(value: *const c_void) -> usize {
    let mut bytes = 0;
    crate::guard::guard_silent("mem usage", || {
        // SAFETY: value is one of our Box<LockValue> pointers, alive during the call.
        bytes = unsafe { (value as *const crate::datatype::LockValue).as_ref() }
            .map_or(0, |v| v.memory());
    });
    bytes
}

/// Frees a value Redis drops (DEL, overwrite, FLUSH*, expiry, shutdown).
pub extern "C" fn type_free(value: *mut c_void) {
    crate::guard::guard_silent("free", || {
        // SAFETY: Redis hands each of our values to free exactly once.
        unsafe { crate::datatype::free(value) }
    });
}

/// Called when a lock key leaves the keyspace (DEL, UNLINK, expiry, overwrite, RENAME/MOVE
/// source) just before it is freed or moved: the waiters are taken out so they can be served
/// again under the key's name.
pub extern "C" fn type_unlink(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    crate::guard::guard_silent("unlink", || {
        // SAFETY: ctx is the live option context of this callback; value is one of our
        // Box<LockValue> pointers. Redis passes it as const, but the value is ours and nothing
        // else reads it during the call.
        let (db, key, v) = unsafe {
            let db = raw::RedisModule_GetDbIdFromOptCtx.map_or(0, |f| f(ctx));
            let key = raw::RedisModule_GetKeyNameFromOptCtx.map_or(ptr::null(), |f| f(ctx));
            (
                db,
                string_bytes(key),
                (value as *mut crate::datatype::LockValue).as_mut(),
            )
        };
        if let Some(v) = v {
            crate::reconcile::on_unlink(db, key, v);
        }
    });
}

/// COPY: a new value with the same holders.
pub extern "C" fn type_copy(
    _ctx: *mut raw::RedisModuleKeyOptCtx,
    value: *const c_void,
) -> *mut c_void {
    let mut out: *mut c_void = ptr::null_mut();
    crate::guard::guard_silent("copy", || {
        // SAFETY: value is one of our Box<LockValue> pointers, alive during the call.
        if let Some(v) = unsafe { (value as *const crate::datatype::LockValue).as_ref() } {
            out = Box::into_raw(Box::new(crate::datatype::copy(v))) as *mut c_void;
        }
    });
    out
}

/// Saves the module-wide fencing counter before the keys.
pub extern "C" fn type_aux_save(io: *mut raw::RedisModuleIO, when: c_int) {
    crate::guard::guard_silent("aux save", || {
        if when == raw::Aux::Before as c_int {
            raw::save_unsigned(io, crate::stats::last_token());
        }
    });
}

/// Loads the module-wide fencing counter. Returns 0 on success, 1 to fail the load.
pub extern "C" fn type_aux_load(io: *mut raw::RedisModuleIO, _encver: c_int, when: c_int) -> c_int {
    let mut rc = 1;
    crate::guard::guard_silent("aux load", || {
        if when != raw::Aux::Before as c_int {
            rc = 0;
            return;
        }
        if let Ok(last) = raw::load_unsigned(io) {
            crate::stats::with_fences(|f| f.observe(last));
            rc = 0;
        }
    });
    rc
}

// ---------------------------------------------------------------------------------------------
// Keyspace and server events

/// Keyspace notifications (generic class): a lock value that arrives under a new name (RENAME,
/// MOVE, COPY, RESTORE) needs its timer re-armed there.
pub extern "C" fn on_keyspace_event(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    event: *const std::ffi::c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    crate::guard::guard_silent("keyspace event", || {
        if event.is_null() {
            return;
        }
        // SAFETY: Redis passes a NUL-terminated event name that lives during the call.
        let name = unsafe { std::ffi::CStr::from_ptr(event) }.to_bytes();
        if matches!(name, b"rename_to" | b"move_to" | b"copy_to" | b"restore") {
            let context = Context::new(ctx);
            crate::reconcile::mark_dirty(selected_db(&context), string_bytes(key));
        }
    });
    0
}

#[repr(C)]
struct FlushInfo {
    version: u64,
    sync: i32,
    dbnum: i32,
}

#[repr(C)]
struct SwapDbInfo {
    version: u64,
    first: i32,
    second: i32,
}

/// FLUSHDB / FLUSHALL (and the flush inside DEBUG RELOAD or a full sync): values are freed
/// without unlink, so waiters of the flushed databases must be served again.
pub extern "C" fn on_flush_event(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    sub: u64,
    data: *mut c_void,
) {
    crate::guard::guard_silent("flush event", || {
        if sub != raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
            return;
        }
        // SAFETY: for the FlushDB event Redis passes a RedisModuleFlushInfoV1.
        let db = unsafe { (data as *const FlushInfo).as_ref() }.map_or(-1, |i| i.dbnum);
        crate::reconcile::on_flush(db);
    });
}

/// SWAPDB: whole databases change index under the waiters and timers. Every lock key now in
/// either database is settled (its timer re-armed where the key now is), and so is every key
/// that waiters were queued on.
pub extern "C" fn on_swapdb_event(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    _sub: u64,
    data: *mut c_void,
) {
    crate::guard::guard_silent("swapdb event", || {
        // SAFETY: for the SwapDB event Redis passes a RedisModuleSwapDbInfoV1.
        if let Some(i) = unsafe { (data as *const SwapDbInfo).as_ref() } {
            crate::reconcile::on_swapdb(i.first, i.second);
            let context = Context::new(ctx);
            for_each_lock_key(&context, &[i.first, i.second], crate::reconcile::mark_dirty);
        }
    });
}

/// A connection is closing (client-change event, DISCONNECTED). Redis 7.0's freeClient sends
/// this before it detaches the client's blocked state, which tells the blocked-client
/// disconnect callback a real disconnect from the call Redis makes on a late timeout.
pub extern "C" fn on_client_event(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    sub: u64,
    data: *mut c_void,
) {
    crate::guard::guard_silent("client event", || {
        if sub != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED {
            return;
        }
        // SAFETY: for the client-change event Redis passes a RedisModuleClientInfoV1.
        if let Some(info) = unsafe { (data as *const raw::RedisModuleClientInfo).as_ref() } {
            crate::blocking::note_closing(info.id);
        }
    });
}

/// REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER (a macro bindgen does not export).
const NOW_MASTER: u64 = 0;

/// A replica became a master: its lock keys need timers now (a replica never arms them).
pub extern "C" fn on_role_event(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    sub: u64,
    _data: *mut c_void,
) {
    crate::guard::guard_silent("role change event", || {
        if sub == NOW_MASTER {
            let context = Context::new(ctx);
            for_each_lock_key(&context, &[], crate::reconcile::mark_dirty);
        }
    });
}

/// Calls `f(db, key)` for every lock key of databases `dbs` (all when empty): a full SCAN of
/// those databases, used on promotion and SWAPDB only.
pub fn for_each_lock_key(ctx: &Context, dbs: &[i32], mut f: impl FnMut(i32, &[u8])) {
    struct Found {
        lock_type: *mut raw::RedisModuleType,
        keys: Vec<Vec<u8>>,
    }
    /// Called by RedisModule_Scan for each key, on the main thread, during the scan call.
    extern "C" fn collect(
        _ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        key: *mut raw::RedisModuleKey,
        privdata: *mut c_void,
    ) {
        // SAFETY: privdata is the &mut Found passed to Scan below, alive during the scan; key
        // is the key Redis opened for this callback only.
        unsafe {
            let Some(found) = (privdata as *mut Found).as_mut() else {
                return;
            };
            if key.is_null() {
                return;
            }
            let mt = raw::RedisModule_ModuleTypeGetType.map_or(ptr::null_mut(), |g| g(key));
            if mt == found.lock_type {
                found.keys.push(string_bytes(name).to_vec());
            }
        }
    }
    let original = selected_db(ctx);
    let mut db = 0;
    while select_db(ctx, db) {
        if dbs.is_empty() || dbs.contains(&db) {
            let mut found = Found {
                lock_type: crate::datatype::lock_type(),
                keys: Vec::new(),
            };
            // SAFETY: the cursor is created and destroyed here; ctx is live; Scan calls
            // `collect` synchronously with our privdata.
            unsafe {
                if let (Some(create), Some(scan), Some(destroy)) = (
                    raw::RedisModule_ScanCursorCreate,
                    raw::RedisModule_Scan,
                    raw::RedisModule_ScanCursorDestroy,
                ) {
                    let cursor = create();
                    let privdata = &mut found as *mut Found as *mut c_void;
                    while scan(ctx.ctx, cursor, Some(collect), privdata) != 0 {}
                    destroy(cursor);
                }
            }
            for key in found.keys {
                f(db, &key);
            }
        }
        db += 1;
    }
    select_db(ctx, original);
}

/// End of RDB/AOF loading: settle the keys loaded (timers, expiry).
pub extern "C" fn on_loading_event(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    sub: u64,
    _data: *mut c_void,
) {
    crate::guard::guard_silent("loading event", || {
        if sub == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
            crate::reconcile::schedule();
        }
    });
}

/// Subscribes to the events above. Called once from OnLoad.
pub fn subscribe_events(ctx: &Context) -> Result<(), String> {
    type Callback =
        unsafe extern "C" fn(*mut raw::RedisModuleCtx, raw::RedisModuleEvent, u64, *mut c_void);
    let events: [(u64, Callback); 5] = [
        (raw::REDISMODULE_EVENT_FLUSHDB, on_flush_event),
        (raw::REDISMODULE_EVENT_SWAPDB, on_swapdb_event),
        (raw::REDISMODULE_EVENT_LOADING, on_loading_event),
        (raw::REDISMODULE_EVENT_CLIENT_CHANGE, on_client_event),
        (
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            on_role_event,
        ),
    ];
    for (id, cb) in events {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: ctx is OnLoad's; the callbacks are 'static functions.
        let rc = unsafe {
            raw::RedisModule_SubscribeToServerEvent.map_or(1, |f| f(ctx.ctx, event, Some(cb)))
        };
        if rc != 0 {
            return Err(format!("cannot subscribe to server event {id}"));
        }
    }
    // SAFETY: as above.
    let rc = unsafe {
        raw::RedisModule_SubscribeToKeyspaceEvents.map_or(1, |f| {
            f(
                ctx.ctx,
                raw::REDISMODULE_NOTIFY_GENERIC,
                Some(on_keyspace_event),
            )
        })
    };
    if rc != 0 {
        return Err("cannot subscribe to keyspace events".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// INFO

/// `INFO lock` (and `INFO all` / `INFO everything`): Redis calls this with an info context.
/// A NULL section name gives the module's default section, `# lock`; Redis prefixes every
/// field with the module name, so `locks_held` is shown as `lock_locks_held`.
pub extern "C" fn on_info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    crate::guard::guard_silent("info", || {
        // SAFETY: ctx is the live info context; field names are NUL-terminated and outlive
        // the calls.
        unsafe {
            let (Some(add_section), Some(add_field)) = (
                raw::RedisModule_InfoAddSection,
                raw::RedisModule_InfoAddFieldULongLong,
            ) else {
                return;
            };
            if add_section(ctx, ptr::null_mut()) != 0 {
                return;
            }
            for (name, value) in crate::stats::snapshot() {
                if let Ok(field) = CString::new(name) {
                    add_field(ctx, field.as_ptr(), value);
                }
            }
        }
    });
}

/// Registers `on_info` as the module's INFO callback (replacing the crate's default one).
pub fn register_info(ctx: &Context) {
    // SAFETY: ctx is OnLoad's; on_info is a 'static function.
    unsafe {
        if let Some(f) = raw::RedisModule_RegisterInfoFunc {
            f(ctx.ctx, Some(on_info));
        }
    }
}

/// Registers the test-only commands (builds with the `test-hooks` feature only):
/// LOCK.DEBUG-PANIC, which panics on purpose so the integration tests can check the panic
/// guard, and LOCK.DEBUG-ALLOC, which reports the module's live allocations (see
/// [`CountingAlloc`]) for the leak test.
#[cfg(feature = "test-hooks")]
pub fn register_test_commands(ctx: &Context) -> Result<(), String> {
    /// Called by Redis for either command, on the main thread.
    extern "C" fn command(
        ctx: *mut raw::RedisModuleCtx,
        argv: *mut *mut raw::RedisModuleString,
        argc: c_int,
    ) -> c_int {
        let context = Context::new(ctx);
        let args = redis_module::decode_args(ctx, argv, argc);
        let reply = crate::commands::debug(&context, args);
        context.reply(reply) as c_int
    }
    for command_name in ["lock.debug-panic", "lock.debug-alloc"] {
        let name = CString::new(command_name).map_err(|e| e.to_string())?;
        let flags = CString::new("fast").map_err(|e| e.to_string())?;
        // SAFETY: ctx is OnLoad's; name and flags are NUL-terminated and Redis copies them.
        let rc = unsafe {
            raw::RedisModule_CreateCommand.map_or(1, |f| {
                f(
                    ctx.ctx,
                    name.as_ptr(),
                    Some(command),
                    flags.as_ptr(),
                    0,
                    0,
                    0,
                )
            })
        };
        if rc != 0 {
            return Err(format!("cannot create {command_name}"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The module's global allocator

/// Redis's allocator (so `used_memory`, `maxmemory` and MEMORY USAGE see the module's memory),
/// counting the blocks and bytes the module holds. The leak test reads the counts through
/// LOCK.DEBUG-ALLOC: unlike `used_memory`, they move only with the module's own allocations,
/// not with the server's client pools and crons. Counting is two relaxed atomic adds per call
/// and is compiled only into `test-hooks` builds; release builds use Redis's allocator as is.
#[cfg(feature = "test-hooks")]
pub struct CountingAlloc;

#[cfg(feature = "test-hooks")]
static LIVE_BLOCKS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
#[cfg(feature = "test-hooks")]
static LIVE_BYTES: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Blocks and bytes the module has allocated and not freed.
#[cfg(feature = "test-hooks")]
pub fn live_allocations() -> (i64, i64) {
    (
        LIVE_BLOCKS.load(Ordering::Relaxed),
        LIVE_BYTES.load(Ordering::Relaxed),
    )
}

#[cfg(feature = "test-hooks")]
fn count_allocation(layout: std::alloc::Layout, sign: i64) {
    let bytes = i64::try_from(layout.size()).unwrap_or(i64::MAX);
    LIVE_BLOCKS.fetch_add(sign, Ordering::Relaxed);
    LIVE_BYTES.fetch_add(sign.saturating_mul(bytes), Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to RedisAlloc, a valid GlobalAlloc; the counters
// are side effects that allocate nothing. `realloc` keeps the default (alloc, copy, dealloc
// through these two methods), so it is counted too.
#[cfg(feature = "test-hooks")]
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `layout` is passed on as is.
        let p = unsafe { redis_module::alloc::RedisAlloc.alloc(layout) };
        if !p.is_null() {
            count_allocation(layout, 1);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count_allocation(layout, -1);
        // SAFETY: ptr came from `alloc` above with this layout (the caller's contract).
        unsafe { redis_module::alloc::RedisAlloc.dealloc(ptr, layout) }
    }
}

/// Propagates `LOCK.SYNC key owner state` to replicas and the AOF. Redis builds the three
/// arguments from the buffers (format `b`), so nothing else is allocated here.
pub fn replicate_sync(ctx: &Context, key: &[u8], owner: &[u8], state: &[u8]) {
    // SAFETY: ctx is the live context of the current command or callback; the format matches
    // the arguments (b = pointer + length) and every buffer outlives the call, which copies them.
    unsafe {
        if let Some(replicate) = raw::RedisModule_Replicate {
            replicate(
                ctx.ctx,
                c"LOCK.SYNC".as_ptr(),
                c"bbb".as_ptr(),
                key.as_ptr(),
                key.len(),
                owner.as_ptr(),
                owner.len(),
                state.as_ptr(),
                state.len(),
            );
        }
    }
}

/// Emits `LOCK.SYNC key owner state` into an AOF rewrite.
pub fn emit_sync(io: *mut raw::RedisModuleIO, key: &[u8], owner: &[u8], state: &[u8]) {
    // SAFETY: io is the live rewrite handle of the current aof_rewrite callback; the format
    // matches the arguments (b = pointer + length) and the buffers outlive the call.
    unsafe {
        if let Some(emit) = raw::RedisModule_EmitAOF {
            emit(
                io,
                c"LOCK.SYNC".as_ptr(),
                c"bbb".as_ptr(),
                key.as_ptr(),
                key.len(),
                owner.as_ptr(),
                owner.len(),
                state.as_ptr(),
                state.len(),
            );
        }
    }
}

/// Sends a keyspace notification of the module class (`d`) for `key`. The event name is a
/// static C string, so nothing is allocated when notifications are off.
pub fn notify_module_event(ctx: &Context, event: &std::ffi::CStr, key: &RedisString) {
    // SAFETY: ctx and key are live for this call; event is NUL-terminated and 'static.
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

/// Redis's id of the client running the current command.
pub fn client_id(ctx: &Context) -> u64 {
    // SAFETY: ctx is the live context of the current command.
    unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx)) }
}
