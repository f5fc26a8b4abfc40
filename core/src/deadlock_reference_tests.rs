//! Tests of deadlock detection: named scenarios, then a property test comparing
//! [`closes_cycle`] over [`Lock::blockers`] with a brute-force reading of SPEC.md on random
//! systems of several locks.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use super::*;
use crate::{Acquired, Event, FenceCounter, HoldOptions, Millis, Request, Step};

/// Several keys of one server, with one clock, one fencing counter and one waiter-id counter,
/// driven through the public [`Lock`] API only.
#[derive(Clone)]
struct System {
    locks: Vec<Lock>,
    fences: FenceCounter,
    now: Millis,
    next_id: u64,
}

impl System {
    fn new(keys: usize) -> Self {
        System {
            locks: vec![Lock::new(); keys],
            fences: FenceCounter::default(),
            now: 1_000,
            next_id: 1,
        }
    }

    fn run<R>(&mut self, key: usize, f: impl FnOnce(&mut Lock, &mut Step<'_>) -> R) -> R {
        let mut events: Vec<Event> = Vec::new();
        let mut step = Step {
            now: self.now,
            fences: &mut self.fences,
            events: &mut events,
            refuse: None,
        };
        f(&mut self.locks[key], &mut step)
    }

    /// A request, queued under a fresh id when `wait` and not grantable.
    fn request(
        &mut self,
        owner: &[u8],
        key: usize,
        mode: Mode,
        ttl: Millis,
        wait: bool,
        lock_delay: Millis,
    ) -> Acquired {
        let id = WaiterId(self.next_id);
        self.next_id += 1;
        let req = Request {
            owner,
            mode,
            ttl,
            options: HoldOptions {
                user: crate::UNKNOWN_USER,
                bound_to: None,
                lock_delay: if mode == Mode::Write { lock_delay } else { 0 },
            },
            capacity: if mode == Mode::Permit { CAPACITY } else { 0 },
        };
        self.run(key, |l, s| l.request(req, wait.then_some(id), s))
    }

    fn hold(&mut self, owner: &str, key: usize, mode: Mode) {
        let got = self.request(owner.as_bytes(), key, mode, 1_000_000, false, 0);
        assert!(
            matches!(got, Acquired::Granted { .. }),
            "{owner} {key}: {got:?}"
        );
    }

    fn queue(&mut self, owner: &str, key: usize, mode: Mode) {
        let got = self.request(owner.as_bytes(), key, mode, 1_000_000, true, 0);
        assert_eq!(got, Acquired::Queued, "{owner} {key}");
    }

    fn release(&mut self, owner: &[u8], key: usize, all: bool) {
        let _ = self.run(key, |l, s| l.release(owner, all, s));
    }

    fn advance(&mut self, ms: Millis) {
        self.now += ms;
        for key in 0..self.locks.len() {
            self.run(key, |l, s| l.settle(s));
        }
    }

    /// Would this request (with WAIT) queue? Asked on a copy of the key without WAIT: busy.
    fn would_wait(&self, owner: &[u8], key: usize, mode: Mode) -> bool {
        let mut probe = System {
            locks: vec![self.locks[key].clone()],
            ..*self
        };
        probe.request(owner, 0, mode, 1_000, false, 0) == Acquired::Busy
    }

    /// What the Redis side keeps and builds for one check: where each owner is queued, and
    /// one [`WaitView`] per key.
    fn index(&self) -> Index<'_> {
        let mut queued: HashMap<Box<[u8]>, Vec<(usize, WaiterId)>> = HashMap::new();
        for (key, lock) in self.locks.iter().enumerate() {
            for (id, waiter) in lock.queue().iter() {
                queued
                    .entry(waiter.owner.clone())
                    .or_default()
                    .push((key, id));
            }
        }
        Index {
            system: self,
            views: self.locks.iter().map(Lock::wait_view).collect(),
            queued,
        }
    }

    /// What the Redis side does: the blockers of every request `owner` has queued.
    fn waits_for(&self, owner: &[u8]) -> Vec<Blocker> {
        self.index().waits_for(owner)
    }

    /// Would the request be refused? `None` when it would not wait (granted at once, or an
    /// upgrade, which is refused anyway). Asks both with the views and with the full blocker
    /// lists, which must agree.
    fn refused(&self, owner: &[u8], key: usize, mode: Mode) -> Option<bool> {
        if !self.would_wait(owner, key, mode) {
            return None;
        }
        let index = self.index();
        let first = self.locks[key].blockers(owner, mode, None);
        let found = closes_cycle(owner, first.clone(), |x| index.waits_for(x));
        let full = closes_cycle(owner, first, |x| index.waits_for_full(x));
        assert_eq!(found, full, "reduced and full graphs disagree");
        let (backward, _) = searched(self, owner, key, mode);
        assert_eq!(found, backward, "the bounded search disagrees");
        Some(found)
    }

    fn refused_str(&self, owner: &str, key: usize, mode: Mode) -> Option<bool> {
        self.refused(owner.as_bytes(), key, mode)
    }
}

/// The server's side of the bounded search, over the system's keys: every key is offered as
/// possibly held (a superset, as the contention index may be), every queued request found by
/// a look at every queue.
impl crate::WaitGraph for System {
    type Key = usize;

    fn held_by(&mut self, who: crate::Who<'_>, max: usize) -> crate::Listing<usize> {
        let owner = who.owner;
        let held: Vec<usize> = (0..self.locks.len())
            .filter(|k| self.locks[*k].holders().get(owner).is_some())
            .collect();
        crate::Listing::walk(held, max, |_| true)
    }

    fn queued_by(&mut self, who: crate::Who<'_>, max: usize) -> crate::Listing<(usize, WaiterId)> {
        let owner = who.owner;
        let mut out = Vec::new();
        for (k, lock) in self.locks.iter().enumerate() {
            for (id, w) in lock.queue().iter() {
                if *w.owner == *owner && w.mode != Mode::Permit {
                    out.push((k, id));
                }
            }
        }
        crate::Listing::walk(out, max, |_| true)
    }

    fn with_lock<R>(&mut self, key: &usize, f: impl FnOnce(&Lock) -> R) -> Option<R> {
        self.locks.get(*key).map(f)
    }
}

/// The bounded backward search with a budget that never runs out: its verdict, and the
/// visits it made.
fn searched(s: &System, owner: &[u8], key: usize, mode: Mode) -> (bool, usize) {
    let mut copy = s.clone();
    let (verdict, used) = crate::check_request(
        &mut copy,
        crate::Who::new(0, owner),
        mode,
        &key,
        &s.locks[key],
        usize::MAX,
    );
    assert_ne!(verdict, crate::Verdict::Cut);
    (verdict == crate::Verdict::Cycle, used)
}

/// The full blockers of queued waiter `id`: [`Lock::blockers`] with its own owner and mode.
fn waiter_blockers(lock: &Lock, id: WaiterId) -> Vec<Blocker> {
    match lock.queue().iter().find(|(queued, _)| *queued == id) {
        Some((_, w)) => lock.blockers(&w.owner, w.mode, Some(id)),
        None => Vec::new(),
    }
}

/// The Redis side's registry of who is queued where, and the views of one check.
struct Index<'a> {
    system: &'a System,
    views: Vec<WaitView>,
    queued: HashMap<Box<[u8]>, Vec<(usize, WaiterId)>>,
}

impl Index<'_> {
    fn waits_for(&self, owner: &[u8]) -> Vec<Blocker> {
        let mut out = Vec::new();
        for &(key, id) in self.queued.get(owner).into_iter().flatten() {
            out.extend_from_slice(self.views[key].blockers_of(id));
        }
        out
    }

    /// The same with the full blocker lists ([`Lock::blockers`] per waiter).
    fn waits_for_full(&self, owner: &[u8]) -> Vec<Blocker> {
        let mut out = Vec::new();
        for &(key, id) in self.queued.get(owner).into_iter().flatten() {
            out.extend(waiter_blockers(&self.system.locks[key], id));
        }
        out
    }
}

fn owners(blockers: &[Blocker]) -> Vec<(String, bool)> {
    let mut v: Vec<(String, bool)> = blockers
        .iter()
        .map(|b| {
            (
                String::from_utf8_lossy(b.owner()).into_owned(),
                b.holds_key(),
            )
        })
        .collect();
    v.sort();
    v
}

fn named(list: &[(&str, bool)]) -> Vec<(String, bool)> {
    let mut v: Vec<(String, bool)> = list.iter().map(|(o, h)| (o.to_string(), *h)).collect();
    v.sort();
    v
}

const W: Mode = Mode::Write;
const R: Mode = Mode::Read;
const P: Mode = Mode::Permit;
/// The capacity of every semaphore in these tests.
const CAPACITY: u32 = 2;

// ---- Named scenarios -------------------------------------------------------------------

/// Two workers move money between two accounts in opposite orders.
#[test]
fn two_workers_two_accounts() {
    let (a, b) = (0, 1);
    let mut s = System::new(2);
    s.hold("w1", a, W);
    s.hold("w2", b, W);
    s.queue("w1", b, W);
    assert_eq!(s.refused_str("w2", a, W), Some(true));
    // A third worker asking for either account is only waiting.
    assert_eq!(s.refused_str("w3", a, W), Some(false));
    assert_eq!(s.refused_str("w3", b, W), Some(false));
    // Once w1 gives up (timeout), w2 may wait for A.
    let id = s.locks[b].queue().head().map(|(id, _)| id).unwrap();
    s.run(b, |l, st| l.cancel_waiter(id, st));
    assert_eq!(s.refused_str("w2", a, W), Some(false));
}

#[test]
fn three_owners_in_a_ring() {
    let mut s = System::new(3);
    s.hold("x1", 0, W);
    s.hold("x2", 1, W);
    s.hold("x3", 2, W);
    s.queue("x1", 1, W); // x1 -> x2
    assert_eq!(s.refused_str("x3", 0, W), Some(false)); // x3 -> x1 -> x2: no way back to x3
    s.queue("x2", 2, W); // x2 -> x3
    assert_eq!(s.refused_str("x3", 0, W), Some(true)); // x3 -> x1 -> x2 -> x3
    assert_eq!(s.refused_str("x3", 0, R), Some(true));
}

/// A chain of waits that does not come back is never refused; joining it closes a cycle
/// exactly when a link asks for a key held further up the chain.
#[test]
fn chain_without_cycle() {
    let names = ["c0", "c1", "c2", "c3"];
    let mut s = System::new(4);
    for (i, o) in names.iter().enumerate() {
        s.hold(o, i, W);
    }
    s.queue("c0", 1, W); // c0 -> c1
    s.queue("c1", 2, R); // c1 -> c2
    s.queue("c2", 3, W); // c2 -> c3
    for key in 0..4 {
        for mode in [W, R] {
            assert_eq!(s.refused_str("new", key, mode), Some(false), "new on {key}");
            for (i, who) in names.iter().enumerate() {
                if i == key {
                    continue; // a re-entry
                }
                let want = Some(key < i);
                assert_eq!(
                    s.refused_str(who, key, mode),
                    want,
                    "{who} on {key} ({mode:?})"
                );
            }
        }
    }
}

/// Readers holding a key together do not wait for each other; a writer waiting for them is
/// part of a cycle when one of them waits for it.
#[test]
fn readers_sharing_a_key() {
    let mut s = System::new(2);
    s.hold("r1", 0, R);
    s.hold("r2", 0, R);
    s.hold("w", 1, W);
    s.queue("r1", 1, R); // r1 -> w
    assert_eq!(s.refused_str("r2", 1, R), Some(false)); // r2 -> w, w waits for nobody
    assert_eq!(
        owners(&s.locks[0].blockers(b"w", W, None)),
        named(&[("r1", true), ("r2", true)])
    );
    assert_eq!(s.refused_str("w", 0, W), Some(true)); // w -> r1 -> w
                                                      // Readers asking a key another reader holds are granted at once: nothing to check.
    assert_eq!(s.refused_str("r3", 0, R), None);
}

/// A writer queued behind readers waits for each of them.
#[test]
fn writer_behind_readers() {
    let mut s = System::new(3);
    s.hold("r1", 0, R);
    s.hold("r2", 0, R);
    s.hold("w", 2, W);
    s.queue("w", 0, W);
    let id = s.locks[0].queue().head().map(|(id, _)| id).unwrap();
    assert_eq!(
        owners(&waiter_blockers(&s.locks[0], id)),
        named(&[("r1", true), ("r2", true)])
    );
    // Either reader asking for w's key closes a cycle; a bystander does not.
    assert_eq!(s.refused_str("r1", 2, R), Some(true));
    assert_eq!(s.refused_str("r2", 2, W), Some(true));
    assert_eq!(s.refused_str("r3", 2, W), Some(false));
    // A new reader queues behind the writer (no starvation) and waits for it, not the readers.
    assert_eq!(
        owners(&s.locks[0].blockers(b"r3", R, None)),
        named(&[("w", false)])
    );
}

/// A reader queued behind a queued writer waits for that writer even though the holders
/// (readers) are compatible with it; the cycle goes through the writer to the holder.
#[test]
fn reader_behind_queued_writer() {
    let mut s = System::new(2);
    s.hold("h", 0, R);
    s.queue("w", 0, W); // w -> h
    s.hold("r", 1, W);
    assert_eq!(
        owners(&s.locks[0].blockers(b"r", R, None)),
        named(&[("w", false)])
    );
    assert_eq!(s.refused_str("r", 0, R), Some(false));
    s.queue("h", 1, W); // h -> r, on a key r holds
    assert_eq!(s.refused_str("r", 0, R), Some(true)); // r -> w -> h -> r
}

/// Readers queued one after the other are granted together: the later one does not wait for
/// the earlier one, so what the earlier one's owner waits for elsewhere is not in its path.
#[test]
fn reader_behind_queued_reader_is_not_a_blocker() {
    let mut s = System::new(4);
    s.hold("w", 0, W);
    s.hold("b", 2, W);
    s.hold("o", 3, W);
    s.queue("a", 0, R); // a -> w
    s.queue("b", 0, R); // b -> w (not a: both read)
    s.queue("a", 3, W); // a -> o, on a key o holds
    let ids: Vec<WaiterId> = s.locks[0].queue().iter().map(|(id, _)| id).collect();
    assert_eq!(
        owners(&waiter_blockers(&s.locks[0], ids[1])),
        named(&[("w", true)])
    );
    // o -> b -> w: when w releases, a and b are granted together; no cycle.
    assert_eq!(s.refused_str("o", 2, W), Some(false));
    // A writer between them does make b wait for a, through the writer.
    let mut t = System::new(4);
    t.hold("w", 0, W);
    t.hold("b", 2, W);
    t.hold("o", 3, W);
    t.queue("a", 0, R);
    t.queue("x", 0, W); // x -> w, a
    t.queue("b", 0, R); // b -> w, x
    t.queue("a", 3, W);
    assert_eq!(t.refused_str("o", 2, W), Some(true)); // o -> b -> x -> a -> o
}

/// Someone queued behind a *request* of the requester, on a key it does not hold, does not
/// wait for a key the requester holds: not refused (SPEC: "for a key this request's owner
/// holds"). Once that request is granted, the requester holds the key and the same request is
/// refused.
#[test]
fn queued_request_of_requester_does_not_close_the_cycle() {
    let mut s = System::new(2);
    s.hold("h", 1, W);
    s.queue("o", 1, W); // o -> h
    s.hold("z", 0, W);
    s.queue("z", 1, W); // z -> h, and z -> o (queued ahead, o does not hold key 1)
    let z_id = s.locks[1].queue().iter().map(|(id, _)| id).last().unwrap();
    assert_eq!(
        owners(&waiter_blockers(&s.locks[1], z_id)),
        named(&[("h", true), ("o", false)])
    );
    assert_eq!(s.refused_str("o", 0, W), Some(false));
    s.release(b"h", 1, false); // o is granted key 1
    assert_eq!(
        owners(&waiter_blockers(&s.locks[1], z_id)),
        named(&[("o", true)])
    );
    assert_eq!(s.refused_str("o", 0, W), Some(true));
}

/// An owner queued on several keys at once waits for all their blockers.
#[test]
fn owner_waiting_on_several_keys() {
    let mut s = System::new(3);
    s.hold("x", 0, W);
    s.hold("y", 1, R);
    s.hold("z", 2, W);
    s.queue("x", 1, W); // x -> y
    s.queue("x", 2, R); // x -> z
    assert_eq!(
        owners(&s.waits_for(b"x")),
        named(&[("y", true), ("z", true)])
    );
    assert_eq!(s.refused_str("y", 0, R), Some(true));
    assert_eq!(s.refused_str("z", 0, W), Some(true));
    assert_eq!(s.refused_str("q", 0, W), Some(false));
}

/// The owner's own hold and own queued requests are never its blockers; an owner both
/// holding and queued ahead is listed once.
#[test]
fn blockers_exclude_self_and_list_each_owner_once() {
    let mut s = System::new(1);
    s.hold("h", 0, W);
    s.queue("o", 0, W);
    s.queue("x", 0, R);
    s.queue("o", 0, W);
    s.release(b"h", 0, false); // o is granted; queue: x (read), o (write)
    assert_eq!(s.locks[0].holders().get(b"o").map(|h| h.mode), Some(W));
    assert_eq!(
        owners(&s.locks[0].blockers(b"y", W, None)),
        named(&[("o", true), ("x", false)])
    );
    let ids: Vec<WaiterId> = s.locks[0].queue().iter().map(|(id, _)| id).collect();
    assert_eq!(
        owners(&waiter_blockers(&s.locks[0], ids[0])),
        named(&[("o", true)])
    );
    assert_eq!(
        owners(&waiter_blockers(&s.locks[0], ids[1])),
        named(&[("x", false)])
    );
    assert!(waiter_blockers(&s.locks[0], WaiterId(999)).is_empty());
}

/// An owner that holds a key and has a request queued on it (here an upgrade that got queued
/// before its read was granted) is flagged as holding it, also when it blocks as a request.
#[test]
fn queued_holder_is_flagged_as_holding() {
    let mut s = System::new(1);
    s.hold("h", 0, W);
    s.queue("o", 0, R);
    s.queue("o", 0, W);
    s.release(b"h", 0, false); // o reads; its write stays queued behind its own read
    assert_eq!(s.locks[0].holders().get(b"o").map(|h| h.mode), Some(R));
    assert_eq!(
        owners(&s.locks[0].blockers(b"c", R, None)),
        named(&[("o", true)])
    );
}

/// Waiters kept out by a lock-delay wait for time, not for an owner.
#[test]
fn lock_delay_blocks_nobody() {
    let mut s = System::new(1);
    let got = s.request(b"h", 0, W, 10, false, 500);
    assert!(matches!(got, Acquired::Granted { .. }));
    s.advance(20);
    assert!(s.locks[0].delay_until() > s.now);
    s.queue("w", 0, W);
    let id = s.locks[0].queue().head().map(|(id, _)| id).unwrap();
    assert!(waiter_blockers(&s.locks[0], id).is_empty());
    assert_eq!(
        owners(&s.locks[0].blockers(b"x", R, None)),
        named(&[("w", false)])
    );
    assert_eq!(s.refused_str("x", 0, R), Some(false));
}

/// Semaphore waits are not part of detection: a permit request has no blockers and never
/// makes its owner wait for anyone.
#[test]
fn semaphore_waits_are_not_edges() {
    let mut s = System::new(2);
    s.hold("a", 0, W);
    s.hold("b", 1, P);
    s.hold("c", 1, P);
    s.queue("a", 1, P); // a waits for a permit that b and c hold
    assert!(s.locks[1].blockers(b"x", P, None).is_empty());
    let id = s.locks[1].queue().head().map(|(id, _)| id).unwrap();
    assert!(waiter_blockers(&s.locks[1], id).is_empty());
    assert!(s.waits_for(b"a").is_empty());
    assert_eq!(s.refused_str("b", 0, W), Some(false));
    // A lock request on a semaphore key is refused for its kind; nothing to check.
    assert_eq!(s.refused_str("x", 1, W), None);
}

/// A long queue of writers: the view stays linear (each writer lists the one ahead), and a
/// cycle that runs through the whole queue is still found.
#[test]
fn long_queue_view_is_linear() {
    let n = 1_000;
    let mut s = System::new(3);
    s.hold("o", 1, W);
    s.hold("h", 0, W);
    s.queue("w0", 0, W);
    s.queue("w0", 1, W); // w0 -> o, on a key o holds
    for i in 1..n {
        s.queue(&format!("w{i}"), 0, W);
    }
    s.hold("x", 2, W);
    s.queue("x", 0, W); // x -> every writer ahead, the view lists only the last
    let view = s.locks[0].wait_view();
    assert!(view.len() <= n + 2, "{}", view.len());
    let last = s.locks[0].queue().iter().map(|(id, _)| id).last().unwrap();
    assert_eq!(
        owners(view.blockers_of(last)),
        named(&[(&format!("w{}", n - 1), false)])
    );
    assert_eq!(s.refused_str("o", 2, W), Some(true)); // o -> x -> w999 -> ... -> w0 -> o
    assert_eq!(s.refused_str("y", 2, W), Some(false));
}

/// A long chain is walked without recursion, each owner asked once.
#[test]
fn long_chain_and_each_owner_asked_once() {
    let n = 200_000u32;
    let name = |i: u32| i.to_le_bytes().to_vec();
    let mut asked: HashSet<Vec<u8>> = HashSet::new();
    let mut calls = 0usize;
    let found = closes_cycle(b"req", vec![Blocker::new(&name(0), true)], |x| {
        calls += 1;
        assert!(asked.insert(x.to_vec()), "asked twice");
        let i = u32::from_le_bytes(x.try_into().unwrap());
        if i + 1 == n {
            // The last one waits for the requester, once as a request, then as a holder.
            vec![Blocker::new(b"req", false), Blocker::new(b"req", true)]
        } else {
            // And everybody waits for the start again, which is already visited.
            vec![
                Blocker::new(&name(i + 1), true),
                Blocker::new(&name(0), true),
            ]
        }
    });
    assert!(found);
    assert_eq!(calls, n as usize);
    // Without the last edge: the whole graph is walked, once per owner, and nothing found.
    let mut calls = 0usize;
    let found = closes_cycle(b"req", vec![Blocker::new(&name(0), true)], |x| {
        calls += 1;
        let Ok(bytes) = x.try_into() else {
            return Vec::new(); // the requester: it waits for nobody here
        };
        let i = u32::from_le_bytes(bytes);
        if i + 1 == n {
            vec![Blocker::new(b"req", false)]
        } else {
            vec![
                Blocker::new(&name(i + 1), false),
                Blocker::new(&name(0), true),
            ]
        }
    });
    assert!(!found);
    // Everybody once, and the requester (reached through a queued request) once.
    assert_eq!(calls, n as usize + 1);
}

// ---- Property test against a brute-force reading of SPEC.md -------------------------------

const KEYS: u8 = 4;
const OWNERS: u8 = 5;
const N: usize = OWNERS as usize;

#[derive(Clone, Debug)]
enum SysOp {
    Acquire {
        owner: u8,
        key: u8,
        mode: Mode,
        ttl: Millis,
        wait: bool,
        lock_delay: Millis,
    },
    Release {
        owner: u8,
        key: u8,
        all: bool,
    },
    /// Time passes; every lock's timer fires.
    Advance {
        ms: Millis,
    },
    /// The n-th (modulo) waiter of a key times out.
    Cancel {
        key: u8,
        nth: usize,
    },
}

fn owner_name(i: u8) -> [u8; 2] {
    [b'o', b'0' + i]
}

fn owner_index(name: &[u8]) -> usize {
    usize::from(name[1] - b'0')
}

fn sys_op() -> impl Strategy<Value = SysOp> {
    let mode = prop_oneof![4 => Just(W), 4 => Just(R), 1 => Just(P)];
    let lock_delay = prop_oneof![6 => Just(0), 1 => 1..50u64];
    prop_oneof![
        8 => (0..OWNERS, 0..KEYS, mode, 20..400u64, prop::bool::weighted(0.8), lock_delay)
            .prop_map(|(owner, key, mode, ttl, wait, lock_delay)| SysOp::Acquire {
                owner, key, mode, ttl, wait, lock_delay,
            }),
        3 => (0..OWNERS, 0..KEYS, prop::bool::weighted(0.3))
            .prop_map(|(owner, key, all)| SysOp::Release { owner, key, all }),
        1 => (0..80u64).prop_map(|ms| SysOp::Advance { ms }),
        1 => (0..KEYS, any::<usize>()).prop_map(|(key, nth)| SysOp::Cancel { key, nth }),
    ]
}

fn build(ops: &[SysOp]) -> System {
    let mut s = System::new(usize::from(KEYS));
    for op in ops {
        match *op {
            SysOp::Acquire {
                owner,
                key,
                mode,
                ttl,
                wait,
                lock_delay,
            } => {
                s.request(&owner_name(owner), key.into(), mode, ttl, wait, lock_delay);
            }
            SysOp::Release { owner, key, all } => s.release(&owner_name(owner), key.into(), all),
            SysOp::Advance { ms } => s.advance(ms),
            SysOp::Cancel { key, nth } => {
                let key = usize::from(key);
                let ids: Vec<WaiterId> = s.locks[key].queue().iter().map(|(id, _)| id).collect();
                if !ids.is_empty() {
                    let id = ids[nth % ids.len()];
                    s.run(key, |l, st| l.cancel_waiter(id, st));
                }
            }
        }
    }
    s
}

/// SPEC.md, plainly: the owners a request of owner `x` in `mode` on this lock would wait for,
/// each with whether it holds the key. Every holder and every queued request is looked at
/// one by one.
fn brute_waits_on(
    lock: &Lock,
    x: usize,
    mode: Mode,
    ahead_of: Option<WaiterId>,
) -> Vec<(usize, bool)> {
    // Locks only: semaphore waits are not part of detection.
    let conflict = |a: Mode, b: Mode| matches!((a, b), (W, W) | (W, R) | (R, W));
    let mut out = Vec::new();
    for (o, h) in lock.holders().iter() {
        let y = owner_index(o);
        let conflicting = conflict(h.mode, mode);
        if y != x && conflicting && !out.contains(&(y, true)) {
            out.push((y, true));
        }
    }
    for (id, w) in lock.queue().iter() {
        let ahead = match ahead_of {
            None => true,
            Some(mine) => id < mine,
        };
        let y = owner_index(&w.owner);
        let holds = lock.holders().get(&w.owner).is_some();
        let conflicting = conflict(w.mode, mode);
        if ahead && y != x && conflicting && !out.contains(&(y, holds)) {
            out.push((y, holds));
        }
    }
    out.sort();
    out
}

/// The explicit wait-for graph of the system: `edge[x][y]` when a queued request of `x`
/// waits for `y`, `onto_hold[x][y]` when it does so on a key `y` holds.
struct Graph {
    edge: [[bool; N]; N],
    onto_hold: [[bool; N]; N],
}

fn brute_graph(s: &System) -> Graph {
    let mut g = Graph {
        edge: [[false; N]; N],
        onto_hold: [[false; N]; N],
    };
    for lock in &s.locks {
        for (id, w) in lock.queue().iter() {
            let x = owner_index(&w.owner);
            for (y, holds) in brute_waits_on(lock, x, w.mode, Some(id)) {
                g.edge[x][y] = true;
                if holds {
                    g.onto_hold[x][y] = true;
                }
            }
        }
    }
    g
}

/// All-pairs shortest path lengths (Floyd-Warshall); `usize::MAX` when unreachable.
#[allow(clippy::needless_range_loop)] // indices are owners: plainer this way
fn distances(g: &Graph) -> [[usize; N]; N] {
    let mut d = [[usize::MAX; N]; N];
    for (x, row) in d.iter_mut().enumerate() {
        row[x] = 0;
        for y in 0..N {
            if g.edge[x][y] && x != y {
                row[y] = 1;
            }
        }
    }
    for k in 0..N {
        for i in 0..N {
            for j in 0..N {
                if d[i][k] != usize::MAX && d[k][j] != usize::MAX && d[i][k] + d[k][j] < d[i][j] {
                    d[i][j] = d[i][k] + d[k][j];
                }
            }
        }
    }
    d
}

/// The shortest cycle the request would close (its length in edges), by brute force: from
/// one of the blockers `first` to some `x` that waits for `o` on a key `o` holds.
#[allow(clippy::needless_range_loop)] // indices are owners: plainer this way
fn brute_cycle(g: &Graph, d: &[[usize; N]; N], o: usize, first: &[(usize, bool)]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for &(b, _) in first {
        for x in 0..N {
            if g.onto_hold[x][o] && d[b][x] != usize::MAX {
                let len = d[b][x] + 2;
                best = Some(best.map_or(len, |l: usize| l.min(len)));
            }
        }
    }
    best
}

fn indexed(blockers: &[Blocker]) -> Vec<(usize, bool)> {
    let mut v: Vec<(usize, bool)> = blockers
        .iter()
        .map(|b| (owner_index(b.owner()), b.holds_key()))
        .collect();
    v.sort();
    v
}

/// What the random systems covered.
#[derive(Debug, Default)]
struct Stats {
    queries: usize,
    refused: usize,
    two_cycles: usize,
    longer_cycles: usize,
    refused_readers: usize,
    writer_behind_readers: usize,
    reader_behind_queued_writer: usize,
    reader_behind_queued_reader: usize,
    waiting_on_several_keys: usize,
}

fn check_system(ops: &[SysOp], stats: &mut Stats) -> Result<(), String> {
    let s = build(ops);
    let g = brute_graph(&s);
    let d = distances(&g);
    // Every queued request's blockers, and what the states look like.
    let mut keys_waited: [HashSet<usize>; N] = Default::default();
    for (k, lock) in s.locks.iter().enumerate() {
        let mut writer_queued = false;
        let mut last_reader = false;
        for (id, w) in lock.queue().iter() {
            let x = owner_index(&w.owner);
            keys_waited[x].insert(k);
            let want = brute_waits_on(lock, x, w.mode, Some(id));
            let got = indexed(&waiter_blockers(lock, id));
            if got != want {
                return Err(format!(
                    "waiter {id:?} on key {k}: {got:?} vs brute {want:?}"
                ));
            }
            // The view lists some of them (the reduction), each with the same flag.
            let reduced = indexed(lock.wait_view().blockers_of(id));
            if reduced.iter().any(|b| !want.contains(b)) {
                return Err(format!(
                    "waiter {id:?} on key {k}: view {reduced:?} not within {want:?}"
                ));
            }
            match w.mode {
                Mode::Write if lock.mode() == Some(Mode::Read) => stats.writer_behind_readers += 1,
                Mode::Read if writer_queued => stats.reader_behind_queued_writer += 1,
                Mode::Read if last_reader => stats.reader_behind_queued_reader += 1,
                _ => {}
            }
            writer_queued |= w.mode == Mode::Write;
            last_reader = w.mode == Mode::Read;
        }
    }
    stats.waiting_on_several_keys += keys_waited.iter().filter(|k| k.len() > 1).count();
    let index = s.index();
    for lock in &s.locks {
        let bound = lock.holders().len() + 2 * lock.queue().len();
        if lock.wait_view().len() > bound {
            return Err(format!("view of {} edges", lock.wait_view().len()));
        }
    }
    for o in 0..OWNERS {
        for k in 0..usize::from(KEYS) {
            for mode in [W, R, P] {
                let name = owner_name(o);
                if !s.would_wait(&name, k, mode) {
                    continue; // granted at once, or refused for another reason
                }
                let first = brute_waits_on(&s.locks[k], o.into(), mode, None);
                let blockers = s.locks[k].blockers(&name, mode, None);
                if indexed(&blockers) != first {
                    return Err(format!(
                        "o{o} {mode:?} on {k}: {blockers:?} vs brute {first:?}"
                    ));
                }
                let want = brute_cycle(&g, &d, o.into(), &first);
                let got = closes_cycle(&name, blockers.clone(), |x| index.waits_for(x));
                let full = closes_cycle(&name, blockers, |x| index.waits_for_full(x));
                if got != want.is_some() || full != want.is_some() {
                    return Err(format!(
                        "o{o} {mode:?} on key {k}: closes_cycle {got} (full lists: {full}), \
                         brute force {want:?}"
                    ));
                }
                // The server's bounded backward search: the same answer with room enough, and
                // with any smaller budget either the same answer or a cut, never the other one.
                let (backward, used) = searched(&s, &name, k, mode);
                if backward != want.is_some() {
                    return Err(format!(
                        "o{o} {mode:?} on key {k}: bounded search {backward}, brute force {want:?}"
                    ));
                }
                for budget in [0, used / 2, used.saturating_sub(1), used] {
                    let mut copy = s.clone();
                    let (verdict, spent) = crate::check_request(
                        &mut copy,
                        crate::Who::new(0, &name),
                        mode,
                        &k,
                        &s.locks[k],
                        budget,
                    );
                    let expected = if budget >= used {
                        if backward {
                            crate::Verdict::Cycle
                        } else {
                            crate::Verdict::NoCycle
                        }
                    } else {
                        crate::Verdict::Cut
                    };
                    if verdict != expected || spent > budget {
                        return Err(format!(
                            "o{o} {mode:?} on key {k}: budget {budget} of {used}: {verdict:?} \
                             after {spent} visits"
                        ));
                    }
                }
                stats.queries += 1;
                if let Some(len) = want {
                    stats.refused += 1;
                    if len == 2 {
                        stats.two_cycles += 1;
                    } else {
                        stats.longer_cycles += 1;
                    }
                    if mode == Mode::Read {
                        stats.refused_readers += 1;
                    }
                }
            }
        }
    }
    Ok(())
}

fn ops() -> impl Strategy<Value = Vec<SysOp>> {
    prop::collection::vec(sys_op(), 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4_000, ..ProptestConfig::default() })]

    #[test]
    fn closes_cycle_matches_brute_force(ops in ops()) {
        if let Err(e) = check_system(&ops, &mut Stats::default()) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// The random systems reach the cases that matter, often enough to trust the property test.
#[test]
fn random_systems_cover_the_cases() {
    let mut runner = TestRunner::deterministic();
    let mut stats = Stats::default();
    for _ in 0..2_000 {
        let ops = ops().new_tree(&mut runner).unwrap().current();
        check_system(&ops, &mut stats).unwrap();
    }
    println!("{stats:?}");
    assert!(stats.queries > 10_000, "{stats:?}");
    assert!(stats.refused * 20 > stats.queries, "{stats:?}");
    assert!(stats.refused * 2 < stats.queries, "{stats:?}");
    assert!(stats.two_cycles > 500, "{stats:?}");
    assert!(stats.longer_cycles > 100, "{stats:?}");
    assert!(stats.refused_readers > 100, "{stats:?}");
    assert!(stats.writer_behind_readers > 100, "{stats:?}");
    assert!(stats.reader_behind_queued_writer > 100, "{stats:?}");
    assert!(stats.reader_behind_queued_reader > 100, "{stats:?}");
    assert!(stats.waiting_on_several_keys > 100, "{stats:?}");
}
