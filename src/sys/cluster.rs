//! Which hash slots this node serves, as the server itself decides it for a command, and the
//! module options and events of Valkey's atomic slot migration.
//!
//! The module API of Redis 7.0 and Valkey 8 has no "who serves this slot" call. What it has:
//! `RM_Call` in a cluster refuses a command whose keys this node does not serve, with the same
//! routine (`getNodeByQuery`) that answers clients MOVED, ASK or CLUSTERDOWN: the reply is NULL
//! and `errno` is `EPERM` (another node serves the key, or nobody does: a MOVED, an ASK, a slot
//! deleted with DELSLOTS), `ENETDOWN` or `EROFS` (the cluster is down). Checked in Redis 7.0.15's
//! and Valkey 8.0.1's `src/module.c` (`RM_Call`). One `EXISTS key` through it is the check: it
//! costs one command call (a few microseconds), made only on the server's own paths (settling
//! a key, a timer firing), never on a client's command (the server routed that already). The
//! call runs the module's own command filter only if it was registered without NOSELF
//! (`filter` registers with it), and an `EXISTS` may expire the key it looks at, as the module's
//! opening of the key right after would.

use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context, ContextFlags};

/// Is the server in cluster mode? Set at load (`cluster-enabled` cannot change at run time).
static CLUSTER: AtomicBool = AtomicBool::new(false);

/// Notes whether the server runs in cluster mode (OnLoad).
pub fn init(ctx: &Context) {
    CLUSTER.store(
        ctx.get_flags().contains(ContextFlags::CLUSTER),
        Ordering::Relaxed,
    );
}

/// Does the server run in cluster mode?
pub fn enabled() -> bool {
    CLUSTER.load(Ordering::Relaxed)
}

/// Who serves a key's hash slot, as the server would answer a client that sent a command on it
/// now (without ASKING).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    /// This node (or the server is not a cluster).
    Here,
    /// Another node, or no node (the slot is unassigned): a client would be redirected or told
    /// the slot is not served.
    Elsewhere,
    /// The cluster is down: nobody may be served now; ask again later.
    ClusterDown,
}

// errno values on Linux (the platform the module is built for).
const EPERM: i32 = 1;
const EROFS: i32 = 30;
const ENETDOWN: i32 = 100;

/// Who serves `key`'s slot now (see the file's comment). Outside a cluster, always [`Serving::Here`].
pub fn serving(ctx: &Context, key: &[u8]) -> Serving {
    if !enabled() {
        return Serving::Here;
    }
    // SAFETY: RM_Call with format "b" reads one (pointer, length) pair: `key` is live and its
    // length is given; the command name and format are NUL-terminated literals. The reply, when
    // not NULL, is ours to free, once, and nothing else keeps it.
    let (reply, errno) = unsafe {
        let Some(call) = raw::RedisModule_Call else {
            return Serving::Here;
        };
        let reply = call(
            ctx.ctx,
            c"EXISTS".as_ptr(),
            c"b".as_ptr(),
            key.as_ptr() as *const c_char,
            key.len(),
        );
        // Read at once: nothing else may run between the call and the read.
        (reply, std::io::Error::last_os_error().raw_os_error())
    };
    if !reply.is_null() {
        // SAFETY: as above: a live reply of ours, freed once.
        unsafe {
            if let Some(free) = raw::RedisModule_FreeCallReply {
                free(reply);
            }
        }
        return Serving::Here;
    }
    match errno {
        Some(EPERM) => Serving::Elsewhere,
        Some(ENETDOWN) | Some(EROFS) => Serving::ClusterDown,
        // Another refusal (the server out of memory for a deny-oom command does not apply to
        // EXISTS; a command the server does not know cannot happen): the server would not stop
        // a client here for a slot reason.
        _ => Serving::Here,
    }
}

/// VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION, `1 << 5` in Valkey 9's
/// `src/valkeymodule.h` (not in redis-module 2.0.8's bindings): the module handles
/// `CLUSTER MIGRATESLOTS`. Without it Valkey 9 refuses every MIGRATESLOTS while the module is
/// loaded.
pub const HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;

/// ValkeyModuleEvent_AtomicSlotMigration's id, 19 in Valkey 9's `src/valkeymodule.h`.
pub const EVENT_ATOMIC_SLOT_MIGRATION: u64 = 19;

/// The module options this server knows (`RM_GetModuleOptionsAll`, Redis 7.2+ and Valkey), or 0
/// where the call is missing (Redis 7.0).
pub fn known_module_options() -> c_int {
    // SAFETY: a plain function pointer read and called without arguments.
    unsafe { raw::RedisModule_GetModuleOptionsAll.map_or(0, |f| f()) }
}

/// Is this server Valkey (its INFO names it so)? Asked once at load.
pub fn is_valkey(ctx: &Context) -> bool {
    use redis_module::RedisValue;
    let text = match ctx.call("INFO", &["server"]) {
        Ok(RedisValue::SimpleString(s) | RedisValue::BulkString(s)) => s,
        Ok(RedisValue::StringBuffer(b) | RedisValue::VerbatimString((_, b))) => {
            String::from_utf8_lossy(&b).into_owned()
        }
        _ => return false,
    };
    text.contains("server_name:valkey")
}

/// Adds `options` to the module's options (OnLoad).
pub fn set_module_options(ctx: &Context, options: c_int) {
    // SAFETY: ctx is OnLoad's; SetModuleOptions stores the flags.
    unsafe {
        if let Some(f) = raw::RedisModule_SetModuleOptions {
            f(ctx.ctx, options);
        }
    }
}
