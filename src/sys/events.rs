//! Server events and keyspace notifications, as trampolines generic over an [`EventHandler`]
//! that receives them typed.

use std::ffi::{c_int, c_void, CStr};

use redis_module::{raw, Context};

use super::context::{selected_db, with_bytes};
use super::guard::guard_silent;

/// A server event the module follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// FLUSHDB (`db`) or FLUSHALL (`db` = -1) finished, also inside DEBUG RELOAD or a full
    /// sync. Values were freed without unlink.
    Flushed { db: i32 },
    /// SWAPDB `first` `second`.
    SwappedDbs { first: i32, second: i32 },
    /// RDB or AOF loading finished.
    LoadingEnded,
    /// RDB or AOF loading failed (the server exits, or a replica tries its sync again).
    LoadingFailed,
    /// Connection `client_id` is closing. Redis 7.0's freeClient sends this before it detaches
    /// the client's blocked state.
    ClientClosing { client_id: u64 },
    /// This server was a replica and is now a master.
    BecameMaster,
    /// This server was a master and is now a replica (REPLICAOF host port).
    BecameReplica,
    /// CONFIG SET changed settings; `memory` says whether `maxmemory` or
    /// `maxmemory-policy` was among them.
    ConfigChanged { memory: bool },
    /// Valkey 9's atomic slot migration: an export of these slot ranges (inclusive) to
    /// another node completed here; the server deletes their keys next.
    SlotsExported { ranges: Vec<(u16, u16)> },
    /// Valkey 9's atomic slot migration: an import of these slot ranges started here.
    SlotsImportStarted { ranges: Vec<(u16, u16)> },
}

/// Receives the events. Every method runs inside the panic guard.
pub trait EventHandler: 'static {
    fn on_server_event(ctx: &Context, event: ServerEvent);
    /// A keyspace notification of the generic or the evicted class (`event` is its name, such
    /// as `del`, `rename_to`, `evicted`) for `key` of database `db`.
    fn on_keyspace_event(ctx: &Context, db: i32, event: &[u8], key: &[u8]);
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

/// REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER and _NOW_REPLICA (macros bindgen does not
/// export).
const NOW_MASTER: u64 = 0;
const NOW_REPLICA: u64 = 1;

/// REDISMODULE_SUBEVENT_CONFIG_CHANGE.
const CONFIG_CHANGE: u64 = 0;

/// Subevents of Valkey 9's atomic slot migration event (`super::cluster`), from Valkey 9's
/// `src/valkeymodule.h`: IMPORT_STARTED 0, EXPORT_STARTED 1, IMPORT_ABORTED 2, EXPORT_ABORTED 3,
/// IMPORT_COMPLETED 4, EXPORT_COMPLETED 5.
const ASM_IMPORT_STARTED: u64 = 0;
const ASM_EXPORT_COMPLETED: u64 = 5;

/// ValkeyModuleSlotRange (Valkey 9): an inclusive range of slots.
#[repr(C)]
struct SlotRange {
    start: c_int,
    end: c_int,
}

/// ValkeyModuleAtomicSlotMigrationInfoV1 (Valkey 9).
#[repr(C)]
struct SlotMigrationInfo {
    version: u64,
    job_name: [std::ffi::c_char; 41],
    slot_ranges: *const SlotRange,
    num_slot_ranges: u32,
}

/// The slot ranges of a slot-migration event's data (empty when there is none).
fn slot_ranges(data: *mut c_void) -> Vec<(u16, u16)> {
    // SAFETY: for the atomic slot migration event Valkey passes a
    // ValkeyModuleAtomicSlotMigrationInfoV1 that lives during the callback.
    let Some(info) = (unsafe { (data as *const SlotMigrationInfo).as_ref() }) else {
        return Vec::new();
    };
    if info.slot_ranges.is_null() {
        return Vec::new();
    }
    (0..info.num_slot_ranges as usize)
        .filter_map(|i| {
            // SAFETY: slot_ranges points to num_slot_ranges ranges, live during the callback;
            // i is below num_slot_ranges.
            let r = unsafe { &*info.slot_ranges.add(i) };
            Some((u16::try_from(r.start).ok()?, u16::try_from(r.end).ok()?))
        })
        .collect()
}

/// The names a CONFIG SET changed (RedisModuleConfigChangeV1): does any of them bear on
/// eviction? Redis passes each setting's canonical name.
fn changes_memory_settings(data: *mut c_void) -> bool {
    // SAFETY: for the config event Redis passes a RedisModuleConfigChangeV1 that lives during
    // the callback.
    let Some(change) = (unsafe { (data as *const raw::RedisModuleConfigChange).as_ref() }) else {
        return false;
    };
    if change.config_names.is_null() {
        return false;
    }
    (0..change.num_changes as usize).any(|i| {
        // SAFETY: config_names points to num_changes NUL-terminated names, live during the
        // callback; i is below num_changes.
        let name = unsafe { *change.config_names.add(i) };
        if name.is_null() {
            return false;
        }
        // SAFETY: as above; the name is NUL-terminated.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        name.eq_ignore_ascii_case(b"maxmemory")
            || name.eq_ignore_ascii_case(b"maxmemory-policy")
            || name.eq_ignore_ascii_case(b"replica-ignore-maxmemory")
    })
}

fn typed(eid: u64, sub: u64, data: *mut c_void) -> Option<ServerEvent> {
    match eid {
        raw::REDISMODULE_EVENT_FLUSHDB if sub == raw::REDISMODULE_SUBEVENT_FLUSHDB_END => {
            // SAFETY: for the FlushDB event Redis passes a RedisModuleFlushInfoV1.
            let db = unsafe { (data as *const FlushInfo).as_ref() }.map_or(-1, |i| i.dbnum);
            Some(ServerEvent::Flushed { db })
        }
        raw::REDISMODULE_EVENT_SWAPDB => {
            // SAFETY: for the SwapDB event Redis passes a RedisModuleSwapDbInfoV1.
            unsafe { (data as *const SwapDbInfo).as_ref() }.map(|i| ServerEvent::SwappedDbs {
                first: i.first,
                second: i.second,
            })
        }
        raw::REDISMODULE_EVENT_LOADING if sub == raw::REDISMODULE_SUBEVENT_LOADING_ENDED => {
            Some(ServerEvent::LoadingEnded)
        }
        raw::REDISMODULE_EVENT_LOADING if sub == raw::REDISMODULE_SUBEVENT_LOADING_FAILED => {
            Some(ServerEvent::LoadingFailed)
        }
        raw::REDISMODULE_EVENT_CLIENT_CHANGE
            if sub == raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED =>
        {
            // SAFETY: for the client-change event Redis passes a RedisModuleClientInfoV1.
            unsafe { (data as *const raw::RedisModuleClientInfo).as_ref() }
                .map(|info| ServerEvent::ClientClosing { client_id: info.id })
        }
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED if sub == NOW_MASTER => {
            Some(ServerEvent::BecameMaster)
        }
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED if sub == NOW_REPLICA => {
            Some(ServerEvent::BecameReplica)
        }
        raw::REDISMODULE_EVENT_CONFIG if sub == CONFIG_CHANGE => Some(ServerEvent::ConfigChanged {
            memory: changes_memory_settings(data),
        }),
        super::cluster::EVENT_ATOMIC_SLOT_MIGRATION if sub == ASM_EXPORT_COMPLETED => {
            Some(ServerEvent::SlotsExported {
                ranges: slot_ranges(data),
            })
        }
        super::cluster::EVENT_ATOMIC_SLOT_MIGRATION if sub == ASM_IMPORT_STARTED => {
            Some(ServerEvent::SlotsImportStarted {
                ranges: slot_ranges(data),
            })
        }
        _ => None,
    }
}

extern "C" fn on_server_event<H: EventHandler>(
    ctx: *mut raw::RedisModuleCtx,
    eid: raw::RedisModuleEvent,
    sub: u64,
    data: *mut c_void,
) {
    // The guard's name per event kind (the fault-injection tests arm them by name).
    let what = match eid.id {
        raw::REDISMODULE_EVENT_FLUSHDB => "flush event",
        raw::REDISMODULE_EVENT_SWAPDB => "swapdb event",
        raw::REDISMODULE_EVENT_LOADING => "loading event",
        raw::REDISMODULE_EVENT_CLIENT_CHANGE => "client event",
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED => "role change event",
        raw::REDISMODULE_EVENT_CONFIG => "config event",
        super::cluster::EVENT_ATOMIC_SLOT_MIGRATION => "slot migration event",
        _ => "server event",
    };
    guard_silent(what, || {
        if let Some(event) = typed(eid.id, sub, data) {
            H::on_server_event(&Context::new(ctx), event);
        }
    });
}

extern "C" fn on_keyspace_event<H: EventHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    event: *const std::ffi::c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    guard_silent("keyspace event", || {
        if event.is_null() {
            return;
        }
        // SAFETY: Redis passes a NUL-terminated event name that lives during the call.
        let name = unsafe { CStr::from_ptr(event) }.to_bytes();
        let context = Context::new(ctx);
        let db = selected_db(&context);
        with_bytes(key, |key| H::on_keyspace_event(&context, db, name, key));
    });
    0
}

/// Subscribes `H` to the events above. Called once from OnLoad. `slot_migration`: also to
/// Valkey 9's atomic slot migration event (only where the server has it).
pub fn subscribe<H: EventHandler>(ctx: &Context, slot_migration: bool) -> Result<(), String> {
    let mut ids = vec![
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_SWAPDB,
        raw::REDISMODULE_EVENT_LOADING,
        raw::REDISMODULE_EVENT_CLIENT_CHANGE,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_CONFIG,
    ];
    if slot_migration {
        ids.push(super::cluster::EVENT_ATOMIC_SLOT_MIGRATION);
    }
    for id in ids {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: ctx is OnLoad's; the callback is a 'static function.
        let rc = unsafe {
            raw::RedisModule_SubscribeToServerEvent
                .map_or(1, |f| f(ctx.ctx, event, Some(on_server_event::<H>)))
        };
        if rc != 0 {
            return Err(format!("cannot subscribe to server event {id}"));
        }
    }
    // Module subscribers get every event of their classes whatever notify-keyspace-events
    // says. The evicted class adds one callback per evicted key (and none otherwise); the
    // expired class one per key the server expires (it tells a lock key's expiry from its
    // eviction, see `eviction`).
    // SAFETY: as above.
    let rc = unsafe {
        raw::RedisModule_SubscribeToKeyspaceEvents.map_or(1, |f| {
            f(
                ctx.ctx,
                raw::REDISMODULE_NOTIFY_GENERIC
                    | raw::REDISMODULE_NOTIFY_EVICTED
                    | raw::REDISMODULE_NOTIFY_EXPIRED,
                Some(on_keyspace_event::<H>),
            )
        })
    };
    if rc != 0 {
        return Err("cannot subscribe to keyspace events".into());
    }
    Ok(())
}

/// What runs once on the next turn of the event loop ([`wake_soon`]).
pub trait SoonHandler: 'static {
    /// Runs inside the panic guard, on the main thread, with the module's detached context
    /// (`context::detached_context`) as its only context: it may arm timers.
    fn soon();
}

extern "C" fn on_soon<H: SoonHandler>(_data: *mut c_void) {
    guard_silent("event-loop wake", || H::soon());
}

/// Wakes the event loop at once and runs `H::soon` on its next turn, whatever else is (or is
/// not) happening. Unlike a timer armed from a timer callback (Redis rounds the wait of those
/// up to a whole millisecond), this leaves the loop no time to sleep. False if the server
/// lacks the API (it then does nothing).
pub fn wake_soon<H: SoonHandler>() -> bool {
    // SAFETY: the callback is a 'static function that ignores its (null) data; Redis calls it
    // once, on the main thread.
    let rc = unsafe {
        raw::RedisModule_EventLoopAddOneShot
            .map_or(1, |f| f(Some(on_soon::<H>), std::ptr::null_mut()))
    };
    rc == 0
}
