//! The bounded search's cost: what it visits and what it never does (the comparison with the
//! brute-force reading of the rules is in `deadlock_reference_tests.rs`, which runs both on random systems).

use super::*;
use crate::{Acquired, FenceCounter, HoldOptions, Request, Step};

/// Keys by number, with a count of how often each is read, and an index of who holds what
/// (as the server's contention index: only keys with waiters).
struct Keys {
    locks: Vec<Lock>,
    fences: FenceCounter,
    next_id: u64,
    held_lookups: usize,
    /// Keys out of the requester's reach: listed by the index (and charged), never kept.
    hidden: HashSet<usize>,
}

impl Keys {
    fn new(n: usize) -> Self {
        Keys {
            locks: vec![Lock::new(); n],
            fences: FenceCounter::default(),
            next_id: 1,
            held_lookups: 0,
            hidden: HashSet::new(),
        }
    }

    fn request(&mut self, owner: &str, key: usize, mode: Mode, wait: bool) -> Acquired {
        self.request_as(0, owner, key, mode, wait)
    }

    fn request_as(
        &mut self,
        user: crate::UserId,
        owner: &str,
        key: usize,
        mode: Mode,
        wait: bool,
    ) -> Acquired {
        let id = WaiterId(self.next_id);
        self.next_id += 1;
        let mut events = Vec::new();
        let mut step = Step {
            now: 1_000,
            fences: &mut self.fences,
            events: &mut events,
            refuse: None,
        };
        let req = Request {
            owner: owner.as_bytes(),
            mode,
            ttl: 1_000_000,
            options: HoldOptions {
                user,
                ..HoldOptions::default()
            },
            capacity: 0,
        };
        self.locks[key].request(req, wait.then_some(id), &mut step)
    }

    fn hold(&mut self, owner: &str, key: usize, mode: Mode) {
        assert!(matches!(
            self.request(owner, key, mode, false),
            Acquired::Granted { .. }
        ));
    }

    fn queue(&mut self, owner: &str, key: usize, mode: Mode) {
        assert_eq!(self.request(owner, key, mode, true), Acquired::Queued);
    }
}

impl Keys {
    /// A copy to search in, so the request's lock can be borrowed from the original.
    fn clone_graph(&self) -> Keys {
        Keys {
            locks: self.locks.clone(),
            fences: self.fences,
            next_id: self.next_id,
            held_lookups: 0,
            hidden: self.hidden.clone(),
        }
    }
}

impl WaitGraph for Keys {
    type Key = usize;

    fn held_by(&mut self, who: crate::Who<'_>, max: usize) -> Listing<usize> {
        let owner = who.owner;
        self.held_lookups += 1;
        let held = (0..self.locks.len()).filter(|k| {
            !self.locks[*k].queue().is_empty() && self.locks[*k].holders().get(owner).is_some()
        });
        Listing::walk(held, max, |k| !self.hidden.contains(k))
    }

    fn queued_by(&mut self, who: crate::Who<'_>, max: usize) -> Listing<(usize, WaiterId)> {
        let mut out = Vec::new();
        for (k, lock) in self.locks.iter().enumerate() {
            for (id, w) in lock.queue().iter() {
                if w.who() == who {
                    out.push((k, id));
                }
            }
        }
        Listing::walk(out, max, |(k, _)| !self.hidden.contains(k))
    }

    fn with_lock<R>(&mut self, key: &usize, f: impl FnOnce(&Lock) -> R) -> Option<R> {
        if self.hidden.contains(key) {
            return None;
        }
        self.locks.get(*key).map(f)
    }
}

const W: Mode = Mode::Write;
const R: Mode = Mode::Read;

/// 100,000 readers of one key and a queued writer: a request for that key from an owner whose
/// own key has one waiter costs a handful of visits, not one per reader.
#[test]
fn readers_that_wait_for_nothing_cost_nothing() {
    let mut keys = Keys::new(2);
    for i in 0..100_000 {
        keys.hold(&format!("r{i}"), 0, R);
    }
    keys.queue("writer", 0, W);
    keys.hold("o", 1, W);
    keys.queue("bystander", 1, W);
    let (verdict, used) = check_request(
        &mut keys.clone_graph(),
        crate::Who::new(0, b"o"),
        W,
        &0,
        &keys.locks[0],
        1_000,
    );
    assert_eq!(verdict, Verdict::NoCycle);
    assert!(used < 20, "{used} visits");
    // The writer waits for o: now the request would close a cycle, found as cheaply.
    keys.queue("writer", 1, W);
    let (verdict, used) = check_request(
        &mut keys.clone_graph(),
        crate::Who::new(0, b"o"),
        W,
        &0,
        &keys.locks[0],
        1_000,
    );
    assert_eq!(verdict, Verdict::Cycle);
    assert!(used < 20, "{used} visits");
}

/// A chain of n owners into the requester's key: owner i holds key i and waits for key i + 1;
/// the last waits for the requester's key. A request for key 0 closes the cycle; the search
/// walks the chain backwards, about five visits a link. With fewer visits than that it is cut,
/// with enough it is found.
#[test]
fn a_long_chain_is_found_within_its_budget_and_cut_below_it() {
    let n = 10_000;
    let own = n;
    let mut keys = Keys::new(n + 1);
    keys.hold("o", own, W);
    for i in 0..n {
        keys.hold(&format!("c{i}"), i, W);
    }
    for i in 0..n {
        let next = if i + 1 == n { own } else { i + 1 };
        keys.queue(&format!("c{i}"), next, W);
    }
    let (verdict, used) = check_request(
        &mut keys.clone_graph(),
        crate::Who::new(0, b"o"),
        W,
        &0,
        &keys.locks[0],
        usize::MAX,
    );
    assert_eq!(verdict, Verdict::Cycle);
    assert!(used >= n && used <= 6 * n, "{used} visits");
    for budget in [0, 1, 100, used - 1] {
        let (verdict, spent) = check_request(
            &mut keys.clone_graph(),
            crate::Who::new(0, b"o"),
            W,
            &0,
            &keys.locks[0],
            budget,
        );
        assert_eq!(verdict, Verdict::Cut, "budget {budget}");
        assert!(spent <= budget);
    }
    assert_eq!(
        check_request(
            &mut keys.clone_graph(),
            crate::Who::new(0, b"o"),
            W,
            &0,
            &keys.locks[0],
            used
        )
        .0,
        Verdict::Cycle
    );
    // Another requester holding nothing anyone waits for: no walk.
    let (verdict, used) = check_request(
        &mut keys.clone_graph(),
        crate::Who::new(0, b"p"),
        W,
        &0,
        &keys.locks[0],
        usize::MAX,
    );
    assert_eq!(verdict, Verdict::NoCycle);
    assert!(used < 5, "{used} visits");
}

/// A long queue on one key reached through many of its holders is enumerated once, not once
/// per holder: 1,000 readers who each wait elsewhere, and 1,000 writers queued on their key.
#[test]
fn a_queue_reached_through_many_holders_is_listed_once() {
    let n = 1_000;
    // Key 0: n readers, n writers queued. Key 1: held by o, each reader waits for it. Key 2:
    // the request's key, held by x, who waits for nothing.
    let mut keys = Keys::new(3);
    for i in 0..n {
        keys.hold(&format!("r{i}"), 0, R);
    }
    for i in 0..n {
        keys.queue(&format!("w{i}"), 0, W);
    }
    keys.hold("o", 1, W);
    for i in 0..n {
        keys.queue(&format!("r{i}"), 1, R);
    }
    keys.hold("x", 2, W);
    let (verdict, used) = check_request(
        &mut keys.clone_graph(),
        crate::Who::new(0, b"o"),
        W,
        &2,
        &keys.locks[2],
        usize::MAX,
    );
    assert_eq!(verdict, Verdict::NoCycle);
    // The readers (n, each a node, its key and its request) and the writers (n listed once,
    // n nodes): well under the n * n a listing per holder would take.
    assert!(used < 12 * n, "{used} visits");
}

#[test]
fn semaphore_requests_are_never_checked() {
    let keys = Keys::new(1);
    assert_eq!(
        check_request(
            &mut keys.clone_graph(),
            crate::Who::new(0, b"o"),
            Mode::Permit,
            &0,
            &keys.locks[0],
            0
        ),
        (Verdict::NoCycle, 0)
    );
}

/// A chain built in order: each new link's check peeks at its one blocker (the next holder,
/// which waits for nothing yet) and stops, instead of walking the whole chain behind it.
#[test]
fn a_chain_built_in_order_costs_each_link_a_peek() {
    let n = 2_000;
    let mut keys = Keys::new(n + 1);
    for i in 0..=n {
        keys.hold(&format!("c{i}"), i, W);
    }
    for i in 0..n {
        let owner = format!("c{i}");
        let (verdict, used) = check_request(
            &mut keys.clone_graph(),
            crate::Who::new(0, owner.as_bytes()),
            W,
            &(i + 1),
            &keys.locks[i + 1],
            usize::MAX,
        );
        assert_eq!(verdict, Verdict::NoCycle);
        assert!(used <= 2, "link {i}: {used} visits");
        keys.queue(&owner, i + 1, W);
    }
}

/// A two-owner cycle within reach: `a` holds key 1, `bw` holds key 2 and waits for key 1, `a`
/// asks for key 2. When `bw`'s oldest queued request is on a key out of reach (key 0), the
/// peek (which looks at one request of each blocker) must not take `bw` for an owner that
/// waits for nothing: the cycle is found all the same, at a small budget.
#[test]
fn an_out_of_reach_first_request_does_not_hide_a_cycle() {
    let verdict = |bw_waits_out_of_reach: bool| {
        let mut keys = Keys::new(3);
        keys.hidden.insert(0);
        if bw_waits_out_of_reach {
            keys.hold("bh", 0, W);
            keys.queue("bw", 0, W);
        }
        keys.hold("a", 1, W);
        keys.hold("bw", 2, W);
        keys.queue("bw", 1, W);
        check_request(
            &mut keys.clone_graph(),
            crate::Who::new(0, b"a"),
            W,
            &2,
            &keys.locks[2],
            500,
        )
    };
    assert_eq!(verdict(false).0, Verdict::Cycle);
    assert_eq!(verdict(true).0, Verdict::Cycle);
}

/// The index entries left out because they are out of reach cost visits, and a listing cut
/// short by the budget ends the check as cut, never as "no cycle": `bw` holds 30 contended
/// keys out of reach (listed first) and key 31, where `c` waits; `c` holds key 33, which `a`
/// asks for; `bw` waits for `a` on key 32. At budget 20 the check is cut; with room, the
/// cycle is found, and the visits include the 30 entries left out.
#[test]
fn out_of_reach_entries_are_charged_and_a_short_listing_is_a_cut() {
    let n = 30;
    let mut keys = Keys::new(n + 4);
    for k in 0..n {
        keys.hidden.insert(k);
        keys.hold("bw", k, W);
        keys.queue(&format!("x{k}"), k, W);
    }
    let (held, wanted, requested) = (n + 1, n + 2, n + 3);
    keys.hold("bw", held, W);
    keys.hold("a", wanted, W);
    keys.hold("c", requested, W);
    keys.queue("c", held, W);
    keys.queue("bw", wanted, W);
    let check = |budget: usize| {
        check_request(
            &mut keys.clone_graph(),
            crate::Who::new(0, b"a"),
            W,
            &requested,
            &keys.locks[requested],
            budget,
        )
    };
    let (verdict, used) = check(20);
    assert_eq!(verdict, Verdict::Cut);
    assert!(used <= 20, "{used} visits");
    let (verdict, used) = check(usize::MAX);
    assert_eq!(verdict, Verdict::Cycle);
    assert!(used > n, "{used} visits");
    assert_eq!(check(used).0, Verdict::Cycle);
    assert_eq!(check(used - 1).0, Verdict::Cut);
}

/// A listing that walks only out-of-reach entries and stops at the budget's limit is a cut:
/// `a`'s blocker `c` has 40 queued requests out of reach before its in-reach one.
#[test]
fn a_queue_listing_stopped_at_the_limit_is_a_cut() {
    let n = 40;
    let mut keys = Keys::new(n + 3);
    for k in 0..n {
        keys.hidden.insert(k);
        keys.hold(&format!("h{k}"), k, W);
        keys.queue("c", k, W);
    }
    let (own, requested) = (n + 1, n + 2);
    keys.hold("a", own, W);
    keys.hold("c", requested, W);
    keys.queue("c", own, W);
    let check = |budget: usize| {
        check_request(
            &mut keys.clone_graph(),
            crate::Who::new(0, b"a"),
            W,
            &requested,
            &keys.locks[requested],
            budget,
        )
        .0
    };
    assert_eq!(check(usize::MAX), Verdict::Cycle);
    assert_eq!(check(20), Verdict::Cut);
}

/// An owner is the pair (user, name): holds and requests that another user made under the
/// same name are someone else's, so they close no cycle with the requester (docs/commands.md,
/// "Deadlock detection").
#[test]
fn owners_of_different_users_are_different_owners() {
    let mut keys = Keys::new(2);
    assert!(matches!(
        keys.request_as(1, "a", 0, W, false),
        Acquired::Granted { .. }
    ));
    assert!(matches!(
        keys.request_as(1, "b", 1, W, false),
        Acquired::Granted { .. }
    ));
    assert_eq!(keys.request_as(1, "b", 0, W, true), Acquired::Queued);
    // User 1's "a" asking for key 1 closes a ... -> a -> b -> a cycle.
    let check = |keys: &Keys, user| {
        check_request(
            &mut keys.clone_graph(),
            crate::Who::new(user, b"a"),
            W,
            &1,
            &keys.locks[1],
            1_000,
        )
        .0
    };
    assert_eq!(check(&keys, 1), Verdict::Cycle);
    // User 2's "a" holds nothing user 1's "b" waits for.
    assert_eq!(check(&keys, 2), Verdict::NoCycle);
    // Nor does a hold of unknown user (loaded) belong to anyone who asks.
    assert_eq!(check(&keys, crate::UNKNOWN_USER), Verdict::NoCycle);
}
