//! The holders of a lock held by two or more owners (readers, semaphore permits), indexed by
//! owner and by expiry with each owner stored once.
//!
//! The holders live in one vector (a slab; a removal moves the last entry into the gap). Two
//! indexes point into it by position: a hash table from the owner's hash to the first entry
//! with that hash (entries with the same hash are chained through `next`), and an ordered set
//! of (expiry, position). So finding an owner, adding, removing and changing an expiry are
//! O(1) or O(log n) as with a map keyed by owner beside a set keyed by expiry, but the owner's
//! bytes are kept once and each index entry is 16 bytes, not a second copy of the owner: with
//! 10,000 readers that is about a third less memory per reader. A set of at most 16 holders
//! keeps no indexes at all and scans its slab (see [`SMALL`]).

use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use super::{Holder, Millis, UserId};

/// No next entry in a hash chain.
const END: usize = usize::MAX;

/// Up to this many holders the indexes are not kept: a scan of so few entries costs less than
/// the indexes do, and their tables (a few hundred bytes) would weigh on every reader of a
/// lightly shared lock. Past it they are built; they are dropped again at half of it.
const SMALL: usize = 16;

#[derive(Clone, Debug)]
struct Entry {
    owner: Box<[u8]>,
    holder: Holder,
    /// The next entry whose owner has the same hash, or [`END`].
    next: usize,
}

/// The hash table's keys are already SipHash outputs (keyed per set, see `Indexed::hasher`):
/// hashing them again would only cost time.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed (`write_u64`); fold anything else in anyway.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Indexed {
    entries: Vec<Entry>,
    /// Owner hash → position of the first entry of that hash.
    heads: HashMap<u64, usize, BuildHasherDefault<PassThrough>>,
    /// (expiry, position) of every entry.
    by_expiry: BTreeSet<(Millis, usize)>,
    /// Random keys per set, so nobody can choose owners that collide.
    hasher: RandomState,
    /// The sum of the holders' counts (a semaphore's permits held), kept so it is read in O(1).
    total: u64,
    /// The distinct users of the holders, with how many holders each has: what deadlock
    /// detection files a key with many holders under (one entry per user, not per holder).
    /// ACL users are few (the operator makes them), so this is a short list.
    users: Vec<(UserId, u32)>,
    /// Whether `heads` and `by_expiry` are kept (more than [`SMALL`] holders); both are empty
    /// otherwise.
    indexed: bool,
    /// Tests only: every owner hashes alike, so all entries share one chain.
    #[cfg(test)]
    collide: bool,
}

impl Indexed {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    fn hash(&self, owner: &[u8]) -> u64 {
        #[cfg(test)]
        if self.collide {
            return 7;
        }
        self.hasher.hash_one(owner)
    }

    fn position(&self, owner: &[u8]) -> Option<usize> {
        if !self.indexed {
            return self.entries.iter().position(|e| *e.owner == *owner);
        }
        let mut at = *self.heads.get(&self.hash(owner))?;
        // A chain is never longer than the slab; the bound only guards against a broken one.
        for _ in 0..self.entries.len() {
            let entry = self.entries.get(at)?;
            if *entry.owner == *owner {
                return Some(at);
            }
            at = entry.next;
        }
        None
    }

    pub(crate) fn get(&self, owner: &[u8]) -> Option<&Holder> {
        let at = self.position(owner)?;
        self.entries.get(at).map(|e| &e.holder)
    }

    /// Some holder (the first in the slab).
    pub(crate) fn first(&self) -> Option<&Holder> {
        self.entries.first().map(|e| &e.holder)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &Holder)> {
        self.entries.iter().map(|e| (&*e.owner, &e.holder))
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// The distinct users of the holders (see [`Holder::user`]).
    pub(crate) fn users(&self) -> impl Iterator<Item = UserId> + '_ {
        self.users.iter().map(|(u, _)| *u)
    }

    fn count_user(&mut self, user: UserId) {
        match self.users.iter_mut().find(|(u, _)| *u == user) {
            Some((_, n)) => *n = n.saturating_add(1),
            None => self.users.push((user, 1)),
        }
    }

    fn uncount_user(&mut self, user: UserId) {
        if let Some(at) = self.users.iter().position(|(u, _)| *u == user) {
            if let Some((_, n)) = self.users.get_mut(at) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.users.swap_remove(at);
                }
            }
        }
    }

    pub(crate) fn earliest_expiry(&self) -> Option<Millis> {
        self.earliest().map(|(t, _)| t)
    }

    pub(crate) fn latest_expiry(&self) -> Option<Millis> {
        if !self.indexed {
            return self.entries.iter().map(|e| e.holder.expires_at).max();
        }
        self.by_expiry.last().map(|(t, _)| *t)
    }

    /// How many entries are due at `now` (expiry at or before it): O(due) through the expiry
    /// index, whatever the number of entries.
    pub(crate) fn count_due(&self, now: Millis) -> usize {
        if !self.indexed {
            return self
                .entries
                .iter()
                .filter(|e| e.holder.expires_at <= now)
                .count();
        }
        self.by_expiry.range(..=(now, usize::MAX)).count()
    }

    /// The earliest expiry and the position of an entry with it.
    fn earliest(&self) -> Option<(Millis, usize)> {
        if !self.indexed {
            return self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.holder.expires_at)
                .map(|(at, e)| (e.holder.expires_at, at));
        }
        self.by_expiry.first().copied()
    }

    /// Builds the indexes over the entries (the set grew past [`SMALL`]).
    fn build_indexes(&mut self) {
        self.indexed = true;
        for at in 0..self.entries.len() {
            let Some(entry) = self.entries.get(at) else {
                break;
            };
            let (hash, expires_at) = (self.hash(&entry.owner), entry.holder.expires_at);
            let next = self.heads.insert(hash, at).unwrap_or(END);
            self.by_expiry.insert((expires_at, at));
            if let Some(entry) = self.entries.get_mut(at) {
                entry.next = next;
            }
        }
    }

    /// Drops the indexes (the set shrank to half of [`SMALL`]).
    fn drop_indexes(&mut self) {
        self.indexed = false;
        self.heads = HashMap::default();
        self.by_expiry = BTreeSet::new();
        for entry in &mut self.entries {
            entry.next = END;
        }
    }

    /// Adds a holder; the caller has checked that `owner` holds nothing yet.
    pub(crate) fn insert(&mut self, owner: Box<[u8]>, holder: Holder) {
        let at = self.entries.len();
        let next = if self.indexed {
            let hash = self.hash(&owner);
            self.by_expiry.insert((holder.expires_at, at));
            self.heads.insert(hash, at).unwrap_or(END)
        } else {
            END
        };
        self.total = self.total.saturating_add(holder.count);
        self.count_user(holder.user);
        // Grow by a quarter rather than doubling: a large set of readers then leaves at most a
        // fifth of the slab unused instead of half (the allocator's size classes are a quarter
        // apart too). Still amortized O(1) per insert.
        if self.entries.len() == self.entries.capacity() {
            self.entries.reserve_exact((self.entries.len() / 4).max(4));
        }
        self.entries.push(Entry {
            owner,
            holder,
            next,
        });
        if !self.indexed && self.entries.len() > SMALL {
            self.build_indexes();
        }
    }

    pub(crate) fn remove(&mut self, owner: &[u8]) -> Option<(Box<[u8]>, Holder)> {
        let at = self.position(owner)?;
        self.remove_at(at)
    }

    /// Removes the entry with the earliest expiry if it is due at `now`.
    pub(crate) fn pop_expired(&mut self, now: Millis) -> Option<(Box<[u8]>, Holder)> {
        let (due, at) = self.earliest()?;
        if due > now {
            return None;
        }
        self.remove_at(at)
    }

    /// Changes an existing holder's count and expiry.
    pub(crate) fn update(
        &mut self,
        owner: &[u8],
        count: u64,
        expires_at: Millis,
    ) -> Option<&Holder> {
        let at = self.position(owner)?;
        let entry = self.entries.get_mut(at)?;
        if self.indexed && entry.holder.expires_at != expires_at {
            self.by_expiry.remove(&(entry.holder.expires_at, at));
            self.by_expiry.insert((expires_at, at));
        }
        self.total = self
            .total
            .saturating_sub(entry.holder.count)
            .saturating_add(count);
        entry.holder.count = count;
        entry.holder.expires_at = expires_at;
        Some(&entry.holder)
    }

    /// The only holder, taken out, when exactly one is left.
    pub(crate) fn into_only(mut self) -> Option<(Box<[u8]>, Holder)> {
        if self.entries.len() != 1 {
            return None;
        }
        self.entries.pop().map(|e| (e.owner, e.holder))
    }

    /// Points whatever refers to position `from` (its chain predecessor or its hash's head)
    /// at `to` instead.
    fn relink(&mut self, hash: u64, from: usize, to: usize) {
        let Some(head) = self.heads.get_mut(&hash) else {
            return;
        };
        if *head == from {
            *head = to;
            return;
        }
        let mut at = *head;
        for _ in 0..self.entries.len() {
            let Some(entry) = self.entries.get_mut(at) else {
                return;
            };
            if entry.next == from {
                entry.next = to;
                return;
            }
            at = entry.next;
        }
    }

    fn remove_at(&mut self, at: usize) -> Option<(Box<[u8]>, Holder)> {
        let entry = self.entries.get(at)?;
        let last = self.entries.len() - 1;
        if self.indexed {
            let (hash, next, expires_at) =
                (self.hash(&entry.owner), entry.next, entry.holder.expires_at);
            // Out of its hash chain, and out of the expiry index.
            if next == END && self.heads.get(&hash) == Some(&at) {
                self.heads.remove(&hash);
            } else {
                self.relink(hash, at, next);
            }
            self.by_expiry.remove(&(expires_at, at));
            // The last entry moves into the gap: re-point its chain link and expiry entry.
            if at != last {
                if let Some(moved) = self.entries.get(last) {
                    let (moved_hash, moved_expiry) =
                        (self.hash(&moved.owner), moved.holder.expires_at);
                    self.relink(moved_hash, last, at);
                    self.by_expiry.remove(&(moved_expiry, last));
                    self.by_expiry.insert((moved_expiry, at));
                }
            }
        }
        let removed = self.entries.swap_remove(at);
        self.total = self.total.saturating_sub(removed.holder.count);
        self.uncount_user(removed.holder.user);
        if self.indexed && self.entries.len() <= SMALL / 2 {
            self.drop_indexes();
        }
        // Give memory back once a set that grew large has mostly emptied.
        if self.entries.capacity() > 64 && self.entries.len() * 4 < self.entries.capacity() {
            self.entries.shrink_to(self.entries.len() * 2);
            self.heads.shrink_to(self.entries.len() * 2);
        }
        Some((removed.owner, removed.holder))
    }

    /// Bytes of heap used (an estimate: the allocator's rounding and the ordered set's node
    /// slack are not counted).
    pub(crate) fn heap_size(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.entries.iter().map(|e| e.owner.len()).sum::<usize>()
            + self.heads.capacity() * (std::mem::size_of::<(u64, usize)>() + 1)
            + self.by_expiry.len() * std::mem::size_of::<(Millis, usize)>()
            + self.users.capacity() * std::mem::size_of::<(UserId, u32)>()
    }

    /// Checks the indexes against the entries (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) -> Result<(), String> {
        if !self.indexed {
            if !self.heads.is_empty() || !self.by_expiry.is_empty() || self.entries.len() > SMALL {
                return Err("indexes kept for a small set, or a large set without".into());
            }
            let total: u64 = self.entries.iter().map(|e| e.holder.count).sum();
            return if total == self.total {
                Ok(())
            } else {
                Err(format!("total {} of {total}", self.total))
            };
        }
        if self.entries.len() <= SMALL / 2 {
            return Err("indexes kept for a set of half the threshold".into());
        }
        let mut chained = 0;
        for (&hash, &head) in &self.heads {
            let mut at = head;
            while at != END {
                if chained > self.entries.len() {
                    return Err("a chain loops".into());
                }
                let e = self.entries.get(at).ok_or("chain points past the end")?;
                if self.hash(&e.owner) != hash {
                    return Err(format!("entry {at} chained under another hash"));
                }
                chained += 1;
                at = e.next;
            }
        }
        if chained != self.entries.len() {
            return Err(format!("{chained} chained of {}", self.entries.len()));
        }
        let expected: BTreeSet<(Millis, usize)> = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.holder.expires_at, i))
            .collect();
        if expected != self.by_expiry {
            return Err("expiry index differs".into());
        }
        let total: u64 = self.entries.iter().map(|e| e.holder.count).sum();
        if total != self.total {
            return Err(format!("total {} of {total}", self.total));
        }
        Ok(())
    }

    /// The same set with every owner hashed to one value: all entries in one chain (tests of
    /// the chain handling, which random keys almost never exercise).
    #[cfg(test)]
    pub(crate) fn colliding() -> Self {
        Indexed {
            collide: true,
            ..Indexed::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Mode, PackedOptions};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn holder(count: u64, expires_at: Millis) -> Holder {
        Holder {
            user: crate::UNKNOWN_USER,
            mode: Mode::Read,
            capacity: 0,
            count,
            expires_at,
            token: 1,
            granted_at: 0,
            options: PackedOptions::NONE,
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u8, u8),
        Remove(u8),
        Update(u8, u8, u8),
        Pop(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..24, 0u8..16).prop_map(|(o, t)| Op::Insert(o, t)),
            (0u8..24).prop_map(Op::Remove),
            (0u8..24, 1u8..4, 0u8..16).prop_map(|(o, c, t)| Op::Update(o, c, t)),
            (0u8..16).prop_map(Op::Pop),
        ]
    }

    /// Runs `ops` on `set` and on a map keyed by owner, checking they agree after each.
    fn run(mut set: Indexed, ops: &[Op]) -> Result<(), TestCaseError> {
        let mut model: BTreeMap<Vec<u8>, (u64, Millis)> = BTreeMap::new();
        for op in ops {
            match *op {
                Op::Insert(o, t) => {
                    let owner = vec![o; usize::from(o % 5) + 1];
                    if !model.contains_key(&owner) {
                        model.insert(owner.clone(), (1, u64::from(t)));
                        set.insert(owner.into(), holder(1, u64::from(t)));
                    }
                }
                Op::Remove(o) => {
                    let owner = vec![o; usize::from(o % 5) + 1];
                    let got = set
                        .remove(&owner)
                        .map(|(k, h)| (k.to_vec(), h.count, h.expires_at));
                    let want = model.remove(&owner).map(|(c, t)| (owner.clone(), c, t));
                    prop_assert_eq!(got, want);
                }
                Op::Update(o, c, t) => {
                    let owner = vec![o; usize::from(o % 5) + 1];
                    let got = set.update(&owner, u64::from(c), u64::from(t)).is_some();
                    if let Some(v) = model.get_mut(&owner) {
                        *v = (u64::from(c), u64::from(t));
                    }
                    prop_assert_eq!(got, model.contains_key(&owner));
                }
                Op::Pop(now) => {
                    let earliest = model.values().map(|v| v.1).min();
                    match set.pop_expired(u64::from(now)) {
                        Some((owner, h)) => {
                            prop_assert_eq!(Some(h.expires_at), earliest);
                            prop_assert!(h.expires_at <= u64::from(now));
                            prop_assert!(model.remove(&owner.to_vec()).is_some());
                        }
                        None => prop_assert!(earliest.map_or(true, |e| e > u64::from(now))),
                    }
                }
            }
            set.check().map_err(TestCaseError::fail)?;
            prop_assert_eq!(set.len(), model.len());
            for (owner, (c, t)) in &model {
                let h = set.get(owner).map(|h| (h.count, h.expires_at));
                prop_assert_eq!(h, Some((*c, *t)));
            }
            prop_assert_eq!(set.earliest_expiry(), model.values().map(|v| v.1).min());
            prop_assert_eq!(set.latest_expiry(), model.values().map(|v| v.1).max());
            prop_assert_eq!(set.total(), model.values().map(|v| v.0).sum::<u64>());
            for now in [0u64, 3, 8, 15, 16] {
                let due = model.values().filter(|v| v.1 <= now).count();
                prop_assert_eq!(set.count_due(now), due);
            }
        }
        Ok(())
    }

    /// Up past the threshold (indexes built) and back down below half of it (dropped), in
    /// both hash modes, checking after every step.
    #[test]
    fn indexes_are_built_and_dropped_across_the_threshold() {
        let up = (0..40u8).map(|o| Op::Insert(o.wrapping_mul(7), o % 16));
        let down = (0..40u8).map(|o| Op::Remove(o.wrapping_mul(7)));
        let ops: Vec<Op> = up.chain(down).collect();
        for set in [Indexed::default(), Indexed::colliding()] {
            run(set, &ops).unwrap();
        }
    }

    proptest! {
        #[test]
        fn agrees_with_a_map_keyed_by_owner(ops in proptest::collection::vec(op(), 1..200)) {
            run(Indexed::default(), &ops)?;
        }

        /// Every owner in one hash chain: removals from the middle, the head and the tail of
        /// a chain, and moves of chained entries.
        #[test]
        fn agrees_when_every_owner_shares_one_hash(ops in proptest::collection::vec(op(), 1..200)) {
            run(Indexed::colliding(), &ops)?;
        }
    }
}
