//! Clients blocked in the module while they wait for a lock.
//!
//! The lock core only knows waiter ids. This registry maps each id to its blocked client
//! handle and to what it asked for (database, key, owner, mode, ttl), and follows it through
//! its life: queued, then granted (reply pending) or refused, until Redis calls back to reply,
//! to time it out, or because the connection closed. Every handle gets exactly one
//! `unblock_client` call: when granted or refused, on timeout, or on disconnect while queued.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::ffi::{self, BlockedClient};
use crate::keys::LockKey;
use crate::stats;
use redis_lock_core::{Millis, Waiter, WaiterId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Queued,
    /// Granted; the token is replied when Redis calls the reply callback.
    Granted {
        token: u64,
    },
    /// The key now holds another type.
    WrongType,
}

struct Entry {
    client: BlockedClient,
    /// Redis's id of the blocked connection (never reused while the server runs).
    client_id: u64,
    db: i32,
    key: Box<[u8]>,
    waiter: Waiter,
    state: State,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    entries: HashMap<WaiterId, Entry>,
    by_client: HashMap<BlockedClient, WaiterId>,
    /// Queued waiters per (db, key), to serve them again when their key goes away.
    by_key: HashMap<(i32, Box<[u8]>), BTreeSet<WaiterId>>,
}

impl Registry {
    fn unindex_key(&mut self, id: WaiterId, db: i32, key: &[u8]) {
        let k = (db, Box::<[u8]>::from(key));
        if let Some(set) = self.by_key.get_mut(&k) {
            set.remove(&id);
            if set.is_empty() {
                self.by_key.remove(&k);
            }
        }
    }

    fn remove(&mut self, id: WaiterId) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        self.by_client.remove(&entry.client);
        if entry.state == State::Queued {
            self.unindex_key(id, entry.db, &entry.key);
        }
        Some(entry)
    }

    /// Moves a queued entry to `state` and returns its client handle.
    fn resolve(&mut self, id: WaiterId, state: State) -> Option<BlockedClient> {
        let entry = self.entries.get_mut(&id)?;
        if entry.state != State::Queued {
            return None;
        }
        entry.state = state;
        let (client, db, key) = (entry.client, entry.db, entry.key.clone());
        self.unindex_key(id, db, &key);
        Some(client)
    }
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
    /// The id of the connection Redis most recently announced as closing.
    static CLOSING: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Redis announced that connection `client_id` is closing (client-change event).
pub fn note_closing(client_id: u64) {
    CLOSING.with(|c| c.set(client_id));
}

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    REGISTRY.with(|r| f(&mut r.borrow_mut()))
}

/// How many clients are blocked in the module (queued, or granted with the reply pending).
pub fn count() -> usize {
    with(|r| r.entries.len())
}

/// A new waiter id; ids increase in arrival order.
pub fn next_id() -> WaiterId {
    with(|r| {
        r.next_id += 1;
        WaiterId(r.next_id)
    })
}

/// Blocks the current client as waiter `id` on (`db`, `key`). `timeout` 0 = no limit.
/// Returns false if Redis refused to block it.
pub fn block(
    ctx: &Context,
    id: WaiterId,
    db: i32,
    key: &[u8],
    waiter: Waiter,
    timeout: Millis,
) -> bool {
    let Some(client) = ffi::block_client(ctx, timeout) else {
        return false;
    };
    with(|r| {
        r.by_client.insert(client, id);
        r.by_key.entry((db, key.into())).or_default().insert(id);
        r.entries.insert(
            id,
            Entry {
                client,
                client_id: ffi::client_id(ctx),
                db,
                key: key.into(),
                waiter,
                state: State::Queued,
            },
        );
    });
    true
}

/// The core granted waiter `id`: unblock its client; the reply callback sends `token`.
pub fn deliver_grant(id: WaiterId, token: u64) {
    if let Some(client) = with(|r| r.resolve(id, State::Granted { token })) {
        ffi::unblock_client(client);
    }
}

/// Waiter `id`'s key now holds another type: it gets WRONGTYPE.
pub fn refuse_wrong_type(id: WaiterId) {
    if let Some(client) = with(|r| r.resolve(id, State::WrongType)) {
        ffi::unblock_client(client);
    }
}

/// Is `id` still queued on (`db`, `key`)?
pub fn is_queued_at(id: WaiterId, db: i32, key: &[u8]) -> bool {
    with(|r| {
        r.entries
            .get(&id)
            .is_some_and(|e| e.state == State::Queued && e.db == db && *e.key == *key)
    })
}

/// The waiters still queued on (`db`, `key`), in arrival order.
pub fn queued_at(db: i32, key: &[u8]) -> Vec<(WaiterId, Waiter)> {
    with(|r| {
        let Some(ids) = r.by_key.get(&(db, key.into())) else {
            return Vec::new();
        };
        ids.iter()
            .filter_map(|id| r.entries.get(id).map(|e| (*id, e.waiter.clone())))
            .collect()
    })
}

/// Every (db, key) that has queued waiters, for databases `dbs` (all when empty).
pub fn waited_keys(dbs: &[i32]) -> Vec<(i32, Box<[u8]>)> {
    with(|r| {
        r.by_key
            .keys()
            .filter(|(db, _)| dbs.is_empty() || dbs.contains(db))
            .cloned()
            .collect()
    })
}

/// Reply callback: the client is still connected and was unblocked by us.
pub fn on_reply(client: BlockedClient) -> RedisResult {
    let entry = with(|r| {
        let id = r.by_client.get(&client).copied()?;
        r.remove(id)
    });
    match entry.map(|e| e.state) {
        Some(State::Granted { token }) => Ok(RedisValue::Integer(
            i64::try_from(token).unwrap_or(i64::MAX),
        )),
        Some(State::WrongType) => Err(RedisError::WrongType),
        Some(State::Queued) | None => Ok(RedisValue::Null),
    }
}

/// Timeout callback: the WAIT timeout passed (or CLIENT UNBLOCK). The waiter leaves the queue,
/// which may let the waiters behind it in.
pub fn on_timeout(ctx: &Context, client: BlockedClient) {
    let Some((id, entry)) = take_queued(client) else {
        return;
    };
    ffi::unblock_client(client);
    stats::count_timeout();
    leave_queue(ctx, id, &entry);
}

/// Disconnect callback: the connection closed while queued, or after its grant was decided
/// but before the reply reached it. Either way it must not hold the lock.
pub fn on_disconnect(ctx: &Context, client: BlockedClient) {
    let entry = with(|r| {
        let id = r.by_client.get(&client).copied()?;
        r.remove(id).map(|e| (id, e))
    });
    let Some((id, entry)) = entry else {
        return;
    };
    // Redis announces a closing connection (the client-change event) just before it detaches
    // its blocked state; any other call of this callback is not a disconnect.
    let closing = CLOSING.with(|c| c.get()) == entry.client_id;
    match entry.state {
        State::Queued => {
            ffi::unblock_client(client);
            leave_queue(ctx, id, &entry);
        }
        State::Granted { token } if closing => {
            // The connection closed after its grant was decided but before the reply was
            // sent: the client never learns it holds the lock, so give the hold back.
            roll_back_grant(ctx, entry.db, &entry.key, &entry.waiter.owner, token);
        }
        State::Granted { token } => {
            // Not a disconnect: Redis 7.0 processed the client's WAIT deadline after we had
            // unblocked it. Its timeout handling skips the module's timeout callback for an
            // unblocked client and detaches the client through this callback instead, so our
            // reply callback will never run. The client is still connected and this is the only
            // chance to answer it, with the grant it has.
            ctx.reply(Ok(RedisValue::Integer(
                i64::try_from(token).unwrap_or(i64::MAX),
            )));
        }
        State::WrongType if closing => {}
        State::WrongType => {
            // The same race as above.
            ctx.reply(Err(RedisError::WrongType));
        }
    }
}

fn take_queued(client: BlockedClient) -> Option<(WaiterId, Entry)> {
    with(|r| {
        let id = r.by_client.get(&client).copied()?;
        if r.entries.get(&id)?.state != State::Queued {
            return None;
        }
        r.remove(id).map(|e| (id, e))
    })
}

/// Takes a waiter that gave up out of its key's queue.
fn leave_queue(ctx: &Context, id: WaiterId, entry: &Entry) {
    if !ffi::select_db(ctx, entry.db) {
        return;
    }
    let mut key = LockKey::open(ctx, &entry.key);
    key.apply(|lock, step| lock.cancel_waiter(id, step));
}

/// Gives back the hold a grant created, if the holder is still exactly that grant.
pub fn roll_back_grant(ctx: &Context, db: i32, key: &[u8], owner: &[u8], token: u64) {
    if !ffi::select_db(ctx, db) {
        return;
    }
    let mut lock_key = LockKey::open(ctx, key);
    let still_holds = matches!(lock_key.existing(), Ok(Some(v))
        if v.lock.holders().get(owner).is_some_and(|h| h.token == token));
    if still_holds {
        lock_key.apply(|lock, step| lock.release(owner, false, step));
        lock_key.notify(c"lock.release");
    }
}
