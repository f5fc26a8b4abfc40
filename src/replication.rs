//! What reaches replicas and the AOF: effects, never decisions.
//!
//! Every change to a holder is propagated as one internal command that states the holder's
//! absolute state after the change:
//!
//! `LOCK.SYNC key owner "count mode expires_at token fence counter"`
//!
//! (the six numbers and the mode in one space-separated argument: Redis builds an object per
//! argument before it knows whether anything consumes propagation, so fewer arguments are
//! measurably cheaper).
//!
//! `count` 0 removes the owner (release, expiry, a rolled-back grant); otherwise the owner holds
//! the lock in `mode` (`write` or `read`) until the absolute Unix time `expires_at` (ms) with
//! fencing token `token`; `fence` is the key's last granted token and `counter` the module-wide
//! fencing counter (so it survives even when the key that got the last token is gone).
//! Applying it needs no clock
//! and no queue, so a replica or an AOF replay ends in the master's state, and every token it
//! sees raises its fencing counter, which keeps tokens increasing after a promotion.
//! `LOCK.SYNC` is refused from ordinary clients: only the replication link and AOF loading may
//! send it. An AOF rewrite emits one `LOCK.SYNC` per holder.

use redis_module::{raw, Context, ContextFlags, RedisError, RedisResult, RedisValue};

use crate::commands::parse::{self, ArgError};
use crate::datatype::LockValue;
use crate::keys::LockKey;
use crate::lock::{Holder, Lock, Mode};
use crate::stats;

/// Propagates `owner`'s state on `lock` to replicas and the AOF.
pub fn replicate_owner(ctx: &Context, key: &[u8], owner: &[u8], lock: &Lock) {
    let (count, mode, expires_at, token) = match lock.holders().get(owner) {
        Some(h) => (h.count, h.mode, h.expires_at, h.token),
        None => (0, Mode::Write, 0, 0),
    };
    let state = sync_state(
        count,
        mode,
        expires_at,
        token,
        lock.fence(),
        stats::last_token(),
    );
    crate::ffi::replicate_sync(ctx, key, owner, state.as_bytes());
}

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
        parse::parse_i64(b)
            .and_then(|v| u64::try_from(v).ok())
            .ok_or(ArgError::Syntax)
    };
    if owner.is_empty() || owner.len() > crate::lock::MAX_OWNER_LEN {
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
    Ok(Sync {
        owner,
        holder,
        fence,
        counter,
    })
}

/// `LOCK.SYNC key owner state`: applies a master's effect.
pub fn sync_command(ctx: &Context, args: &[&[u8]]) -> RedisResult {
    let [_, key, rest @ ..] = args else {
        return Err(RedisError::WrongArity);
    };
    let sync = parse_sync(rest).map_err(|e| match e {
        ArgError::Arity => RedisError::WrongArity,
        other => RedisError::Str(other.message()),
    })?;
    let flags = ctx.get_flags();
    if !flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        return Err(RedisError::Str(
            "ERR LOCK.SYNC is internal: it is accepted only from a master or while loading the AOF",
        ));
    }
    let mut lock_key = LockKey::open(ctx, key);
    lock_key.set_replicate(false);
    match (&sync.holder, lock_key.existing()?) {
        (None, None) => return Ok(RedisValue::Integer(0)),
        (Some(_), None) => {
            lock_key.existing_or_new()?;
        }
        _ => {}
    }
    lock_key.apply_exact(|lock| {
        stats::with_fences(|fences| {
            fences.observe(sync.counter);
            lock.restore_fence(sync.fence, fences);
            match sync.holder {
                Some(h) => lock.restore_holder(sync.owner, h, fences),
                None => {
                    lock.remove_holder(sync.owner);
                }
            }
        })
    });
    if flags.contains(ContextFlags::LOADING) {
        // Loaded holders get their timers once loading ends.
        crate::reconcile::mark_dirty(crate::ffi::selected_db(ctx), key);
    }
    Ok(RedisValue::Integer(1))
}

/// AOF rewrite: one `LOCK.SYNC` per holder rebuilds the value.
pub fn rewrite(io: *mut raw::RedisModuleIO, key: &[u8], value: &LockValue) {
    let fence = value.lock.fence();
    let counter = stats::last_token();
    for (owner, h) in value.lock.holders().iter() {
        let state = sync_state(h.count, h.mode, h.expires_at, h.token, fence, counter);
        crate::ffi::emit_sync(io, key, owner, state.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_round_trips_a_holder_and_a_removal() {
        let mut lock = Lock::new();
        let mut fences = crate::lock::FenceCounter::default();
        let mut events = Vec::new();
        let mut step = crate::lock::Step {
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
        ] {
            assert_eq!(parse_sync(&[b"o", bad]), Err(ArgError::Syntax), "{bad:?}");
        }
        assert_eq!(parse_sync(&[b"", ok]), Err(ArgError::Owner));
        assert_eq!(parse_sync(&[b"o"]), Err(ArgError::Arity));
    }
}
