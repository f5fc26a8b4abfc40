//! Which owners hold a key that someone waits for: the filter that lets deadlock detection
//! (`deadlock`) skip almost every check. A cycle needs someone waiting for a key the requester
//! holds, so a requester that holds no key with waiters cannot close one, and its request is
//! queued without walking the graph.
//!
//! `LockKey::commit` updates a key's entries whenever the key has or had waiters, so an
//! uncontended lock never touches this index: all its holders when waiters arrive, only the
//! owners a change touched while they stay, nothing once they are gone (so many readers
//! beside a waiting writer cost one entry each, once); a value leaving its key drops them
//! (`settle::on_unlink`). Entries can only be left behind (FLUSHALL frees values without
//! telling anyone, SWAPDB moves them), never missing: a key gets waiters, and holders beside
//! waiters, only through a commit. A stale entry costs one unneeded check, never a wrong
//! answer.
//!
//! Beside the owners it keeps each such key's fence, for LOCK.INFO to show while the key
//! cannot be read (a TTL that passed during a client pause).

use redis_lock_core::{Listing, Lock};

use crate::state::{with_contended, DbKey};

/// Brings the entries of (`db`, `key`) up to date after a change that touched the owners in
/// `changed`; `had_waiters`: whether the key had waiters before the change.
pub fn update(db: i32, key: &[u8], lock: &Lock, had_waiters: bool, changed: &[Box<[u8]>]) {
    let has_waiters = !lock.queue().is_empty();
    match (had_waiters, has_waiters) {
        (_, false) => forget(db, key),
        (false, true) => {
            forget(db, key);
            for (owner, _) in lock.holders().iter() {
                add(db, key, owner);
            }
        }
        (true, true) => {
            for owner in changed {
                if lock.holders().get(owner).is_some() {
                    add(db, key, owner);
                } else {
                    remove(db, key, owner);
                }
            }
        }
    }
    if has_waiters {
        note_fence(db, key, lock.fence());
    }
}

fn add(db: i32, key: &[u8], owner: &[u8]) {
    with_contended(|c| {
        let place: DbKey = (db, key.into());
        if c.by_owner
            .entry(owner.into())
            .or_default()
            .insert(place.clone())
        {
            c.by_key.entry(place).or_default().insert(owner.into());
        }
    });
}

fn remove(db: i32, key: &[u8], owner: &[u8]) {
    with_contended(|c| {
        let place: DbKey = (db, key.into());
        if let Some(keys) = c.by_owner.get_mut(owner) {
            keys.remove(&place);
            if keys.is_empty() {
                c.by_owner.remove(owner);
            }
        }
        if let Some(owners) = c.by_key.get_mut(&place) {
            owners.remove(owner);
            if owners.is_empty() {
                c.by_key.remove(&place);
            }
        }
    });
}

fn note_fence(db: i32, key: &[u8], fence: u64) {
    with_contended(|c| {
        let of_db = c.fences.entry(db).or_default();
        // Called on every commit of a key with waiters: the key is copied only the first time.
        match of_db.get_mut(key) {
            Some(known) => *known = fence,
            None => {
                of_db.insert(key.into(), fence);
            }
        }
    });
}

/// The fence of (`db`, `key`) as of its last change while it had waiters.
pub fn fence_of(db: i32, key: &[u8]) -> Option<u64> {
    with_contended(|c| c.fences.get(&db).and_then(|f| f.get(key)).copied())
}

/// (`db`, `key`) has no waiters any more, or is gone.
pub fn forget(db: i32, key: &[u8]) {
    with_contended(|c| {
        if let Some(of_db) = c.fences.get_mut(&db) {
            if of_db.remove(key).is_some() && of_db.is_empty() {
                c.fences.remove(&db);
            }
        }
        let place: DbKey = (db, key.into());
        let Some(owners) = c.by_key.remove(&place) else {
            return;
        };
        for owner in owners {
            if let Some(keys) = c.by_owner.get_mut(&owner) {
                keys.remove(&place);
                if keys.is_empty() {
                    c.by_owner.remove(&owner);
                }
            }
        }
    });
}

/// Does `owner` hold some key that has waiters (as far as the index knows)?
pub fn holds_contended(owner: &[u8]) -> bool {
    with_contended(|c| c.by_owner.contains_key(owner))
}

/// The keys with waiters that `owner` holds (as far as the index knows: a key listed may
/// since hold nothing of it) for which `keep` says yes, among the first `max` the index has;
/// with how many were looked at.
pub fn held_keys(owner: &[u8], max: usize, keep: impl FnMut(&DbKey) -> bool) -> Listing<DbKey> {
    with_contended(|c| match c.by_owner.get(owner) {
        Some(keys) => Listing::walk(keys.iter().cloned(), max, keep),
        None => Listing::walk(Vec::new(), max, keep),
    })
}
