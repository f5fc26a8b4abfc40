//! The lock core driven by arbitrary operation sequences (4 bytes each, see
//! `reference::decode`: acquire / read with or without waiting, bound to a connection or not,
//! with or without a lock-delay; a semaphore permit of capacity 1 to 3, waiting or not, bound
//! or not; release, release ALL, extend, time passing, a waiter leaving, a connection closing),
//! compared step by step with the reference model, with the safety invariants (no grant during
//! a lock-delay, options kept on re-entry, never more permits than the capacity, permits never
//! beside a lock, the key's kind and capacity kept while it exists, an owner's token kept
//! across its extra permits, ...) checked after every step. The same key goes from lock to
//! semaphore and back as it empties.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_lock_core::reference;

fuzz_target!(|data: &[u8]| {
    let ops = reference::decode(data);
    if let Err(e) = reference::run(&ops) {
        panic!("lock diverged from the reference model: {e}\nops: {ops:?}");
    }
});
