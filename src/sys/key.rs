//! A key opened through the raw API, closed on drop, with what the crate's key wrapper does
//! not give: absolute expiry, and typed access to the values of one [`ValueType`].

use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::ptr;

use redis_module::{raw, Context, RedisString};

use super::datatype::{TypeHandler, ValueType};

/// What an opened key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    /// A value of the key's [`ValueType`].
    Value,
    /// Anything else (another type).
    Other,
}

/// An open key, typed by the data type whose values it may hand out.
pub struct RawKey<H: TypeHandler> {
    key: *mut raw::RedisModuleKey,
    /// The registered type's handle, read once at open (it is behind a RefCell in the type).
    ty: *mut raw::RedisModuleType,
    _values: PhantomData<fn() -> H>,
}

impl<H: TypeHandler> RawKey<H> {
    pub fn open(ctx: &Context, name: &RedisString, ty: &'static ValueType<H>, write: bool) -> Self {
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
        RawKey {
            key,
            ty: ty.raw(),
            _values: PhantomData,
        }
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
        if t == raw::REDISMODULE_KEYTYPE_MODULE && mt == self.ty {
            KeyKind::Value
        } else {
            KeyKind::Other
        }
    }

    /// The value stored in the key, if it holds one of this type.
    pub fn value(&mut self) -> Option<&mut H::Value> {
        if self.kind() != KeyKind::Value {
            return None;
        }
        // SAFETY: the key holds a value of our type, and every value of that type was created
        // as a Box<H::Value> (set_value, or the type's load and copy trampolines); it stays
        // valid while the key is open, and the one &mut is tied to &mut self.
        unsafe {
            let v = raw::RedisModule_ModuleTypeGetValue.map_or(ptr::null_mut(), |f| f(self.key))
                as *mut H::Value;
            v.as_mut()
        }
    }

    /// Stores `value` in the (empty) key. Redis owns it from now on and frees it through the
    /// type's free trampoline. False if Redis refused (the value is then dropped).
    pub fn set_value(&mut self, value: Box<H::Value>) -> bool {
        let p = Box::into_raw(value) as *mut c_void;
        // SAFETY: the key is open for writing; on success Redis takes ownership of p.
        let ok =
            unsafe { raw::RedisModule_ModuleTypeSetValue.map_or(1, |f| f(self.key, self.ty, p)) }
                == 0;
        if !ok {
            // SAFETY: Redis refused the pointer, so it is still ours to free.
            drop(unsafe { Box::from_raw(p as *mut H::Value) });
        }
        ok
    }

    /// Deletes the key (its value is freed through the free trampoline).
    pub fn delete(&mut self) {
        if self.key.is_null() {
            return;
        }
        // SAFETY: the key is open for writing.
        unsafe {
            if let Some(f) = raw::RedisModule_DeleteKey {
                f(self.key);
            }
        }
    }

    /// Sets the key's absolute expiry, in Unix ms.
    pub fn set_abs_expire(&mut self, at: u64) {
        if self.key.is_null() {
            return;
        }
        let at = i64::try_from(at).unwrap_or(i64::MAX);
        // SAFETY: the key is open for writing and not empty (callers set it after a value).
        unsafe {
            if let Some(f) = raw::RedisModule_SetAbsExpire {
                f(self.key, at);
            }
        }
    }
}

impl<H: TypeHandler> Drop for RawKey<H> {
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
