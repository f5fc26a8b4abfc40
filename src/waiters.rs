//! The registry of clients blocked in the module while they wait for a lock.
//!
//! The lock core only knows waiter ids. The registry (`state::Registry`) maps each id to its
//! blocked client handle and to what it asked for (database, key, owner, mode, ttl), and
//! follows it through its life: queued, then granted (reply pending) or refused, until Redis
//! calls back (`blocking`). The entry owns the client's handle while it is queued and gives it
//! up to the one `unblock` it gets: when granted or refused here, or on timeout or disconnect
//! while queued (`blocking`).

use std::cmp::Reverse;
use std::ops::Bound;

use redis_lock_core::{Listing, Waiter, WaiterId, Who};

use crate::state::{self, with_waiters, WaitState};
use crate::stats;
use crate::sys::context;

/// Redis announced that connection `client_id` is closing (client-change event).
pub fn note_closing(client_id: u64) {
    state::set_closing(client_id);
}

/// How many clients are blocked in the module (queued, or granted with the reply pending).
pub fn count() -> usize {
    with_waiters(|r| r.entries.len())
}

/// How many clients ACL user `user` has blocked in the module (queued, or granted with the
/// reply pending).
pub fn count_of_user(user: &[u8]) -> usize {
    with_waiters(|r| r.by_user.get(user).copied().unwrap_or(0))
}

/// A new waiter id; ids increase in arrival order.
pub fn next_id() -> WaiterId {
    with_waiters(|r| {
        r.next_id += 1;
        WaiterId(r.next_id)
    })
}

/// The core granted waiter `id`: unblock its client; the reply callback sends `token`.
/// Counted as a hand-over, with how long the waiter waited.
pub fn deliver_grant(id: WaiterId, token: u64) {
    let now = context::now_ms();
    let resolved = with_waiters(|r| {
        let queued_at = r.entries.get(&id).map_or(now, |e| e.queued_at);
        r.resolve(id, WaitState::Granted { token })
            .map(|client| (client, queued_at))
    });
    if let Some((client, queued_at)) = resolved {
        stats::count_handoff(now.saturating_sub(queued_at));
        client.unblock();
    }
}

/// Waiter `id`'s key now holds another type: it gets WRONGTYPE.
pub fn refuse_wrong_type(id: WaiterId) {
    if let Some(client) = with_waiters(|r| r.resolve(id, WaitState::WrongType)) {
        client.unblock();
    }
}

/// Waiter `id`'s key now holds another kind or capacity: it gets `message`.
pub fn refuse(id: WaiterId, message: &'static str) {
    if let Some(client) = with_waiters(|r| r.resolve(id, WaitState::Refused { message })) {
        client.unblock();
    }
}

/// Is `id` still queued on (`db`, `key`)?
pub fn is_queued_at(id: WaiterId, db: i32, key: &[u8]) -> bool {
    with_waiters(|r| {
        r.entries
            .get(&id)
            .is_some_and(|e| e.state == WaitState::Queued && e.db == db && *e.key == *key)
    })
}

/// Who queued waiter `id` and when: (client id, queued at, module clock ms).
pub fn describe(id: WaiterId) -> Option<(u64, u64)> {
    with_waiters(|r| r.entries.get(&id).map(|e| (e.client_id, e.queued_at)))
}

/// The waiters still queued on (`db`, `key`), in arrival order.
pub fn queued_at(db: i32, key: &[u8]) -> Vec<(WaiterId, Waiter)> {
    with_waiters(|r| {
        // Most keys have nobody waiting (LOCK.INFO asks for any key): no key copy then.
        if r.by_key.is_empty() {
            return Vec::new();
        }
        let Some(ids) = r.by_key.get(&(db, key.into())) else {
            return Vec::new();
        };
        ids.iter()
            .filter_map(|id| r.entries.get(id).map(|e| (*id, e.waiter.clone())))
            .collect()
    })
}

/// Has (`db`, `key`) any client queued?
pub fn has_queue(place: &state::DbKey) -> bool {
    with_waiters(|r| r.by_key.contains_key(place))
}

/// How [`top_queues`] ranks queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueOrder {
    /// The oldest waiter's wait first.
    Age,
    /// The most waiters first.
    Length,
}

/// One queue as [`top_queues`] reports it.
pub struct QueueSummary {
    pub db: i32,
    pub key: Box<[u8]>,
    pub waiting: u64,
    /// How long its oldest waiter has waited, ms.
    pub oldest_ms: u64,
}

/// How many queues [`top_queues`] skips, at most, in one call because the caller may not read
/// them: with the rankings kept in order, the rows returned (at most COUNT) and these skips
/// are all a call costs, which keeps LOCK.QUEUES under a millisecond of server time whatever
/// the number of queues.
pub const QUEUES_LOOK_LIMIT: usize = 500;

/// What [`top_queues`] and [`prefix_queues`] found: the rows, and whether the walk stopped on
/// its look limit with queues left that it did not look at (the reply must then say so: fewer
/// rows, or none, would otherwise read as "nothing more waits").
pub struct QueuesFound {
    pub rows: Vec<QueueSummary>,
    pub truncated: bool,
}

/// The `count` first queues of the server in `order` that `may_read` accepts (ties: the
/// oldest first waiter, then database and key). Reads the registry's rankings in order, so it
/// costs the queues it looks at: the rows it returns and the ones `may_read` refuses before
/// them, at most `limit` of those (a caller who may read few queues may then get fewer rows
/// than exist for it, never rows out of order, and `truncated` says so). `may_read` is called
/// outside the registry's borrow.
pub fn top_queues(
    now: u64,
    order: QueueOrder,
    count: usize,
    limit: usize,
    may_read: impl FnMut(&[u8]) -> bool,
) -> QueuesFound {
    // Where the last batch ended, in the ranking's own order.
    let mut after: Option<(u64, WaiterId, state::DbKey)> = None;
    walk_queues(count, limit, may_read, |want| {
        let batch: Vec<(u64, WaiterId, state::DbKey, u64)> = with_waiters(|r| {
            let rank = |first: WaiterId, place: &state::DbKey| {
                (
                    r.queue_len(place),
                    first,
                    place.clone(),
                    r.age_of(first, now),
                )
            };
            match order {
                QueueOrder::Age => {
                    let start = match &after {
                        None => Bound::Unbounded,
                        Some((_, first, place)) => Bound::Excluded((*first, place.clone())),
                    };
                    r.by_age
                        .range((start, Bound::Unbounded))
                        .take(want)
                        .map(|(first, place)| rank(*first, place))
                        .collect()
                }
                QueueOrder::Length => {
                    let start = match &after {
                        None => Bound::Unbounded,
                        Some((len, first, place)) => {
                            Bound::Excluded((Reverse(*len), *first, place.clone()))
                        }
                    };
                    r.by_length
                        .range((start, Bound::Unbounded))
                        .take(want)
                        .map(|(_, first, place)| rank(*first, place))
                        .collect()
                }
            }
        });
        if let Some((len, first, place, _)) = batch.last() {
            after = Some((*len, *first, place.clone()));
        }
        batch
            .into_iter()
            .map(|(len, _, place, age)| (place, len, age))
            .collect()
    })
}

/// The first `count` queues, in key order (then database), whose key starts with `prefix` and
/// that `may_read` accepts. Walks the registry's by-name index from the prefix on, so it costs
/// the queues under the prefix it looks at, never any other: the rows depend only on the
/// queues whose keys start with `prefix`. Skips at most `limit` queues `may_read` refuses
/// (`truncated` then says so).
pub fn prefix_queues(
    now: u64,
    prefix: &[u8],
    count: usize,
    limit: usize,
    may_read: impl FnMut(&[u8]) -> bool,
) -> QueuesFound {
    let mut after: Option<(Box<[u8]>, i32)> = None;
    walk_queues(count, limit, may_read, |want| {
        let batch: Vec<(state::DbKey, u64, u64)> = with_waiters(|r| {
            let start = match &after {
                None => Bound::Included((Box::<[u8]>::from(prefix), i32::MIN)),
                Some(last) => Bound::Excluded(last.clone()),
            };
            r.by_name
                .range((start, Bound::Unbounded))
                .take_while(|(name, _)| name.starts_with(prefix))
                .take(want)
                .map(|(name, db)| {
                    let place: state::DbKey = (*db, name.clone());
                    let age = r
                        .by_key
                        .get(&place)
                        .and_then(|ids| ids.first())
                        .map_or(0, |first| r.age_of(*first, now));
                    let len = r.queue_len(&place);
                    (place, len, age)
                })
                .collect()
        });
        if let Some(((db, name), _, _)) = batch.last() {
            after = Some((name.clone(), *db));
        }
        batch
    })
}

/// The walk both listings share: asks `next_batch(want)` for up to `want` more queues in
/// order, as (place, waiting, oldest ms), keeps those `may_read` accepts until `count` rows,
/// and stops after `limit` refused ones.
fn walk_queues(
    count: usize,
    limit: usize,
    mut may_read: impl FnMut(&[u8]) -> bool,
    mut next_batch: impl FnMut(usize) -> Vec<(state::DbKey, u64, u64)>,
) -> QueuesFound {
    const BATCH: usize = 64;
    let mut rows = Vec::new();
    let mut skipped = 0usize;
    loop {
        if rows.len() >= count {
            return QueuesFound {
                rows,
                truncated: false,
            };
        }
        // No more than the rows still wanted (a tenant's skips take further batches).
        let want = BATCH.min(count.saturating_sub(rows.len())).max(1);
        let batch = next_batch(want);
        let exhausted = batch.len() < want;
        let mut batch = batch.into_iter().peekable();
        while let Some((place, waiting, oldest_ms)) = batch.next() {
            if rows.len() >= count {
                break;
            }
            if may_read(&place.1) {
                rows.push(QueueSummary {
                    db: place.0,
                    key: place.1,
                    waiting,
                    oldest_ms,
                });
            } else {
                skipped += 1;
                if skipped >= limit && rows.len() < count {
                    // Stopped looking: anything after this queue was not looked at.
                    let more = batch.peek().is_some() || !exhausted;
                    return QueuesFound {
                        rows,
                        truncated: more,
                    };
                }
            }
        }
        if exhausted {
            return QueuesFound {
                rows,
                truncated: false,
            };
        }
    }
}

/// Every (db, key) that has queued waiters, for databases `dbs` (all when empty).
pub fn waited_keys(dbs: &[i32]) -> Vec<(i32, Box<[u8]>)> {
    with_waiters(|r| {
        r.by_key
            .keys()
            .filter(|(db, _)| dbs.is_empty() || dbs.contains(db))
            .cloned()
            .collect()
    })
}

/// The lock requests `owner` (its user and name) has queued, on any key of any database, for which `keep` says
/// yes, among the first `max` entries of its index; with how many were looked at (an entry
/// no longer queued counts as looked at too).
pub fn queued_of(
    owner: Who<'_>,
    max: usize,
    mut keep: impl FnMut(&state::DbKey) -> bool,
) -> Listing<(state::DbKey, WaiterId)> {
    let owner = state::who_key(owner);
    with_waiters(|r| {
        let Some(ids) = r.by_owner.get(&owner) else {
            return Listing::walk(Vec::new(), max, |_| false);
        };
        let listing = Listing::walk(
            ids.iter().map(|id| {
                r.entries
                    .get(id)
                    .filter(|e| e.state == WaitState::Queued)
                    .map(|e| ((e.db, e.key.clone()), *id))
            }),
            max,
            |entry| entry.as_ref().is_some_and(|(key, _)| keep(key)),
        );
        Listing {
            items: listing.items.into_iter().flatten().collect(),
            walked: listing.walked,
        }
    })
}
