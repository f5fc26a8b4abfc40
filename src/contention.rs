//! Which lock keys each owner holds where a wait-for edge can start: the index that deadlock
//! detection (`deadlock`) walks backwards from an owner, and that lets it skip almost every
//! check (a requester that holds no key with waiters cannot close a cycle).
//!
//! # What is indexed, and why no event costs O(holders)
//!
//! A hold is indexed (owner -> its keys; per key only a mark that its holders are in, since
//! the lock's own holder list says which entries to drop) while its key is *shared or waited*: a lock (not a semaphore) with two or more holders, or with someone queued. The
//! entries are kept up to date from each commit's changed owners (`LockKey::commit`), so each
//! hold change costs O(1) entries and nothing costs O(holders):
//! - readers joining a key that already has readers: each adds its own entry at its grant;
//! - the first waiter on a key with N readers: nothing to add (they are indexed already); on a
//!   key with one holder, that one holder is added;
//! - the queue emptying (timeout, disconnect, grant): nothing to remove while the key stays
//!   shared; a key going back to one holder and no waiter drops its last entry;
//! - a key turning shared or waited from *plain* (at most one holder, nobody queued): its
//!   holders are that one holder plus the owners this commit granted, all of them changes.
//!
//! An uncontended exclusive lock (the common case) never touches the index, and neither does a
//! semaphore: permit waits are not part of deadlock detection, so permit holders start no edge.
//!
//! "Holds a key someone waits for" is then answered by looking at the owner's indexed keys and
//! asking the waiter registry whether each has a queue, within a limit ([`holds_contended`]);
//! the deadlock walk charges every key it looks at to its budget (`held_keys`), so an owner
//! that reads many shared keys nobody waits for can make a check run out of budget (counted as
//! cut), never answer wrongly.
//!
//! A value that no commit has indexed (loaded from an RDB file or the AOF, restored, received
//! from a master) is indexed at its first commit: once per loaded key. Entries can only be left
//! behind (FLUSHALL frees values without telling anyone, SWAPDB moves them), never missing for
//! a key a commit has seen: a stale entry costs one unneeded look, never a wrong answer. A
//! value leaving its key drops its entries (`settle::on_unlink`).
//!
//! Beside the owners it keeps each waited key's fence, for LOCK.INFO to show while the key
//! cannot be read (a TTL that passed during a client pause).

use std::cell::Cell;

use redis_lock_core::{Listing, Lock, Mode};

use std::collections::BTreeSet;

use crate::state::{with_contended, DbKey, Held};
use crate::stats::Gauges;

thread_local! {
    /// Index entries added or removed since the server started: the work the index did, which
    /// the test hooks report (`LOCK.DEBUG-INDEX`).
    static ENTRY_WRITES: Cell<u64> = const { Cell::new(0) };
}

/// How many index entries have been added or removed since the module loaded.
#[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
pub fn entry_writes() -> u64 {
    ENTRY_WRITES.with(|c| c.get())
}

fn count_write() {
    ENTRY_WRITES.with(|c| c.set(c.get().saturating_add(1)));
}

/// Is a lock with these figures one whose holds are indexed (shared by two or more lock
/// holders, or with someone queued)? Semaphore permits never are.
pub fn is_indexed(g: &Gauges) -> bool {
    g.waiters > 0 || g.readers.saturating_add(g.writers) >= 2
}

/// Brings the entries of (`db`, `key`) up to date after a change that touched the owners in
/// `changed`; `before` and `after`: the lock's figures before and after the change.
pub fn update(
    db: i32,
    key: &[u8],
    lock: &Lock,
    before: &Gauges,
    after: &Gauges,
    changed: &[Box<[u8]>],
) {
    let was = is_indexed(before);
    let is = is_indexed(after);
    if !was && !is {
        return;
    }
    if after.waiters > 0 {
        note_fence(db, key, lock.fence());
    } else if before.waiters > 0 {
        forget_fence(db, key);
    }
    let place: DbKey = (db, key.into());
    let semaphore = lock.holders().mode() == Some(Mode::Permit);
    if !is || semaphore {
        // Back to plain: at most one holder is left, the others this commit changed.
        forget_entries(&place, lock, changed);
        return;
    }
    let known = with_contended(|c| c.indexed.contains(&place));
    if !was || !known {
        // From plain (at most one holder before this commit, so the holders now are that one
        // and the owners this commit changed), or a value no commit indexed yet (loaded).
        for (owner, _) in lock.holders().iter() {
            add(&place, owner);
        }
        for owner in changed {
            if lock.holders().get(owner).is_none() {
                remove(&place, owner);
            }
        }
        with_contended(|c| c.indexed.insert(place));
        return;
    }
    for owner in changed {
        if lock.holders().get(owner).is_some() {
            add(&place, owner);
        } else {
            remove(&place, owner);
        }
    }
}

fn add(place: &DbKey, owner: &[u8]) {
    with_contended(|c| {
        let added = match c.by_owner.get_mut(owner) {
            None => {
                c.by_owner.insert(owner.into(), Held::One(place.clone()));
                true
            }
            Some(Held::One(k)) if k == place => false,
            Some(held @ Held::One(_)) => {
                let Held::One(first) = std::mem::replace(held, Held::Many(BTreeSet::new())) else {
                    return;
                };
                if let Held::Many(set) = held {
                    set.insert(first);
                    set.insert(place.clone());
                }
                true
            }
            Some(Held::Many(set)) => set.insert(place.clone()),
        };
        if added {
            count_write();
        }
    });
}

fn remove(place: &DbKey, owner: &[u8]) {
    with_contended(|c| {
        let (removed, now_empty) = match c.by_owner.get_mut(owner) {
            None => (false, false),
            Some(Held::One(k)) => (k == place, k == place),
            Some(Held::Many(set)) => (set.remove(place), set.is_empty()),
        };
        if now_empty {
            c.by_owner.remove(owner);
        }
        if removed {
            count_write();
        }
    });
}

/// Drops the entries of `place`: those of the lock's holders and of the owners in `changed`
/// (which may have just left it).
fn forget_entries(place: &DbKey, lock: &Lock, changed: &[Box<[u8]>]) {
    if !with_contended(|c| c.indexed.remove(place)) {
        return;
    }
    for (owner, _) in lock.holders().iter() {
        remove(place, owner);
    }
    for owner in changed {
        remove(place, owner);
    }
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

fn forget_fence(db: i32, key: &[u8]) {
    with_contended(|c| {
        if let Some(of_db) = c.fences.get_mut(&db) {
            if of_db.remove(key).is_some() && of_db.is_empty() {
                c.fences.remove(&db);
            }
        }
    });
}

/// The fence of (`db`, `key`) as of its last change while it had waiters.
pub fn fence_of(db: i32, key: &[u8]) -> Option<u64> {
    with_contended(|c| c.fences.get(&db).and_then(|f| f.get(key)).copied())
}

/// (`db`, `key`), whose lock is `lock`, is gone: drops its entries (one per holder: the
/// removal of a value, which costs that much anyway).
pub fn forget(db: i32, key: &[u8], lock: &Lock) {
    forget_fence(db, key);
    forget_entries(&(db, key.into()), lock, &[]);
}

/// How many of an owner's indexed keys [`holds_contended`] looks at before it stops and
/// answers "maybe" (the deadlock walk then decides, within its own budget).
const CONTENDED_LOOKS: usize = 64;

/// Does `owner` hold some key that has waiters (as far as the index knows)? Looks at no more
/// than [`CONTENDED_LOOKS`] of its indexed keys, asking `has_waiters` of each; an owner with
/// more is answered yes (the caller's walk is bounded by its budget).
pub fn holds_contended(owner: &[u8], mut has_waiters: impl FnMut(&DbKey) -> bool) -> bool {
    let keys: Option<Vec<DbKey>> = with_contended(|c| {
        c.by_owner.get(owner).map(|held| match held {
            Held::One(k) => vec![k.clone()],
            Held::Many(set) => set.iter().take(CONTENDED_LOOKS + 1).cloned().collect(),
        })
    });
    let Some(keys) = keys else {
        return false;
    };
    keys.len() > CONTENDED_LOOKS || keys.iter().any(&mut has_waiters)
}

/// The keys `owner` holds that may have waiters (as far as the index knows: a key listed may
/// since hold nothing of it, or have nobody queued) for which `keep` says yes, among the first
/// `max` the index has; with how many were looked at.
pub fn held_keys(owner: &[u8], max: usize, keep: impl FnMut(&DbKey) -> bool) -> Listing<DbKey> {
    with_contended(|c| match c.by_owner.get(owner) {
        Some(Held::One(k)) => Listing::walk(std::iter::once(k.clone()), max, keep),
        Some(Held::Many(keys)) => Listing::walk(keys.iter().cloned(), max, keep),
        None => Listing::walk(Vec::new(), max, keep),
    })
}
