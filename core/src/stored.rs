//! The stored form of a lock value: what an RDB file, a `DUMP` payload and a full
//! resynchronisation carry for one key, read back by RDB load and `RESTORE` alike.
//!
//! Redis hands the module its stored fields one at a time (an unsigned integer, a string), so
//! the codec is written against two small traits, [`FieldSource`] and [`FieldSink`]: the
//! module implements them over Redis's RDB handles, the fuzz target and the tests over plain
//! bytes ([`ByteSource`], [`ByteSink`]). Decoding and checking are one pass, and nothing
//! outside the returned [`Decoded`] is touched, so a value that is refused half-way changed
//! nothing (the caller raises the fencing counter only once the whole value is accepted).
//!
//! Encoding, version 3 (waiters are connections and are never stored): `fence` (unsigned),
//! `holder count` (unsigned), then per holder `owner` (string), `mode` (unsigned: 0 write, 1
//! read, 2 semaphore permit), `count`, `expires_at` (absolute Unix ms), `token`, `bound` (0, or
//! 1 followed by the connection id), `lock_delay`, `capacity` (the semaphore's, 0 for a lock),
//! `granted_at` (when the hold began, absolute Unix ms, 0 when unknown); then `delay_until`
//! (the pending lock-delay's end, absolute Unix ms, 0 for none).
//! Version 2 (module version 0.1.0 and 0.2.x) is version 3 without `granted_at`: its holds
//! load with their start unknown. Version 1, written before BIND, LOCKDELAY and semaphores, is
//! version 2 without the per-holder `bound`, `lock_delay` and `capacity` and without
//! `delay_until`, modes 0 and 1 only. Both are still read.
//!
//! What a value must satisfy to be accepted (anything else is refused with the reason):
//! the fence at most [`MAX_TOKEN`]; every holder as [`check_holder`] wants it (owner of 1 to
//! [`MAX_OWNER_LEN`] bytes, count 1 to [`crate::MAX_COUNT`], token 1 to [`MAX_TOKEN`], expiry
//! at most [`MAX_INSTANT`], a lock-delay of at most [`crate::MAX_DURATION`] and on an exclusive
//! hold only, a capacity 1 to [`crate::MAX_CAPACITY`] covering its count on a permit and 0 on a
//! lock hold, a start at most [`MAX_INSTANT`]); its token at most the fence; owners unique; no writer beside another holder,
//! permits only beside permits of the same capacity and never more than it
//! ([`Lock::check_restorable`]); a pending lock-delay only while nobody holds the lock and
//! ending by [`MAX_INSTANT`].

use crate::{
    check_holder, HoldOptions, Holder, Lock, Millis, Mode, PackedOptions, MAX_INSTANT,
    MAX_OWNER_LEN, MAX_TOKEN,
};

/// The newest encoding version, the one written.
pub const ENCODING_VERSION: i32 = 3;

/// Where stored fields are read from, one at a time.
pub trait FieldSource {
    /// The next field as an unsigned integer.
    fn unsigned(&mut self) -> Result<u64, String>;
    /// The next field as a string of at most `max` bytes: a longer one is an error, reported
    /// before anything of its length is allocated where the source can tell.
    fn bytes(&mut self, max: usize) -> Result<Vec<u8>, String>;
}

/// Where stored fields are written to.
pub trait FieldSink {
    fn unsigned(&mut self, v: u64);
    fn bytes(&mut self, b: &[u8]);
}

/// An accepted value: the lock, and the largest token it carries (its fence), which the
/// caller's fencing counter must observe.
#[derive(Debug)]
pub struct Decoded {
    pub lock: Lock,
    pub max_token: u64,
}

fn mode_code(mode: Mode) -> u64 {
    match mode {
        Mode::Write => 0,
        Mode::Read => 1,
        Mode::Permit => 2,
    }
}

/// Writes `lock` in the current encoding.
pub fn encode(sink: &mut impl FieldSink, lock: &Lock) {
    sink.unsigned(lock.fence());
    sink.unsigned(lock.holders().len() as u64);
    for (owner, h) in lock.holders().iter() {
        sink.bytes(owner);
        sink.unsigned(mode_code(h.mode));
        sink.unsigned(h.count);
        sink.unsigned(h.expires_at);
        sink.unsigned(h.token);
        let options = h.options.get();
        match options.bound_to {
            Some(conn) => {
                sink.unsigned(1);
                sink.unsigned(conn);
            }
            None => sink.unsigned(0),
        }
        sink.unsigned(options.lock_delay);
        sink.unsigned(u64::from(h.capacity));
        sink.unsigned(h.granted_at);
    }
    sink.unsigned(lock.delay_until());
}

/// Reads and checks one value written with encoding version `encver` (see the module docs for
/// what is refused). The lock is built on its own fencing counter: the caller's is not touched.
pub fn decode(source: &mut impl FieldSource, encver: i32) -> Result<Decoded, String> {
    decode_with(source, encver, Bindings::Keep)
}

/// What a decoded value's bound holds (`BIND`) keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bindings {
    /// Their connection ids, as saved: an RDB load or a full resynchronisation (the ids are
    /// then checked against this server's connections: a master ends them after loading, a
    /// replica keeps them until its promotion).
    Keep,
    /// None: the holds become plain TTL holds. For a value that arrives by `RESTORE` (what
    /// `MIGRATE` and cluster resharding send), whose connection ids name connections of
    /// another server: matching them against this server's ids could end a hold when an
    /// unrelated connection with the same id closes here.
    Drop,
}

/// [`decode`], saying what bound holds keep.
pub fn decode_with(
    source: &mut impl FieldSource,
    encver: i32,
    bindings: Bindings,
) -> Result<Decoded, String> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return Err(format!(
            "encoding version {encver} (this build reads 1 to {ENCODING_VERSION})"
        ));
    }
    let with_options = encver >= 2;
    let with_start = encver >= 3;
    let fence = source.unsigned()?;
    if fence > MAX_TOKEN {
        return Err("fence out of range".into());
    }
    // Not used to allocate: a count larger than the holders present ends at the data's end.
    let n = source.unsigned()?;
    let mut lock = Lock::new();
    let mut local = crate::FenceCounter::default();
    lock.restore_fence(fence, &mut local);
    for _ in 0..n {
        let owner = source.bytes(MAX_OWNER_LEN)?;
        let mode = match source.unsigned()? {
            0 => Mode::Write,
            1 => Mode::Read,
            2 if with_options => Mode::Permit,
            m => return Err(format!("unknown mode {m}")),
        };
        let count = source.unsigned()?;
        let expires_at = source.unsigned()?;
        let token = source.unsigned()?;
        let mut options = HoldOptions::default();
        let mut capacity = 0;
        if with_options {
            options.bound_to = match source.unsigned()? {
                0 => None,
                1 => Some(source.unsigned()?),
                b => return Err(format!("unknown bound flag {b}")),
            };
            if bindings == Bindings::Drop {
                options.bound_to = None;
            }
            options.lock_delay = source.unsigned()?;
            capacity = u32::try_from(source.unsigned()?).map_err(|_| "capacity out of range")?;
        }
        // The start is not compared with the expiry: a wall clock stepped back between a grant
        // and an extend leaves a start after the expiry, which is harmless (ages saturate at 0).
        let granted_at: Millis = if with_start { source.unsigned()? } else { 0 };
        if granted_at > MAX_INSTANT {
            return Err("hold start out of range".into());
        }
        if lock.holders().get(&owner).is_some() {
            return Err("duplicate owner".into());
        }
        let holder = Holder {
            user: crate::UNKNOWN_USER,
            mode,
            capacity,
            count,
            expires_at,
            token,
            granted_at,
            options: PackedOptions::new(options),
        };
        check_holder(&owner, &holder).map_err(|e| e.message().to_string())?;
        if token > fence {
            return Err("a token above the key's fence".into());
        }
        lock.check_restorable(&owner, &holder)
            .map_err(|e| e.message().to_string())?;
        lock.restore_holder(&owner, holder, &mut local);
    }
    if with_options {
        let delay_until: Millis = source.unsigned()?;
        if delay_until > MAX_INSTANT {
            return Err("lock-delay end out of range".into());
        }
        if delay_until != 0 && !lock.holders().is_empty() {
            return Err("a lock-delay beside holders".into());
        }
        lock.restore_delay(delay_until);
    }
    Ok(Decoded {
        max_token: lock.fence(),
        lock,
    })
}

/// A [`FieldSource`] over plain bytes, for the fuzz target and tests: an unsigned field is 8
/// bytes little-endian, a string a 4-byte little-endian length and its bytes.
pub struct ByteSource<'a> {
    rest: &'a [u8],
}

impl<'a> ByteSource<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        ByteSource { rest: bytes }
    }

    /// What has not been read.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.rest.len() < n {
            return Err("unexpected end of data".into());
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }
}

impl FieldSource for ByteSource<'_> {
    fn unsigned(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(
            <[u8; 8]>::try_from(b).map_err(|_| "short field")?,
        ))
    }

    fn bytes(&mut self, max: usize) -> Result<Vec<u8>, String> {
        let b = self.take(4)?;
        let len = u32::from_le_bytes(<[u8; 4]>::try_from(b).map_err(|_| "short field")?);
        let len = usize::try_from(len).map_err(|_| "string too long")?;
        if len > max {
            return Err("string too long".into());
        }
        Ok(self.take(len)?.to_vec())
    }
}

/// The [`FieldSink`] that [`ByteSource`] reads.
#[derive(Default)]
pub struct ByteSink {
    pub bytes: Vec<u8>,
}

impl FieldSink for ByteSink {
    fn unsigned(&mut self, v: u64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    fn bytes(&mut self, b: &[u8]) {
        let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
        self.bytes.extend_from_slice(&len.to_le_bytes());
        self.bytes.extend_from_slice(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FenceCounter, Request, Step, MAX_CAPACITY, MAX_COUNT, MAX_DURATION};

    fn encoded(lock: &Lock) -> Vec<u8> {
        let mut sink = ByteSink::default();
        encode(&mut sink, lock);
        sink.bytes
    }

    fn decode_bytes(bytes: &[u8], encver: i32) -> Result<Lock, String> {
        let mut source = ByteSource::new(bytes);
        let d = decode(&mut source, encver)?;
        assert!(source.rest().is_empty(), "trailing bytes");
        Ok(d.lock)
    }

    /// Fields of one holder in version 3, in order (version 2 leaves out `granted_at`).
    struct H<'a> {
        owner: &'a [u8],
        mode: u64,
        count: u64,
        expires_at: u64,
        token: u64,
        bound: Option<u64>,
        lock_delay: u64,
        capacity: u64,
        granted_at: u64,
    }

    fn h(owner: &[u8], mode: u64, token: u64) -> H<'_> {
        H {
            owner,
            mode,
            count: 1,
            expires_at: 2_000_000_000_000,
            token,
            bound: None,
            lock_delay: 0,
            capacity: if mode == 2 { 3 } else { 0 },
            granted_at: 1_999_999_000_000,
        }
    }

    fn v2(fence: u64, holders: &[H<'_>], delay_until: u64) -> Vec<u8> {
        written(2, fence, holders, delay_until)
    }

    fn v3(fence: u64, holders: &[H<'_>], delay_until: u64) -> Vec<u8> {
        written(3, fence, holders, delay_until)
    }

    fn written(encver: i32, fence: u64, holders: &[H<'_>], delay_until: u64) -> Vec<u8> {
        let mut s = ByteSink::default();
        s.unsigned(fence);
        s.unsigned(holders.len() as u64);
        for x in holders {
            FieldSink::bytes(&mut s, x.owner);
            s.unsigned(x.mode);
            s.unsigned(x.count);
            s.unsigned(x.expires_at);
            s.unsigned(x.token);
            match x.bound {
                Some(c) => {
                    s.unsigned(1);
                    s.unsigned(c);
                }
                None => s.unsigned(0),
            }
            s.unsigned(x.lock_delay);
            s.unsigned(x.capacity);
            if encver >= 3 {
                s.unsigned(x.granted_at);
            }
        }
        s.unsigned(delay_until);
        s.bytes
    }

    /// Version 3 keeps when each hold began; a version 2 value loads with the start unknown.
    #[test]
    fn a_hold_keeps_its_start_from_version_3_on() {
        let held = |bytes: &[u8], encver: i32| {
            let d = decode(&mut ByteSource::new(bytes), encver).unwrap();
            let (_, holder) = d.lock.holders().iter().next().unwrap();
            holder.granted_at
        };
        assert_eq!(held(&v3(5, &[h(b"w", 0, 5)], 0), 3), 1_999_999_000_000);
        assert_eq!(held(&v2(5, &[h(b"w", 0, 5)], 0), 2), 0);
        // Unknown stays unknown, and a start after the expiry (a clock stepped back) loads.
        let unknown = H {
            granted_at: 0,
            ..h(b"w", 0, 5)
        };
        assert_eq!(held(&v3(5, &[unknown], 0), 3), 0);
        let late = H {
            granted_at: 2_000_000_000_001,
            ..h(b"w", 0, 5)
        };
        assert_eq!(held(&v3(5, &[late], 0), 3), 2_000_000_000_001);
    }

    #[test]
    fn a_value_survives_encode_and_decode() {
        let mut fences = FenceCounter::default();
        let mut events = Vec::new();
        let mut lock = Lock::new();
        let mut step = Step {
            now: 1000,
            fences: &mut fences,
            events: &mut events,
            refuse: None,
        };
        for owner in [&b"a"[..], b"b", b"c"] {
            let req = Request {
                owner,
                mode: Mode::Read,
                ttl: 5000,
                options: HoldOptions::default(),
                capacity: 0,
            };
            lock.request(req, None, &mut step);
        }
        let bytes = encoded(&lock);
        let back = decode_bytes(&bytes, ENCODING_VERSION).unwrap();
        assert_eq!(encoded(&back), bytes);
        assert_eq!(back.fence(), lock.fence());
    }

    #[test]
    fn a_restored_value_keeps_its_holds_without_their_bindings() {
        let mut bound = h(b"w", 0, 7);
        bound.bound = Some(42);
        bound.lock_delay = 500;
        let bytes = v2(7, &[bound], 0);
        let kept = decode_with(&mut ByteSource::new(&bytes), 2, Bindings::Keep).unwrap();
        let (_, holder) = kept.lock.holders().iter().next().unwrap();
        assert_eq!(holder.options.get().bound_to, Some(42));
        let dropped = decode_with(&mut ByteSource::new(&bytes), 2, Bindings::Drop).unwrap();
        let (owner, holder) = dropped.lock.holders().iter().next().unwrap();
        assert_eq!(owner, b"w");
        assert_eq!(holder.options.get().bound_to, None);
        // Everything else stays: the delay, the token, the expiry.
        assert_eq!(holder.options.get().lock_delay, 500);
        assert_eq!((holder.token, holder.expires_at), (7, 2_000_000_000_000));
    }

    /// The longest TTL followed by the longest lock-delay ends within range: whatever this build
    /// writes, it reads back (until the year 10889).
    #[test]
    fn the_farthest_times_this_build_computes_are_accepted() {
        let now: Millis = 1_795_000_000_000;
        let mut fences = FenceCounter::default();
        let mut events = Vec::new();
        let mut lock = Lock::new();
        let req = Request {
            owner: b"w",
            mode: Mode::Write,
            ttl: MAX_DURATION,
            options: HoldOptions {
                user: crate::UNKNOWN_USER,
                bound_to: None,
                lock_delay: MAX_DURATION,
            },
            capacity: 0,
        };
        let mut step = Step {
            now,
            fences: &mut fences,
            events: &mut events,
            refuse: None,
        };
        lock.request(req, None, &mut step);
        decode_bytes(&encoded(&lock), ENCODING_VERSION).unwrap();
        let mut step = Step {
            now: now + MAX_DURATION,
            fences: &mut fences,
            events: &mut events,
            refuse: None,
        };
        lock.settle(&mut step);
        assert_eq!(lock.delay_until(), now + 2 * MAX_DURATION);
        decode_bytes(&encoded(&lock), ENCODING_VERSION).unwrap();
    }

    #[test]
    fn valid_shapes_are_accepted() {
        let ok = [
            v2(5, &[h(b"w", 0, 5)], 0),
            v2(9, &[h(b"r1", 1, 4), h(b"r2", 1, 9)], 0),
            v2(9, &[h(b"p1", 2, 4), h(b"p2", 2, 9)], 0),
            v2(3, &[], 2_000_000_000_000),
            v2(MAX_TOKEN, &[h(b"w", 0, MAX_TOKEN)], 0),
            v2(
                7,
                &[H {
                    lock_delay: MAX_DURATION,
                    bound: Some(42),
                    expires_at: MAX_INSTANT,
                    ..h(b"w", 0, 7)
                }],
                0,
            ),
            v2(
                7,
                &[H {
                    count: 3,
                    capacity: u64::from(MAX_CAPACITY),
                    ..h(b"p", 2, 7)
                }],
                0,
            ),
        ];
        for bytes in &ok {
            decode_bytes(bytes, 2).unwrap();
        }
        // The same shapes in version 3.
        assert!(decode_bytes(&v3(5, &[h(b"w", 0, 5)], 0), 3).is_ok());
        assert!(decode_bytes(&v3(3, &[], 2_000_000_000_000), 3).is_ok());
    }

    #[test]
    fn every_broken_invariant_is_refused() {
        let long = [b'x'; MAX_OWNER_LEN + 1];
        let bad: Vec<(&str, Vec<u8>)> = vec![
            ("fence", v2(MAX_TOKEN + 1, &[], 0)),
            ("token above fence", v2(4, &[h(b"w", 0, 5)], 0)),
            ("token 0", v2(4, &[h(b"w", 0, 0)], 0)),
            (
                "count 0",
                v2(
                    4,
                    &[H {
                        count: 0,
                        ..h(b"w", 0, 4)
                    }],
                    0,
                ),
            ),
            (
                "count",
                v2(
                    4,
                    &[H {
                        count: MAX_COUNT + 1,
                        ..h(b"w", 0, 4)
                    }],
                    0,
                ),
            ),
            (
                "expiry 2^63",
                v2(
                    4,
                    &[H {
                        expires_at: 1 << 63,
                        ..h(b"w", 0, 4)
                    }],
                    0,
                ),
            ),
            (
                "expiry 2^64-1",
                v2(
                    4,
                    &[H {
                        expires_at: u64::MAX,
                        ..h(b"w", 0, 4)
                    }],
                    0,
                ),
            ),
            (
                "expiry",
                v2(
                    4,
                    &[H {
                        expires_at: MAX_INSTANT + 1,
                        ..h(b"w", 0, 4)
                    }],
                    0,
                ),
            ),
            ("delay end", v2(4, &[], MAX_INSTANT + 1)),
            ("delay beside holder", v2(4, &[h(b"w", 0, 4)], 5)),
            (
                "lock-delay",
                v2(
                    4,
                    &[H {
                        lock_delay: MAX_DURATION + 1,
                        ..h(b"w", 0, 4)
                    }],
                    0,
                ),
            ),
            (
                "lock-delay on a reader",
                v2(
                    4,
                    &[H {
                        lock_delay: 5,
                        ..h(b"r", 1, 4)
                    }],
                    0,
                ),
            ),
            (
                "writer beside reader",
                v2(4, &[h(b"w", 0, 3), h(b"r", 1, 4)], 0),
            ),
            ("two writers", v2(4, &[h(b"w", 0, 3), h(b"v", 0, 4)], 0)),
            (
                "permit beside lock",
                v2(4, &[h(b"p", 2, 3), h(b"r", 1, 4)], 0),
            ),
            (
                "capacities differ",
                v2(
                    4,
                    &[
                        h(b"p", 2, 3),
                        H {
                            capacity: 4,
                            ..h(b"q", 2, 4)
                        },
                    ],
                    0,
                ),
            ),
            (
                "permits beyond capacity",
                v2(
                    4,
                    &[
                        h(b"p", 2, 3),
                        H {
                            count: 3,
                            ..h(b"q", 2, 4)
                        },
                    ],
                    0,
                ),
            ),
            (
                "capacity 0",
                v2(
                    4,
                    &[H {
                        capacity: 0,
                        ..h(b"p", 2, 4)
                    }],
                    0,
                ),
            ),
            (
                "capacity 2^31",
                v2(
                    4,
                    &[H {
                        capacity: u64::from(MAX_CAPACITY) + 1,
                        ..h(b"p", 2, 4)
                    }],
                    0,
                ),
            ),
            (
                "capacity on a lock",
                v2(
                    4,
                    &[H {
                        capacity: 2,
                        ..h(b"w", 0, 4)
                    }],
                    0,
                ),
            ),
            ("duplicate owner", v2(4, &[h(b"r", 1, 3), h(b"r", 1, 4)], 0)),
            ("empty owner", v2(4, &[h(b"", 0, 4)], 0)),
            ("long owner", v2(4, &[h(&long, 0, 4)], 0)),
            ("mode", v2(4, &[h(b"w", 3, 4)], 0)),
            ("bound flag", {
                let mut b = v2(4, &[h(b"w", 0, 4)], 0);
                // fence, n, owner (4 + 1), mode, count, expiry, token: then the bound flag.
                let at = 8 + 8 + 5 + 8 * 4;
                b[at] = 2;
                b
            }),
            ("truncated", {
                let mut b = v2(4, &[h(b"w", 0, 4)], 0);
                b.pop();
                b
            }),
            ("more holders than present", {
                let mut b = v2(4, &[h(b"w", 0, 4)], 0);
                b[8] = 2;
                b
            }),
        ];
        for (name, bytes) in bad {
            assert!(decode_bytes(&bytes, 2).is_err(), "{name} was accepted");
        }
        let late = H {
            granted_at: MAX_INSTANT + 1,
            ..h(b"w", 0, 4)
        };
        assert!(decode_bytes(&v3(4, &[late], 0), 3).is_err(), "start");
        // A version 2 value read as version 3 misses its last field.
        assert!(decode_bytes(&v2(5, &[h(b"w", 0, 5)], 0), 3).is_err());
        assert!(decode_bytes(&v3(5, &[h(b"w", 0, 5)], 0), 4).is_err());
        assert!(decode_bytes(&v2(5, &[h(b"w", 0, 5)], 0), 0).is_err());
    }

    #[test]
    fn a_string_longer_than_allowed_is_refused_before_it_is_read() {
        let mut s = ByteSink::default();
        s.unsigned(1);
        s.unsigned(1);
        s.bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = decode_bytes(&s.bytes, 2).unwrap_err();
        assert!(err.contains("too long"), "{err}");
    }
}
