//! The owners currently holding one lock, indexed by owner and by expiry time.
//!
//! Both indexes are needed so that every operation stays logarithmic in the number of
//! holders: a reader acquiring or releasing next to 10,000 other readers must cost the same
//! as next to one, and the nearest expiry (for the timer) and the latest one (for the key's
//! Redis TTL) are read without a scan.

use std::collections::{BTreeSet, HashMap};

use super::{Millis, Mode};

/// One owner's hold on a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub mode: Mode,
    /// Reentrancy count, at least 1 while the holder exists.
    pub count: u64,
    /// Absolute time (ms) at which the hold ends unless extended.
    pub expires_at: Millis,
    /// Fencing token handed out when this hold began.
    pub token: u64,
}

/// All holders of one lock. Invariant: every holder has the same mode.
#[derive(Clone, Debug, Default)]
pub struct HolderSet {
    by_owner: HashMap<Box<[u8]>, Holder>,
    by_expiry: BTreeSet<(Millis, Box<[u8]>)>,
}

impl HolderSet {
    pub fn len(&self) -> usize {
        self.by_owner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_owner.is_empty()
    }

    pub fn get(&self, owner: &[u8]) -> Option<&Holder> {
        self.by_owner.get(owner)
    }

    /// The mode the lock is held in, or `None` when nobody holds it.
    pub fn mode(&self) -> Option<Mode> {
        self.by_owner.values().next().map(|h| h.mode)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Holder)> {
        self.by_owner.iter().map(|(o, h)| (&**o, h))
    }

    /// Adds a new holder; the caller has checked that `owner` holds nothing yet.
    pub fn insert(&mut self, owner: &[u8], holder: Holder) {
        let key: Box<[u8]> = owner.into();
        self.by_expiry.insert((holder.expires_at, key.clone()));
        self.by_owner.insert(key, holder);
    }

    pub fn remove(&mut self, owner: &[u8]) -> Option<Holder> {
        let (key, holder) = self.by_owner.remove_entry(owner)?;
        self.by_expiry.remove(&(holder.expires_at, key));
        Some(holder)
    }

    /// Changes the count and expiry of an existing holder. Returns `None` if `owner` does not
    /// hold the lock.
    pub fn update(&mut self, owner: &[u8], count: u64, expires_at: Millis) -> Option<&Holder> {
        let (key, holder) = self.by_owner.get_key_value(owner)?;
        if holder.expires_at != expires_at {
            let old = (holder.expires_at, key.clone());
            self.by_expiry.remove(&old);
            self.by_expiry.insert((expires_at, old.1));
        }
        let holder = self.by_owner.get_mut(owner)?;
        holder.count = count;
        holder.expires_at = expires_at;
        Some(holder)
    }

    /// The earliest expiry among the holders.
    pub fn earliest_expiry(&self) -> Option<Millis> {
        self.by_expiry.first().map(|(t, _)| *t)
    }

    /// The latest expiry among the holders: the key's Redis expiry.
    pub fn latest_expiry(&self) -> Option<Millis> {
        self.by_expiry.last().map(|(t, _)| *t)
    }

    /// Removes and returns the holder with the earliest expiry if it is due at `now`.
    pub fn pop_expired(&mut self, now: Millis) -> Option<(Box<[u8]>, Holder)> {
        let (t, _) = self.by_expiry.first()?;
        if *t > now {
            return None;
        }
        let (_, owner) = self.by_expiry.pop_first()?;
        let holder = self.by_owner.remove(&owner)?;
        Some((owner, holder))
    }

    /// Bytes of heap owned by this set, for MEMORY USAGE (an estimate).
    pub fn heap_size(&self) -> usize {
        let per_entry = std::mem::size_of::<(Box<[u8]>, Holder)>() + 1;
        let per_index = std::mem::size_of::<(Millis, Box<[u8]>)>();
        self.by_owner.capacity() * per_entry
            + self
                .by_owner
                .keys()
                .map(|o| 2 * o.len() + per_index)
                .sum::<usize>()
    }
}
