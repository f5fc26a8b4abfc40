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

use crate::datatype::LockValue;
use crate::errors::{arg_error, SYNC_CONFLICT, SYNC_IS_INTERNAL};
use crate::keys::LockKey;
use crate::stats;
use redis_lock_core::sync::{parse_sync, sync_state};
use redis_lock_core::{Lock, Mode};

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

/// `LOCK.SYNC key owner state`: applies a master's effect.
pub fn sync_command(ctx: &Context, args: &[&[u8]]) -> RedisResult {
    let [_, key, rest @ ..] = args else {
        return Err(RedisError::WrongArity);
    };
    let sync = parse_sync(rest).map_err(arg_error)?;
    let flags = ctx.get_flags();
    if !flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        return Err(RedisError::Str(SYNC_IS_INTERNAL));
    }
    let mut lock_key = LockKey::open(ctx, key);
    lock_key.set_replicate(false);
    match (&sync.holder, lock_key.existing()?) {
        (None, None) => return Ok(RedisValue::Integer(0)),
        (Some(_), None) => {
            lock_key.existing_or_new()?;
        }
        (Some(h), Some(value)) => {
            // As strict as an RDB load: never a writer beside another holder.
            if value.lock.check_restorable(sync.owner, h).is_err() {
                return Err(RedisError::Str(SYNC_CONFLICT));
            }
        }
        (None, Some(_)) => {}
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
