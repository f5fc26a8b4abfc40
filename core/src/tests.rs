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
            .filter(|e| !matches!(e, Event::Updated { .. }))
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
fn fence_counter_saturates_instead_of_wrapping() {
    let mut f = FenceCounter::default();
    f.observe(u64::MAX);
    assert_eq!(f.last(), MAX_TOKEN);
    assert_eq!(f.issue(), MAX_TOKEN);
    f.observe(u64::MAX);
    assert_eq!(f.last(), MAX_TOKEN);
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
        mode,
        count,
        expires_at: 10_000,
        token,
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
    // 2026-11-23 in Unix ms: about 2^60.7 once shifted, below 2^63.
    let now: Millis = 1_795_000_000_000;
    assert_eq!(token_floor(now), now << FLOOR_SHIFT);
    assert!(token_floor(now) < MAX_TOKEN);
    assert!(token_floor(now + 1) > token_floor(now));
    // Far in the future the floor saturates at the largest token rather than wrapping.
    assert_eq!(token_floor(u64::MAX), MAX_TOKEN);
    assert_eq!(token_floor(1 << 43), MAX_TOKEN);

    let mut fences = FenceCounter::default();
    fences.raise_to_floor(now);
    let first = fences.issue();
    assert_eq!(first, token_floor(now) + 1);
    // An incarnation that issued a million tokens after its jump is still below the floor of
    // a restart one millisecond later...
    for _ in 0..1_000_000 {
        fences.issue();
    }
    assert!(fences.last() < token_floor(now + 1));
    // ...and a floor from an earlier clock never lowers the counter.
    let before = fences.last();
    fences.raise_to_floor(now - 10_000);
    assert_eq!(fences.last(), before);
}
