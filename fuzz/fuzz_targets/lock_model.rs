//! The lock core driven by arbitrary operation sequences (4 bytes each, see
//! `reference::decode`: acquire / read with or without waiting, bound to a connection or not,
//! with or without a lock-delay; release, release ALL, extend, time passing, a waiter leaving,
//! a connection closing), compared step by step with the reference model, with the safety
//! invariants (no grant during a lock-delay, options kept on re-entry, ...) checked after every
//! step.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_lock_core::reference;

fuzz_target!(|data: &[u8]| {
    let ops = reference::decode(data);
    if let Err(e) = reference::run(&ops) {
        panic!("lock diverged from the reference model: {e}\nops: {ops:?}");
    }
});
