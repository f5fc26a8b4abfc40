//! Where server events and keyspace notifications lead: almost all of them to settling keys
//! whose waiters or timers Redis moved behind the module's back (`settle`).

use redis_module::{Context, ContextFlags};

use crate::keys::LockKey;
use crate::sys::events::{EventHandler, ServerEvent};
use crate::sys::scan::for_each_key_of;
use crate::value::LOCK_TYPE;
use crate::{bound, eviction, moving, settle, stats, waiters};

/// The module's [`EventHandler`].
pub struct Events;

impl EventHandler for Events {
    fn on_server_event(ctx: &Context, event: ServerEvent) {
        match event {
            // Values of the flushed databases were freed without unlink: their waiters must
            // be served again.
            // Freed values' addresses may be reused: what was serialized is forgotten.
            ServerEvent::Flushed { db } => {
                moving::forget_serialized();
                settle::on_flush(db);
            }
            // Whole databases changed index under the waiters and timers: every lock key now
            // in either database is settled (its timer re-armed where the key now is), and so
            // is every key that waiters were queued on.
            ServerEvent::SwappedDbs { first, second } => {
                settle::on_swapdb(first, second);
                for_each_key_of(ctx, &LOCK_TYPE, &[first, second], settle::mark_dirty);
            }
            // Loaded keys get their timers and expiry once loading is done; tokens continue
            // above the clock's floor, whatever the loaded file missed.
            // A master that loaded bound holds has none of their connections: they end.
            // A load that refused a value (an AOF, which goes on past a failed command) stops
            // the server here.
            ServerEvent::LoadingEnded => {
                stats::stop_if_load_refused();
                moving::forget_serialized();
                stats::raise_fences_to_clock("after loading");
                if ctx.get_flags().contains(ContextFlags::MASTER) {
                    orphan_bound_holds(ctx);
                }
                settle::schedule();
            }
            // Its waits end in `blocking`; its bound holds when their keys are settled.
            ServerEvent::ClientClosing { client_id } => {
                waiters::note_closing(client_id);
                crate::users::forget_connection(client_id);
                settle::mark_closed(bound::on_closing(client_id));
            }
            // A replica arms no timers: a promoted one needs them for every lock key now. Its
            // tokens jump above the clock's floor, so they are above anything the previous
            // master issued, replicated to this server or not.
            // Bound holds replicated from the old master end: their connections were there.
            ServerEvent::BecameMaster => {
                stats::raise_fences_to_clock("on promotion");
                orphan_bound_holds(ctx);
                for_each_key_of(ctx, &LOCK_TYPE, &[], settle::mark_dirty);
                // A replica that ignored maxmemory now applies it.
                eviction::recheck(ctx);
            }
            ServerEvent::LoadingFailed => stats::forget_refused_load(),
            ServerEvent::BecameReplica => eviction::recheck(ctx),
            ServerEvent::ConfigChanged { memory: true } => eviction::recheck(ctx),
            ServerEvent::ConfigChanged { memory: false } => {}
            // Valkey 9's atomic slot migration: the keys of exported slots that the server
            // deletes next moved, they were not lost (`moving`, `settle`).
            ServerEvent::SlotsExported { ranges } => moving::note_slots_exported(&ranges),
            ServerEvent::SlotsImportStarted { ranges } => moving::note_slots_importing(&ranges),
        }
    }

    /// A lock value that arrives under a new name (RENAME, MOVE, COPY, RESTORE) needs its
    /// timer re-armed there. An evicted lock key is counted, then notified and its waiters
    /// served when it is settled.
    fn on_keyspace_event(_ctx: &Context, db: i32, event: &[u8], key: &[u8]) {
        if eviction::on_notification(db, event, key)
            || matches!(event, b"rename_to" | b"move_to" | b"copy_to" | b"restore")
        {
            settle::mark_dirty(db, key);
        }
    }
}

/// Notes the connection of every bound hold in the keyspace as gone and marks its key for
/// settling (after a restart or a promotion: see `bound`).
fn orphan_bound_holds(ctx: &Context) {
    // The scan calls back with each key's database selected.
    for_each_key_of(ctx, &LOCK_TYPE, &[], |db, key| {
        let mut lock_key = LockKey::open_read(ctx, key);
        let Ok(Some(value)) = lock_key.existing() else {
            return;
        };
        let conns = bound::connections(&value.view());
        if !conns.is_empty() {
            bound::mark_gone(conns);
            settle::mark_dirty(db, key);
        }
    });
}
