//! The `LOCK.SYNC` codec: how one holder's absolute state travels to replicas and the AOF.
//!
//! `LOCK.SYNC key owner state`, where `state` is one argument (Redis builds an object per
//! argument before it knows whether anything consumes propagation, so fewer arguments are
//! measurably cheaper) holding `count mode expires_at token fence counter`. `count` 0 removes
//! the owner; otherwise the owner holds the lock in `mode` until the absolute Unix time
//! `expires_at` (ms) with fencing token `token`; `fence` is the key's last granted token and
//! `counter` the module-wide fencing counter.
//!
//! Three encodings of `state` are read; the first two are written:
//! - binary version 2, only when the holder was created with BIND or LOCKDELAY, holds
//!   semaphore permits, or the key has a lock-delay pending: the byte `0x02`, the 41 bytes of
//!   version 1 after its first byte (`mode` 2 is a permit), then a flags byte (bit 0: the hold
//!   is bound), `bound_to` (the connection id on the master), `lock_delay` and `delay_until`
//!   (the key's pending lock-delay, absolute ms, 0 for none), 8 bytes each, and `capacity`
//!   (4 bytes: the semaphore's, 0 for a lock): 71 bytes;
//! - binary (written since tokens are tied to the clock, see [`crate::token_floor`]): the byte
//!   `0x01`, then `count` (8 bytes, little-endian), `mode` (1 byte: 0 write, 1 read),
//!   `expires_at`, `token`, `fence`, `counter` (8 bytes each): 42 bytes, which Redis keeps in
//!   one allocation with its object (it embeds strings up to 44 bytes), and no decimal
//!   formatting; tokens of 19 digits made the text form cost about 6% more per lock command;
//! - text, the six values separated by single spaces, `mode` as `write` / `read` (written by
//!   earlier versions, so AOF files written by them still load).
//!
//! A state is checked as strictly as an RDB load checks a saved holder ([`check_holder`]
//! here, [`crate::Lock::check_restorable`] against the holders already there).

use crate::parse::ArgError;
use crate::{
    check_holder, HoldOptions, Holder, Millis, Mode, PackedOptions, MAX_DURATION, MAX_INSTANT,
    MAX_OWNER_LEN, MAX_TOKEN,
};

/// One parsed `LOCK.SYNC`.
#[derive(Debug, PartialEq, Eq)]
pub struct Sync<'a> {
    pub owner: &'a [u8],
    /// `None` removes the owner.
    pub holder: Option<Holder>,
    pub fence: u64,
    pub counter: u64,
    /// The key's pending lock-delay after this change (absolute ms, 0 for none).
    pub delay_until: Millis,
}

/// The first byte of the binary encodings (a text state starts with a digit).
const BINARY_V1: u8 = 0x01;
const BINARY_V2: u8 = 0x02;
/// Length of the binary encodings.
const BINARY_LEN: usize = 1 + 8 + 1 + 8 * 4;
const BINARY_V2_LEN: usize = BINARY_LEN + 1 + 8 * 3 + 4;

/// The binary state argument of `LOCK.SYNC` (see the module docs), built on the stack: this
/// runs for every holder a lock command changes.
pub struct SyncState {
    buf: [u8; BINARY_V2_LEN],
    len: usize,
}

impl SyncState {
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&self.buf)
    }
}

fn mode_byte(mode: Mode) -> u8 {
    match mode {
        Mode::Write => 0,
        Mode::Read => 1,
        Mode::Permit => 2,
    }
}

/// The state of one owner after a change: its hold (`None` when it has none), the key's last
/// token (`fence`), the module-wide counter and the key's pending lock-delay.
#[inline]
pub fn sync_state(
    holder: Option<&Holder>,
    fence: u64,
    counter: u64,
    delay_until: Millis,
) -> SyncState {
    let (count, mode, expires_at, token, options, capacity) = match holder {
        Some(h) => (
            h.count,
            h.mode,
            h.expires_at,
            h.token,
            &h.options,
            h.capacity,
        ),
        None => (0, Mode::Write, 0, 0, &PackedOptions::NONE, 0),
    };
    let mut state = SyncState {
        buf: [0u8; BINARY_V2_LEN],
        len: BINARY_LEN,
    };
    let buf = &mut state.buf;
    buf[0] = BINARY_V1;
    buf[1..9].copy_from_slice(&count.to_le_bytes());
    buf[9] = mode_byte(mode);
    for (i, v) in [expires_at, token, fence, counter].into_iter().enumerate() {
        let at = 10 + 8 * i;
        buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    if !options.is_none() || delay_until != 0 || capacity != 0 {
        add_version_2(&mut state, options.get(), delay_until, capacity);
    }
    state
}

/// Turns a version 1 state into version 2 (rare: holds with options, running delays).
#[cold]
fn add_version_2(state: &mut SyncState, options: HoldOptions, delay_until: Millis, capacity: u32) {
    state.buf[0] = BINARY_V2;
    state.buf[BINARY_LEN] = u8::from(options.bound_to.is_some());
    let extra = [
        options.bound_to.unwrap_or(0),
        options.lock_delay,
        delay_until,
    ];
    for (i, v) in extra.into_iter().enumerate() {
        let at = BINARY_LEN + 1 + 8 * i;
        state.buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    let at = BINARY_LEN + 1 + 8 * 3;
    state.buf[at..at + 4].copy_from_slice(&capacity.to_le_bytes());
    state.len = BINARY_V2_LEN;
}

/// The values of a state, in any encoding.
struct Decoded {
    count: u64,
    mode: Mode,
    expires_at: u64,
    token: u64,
    fence: u64,
    counter: u64,
    options: HoldOptions,
    delay_until: Millis,
    capacity: u32,
}

fn decode(state: &[u8]) -> Result<Decoded, ArgError> {
    let u64_at = |at: usize| -> Result<u64, ArgError> {
        state
            .get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
            .ok_or(ArgError::Syntax)
    };
    if state.first() == Some(&BINARY_V2) {
        if state.len() != BINARY_V2_LEN {
            return Err(ArgError::Syntax);
        }
        let bound = match state.get(BINARY_LEN) {
            Some(0) => false,
            Some(1) => true,
            _ => return Err(ArgError::Syntax),
        };
        let bound_to = u64_at(BINARY_LEN + 1)?;
        let lock_delay = u64_at(BINARY_LEN + 9)?;
        let delay_until = u64_at(BINARY_LEN + 17)?;
        if lock_delay > MAX_DURATION {
            return Err(ArgError::Syntax);
        }
        let capacity = state
            .get(BINARY_LEN + 25..BINARY_LEN + 29)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
            .ok_or(ArgError::Syntax)?;
        let mut v1 = state.get(..BINARY_LEN).ok_or(ArgError::Syntax)?.to_vec();
        v1[0] = BINARY_V1;
        // Mode 2 (a permit) exists in version 2 only.
        let permit = v1.get(9) == Some(&2);
        if permit {
            v1[9] = 0;
        }
        let mut decoded = decode(&v1)?;
        if permit {
            decoded.mode = Mode::Permit;
        }
        decoded.options = HoldOptions {
            user: crate::UNKNOWN_USER,
            bound_to: bound.then_some(bound_to),
            lock_delay,
        };
        decoded.delay_until = delay_until;
        decoded.capacity = capacity;
        return Ok(decoded);
    }
    if state.first() == Some(&BINARY_V1) {
        if state.len() != BINARY_LEN {
            return Err(ArgError::Syntax);
        }
        let mode = match state.get(9) {
            Some(0) => Mode::Write,
            Some(1) => Mode::Read,
            _ => return Err(ArgError::Syntax),
        };
        return Ok(Decoded {
            count: u64_at(1)?,
            mode,
            expires_at: u64_at(10)?,
            token: u64_at(18)?,
            fence: u64_at(26)?,
            counter: u64_at(34)?,
            options: HoldOptions::default(),
            delay_until: 0,
            capacity: 0,
        });
    }
    let fields: Vec<&[u8]> = state.split(|b| *b == b' ').collect();
    let [count, mode, expires_at, token, fence, counter] = fields[..] else {
        return Err(ArgError::Syntax);
    };
    let number = |b: &[u8]| {
        crate::parse::parse_i64(b)
            .and_then(|v| u64::try_from(v).ok())
            .ok_or(ArgError::Syntax)
    };
    let mode = match mode {
        b"write" => Mode::Write,
        b"read" => Mode::Read,
        _ => return Err(ArgError::Syntax),
    };
    Ok(Decoded {
        count: number(count)?,
        mode,
        expires_at: number(expires_at)?,
        token: number(token)?,
        fence: number(fence)?,
        counter: number(counter)?,
        options: HoldOptions::default(),
        delay_until: 0,
        capacity: 0,
    })
}

/// Parses `owner state` (see the module docs).
pub fn parse_sync<'a>(args: &[&'a [u8]]) -> Result<Sync<'a>, ArgError> {
    let [owner, state] = args else {
        return Err(ArgError::Arity);
    };
    if owner.is_empty() || owner.len() > MAX_OWNER_LEN {
        return Err(ArgError::Owner);
    }
    let Decoded {
        count,
        mode,
        expires_at,
        token,
        fence,
        counter,
        options,
        delay_until,
        capacity,
    } = decode(state)?;
    let holder = (count > 0).then(|| Holder {
        user: crate::UNKNOWN_USER,
        mode,
        capacity,
        count,
        expires_at,
        token,
        granted_at: 0,
        options: PackedOptions::new(options),
    });
    // The same rules as an RDB load: a holder with a token that was never issued is refused.
    // Tokens never above the key's fence, nor that above the module-wide counter: on the
    // master the counter issued them all.
    if let Some(h) = &holder {
        check_holder(owner, h).map_err(|_| ArgError::Syntax)?;
        if h.token > fence {
            return Err(ArgError::Syntax);
        }
    }
    if fence > counter || counter > MAX_TOKEN || delay_until > MAX_INSTANT {
        return Err(ArgError::Syntax);
    }
    Ok(Sync {
        owner,
        holder,
        fence,
        counter,
        delay_until,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Lock;

    #[test]
    fn sync_round_trips_a_holder_and_a_removal() {
        let mut lock = Lock::new();
        let mut fences = crate::FenceCounter::default();
        let mut events = Vec::new();
        let mut step = crate::Step {
            now: 1_000,
            fences: &mut fences,
            events: &mut events,
            refuse: None,
        };
        lock.acquire(b"me", Mode::Read, 500, None, &mut step);
        let h = lock.holders().get(b"me").cloned().unwrap();
        let state = sync_state(Some(&h), lock.fence(), 7, 0);
        let sync = parse_sync(&[b"me", state.as_bytes()]).unwrap();
        assert_eq!(sync.owner, b"me");
        // The grant time is this server's own figure: it does not travel.
        assert_eq!(sync.holder, Some(Holder { granted_at: 0, ..h }));
        assert_eq!((sync.fence, sync.counter), (1, 7));
        let gone = sync_state(None, 1, 7, 0);
        assert_eq!(
            parse_sync(&[b"other", gone.as_bytes()]).unwrap().holder,
            None
        );
    }

    #[test]
    fn the_binary_state_is_42_bytes_and_round_trips_extreme_values() {
        for v in [0, 1, 255, 1 << 40, MAX_TOKEN] {
            let h = Holder {
                user: crate::UNKNOWN_USER,
                mode: Mode::Read,
                capacity: 0,
                count: 1,
                expires_at: MAX_INSTANT,
                token: v.max(1),
                granted_at: 0,
                options: PackedOptions::default(),
            };
            let state = sync_state(Some(&h), v.max(1), v.max(1), 0);
            assert_eq!(state.as_bytes().len(), 42);
            let sync = parse_sync(&[b"o", state.as_bytes()]).unwrap();
            assert_eq!(sync.holder, Some(h));
            assert_eq!((sync.fence, sync.counter), (v.max(1), v.max(1)));
        }
    }

    #[test]
    fn the_text_state_of_earlier_versions_still_parses() {
        let sync = parse_sync(&[b"me", b"2 read 1795440190000 12 12 40"]).unwrap();
        assert_eq!(
            sync.holder,
            Some(Holder {
                user: crate::UNKNOWN_USER,
                mode: Mode::Read,
                capacity: 0,
                count: 2,
                expires_at: 1_795_440_190_000,
                token: 12,
                granted_at: 0,
                options: PackedOptions::default(),
            })
        );
        assert_eq!((sync.fence, sync.counter), (12, 40));
        let gone = parse_sync(&[b"me", b"0 write 0 0 12 40"]).unwrap();
        assert_eq!(gone.holder, None);
    }

    #[test]
    fn a_malformed_binary_state_is_refused() {
        let holder = |token| Holder {
            user: crate::UNKNOWN_USER,
            mode: Mode::Write,
            capacity: 0,
            count: 1,
            expires_at: 10,
            token,
            granted_at: 0,
            options: PackedOptions::default(),
        };
        let good = sync_state(Some(&holder(1)), 1, 3, 0);
        let bytes = good.as_bytes();
        // Truncated, extended, an unknown mode byte, a token that was never issued.
        let mut bad_mode = bytes.to_vec();
        bad_mode[9] = 7;
        let zero_token = sync_state(Some(&holder(0)), 1, 3, 0);
        let big_fence = sync_state(None, MAX_TOKEN + 1, 3, 0);
        // Out of range or inconsistent: expiries past MAX_INSTANT (2^63 and 2^64 - 1 among
        // them), a token above the fence, a fence above the counter, a delay end past the range,
        // a lock-delay on a reader, a count above the RESP integer range.
        let expiry = |at| {
            sync_state(
                Some(&Holder {
                    expires_at: at,
                    ..holder(1)
                }),
                1,
                3,
                0,
            )
        };
        let (expiry_big, expiry_2_63, expiry_max) =
            (expiry(MAX_INSTANT + 1), expiry(1 << 63), expiry(u64::MAX));
        let above_fence = sync_state(Some(&holder(2)), 1, 3, 0);
        let fence_above_counter = sync_state(Some(&holder(1)), 4, 3, 0);
        let late_delay = sync_state(None, 1, 3, MAX_INSTANT + 1);
        let reader_delay = sync_state(
            Some(&Holder {
                mode: Mode::Read,
                options: PackedOptions::new(HoldOptions {
                    user: crate::UNKNOWN_USER,
                    bound_to: None,
                    lock_delay: 5,
                }),
                ..holder(1)
            }),
            1,
            3,
            0,
        );
        let huge_count = sync_state(
            Some(&Holder {
                count: u64::MAX,
                ..holder(1)
            }),
            1,
            3,
            0,
        );
        for bad in [
            &bytes[..41],
            &[bytes, &[0u8][..]].concat()[..],
            &bad_mode[..],
            zero_token.as_bytes(),
            big_fence.as_bytes(),
            expiry_big.as_bytes(),
            expiry_2_63.as_bytes(),
            expiry_max.as_bytes(),
            above_fence.as_bytes(),
            fence_above_counter.as_bytes(),
            late_delay.as_bytes(),
            reader_delay.as_bytes(),
            huge_count.as_bytes(),
        ] {
            assert_eq!(parse_sync(&[b"o", bad]), Err(ArgError::Syntax), "{bad:?}");
        }
    }

    #[test]
    fn sync_rejects_malformed_arguments() {
        let ok: &[u8] = b"1 write 10 1 1 3";
        assert!(parse_sync(&[b"o", ok]).is_ok());
        for bad in [
            &b"1 exclusive 10 1 1 3"[..],
            b"-1 write 10 1 1 3",
            b"1 write 10 1 1",
            b"1 write 10 1 1 3 4",
            b"1  write 10 1 1 3",
            b"",
            b"1 write 10 1 1 x",
            // A holder with token 0 (never issued), or tokens beyond the RESP integer range.
            b"1 write 10 0 1 3",
            b"1 write 10 9223372036854775808 1 3",
            b"1 write 10 1 9223372036854775808 3",
        ] {
            assert_eq!(parse_sync(&[b"o", bad]), Err(ArgError::Syntax), "{bad:?}");
        }
        assert_eq!(parse_sync(&[b"", ok]), Err(ArgError::Owner));
        assert_eq!(parse_sync(&[b"o"]), Err(ArgError::Arity));
    }

    #[test]
    fn options_and_a_pending_delay_travel_in_version_2() {
        let bound = Holder {
            user: crate::UNKNOWN_USER,
            mode: Mode::Write,
            capacity: 0,
            count: 3,
            expires_at: 5_000,
            token: 9,
            granted_at: 0,
            options: PackedOptions::new(HoldOptions {
                user: crate::UNKNOWN_USER,
                bound_to: Some(0),
                lock_delay: MAX_DURATION,
            }),
        };
        let state = sync_state(Some(&bound), 9, 11, 0);
        assert_eq!(state.as_bytes().len(), 71);
        let sync = parse_sync(&[b"o", state.as_bytes()]).unwrap();
        assert_eq!(sync.holder, Some(bound));
        assert_eq!((sync.fence, sync.counter, sync.delay_until), (9, 11, 0));
        let removal = sync_state(None, 9, 11, 123_456);
        assert_eq!(removal.as_bytes().len(), 71);
        let sync = parse_sync(&[b"o", removal.as_bytes()]).unwrap();
        assert_eq!((sync.holder, sync.delay_until), (None, 123_456));
        // Version 1 stays the form for everything without options.
        assert_eq!(sync_state(None, 9, 11, 0).as_bytes().len(), 42);
    }

    #[test]
    fn a_malformed_version_2_state_is_refused() {
        let good = sync_state(None, 1, 3, 50);
        let bytes = good.as_bytes();
        let mut bad_flags = bytes.to_vec();
        bad_flags[42] = 2;
        let mut long_delay = bytes.to_vec();
        long_delay[51..59].copy_from_slice(&(MAX_DURATION + 1).to_le_bytes());
        for bad in [
            &bytes[..66],
            &bytes[..42],
            &[bytes, &[0u8][..]].concat()[..],
            &bad_flags[..],
            &long_delay[..],
        ] {
            assert_eq!(parse_sync(&[b"o", bad]), Err(ArgError::Syntax), "{bad:?}");
        }
    }

    #[test]
    fn a_permit_travels_in_version_2_with_its_capacity() {
        let permit = Holder {
            user: crate::UNKNOWN_USER,
            mode: Mode::Permit,
            capacity: crate::MAX_CAPACITY,
            count: 2,
            expires_at: 5_000,
            token: 9,
            granted_at: 0,
            options: PackedOptions::default(),
        };
        let state = sync_state(Some(&permit), 9, 11, 0);
        assert_eq!(state.as_bytes().len(), 71);
        assert_eq!(
            parse_sync(&[b"o", state.as_bytes()]).unwrap().holder,
            Some(permit)
        );
        // Mode 2 in a version 1 state, or a permit whose capacity is out of range: refused.
        let mut v1 = sync_state(None, 9, 11, 0).as_bytes().to_vec();
        v1[9] = 2;
        assert_eq!(parse_sync(&[b"o", &v1]), Err(ArgError::Syntax));
        let zero = Holder {
            user: crate::UNKNOWN_USER,
            mode: Mode::Permit,
            capacity: 0,
            count: 1,
            expires_at: 5_000,
            token: 9,
            granted_at: 0,
            options: PackedOptions::default(),
        };
        let state = sync_state(Some(&zero), 9, 11, 0);
        assert_eq!(parse_sync(&[b"o", state.as_bytes()]), Err(ArgError::Syntax));
    }
}
