//! Scenario tests of the lock core, one rule each.

use super::*;

/// A lock with its own clock, fencing counter and event log, to keep tests short.
struct Bench {
    lock: Lock,
    fences: FenceCounter,
    events: Vec<Event>,
    now: Millis,
}

impl Bench {
    fn new() -> Self {
        Bench {
            lock: Lock::new(),
            fences: FenceCounter::default(),
            events: Vec::new(),
            now: 1_000,
        }
    }

    fn run<R>(&mut self, f: impl FnOnce(&mut Lock, &mut Step<'_>) -> R) -> R {
        let mut step = Step {
            now: self.now,
            fences: &mut self.fences,
            events: &mut self.events,
            refuse: None,
        };
        f(&mut self.lock, &mut step)
    }

    fn acquire(&mut self, owner: &str, mode: Mode, ttl: Millis, wait: Option<u64>) -> Acquired {
        self.run(|l, s| l.acquire(owner.as_bytes(), mode, ttl, wait.map(WaiterId), s))
    }

    fn write(&mut self, owner: &str) -> Acquired {
        self.acquire(owner, Mode::Write, 10_000, None)
    }

    fn read(&mut self, owner: &str) -> Acquired {
        self.acquire(owner, Mode::Read, 10_000, None)
    }

    fn release(&mut self, owner: &str) -> Result<u64, NotOwner> {
        self.run(|l, s| l.release(owner.as_bytes(), false, s))
    }

    /// Grants and expiries since the last call (direct updates left out).
    fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
            .into_iter()
            .filter(|e| {
                !matches!(
                    e,
                    Event::Updated { .. } | Event::BoundEnded { .. } | Event::HoldEnded { .. }
                )
            })
            .collect()
    }

    fn granted_ids(&mut self) -> Vec<u64> {
        self.take_events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Granted { waiter, .. } => Some(waiter.0),
                _ => None,
            })
            .collect()
    }

    fn count(&self, owner: &str) -> Option<u64> {
        self.lock.holders().get(owner.as_bytes()).map(|h| h.count)
    }

    /// An acquire with options (`BIND`, `LOCKDELAY`).
    fn request(
        &mut self,
        owner: &str,
        mode: Mode,
        ttl: Millis,
        wait: Option<u64>,
        options: HoldOptions,
    ) -> Acquired {
        let req = Request {
            owner: owner.as_bytes(),
            mode,
            ttl,
            options,
            capacity: 0,
        };
        self.run(|l, s| l.request(req, wait.map(WaiterId), s))
    }

    /// One permit of a semaphore of `capacity`.
    fn permit(&mut self, owner: &str, capacity: u32, ttl: Millis, wait: Option<u64>) -> Acquired {
        let req = Request {
            owner: owner.as_bytes(),
            mode: Mode::Permit,
            ttl,
            options: HoldOptions::default(),
            capacity,
        };
        self.run(|l, s| l.request(req, wait.map(WaiterId), s))
    }

    fn options(&self, owner: &str) -> Option<HoldOptions> {
        self.lock
            .holders()
            .get(owner.as_bytes())
            .map(|h| h.options.get())
    }

    /// The clock reaches `t` and the expiry timer fires.
    fn tick_at(&mut self, t: Millis) {
        self.now = t;
        self.run(|l, s| l.expire(s));
    }

    /// Connection `conn` closes.
    fn disconnect(&mut self, conn: u64) -> usize {
        self.run(|l, s| l.end_bound(|c| c == conn, s))
    }
}

fn opts(bound_to: Option<u64>, lock_delay: Millis) -> HoldOptions {
    HoldOptions {
        user: crate::UNKNOWN_USER,
        bound_to,
        lock_delay,
    }
}

fn granted(waiter: u64, owner: &str, events: &[Event]) -> bool {
    events.iter().any(|e| {
        matches!(e, Event::Granted { waiter: WaiterId(w), owner: o, .. }
            if *w == waiter && **o == *owner.as_bytes())
    })
}

fn token(a: Acquired) -> u64 {
    match a {
        Acquired::Granted { token, .. } => token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn free_lock_is_granted_with_token_one() {
    let mut b = Bench::new();
    assert_eq!(b.write("a"), Acquired::Granted { token: 1, count: 1 });
    assert_eq!(b.lock.mode(), Some(Mode::Write));
    assert_eq!(b.lock.fence(), 1);
    assert_eq!(b.lock.last_expiry(), Some(11_000));
}

#[test]
fn held_lock_without_wait_is_busy_and_unchanged() {
    let mut b = Bench::new();
    b.write("a");
    assert_eq!(b.write("b"), Acquired::Busy);
    assert_eq!(b.read("b"), Acquired::Busy);
    assert_eq!(b.lock.holders().len(), 1);
    assert!(b.lock.queue().is_empty());
}

#[test]
fn reentrant_acquire_counts_and_keeps_token() {
    let mut b = Bench::new();
    let t = token(b.write("a"));
    b.now += 500;
    assert_eq!(b.write("a"), Acquired::Granted { token: t, count: 2 });
    assert_eq!(b.lock.last_expiry(), Some(b.now + 10_000));
    assert_eq!(b.release("a"), Ok(1));
    assert_eq!(b.release("a"), Ok(0));
    assert!(b.lock.is_empty());
    assert_eq!(b.release("a"), Err(NotOwner));
}

#[test]
fn release_all_drops_every_hold() {
    let mut b = Bench::new();
    b.write("a");
    b.write("a");
    b.write("a");
    assert_eq!(b.run(|l, s| l.release(b"a", true, s)), Ok(0));
    assert!(b.lock.holders().is_empty());
}

#[test]
fn waiters_are_granted_in_arrival_order() {
    let mut b = Bench::new();
    b.write("holder");
    for i in 1..=12 {
        let owner = format!("w{i}");
        assert_eq!(
            b.acquire(&owner, Mode::Write, 1_000, Some(i)),
            Acquired::Queued
        );
    }
    let mut order = Vec::new();
    let mut current = "holder".to_string();
    for _ in 0..12 {
        b.release(&current).unwrap();
        let events = b.take_events();
        assert_eq!(events.len(), 1, "exactly one writer is granted per release");
        match &events[0] {
            Event::Granted { waiter, owner, .. } => {
                order.push(waiter.0);
                current = String::from_utf8(owner.to_vec()).unwrap();
            }
            e => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(order, (1..=12).collect::<Vec<_>>());
}

#[test]
fn newcomer_does_not_overtake_the_queue() {
    let mut b = Bench::new();
    b.write("a");
    b.acquire("w", Mode::Write, 1_000, Some(1));
    b.release("a").unwrap();
    assert_eq!(b.granted_ids(), vec![1]);
    // "w" holds now; a newcomer must queue behind nobody but still be refused.
    assert_eq!(b.write("x"), Acquired::Busy);
}

#[test]
fn tokens_strictly_increase_across_grants_and_expiry() {
    let mut b = Bench::new();
    let t1 = token(b.write("a"));
    b.release("a").unwrap();
    let t2 = token(b.write("b"));
    b.now += 20_000;
    let t3 = token(b.write("c"));
    assert!(t1 < t2 && t2 < t3, "{t1} {t2} {t3}");
    assert!(matches!(b.take_events()[..], [Event::Expired { .. }]));
}

#[test]
fn expiry_hands_over_to_the_head_waiter() {
    let mut b = Bench::new();
    b.acquire("a", Mode::Write, 100, None);
    b.acquire("w", Mode::Write, 5_000, Some(7));
    b.now += 99;
    b.run(|l, s| l.expire(s));
    assert!(b.take_events().is_empty(), "not due yet");
    b.now += 1;
    b.run(|l, s| l.expire(s));
    let events = b.take_events();
    assert_eq!(events.len(), 2);
    assert!(matches!(&events[0], Event::Expired { owner, .. } if &**owner == b"a"));
    assert!(
        matches!(&events[1], Event::Granted { waiter: WaiterId(7), expires_at, .. } if *expires_at == b.now + 5_000)
    );
    assert_eq!(b.count("w"), Some(1));
}

#[test]
fn expired_holder_is_not_owner() {
    let mut b = Bench::new();
    b.acquire("a", Mode::Write, 100, None);
    b.now += 100;
    assert_eq!(b.release("a"), Err(NotOwner));
    assert_eq!(b.run(|l, s| l.extend(b"a", 100, s)), Err(NotOwner));
}

#[test]
fn extend_moves_the_expiry_only() {
    let mut b = Bench::new();
    b.write("a");
    b.write("a");
    b.now += 5;
    assert_eq!(b.run(|l, s| l.extend(b"a", 50, s)), Ok(b.now + 50));
    assert_eq!(b.count("a"), Some(2));
    assert_eq!(b.lock.next_expiry(), Some(b.now + 50));
}

#[test]
fn cancelled_waiter_leaves_and_the_next_is_served() {
    let mut b = Bench::new();
    b.write("a");
    b.acquire("w1", Mode::Write, 1_000, Some(1));
    b.acquire("w2", Mode::Write, 1_000, Some(2));
    assert!(b.run(|l, s| l.cancel_waiter(WaiterId(1), s)).is_some());
    assert!(b.run(|l, s| l.cancel_waiter(WaiterId(1), s)).is_none());
    b.release("a").unwrap();
    assert_eq!(b.granted_ids(), vec![2]);
}

#[test]
fn reader_upgrade_is_a_deadlock_and_changes_nothing() {
    let mut b = Bench::new();
    b.read("r");
    assert_eq!(b.acquire("r", Mode::Write, 10, Some(1)), Acquired::Deadlock);
    assert_eq!(b.count("r"), Some(1));
    assert!(b.lock.queue().is_empty());
}

#[test]
fn readers_share_and_writer_waits_for_all() {
    let mut b = Bench::new();
    let t1 = token(b.read("r1"));
    let t2 = token(b.read("r2"));
    assert!(t2 > t1);
    assert_eq!(
        b.acquire("w", Mode::Write, 1_000, Some(1)),
        Acquired::Queued
    );
    b.release("r1").unwrap();
    assert!(b.granted_ids().is_empty());
    b.release("r2").unwrap();
    assert_eq!(b.granted_ids(), vec![1]);
}

#[test]
fn queued_writer_blocks_new_readers_but_not_reentering_ones() {
    let mut b = Bench::new();
    b.read("r1");
    b.acquire("w", Mode::Write, 1_000, Some(1));
    assert_eq!(b.read("r2"), Acquired::Busy);
    assert_eq!(
        b.acquire("r2", Mode::Read, 1_000, Some(2)),
        Acquired::Queued
    );
    assert!(matches!(b.read("r1"), Acquired::Granted { count: 2, .. }));
}

#[test]
fn writer_release_grants_the_run_of_readers_up_to_the_next_writer() {
    let mut b = Bench::new();
    b.write("w0");
    b.acquire("r1", Mode::Read, 1_000, Some(1));
    b.acquire("r2", Mode::Read, 1_000, Some(2));
    b.acquire("w3", Mode::Write, 1_000, Some(3));
    b.acquire("r4", Mode::Read, 1_000, Some(4));
    b.release("w0").unwrap();
    assert_eq!(b.granted_ids(), vec![1, 2]);
    assert_eq!(b.lock.queue().len(), 2);
}

#[test]
fn timed_out_head_writer_lets_readers_behind_it_in() {
    let mut b = Bench::new();
    b.read("r0");
    b.acquire("w", Mode::Write, 1_000, Some(1));
    b.acquire("r1", Mode::Read, 1_000, Some(2));
    b.acquire("r2", Mode::Read, 1_000, Some(3));
    b.run(|l, s| l.cancel_waiter(WaiterId(1), s));
    assert_eq!(b.granted_ids(), vec![2, 3]);
}

#[test]
fn exclusive_holder_reading_is_reentrant_and_stays_exclusive() {
    let mut b = Bench::new();
    let t = token(b.write("a"));
    assert_eq!(b.read("a"), Acquired::Granted { token: t, count: 2 });
    assert_eq!(b.lock.mode(), Some(Mode::Write));
    assert_eq!(b.read("b"), Acquired::Busy);
}

#[test]
fn each_reader_expires_alone() {
    let mut b = Bench::new();
    b.acquire("r1", Mode::Read, 100, None);
    b.acquire("r2", Mode::Read, 300, None);
    b.now += 150;
    b.run(|l, s| l.expire(s));
    assert_eq!(b.count("r1"), None);
    assert_eq!(b.count("r2"), Some(1));
    assert_eq!(b.lock.next_expiry(), Some(1_300));
}

#[test]
fn requeued_waiters_keep_their_order_and_are_served() {
    let mut b = Bench::new();
    b.write("a");
    b.acquire("w1", Mode::Write, 1_000, Some(1));
    b.acquire("w2", Mode::Write, 1_000, Some(2));
    let waiters = b.lock.take_waiters();
    // The key was deleted: a fresh lock takes the waiters back.
    b.lock = Lock::new();
    b.run(|l, s| l.requeue(waiters, s));
    assert_eq!(b.granted_ids(), vec![1]);
    assert_eq!(b.lock.queue().len(), 1);
}

#[test]
fn fence_counter_at_its_end_issues_nothing_rather_than_saturating() {
    // Without the legacy setting the end is 2^53 - 1.
    let mut f = FenceCounter::default();
    f.observe(MAX_EXACT_TOKEN - 1);
    assert_eq!(f.issue(), Some(MAX_EXACT_TOKEN));
    assert!(f.exhausted());
    assert_eq!(f.issue(), None);
    assert_eq!(f.issue(), None);
    assert_eq!(f.last(), MAX_EXACT_TOKEN);
    assert!(f.accepts(MAX_EXACT_TOKEN));
    assert!(!f.accepts(MAX_EXACT_TOKEN + 1));
    // With it, 2^63 - 1; an observed larger value never gets past it.
    let mut f = FenceCounter::default();
    f.set_legacy(true);
    assert_eq!(f.end(), MAX_TOKEN);
    f.observe(u64::MAX);
    assert_eq!(f.last(), MAX_TOKEN);
    assert_eq!(f.issue(), None);
    f.observe(u64::MAX);
    assert_eq!(f.last(), MAX_TOKEN);
    // A counter left in the legacy range when the setting goes off issues nothing either.
    let mut f = FenceCounter::default();
    f.set_legacy(true);
    f.observe(MAX_EXACT_TOKEN + 10);
    assert_eq!(f.issue(), Some(MAX_EXACT_TOKEN + 11));
    f.set_legacy(false);
    assert_eq!(f.issue(), None);
    assert_eq!(f.last(), MAX_EXACT_TOKEN + 11);
}

#[test]
fn a_counter_at_its_end_refuses_new_holds_but_not_reentries() {
    let mut b = Bench::new();
    b.fences.observe(MAX_EXACT_TOKEN - 1);
    // The last token goes to o1; o2 is then refused, whatever it asks.
    assert_eq!(
        b.run(|l, s| l.acquire(b"o1", Mode::Read, 100, None, s)),
        Acquired::Granted {
            token: MAX_EXACT_TOKEN,
            count: 1
        }
    );
    assert_eq!(
        b.run(|l, s| l.acquire(b"o2", Mode::Read, 100, None, s)),
        Acquired::Refused(Refusal::TokensExhausted)
    );
    // o1's re-entry keeps its token: nothing new is issued.
    assert_eq!(
        b.run(|l, s| l.acquire(b"o1", Mode::Read, 100, None, s)),
        Acquired::Granted {
            token: MAX_EXACT_TOKEN,
            count: 2
        }
    );
    assert_eq!(b.fences.last(), MAX_EXACT_TOKEN);
    assert_eq!(b.lock.holders().len(), 1);
    // A semaphore on another key: its first permit is refused too.
    let mut sem = Lock::new();
    let req = Request {
        owner: b"p",
        mode: Mode::Permit,
        ttl: 100,
        options: HoldOptions::default(),
        capacity: 2,
    };
    let mut events = Vec::new();
    let mut step = Step {
        now: b.now,
        fences: &mut b.fences,
        events: &mut events,
        refuse: None,
    };
    assert_eq!(
        sem.request(req, None, &mut step),
        Acquired::Refused(Refusal::TokensExhausted)
    );
    assert!(sem.is_empty());
}

fn permit(owner: &'static [u8], capacity: u32) -> Request<'static> {
    Request {
        owner,
        mode: Mode::Permit,
        ttl: 100,
        options: HoldOptions::default(),
        capacity,
    }
}

fn refusals(events: &[Event]) -> Vec<(u64, Refusal)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Refused { waiter, reason } => Some((waiter.0, *reason)),
            _ => None,
        })
        .collect()
}

#[test]
fn waiters_whose_turn_comes_at_the_counters_end_are_refused_in_order() {
    let mut b = Bench::new();
    b.fences.observe(MAX_EXACT_TOKEN - 1);
    b.run(|l, s| l.acquire(b"w", Mode::Write, 100, None, s));
    for (id, owner, mode) in [
        (1, b"o1", Mode::Write),
        (2, b"o2", Mode::Read),
        (3, b"o3", Mode::Read),
    ] {
        assert_eq!(
            b.run(|l, s| l.acquire(owner, mode, 100, Some(WaiterId(id)), s)),
            Acquired::Queued
        );
    }
    b.events.clear();
    // The writer goes: o1's turn, refused; then o2's, refused; then o3's. Nobody is left.
    b.run(|l, s| l.release(b"w", false, s)).unwrap();
    assert_eq!(
        refusals(&b.events),
        vec![
            (1, Refusal::TokensExhausted),
            (2, Refusal::TokensExhausted),
            (3, Refusal::TokensExhausted)
        ]
    );
    assert!(b.granted_ids().is_empty());
    assert!(b.lock.is_empty());
    assert_eq!(b.fences.last(), MAX_EXACT_TOKEN);
}

#[test]
fn a_queued_extra_permit_is_granted_at_the_counters_end_after_the_refused_waiter_before_it() {
    let mut b = Bench::new();
    b.fences.observe(MAX_EXACT_TOKEN - 2);
    let t1 = b.run(|l, s| l.request(permit(b"p1", 2), None, s));
    assert_eq!(
        t1,
        Acquired::Granted {
            token: MAX_EXACT_TOKEN - 1,
            count: 1
        }
    );
    b.run(|l, s| l.request(permit(b"p2", 2), None, s));
    assert_eq!(b.fences.last(), MAX_EXACT_TOKEN);
    // Full: p3 (a new hold) queues, then p1 for one more permit.
    assert_eq!(
        b.run(|l, s| l.request(permit(b"p3", 2), Some(WaiterId(1)), s)),
        Acquired::Queued
    );
    assert_eq!(
        b.run(|l, s| l.request(permit(b"p1", 2), Some(WaiterId(2)), s)),
        Acquired::Queued
    );
    b.events.clear();
    b.run(|l, s| l.release(b"p2", false, s)).unwrap();
    // p3 would need a token: refused. p1's turn then comes, and its own hold grows.
    assert_eq!(refusals(&b.events), vec![(1, Refusal::TokensExhausted)]);
    assert_eq!(b.granted_ids(), vec![2]);
    assert_eq!(
        b.lock.holders().get(b"p1").map(|h| (h.count, h.token)),
        Some((2, MAX_EXACT_TOKEN - 1))
    );
    assert!(b.lock.queue().is_empty());
}

#[test]
fn a_step_that_refuses_grants_refuses_every_waiter_at_its_turn_and_direct_reentries() {
    let mut b = Bench::new();
    b.run(|l, s| l.acquire(b"w", Mode::Write, 100, None, s));
    b.run(|l, s| l.acquire(b"o1", Mode::Write, 100, Some(WaiterId(1)), s));
    b.run(|l, s| l.acquire(b"o2", Mode::Read, 100, Some(WaiterId(2)), s));
    let last = b.fences.last();
    let mut events = Vec::new();
    let mut step = Step {
        now: b.now,
        fences: &mut b.fences,
        events: &mut events,
        refuse: Some(Refusal::Evictable),
    };
    // The holder's re-entry is refused like any grant...
    assert_eq!(
        b.lock.acquire(b"w", Mode::Write, 100, None, &mut step),
        Acquired::Refused(Refusal::Evictable)
    );
    assert_eq!(b.lock.holders().get(b"w").map(|h| h.count), Some(1));
    // ...and when it releases, each waiter in turn gets the refusal, none a grant.
    b.lock.release(b"w", false, &mut step).unwrap();
    let refused: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Refused {
                waiter,
                reason: Refusal::Evictable,
            } => Some(waiter.0),
            Event::Granted { .. } => Some(0),
            _ => None,
        })
        .collect();
    assert_eq!(refused, vec![1, 2]);
    assert!(b.lock.is_empty());
    assert_eq!(b.fences.last(), last, "no token issued");
}

#[test]
fn a_counter_in_the_legacy_range_jumps_to_the_pre_release_floor() {
    let now: Micros = 1_795_000_000_000_000;
    assert_eq!(legacy_floor(now), 1_795_000_000_000 << 20);
    assert_eq!(legacy_floor(u64::MAX), MAX_TOKEN);
    // Legacy setting off: the µs floor.
    let mut exact = FenceCounter::default();
    exact.raise_to_floor(now);
    assert_eq!(exact.last(), now);
    // On: the pre-release floor even from a counter in the exact range, so a restart from an
    // RDB saved before legacy tokens arrived (by a RESTORE) cannot go below the legacy tokens
    // issued since (fewer than 2^20 per ms).
    let mut f = FenceCounter::default();
    f.set_legacy(true);
    f.raise_to_floor(now);
    assert_eq!(f.last(), legacy_floor(now));
    let mut g = FenceCounter::default();
    g.set_legacy(true);
    g.observe(MAX_EXACT_TOKEN + 10);
    g.raise_to_floor(now);
    assert_eq!(g.last(), legacy_floor(now));
    let issued = f.issue().unwrap();
    f.raise_to_floor(now + 1000);
    assert!(f.last() > issued);
}

#[test]
fn huge_ttl_does_not_overflow() {
    let mut b = Bench::new();
    b.now = u64::MAX - 5;
    assert!(matches!(
        b.acquire("a", Mode::Write, MAX_DURATION, None),
        Acquired::Granted { .. }
    ));
    assert_eq!(b.lock.last_expiry(), Some(u64::MAX));
}

#[test]
fn direct_changes_are_reported_for_replication() {
    let mut b = Bench::new();
    b.write("a");
    b.release("a").unwrap();
    b.run(|l, s| l.extend(b"nobody", 10, s)).unwrap_err();
    b.write("b");
    b.run(|l, s| l.extend(b"b", 10, s)).unwrap();
    let updated: Vec<Vec<u8>> = std::mem::take(&mut b.events)
        .into_iter()
        .filter_map(|e| match e {
            Event::Updated { owner } => Some(owner.to_vec()),
            _ => None,
        })
        .collect();
    assert_eq!(
        updated,
        vec![b"a".to_vec(), b"a".to_vec(), b"b".to_vec(), b"b".to_vec()]
    );
    assert_eq!(b.write("c"), Acquired::Busy);
    assert!(
        b.events.is_empty(),
        "a refused request changes nothing and reports nothing"
    );
}

#[test]
fn restoring_checks_what_an_rdb_load_or_a_replicated_state_may_hold() {
    let holder = |mode, count, token| Holder {
        user: crate::UNKNOWN_USER,
        mode,
        capacity: 0,
        count,
        expires_at: 10_000,
        token,
        granted_at: 0,
        options: Default::default(),
    };
    let mut fences = FenceCounter::default();
    let mut lock = Lock::new();
    lock.restore_holder(b"r1", holder(Mode::Read, 1, 3), &mut fences);
    // Another reader, or the same owner's own state replaced: fine.
    assert_eq!(
        lock.check_restorable(b"r2", &holder(Mode::Read, 2, 4)),
        Ok(())
    );
    assert_eq!(
        lock.check_restorable(b"r1", &holder(Mode::Write, 1, 5)),
        Ok(())
    );
    // A writer beside a reader, a reader beside a writer.
    assert_eq!(
        lock.check_restorable(b"w", &holder(Mode::Write, 1, 5)),
        Err(RestoreError::Conflict)
    );
    let mut written = Lock::new();
    written.restore_holder(b"w", holder(Mode::Write, 1, 3), &mut fences);
    assert_eq!(
        written.check_restorable(b"r", &holder(Mode::Read, 1, 4)),
        Err(RestoreError::Conflict)
    );
    // Values that were never issued or accepted.
    for (owner, h) in [
        (&b""[..], holder(Mode::Read, 1, 1)),
        (&[b'o'; MAX_OWNER_LEN + 1][..], holder(Mode::Read, 1, 1)),
    ] {
        assert_eq!(
            lock.check_restorable(owner, &h),
            Err(RestoreError::OwnerLength)
        );
    }
    for h in [
        holder(Mode::Read, 0, 1),
        holder(Mode::Read, 1, 0),
        holder(Mode::Read, 1, MAX_TOKEN + 1),
    ] {
        assert_eq!(
            lock.check_restorable(b"r3", &h),
            Err(RestoreError::CountOrToken)
        );
    }
}

#[test]
fn the_token_floor_follows_the_clock_and_never_lowers_the_counter() {
    // 2026-11-23 in Unix microseconds: about 2^50.6, far below 2^53.
    let now: Micros = 1_795_000_000_000_000;
    assert_eq!(token_floor(now), now);
    assert!(token_floor(now) < MAX_EXACT_TOKEN);
    assert!(token_floor(now + 1) > token_floor(now));
    // The floor stays exact for every client until Unix µs 2^53, in the year 2255...
    let year_2255: Micros = 8_993_000_000_000_000;
    assert!(token_floor(year_2255) <= MAX_EXACT_TOKEN);
    // ...and far in the future it saturates at the largest token rather than wrapping.
    assert_eq!(token_floor(u64::MAX), MAX_TOKEN);

    let mut fences = FenceCounter::default();
    fences.raise_to_floor(now);
    let first = fences.issue();
    assert_eq!(first, Some(token_floor(now) + 1));
    // An incarnation that issued 999,999 tokens after its jump is still below the floor of a
    // restart one second (10^6 µs) later...
    for _ in 1..999_999 {
        assert!(fences.issue().is_some());
    }
    assert!(fences.last() < token_floor(now + 1_000_000));
    assert!(!fences.beyond_exact());
    // ...and a floor from an earlier clock never lowers the counter.
    let before = fences.last();
    fences.raise_to_floor(now - 10_000);
    assert_eq!(fences.last(), before);
}

#[test]
fn a_counter_from_a_pre_release_build_keeps_counting_from_where_it_is_with_the_legacy_setting() {
    // The pre-release floor was `unix_ms << 20`: about 1.88e18 in 2026.
    let legacy: u64 = 1_795_000_000_000 << 20;
    let mut fences = FenceCounter::default();
    fences.raise_to_floor(1_795_000_000_000_000);
    fences.set_legacy(true);
    // Observing it is reported once, when the counter crosses 2^53 - 1...
    assert!(fences.observe(legacy));
    assert!(fences.beyond_exact());
    assert!(!fences.observe(legacy + 5));
    // ...and the counter never goes back: neither an earlier floor nor a smaller token lowers it.
    fences.raise_to_floor(1_794_000_000_000_000);
    assert_eq!(fences.last(), legacy + 5);
    assert_eq!(fences.issue(), Some(legacy + 6));
}

// ---- BIND and LOCKDELAY (version 2) ----

#[test]
fn expiry_with_lock_delay_blocks_everyone_until_it_ends_then_grants_the_head() {
    let mut b = Bench::new();
    b.request("a", Mode::Write, 100, None, opts(None, 50));
    b.acquire("w", Mode::Write, 500, Some(1));
    b.tick_at(1_100);
    assert_eq!(
        b.take_events(),
        vec![
            Event::Expired {
                owner: b"a"[..].into(),
                mode: Mode::Write
            },
            Event::DelayStarted { until: 1_150 },
        ]
    );
    assert_eq!(b.lock.delay_until(), 1_150);
    assert_eq!(b.lock.mode(), None, "free while only the delay is pending");
    // Newcomers are refused or queue, readers included; the waiter stays queued.
    assert_eq!(b.write("x"), Acquired::Busy);
    assert_eq!(b.read("y"), Acquired::Busy);
    assert_eq!(b.acquire("z", Mode::Read, 500, Some(2)), Acquired::Queued);
    b.tick_at(1_149);
    assert!(b.take_events().is_empty(), "the delay is not over yet");
    assert_eq!(b.write("x"), Acquired::Busy);
    b.tick_at(1_150);
    let events = b.take_events();
    assert_eq!(events[0], Event::DelayEnded);
    assert!(
        matches!(
            &events[1],
            Event::Granted {
                waiter: WaiterId(1),
                expires_at: 1_650,
                count: 1,
                ..
            }
        ),
        "{events:?}"
    );
    assert_eq!(events.len(), 2, "the writer alone: {events:?}");
    assert_eq!(b.lock.delay_until(), 0);
    assert_eq!(b.count("w"), Some(1));
}

#[test]
fn late_timer_grants_at_once_because_the_delay_counts_from_the_expiry() {
    // The timer fires after expires_at + delay: nothing left to wait for.
    let mut b = Bench::new();
    b.request("a", Mode::Write, 100, None, opts(None, 50));
    b.acquire("w", Mode::Write, 500, Some(1));
    b.tick_at(1_180);
    let events = b.take_events();
    assert_eq!(events[1], Event::DelayStarted { until: 1_150 });
    assert_eq!(events[2], Event::DelayEnded);
    assert!(granted(1, "w", &events), "{events:?}");
    assert_eq!(b.lock.delay_until(), 0);

    // The timer fires inside the delay: it still ends at expires_at + delay, not now + delay.
    let mut b = Bench::new();
    b.request("a", Mode::Write, 100, None, opts(None, 50));
    b.tick_at(1_130);
    assert_eq!(b.lock.delay_until(), 1_150);
    assert_eq!(b.lock.next_expiry(), Some(1_150));

    // No timer at all: the next request finds the delay over and is granted directly.
    let mut b = Bench::new();
    b.request("a", Mode::Write, 100, None, opts(None, 50));
    b.now = 1_150;
    assert!(matches!(b.write("x"), Acquired::Granted { count: 1, .. }));
}

#[test]
fn release_imposes_no_delay() {
    let mut b = Bench::new();
    b.request("a", Mode::Write, 1_000, None, opts(None, 5_000));
    b.acquire("w", Mode::Write, 1_000, Some(1));
    b.release("a").unwrap();
    assert_eq!(b.granted_ids(), vec![1]);
    assert_eq!(b.lock.delay_until(), 0);
    // RELEASE ALL neither, and the lock is then simply gone.
    let mut b = Bench::new();
    b.request("a", Mode::Write, 1_000, None, opts(Some(3), 5_000));
    b.write("a");
    assert_eq!(b.run(|l, s| l.release(b"a", true, s)), Ok(0));
    assert_eq!(b.lock.delay_until(), 0);
    assert!(b.lock.is_empty());
    assert!(matches!(b.write("x"), Acquired::Granted { .. }));
}

#[test]
fn closing_a_connection_ends_its_holds_at_once_and_no_others() {
    let mut b = Bench::new();
    b.request("r1", Mode::Read, 10_000, None, opts(Some(7), 0));
    b.request("r2", Mode::Read, 10_000, None, opts(None, 0));
    b.request("r3", Mode::Read, 10_000, None, opts(Some(8), 0));
    b.read("r1");
    b.acquire("w", Mode::Write, 1_000, Some(1));
    assert_eq!(b.disconnect(9), 0);
    assert_eq!(b.disconnect(7), 1);
    assert_eq!(
        b.take_events(),
        vec![Event::Disconnected {
            owner: b"r1"[..].into(),
            mode: Mode::Read
        }],
        "every count of r1 ends, nobody else's, nobody granted yet"
    );
    assert_eq!(b.count("r1"), None);
    assert_eq!(b.count("r2"), Some(1));
    assert_eq!(b.count("r3"), Some(1));
    b.release("r2").unwrap();
    b.take_events();
    assert_eq!(b.disconnect(8), 1);
    let events = b.take_events();
    assert!(granted(1, "w", &events), "handed over at once: {events:?}");
    assert_eq!(b.lock.delay_until(), 0, "no LOCKDELAY, no delay");
}

#[test]
fn closing_the_connection_of_a_writer_with_lock_delay_delays_from_now() {
    let mut b = Bench::new();
    b.request("a", Mode::Write, 10_000, None, opts(Some(1), 300));
    b.acquire("w", Mode::Write, 1_000, Some(1));
    b.now = 1_200;
    assert_eq!(b.disconnect(1), 1);
    assert_eq!(
        b.take_events(),
        vec![
            Event::Disconnected {
                owner: b"a"[..].into(),
                mode: Mode::Write
            },
            Event::DelayStarted { until: 1_500 },
        ]
    );
    assert_eq!(b.lock.next_expiry(), Some(1_500));
    assert_eq!(b.lock.last_expiry(), Some(1_500));
    assert_eq!(b.write("x"), Acquired::Busy);
    b.tick_at(1_499);
    assert!(b.take_events().is_empty());
    b.tick_at(1_500);
    assert_eq!(b.granted_ids(), vec![1]);
}

#[test]
fn every_bound_hold_ends_when_the_server_loses_all_connections() {
    let mut b = Bench::new();
    b.request("r1", Mode::Read, 10_000, None, opts(Some(1), 0));
    b.request("r2", Mode::Read, 10_000, None, opts(Some(2), 0));
    b.request("r3", Mode::Read, 10_000, None, opts(None, 0));
    assert_eq!(b.run(|l, s| l.end_bound(|_| true, s)), 2);
    assert_eq!(b.lock.holders().len(), 1);
    assert_eq!(b.count("r3"), Some(1));
}

#[test]
fn reentry_keeps_the_options_the_hold_began_with() {
    let mut b = Bench::new();
    let t = token(b.request("a", Mode::Write, 100, None, opts(Some(1), 50)));
    assert_eq!(
        b.request("a", Mode::Write, 100, None, opts(Some(2), 0)),
        Acquired::Granted { token: t, count: 2 }
    );
    b.request("a", Mode::Read, 100, None, opts(None, 900));
    assert_eq!(b.options("a"), Some(opts(Some(1), 50)));
    assert_eq!(b.disconnect(2), 0, "the re-entry's BIND was ignored");
    assert_eq!(b.disconnect(1), 1);
    assert_eq!(b.lock.delay_until(), b.now + 50);

    // An unbound hold stays unbound when re-entered with BIND, and gets no delay.
    let mut b = Bench::new();
    b.write("u");
    b.request("u", Mode::Write, 100, None, opts(Some(1), 50));
    assert_eq!(b.options("u"), Some(HoldOptions::default()));
    assert_eq!(b.disconnect(1), 0);
    b.tick_at(b.now + 100);
    assert_eq!(b.lock.delay_until(), 0);
    assert!(b.lock.is_empty());

    // A queued re-entry (the owner's second waiter) is granted without changing them either.
    let mut b = Bench::new();
    b.write("a");
    b.request("o", Mode::Write, 100, Some(1), opts(Some(4), 10));
    b.request("o", Mode::Read, 100, Some(2), opts(Some(5), 0));
    b.release("a").unwrap();
    assert_eq!(b.granted_ids(), vec![1, 2]);
    assert_eq!(b.count("o"), Some(2));
    assert_eq!(b.options("o"), Some(opts(Some(4), 10)));
}

#[test]
fn a_bound_waiter_is_bound_to_its_own_connection() {
    let mut b = Bench::new();
    b.request("a", Mode::Write, 10_000, None, opts(Some(1), 0));
    b.request("w", Mode::Write, 10_000, Some(1), opts(Some(2), 40));
    assert_eq!(b.disconnect(1), 1);
    assert_eq!(b.granted_ids(), vec![1]);
    assert_eq!(b.options("w"), Some(opts(Some(2), 40)));
    assert_eq!(
        b.disconnect(1),
        0,
        "not bound to the connection it replaced"
    );
    b.now += 5;
    assert_eq!(b.disconnect(2), 1);
    assert_eq!(b.lock.delay_until(), b.now + 40);
}

#[test]
fn the_key_expiry_covers_the_lock_delay() {
    let mut b = Bench::new();
    b.request("a", Mode::Write, 100, None, opts(None, 50));
    // Held: the timer fires at the expiry, the key lives until expiry + delay.
    assert_eq!(b.lock.next_expiry(), Some(1_100));
    assert_eq!(b.lock.last_expiry(), Some(1_150));
    // An extend moves both.
    b.now = 1_050;
    b.run(|l, s| l.extend(b"a", 100, s)).unwrap();
    assert_eq!(b.lock.next_expiry(), Some(1_150));
    assert_eq!(b.lock.last_expiry(), Some(1_200));
    // Pending: both are the delay's end.
    b.tick_at(1_160);
    assert_eq!(b.lock.next_expiry(), Some(1_200));
    assert_eq!(b.lock.last_expiry(), Some(1_200));
    b.tick_at(1_200);
    assert_eq!(b.lock.next_expiry(), None);
    assert_eq!(b.lock.last_expiry(), None);
}

#[test]
fn a_shared_hold_drops_lock_delay() {
    let mut b = Bench::new();
    b.request("r", Mode::Read, 100, None, opts(Some(1), 50));
    assert_eq!(b.options("r"), Some(opts(Some(1), 0)));
    assert_eq!(b.lock.last_expiry(), Some(1_100));
    b.tick_at(1_100);
    assert_eq!(b.lock.delay_until(), 0);
    assert!(b.lock.is_empty());
}

#[test]
fn a_pending_delay_keeps_the_lock_until_it_ends() {
    let mut b = Bench::new();
    b.request("a", Mode::Write, 100, None, opts(None, 50));
    b.tick_at(1_100);
    assert!(b.lock.holders().is_empty() && b.lock.queue().is_empty());
    assert!(
        !b.lock.is_empty(),
        "the key must stay while the delay is pending"
    );
    b.tick_at(1_150);
    assert!(b.lock.is_empty());
    assert_eq!(b.take_events().last(), Some(&Event::DelayEnded));
}

#[test]
fn a_waiter_timing_out_during_a_delay_leaves_without_a_grant() {
    let mut b = Bench::new();
    b.request("a", Mode::Write, 100, None, opts(None, 50));
    b.acquire("w1", Mode::Write, 100, Some(1));
    b.acquire("w2", Mode::Write, 100, Some(2));
    b.tick_at(1_120);
    assert!(b.run(|l, s| l.cancel_waiter(WaiterId(1), s)).is_some());
    assert!(b.granted_ids().is_empty(), "w2 still waits for the delay");
    b.tick_at(1_150);
    assert_eq!(b.granted_ids(), vec![2]);
}

#[test]
fn restore_delay_is_ignored_while_the_lock_is_held() {
    let mut b = Bench::new();
    b.write("a");
    b.lock.restore_delay(5_000);
    assert_eq!(b.lock.delay_until(), 0);
    assert_eq!(b.count("a"), Some(1));
    // On an empty lock it is restored exactly, blocks grants, and 0 clears it.
    let mut b = Bench::new();
    b.lock.restore_delay(5_000);
    assert_eq!(b.lock.delay_until(), 5_000);
    assert!(!b.lock.is_empty());
    assert_eq!(b.lock.last_expiry(), Some(5_000));
    assert_eq!(b.write("x"), Acquired::Busy);
    b.lock.restore_delay(0);
    assert!(b.lock.is_empty());
    assert!(matches!(b.write("x"), Acquired::Granted { .. }));
}

/// The Redis side keeps an index of where each connection holds bound holds; it learns that a
/// bound hold ended, whichever way, from `BoundEnded`.
#[test]
fn the_end_of_every_bound_hold_is_reported_with_its_connection() {
    let bound_ends = |b: &mut Bench| -> Vec<u64> {
        std::mem::take(&mut b.events)
            .into_iter()
            .filter_map(|e| match e {
                Event::BoundEnded { conn } => Some(conn),
                _ => None,
            })
            .collect()
    };
    let mut b = Bench::new();
    // Released: only when the last count goes.
    b.request("a", Mode::Write, 10_000, None, opts(Some(4), 0));
    b.write("a");
    b.release("a").unwrap();
    assert_eq!(bound_ends(&mut b), Vec::<u64>::new());
    b.release("a").unwrap();
    assert_eq!(bound_ends(&mut b), vec![4]);
    // Expired.
    b.request("e", Mode::Read, 100, None, opts(Some(5), 0));
    b.request("u", Mode::Read, 100, None, opts(None, 0));
    b.tick_at(1_100);
    assert_eq!(
        bound_ends(&mut b),
        vec![5],
        "the unbound reader reports nothing"
    );
    // Disconnected.
    b.request("d", Mode::Write, 10_000, None, opts(Some(6), 0));
    assert_eq!(b.disconnect(6), 1);
    assert_eq!(bound_ends(&mut b), vec![6]);
}

#[test]
fn a_semaphore_grants_up_to_its_capacity_then_queues_in_order() {
    let mut b = Bench::new();
    assert_eq!(b.lock.kind(), Kind::Fresh);
    let t1 = token(b.permit("a", 2, 1_000, None));
    assert_eq!(b.lock.kind(), Kind::Semaphore(2));
    token(b.permit("b", 2, 1_000, None));
    assert_eq!(b.permit("c", 2, 1_000, None), Acquired::Busy);
    assert_eq!(b.permit("c", 2, 1_000, Some(1)), Acquired::Queued);
    // An owner that holds permits asks for one more behind the queue, like anyone.
    assert_eq!(b.permit("a", 2, 1_000, Some(2)), Acquired::Queued);
    assert_eq!(b.lock.holders().total_count(), 2);
    b.release("b").unwrap();
    assert_eq!(b.granted_ids(), vec![1]);
    b.release("c").unwrap();
    let events = b.take_events();
    assert!(
        matches!(&events[..], [Event::Granted { waiter: WaiterId(2), token, count: 2, .. }] if *token == t1),
        "a's second permit, with its first token: {events:?}"
    );
    assert_eq!(b.count("a"), Some(2));
    // RELEASE drops one permit, ALL every one.
    assert_eq!(b.release("a"), Ok(1));
    assert_eq!(b.run(|l, s| l.release(b"a", true, s)), Ok(0));
    assert!(b.lock.is_empty());
}

#[test]
fn freed_permits_go_to_as_many_head_waiters_as_fit() {
    let mut b = Bench::new();
    b.permit("a", 3, 100, None);
    b.permit("b", 3, 100, None);
    b.permit("c", 3, 5_000, None);
    for (i, o) in ["w1", "w2", "w3"].iter().enumerate() {
        assert_eq!(b.permit(o, 3, 1_000, Some(i as u64 + 1)), Acquired::Queued);
    }
    // a and b expire together: two permits free, the first two waiters get them.
    b.tick_at(1_100);
    assert_eq!(b.granted_ids(), vec![1, 2]);
    assert_eq!(b.lock.holders().total_count(), 3);
    assert_eq!(b.lock.queue().len(), 1);
}

#[test]
fn a_key_keeps_its_kind_and_capacity_while_it_exists() {
    let mut b = Bench::new();
    b.permit("a", 2, 1_000, None);
    assert_eq!(b.permit("x", 3, 1_000, Some(1)), Acquired::CapacityMismatch);
    assert_eq!(b.write("x"), Acquired::WrongKind);
    assert_eq!(b.read("x"), Acquired::WrongKind);
    assert!(b.lock.queue().is_empty(), "a refusal queues nothing");
    // A lock key refuses permits.
    let mut l = Bench::new();
    l.write("w");
    assert_eq!(l.permit("x", 2, 1_000, Some(1)), Acquired::WrongKind);
    // A lock-delay alone still makes the key a lock.
    let mut d = Bench::new();
    d.request("w", Mode::Write, 100, None, opts(None, 1_000));
    d.tick_at(1_100);
    assert_eq!(d.lock.kind(), Kind::Lock);
    assert_eq!(d.permit("x", 2, 1_000, None), Acquired::WrongKind);
    // Once the key is empty again, the next request sets the kind anew.
    b.run(|l, s| l.release(b"a", true, s)).unwrap();
    assert_eq!(b.lock.kind(), Kind::Fresh);
    assert!(matches!(
        b.permit("x", 5, 1_000, None),
        Acquired::Granted { .. }
    ));
    assert_eq!(b.lock.kind(), Kind::Semaphore(5));
}

#[test]
fn a_restored_permit_must_fit_the_semaphore() {
    let permit = |capacity, count, token| Holder {
        user: crate::UNKNOWN_USER,
        mode: Mode::Permit,
        capacity,
        count,
        expires_at: 10_000,
        token,
        granted_at: 0,
        options: Default::default(),
    };
    let mut fences = FenceCounter::default();
    let mut lock = Lock::new();
    lock.restore_holder(b"a", permit(3, 2, 1), &mut fences);
    assert_eq!(lock.check_restorable(b"b", &permit(3, 1, 2)), Ok(()));
    assert_eq!(
        lock.check_restorable(b"b", &permit(3, 2, 2)),
        Err(RestoreError::Conflict)
    );
    assert_eq!(
        lock.check_restorable(b"b", &permit(4, 1, 2)),
        Err(RestoreError::Conflict)
    );
    assert_eq!(
        lock.check_restorable(b"a", &permit(3, 3, 1)),
        Ok(()),
        "a's own state replaced"
    );
    assert_eq!(
        lock.check_restorable(b"c", &permit(0, 1, 2)),
        Err(RestoreError::Capacity)
    );
    let writer = Holder {
        user: crate::UNKNOWN_USER,
        mode: Mode::Write,
        capacity: 0,
        count: 1,
        expires_at: 10_000,
        token: 5,
        granted_at: 0,
        options: Default::default(),
    };
    assert_eq!(
        lock.check_restorable(b"w", &writer),
        Err(RestoreError::Conflict)
    );
}

/// Waiters rescued from a deleted or replaced key rejoin what the key holds now, unless it is
/// of the other kind or another capacity: those are handed back with the refusal.
#[test]
fn requeued_waiters_of_another_kind_or_capacity_are_refused() {
    let waiter = |mode, capacity| Waiter {
        owner: b"w"[..].into(),
        mode,
        ttl: 1_000,
        options: HoldOptions::default(),
        capacity,
    };
    let mut b = Bench::new();
    b.write("x");
    let refused = b.run(|l, s| {
        l.requeue(
            vec![
                (WaiterId(1), waiter(Mode::Permit, 2)),
                (WaiterId(2), waiter(Mode::Write, 0)),
            ],
            s,
        )
    });
    assert_eq!(refused, vec![(WaiterId(1), Acquired::WrongKind)]);
    assert_eq!(b.lock.queue().len(), 1, "the lock waiter rejoined");
    let mut s = Bench::new();
    s.permit("x", 1, 1_000, None);
    let refused = s.run(|l, st| {
        l.requeue(
            vec![
                (WaiterId(1), waiter(Mode::Permit, 3)),
                (WaiterId(2), waiter(Mode::Read, 0)),
                (WaiterId(3), waiter(Mode::Permit, 1)),
            ],
            st,
        )
    });
    assert_eq!(
        refused,
        vec![
            (WaiterId(1), Acquired::CapacityMismatch),
            (WaiterId(2), Acquired::WrongKind)
        ]
    );
    assert_eq!(
        s.lock.holders().total_count(),
        1,
        "never beyond the capacity"
    );
    assert_eq!(s.lock.queue().len(), 1);
}

#[test]
fn a_hold_that_ends_reports_how_long_it_was_held() {
    let mut lock = Lock::new();
    let mut fences = FenceCounter::default();
    let mut events = Vec::new();
    let held = |events: &mut Vec<Event>| -> Vec<Millis> {
        events
            .drain(..)
            .filter_map(|e| match e {
                Event::HoldEnded { held_ms } => Some(held_ms),
                _ => None,
            })
            .collect()
    };
    macro_rules! at {
        ($now:expr) => {
            &mut Step {
                now: $now,
                fences: &mut fences,
                events: &mut events,
                refuse: None,
            }
        };
    }
    // Released: from the grant to the release; a re-entry and an extend change nothing.
    lock.acquire(b"a", Mode::Write, 1_000, None, at!(100));
    lock.acquire(b"a", Mode::Write, 1_000, None, at!(150));
    lock.extend(b"a", 1_000, at!(200)).unwrap();
    lock.release(b"a", false, at!(250)).unwrap();
    assert_eq!(held(&mut events), Vec::<Millis>::new(), "still held once");
    lock.release(b"a", false, at!(340)).unwrap();
    assert_eq!(held(&mut events), vec![240]);
    // Expired: from the grant to its expiry, however late the expiry is noticed; the waiter
    // it hands over to starts its own hold at the hand-over.
    lock.acquire(b"b", Mode::Write, 50, None, at!(1_000));
    lock.acquire(b"c", Mode::Write, 500, Some(WaiterId(1)), at!(1_010));
    lock.settle(at!(1_200));
    assert_eq!(held(&mut events), vec![50]);
    lock.release(b"c", true, at!(1_230)).unwrap();
    assert_eq!(held(&mut events), vec![30]);
    // Disconnected: from the grant to the close.
    let bound = Request {
        owner: b"d",
        mode: Mode::Read,
        ttl: 10_000,
        options: HoldOptions {
            user: crate::UNKNOWN_USER,
            bound_to: Some(9),
            lock_delay: 0,
        },
        capacity: 0,
    };
    lock.request(bound, None, at!(2_000));
    lock.end_bound(|c| c == 9, at!(2_075));
    assert_eq!(held(&mut events), vec![75]);
    // A restored hold (its start unknown) reports nothing when it ends.
    let restored = Holder {
        user: crate::UNKNOWN_USER,
        mode: Mode::Write,
        capacity: 0,
        count: 1,
        expires_at: 9_000,
        token: 99,
        granted_at: 0,
        options: PackedOptions::NONE,
    };
    lock.restore_holder(b"e", restored, &mut fences);
    lock.release(b"e", true, at!(3_000)).unwrap();
    assert_eq!(held(&mut events), Vec::<Millis>::new());
}

#[test]
fn a_single_plain_holder_round_trips_through_from_single() {
    let mut lock = Lock::new();
    let mut fences = FenceCounter::default();
    let mut events = Vec::new();
    let mut step = Step {
        now: 500,
        fences: &mut fences,
        events: &mut events,
        refuse: None,
    };
    assert!(lock.single().is_none(), "nobody holds it");
    lock.acquire(b"a", Mode::Write, 1_000, None, &mut step);
    lock.acquire(b"a", Mode::Read, 2_000, None, &mut step);
    let (owner, holder) = lock.single().expect("one plain holder");
    let rebuilt = Lock::from_single(owner, holder.clone());
    assert_eq!(rebuilt.single(), lock.single());
    assert_eq!(rebuilt.fence(), lock.fence());
    assert_eq!(rebuilt.last_expiry(), lock.last_expiry());
    // A waiter, a second reader, or a fence above the holder's token: more than one holder.
    lock.acquire(b"b", Mode::Write, 1_000, Some(WaiterId(1)), &mut step);
    assert!(lock.single().is_none(), "someone waits");
    let mut readers = Lock::new();
    readers.acquire(b"r1", Mode::Read, 1_000, None, &mut step);
    readers.acquire(b"r2", Mode::Read, 1_000, None, &mut step);
    assert!(readers.single().is_none(), "two readers");
    readers.release(b"r2", true, &mut step).unwrap();
    assert!(
        readers.single().is_none(),
        "r1's token is below the fence r2 raised"
    );
    let mut delayed = Lock::new();
    let with_delay = Request {
        owner: b"w",
        mode: Mode::Write,
        ttl: 1_000,
        options: HoldOptions {
            user: crate::UNKNOWN_USER,
            bound_to: None,
            lock_delay: 100,
        },
        capacity: 0,
    };
    delayed.request(with_delay, None, &mut step);
    assert!(delayed.single().is_none(), "options");
}

/// A hold's age counts from its first grant: a re-entry and an extend do not restart it, and
/// a hold whose start is unknown (restored) has no age.
#[test]
fn hold_age_counts_from_the_first_grant() {
    let mut b = Bench::new();
    b.write("a");
    b.now = 1_400;
    b.write("a");
    b.run(|l, s| l.extend(b"a", 10_000, s)).unwrap();
    let held = b.lock.holders().get(b"a").unwrap().held_ms(1_900);
    assert_eq!(held, Some(900));
    // A clock stepped back reads as 0, never as a huge age.
    assert_eq!(b.lock.holders().get(b"a").unwrap().held_ms(500), Some(0));
    let unknown = Holder {
        granted_at: 0,
        ..b.lock.holders().get(b"a").unwrap().clone()
    };
    assert_eq!(unknown.held_ms(1_900), None);
}

/// Naming a few holders of a widely shared lock looks at a bounded number of them, names only
/// live ones, and sorts the names.
#[test]
fn some_live_holders_are_named_within_a_budget() {
    let mut b = Bench::new();
    for i in (0..1000).rev() {
        b.read(&format!("r{i:04}"));
    }
    let named = b.lock.holders().some_live(b.now, 10, 64);
    assert_eq!(named.len(), 10);
    assert!(named.windows(2).all(|w| w[0].0 < w[1].0));
    // Only the first `looks` holders in storage order are candidates.
    let all: Vec<&[u8]> = b.lock.holders().iter().map(|(o, _)| o).take(64).collect();
    assert!(named.iter().all(|(o, _)| all.contains(o)));
    // Holders whose lease has passed are not named, even before their removal runs.
    assert!(b
        .lock
        .holders()
        .some_live(b.now + 10_000, 10, 64)
        .is_empty());
    // Fewer holders than asked for: all of them.
    let mut one = Bench::new();
    one.write("w");
    let named = one.lock.holders().some_live(one.now, 10, 64);
    assert_eq!(named.len(), 1);
    assert_eq!(named[0].0, b"w");
    // The count: live holders within the budget, every recorded one above it.
    assert_eq!(one.lock.holders().live_count(one.now, 64), 1);
    assert_eq!(one.lock.holders().live_count(one.now + 10_000, 64), 0);
    assert_eq!(b.lock.holders().live_count(b.now + 10_000, 64), 1000);
    assert_eq!(b.lock.holders().live_count(b.now, 1000), 1000);
}

/// LOCK.INFO's bounded forms: the exact live count through the expiry index, and the first `n`
/// live holders in storage order (sorted by owner), whatever the number of holders.
#[test]
fn live_len_and_first_live_skip_passed_leases() {
    let mut b = Bench::new();
    for i in 0..1000 {
        b.read(&format!("r{i:04}"));
    }
    assert_eq!(b.lock.holders().live_len(b.now), 1000);
    assert_eq!(b.lock.holders().live_len(b.now + 10_000), 0);
    let first = b.lock.holders().first_live(b.now, 7);
    assert_eq!(first.len(), 7);
    assert!(first.windows(2).all(|w| w[0].0 < w[1].0));
    assert!(b.lock.holders().first_live(b.now + 10_000, 7).is_empty());
    let mut one = Bench::new();
    one.write("w");
    assert_eq!(one.lock.holders().live_len(one.now), 1);
    assert_eq!(one.lock.holders().live_len(one.now + 10_000), 0);
    assert_eq!(one.lock.holders().first_live(one.now, 1000).len(), 1);
    assert_eq!(Bench::new().lock.holders().live_len(0), 0);
}

/// A count never goes past MAX_COUNT, the largest a stored value may carry: a re-entry at it is
/// refused and changes nothing (found by the docs test: a restored count of 2^63 - 1 took one
/// more re-entry, and the key's DUMP was then refused by RESTORE).
#[test]
fn a_reentry_beyond_the_largest_storable_count_is_refused() {
    let mut b = Bench::new();
    b.write("a");
    let full = Holder {
        count: MAX_COUNT,
        ..b.lock.holders().get(b"a").unwrap().clone()
    };
    b.lock
        .restore_holder(b"a", full, &mut FenceCounter::default());
    assert_eq!(b.count("a"), Some(MAX_COUNT));
    assert!(matches!(b.write("a"), Acquired::CountOverflow));
    assert!(matches!(b.read("a"), Acquired::CountOverflow));
    assert_eq!(b.count("a"), Some(MAX_COUNT));
}
