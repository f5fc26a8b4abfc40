//! What reaches replicas and the AOF: effects, never decisions.
//!
//! Every change to a holder is propagated as one internal command that states the holder's
//! absolute state after the change: `LOCK.SYNC key owner state`, where `state` packs
//! `count mode expires_at token fence counter`, and when there are any the hold's options
//! (BIND's connection, LOCKDELAY) and the key's pending lock-delay, into one argument (the
//! encoding is `redis_lock_core::sync`; applying it is `commands/sync.rs`). A bound hold keeps
//! its master's connection id on replicas, where it is only a marker: a replica never ends a
//! hold by itself, and ends them all when it is promoted (`bound`).
//!
//! `count` 0 removes the owner (release, expiry, a rolled-back grant); `fence` is the key's
//! last granted token and `counter` the module-wide fencing counter (so it survives even when
//! the key that got the last token is gone). Applying it needs no clock and no queue, so a
//! replica or an AOF replay ends in the master's state, and every token it sees raises its
//! fencing counter.
//! `LOCK.SYNC` is refused from ordinary clients: only the replication link and AOF loading may
//! send it. An AOF rewrite emits one `LOCK.SYNC` per holder.

use redis_lock_core::sync::sync_state;
use redis_lock_core::{Holder, Lock};
use redis_module::Context;

use crate::stats;
use crate::sys::context;
use crate::sys::datatype::AofWriter;

/// Propagates `owner`'s state on `lock` (its hold, `None` when it has none) to replicas and
/// the AOF.
pub fn replicate_owner(
    ctx: &Context,
    key: &[u8],
    owner: &[u8],
    holder: Option<&Holder>,
    lock: &Lock,
) {
    let state = sync_state(
        holder,
        lock.fence(),
        stats::last_token(),
        lock.delay_until(),
    );
    context::replicate3(ctx, c"LOCK.SYNC", [key, owner, state.as_bytes()]);
}

/// The owner named by the `LOCK.SYNC` that rewrites a key holding only a pending lock-delay:
/// a removal of an owner that holds nothing, whose state carries the delay.
pub const DELAY_ONLY_OWNER: &[u8] = b"lock-delay";

/// AOF rewrite: one `LOCK.SYNC` per holder rebuilds the value; a key with no holder but a
/// pending lock-delay is one removal that carries the delay.
pub fn rewrite(aof: &mut AofWriter<'_>, key: &[u8], lock: &Lock) {
    let fence = lock.fence();
    let counter = stats::last_token();
    let delay_until = lock.delay_until();
    if lock.holders().is_empty() && delay_until != 0 {
        let state = sync_state(None, fence, counter, delay_until);
        aof.emit3(c"LOCK.SYNC", [key, DELAY_ONLY_OWNER, state.as_bytes()]);
    }
    for (owner, h) in lock.holders().iter() {
        let state = sync_state(Some(h), fence, counter, delay_until);
        aof.emit3(c"LOCK.SYNC", [key, owner, state.as_bytes()]);
    }
}
