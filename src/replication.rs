//! What reaches replicas and the AOF: effects, never decisions.
//!
//! Every change to a holder is propagated as one internal command that states the holder's
//! absolute state after the change: `LOCK.SYNC key owner state`, where `state` packs
//! `count mode expires_at token fence counter` into one argument (the encoding is
//! `redis_lock_core::sync`; applying it is `commands/sync.rs`).
//!
//! `count` 0 removes the owner (release, expiry, a rolled-back grant); `fence` is the key's
//! last granted token and `counter` the module-wide fencing counter (so it survives even when
//! the key that got the last token is gone). Applying it needs no clock and no queue, so a
//! replica or an AOF replay ends in the master's state, and every token it sees raises its
//! fencing counter.
//! `LOCK.SYNC` is refused from ordinary clients: only the replication link and AOF loading may
//! send it. An AOF rewrite emits one `LOCK.SYNC` per holder.

use redis_lock_core::sync::sync_state;
use redis_lock_core::{Lock, Mode};
use redis_module::Context;

use crate::stats;
use crate::sys::context;
use crate::sys::datatype::AofWriter;

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
    context::replicate3(ctx, c"LOCK.SYNC", [key, owner, state.as_bytes()]);
}

/// AOF rewrite: one `LOCK.SYNC` per holder rebuilds the value.
pub fn rewrite(aof: &mut AofWriter<'_>, key: &[u8], lock: &Lock) {
    let fence = lock.fence();
    let counter = stats::last_token();
    for (owner, h) in lock.holders().iter() {
        let state = sync_state(h.count, h.mode, h.expires_at, h.token, fence, counter);
        aof.emit3(c"LOCK.SYNC", [key, owner, state.as_bytes()]);
    }
}
