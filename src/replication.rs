//! What reaches replicas and the AOF: effects, never decisions.
//!
//! Every change to a holder is propagated as one internal command that states the holder's
//! absolute state after the change:
//!
//! `LOCK.SYNC key owner count mode expires_at token fence counter`
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

use std::ffi::{c_longlong, CString};

use redis_module::{raw, Context, ContextFlags, RedisError, RedisResult, RedisValue};

use crate::commands::parse::{self, ArgError};
use crate::datatype::LockValue;
use crate::keys::LockKey;
use crate::lock::{Holder, Lock, Mode};
use crate::stats;

pub const SYNC_COMMAND: &str = "LOCK.SYNC";

/// Propagates `owner`'s state on `lock` to replicas and the AOF.
pub fn replicate_owner(ctx: &Context, key: &[u8], owner: &[u8], lock: &Lock) {
    let (count, mode, expires_at, token) = match lock.holders().get(owner) {
        Some(h) => (h.count, h.mode, h.expires_at, h.token),
        None => (0, Mode::Write, 0, 0),
    };
    crate::ffi::replicate_sync(
        ctx,
        &crate::ffi::SyncFields {
            key,
            owner,
            count,
            mode: mode_cstr(mode),
            expires_at,
            token,
            fence: lock.fence(),
            counter: stats::last_token(),
        },
    );
}

fn mode_cstr(mode: Mode) -> &'static std::ffi::CStr {
    match mode {
        Mode::Write => c"write",
        Mode::Read => c"read",
    }
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

/// Parses `owner count mode expires_at token fence counter`.
pub fn parse_sync<'a>(args: &[&'a [u8]]) -> Result<Sync<'a>, ArgError> {
    let [owner, count, mode, expires_at, token, fence, counter] = args else {
        return Err(ArgError::Arity);
    };
    let number = |b: &[u8]| {
        parse::parse_i64(b)
            .and_then(|v| u64::try_from(v).ok())
            .ok_or(ArgError::Syntax)
    };
    let owner = if owner.is_empty() || owner.len() > crate::lock::MAX_OWNER_LEN {
        return Err(ArgError::Owner);
    } else {
        *owner
    };
    let count = number(count)?;
    let mode = match *mode {
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

/// `LOCK.SYNC key owner count mode expires_at token fence counter`: applies a master's effect.
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
    let (Ok(command), Ok(format)) = (CString::new(SYNC_COMMAND), CString::new("bblcllll")) else {
        return;
    };
    let fence = value.lock.fence();
    let counter = stats::last_token();
    for (owner, h) in value.lock.holders().iter() {
        let mode = mode_cstr(h.mode);
        let as_ll = |v: u64| c_longlong::try_from(v).unwrap_or(c_longlong::MAX);
        // SAFETY: io is the live rewrite handle; the format string matches the arguments:
        // b = (pointer, length) buffer, l = long long, c = NUL-terminated C string.
        unsafe {
            if let Some(emit) = raw::RedisModule_EmitAOF {
                emit(
                    io,
                    command.as_ptr(),
                    format.as_ptr(),
                    key.as_ptr(),
                    key.len(),
                    owner.as_ptr(),
                    owner.len(),
                    as_ll(h.count),
                    mode.as_ptr(),
                    as_ll(h.expires_at),
                    as_ll(h.token),
                    as_ll(fence),
                    as_ll(counter),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments of the `LOCK.SYNC` that states `owner`'s current hold on `lock` (or its
    /// absence).
    fn sync_args(key: &[u8], owner: &[u8], lock: &Lock) -> Vec<Vec<u8>> {
        let (count, mode, expires_at, token) = match lock.holders().get(owner) {
            Some(h) => (h.count, h.mode.as_str(), h.expires_at, h.token),
            None => (0, "write", 0, 0),
        };
        vec![
            key.to_vec(),
            owner.to_vec(),
            count.to_string().into_bytes(),
            mode.as_bytes().to_vec(),
            expires_at.to_string().into_bytes(),
            token.to_string().into_bytes(),
            lock.fence().to_string().into_bytes(),
            stats::last_token().to_string().into_bytes(),
        ]
    }

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
        let args = sync_args(b"k", b"me", &lock);
        let refs: Vec<&[u8]> = args[1..].iter().map(|a| a.as_slice()).collect();
        let sync = parse_sync(&refs).unwrap();
        assert_eq!(sync.owner, b"me");
        assert_eq!(sync.holder.as_ref(), lock.holders().get(b"me"));
        assert_eq!(sync.fence, 1);
        let gone = sync_args(b"k", b"other", &lock);
        let refs: Vec<&[u8]> = gone[1..].iter().map(|a| a.as_slice()).collect();
        assert_eq!(parse_sync(&refs).unwrap().holder, None);
    }

    #[test]
    fn sync_rejects_malformed_arguments() {
        let ok: [&[u8]; 7] = [b"o", b"1", b"write", b"10", b"1", b"1", b"3"];
        assert!(parse_sync(&ok).is_ok());
        let mut bad = ok;
        bad[2] = b"exclusive";
        assert_eq!(parse_sync(&bad), Err(ArgError::Syntax));
        let mut bad = ok;
        bad[1] = b"-1";
        assert_eq!(parse_sync(&bad), Err(ArgError::Syntax));
        let mut bad = ok;
        bad[0] = b"";
        assert_eq!(parse_sync(&bad), Err(ArgError::Owner));
        assert_eq!(parse_sync(&ok[..6]), Err(ArgError::Arity));
    }
}
