//! Finding every key of one data type: a full SCAN, for the rare events that need it
//! (promotion, SWAPDB).

use std::ffi::c_void;
use std::ptr;

use redis_module::{raw, Context};

use super::context::{select_db, selected_db, with_bytes};
use super::datatype::{TypeHandler, ValueType};

/// Calls `f(db, key)` for every key holding a value of `ty` in databases `dbs` (all when
/// empty). The context's selected database is restored afterwards.
pub fn for_each_key_of<H: TypeHandler>(
    ctx: &Context,
    ty: &ValueType<H>,
    dbs: &[i32],
    mut f: impl FnMut(i32, &[u8]),
) {
    struct Found {
        ty: *mut raw::RedisModuleType,
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
            if mt == found.ty {
                with_bytes(name, |name| found.keys.push(name.to_vec()));
            }
        }
    }
    let original = selected_db(ctx);
    let mut db = 0;
    while select_db(ctx, db) {
        if dbs.is_empty() || dbs.contains(&db) {
            let mut found = Found {
                ty: ty.raw(),
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
