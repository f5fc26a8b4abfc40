//! The command handlers: parse, look at the key, run the core, reply.
//!
//! Each public handler is what `redis_module!` registers; it runs its body under the panic
//! guard and validates every argument before any state is looked at.

use std::collections::BTreeMap;

use redis_module::redisvalue::RedisValueKey;
use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::guard::guard;
use crate::keys::LockKey;
use crate::{blocking, ffi, reconcile, stats};
use redis_lock_core::{Acquired, Mode, Waiter};

use crate::errors::{
    arg_error, COUNT_OVERFLOW, DEADLOCK, KEY_VANISHED, NOT_OWNER, QUEUE_FULL, TOO_MANY_WAITERS,
};
use redis_lock_core::parse;

fn slices(args: &[RedisString]) -> Vec<&[u8]> {
    args.iter().map(|a| a.as_slice()).collect()
}

/// LOCK.ACQUIRE key owner ttl [WAIT timeout]
pub fn acquire(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard("LOCK.ACQUIRE", || acquire_in_mode(ctx, &args, Mode::Write))
}

/// LOCK.RWREAD key owner ttl [WAIT timeout]
pub fn rwread(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard("LOCK.RWREAD", || acquire_in_mode(ctx, &args, Mode::Read))
}

fn acquire_in_mode(ctx: &Context, args: &[RedisString], mode: Mode) -> RedisResult {
    let [_, key_arg, rest @ ..] = args else {
        return Err(RedisError::WrongArity);
    };
    let key = key_arg.as_slice();
    let rest = slices(rest);
    let req = parse::acquire(&rest).map_err(arg_error)?;
    let db = ffi::selected_db(ctx);
    reconcile::run_for(ctx, db, key);

    // Inside MULTI, Lua and functions nothing may block: WAIT then acts as without WAIT.
    let may_block = !ctx
        .get_flags()
        .intersects(ContextFlags::DENY_BLOCKING | ContextFlags::MULTI | ContextFlags::LUA);
    let mut lock_key = LockKey::open_arg(ctx, key_arg);
    let queued_here = lock_key.existing_or_new()?.lock.queue().len();
    let queue_full = if queued_here >= crate::config::max_waiters() {
        Some(QUEUE_FULL)
    } else if blocking::count() >= crate::config::max_total_waiters() {
        Some(TOO_MANY_WAITERS)
    } else {
        None
    };
    let wants_to_wait = req.wait.is_some() && may_block;
    let wait_id = (wants_to_wait && queue_full.is_none()).then(blocking::next_id);
    let outcome = lock_key
        .apply(|lock, step| lock.acquire(req.owner, mode, req.ttl, wait_id, step))
        .ok_or(RedisError::Str(KEY_VANISHED))?;
    match outcome {
        Acquired::Granted { token, .. } => {
            stats::count_grant();
            lock_key.notify(c"lock.acquire");
            Ok(RedisValue::Integer(
                i64::try_from(token).unwrap_or(i64::MAX),
            ))
        }
        Acquired::Queued => {
            let (Some(id), Some(timeout)) = (wait_id, req.wait) else {
                return Ok(RedisValue::Null);
            };
            let waiter = Waiter {
                owner: req.owner.into(),
                mode,
                ttl: req.ttl,
            };
            if blocking::block(ctx, id, db, key, waiter, timeout) {
                // The reply comes from the blocked-client callbacks.
                Ok(RedisValue::NoReply)
            } else {
                lock_key.apply(|lock, step| lock.cancel_waiter(id, step));
                Ok(RedisValue::Null)
            }
        }
        Acquired::Busy if wants_to_wait => match queue_full {
            Some(message) => Err(RedisError::Str(message)),
            None => Ok(RedisValue::Null),
        },
        Acquired::Busy => Ok(RedisValue::Null),
        Acquired::Deadlock => Err(RedisError::Str(DEADLOCK)),
        Acquired::CountOverflow => Err(RedisError::Str(COUNT_OVERFLOW)),
    }
}

/// LOCK.RELEASE key owner [ALL]
pub fn release(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard("LOCK.RELEASE", || {
        let [_, key_arg, rest @ ..] = &args[..] else {
            return Err(RedisError::WrongArity);
        };
        let key = key_arg.as_slice();
        let rest = slices(rest);
        let rest = &rest[..];
        let (owner, all) = parse::release(rest).map_err(arg_error)?;
        reconcile::run_for(ctx, ffi::selected_db(ctx), key);
        let mut lock_key = LockKey::open_arg(ctx, key_arg);
        if lock_key.existing()?.is_none() {
            return Err(RedisError::Str(NOT_OWNER));
        }
        let remaining = lock_key
            .apply(|lock, step| lock.release(owner, all, step))
            .ok_or(RedisError::Str(NOT_OWNER))?
            .map_err(|_| RedisError::Str(NOT_OWNER))?;
        lock_key.notify(c"lock.release");
        Ok(RedisValue::Integer(
            i64::try_from(remaining).unwrap_or(i64::MAX),
        ))
    })
}

/// LOCK.EXTEND key owner ttl
pub fn extend(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard("LOCK.EXTEND", || {
        let [_, key_arg, rest @ ..] = &args[..] else {
            return Err(RedisError::WrongArity);
        };
        let key = key_arg.as_slice();
        let rest = slices(rest);
        let rest = &rest[..];
        let (owner, ttl) = parse::extend(rest).map_err(arg_error)?;
        reconcile::run_for(ctx, ffi::selected_db(ctx), key);
        let mut lock_key = LockKey::open_arg(ctx, key_arg);
        if lock_key.existing()?.is_none() {
            return Err(RedisError::Str(NOT_OWNER));
        }
        let result = lock_key.apply(|lock, step| lock.extend(owner, ttl, step));
        match result {
            Some(Ok(_)) => Ok(RedisValue::Integer(1)),
            _ => Err(RedisError::Str(NOT_OWNER)),
        }
    })
}

/// LOCK.INFO key
pub fn info(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard("LOCK.INFO", || {
        let [_, key_arg] = &args[..] else {
            return Err(RedisError::WrongArity);
        };
        let mut lock_key = LockKey::open_arg_read(ctx, key_arg);
        let Some(value) = lock_key.existing()? else {
            return Ok(RedisValue::Null);
        };
        let now = ffi::now_ms();
        let lock = &value.lock;
        // Holders whose expiry has passed are gone even if the timer has not run yet.
        let mut holders: Vec<_> = lock
            .holders()
            .iter()
            .filter(|(_, h)| h.expires_at > now)
            .collect();
        holders.sort_by(|a, b| a.0.cmp(b.0));
        let mode = match holders.first() {
            None => "free",
            Some((_, h)) => h.mode.as_str(),
        };
        let holders = holders
            .into_iter()
            .map(|(owner, h)| {
                RedisValue::Array(vec![
                    RedisValue::StringBuffer(owner.to_vec()),
                    RedisValue::Integer(i64::try_from(h.count).unwrap_or(i64::MAX)),
                    RedisValue::Integer(i64::try_from(h.expires_at - now).unwrap_or(i64::MAX)),
                ])
            })
            .collect();
        let queue = lock
            .queue()
            .iter()
            .map(|(_, w)| RedisValue::SimpleStringStatic(w.mode.as_str()))
            .collect();
        let mut map = BTreeMap::new();
        let field = |name: &str| RedisValueKey::String(name.to_string());
        map.insert(field("mode"), RedisValue::SimpleStringStatic(mode));
        map.insert(
            field("fence"),
            RedisValue::Integer(i64::try_from(lock.fence()).unwrap_or(i64::MAX)),
        );
        map.insert(field("holders"), RedisValue::Array(holders));
        map.insert(
            field("waiting"),
            RedisValue::Integer(i64::try_from(lock.queue().len()).unwrap_or(i64::MAX)),
        );
        map.insert(field("queue"), RedisValue::Array(queue));
        Ok(RedisValue::OrderedMap(map))
    })
}

/// LOCK.SYNC key owner state (internal: replication and AOF).
pub fn sync(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard("LOCK.SYNC", || {
        crate::replication::sync_command(ctx, &slices(&args))
    })
}

/// The test-only commands (`test-hooks` builds):
/// - LOCK.DEBUG-PANIC [name]: panics on purpose, so the tests can check that the guard turns a
///   panic into an error reply and the server keeps running. With a name, arms a panic for the
///   next run of that entry point instead (see `guard::fault`).
/// - LOCK.DEBUG-ALLOC: `[live blocks, live bytes]` the module holds (see `ffi::CountingAlloc`).
#[cfg(feature = "test-hooks")]
pub fn debug(_ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let command = args
        .first()
        .map(|a| a.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if command == "lock.debug-alloc" {
        let (blocks, bytes) = ffi::live_allocations();
        return Ok(RedisValue::Array(vec![
            RedisValue::Integer(blocks),
            RedisValue::Integer(bytes),
        ]));
    }
    if let [_, name] = &args[..] {
        crate::guard::fault::arm(&name.to_string_lossy());
        return Ok(RedisValue::SimpleStringStatic("OK"));
    }
    guard("LOCK.DEBUG-PANIC", || {
        panic!("deliberate panic from LOCK.DEBUG-PANIC")
    })
}
