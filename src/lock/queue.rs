//! The FIFO queue of clients waiting for one lock.
//!
//! Waiter ids are handed out in arrival order by the caller, so ordering the queue by id is
//! ordering it by arrival. A map (rather than a deque) lets a waiter that times out or
//! disconnects leave from the middle in logarithmic time, and lets waiters rescued from a
//! deleted key rejoin in their original places.

use std::collections::BTreeMap;

use super::{Millis, Mode, WaiterId};

/// A client queued for a lock: what it asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub owner: Box<[u8]>,
    pub mode: Mode,
    /// The TTL the hold gets when it is finally granted (counted from the grant).
    pub ttl: Millis,
}

#[derive(Clone, Debug, Default)]
pub struct WaitQueue {
    waiters: BTreeMap<WaiterId, Waiter>,
}

impl WaitQueue {
    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    pub fn push(&mut self, id: WaiterId, waiter: Waiter) {
        self.waiters.insert(id, waiter);
    }

    pub fn head(&self) -> Option<(WaiterId, &Waiter)> {
        self.waiters.first_key_value().map(|(id, w)| (*id, w))
    }

    pub fn pop_head(&mut self) -> Option<(WaiterId, Waiter)> {
        self.waiters.pop_first()
    }

    pub fn remove(&mut self, id: WaiterId) -> Option<Waiter> {
        self.waiters.remove(&id)
    }

    pub fn contains(&self, id: WaiterId) -> bool {
        self.waiters.contains_key(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = (WaiterId, &Waiter)> {
        self.waiters.iter().map(|(id, w)| (*id, w))
    }

    /// Empties the queue, returning the waiters in arrival order.
    pub fn take_all(&mut self) -> Vec<(WaiterId, Waiter)> {
        std::mem::take(&mut self.waiters).into_iter().collect()
    }

    /// Keeps only the waiters for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(WaiterId) -> bool) {
        self.waiters.retain(|id, _| keep(*id));
    }

    pub fn heap_size(&self) -> usize {
        self.waiters
            .values()
            .map(|w| std::mem::size_of::<(WaiterId, Waiter)>() + w.owner.len())
            .sum()
    }
}
