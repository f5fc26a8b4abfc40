//! The stored-value decoder (`redis_lock_core::stored`, what RDB load and RESTORE run) fed
//! arbitrary fields: the first byte picks the encoding version (0 to 3), the next 8 the clock,
//! the rest are the fields in `ByteSource`'s form. Whatever it accepts must
//! - encode back to the same fields (nothing read is lost or invented),
//! - satisfy the lock's safety invariants once settled at that clock (one writer at most and
//!   never beside a reader, counts >= 1, permits within one capacity, ...),
//! - and then survive any sequence of lock operations at any later time without a panic,
//!   with the invariants after each (the module would reply "internal error" where the core
//!   panics, and every time it computes must stay in range).
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_lock_core::reference::check_invariants;
use redis_lock_core::stored::{decode, encode, ByteSink, ByteSource, ENCODING_VERSION};
use redis_lock_core::{
    FenceCounter, HoldOptions, Lock, Mode, Request, Step, UserId, WaiterId, MAX_DURATION,
    MAX_INSTANT, MAX_TOKEN,
};

fn run_ops(lock: &mut Lock, mut now: u64, ops: &[u8], fences: &mut FenceCounter) {
    let mut events = Vec::new();
    let owners: [&[u8]; 3] = [b"a", b"b", b"c"];
    for (i, op) in ops.chunks(2).enumerate() {
        let (kind, arg) = (op[0], *op.get(1).unwrap_or(&0));
        let owner = owners[usize::from(arg % 3)];
        let ttl = match arg >> 2 {
            0 => MAX_DURATION,
            n => u64::from(n) * 100,
        };
        let mut step = Step {
            now,
            fences: &mut *fences,
            events: &mut events,
            refuse: None,
        };
        match kind % 8 {
            0..=2 => {
                let mode = [Mode::Write, Mode::Read, Mode::Permit][usize::from(kind % 8)];
                let req = Request {
                    owner,
                    mode,
                    ttl,
                    options: HoldOptions {
                        bound_to: (arg & 0x80 != 0).then_some(7),
                        lock_delay: if mode == Mode::Write {
                            u64::from(arg & 3) * 50
                        } else {
                            0
                        },
                        // Two users, or unknown: the user travels with the hold, not stored.
                        user: UserId::from((arg & 0x60) >> 5),
                    },
                    capacity: if mode == Mode::Permit {
                        u32::from(arg % 4) + 1
                    } else {
                        0
                    },
                };
                let wait = (kind & 0x10 != 0).then_some(WaiterId(i as u64 + 1));
                let _ = lock.request(req, wait, &mut step);
            }
            3 => {
                let _ = lock.release(owner, arg & 1 != 0, &mut step);
            }
            4 => {
                let _ = lock.extend(owner, ttl, &mut step);
            }
            5 => {
                let _ = lock.end_bound(|c| c == 7, &mut step);
            }
            6 => {
                let _ = lock.cancel_waiter(WaiterId(u64::from(arg)), &mut step);
            }
            _ => {
                // Time passes, by up to 2^arg ms (MAX_INSTANT and beyond included).
                now = now.saturating_add(1u64 << (arg % 50));
            }
        }
        let mut step = Step {
            now,
            fences: &mut *fences,
            events: &mut events,
            refuse: None,
        };
        lock.settle(&mut step);
        if let Err(e) = check_invariants(lock, now) {
            panic!("invariant broken after op {i} ({kind}, {arg}) at {now}: {e}");
        }
        assert!(lock.fence() <= MAX_TOKEN);
        events.clear();
    }
}

fuzz_target!(|data: &[u8]| {
    let (Some(&version), Some(clock)) = (data.first(), data.get(1..9)) else {
        return;
    };
    // 0 to 4: every version this build reads, and one on each side that it refuses.
    let encver = i32::from(version % 5);
    let now = u64::from_le_bytes(clock.try_into().unwrap()) % (MAX_INSTANT + 2);
    let rest = &data[9..];
    // Operations after the fields: a length byte says how much of the rest are fields.
    let (fields, ops) = match rest.split_first() {
        Some((&n, tail)) => {
            let n = (usize::from(n) * 4).min(tail.len());
            (&tail[n..], &tail[..n])
        }
        None => return,
    };
    let mut source = ByteSource::new(fields);
    let Ok(decoded) = decode(&mut source, encver) else {
        return;
    };
    let mut lock = decoded.lock;
    assert_eq!(decoded.max_token, lock.fence());
    assert!(lock.fence() <= MAX_TOKEN);

    // What was read is what is written (the current encoding: an older value gains its
    // defaults, so compare against a re-decode instead).
    let mut sink = ByteSink::default();
    encode(&mut sink, &lock);
    let again = decode(&mut ByteSource::new(&sink.bytes), ENCODING_VERSION)
        .expect("an encoded value decodes");
    let mut sink2 = ByteSink::default();
    encode(&mut sink2, &again.lock);
    assert_eq!(sink.bytes, sink2.bytes);
    // With at most one holder the order of holders cannot differ: the very same fields.
    if encver == ENCODING_VERSION && lock.holders().len() <= 1 {
        let consumed = fields.len() - source.rest().len();
        assert_eq!(sink.bytes, fields[..consumed]);
    }

    // Settled at the clock, it keeps every invariant; then operations keep them too.
    let mut fences = FenceCounter::default();
    let _ = fences.observe(decoded.max_token);
    let mut events = Vec::new();
    let mut step = Step {
        now,
        fences: &mut fences,
        events: &mut events,
        refuse: None,
    };
    lock.settle(&mut step);
    if let Err(e) = check_invariants(&lock, now) {
        panic!("an accepted value breaks an invariant at {now}: {e}");
    }
    run_ops(&mut lock, now, ops, &mut fences);
});
