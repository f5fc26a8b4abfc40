//! LOCK.INFO: a lock's mode, fence, holders, queue and lock-delay (read-only; also on
//! replicas).

use std::collections::BTreeMap;

use redis_module::redisvalue::RedisValueKey;
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::keys::LockKey;
use crate::sys::commands::Command;
use crate::sys::context;
use crate::waiters;
use redis_lock_core::{Kind, Mode};

/// LOCK.INFO key
pub struct Info;

impl Command for Info {
    const NAME: &'static str = "LOCK.INFO";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        let [_, key_arg] = &args[..] else {
            return Err(RedisError::WrongArity);
        };
        let mut lock_key = LockKey::open_arg_read(ctx, key_arg);
        let Some(value) = lock_key.existing()? else {
            return Ok(RedisValue::Null);
        };
        let now = context::now_ms();
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
        // Fields added after version 1 come after the first five, in the order they were added
        // (`delay`, then `capacity` for semaphores): RESP2 clients may read by position. The map
        // orders keys by variant first (`String` < `BulkRedisString` < `BulkString`), so each
        // of these sorts after the ones before it whatever its name.
        // Remaining ms of the lock-delay (0 for none); `mode` is `free` meanwhile.
        let delay = lock.delay_end(now).saturating_sub(now);
        map.insert(
            RedisValueKey::BulkRedisString(ctx.create_string("delay")),
            RedisValue::Integer(i64::try_from(delay).unwrap_or(i64::MAX)),
        );
        if let Kind::Semaphore(capacity) = lock.kind() {
            map.insert(
                RedisValueKey::BulkString(b"capacity".to_vec()),
                RedisValue::Integer(i64::from(capacity)),
            );
        }
        // Each queued client, head first: [owner, mode, waited ms, client id]. Same variant as
        // `capacity` and after it by name, so it stays last. Replicas have no waiters.
        let waiters = lock
            .queue()
            .iter()
            .map(|(id, w)| {
                let (client, queued_at) = waiters::describe(id).unwrap_or((0, now));
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
        Ok(RedisValue::OrderedMap(map))
    }
}
