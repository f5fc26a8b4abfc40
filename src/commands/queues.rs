//! LOCK.QUEUES: the server's queues ranked by their oldest waiter's wait or their length, for
//! finding stuck locks without a SCAN of the keyspace (read-only; keyless, per server). Only
//! keys the calling user may read under its ACL key patterns are reported (SPEC.md, "Tenants
//! (ACL)"): a queue the user may not read is skipped as if it did not exist.

use redis_lock_core::parse::{self, QueuesBy};
use redis_module::{Context, RedisResult, RedisString, RedisValue};

use crate::errors::arg_error;
use crate::sys::acl::Caller;
use crate::sys::commands::Command;
use crate::sys::context;
use crate::waiters::{self, QueueOrder};

use super::common::slices;

/// LOCK.QUEUES [BY AGE|LENGTH] [COUNT n]
pub struct Queues;

impl Command for Queues {
    const NAME: &'static str = "LOCK.QUEUES";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        let rest = args.get(1..).unwrap_or_default();
        let parsed = parse::queues(&slices(rest)).map_err(arg_error)?;
        let order = match parsed.by {
            QueuesBy::Age => QueueOrder::Age,
            QueuesBy::Length => QueueOrder::Length,
        };
        let caller = Caller::of_current(ctx);
        let top = match &caller {
            // A user that no longer exists may read nothing.
            None => Vec::new(),
            Some(caller) => waiters::top_queues(
                context::now_ms(),
                order,
                parsed.count,
                waiters::QUEUES_LOOK_LIMIT,
                |key| caller.may_read(key),
            ),
        };
        Ok(RedisValue::Array(
            top.into_iter()
                .map(|q| {
                    RedisValue::Array(vec![
                        RedisValue::StringBuffer(q.key.into_vec()),
                        RedisValue::Integer(i64::from(q.db)),
                        RedisValue::Integer(i64::try_from(q.waiting).unwrap_or(i64::MAX)),
                        RedisValue::Integer(i64::try_from(q.oldest_ms).unwrap_or(i64::MAX)),
                    ])
                })
                .collect(),
        ))
    }
}
