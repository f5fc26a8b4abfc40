//! The bounded search's cost: what it visits and what it never does (the comparison with the
//! brute-force reading of SPEC.md is in `deadlock_tests.rs`, which runs both on random systems).

use super::*;
use crate::{Acquired, FenceCounter, HoldOptions, Request, Step};

/// Keys by number, with a count of how often each is read, and an index of who holds what
/// (as the server's contention index: only keys with waiters).
struct Keys {
    locks: Vec<Lock>,
    fences: FenceCounter,
    next_id: u64,
    held_lookups: usize,
}

impl Keys {
    fn new(n: usize) -> Self {
        Keys {
            locks: vec![Lock::new(); n],
            fences: FenceCounter::default(),
            next_id: 1,
            held_lookups: 0,
        }
    }

    fn request(&mut self, owner: &str, key: usize, mode: Mode, wait: bool) -> Acquired {
        let id = WaiterId(self.next_id);
        self.next_id += 1;
        let mut events = Vec::new();
        let mut step = Step {
            now: 1_000,
            fences: &mut self.fences,
            events: &mut events,
        };
        let req = Request {
            owner: owner.as_bytes(),
            mode,
            ttl: 1_000_000,
            options: HoldOptions::default(),
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
        }
    }
}

impl WaitGraph for Keys {
    type Key = usize;

    fn held_by(&mut self, owner: &[u8], max: usize) -> Vec<usize> {
        self.held_lookups += 1;
        (0..self.locks.len())
            .filter(|k| {
                !self.locks[*k].queue().is_empty() && self.locks[*k].holders().get(owner).is_some()
            })
            .take(max)
            .collect()
    }

    fn queued_by(&mut self, owner: &[u8], max: usize) -> Vec<(usize, WaiterId)> {
        let mut out = Vec::new();
        for (k, lock) in self.locks.iter().enumerate() {
            for (id, w) in lock.queue().iter() {
                if *w.owner == *owner {
                    out.push((k, id));
                }
            }
        }
        out.truncate(max);
        out
    }

    fn with_lock<R>(&mut self, key: &usize, f: impl FnOnce(&Lock) -> R) -> Option<R> {
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
    let (verdict, used) =
        check_request(&mut keys.clone_graph(), b"o", W, &0, &keys.locks[0], 1_000);
    assert_eq!(verdict, Verdict::NoCycle);
    assert!(used < 20, "{used} visits");
    // The writer waits for o: now the request would close a cycle, found as cheaply.
    keys.queue("writer", 1, W);
    let (verdict, used) =
        check_request(&mut keys.clone_graph(), b"o", W, &0, &keys.locks[0], 1_000);
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
        b"o",
        W,
        &0,
        &keys.locks[0],
        usize::MAX,
    );
    assert_eq!(verdict, Verdict::Cycle);
    assert!(used >= n && used <= 6 * n, "{used} visits");
    for budget in [0, 1, 100, used - 1] {
        let (verdict, spent) =
            check_request(&mut keys.clone_graph(), b"o", W, &0, &keys.locks[0], budget);
        assert_eq!(verdict, Verdict::Cut, "budget {budget}");
        assert!(spent <= budget);
    }
    assert_eq!(
        check_request(&mut keys.clone_graph(), b"o", W, &0, &keys.locks[0], used).0,
        Verdict::Cycle
    );
    // Another requester holding nothing anyone waits for: no walk.
    let (verdict, used) = check_request(
        &mut keys.clone_graph(),
        b"p",
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
        b"o",
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
            b"o",
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
            owner.as_bytes(),
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
