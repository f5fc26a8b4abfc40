//! Property tests: random operation sequences run on [`Lock`] and on the reference model
//! (`reference.rs`), compared step by step, with the safety invariants checked after every
//! step.

use proptest::prelude::*;

use super::reference::{run, Op, OWNERS};
use super::*;

fn op() -> impl Strategy<Value = Op> {
    let mode = prop_oneof![Just(Mode::Write), Just(Mode::Read)];
    prop_oneof![
        4 => (0..OWNERS, mode, 1..60u64, any::<bool>())
            .prop_map(|(owner, mode, ttl, wait)| Op::Acquire { owner, mode, ttl, wait }),
        3 => (0..OWNERS, prop::bool::weighted(0.2)).prop_map(|(owner, all)| Op::Release { owner, all }),
        1 => (0..OWNERS, 1..60u64).prop_map(|(owner, ttl)| Op::Extend { owner, ttl }),
        2 => (0..40u64).prop_map(|ms| Op::Advance { ms }),
        1 => any::<usize>().prop_map(|nth| Op::Cancel { nth }),
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
}
