//! LOCK.QUEUES: the server's queues ranked by their oldest waiter's wait or their length, for
//! finding stuck locks without a SCAN of the keyspace (read-only; keyless, per server). Only
//! keys the calling user may read under its ACL key patterns are reported (SPEC.md, "Tenants
//! (ACL)"): a queue the user may not read is skipped as if it did not exist. Each row names
//! the key's holders (a few of them for a widely shared lock) and how long they have held it,
//! so a stuck lock and its holder are found in one command.
//!
//! Bounded cost: a call looks at its rows and at most `waiters::QUEUES_LOOK_LIMIT` queues the
//! caller may not read; a call that stopped there with queues left unexamined ends its reply
//! with the status `TRUNCATED`, so an empty or short reply never reads as "nothing more
//! waits". `PREFIX p` lists only queues whose key starts with `p`, in key order, walking the
//! registry's by-name index from `p` on: its rows depend only on the queues under the prefix.

use redis_lock_core::parse::{self, QueuesBy};
use redis_module::{Context, RedisResult, RedisString, RedisValue};

use crate::errors::arg_error;
use crate::keys::LockKey;
use crate::sys::acl::Caller;
use crate::sys::commands::Command;
use crate::sys::context;
use crate::waiters::{self, QueueOrder};

use super::common::slices;
use super::info::held_reply;

/// Holders named per row, at most: a lock is held by one owner, or shared by readers or
/// permit holders, whose full list LOCK.INFO gives.
pub const HOLDERS_NAMED: usize = 10;

/// Holders looked at per row to find those to name (a holder whose lease has just passed is
/// skipped): with COUNT 1000, at most 64,000 entries in all, whatever the number of readers.
const HOLDERS_LOOKED_AT: usize = 64;

/// The last element of a reply whose walk stopped on its look limit with queues it did not
/// look at.
pub const TRUNCATED: &str = "TRUNCATED";

/// LOCK.QUEUES [BY AGE|LENGTH] [COUNT n] [PREFIX p]
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
        let found = match &caller {
            // A user that no longer exists may read nothing.
            None => waiters::QueuesFound {
                rows: Vec::new(),
                truncated: false,
            },
            Some(caller) => match parsed.prefix {
                Some(prefix) => waiters::prefix_queues(
                    context::now_ms(),
                    prefix,
                    parsed.count,
                    waiters::QUEUES_LOOK_LIMIT,
                    |key| caller.may_read(key),
                ),
                None => waiters::top_queues(
                    context::now_ms(),
                    order,
                    parsed.count,
                    waiters::QUEUES_LOOK_LIMIT,
                    |key| caller.may_read(key),
                ),
            },
        };
        let top = found.rows;
        let now = context::now_ms();
        let original_db = context::selected_db(ctx);
        let rows = top
            .into_iter()
            .map(|q| {
                let (holding, holders) = holders_of(ctx, q.db, &q.key, now);
                RedisValue::Array(vec![
                    RedisValue::StringBuffer(q.key.into_vec()),
                    RedisValue::Integer(i64::from(q.db)),
                    RedisValue::Integer(i64::try_from(q.waiting).unwrap_or(i64::MAX)),
                    RedisValue::Integer(i64::try_from(q.oldest_ms).unwrap_or(i64::MAX)),
                    RedisValue::Integer(i64::try_from(holding).unwrap_or(i64::MAX)),
                    RedisValue::Array(holders),
                ])
            })
            .collect::<Vec<_>>();
        context::select_db(ctx, original_db);
        let mut rows = rows;
        if found.truncated {
            // The walk stopped on its look limit: say so, so that fewer rows (or none) are
            // not read as "nothing more waits".
            rows.push(RedisValue::SimpleStringStatic(TRUNCATED));
        }
        Ok(RedisValue::Array(rows))
    }
}

/// The number of holders of (`db`, `key`) and up to [`HOLDERS_NAMED`] of them as
/// `[owner, held]` (held: ms since the hold began, -1 when unknown), sorted by owner. A key
/// that reads as absent (a TTL that passed during a client pause, a DEL whose waiters are
/// being served) has none. Leaves `db` selected.
fn holders_of(ctx: &Context, db: i32, key: &[u8], now: u64) -> (usize, Vec<RedisValue>) {
    if !context::select_db(ctx, db) {
        return (0, Vec::new());
    }
    let mut lock_key = LockKey::open_read(ctx, key);
    let Ok(Some(value)) = lock_key.existing() else {
        return (0, Vec::new());
    };
    let lock = value.view();
    let named = lock
        .holders()
        .some_live(now, HOLDERS_NAMED, HOLDERS_LOOKED_AT)
        .into_iter()
        .map(|(owner, h)| {
            RedisValue::Array(vec![
                RedisValue::StringBuffer(owner.to_vec()),
                held_reply(h.held_ms(now)),
            ])
        })
        .collect();
    // Live holders only, as LOCK.INFO shows them, within the same look budget.
    let holding = lock.holders().live_count(now, HOLDERS_LOOKED_AT);
    (holding, named)
}
