//! Property tests: random operation sequences run on [`Lock`] and on the reference model
//! (`reference.rs`), compared step by step, with the safety invariants checked after every
//! step.

use proptest::prelude::*;

use super::reference::{decode, run, Op, CONNS, OWNERS};
use super::*;

fn op() -> impl Strategy<Value = Op> {
    let mode = prop_oneof![Just(Mode::Write), Just(Mode::Read)];
    // Most requests are plain; a third bind to a connection, a third carry a lock-delay
    // (shorter than most ttls, so that delays, expiries and waits overlap).
    let bind = prop_oneof![2 => Just(None), 1 => (0..CONNS).prop_map(Some)];
    let lock_delay = prop_oneof![2 => Just(0), 1 => 1..40u64];
    prop_oneof![
        4 => (0..OWNERS, mode, 1..60u64, any::<bool>(), bind, lock_delay).prop_map(
            |(owner, mode, ttl, wait, bind, lock_delay)| Op::Acquire {
                owner,
                mode,
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn lock_matches_reference_model(ops in prop::collection::vec(op(), 1..80)) {
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

/// The fuzz decoder reaches every operation and every option.
#[test]
fn decoder_reaches_every_op_and_option() {
    let data: Vec<u8> = (0..=255u8)
        .flat_map(|b| [b % 12, b, b, b.wrapping_mul(7)])
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
}
