//! LOCK.INFO: a lock's mode, fence, holders, queue and lock-delay (read-only; also on
//! replicas), and the queue of a key that reads as absent while clients wait on it.

use std::collections::BTreeMap;

use redis_module::redisvalue::RedisValueKey;
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::keys::LockKey;
use crate::sys::commands::Command;
use crate::sys::context;
use crate::{contention, waiters};
use redis_lock_core::{Kind, Mode, Waiter, WaiterId};

/// LOCK.INFO key
pub struct Info;

impl Command for Info {
    const NAME: &'static str = "LOCK.INFO";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        let [_, key_arg] = &args[..] else {
            return Err(RedisError::WrongArity);
        };
        let mut lock_key = LockKey::open_arg_read(ctx, key_arg);
        let now = context::now_ms();
        let Some(value) = lock_key.existing()? else {
            return Ok(queued_on_absent_key(ctx, key_arg.as_slice(), now));
        };
        let lock = value.view();
        // Holders whose expiry has passed are gone even if the timer has not run yet.
        let mut holders: Vec<_> = lock
            .holders()
            .iter()
            .filter(|(_, h)| h.expires_at > now)
            .collect();
        holders.sort_by(|a, b| a.0.cmp(b.0));
        let mode = match holders.first() {
            None => "free",
            Some((_, h)) if h.mode == Mode::Permit => "semaphore",
            Some((_, h)) => h.mode.as_str(),
        };
        let holders = holders
            .into_iter()
            .map(|(owner, h)| {
                // [owner, count, ttl, held]: `held` (ms since the hold began, -1 when its
                // start is unknown) came after the first three, as SPEC's version 2 allows.
                RedisValue::Array(vec![
                    RedisValue::StringBuffer(owner.to_vec()),
                    RedisValue::Integer(i64::try_from(h.count).unwrap_or(i64::MAX)),
                    RedisValue::Integer(
                        i64::try_from(h.expires_at.saturating_sub(now)).unwrap_or(i64::MAX),
                    ),
                    held_reply(h.held_ms(now)),
                ])
            })
            .collect();
        // A waiter that left during a client pause stays in the value until the pause ends
        // (`blocking`); it is not shown.
        let queue: Vec<(WaiterId, &Waiter)> = lock
            .queue()
            .iter()
            .filter(|(id, _)| waiters::describe(*id).is_some())
            .collect();
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
                queue: &queue,
                delay,
                capacity,
            },
            now,
        ))
    }
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
    queue: &'a [(WaiterId, &'a Waiter)],
    delay: u64,
    capacity: Option<u32>,
}

/// The key reads as absent, but clients may still be queued on it: while clients are paused
/// (CLIENT PAUSE, a failover) a key whose TTL has passed reads as absent, yet the server keeps
/// it and the hand-over waits for the pause to end; likewise for the moment between a DEL and
/// the settling of its waiters. Those waiters are shown on a free lock (every holder's TTL
/// has passed), with the fence the key had when it last changed. Nil when nobody waits.
fn queued_on_absent_key(ctx: &Context, key: &[u8], now: u64) -> RedisValue {
    let db = context::selected_db(ctx);
    let waiting = waiters::queued_at(db, key);
    if waiting.is_empty() {
        return RedisValue::Null;
    }
    let queue: Vec<(WaiterId, &Waiter)> = waiting.iter().map(|(id, w)| (*id, w)).collect();
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
        RedisValue::Integer(i64::try_from(f.queue.len()).unwrap_or(i64::MAX)),
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
