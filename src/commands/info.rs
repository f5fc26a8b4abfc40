//! LOCK.INFO: a lock's mode, fence, holders, queue and lock-delay (read-only; also on
//! replicas), and the queue of a key that reads as absent while clients wait on it. `OWNER`
//! and `COUNT` bound the reply (one owner's entry, or the first n holders, and at most
//! [`QUEUE_SHOWN`] queued clients), so a client checking its own hold costs the server O(1)
//! whatever the number of readers or permit holders; plain LOCK.INFO lists everything.

use std::collections::BTreeMap;

use redis_module::redisvalue::RedisValueKey;
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::errors::arg_error;
use crate::keys::LockKey;
use crate::sys::commands::Command;
use crate::sys::context;
use crate::{contention, waiters};
use redis_lock_core::parse::{self, InfoArgs};
use redis_lock_core::{Holder, Kind, Mode, Waiter, WaiterId};

use super::common::slices;

/// LOCK.INFO key [OWNER owner] [COUNT n]
pub struct Info;

/// Queued clients listed at most by the bounded forms (`OWNER`, `COUNT`): the queue may hold
/// up to `lock.max-waiters` (100,000 by default) clients; `waiting` still counts them all.
pub const QUEUE_SHOWN: usize = 1000;

impl Command for Info {
    const NAME: &'static str = "LOCK.INFO";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        let [_, key_arg, rest @ ..] = &args[..] else {
            return Err(RedisError::WrongArity);
        };
        let wanted = parse::info(&slices(rest)).map_err(arg_error)?;
        let mut lock_key = LockKey::open_arg_read(ctx, key_arg);
        let now = context::now_ms();
        let Some(value) = lock_key.existing()? else {
            return Ok(queued_on_absent_key(
                ctx,
                key_arg.as_slice(),
                now,
                queue_limit(&wanted),
            ));
        };
        let lock = value.view();
        // Holders whose expiry has passed are gone even if the timer has not run yet. Plain
        // LOCK.INFO lists them all (O(holders)); OWNER and COUNT look at no more than they list
        // (and at the leases that have passed but whose removal has not run yet).
        let all = lock.holders();
        let holders_count = all.live_len(now);
        let listed: Vec<(&[u8], &Holder)> = match (wanted.owner, wanted.count) {
            (Some(owner), _) => all
                .get(owner)
                .filter(|h| h.expires_at > now)
                .map(|h| (owner, h))
                .into_iter()
                .collect(),
            (None, Some(n)) => all.first_live(now, n),
            (None, None) => {
                let mut every: Vec<_> = all.iter().filter(|(_, h)| h.expires_at > now).collect();
                every.sort_by(|a, b| a.0.cmp(b.0));
                every
            }
        };
        // Every live holder has the same mode.
        let mode = match all.any() {
            Some(h) if holders_count > 0 && h.mode == Mode::Permit => "semaphore",
            Some(h) if holders_count > 0 => h.mode.as_str(),
            _ => "free",
        };
        let holders = listed
            .into_iter()
            .map(|(owner, h)| holder_reply(owner, h, now))
            .collect();
        // A waiter that left during a client pause stays in the value until the pause ends
        // (`blocking`); it is not shown.
        let queue: Vec<(WaiterId, &Waiter)> = lock
            .queue()
            .iter()
            .filter(|(id, _)| waiters::describe(*id).is_some())
            .take(queue_limit(&wanted))
            .collect();
        let waiting = if wanted.is_full() {
            queue.len()
        } else {
            // The bounded forms do not look at every queued client; the value's count includes
            // any that left during a client pause (shown by plain LOCK.INFO without them).
            lock.queue().len()
        };
        let capacity = match lock.kind() {
            Kind::Semaphore(capacity) => Some(capacity),
            _ => None,
        };
        let delay = lock.delay_end(now).saturating_sub(now);
        Ok(reply(
            ctx,
            Fields {
                mode,
                fence: lock.fence(),
                holders,
                holders_count,
                waiting,
                queue: &queue,
                delay,
                capacity,
            },
            now,
        ))
    }
}

/// How many queued clients a reply lists.
fn queue_limit(wanted: &InfoArgs<'_>) -> usize {
    if wanted.is_full() {
        usize::MAX
    } else {
        QUEUE_SHOWN
    }
}

/// One holder entry: `[owner, count, ttl, held, client]`. `held` (ms since the hold began, -1
/// when its start is unknown) and `client` (the id of the connection a BIND hold is bound to,
/// as CLIENT LIST and CLIENT KILL ID show it; 0 for a hold that is not bound) came after the
/// first three, as holder entries may grow.
fn holder_reply(owner: &[u8], h: &Holder, now: u64) -> RedisValue {
    RedisValue::Array(vec![
        RedisValue::StringBuffer(owner.to_vec()),
        RedisValue::Integer(i64::try_from(h.count).unwrap_or(i64::MAX)),
        RedisValue::Integer(i64::try_from(h.expires_at.saturating_sub(now)).unwrap_or(i64::MAX)),
        held_reply(h.held_ms(now)),
        RedisValue::Integer(
            h.options
                .bound_to()
                .map_or(0, |c| i64::try_from(c).unwrap_or(i64::MAX)),
        ),
    ])
}

/// A hold's age as replied by LOCK.INFO and LOCK.QUEUES: ms, or -1 when its start is unknown.
pub(super) fn held_reply(held: Option<u64>) -> RedisValue {
    RedisValue::Integer(held.map_or(-1, |ms| i64::try_from(ms).unwrap_or(i64::MAX)))
}

/// What LOCK.INFO shows, before it is laid out.
struct Fields<'a> {
    mode: &'static str,
    fence: u64,
    holders: Vec<RedisValue>,
    /// Live holders, listed or not.
    holders_count: usize,
    /// Queued clients, listed or not.
    waiting: usize,
    queue: &'a [(WaiterId, &'a Waiter)],
    delay: u64,
    capacity: Option<u32>,
}

/// The key reads as absent, but clients may still be queued on it: while clients are paused
/// (CLIENT PAUSE, a failover) a key whose TTL has passed reads as absent, yet the server keeps
/// it and the hand-over waits for the pause to end; likewise for the moment between a DEL and
/// the settling of its waiters. Those waiters are shown on a free lock (every holder's TTL
/// has passed), with the fence the key had when it last changed. Nil when nobody waits.
fn queued_on_absent_key(ctx: &Context, key: &[u8], now: u64, limit: usize) -> RedisValue {
    let db = context::selected_db(ctx);
    let waiting = waiters::queued_at(db, key);
    if waiting.is_empty() {
        return RedisValue::Null;
    }
    let queue: Vec<(WaiterId, &Waiter)> =
        waiting.iter().take(limit).map(|(id, w)| (*id, w)).collect();
    // Permit requests carry the semaphore's capacity.
    let capacity = waiting
        .iter()
        .find(|(_, w)| w.mode == Mode::Permit)
        .map(|(_, w)| w.capacity);
    reply(
        ctx,
        Fields {
            mode: "free",
            fence: contention::fence_of(db, key).unwrap_or(0),
            holders: Vec::new(),
            holders_count: 0,
            waiting: waiting.len(),
            queue: &queue,
            delay: 0,
            capacity,
        },
        now,
    )
}

/// Lays out the fields: a map in RESP3, a flat array in RESP2.
fn reply(ctx: &Context, f: Fields<'_>, now: u64) -> RedisValue {
    let queue = f
        .queue
        .iter()
        .map(|(_, w)| RedisValue::SimpleStringStatic(w.mode.as_str()))
        .collect();
    let mut map = BTreeMap::new();
    let field = |name: &str| RedisValueKey::String(name.to_string());
    map.insert(field("mode"), RedisValue::SimpleStringStatic(f.mode));
    map.insert(
        field("fence"),
        RedisValue::Integer(i64::try_from(f.fence).unwrap_or(i64::MAX)),
    );
    map.insert(field("holders"), RedisValue::Array(f.holders));
    map.insert(
        field("waiting"),
        RedisValue::Integer(i64::try_from(f.waiting).unwrap_or(i64::MAX)),
    );
    map.insert(field("queue"), RedisValue::Array(queue));
    // Fields added after version 1 come after the first five, in the order they were added
    // (`delay`, then `capacity` for semaphores): RESP2 clients may read by position. The map
    // orders keys by variant first (`String` < `BulkRedisString` < `BulkString`), so each
    // of these sorts after the ones before it whatever its name.
    // Remaining ms of the lock-delay (0 for none); `mode` is `free` meanwhile.
    map.insert(
        RedisValueKey::BulkRedisString(ctx.create_string("delay")),
        RedisValue::Integer(i64::try_from(f.delay).unwrap_or(i64::MAX)),
    );
    if let Some(capacity) = f.capacity {
        map.insert(
            RedisValueKey::BulkString(b"capacity".to_vec()),
            RedisValue::Integer(i64::from(capacity)),
        );
    }
    // Live holders, whether listed or not (version 4): same variant, between the two by name.
    map.insert(
        RedisValueKey::BulkString(b"holders_count".to_vec()),
        RedisValue::Integer(i64::try_from(f.holders_count).unwrap_or(i64::MAX)),
    );
    // Each queued client, head first: [owner, mode, waited ms, client id]. Same variant as
    // `capacity` and after it by name, so it stays last. Replicas have no waiters.
    let waiters = f
        .queue
        .iter()
        .map(|(id, w)| {
            let (client, queued_at) = waiters::describe(*id).unwrap_or((0, now));
            RedisValue::Array(vec![
                RedisValue::StringBuffer(w.owner.to_vec()),
                RedisValue::SimpleStringStatic(w.mode.as_str()),
                RedisValue::Integer(
                    i64::try_from(now.saturating_sub(queued_at)).unwrap_or(i64::MAX),
                ),
                RedisValue::Integer(i64::try_from(client).unwrap_or(i64::MAX)),
            ])
        })
        .collect();
    map.insert(
        RedisValueKey::BulkString(b"waiters".to_vec()),
        RedisValue::Array(waiters),
    );
    RedisValue::OrderedMap(map)
}
