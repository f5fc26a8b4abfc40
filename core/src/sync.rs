//! The `LOCK.SYNC` codec: how one holder's absolute state travels to replicas and the AOF.
//!
//! `LOCK.SYNC key owner "count mode expires_at token fence counter"`: the six values in one
//! space-separated argument (Redis builds an object per argument before it knows whether
//! anything consumes propagation, so fewer arguments are measurably cheaper). `count` 0
//! removes the owner; otherwise the owner holds the lock in `mode` (`write` or `read`) until
//! the absolute Unix time `expires_at` (ms) with fencing token `token`; `fence` is the key's
//! last granted token and `counter` the module-wide fencing counter.
//!
//! A state is checked as strictly as an RDB load checks a saved holder ([`check_holder`]
//! here, [`crate::Lock::check_restorable`] against the holders already there).

use crate::parse::ArgError;
use crate::{check_holder, Holder, Mode, MAX_OWNER_LEN, MAX_TOKEN};

/// One parsed `LOCK.SYNC`.
#[derive(Debug, PartialEq, Eq)]
pub struct Sync<'a> {
    pub owner: &'a [u8],
    /// `None` removes the owner.
    pub holder: Option<Holder>,
    pub fence: u64,
    pub counter: u64,
}

/// The state argument of `LOCK.SYNC`: `count mode expires_at token fence counter`, written
/// into a stack buffer (this runs on every lock command; `format!` cost more than the rest of
/// the replication path).
pub struct SyncState {
    buf: [u8; 6 * 20 + 5 + 5],
    len: usize,
}

impl SyncState {
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }

    fn push(&mut self, bytes: &[u8]) {
        if let Some(dst) = self.buf.get_mut(self.len..self.len + bytes.len()) {
            dst.copy_from_slice(bytes);
            self.len += bytes.len();
        }
    }

    fn push_u64(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(digits.get(i..).unwrap_or(&[]));
    }
}

pub fn sync_state(
    count: u64,
    mode: Mode,
    expires_at: u64,
    token: u64,
    fence: u64,
    counter: u64,
) -> SyncState {
    let mut s = SyncState {
        buf: [0; 130],
        len: 0,
    };
    s.push_u64(count);
    s.push(b" ");
    s.push(mode.as_str().as_bytes());
    for v in [expires_at, token, fence, counter] {
        s.push(b" ");
        s.push_u64(v);
    }
    s
}

/// Parses `owner state` (see [`sync_state`]).
pub fn parse_sync<'a>(args: &[&'a [u8]]) -> Result<Sync<'a>, ArgError> {
    let [owner, state] = args else {
        return Err(ArgError::Arity);
    };
    let fields: Vec<&[u8]> = state.split(|b| *b == b' ').collect();
    let [count, mode, expires_at, token, fence, counter] = fields[..] else {
        return Err(ArgError::Syntax);
    };
    let number = |b: &[u8]| {
        crate::parse::parse_i64(b)
            .and_then(|v| u64::try_from(v).ok())
            .ok_or(ArgError::Syntax)
    };
    if owner.is_empty() || owner.len() > MAX_OWNER_LEN {
        return Err(ArgError::Owner);
    }
    let count = number(count)?;
    let mode = match mode {
        b"write" => Mode::Write,
        b"read" => Mode::Read,
        _ => return Err(ArgError::Syntax),
    };
    let expires_at = number(expires_at)?;
    let token = number(token)?;
    let fence = number(fence)?;
    let counter = number(counter)?;
    let holder = (count > 0).then_some(Holder {
        mode,
        count,
        expires_at,
        token,
    });
    // The same rules as an RDB load: a holder with a token that was never issued is refused.
    if let Some(h) = &holder {
        check_holder(owner, h).map_err(|_| ArgError::Syntax)?;
    }
    if fence > MAX_TOKEN || counter > MAX_TOKEN {
        return Err(ArgError::Syntax);
    }
    Ok(Sync {
        owner,
        holder,
        fence,
        counter,
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
        };
        lock.acquire(b"me", Mode::Read, 500, None, &mut step);
        let h = lock.holders().get(b"me").cloned().unwrap();
        let state = sync_state(h.count, h.mode, h.expires_at, h.token, lock.fence(), 7);
        let sync = parse_sync(&[b"me", state.as_bytes()]).unwrap();
        assert_eq!(sync.owner, b"me");
        assert_eq!(sync.holder, Some(h));
        assert_eq!((sync.fence, sync.counter), (1, 7));
        let gone = sync_state(0, Mode::Write, 0, 0, 1, 7);
        assert_eq!(
            parse_sync(&[b"other", gone.as_bytes()]).unwrap().holder,
            None
        );
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
}
