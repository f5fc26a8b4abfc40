//! Which lock keys with waiters each owner holds: the index that deadlock detection
//! (`deadlock`) walks backwards from an owner, and that lets it skip almost every check (a
//! requester that holds no key with waiters cannot close a cycle).
//!
//! # What is indexed, and why no event costs O(holders)
//!
//! Only lock keys that have someone queued (*waited* keys; semaphores never: permit waits are
//! not part of detection). A key nobody waits for costs the index nothing, however it is held:
//! an uncontended lock, or a shared one with 100,000 readers, never touches it. A waited key is
//! filed one of two ways, by its number of holders:
//! - *narrow* (at most [`SMALL`] holders): each holder is filed under its owner (`by_owner`),
//!   and the key keeps the list of what it filed (`narrow`), at most [`SMALL`] entries;
//! - *wide* (more): filed once under each distinct user of its holders (`wide_by_user`; the
//!   lock keeps its users' list, see `HolderSet::users`), never per holder. ACL users are made
//!   by the operator, so they are few.
//!
//! Every commit of a waited key (or one that was) brings its filing up to date from the lock
//! as it is, against the list the key kept: O([`SMALL`]) for a narrow key, O(users) for a wide
//! one, nothing for any other key. So the first waiter behind 100,000 readers, its timeout and
//! the queue emptying each cost O(users), and a key growing past or shrinking to [`SMALL`]
//! holders while waited costs O([`SMALL`]) plus the owners the commit changed.
//!
//! # Owners are (user, name)
//!
//! Deadlock detection tells owners apart by the ACL user that made the hold and the owner name
//! (`redis_lock_core::Who`, docs/commands.md, "Deadlock detection"): entries are filed by both, so holds
//! that another user made under the same name are never listed for this user's owner, and
//! cost its walk nothing. A hold whose user is not known (`UNKNOWN_USER`: loaded from an RDB
//! file or the AOF, restored, received from a master, or made in a script) is filed under no
//! one: it is on nobody's walk. Detection then never refuses because of it (it can only miss a
//! cycle through it, which ends by the WAIT timeout or the hold's TTL): the safe side, since
//! whose it was cannot be known.
//!
//! # Answering
//!
//! "Does owner O of user U hold a key someone waits for" looks at O's narrow entries (asking
//! the waiter registry whether each still has a queue) and at U's wide keys (one hashed holder
//! lookup each), each within a limit: past it the answer is "maybe", and the budgeted walk
//! decides ([`holds_contended`]). The walk's listing ([`held_keys`]) charges every entry it
//! looks at, narrow or wide, to the check's budget, so a user with many wide waited keys can
//! make its own checks run out of budget (counted as cut), never answer wrongly, and never
//! another user's.
//!
//! Entries can only be left behind (FLUSHALL frees values without telling anyone, SWAPDB
//! moves them), never missing for a waited key: a key gets its first waiter only through a
//! commit. A stale entry costs one unneeded look, never a wrong answer. A value leaving its
//! key drops its entries (`settle::on_unlink`).
//!
//! Beside the owners it keeps each waited key's fence, for LOCK.INFO to show while the key
//! cannot be read (a TTL that passed during a client pause).

use std::cell::Cell;
use std::collections::BTreeSet;

use redis_lock_core::{Kind, Listing, Lock, UserId, Who, UNKNOWN_USER};

use crate::state::{who_key, with_contended, Contended, DbKey, Held};
use crate::stats::Gauges;

/// The most holders of a waited key that are filed one by one (narrow); a key with more is
/// filed once per user (wide).
pub const SMALL: usize = 8;

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

/// Could a lock with these figures be filed (does it have waiters)? Only such keys, before or
/// after a change, need [`update`]: the test every commit makes, and all that a key nobody
/// waits for costs.
pub fn is_waited(g: &Gauges) -> bool {
    g.waiters > 0
}

/// How a key stands in the index.
enum Standing {
    /// Not filed: nobody waits, or a semaphore.
    Plain,
    Narrow,
    Wide,
}

fn standing(lock: &Lock) -> Standing {
    if lock.queue().is_empty() || matches!(lock.kind(), Kind::Semaphore(_)) {
        Standing::Plain
    } else if lock.holders().len() <= SMALL {
        Standing::Narrow
    } else {
        Standing::Wide
    }
}

/// Brings the filing of (`db`, `key`) up to date after a change; `before` and `after`: the
/// lock's figures before and after it (see [`is_waited`]).
pub fn update(db: i32, key: &[u8], lock: &Lock, before: &Gauges, after: &Gauges) {
    if after.waiters > 0 {
        note_fence(db, key, lock.fence());
    } else if before.waiters > 0 {
        forget_fence(db, key);
    }
    let place: DbKey = (db, key.into());
    // What the key should be filed under now: at most SMALL owners, or its users.
    let (owners, users): (Vec<Box<[u8]>>, Vec<UserId>) = match standing(lock) {
        Standing::Plain => (Vec::new(), Vec::new()),
        Standing::Narrow => (
            lock.holders()
                .iter()
                .filter(|(_, h)| h.user != UNKNOWN_USER)
                .map(|(owner, h)| who_key(Who::new(h.user, owner)))
                .collect(),
            Vec::new(),
        ),
        Standing::Wide => (
            Vec::new(),
            lock.holders()
                .users()
                .filter(|u| *u != UNKNOWN_USER)
                .collect(),
        ),
    };
    with_contended(|c| {
        refile_narrow(c, &place, owners);
        refile_wide(c, &place, users);
    });
}

/// Files `place` under exactly `owners` (none: not narrow), from what it was filed under.
fn refile_narrow(c: &mut Contended, place: &DbKey, owners: Vec<Box<[u8]>>) {
    let old = c.narrow.remove(place).unwrap_or_default();
    for gone in old.iter().filter(|o| !owners.contains(o)) {
        remove(c, place, gone);
    }
    for new in owners.iter().filter(|o| !old.contains(o)) {
        add(c, place, new);
    }
    if !owners.is_empty() {
        c.narrow.insert(place.clone(), owners);
    }
}

/// Files `place` under exactly `users` (none: not wide), from what it was filed under.
fn refile_wide(c: &mut Contended, place: &DbKey, users: Vec<UserId>) {
    let old = c.wide.remove(place).unwrap_or_default();
    for gone in old.iter().filter(|u| !users.contains(u)) {
        if let Some(keys) = c.wide_by_user.get_mut(gone) {
            if keys.remove(place) {
                count_write();
            }
            if keys.is_empty() {
                c.wide_by_user.remove(gone);
            }
        }
    }
    for new in users.iter().filter(|u| !old.contains(u)) {
        if c.wide_by_user
            .entry(*new)
            .or_default()
            .insert(place.clone())
        {
            count_write();
        }
    }
    if !users.is_empty() {
        c.wide.insert(place.clone(), users);
    }
}

fn add(c: &mut Contended, place: &DbKey, owner: &[u8]) {
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
}

fn remove(c: &mut Contended, place: &DbKey, owner: &[u8]) {
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

/// (`db`, `key`) is gone: drops its entries (what it kept: at most [`SMALL`] owners, or its
/// users).
pub fn forget(db: i32, key: &[u8]) {
    forget_fence(db, key);
    let place: DbKey = (db, key.into());
    with_contended(|c| {
        refile_narrow(c, &place, Vec::new());
        refile_wide(c, &place, Vec::new());
    });
}

/// How many of an owner's narrow entries, and of its user's wide keys, [`holds_contended`]
/// looks at before it stops and answers "maybe" (the deadlock walk then decides, within its
/// own budget).
const CONTENDED_LOOKS: usize = 64;
const WIDE_LOOKS: usize = 16;

/// Does `owner` hold some key that has waiters (as far as the index knows)? Looks at no more
/// than [`CONTENDED_LOOKS`] of its narrow entries, asking `has_waiters` of each, and no more
/// than [`WIDE_LOOKS`] of its user's wide keys, asking `holds_at` of each (does the owner
/// hold it); an owner with more is answered yes (the caller's walk is bounded by its budget).
pub fn holds_contended(
    owner: Who<'_>,
    mut has_waiters: impl FnMut(&DbKey) -> bool,
    mut holds_at: impl FnMut(&DbKey) -> bool,
) -> bool {
    if owner.user == UNKNOWN_USER {
        return false;
    }
    let k = who_key(owner);
    let (narrow, wide): (Vec<DbKey>, Vec<DbKey>) = with_contended(|c| {
        let narrow = match c.by_owner.get(&k) {
            None => Vec::new(),
            Some(Held::One(k)) => vec![k.clone()],
            Some(Held::Many(set)) => set.iter().take(CONTENDED_LOOKS + 1).cloned().collect(),
        };
        let wide = c
            .wide_by_user
            .get(&owner.user)
            .map_or_else(Vec::new, |set| {
                set.iter().take(WIDE_LOOKS + 1).cloned().collect()
            });
        (narrow, wide)
    });
    // The borrow of the index has ended: the callbacks may open keys.
    narrow.len() > CONTENDED_LOOKS
        || wide.len() > WIDE_LOOKS
        || narrow.iter().any(&mut has_waiters)
        || wide.iter().any(&mut holds_at)
}

/// Where an index entry came from: it says what to ask of the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filed {
    /// The owner's own entry for a narrow key (it held the key when last filed).
    Narrow,
    /// A wide key of the owner's user: the owner may hold it or not.
    Wide,
}

/// The keys `owner` may hold that may have waiters, among the first `max` entries of the
/// index (its narrow entries, then its user's wide keys), each with where it came from; the
/// caller filters them (a key listed may since hold nothing of it, or have nobody queued).
pub fn held_keys(owner: Who<'_>, max: usize) -> Vec<(DbKey, Filed)> {
    if owner.user == UNKNOWN_USER {
        return Vec::new();
    }
    let k = who_key(owner);
    with_contended(|c| {
        let narrow: Box<dyn Iterator<Item = &DbKey>> = match c.by_owner.get(&k) {
            None => Box::new(std::iter::empty()),
            Some(Held::One(k)) => Box::new(std::iter::once(k)),
            Some(Held::Many(set)) => Box::new(set.iter()),
        };
        let wide = c.wide_by_user.get(&owner.user).into_iter().flatten();
        narrow
            .map(|k| (k.clone(), Filed::Narrow))
            .chain(wide.map(|k| (k.clone(), Filed::Wide)))
            .take(max)
            .collect()
    })
}

/// Walks `entries` (from [`held_keys`]) keeping what `keep` says, as a listing of the walk.
pub fn listing(
    entries: Vec<(DbKey, Filed)>,
    keep: impl FnMut(&(DbKey, Filed)) -> bool,
) -> Listing<DbKey> {
    let walked = Listing::walk(entries, usize::MAX, keep);
    Listing {
        items: walked.items.into_iter().map(|(k, _)| k).collect(),
        walked: walked.walked,
    }
}
