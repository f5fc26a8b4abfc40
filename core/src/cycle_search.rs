//! The deadlock check the server runs: the question of `closes_cycle` (in the test-only
//! `deadlock_reference.rs`; same graph, same answer), searched backwards from the requester and within a budget of
//! visits, so that no request costs the server an unbounded amount of time (SPEC.md, "Bounded
//! cost").
//!
//! # Why backwards
//!
//! A request of owner `O` closes a cycle when one of its blockers reaches, along wait-for
//! edges, an owner `X` whose queued request waits for `O` on a key `O` holds. Searched
//! forwards (from the blockers), the first step lists the holders of the requested key, all
//! of them: 100,000 readers of one key are 100,000 owners to look at, and almost all of them
//! wait for nothing, so they lead nowhere. Searched backwards, every step goes from an owner
//! to the *waiters* that wait for it: the start is the waiters of the keys `O` holds that wait
//! for `O`, and from each owner reached, the waiters that wait for it (on a key it holds, or
//! behind one of its queued requests). Only queued requests are ever enumerated; a holder is
//! only ever *tested* (is this owner one of the request's blockers: a hash lookup in the
//! requested key's holder set, and its own queued requests), never listed. Owners that wait
//! for nothing cost nothing.
//!
//! # The budget
//!
//! Every owner expanded, every key of an owner looked at and every waiter enumerated is one
//! visit. A check that would need more visits than its budget stops and answers
//! [`Verdict::Cut`]: the server then lets the request wait as if no cycle were found (its WAIT
//! timeout ends the wait if there was one), and counts it. A cycle whose search takes fewer
//! visits than the budget is always found: the search stops early only on a cycle or on the
//! budget.
//!
//! # Each waiter enumerated once per reach
//!
//! The owners waiting for a holder of key `K` are the conflicting waiters of `K`'s whole queue
//! (all of them when `K` is held exclusively, the queued writers when it is shared); the ones
//! waiting for a queued request are the conflicting waiters behind it. These are suffixes of
//! the queue, so one search remembers per key how far back it has enumerated every waiter and
//! every writer ([`Marks`]), and enumerates only what is new: each waiter of a key is
//! enumerated at most twice per search, however many of that key's holders and waiters the
//! search reaches (a key's 100,000 readers reached one by one would otherwise list its queue
//! 100,000 times). A waiter left out because it belongs to the owner being expanded is an edge
//! from that owner to itself, which no cycle needs.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

use super::{Lock, Mode, UserId, WaiterId, Who};

/// What the search needs from the server: the keys and queued requests of an owner, within
/// the requester's reach (the Redis side leaves out keys the requesting user may not read),
/// and each key's lock.
///
/// The two listings walk an index and keep what is in reach *as they walk*: they look at no
/// more than `max` entries of the index, in reach or not, and say how many they looked at
/// ([`Listing::walked`]). The search charges its budget by that count, so that entries left
/// out cost visits too (a check cannot make unbounded uncharged reach tests), and a listing
/// that stopped at its limit ends the check as cut (the walk's remaining entries could hold
/// an in-reach key). Filtering only after taking `max` entries would instead make an owner
/// whose first entries are out of reach look as if it held or waited for nothing.
pub trait WaitGraph {
    /// A key of the server (database and name on the Redis side).
    type Key: Clone + Eq + Hash;

    /// The keys that `owner` holds and that may have waiters (a superset is fine: a key
    /// where it holds nothing or nobody waits gives nothing), among the first `max` entries
    /// of the index.
    fn held_by(&mut self, owner: Who<'_>, max: usize) -> Listing<Self::Key>;

    /// The lock requests `owner` has queued (semaphore requests may be left out: they wait
    /// for nobody), each key and waiter id, among the first `max` entries of the index.
    fn queued_by(&mut self, owner: Who<'_>, max: usize) -> Listing<(Self::Key, WaiterId)>;

    /// Runs `f` on the lock stored at `key`; `None` when there is none (gone, another type,
    /// out of reach).
    fn with_lock<R>(&mut self, key: &Self::Key, f: impl FnOnce(&Lock) -> R) -> Option<R>;
}

/// One listing of a [`WaitGraph`] index: the entries kept (in reach), and how many entries
/// of the index were looked at to find them (kept or not; at most the listing's `max`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing<T> {
    pub items: Vec<T>,
    pub walked: usize,
}

impl<T> Listing<T> {
    /// Walks `entries`, looking at no more than `max` of them, and keeps those `keep` says.
    pub fn walk(
        entries: impl IntoIterator<Item = T>,
        max: usize,
        mut keep: impl FnMut(&T) -> bool,
    ) -> Self {
        let mut items = Vec::new();
        let mut walked = 0;
        for entry in entries.into_iter().take(max) {
            walked += 1;
            if keep(&entry) {
                items.push(entry);
            }
        }
        Listing { items, walked }
    }
}

/// The answer of a bounded check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Waiting would close a cycle: refuse.
    Cycle,
    /// It would not.
    NoCycle,
    /// The budget ran out before the search could tell: let the request wait as if no cycle
    /// were found (and count it).
    Cut,
}

/// A check's allowance of visits, and how many it used.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    left: usize,
    used: usize,
}

impl Budget {
    pub fn new(visits: usize) -> Self {
        Budget {
            left: visits,
            used: 0,
        }
    }

    /// How many visits the check made.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Spends one visit; false when none is left.
    fn spend(&mut self) -> bool {
        self.spend_n(1)
    }

    fn spend_n(&mut self, n: usize) -> bool {
        if n > self.left {
            self.used = self.used.saturating_add(self.left);
            self.left = 0;
            return false;
        }
        self.left -= n;
        self.used = self.used.saturating_add(n);
        true
    }

    /// How many items a listing may return: one more than the visits left, so that a full
    /// listing shows the budget would run out.
    fn listing_max(&self) -> usize {
        self.left.saturating_add(1)
    }
}

/// Which conflicting waiters behind a point of a queue wait for what is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// Every lock waiter (behind an exclusive hold or a queued writer).
    All,
    /// The writers only (behind a shared hold or a queued reader).
    Writers,
}

/// What one search has enumerated on one key: every waiter after `all`, every writer after
/// `writers` (`Some(None)`: from the head of the queue; `None`: nothing yet).
#[derive(Clone, Copy, Debug, Default)]
struct Marks {
    all: Option<Option<WaiterId>>,
    writers: Option<Option<WaiterId>>,
}

/// The earlier of two marks (the one that covers more); `None` covers nothing.
fn earlier(a: Option<Option<WaiterId>>, b: Option<Option<WaiterId>>) -> Option<Option<WaiterId>> {
    match (a, b) {
        (None, x) | (x, None) => x,
        (Some(x), Some(y)) => Some(x.min(y)),
    }
}

/// An owner reached by the search (see [`Who`]), kept.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Party {
    user: UserId,
    owner: Box<[u8]>,
}

impl Party {
    fn of(who: Who<'_>) -> Self {
        Party {
            user: who.user,
            owner: who.owner.into(),
        }
    }

    fn who(&self) -> Who<'_> {
        Who::new(self.user, &self.owner)
    }
}

/// Why an expansion stopped.
struct OutOfBudget;

/// Pushes to `out` the owners of the waiters of `lock` after `after` that wait for `target`
/// in `reach`, skipping what `marks` says was enumerated already (each enumerated waiter is
/// one visit).
fn enumerate(
    lock: &Lock,
    target: Who<'_>,
    reach: Reach,
    after: Option<WaiterId>,
    marks: &mut Marks,
    budget: &mut Budget,
    out: &mut Vec<Party>,
) -> Result<(), OutOfBudget> {
    let covered = match reach {
        Reach::All => marks.all,
        Reach::Writers => earlier(marks.all, marks.writers),
    };
    // Everything after `covered` is done: enumerate (after, covered].
    let upto = match covered {
        None => None,
        Some(c) if after >= c => return Ok(()),
        Some(None) => return Ok(()),
        Some(Some(id)) => Some(id),
    };
    for (_, waiter) in lock.queue().range(after, upto) {
        if !budget.spend() {
            return Err(OutOfBudget);
        }
        let waits = match reach {
            Reach::All => waiter.mode != Mode::Permit,
            Reach::Writers => waiter.mode == Mode::Write,
        };
        if waits && waiter.who() != target {
            out.push(Party::of(waiter.who()));
        }
    }
    match reach {
        Reach::All => marks.all = Some(after),
        Reach::Writers => marks.writers = Some(after),
    }
    Ok(())
}

/// Where an owner is on one key: holding it, or queued there as request `id`.
#[derive(Clone, Copy)]
enum Place {
    Holding,
    Queued(WaiterId),
}

/// Pushes to `out` the owners whose queued requests on `lock` wait for `target` because of
/// `place` (its hold, or its queued request).
fn waiting_for(
    lock: &Lock,
    target: Who<'_>,
    place: Place,
    marks: &mut Marks,
    budget: &mut Budget,
    out: &mut Vec<Party>,
) -> Result<(), OutOfBudget> {
    let (mode, after) = match place {
        Place::Holding => {
            if !lock
                .holders()
                .get(target.owner)
                .is_some_and(|h| target.holds(h))
            {
                return Ok(());
            }
            match lock.holders().mode() {
                Some(mode) => (mode, None),
                None => return Ok(()),
            }
        }
        Place::Queued(id) => match lock.queue().get(id) {
            Some(w) if w.who() == target => (w.mode, Some(id)),
            _ => return Ok(()),
        },
    };
    let reach = match mode {
        Mode::Write => Reach::All,
        Mode::Read => Reach::Writers,
        Mode::Permit => return Ok(()),
    };
    enumerate(lock, target, reach, after, marks, budget, out)
}

/// Do a lock request in `mode` and a hold or request in `other` exclude each other?
fn conflict(mode: Mode, other: Mode) -> bool {
    match (mode, other) {
        (Mode::Permit, _) | (_, Mode::Permit) => false,
        (Mode::Write, _) | (_, Mode::Write) => true,
        (Mode::Read, Mode::Read) => false,
    }
}

/// One search: the per-key marks, the owners reached and the budget.
struct Search<'g, G: WaitGraph> {
    graph: &'g mut G,
    marks: HashMap<G::Key, Marks>,
    budget: Budget,
}

impl<G: WaitGraph> Search<'_, G> {
    /// The owners that wait for `owner`: on the keys it holds and behind its queued requests
    /// (`queued`, already listed). With `held_only`, only on keys `owner` holds (behind its
    /// requests there too): the edges that close a cycle onto the requester.
    fn predecessors(
        &mut self,
        owner: Who<'_>,
        queued: &[(G::Key, WaiterId)],
        held_only: bool,
        out: &mut Vec<Party>,
    ) -> Result<(), OutOfBudget> {
        let held = self.graph.held_by(owner, self.budget.listing_max());
        if !self.budget.spend_n(held.walked) {
            return Err(OutOfBudget);
        }
        for key in held.items {
            let marks = self.marks.entry(key.clone()).or_default();
            let budget = &mut self.budget;
            self.graph
                .with_lock(&key, |lock| {
                    waiting_for(lock, owner, Place::Holding, marks, budget, out)
                })
                .unwrap_or(Ok(()))?;
        }
        for (key, id) in queued {
            let marks = self.marks.entry(key.clone()).or_default();
            let budget = &mut self.budget;
            self.graph
                .with_lock(key, |lock| {
                    if held_only
                        && !lock
                            .holders()
                            .get(owner.owner)
                            .is_some_and(|h| owner.holds(h))
                    {
                        return Ok(());
                    }
                    waiting_for(lock, owner, Place::Queued(*id), marks, budget, out)
                })
                .unwrap_or(Ok(()))?;
        }
        Ok(())
    }

    /// The queued requests of `owner` in reach among the first `max` of the index, and how
    /// many were walked; the look is a visit, and so is each request walked, in reach or
    /// not. Runs out of budget when the listing stopped at the budget's limit.
    fn queued_of(
        &mut self,
        owner: Who<'_>,
        max: usize,
    ) -> Result<Listing<(G::Key, WaiterId)>, OutOfBudget> {
        let queued = self
            .graph
            .queued_by(owner, self.budget.listing_max().min(max));
        if self.budget.spend_n(queued.walked.saturating_add(1)) {
            Ok(queued)
        } else {
            Err(OutOfBudget)
        }
    }
}

/// How many of the request's blockers [`check_request`] looks at forwards before searching
/// backwards (see there).
const PEEK: usize = 16;

/// Would a request of `requester` in `mode` on `key` (whose lock is `lock`), which cannot be
/// granted at once, close a cycle if it waited? The question the test-only reference
/// `closes_cycle` answers over `Lock::blockers`, searched backwards
/// within `visits` (see the module documentation). Also returns how many visits the check
/// made.
///
/// First a peek forwards: when the request has at most [`PEEK`] blockers, at most [`PEEK`]
/// requests are queued on its key, and none of the blockers has a request queued anywhere (in
/// reach or not: the peek looks at one entry of each), no path leaves them and nothing closes, whatever waits for the
/// requester (a chain of locks built in order is the common case: each new link's blocker is
/// the next holder, which waits for nothing yet, while backwards the whole chain behind it
/// waits for the new link). The peek's looks are visits too.
pub fn check_request<G: WaitGraph>(
    graph: &mut G,
    requester: Who<'_>,
    mode: Mode,
    key: &G::Key,
    lock: &Lock,
    visits: usize,
) -> (Verdict, usize) {
    let mut search = Search {
        graph,
        marks: HashMap::new(),
        budget: Budget::new(visits),
    };
    let verdict = run(&mut search, requester, mode, key, lock).unwrap_or(Verdict::Cut);
    (verdict, search.budget.used())
}

/// The blockers of the request when there are at most [`PEEK`] of them, `None` otherwise.
fn few_blockers(lock: &Lock, requester: Who<'_>, mode: Mode) -> Option<Vec<Party>> {
    let mut out: Vec<Party> = Vec::new();
    let holders_conflict = lock
        .holders()
        .mode()
        .is_some_and(|held| conflict(mode, held));
    if holders_conflict {
        if lock.holders().len() > PEEK {
            return None;
        }
        for (owner, holder) in lock.holders().iter() {
            let who = Who::new(holder.user, owner);
            if who != requester {
                out.push(Party::of(who));
            }
        }
    }
    // Queued waiters ahead are blockers that wait: the peek cannot conclude. Nor can it on a
    // queue longer than the peek's own allowance: looking through it would be visits the
    // budget does not see.
    if lock.queue().len() > PEEK {
        return None;
    }
    if lock
        .queue()
        .iter()
        .any(|(_, w)| w.who() != requester && conflict(mode, w.mode))
    {
        return None;
    }
    Some(out)
}

fn run<G: WaitGraph>(
    search: &mut Search<'_, G>,
    requester: Who<'_>,
    mode: Mode,
    key: &G::Key,
    lock: &Lock,
) -> Result<Verdict, OutOfBudget> {
    if mode == Mode::Permit {
        return Ok(Verdict::NoCycle);
    }
    if let Some(blockers) = few_blockers(lock, requester, mode) {
        // A blocker with any queued request, in reach or not, stops the peek: one whose
        // first request is out of reach may have others in reach, and the peek looks at one
        // only (nor may the answer depend on whether it waits out of reach).
        let mut any_waits = false;
        for owner in blockers {
            if search.queued_of(owner.who(), 1)?.walked > 0 {
                any_waits = true;
                break;
            }
        }
        if !any_waits {
            return Ok(Verdict::NoCycle);
        }
    }
    // The owners whose queued requests wait for the requester on a key it holds: a cycle
    // closes exactly when one of the request's blockers reaches one of them.
    let mut start = Vec::new();
    let own_queued = search.queued_of(requester, usize::MAX)?.items;
    search.predecessors(requester, &own_queued, true, &mut start)?;
    if start.is_empty() {
        return Ok(Verdict::NoCycle);
    }
    // The marks of that first pass covered only the requester's held keys, and left out its
    // own waiters there: start the search proper afresh.
    search.marks.clear();
    let mut seen: HashSet<Party> = HashSet::new();
    let mut todo: VecDeque<Party> = VecDeque::new();
    for owner in start {
        if seen.insert(owner.clone()) {
            todo.push_back(owner);
        }
    }
    let mut found = Vec::new();
    while let Some(owner) = todo.pop_front() {
        if !search.budget.spend() {
            return Err(OutOfBudget);
        }
        let queued = search.queued_of(owner.who(), usize::MAX)?.items;
        if owner.who() != requester && is_blocker(lock, owner.who(), &queued, mode, key) {
            return Ok(Verdict::Cycle);
        }
        found.clear();
        search.predecessors(owner.who(), &queued, false, &mut found)?;
        for next in found.drain(..) {
            if !seen.contains(&next) {
                seen.insert(next.clone());
                todo.push_back(next);
            }
        }
    }
    Ok(Verdict::NoCycle)
}

/// Is `owner` one of the blockers of the new request (in `mode` on `key`, whose lock is
/// `lock`): a conflicting holder of the key, or the owner of a conflicting request queued
/// there? A test, not a listing: one lookup in the key's holders, and the owner's own queued
/// requests.
fn is_blocker<K: PartialEq>(
    lock: &Lock,
    owner: Who<'_>,
    queued: &[(K, WaiterId)],
    mode: Mode,
    key: &K,
) -> bool {
    let holds = lock
        .holders()
        .get(owner.owner)
        .is_some_and(|h| owner.holds(h))
        && lock
            .holders()
            .mode()
            .is_some_and(|held| conflict(mode, held));
    holds
        || queued.iter().any(|(k, id)| {
            k == key
                && lock
                    .queue()
                    .get(*id)
                    .is_some_and(|w| w.who() == owner && conflict(mode, w.mode))
        })
}

#[cfg(test)]
#[path = "cycle_search_tests.rs"]
mod tests;
