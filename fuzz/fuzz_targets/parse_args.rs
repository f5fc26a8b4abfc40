//! Argument parsing and the LOCK.SYNC codec: any byte strings, split into arguments at NUL
//! bytes, must parse or fail cleanly, and anything accepted must be within the documented
//! limits. Version 2: options in any order (`WAIT`, `BIND`, `LOCKDELAY` on exclusive requests
//! only), LOCK.SEMACQUIRE's capacity, and the LOCK.SYNC state with options, the lock-delay and
//! semaphore permits, which must round-trip and keep the stored-value ranges (expiries and
//! delay ends at most `MAX_INSTANT`, token <= fence <= counter).
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_lock_core::parse::{self, Accepts};
use redis_lock_core::sync::{parse_sync, sync_state};
use redis_lock_core::{
    check_holder, MAX_CAPACITY, MAX_DURATION, MAX_INSTANT, MAX_OWNER_LEN, MAX_TOKEN,
};

fuzz_target!(|data: &[u8]| {
    let args: Vec<&[u8]> = data.split(|b| *b == 0).collect();
    for accepts in [Accepts::Exclusive, Accepts::Shared] {
        if let Ok(a) = parse::acquire(&args, accepts) {
            assert!((1..=MAX_OWNER_LEN).contains(&a.owner.len()));
            assert!((1..=MAX_DURATION).contains(&a.ttl));
            assert!(a.wait.is_none_or(|w| w <= MAX_DURATION));
            assert!(a.lock_delay <= MAX_DURATION);
            if accepts == Accepts::Shared {
                // LOCKDELAY is refused on shared requests; what they accept, LOCK.ACQUIRE
                // accepts the same way.
                assert_eq!(a.lock_delay, 0);
                assert_eq!(parse::acquire(&args, Accepts::Exclusive), Ok(a));
            }
        }
    }
    if let Ok(sem) = parse::semacquire(&args) {
        assert!((1..=MAX_CAPACITY).contains(&sem.capacity));
        assert!((1..=MAX_OWNER_LEN).contains(&sem.request.owner.len()));
        assert!((1..=MAX_DURATION).contains(&sem.request.ttl));
        assert_eq!(sem.request.lock_delay, 0);
    }
    if let Ok((owner, _all)) = parse::release(&args) {
        assert!((1..=MAX_OWNER_LEN).contains(&owner.len()));
    }
    if let Ok((owner, ttl)) = parse::extend(&args) {
        assert!((1..=MAX_OWNER_LEN).contains(&owner.len()));
        assert!((1..=MAX_DURATION).contains(&ttl));
    }
    if let Ok(q) = parse::queues(&args) {
        assert!((1..=parse::MAX_QUEUES_COUNT).contains(&q.count));
    }
    check_sync(&args);
    // The whole input as one state too: binary states hold NUL bytes (a version 2 state always
    // does: its lock-delay is at most 2^47), which the split above never passes on.
    check_sync(&[b"o", data]);
    if let Some(first) = args.first() {
        if let Some(v) = parse::parse_i64(first) {
            // Whatever parses prints back to the same text.
            assert_eq!(v.to_string().as_bytes(), *first);
        }
    }
});

fn check_sync(args: &[&[u8]]) {
    if let Ok(sync) = parse_sync(args) {
        if let Some(h) = &sync.holder {
            assert!(check_holder(sync.owner, h).is_ok());
            assert!(h.expires_at <= MAX_INSTANT && h.token <= sync.fence);
        }
        assert!(sync.fence <= sync.counter && sync.counter <= MAX_TOKEN);
        assert!(sync.delay_until <= MAX_INSTANT);
        // What was accepted encodes back to a state that parses to the same thing.
        let state = sync_state(
            sync.holder.as_ref(),
            sync.fence,
            sync.counter,
            sync.delay_until,
        );
        assert_eq!(parse_sync(&[sync.owner, state.as_bytes()]), Ok(sync));
    }
}
