//! Argument parsing and the LOCK.SYNC codec: any byte strings, split into arguments at NUL
//! bytes, must parse or fail cleanly, and anything accepted must be within the documented
//! limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_lock_core::sync::parse_sync;
use redis_lock_core::{check_holder, parse, MAX_DURATION, MAX_OWNER_LEN, MAX_TOKEN};

fuzz_target!(|data: &[u8]| {
    let args: Vec<&[u8]> = data.split(|b| *b == 0).collect();
    if let Ok(a) = parse::acquire(&args) {
        assert!((1..=MAX_OWNER_LEN).contains(&a.owner.len()));
        assert!((1..=MAX_DURATION).contains(&a.ttl));
        assert!(a.wait.is_none_or(|w| w <= MAX_DURATION));
    }
    if let Ok((owner, _all)) = parse::release(&args) {
        assert!((1..=MAX_OWNER_LEN).contains(&owner.len()));
    }
    if let Ok((owner, ttl)) = parse::extend(&args) {
        assert!((1..=MAX_OWNER_LEN).contains(&owner.len()));
        assert!((1..=MAX_DURATION).contains(&ttl));
    }
    if let Ok(sync) = parse_sync(&args) {
        if let Some(h) = &sync.holder {
            assert!(check_holder(sync.owner, h).is_ok());
        }
        assert!(sync.fence <= MAX_TOKEN && sync.counter <= MAX_TOKEN);
    }
    if let Some(first) = args.first() {
        if let Some(v) = parse::parse_i64(first) {
            // Whatever parses prints back to the same text.
            assert_eq!(v.to_string().as_bytes(), *first);
        }
    }
});
