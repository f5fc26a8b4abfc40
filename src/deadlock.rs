//! Deadlock detection, the Redis side: a lock request with WAIT that would have to wait is
//! refused when waiting would close a cycle (SPEC.md, "Deadlock detection"). The graph and the
//! search are in the core (`redis_lock_core::closes_cycle`); this file finds, for an owner, the
//! requests it has queued on every key of every database (the waiter registry's by-owner
//! index) and reads who they wait for from those keys.
//!
//! It runs only for a request that cannot be granted at once and would queue: a request that
//! is granted, refused without WAIT, or made inside MULTI or a script costs nothing more.
//! Semaphore requests are left out, as SPEC.md says.
//!
//! Cost of one check: each owner reachable from the request's blockers is visited once; each
//! key where a visited owner waits is read once per check (`WaitView`, built in one pass over
//! that key's holders and queue), so a check costs about the size of the keys it reaches, not
//! their square.

use std::collections::HashMap;

use redis_lock_core::{closes_cycle, Blocker, WaitView};
use redis_module::Context;

use crate::keys::LockKey;
use crate::sys::context;
use crate::waiters;

/// Would a request of `requester` that waits for `first` (its blockers on its own key) close a
/// cycle? Reads other keys, possibly in other databases; the selected database is restored.
pub fn closes_cycle_here(ctx: &Context, requester: &[u8], first: Vec<Blocker>) -> bool {
    if first.is_empty() {
        return false;
    }
    let original_db = context::selected_db(ctx);
    let mut views: HashMap<(i32, Box<[u8]>), Option<WaitView>> = HashMap::new();
    let found = closes_cycle(requester, first, |owner| {
        let mut out = Vec::new();
        for (id, db, key) in waiters::queued_of(owner) {
            let view = views.entry((db, key)).or_insert_with_key(|(db, key)| {
                if !context::select_db(ctx, *db) {
                    return None;
                }
                let mut lock_key = LockKey::open_read(ctx, key);
                match lock_key.existing() {
                    Ok(Some(value)) => Some(value.view().wait_view()),
                    _ => None,
                }
            });
            if let Some(view) = view {
                out.extend_from_slice(view.blockers_of(id));
            }
        }
        out
    });
    context::select_db(ctx, original_db);
    found
}
