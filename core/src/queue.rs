//! The FIFO queue of clients waiting for one lock.
//!
//! Waiter ids are handed out in arrival order by the caller, so ordering the queue by id is
//! ordering it by arrival. A map (rather than a deque) lets a waiter that times out or
//! disconnects leave from the middle in logarithmic time, and lets waiters rescued from a
//! deleted key rejoin in their original places.

use std::collections::BTreeMap;

use super::{HoldOptions, Millis, Mode, WaiterId};

/// A client queued for a lock: what it asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub owner: Box<[u8]>,
    pub mode: Mode,
    /// The TTL the hold gets when it is finally granted (counted from the grant).
    pub ttl: Millis,
    /// BIND (the waiter's own connection) and LOCKDELAY for the hold it will get.
    pub options: HoldOptions,
    /// The capacity a semaphore request named ([`Mode::Permit`]), 0 for a lock.
    pub capacity: u32,
}

impl Waiter {
    /// The owner as deadlock detection sees it: its user (from its options) and name.
    pub fn who(&self) -> crate::Who<'_> {
        crate::Who::new(self.options.user, &self.owner)
    }
}

/// The queue of one lock. Most locks never have a waiter, so the map is allocated only while
/// someone waits (an empty queue is one null pointer).
#[derive(Clone, Debug, Default)]
pub struct WaitQueue {
    // Boxed on purpose: 8 bytes in every lock instead of a 24-byte map header, for a queue
    // that is empty in most locks (memory per lock is a published figure).
    #[allow(clippy::box_collection)]
    waiters: Option<Box<BTreeMap<WaiterId, Waiter>>>,
}

impl WaitQueue {
    pub fn len(&self) -> usize {
        self.waiters.as_ref().map_or(0, |w| w.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn push(&mut self, id: WaiterId, waiter: Waiter) {
        self.waiters
            .get_or_insert_with(Default::default)
            .insert(id, waiter);
    }

    pub fn head(&self) -> Option<(WaiterId, &Waiter)> {
        self.waiters
            .as_ref()?
            .first_key_value()
            .map(|(id, w)| (*id, w))
    }

    pub fn pop_head(&mut self) -> Option<(WaiterId, Waiter)> {
        let popped = self.waiters.as_mut()?.pop_first();
        self.free_if_empty();
        popped
    }

    pub fn remove(&mut self, id: WaiterId) -> Option<Waiter> {
        let removed = self.waiters.as_mut()?.remove(&id);
        self.free_if_empty();
        removed
    }

    pub fn contains(&self, id: WaiterId) -> bool {
        self.waiters.as_ref().is_some_and(|w| w.contains_key(&id))
    }

    /// Waiter `id`, if it is queued here.
    pub fn get(&self, id: WaiterId) -> Option<&Waiter> {
        self.waiters.as_ref()?.get(&id)
    }

    /// The waiters queued after `after` (all of them for `None`) up to and including `upto`
    /// (to the end for `None`), in arrival order.
    pub fn range(
        &self,
        after: Option<WaiterId>,
        upto: Option<WaiterId>,
    ) -> impl Iterator<Item = (WaiterId, &Waiter)> {
        use std::ops::Bound;
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let end = upto.map_or(Bound::Unbounded, Bound::Included);
        let valid = match (after, upto) {
            (Some(a), Some(u)) => a < u,
            _ => true,
        };
        self.waiters
            .iter()
            .filter(move |_| valid)
            .flat_map(move |w| w.range((start, end)).map(|(id, w)| (*id, w)))
    }

    pub fn iter(&self) -> impl Iterator<Item = (WaiterId, &Waiter)> {
        self.waiters
            .iter()
            .flat_map(|w| w.iter().map(|(id, w)| (*id, w)))
    }

    /// Empties the queue, returning the waiters in arrival order.
    pub fn take_all(&mut self) -> Vec<(WaiterId, Waiter)> {
        self.waiters
            .take()
            .map(|w| w.into_iter().collect())
            .unwrap_or_default()
    }

    /// Keeps only the waiters for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(WaiterId) -> bool) {
        if let Some(w) = self.waiters.as_mut() {
            w.retain(|id, _| keep(*id));
        }
        self.free_if_empty();
    }

    fn free_if_empty(&mut self) {
        if self.waiters.as_ref().is_some_and(|w| w.is_empty()) {
            self.waiters = None;
        }
    }

    pub fn heap_size(&self) -> usize {
        self.iter()
            .map(|(_, w)| std::mem::size_of::<(WaiterId, Waiter)>() + w.owner.len())
            .sum()
    }
}
