//! A module data type whose values are one Rust type: the type methods Redis calls (RDB load
//! and save, AOF rewrite, digest, memory usage, free, unlink, copy, aux data, defrag) as trampolines
//! generic over a [`TypeHandler`], and the handles they lend the handler (RDB reader and
//! writer, AOF writer, digest) in place of raw pointers.
//!
//! Values are `Box<H::Value>` created by `RawKey::set_value` or by the load and copy
//! trampolines, and freed only by the free trampoline. Redis calls these on the main thread
//! (rdb_save and aux_save also in a fork child during BGSAVE).
//!
//! Active defragmentation may move a value's box to another address between two commands
//! (also between the commands of one long script; `super::defrag`): nothing may keep a value's
//! address past the command that read it.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use redis_module::native_types::RedisType;
use redis_module::raw;

use super::context::with_bytes;
use super::defrag::Mover;
use super::guard::guard_silent;

/// What a data type does with its values. Implemented above this layer; every method runs
/// inside the panic guard.
pub trait TypeHandler: 'static {
    type Value: 'static;
    /// Reads one value saved with encoding version `encver` for key `key` of database `db`;
    /// `None` fails the load.
    fn rdb_load(rdb: &mut RdbReader<'_>, encver: i32, db: i32, key: &[u8]) -> Option<Self::Value>;
    fn rdb_save(rdb: &mut RdbWriter<'_>, value: &Self::Value);
    /// Emits the commands that rebuild `value` at `key`.
    fn aof_rewrite(aof: &mut AofWriter<'_>, key: &[u8], value: &Self::Value);
    /// Feeds DEBUG DIGEST.
    fn digest(value: &Self::Value, digest: &mut Digest<'_>);
    /// Bytes used, for MEMORY USAGE.
    fn mem_usage(value: &Self::Value) -> usize;
    /// The value is leaving key `key` of database `db` (DEL, UNLINK, expiry, overwrite,
    /// RENAME/MOVE source), just before it is freed or moved.
    fn unlink(db: i32, key: &[u8], value: &mut Self::Value);
    /// A copy for COPY.
    fn copy(value: &Self::Value) -> Self::Value;
    /// Module-wide data saved before the keys.
    fn aux_save(rdb: &mut RdbWriter<'_>);
    /// Reads what `aux_save` wrote; false fails the load.
    fn aux_load(rdb: &mut RdbReader<'_>) -> bool;
    /// Active defragmentation: the value's own box has just been moved if the allocator
    /// suggested it; this moves what the value owns (its inner boxes) through `mover`. The
    /// default moves nothing more. Called between commands, on the main thread.
    fn defrag(value: &mut Self::Value, mover: &mut Mover<'_>) {
        let _ = (value, mover);
    }
}

/// A registered data type whose values are `H::Value`. Built with the trampolines of `H`
/// itself, so a key of this type can only ever be read as `H::Value`.
pub struct ValueType<H: TypeHandler> {
    ty: RedisType,
    _handler: PhantomData<fn() -> H>,
}

impl<H: TypeHandler> ValueType<H> {
    /// `name` must be 9 characters (Redis's rule); `version` is the encoding version.
    pub const fn new(name: &'static str, version: i32) -> Self {
        ValueType {
            ty: RedisType::new(name, version, methods::<H>()),
            _handler: PhantomData,
        }
    }

    /// Registers the type with Redis (called from OnLoad by `redis_module!`).
    pub fn create_data_type(&self, ctx: *mut raw::RedisModuleCtx) -> Result<(), &str> {
        self.ty.create_data_type(ctx)
    }

    /// The handle Redis gave the type at registration.
    pub(super) fn raw(&self) -> *mut raw::RedisModuleType {
        *self.ty.raw_type.borrow()
    }
}

const fn methods<H: TypeHandler>() -> raw::RedisModuleTypeMethods {
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load::<H>),
        rdb_save: Some(rdb_save::<H>),
        aof_rewrite: Some(aof_rewrite::<H>),
        mem_usage: Some(mem_usage::<H>),
        digest: Some(digest::<H>),
        free: Some(free::<H>),
        aux_load: Some(aux_load::<H>),
        aux_save: Some(aux_save::<H>),
        aux_save_triggers: raw::Aux::Before as i32,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: Some(defrag::<H>),
        mem_usage2: None,
        free_effort2: None,
        unlink2: Some(unlink::<H>),
        copy2: Some(copy::<H>),
        aux_save2: None,
    }
}

/// Reads an RDB stream during one load callback.
pub struct RdbReader<'a> {
    io: *mut raw::RedisModuleIO,
    _callback: PhantomData<&'a mut ()>,
}

impl RdbReader<'_> {
    pub fn unsigned(&mut self) -> Result<u64, String> {
        raw::load_unsigned(self.io).map_err(|e| e.to_string())
    }

    /// The next string, refused (without copying it) when longer than `max` bytes.
    pub fn bytes(&mut self, max: usize) -> Result<Vec<u8>, String> {
        let buffer = raw::load_string_buffer(self.io).map_err(|e| e.to_string())?;
        let bytes = buffer.as_ref();
        if bytes.len() > max {
            return Err(format!("a string of {} bytes (at most {max})", bytes.len()));
        }
        Ok(bytes.to_vec())
    }
}

/// Writes an RDB stream during one save callback.
pub struct RdbWriter<'a> {
    io: *mut raw::RedisModuleIO,
    _callback: PhantomData<&'a mut ()>,
}

impl RdbWriter<'_> {
    pub fn unsigned(&mut self, v: u64) {
        raw::save_unsigned(self.io, v);
    }

    pub fn bytes(&mut self, b: &[u8]) {
        raw::save_slice(self.io, b);
    }
}

/// Emits commands into an AOF rewrite during one rewrite callback.
pub struct AofWriter<'a> {
    io: *mut raw::RedisModuleIO,
    _callback: PhantomData<&'a mut ()>,
}

impl AofWriter<'_> {
    /// Emits `command a b c` (three binary-safe arguments).
    pub fn emit3(&mut self, command: &CStr, args: [&[u8]; 3]) {
        let [a, b, c] = args;
        // SAFETY: io is the live rewrite handle of the current aof_rewrite callback; the format
        // matches the arguments (b = pointer + length) and the buffers outlive the call.
        unsafe {
            if let Some(emit) = raw::RedisModule_EmitAOF {
                emit(
                    self.io,
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
}

/// Feeds DEBUG DIGEST during one digest callback.
pub struct Digest<'a> {
    md: *mut raw::RedisModuleDigest,
    _callback: PhantomData<&'a mut ()>,
}

impl Digest<'_> {
    pub fn bytes(&mut self, b: &[u8]) {
        // SAFETY: md is the live digest handle of the current callback; b outlives the call.
        unsafe {
            if let Some(add) = raw::RedisModule_DigestAddStringBuffer {
                add(self.md, b.as_ptr() as *const c_char, b.len());
            }
        }
    }

    pub fn number(&mut self, n: i64) {
        // SAFETY: as above.
        unsafe {
            if let Some(add) = raw::RedisModule_DigestAddLongLong {
                add(self.md, n);
            }
        }
    }

    /// Ends one element (Redis digests elements independently of their order).
    pub fn end_element(&mut self) {
        // SAFETY: as above.
        unsafe {
            if let Some(end) = raw::RedisModule_DigestEndSequence {
                end(self.md);
            }
        }
    }
}

/// RDB load (startup, DEBUG RELOAD, RESTORE, full sync): a new value, or NULL to fail the
/// load.
extern "C" fn rdb_load<H: TypeHandler>(io: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    let mut out: *mut c_void = ptr::null_mut();
    guard_silent("rdb load", || {
        // SAFETY: io is the live loading handle; both calls only read from it.
        let (db, key) = unsafe {
            (
                raw::RedisModule_GetDbIdFromIO.map_or(0, |f| f(io)),
                raw::RedisModule_GetKeyNameFromIO.map_or(ptr::null(), |f| f(io)),
            )
        };
        let mut rdb = RdbReader {
            io,
            _callback: PhantomData,
        };
        let value = with_bytes(key, |key| H::rdb_load(&mut rdb, encver, db, key));
        if let Some(value) = value {
            out = Box::into_raw(Box::new(value)) as *mut c_void;
        }
    });
    out
}

/// Borrows one of our values for the duration of a callback.
///
/// # Safety
/// `value` must be NULL or a pointer made by `Box::into_raw(Box<H::Value>)` that Redis has not
/// handed to `free` yet, and nothing else may use it during the borrow.
unsafe fn value_ref<'a, H: TypeHandler>(value: *const c_void) -> Option<&'a H::Value> {
    // SAFETY: per the contract above.
    unsafe { (value as *const H::Value).as_ref() }
}

/// RDB save of one value (SAVE, BGSAVE in a child, replication full sync, DUMP).
extern "C" fn rdb_save<H: TypeHandler>(io: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard_silent("rdb save", || {
        // SAFETY: value is one of our values, alive during the call.
        if let Some(v) = unsafe { value_ref::<H>(value) } {
            let mut rdb = RdbWriter {
                io,
                _callback: PhantomData,
            };
            H::rdb_save(&mut rdb, v);
        }
    });
}

/// AOF rewrite of one value.
extern "C" fn aof_rewrite<H: TypeHandler>(
    io: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard_silent("aof rewrite", || {
        // SAFETY: value is one of our values, alive during the call.
        if let Some(v) = unsafe { value_ref::<H>(value) } {
            let mut aof = AofWriter {
                io,
                _callback: PhantomData,
            };
            with_bytes(key, |key| H::aof_rewrite(&mut aof, key, v));
        }
    });
}

/// DEBUG DIGEST / DEBUG DIGEST-VALUE.
extern "C" fn digest<H: TypeHandler>(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard_silent("digest", || {
        // SAFETY: value is one of our values, alive during the call.
        if let Some(v) = unsafe { value_ref::<H>(value) } {
            let mut digest = Digest {
                md,
                _callback: PhantomData,
            };
            H::digest(v, &mut digest);
        }
    });
}

/// MEMORY USAGE of one value.
extern "C" fn mem_usage<H: TypeHandler>(value: *const c_void) -> usize {
    let mut bytes = 0;
    guard_silent("mem usage", || {
        // SAFETY: value is one of our values, alive during the call.
        bytes = unsafe { value_ref::<H>(value) }.map_or(0, H::mem_usage);
    });
    bytes
}

/// Frees a value Redis drops (DEL, overwrite, FLUSH*, expiry, shutdown).
extern "C" fn free<H: TypeHandler>(value: *mut c_void) {
    guard_silent("free", || {
        if !value.is_null() {
            // SAFETY: Redis hands each of our values (made by Box::into_raw) to free exactly
            // once, and uses it no more.
            drop(unsafe { Box::from_raw(value as *mut H::Value) });
        }
    });
}

/// A value is leaving its key, just before it is freed or moved.
extern "C" fn unlink<H: TypeHandler>(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    guard_silent("unlink", || {
        // SAFETY: ctx is the live option context of this callback; value is one of our values.
        // Redis passes it as const, but the value is ours and nothing else reads it during the
        // call.
        let (db, key, v) = unsafe {
            (
                raw::RedisModule_GetDbIdFromOptCtx.map_or(0, |f| f(ctx)),
                raw::RedisModule_GetKeyNameFromOptCtx.map_or(ptr::null(), |f| f(ctx)),
                (value as *mut H::Value).as_mut(),
            )
        };
        if let Some(v) = v {
            with_bytes(key, |key| H::unlink(db, key, v));
        }
    });
}

/// COPY: a new value.
extern "C" fn copy<H: TypeHandler>(
    _ctx: *mut raw::RedisModuleKeyOptCtx,
    value: *const c_void,
) -> *mut c_void {
    let mut out: *mut c_void = ptr::null_mut();
    guard_silent("copy", || {
        // SAFETY: value is one of our values, alive during the call.
        if let Some(v) = unsafe { value_ref::<H>(value) } {
            out = Box::into_raw(Box::new(H::copy(v))) as *mut c_void;
        }
    });
    out
}

/// Active defragmentation of one value (`super::defrag`): moves the value's box if the
/// allocator suggests it, writing the new address into Redis's slot, then lets the handler
/// move what the value owns. Returns 0: the work is bounded, nothing is left for later.
extern "C" fn defrag<H: TypeHandler>(
    ctx: *mut raw::RedisModuleDefragCtx,
    _key: *mut raw::RedisModuleString,
    value: *mut *mut c_void,
) -> c_int {
    guard_silent("defrag", || {
        // SAFETY: ctx is the live context of this callback; the mover does not outlive it.
        let mut mover = unsafe { Mover::new(ctx) };
        // SAFETY: value is Redis's slot holding one of our values (a Box<H::Value> made by
        // Box::into_raw), alive during the call, and nothing else uses it meanwhile.
        let Some(slot) = (unsafe { value.as_mut() }) else {
            return;
        };
        let Some(old) = NonNull::new(*slot as *mut H::Value) else {
            return;
        };
        // SAFETY: the value is a block of the global allocator, i.e. RedisModule_Alloc (see
        // super::defrag), that nothing touches during the callback. If it moves, the old block
        // is freed and Redis's slot (its only owner) takes the new address at once.
        let current = match unsafe { mover.move_block(old.cast()) } {
            Some(new) => {
                *slot = new.as_ptr().cast();
                new.cast::<H::Value>()
            }
            None => old,
        };
        // SAFETY: `current` is our live value (moved or not), borrowed only for this call.
        let v = unsafe { &mut *current.as_ptr() };
        H::defrag(v, &mut mover);
    });
    0
}

/// Saves the module-wide data before the keys.
extern "C" fn aux_save<H: TypeHandler>(io: *mut raw::RedisModuleIO, when: c_int) {
    guard_silent("aux save", || {
        if when == raw::Aux::Before as c_int {
            let mut rdb = RdbWriter {
                io,
                _callback: PhantomData,
            };
            H::aux_save(&mut rdb);
        }
    });
}

/// Loads the module-wide data. Returns 0 on success, 1 to fail the load.
extern "C" fn aux_load<H: TypeHandler>(
    io: *mut raw::RedisModuleIO,
    _encver: c_int,
    when: c_int,
) -> c_int {
    let mut rc = 1;
    guard_silent("aux load", || {
        if when != raw::Aux::Before as c_int {
            rc = 0;
            return;
        }
        let mut rdb = RdbReader {
            io,
            _callback: PhantomData,
        };
        if H::aux_load(&mut rdb) {
            rc = 0;
        }
    });
    rc
}
