//! Property tests: random operation sequences run on [`Lock`] and on the reference model
//! (`reference.rs`), compared step by step, with the safety invariants checked after every
//! step. Locks and semaphores share the one key: a sequence goes through phases that favour
//! one kind or the other, so the key keeps switching between them as it empties, and requests
//! of the wrong kind or capacity meet a live key.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use super::reference::{decode, run, run_from, run_with_stats, Op, Stats, CONNS, OWNERS};
use super::*;

/// One operation; `locks` and `permits` weigh the two kinds of request.
fn op(locks: u32, permits: u32) -> impl Strategy<Value = Op> {
    let mode = prop_oneof![Just(Mode::Write), Just(Mode::Read)];
    // Most requests are plain; a third bind to a connection, a third carry a lock-delay
    // (shorter than most ttls, so that delays, expiries and waits overlap).
    let bind = prop_oneof![2 => Just(None), 1 => (0..CONNS).prop_map(Some)];
    let lock_delay = prop_oneof![2 => Just(0), 1 => 1..40u64];
    // A semaphore is mostly of capacity 2; the others create keys of another capacity, or
    // are refused on a key of 2.
    let capacity = prop_oneof![8 => Just(2u32), 1 => Just(1u32), 1 => Just(3u32)];
    // A permit request with a lock-delay (which must be ignored) now and then.
    let permit_delay = prop_oneof![4 => Just(0), 1 => 1..40u64];
    prop_oneof![
        locks => (0..OWNERS, mode, 1..60u64, any::<bool>(), bind.clone(), lock_delay).prop_map(
            |(owner, mode, ttl, wait, bind, lock_delay)| Op::Acquire {
                owner,
                mode,
                ttl,
                wait,
                bind,
                lock_delay,
            }
        ),
        permits => (0..OWNERS, capacity, 1..30u64, prop::bool::weighted(0.6), bind, permit_delay).prop_map(
            |(owner, capacity, ttl, wait, bind, lock_delay)| Op::Permit {
                owner,
                capacity,
                ttl,
                wait,
                bind,
                lock_delay,
            }
        ),
        3 => (0..OWNERS, prop::bool::weighted(0.2)).prop_map(|(owner, all)| Op::Release { owner, all }),
        1 => (0..OWNERS, 1..60u64).prop_map(|(owner, ttl)| Op::Extend { owner, ttl }),
        2 => (0..40u64).prop_map(|ms| Op::Advance { ms }),
        1 => any::<usize>().prop_map(|nth| Op::Cancel { nth }),
        1 => (0..CONNS).prop_map(|conn| Op::Disconnect { conn }),
    ]
}

/// A sequence of up to 80 operations in one to four phases: mostly locks, mostly permits, or
/// both alike. Half the phases end by draining the key (its waiters leave, time passes beyond
/// every ttl), so that the next request finds it fresh and the key changes kinds often.
fn ops() -> impl Strategy<Value = Vec<Op>> {
    let phase = prop_oneof![
        prop::collection::vec(op(5, 1), 1..30),
        prop::collection::vec(op(1, 10), 1..30),
        prop::collection::vec(op(3, 3), 1..30),
    ];
    let drain = prop_oneof![Just(false), Just(true)];
    prop::collection::vec((phase, drain), 1..5).prop_map(|phases| {
        let mut ops = Vec::new();
        for (phase, drain) in phases {
            ops.extend(phase);
            if drain {
                ops.extend(std::iter::repeat(Op::Cancel { nth: 0 }).take(6));
                ops.push(Op::Advance { ms: 60 });
            }
        }
        ops.truncate(80);
        ops
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn lock_matches_reference_model(ops in ops()) {
        if let Err(e) = run(&ops) {
            return Err(TestCaseError::fail(e));
        }
    }

    /// The fuzz target's decoder on random bytes: whatever it yields runs clean too.
    #[test]
    fn decoded_fuzz_input_matches_reference_model(data in prop::collection::vec(any::<u8>(), 0..320)) {
        if let Err(e) = run(&decode(&data)) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// The generator reaches what the semaphore rules are about, run after run: grants at once and
/// from the queue, extra permits both ways, a release of one permit serving a waiter, full
/// semaphores, refusals of the wrong kind and capacity, and a key switching kinds. (The same
/// 300 sequences each time; `--nocapture` prints the numbers.)
#[test]
fn generated_sequences_exercise_the_semaphore_rules() {
    let mut runner = TestRunner::deterministic();
    let strategy = ops();
    let mut stats = Stats::default();
    for _ in 0..300 {
        let ops = strategy
            .new_tree(&mut runner)
            .expect("a sequence")
            .current();
        run_with_stats(&ops, &mut stats).expect("a clean run");
    }
    println!("300 sequences: {stats:#?}");
    let Stats {
        permits_direct,
        extra_permits_direct,
        permits_from_queue,
        extra_permits_from_queue,
        served_by_partial_release,
        permits_queued,
        permits_busy,
        permits_on_locks,
        locks_on_semaphores,
        capacity_mismatch,
        kind_switches,
        full,
        permit_holds_ended,
        ..
    } = stats;
    for (what, n, min) in [
        ("permits granted at once", permits_direct, 400),
        ("extra permits granted at once", extra_permits_direct, 40),
        ("permits granted from the queue", permits_from_queue, 100),
        ("extra permits from the queue", extra_permits_from_queue, 10),
        ("served by releasing 1 permit", served_by_partial_release, 3),
        ("permit requests queued", permits_queued, 200),
        ("permit requests busy", permits_busy, 150),
        ("permit requests on a lock", permits_on_locks, 200),
        ("lock requests on a semaphore", locks_on_semaphores, 100),
        ("capacity mismatches", capacity_mismatch, 200),
        ("keys switching kinds", kind_switches, 150),
        ("steps with every permit held", full, 1500),
        ("permit holds ended", permit_holds_ended, 300),
    ] {
        assert!(n >= min, "{what}: {n} (expected at least {min})");
    }
}

/// The fuzz decoder reaches every operation and every option.
#[test]
fn decoder_reaches_every_op_and_option() {
    let data: Vec<u8> = (0..=255u8)
        .flat_map(|b| [b % 14, b, b, b.wrapping_mul(7)])
        .collect();
    let ops = decode(&data);
    let has = |f: &dyn Fn(&Op) -> bool| ops.iter().any(f);
    assert!(has(&|o| matches!(o, Op::Acquire { bind: Some(2), .. })));
    assert!(has(&|o| matches!(o, Op::Acquire { bind: None, .. })));
    assert!(has(&|o| matches!(o, Op::Acquire { lock_delay: 40, .. })));
    assert!(has(&|o| matches!(o, Op::Acquire { lock_delay: 0, .. })));
    assert!(has(&|o| matches!(o, Op::Release { .. })));
    assert!(has(&|o| matches!(o, Op::Extend { .. })));
    assert!(has(&|o| matches!(o, Op::Advance { .. })));
    assert!(has(&|o| matches!(o, Op::Cancel { .. })));
    assert!(has(&|o| matches!(o, Op::Disconnect { conn: 2 })));
    for capacity in 1..=3 {
        assert!(has(
            &|o| matches!(o, Op::Permit { capacity: c, .. } if *c == capacity)
        ));
    }
    assert!(has(&|o| matches!(
        o,
        Op::Permit {
            wait: true,
            bind: Some(2),
            ..
        }
    )));
    assert!(has(&|o| matches!(
        o,
        Op::Permit {
            wait: false,
            bind: None,
            ..
        }
    )));
    assert!(has(&|o| matches!(o, Op::Permit { lock_delay: 20, .. })));
    assert!(has(&|o| matches!(o, Op::Permit { lock_delay: 0, .. })));
}

/// Sequences with grants refused now and then (as while the server can evict, with the
/// refusal option on), run from a fencing counter a few tokens from its end.
fn ops_near_the_end() -> impl Strategy<Value = (Vec<Op>, u64)> {
    let with_refusals = prop::collection::vec(
        prop_oneof![
            6 => op(3, 2),
            6 => op(1, 6),
            1 => any::<bool>().prop_map(|on| Op::Refuse { on }),
        ],
        1..80,
    );
    (with_refusals, 0..6u64).prop_map(|(ops, left)| (ops, MAX_EXACT_TOKEN - left))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, ..ProptestConfig::default() })]

    #[test]
    fn lock_matches_reference_model_at_the_counters_end_and_with_grants_refused(
        (ops, start) in ops_near_the_end()
    ) {
        if let Err(e) = run_from(&ops, start, &mut Stats::default()) {
            prop_assert!(false, "{e}");
        }
    }
}

/// The sequences near the counter's end reach every kind of refusal, and grants that need no
/// token still happen there.
#[test]
fn sequences_near_the_end_exercise_every_refusal() {
    let mut runner = TestRunner::deterministic();
    let strategy = ops_near_the_end();
    let mut stats = Stats::default();
    for _ in 0..300 {
        let (ops, start) = strategy
            .new_tree(&mut runner)
            .expect("a sequence")
            .current();
        run_from(&ops, start, &mut stats).expect("a clean run");
    }
    println!("300 sequences near the end: {stats:#?}");
    for (what, n, min) in [
        ("requests refused at once", stats.refused_direct, 100),
        (
            "waiters refused at the counter's end",
            stats.refused_exhausted,
            15,
        ),
        (
            "waiters refused while grants are refused",
            stats.refused_evictable,
            30,
        ),
        (
            "queued grants at the counter's end",
            stats.granted_at_end,
            2,
        ),
    ] {
        assert!(n >= min, "{what}: {n} (expected at least {min})");
    }
}
