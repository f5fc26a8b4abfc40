//! Connection-bound holds (BIND): a hold that ends when its connection closes.
//!
//! The lock core ends them ([`Lock::end_bound`]); this file keeps track of which connections
//! are gone and where their holds are. Redis announces a closing connection in an event
//! callback, where keys may not be changed, so the connection is only noted as gone here and
//! its keys are handed to `settle` (`events`), which ends its holds from the next turn of the
//! event loop on, a bounded slice of keys per turn, or earlier when a lock command touches one
//! of those keys. Waiters are then served as after a release.
//!
//! To find those keys without a scan, every commit that leaves a bound hold records its key
//! under the connection ([`index`]), and every commit that ends one takes it out again
//! ([`forget_ended`]); so does a lock value leaving its key (`settle::on_unlink`). The record is
//! still only a hint: a key flushed or renamed since is checked and found without the hold; a
//! renamed key is recorded again when it is settled under its new name. A connection's record
//! goes when the connection closes.
//!
//! A bound hold never outlives its connection, and a server that restarts or is promoted has
//! none of the connections its bound holds name: at the end of loading (on a master) and on
//! promotion, every bound hold's connection is noted as gone ([`mark_gone`]).

use std::collections::BTreeSet;

use redis_lock_core::{Lock, Step};

use crate::state::{with_bound, with_gone, DbKey};

/// Records that connection `conn` holds a bound hold on (`db`, `key`).
pub fn index(conn: u64, db: i32, key: &[u8]) {
    with_bound(|b| b.entry(conn).or_default().insert((db, key.into())));
}

/// Bound holds of connections `conns` ended on (`db`, `key`): forgets the key for each of them
/// that holds nothing else bound there, so a long-lived connection that binds many keys in turn
/// does not grow the index.
pub fn forget_ended(conns: &[u64], db: i32, key: &[u8], lock: &Lock) {
    let still = connections(lock);
    for conn in conns {
        if !still.contains(conn) {
            forget(*conn, db, key);
        }
    }
}

/// Connection `conn` holds nothing bound on (`db`, `key`) any more.
pub fn forget(conn: u64, db: i32, key: &[u8]) {
    with_bound(|b| {
        if let Some(keys) = b.get_mut(&conn) {
            keys.remove(&(db, Box::<[u8]>::from(key)));
            if keys.is_empty() {
                b.remove(&conn);
            }
        }
    });
}

/// The connections that bound holds on `lock` belong to.
pub fn connections(lock: &Lock) -> Vec<u64> {
    lock.holders()
        .iter()
        .filter(|(_, h)| !h.options.is_none())
        .filter_map(|(_, h)| h.options.get().bound_to)
        .collect()
}

/// Connection `client_id` is closing: notes it as gone and returns the keys where it may hold
/// something (to be settled), as the index kept them: no per-key work here, however many.
pub fn on_closing(client_id: u64) -> BTreeSet<DbKey> {
    let Some(keys) = with_bound(|b| b.remove(&client_id)) else {
        return BTreeSet::new();
    };
    with_gone(|g| g.insert(client_id));
    keys
}

/// Notes connections as gone (their holds end when their keys are settled).
pub fn mark_gone(conns: impl IntoIterator<Item = u64>) {
    with_gone(|g| g.extend(conns));
}

/// Ends, on `lock`, the bound holds of every connection noted as gone.
pub fn end_gone(lock: &mut Lock, step: &mut Step<'_>) {
    with_gone(|gone| {
        if !gone.is_empty() {
            lock.end_bound(|conn| gone.contains(&conn), step);
        }
    });
}

/// A settle pass is over: every key of a gone connection has been settled.
pub fn forget_gone() {
    with_gone(|g| g.clear());
}
