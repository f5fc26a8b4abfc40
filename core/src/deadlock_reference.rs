//! The reference for deadlock detection, compiled only for tests: who a request waits for on
//! one key ([`Lock::blockers`]), and whether waiting would close a cycle through the other keys
//! ([`closes_cycle`]), with no budget. The module uses the bounded search of `cycle_search`;
//! the tests here and in `cycle_search_tests.rs` hold it to this exhaustive reading of the
//! rules. Nothing here knows about keys, databases or clients.
//!
//! # The graph (SPEC.md, "Deadlock detection")
//!
//! The nodes are owners, compared by their bytes. A queued request `r` of owner `X` on a key
//! *waits for* owner `Y` (an edge `X -> Y`, `Y != X`) when
//! - `Y` holds the key in a conflicting way (a writer conflicts with everyone, a reader with
//!   writers), or
//! - `Y` has a conflicting request queued ahead of `r` on that key.
//!
//! That is the SPEC's "the conflicting holders of the key, and the conflicting requests queued
//! ahead of it", applied to every queued request and to the new one. Each edge also records
//! whether `Y` *holds* the key `r` waits on ([`Blocker::holds_key`]).
//!
//! A new request of owner `O` that cannot be granted at once would add the edges `O -> B` for
//! its blockers `B`. It *closes a cycle* when some owner `X` reachable from a blocker (`X`
//! may be the blocker itself; the path may pass through any owner, `O` included) has a queued
//! request that waits for `O` on a key `O` holds: the SPEC's "the owners it would wait for wait,
//! directly or through other owners, for a key this request's owner holds". An edge into `O`
//! through a request `O` has only *queued* on that key (`O` does not hold it) does not close
//! a cycle: the owner behind that request waits for a key `O` does not hold. (Should that
//! request of `O` be granted while the new one still waits, a cycle forms then, by a grant;
//! SPEC.md checks requests, and the WAIT timeouts end such a wait.)
//!
//! Cost of one check: [`closes_cycle`] visits each owner reachable from the blockers once
//! and stops at the first cycle; the Redis side builds one [`WaitView`] per key where a
//! visited owner waits (one pass over its holders and queue, linear in them), so a check costs
//! about the size of the keys it reaches.
//!
//! # Why a reader queued behind a reader is not a blocker
//!
//! Readers queued one after the other with no writer between them are granted together (see
//! the grant rule in `Lock::grant_waiters`): the later one never waits for the
//! earlier one to be granted *and released*, only for what the earlier one waits for, and that
//! (the conflicting holders and the writers queued ahead) it waits for itself. They do not
//! conflict, so the SPEC's words leave the edge out, and so must we: with the edge, an owner
//! whose reader is queued next to another owner's reader would "wait for" that owner's other
//! requests, and a request that is part of no cycle would be refused. A reader behind a writer
//! behind a reader still waits for the first reader, through the writer (a path in the graph).

use std::collections::HashSet;

use super::{Lock, Mode, WaiterId};

/// One owner a request waits for on one key. Built only by [`Lock::blockers`] and
/// [`Lock::wait_view`], so the flag always means what [`closes_cycle`] expects.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Blocker {
    owner: Box<[u8]>,
    holds_key: bool,
}

impl Blocker {
    /// The owner waited for.
    pub fn owner(&self) -> &[u8] {
        &self.owner
    }

    /// Whether that owner holds the key the request waits on (as a conflicting holder, or, in
    /// the corner where an owner holds the key and also has a request queued on it, through
    /// that request).
    pub fn holds_key(&self) -> bool {
        self.holds_key
    }

    /// For the tests' hand-built graphs.
    #[cfg(test)]
    pub(crate) fn new(owner: &[u8], holds_key: bool) -> Self {
        Blocker {
            owner: owner.into(),
            holds_key,
        }
    }
}

/// Do a lock request in `mode` and a hold or request in `other` exclude each other? Permits
/// never meet locks on one key, and semaphore waits are not part of detection.
fn conflict(mode: Mode, other: Mode) -> bool {
    match (mode, other) {
        (Mode::Permit, _) | (_, Mode::Permit) => false,
        (Mode::Write, _) | (_, Mode::Write) => true,
        (Mode::Read, Mode::Read) => false,
    }
}

impl Lock {
    /// The owners a request of `owner` in `mode` waits for on this lock: the conflicting
    /// holders and the owners of the conflicting requests queued ahead of it. For a new
    /// request (`ahead_of` = `None`) that is the whole queue; for a queued waiter
    /// (`ahead_of` = its id) the waiters before it. `owner` itself is never listed, and each
    /// owner at most once. Call it on a settled lock (expired holders dropped). A semaphore
    /// request (`Mode::Permit`) has no blockers: semaphore waits are not part of detection.
    ///
    /// Cost: the conflicting holders (none are looked at for a reader beside readers) plus the
    /// part of the queue ahead of the request.
    pub fn blockers(&self, owner: &[u8], mode: Mode, ahead_of: Option<WaiterId>) -> Vec<Blocker> {
        let mut seen: HashSet<&[u8]> = HashSet::new();
        let mut out = Vec::new();
        if mode == Mode::Permit {
            return out;
        }
        let holders_conflict = match self.holders().mode() {
            None => false,
            Some(held) => conflict(mode, held),
        };
        if holders_conflict {
            for (other, _) in self.holders().iter() {
                if other != owner && seen.insert(other) {
                    out.push(Blocker {
                        owner: other.into(),
                        holds_key: true,
                    });
                }
            }
        }
        let ahead = self
            .queue()
            .iter()
            .take_while(|(id, _)| ahead_of.map_or(true, |mine| *id < mine));
        for (_, waiter) in ahead {
            let other = &waiter.owner[..];
            if other != owner && conflict(mode, waiter.mode) && seen.insert(other) {
                out.push(Blocker {
                    owner: other.into(),
                    holds_key: self.holders().get(other).is_some(),
                });
            }
        }
        out
    }

    /// Who each queued waiter of this lock waits for, in one pass over the holders and the
    /// queue: what `waits_for` (see [`closes_cycle`]) reads. See [`WaitView`].
    pub fn wait_view(&self) -> WaitView {
        let mut view = WaitView::default();
        let all_holders: Vec<&[u8]> = self.holders().iter().map(|(o, _)| o).collect();
        let writer_holders: &[&[u8]] = match self.holders().mode() {
            Some(Mode::Write) => &all_holders,
            _ => &[],
        };
        // The owner of the last writer queued so far, and the readers queued since it (or
        // since the head, when there is none).
        let mut last_writer: Option<&[u8]> = None;
        let mut readers_since: Vec<&[u8]> = Vec::new();
        let mut seen: HashSet<&[u8]> = HashSet::new();
        for (id, waiter) in self.queue().iter() {
            let owner = &waiter.owner[..];
            let targets: Vec<&[u8]> = match (waiter.mode, last_writer) {
                (Mode::Permit, _) => Vec::new(),
                (Mode::Read, Some(writer)) => vec![writer],
                (Mode::Read, None) => writer_holders.to_vec(),
                (Mode::Write, Some(writer)) => {
                    readers_since.iter().copied().chain([writer]).collect()
                }
                (Mode::Write, None) => readers_since
                    .iter()
                    .chain(all_holders.iter())
                    .copied()
                    .collect(),
            };
            let start = view.edges.len();
            seen.clear();
            for target in targets {
                if target != owner && seen.insert(target) {
                    view.edges.push(Blocker {
                        owner: target.into(),
                        holds_key: self.holders().get(target).is_some(),
                    });
                }
            }
            view.index.push((id, start, view.edges.len()));
            match waiter.mode {
                Mode::Write => {
                    last_writer = Some(owner);
                    readers_since.clear();
                }
                Mode::Read => readers_since.push(owner),
                Mode::Permit => {}
            }
        }
        view
    }
}

/// Who the queued waiters of one lock wait for, as [`Lock::wait_view`] found them: for the
/// Redis side to read while it walks the graph (build it once per key per check).
///
/// Each waiter's list is a *reduced* form of [`Lock::blockers`] for it, which keeps a view
/// linear in the size of the lock (a queue of n writers would otherwise have n^2/2 edges)
/// without changing what [`closes_cycle`] answers:
/// - a reader lists the last writer queued ahead of it, or, when there is none, the writer
///   holding the lock;
/// - a writer lists the readers queued since the last writer ahead of it, and that writer, or,
///   when there is none, every holder.
///
/// Every listed owner is one of the waiter's blockers (with the same [`Blocker::holds_key`]),
/// and every other blocker is reached from them through the same key: the last writer ahead
/// lists its own readers and the writer before it, and so on to the first writer, which lists
/// the holders. An owner reached that way is visited with all its queued requests, so the
/// owners reachable from any owner, and the edges into the requester with their flags, are
/// those of the full graph.
#[derive(Clone, Debug, Default)]
pub struct WaitView {
    /// Per queued waiter, in queue (id) order: where its blockers are in `edges`.
    index: Vec<(WaiterId, usize, usize)>,
    edges: Vec<Blocker>,
}

impl WaitView {
    /// The owners waiter `id` waits for (see the type); empty when it is not queued here.
    pub fn blockers_of(&self, id: WaiterId) -> &[Blocker] {
        let Ok(at) = self.index.binary_search_by_key(&id, |(i, _, _)| *i) else {
            return &[];
        };
        self.index
            .get(at)
            .and_then(|(_, start, end)| self.edges.get(*start..*end))
            .unwrap_or(&[])
    }

    /// How many edges the view holds (at most the holders plus twice the queue).
    pub fn len(&self) -> usize {
        self.edges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }
}

/// Would a request of `requester` whose blockers are `first` ([`Lock::blockers`] with
/// `ahead_of` = `None`, for a request that cannot be granted at once) close a cycle?
///
/// `waits_for(X)` returns the blockers of every request `X` has queued, on every key of every
/// database: the concatenation of [`WaitView::blockers_of`] over them (or of
/// [`Lock::blockers`] with `ahead_of` = the waiter's id, the same answer at a higher cost);
/// duplicates are fine; semaphore waiters have none. It is called at most once per owner.
///
/// True when an owner reachable from `first` (directly or through other owners) waits for
/// `requester` on a key `requester` holds; see the module documentation for why exactly that.
///
/// Cost: an iterative depth-first search with a visited set, stopping at the first cycle
/// found: one `waits_for` call per owner reached, and work proportional to the blockers it
/// returns. No recursion.
pub fn closes_cycle(
    requester: &[u8],
    first: Vec<Blocker>,
    mut waits_for: impl FnMut(&[u8]) -> Vec<Blocker>,
) -> bool {
    let mut seen: HashSet<Box<[u8]>> = HashSet::new();
    let mut stack: Vec<Box<[u8]>> = Vec::new();
    for blocker in first {
        if seen.insert(blocker.owner.clone()) {
            stack.push(blocker.owner);
        }
    }
    while let Some(owner) = stack.pop() {
        for blocker in waits_for(&owner) {
            if blocker.holds_key && *blocker.owner == *requester {
                return true;
            }
            if !seen.contains(&blocker.owner) {
                seen.insert(blocker.owner.clone());
                stack.push(blocker.owner);
            }
        }
    }
    false
}

#[cfg(test)]
#[path = "deadlock_reference_tests.rs"]
mod tests;
