//! The registry of clients blocked in the module while they wait for a lock.
//!
//! The lock core only knows waiter ids. The registry (`state::Registry`) maps each id to its
//! blocked client handle and to what it asked for (database, key, owner, mode, ttl), and
//! follows it through its life: queued, then granted (reply pending) or refused, until Redis
//! calls back (`blocking`). The entry owns the client's handle while it is queued and gives it
//! up to the one `unblock` it gets: when granted or refused here, or on timeout or disconnect
//! while queued (`blocking`).

use redis_lock_core::{Waiter, WaiterId};

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

/// The `count` first queues of the server in `order` (ties: the other figure, then database and
/// key). Looks once at each key with waiters and copies only the names it returns: O(W + count
/// log count) for W keys with waiters, whatever the number of keys without any.
pub fn top_queues(now: u64, order: QueueOrder, count: usize) -> Vec<QueueSummary> {
    with_waiters(|r| {
        let mut all: Vec<(&state::DbKey, u64, u64)> = r.queues(now).collect();
        let rank = |a: &(&state::DbKey, u64, u64), b: &(&state::DbKey, u64, u64)| {
            let (first, second) = match order {
                QueueOrder::Age => ((b.2, b.1), (a.2, a.1)),
                QueueOrder::Length => ((b.1, b.2), (a.1, a.2)),
            };
            first.cmp(&second).then_with(|| a.0.cmp(b.0))
        };
        if count == 0 {
            return Vec::new();
        }
        if all.len() > count {
            all.select_nth_unstable_by(count - 1, rank);
            all.truncate(count);
        }
        all.sort_unstable_by(rank);
        all.into_iter()
            .map(|((db, key), waiting, oldest_ms)| QueueSummary {
                db: *db,
                key: key.clone(),
                waiting,
                oldest_ms,
            })
            .collect()
    })
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

/// The lock requests `owner` has queued, on any key of any database: (id, db, key).
pub fn queued_of(owner: &[u8]) -> Vec<(WaiterId, i32, Box<[u8]>)> {
    with_waiters(|r| {
        let Some(ids) = r.by_owner.get(owner) else {
            return Vec::new();
        };
        ids.iter()
            .filter_map(|id| r.entries.get(id).map(|e| (*id, e.db, e.key.clone())))
            .collect()
    })
}
