//! LOCK.SYNC: applies a master's effect (replication stream, AOF load). The wire format is
//! `redis_lock_core::sync`; what produces it is `replication`.

use redis_lock_core::sync::parse_sync;
use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::errors::{arg_error, SYNC_CONFLICT, SYNC_IS_INTERNAL, SYNC_TOKEN_REFUSED};
use crate::keys::LockKey;
use crate::sys::commands::Command;
use crate::sys::context;
use crate::{settle, stats};

use super::common::slices;

/// LOCK.SYNC key owner state (internal: replication and AOF).
pub struct Sync;

impl Command for Sync {
    const NAME: &'static str = "LOCK.SYNC";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        apply(ctx, &slices(&args))
    }
}

fn apply(ctx: &Context, args: &[&[u8]]) -> RedisResult {
    let [_, key, rest @ ..] = args else {
        return Err(RedisError::WrongArity);
    };
    // Refused from ordinary clients whatever they send: the state's format is nobody's
    // business but the master's.
    let flags = ctx.get_flags();
    if !flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        return Err(RedisError::Str(SYNC_IS_INTERNAL));
    }
    let mut sync = parse_sync(rest).map_err(arg_error)?;
    // The counter is at least the fence and every token (`parse_sync` checks).
    let what = format!(
        "LOCK.SYNC of lock key {:?} (db {})",
        String::from_utf8_lossy(key).escape_debug().to_string(),
        context::selected_db(ctx)
    );
    if !stats::accept_stored_token(sync.counter, &what) {
        return Err(RedisError::Str(SYNC_TOKEN_REFUSED));
    }
    let mut lock_key = LockKey::open(ctx, key);
    lock_key.set_replicate(false);
    // The state does not carry when the hold began (it would cost every lock command bytes
    // of propagation): a hold this server already has keeps its start, a new one starts now,
    // within the replication lag of the master's grant. Replayed from an AOF file, "now" is
    // the load, so a new hold's start is then unknown.
    let mut known_start = None;
    match (&sync.holder, lock_key.existing()?) {
        (None, None) if sync.delay_until == 0 => return Ok(RedisValue::Integer(0)),
        // A hold, or a key left with only a lock-delay.
        (_, None) => {
            lock_key.existing_or_new()?;
        }
        (Some(h), Some(value)) => {
            let lock = value.view();
            // As strict as an RDB load: never a writer beside another holder.
            if lock.check_restorable(sync.owner, h).is_err() {
                return Err(RedisError::Str(SYNC_CONFLICT));
            }
            known_start = lock.holders().get(sync.owner).map(|held| held.granted_at);
        }
        (None, Some(_)) => {}
    }
    if let Some(h) = sync.holder.as_mut() {
        h.granted_at = match known_start {
            Some(start) => start,
            None if flags.contains(ContextFlags::LOADING) => 0,
            None => context::now_ms(),
        };
    }
    // The counter is at least the fence and every token (`parse_sync` checks): observing it
    // covers them, and a counter from a pre-release build is reported when first seen.
    stats::observe_token(sync.counter, "LOCK.SYNC");
    lock_key.apply_exact(|lock| {
        stats::with_fences(|fences| {
            lock.restore_fence(sync.fence, fences);
            match sync.holder {
                Some(h) => lock.restore_holder(sync.owner, h, fences),
                None => {
                    lock.remove_holder(sync.owner);
                }
            }
            // After the holder: a delay exists only once nobody holds the lock.
            lock.restore_delay(sync.delay_until);
        })
    });
    if flags.contains(ContextFlags::LOADING) {
        // Loaded holders get their timers once loading ends.
        settle::mark_dirty(context::selected_db(ctx), key);
    }
    Ok(RedisValue::Integer(1))
}
