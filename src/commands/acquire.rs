//! LOCK.ACQUIRE, LOCK.RWREAD and LOCK.SEMACQUIRE: take a lock exclusive or shared, or a
//! semaphore permit, now or after waiting in the FIFO queue (the client is then blocked
//! natively; `waiters` replies when it is granted, times out or leaves).

use redis_lock_core::parse::{Accepts, AcquireArgs};
use redis_lock_core::{
    parse, Acquired, HoldOptions, Mode, Request, Verdict, Waiter, Who, UNKNOWN_USER,
};
use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::errors::{
    arg_error, refusal_reason, BIND_IN_SCRIPT, CAPACITY_MISMATCH, COUNT_OVERFLOW, DEADLOCK,
    DEADLOCK_CYCLE, KEY_VANISHED, NOT_A_LOCK, NOT_A_SEMAPHORE, QUEUE_FULL, TOO_MANY_WAITERS,
    USER_WAITERS_FULL,
};
use crate::sys::acl;
use crate::sys::commands::Command;
use crate::sys::context;
use crate::{blocking, deadlock, eviction, settle, stats, users, waiters};

use super::common::split_key;

/// LOCK.ACQUIRE key owner ttl [WAIT timeout] [BIND] [LOCKDELAY ms]
pub struct Acquire;

impl Command for Acquire {
    const NAME: &'static str = "LOCK.ACQUIRE";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        acquire_in_mode(ctx, &args, Mode::Write)
    }
}

/// LOCK.RWREAD key owner ttl [WAIT timeout] [BIND]
pub struct RwRead;

impl Command for RwRead {
    const NAME: &'static str = "LOCK.RWREAD";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        acquire_in_mode(ctx, &args, Mode::Read)
    }
}

/// LOCK.SEMACQUIRE key owner capacity ttl [WAIT timeout] [BIND]
pub struct SemAcquire;

impl Command for SemAcquire {
    const NAME: &'static str = "LOCK.SEMACQUIRE";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        let (key_arg, rest) = split_key(&args)?;
        let sem = parse::semacquire(&rest).map_err(arg_error)?;
        request(ctx, key_arg, sem.request, Mode::Permit, sem.capacity)
    }
}

fn acquire_in_mode(ctx: &Context, args: &[RedisString], mode: Mode) -> RedisResult {
    let (key_arg, rest) = split_key(args)?;
    let accepts = match mode {
        Mode::Write => Accepts::Exclusive,
        Mode::Read | Mode::Permit => Accepts::Shared,
    };
    let req = parse::acquire(&rest, accepts).map_err(arg_error)?;
    request(ctx, key_arg, req, mode, 0)
}

/// Runs a parsed request (`capacity` for a permit, 0 otherwise): grants it, queues and blocks
/// the client, or refuses it.
fn request(
    ctx: &Context,
    key_arg: &RedisString,
    req: AcquireArgs<'_>,
    mode: Mode,
    capacity: u32,
) -> RedisResult {
    let key = key_arg.as_slice();
    let flags = ctx.get_flags();
    // A script's or function's commands run on a connection of the server's own that never
    // closes: a hold bound to it would only end by its TTL, which is not what BIND promises.
    if req.bind && flags.contains(ContextFlags::LUA) {
        return Err(RedisError::Str(BIND_IN_SCRIPT));
    }
    // lock.refuse-when-evictable: no new hold that the server could evict.
    if let Some(message) = eviction::refusal(&flags) {
        return Err(RedisError::Str(message));
    }
    // Who asks, for deadlock detection's (user, owner) identity: only lock holds and waits
    // take part in it, so a permit request does not read its user.
    let user = if mode == Mode::Permit {
        UNKNOWN_USER
    } else {
        users::current(ctx, &flags)
    };
    let options = HoldOptions {
        bound_to: req.bind.then(|| context::client_id(ctx)),
        lock_delay: req.lock_delay,
        user,
    };
    let request = Request {
        owner: req.owner,
        mode,
        ttl: req.ttl,
        options,
        capacity,
    };
    let db = context::selected_db(ctx);

    // Inside MULTI, Lua and functions nothing may block: WAIT then acts as without WAIT.
    let may_block =
        !flags.intersects(ContextFlags::DENY_BLOCKING | ContextFlags::MULTI | ContextFlags::LUA);
    let mut lock_key = settle::open_settled(ctx, key_arg);
    let queued_here = lock_key.existing_or_new()?.waiters();
    let wants_to_wait = req.wait.is_some() && may_block;
    // Only a request that may block is counted against its user's limit.
    let user_name = if wants_to_wait {
        acl::current_user_name(ctx)
    } else {
        None
    };
    let user_full = match (&user_name, crate::config::max_waiters_per_user()) {
        (Some(user), Some(limit)) => waiters::count_of_user(user) >= limit,
        _ => false,
    };
    let queue_full = if queued_here >= crate::config::max_waiters() {
        Some(QUEUE_FULL)
    } else if user_full {
        Some(USER_WAITERS_FULL)
    } else if waiters::count() >= crate::config::max_total_waiters() {
        Some(TOO_MANY_WAITERS)
    } else {
        None
    };
    let may_queue = wants_to_wait && queue_full.is_none();
    // A lock request that may wait is first tried without queueing; only if it would wait is
    // it checked for a deadlock, then queued. Nothing changes in between, so the second try
    // queues. Semaphore waits are not part of detection.
    let detect = may_queue && mode != Mode::Permit;
    let mut wait_id = (may_queue && !detect).then(waiters::next_id);
    let mut outcome = lock_key
        .apply(|lock, step| lock.request(request, wait_id, step))
        .ok_or(RedisError::Str(KEY_VANISHED))?;
    // A requester that holds no key anyone waits for cannot close a cycle: no walk.
    let who = Who::new(user, req.owner);
    if detect && outcome == Acquired::Busy && deadlock::may_close_cycle(ctx, who) {
        let budget = crate::config::deadlock_budget();
        let verdict = match lock_key.existing()? {
            Some(value) => deadlock::check_here(ctx, who, mode, key, &value.view(), budget),
            None => Verdict::NoCycle,
        };
        match verdict {
            Verdict::Cycle => {
                stats::count_deadlock();
                return Err(RedisError::Str(DEADLOCK_CYCLE));
            }
            // Waits as if no cycle were found; its WAIT timeout still ends it.
            Verdict::Cut => stats::count_deadlock_check_cut(),
            Verdict::NoCycle => {}
        }
    }
    if detect && outcome == Acquired::Busy {
        wait_id = Some(waiters::next_id());
        outcome = lock_key
            .apply(|lock, step| lock.request(request, wait_id, step))
            .ok_or(RedisError::Str(KEY_VANISHED))?;
    }
    match outcome {
        Acquired::Granted { token, count } => {
            stats::count_grant();
            if count > 1 && mode != Mode::Permit {
                stats::count_reentry();
            }
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
                options,
                capacity,
            };
            if blocking::block(ctx, id, db, key, waiter, timeout, user_name) {
                lock_key.notify(c"lock.queued");
                // The reply comes from the blocked-client callbacks.
                Ok(RedisValue::NoReply)
            } else {
                lock_key.apply(|lock, step| lock.cancel_waiter(id, step));
                Ok(RedisValue::Null)
            }
        }
        Acquired::Busy if wants_to_wait => match queue_full {
            Some(message) => {
                stats::count_queue_full();
                Err(RedisError::Str(message))
            }
            None => Ok(RedisValue::Null),
        },
        Acquired::Busy => Ok(RedisValue::Null),
        Acquired::Deadlock => Err(RedisError::Str(DEADLOCK)),
        Acquired::CountOverflow => Err(RedisError::Str(COUNT_OVERFLOW)),
        Acquired::Refused(reason) => Err(RedisError::Str(refusal_reason(reason))),
        Acquired::WrongKind if mode == Mode::Permit => Err(RedisError::Str(NOT_A_SEMAPHORE)),
        Acquired::WrongKind => Err(RedisError::Str(NOT_A_LOCK)),
        Acquired::CapacityMismatch => Err(RedisError::Str(CAPACITY_MISMATCH)),
    }
}
