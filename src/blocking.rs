//! Blocking a waiting client, and what happens when Redis calls back for it: the reply once
//! it was granted or refused, its WAIT timeout, its connection closing. A waiter that gives up
//! leaves its key's queue through `keys`, which may grant the waiters behind it.

use std::ffi::CStr;

use redis_lock_core::{Millis, Waiter, WaiterId};
use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::keys::LockKey;
use crate::state::{self, with_waiters, Entry, WaitState};
use crate::sys::blocked::{self, BlockedClientId, BlockedHandler};
use crate::sys::context;
use crate::{deadlines, settle, stats};

/// Blocks the current client as waiter `id` on (`db`, `key`). `timeout` 0 = no limit. `user`:
/// the ACL user that sent it, counted against `lock.max-waiters-per-user`.
/// Returns false if Redis refused to block it.
pub fn block(
    ctx: &Context,
    id: WaiterId,
    db: i32,
    key: &[u8],
    waiter: Waiter,
    timeout: Millis,
    user: Option<Box<[u8]>>,
) -> bool {
    let Some(client) = blocked::block_client::<Callbacks>(ctx, timeout) else {
        return false;
    };
    let handle_id = client.id();
    // Redis's own deadline for the client, on the same clock, read just before this.
    let deadline = if timeout == 0 {
        0
    } else {
        context::now_ms().saturating_add(timeout)
    };
    with_waiters(|r| {
        r.insert(
            id,
            Entry {
                client: Some(client),
                client_handle_id: handle_id,
                client_id: context::client_id(ctx),
                queued_at: context::now_ms(),
                deadline,
                db,
                key: key.into(),
                waiter,
                state: WaitState::Queued,
                user,
            },
        );
    });
    deadlines::on_block(ctx, deadline);
    true
}

/// The blocked-client callbacks (see [`BlockedHandler`]).
pub struct Callbacks;

impl BlockedHandler for Callbacks {
    fn on_reply(_ctx: &Context, client: BlockedClientId) -> RedisResult {
        on_reply(client)
    }

    fn on_timeout(ctx: &Context, client: BlockedClientId) {
        on_timeout(ctx, client);
    }

    fn on_disconnect(ctx: &Context, client: BlockedClientId) {
        on_disconnect(ctx, client);
    }
}

/// Reply callback: the client is still connected and was unblocked by us.
fn on_reply(client: BlockedClientId) -> RedisResult {
    let entry = with_waiters(|r| {
        let id = r.by_client.get(&client).copied()?;
        r.remove(id)
    });
    match entry.map(|e| e.state) {
        Some(WaitState::Granted { token }) => Ok(RedisValue::Integer(
            i64::try_from(token).unwrap_or(i64::MAX),
        )),
        Some(WaitState::WrongType) => Err(RedisError::WrongType),
        Some(WaitState::Refused { message }) => Err(RedisError::Str(message)),
        Some(WaitState::Queued) | None => Ok(RedisValue::Null),
    }
}

/// Timeout callback: the WAIT timeout passed (or CLIENT UNBLOCK). The waiter leaves the queue,
/// which may let the waiters behind it in.
fn on_timeout(ctx: &Context, client: BlockedClientId) {
    let Some((id, mut entry)) = take_queued(client) else {
        return;
    };
    if let Some(handle) = entry.client.take() {
        handle.unblock();
    }
    stats::count_timeout();
    leave_queue(ctx, id, &entry, c"lock.timeout");
}

/// Disconnect callback: the connection closed while queued, or after its grant was decided
/// but before the reply reached it. Either way it must not hold the lock.
fn on_disconnect(ctx: &Context, client: BlockedClientId) {
    let entry = with_waiters(|r| {
        let id = r.by_client.get(&client).copied()?;
        r.remove(id).map(|e| (id, e))
    });
    let Some((id, mut entry)) = entry else {
        return;
    };
    // Redis announces a closing connection (the client-change event) just before it detaches
    // its blocked state; any other call of this callback is not a disconnect.
    let closing = state::closing() == entry.client_id;
    match entry.state {
        WaitState::Queued => {
            if let Some(handle) = entry.client.take() {
                handle.unblock();
            }
            leave_queue(ctx, id, &entry, c"lock.cancel");
        }
        WaitState::Granted { token } if closing => {
            // The connection closed after its grant was decided but before the reply was
            // sent: the client never learns it holds the lock, so give the hold back.
            settle::give_back(ctx, entry.db, &entry.key, &entry.waiter.owner, token);
        }
        WaitState::Granted { token } => {
            // Not a disconnect: Redis 7.0 processed the client's WAIT deadline after we had
            // unblocked it. Its timeout handling skips the module's timeout callback for an
            // unblocked client and detaches the client through this callback instead, so our
            // reply callback will never run. The client is still connected and this is the only
            // chance to answer it, with the grant it has.
            ctx.reply(Ok(RedisValue::Integer(
                i64::try_from(token).unwrap_or(i64::MAX),
            )));
        }
        WaitState::WrongType | WaitState::Refused { .. } if closing => {}
        WaitState::WrongType => {
            // The same race as above.
            ctx.reply(Err(RedisError::WrongType));
        }
        WaitState::Refused { message } => {
            ctx.reply(Err(RedisError::Str(message)));
        }
    }
}

fn take_queued(client: BlockedClientId) -> Option<(WaiterId, Entry)> {
    with_waiters(|r| {
        let id = r.by_client.get(&client).copied()?;
        if r.entries.get(&id)?.state != WaitState::Queued {
            return None;
        }
        r.remove(id).map(|e| (id, e))
    })
}

/// Takes a waiter that gave up out of its key's queue, and notifies `event` there.
fn leave_queue(ctx: &Context, id: WaiterId, entry: &Entry, event: &CStr) {
    if !context::select_db(ctx, entry.db) {
        return;
    }
    // While clients are paused the server must not change the dataset or propagate anything
    // (with AOF on or a replica attached it asserts so and dies), and nobody may be granted.
    // The registry no longer lists this waiter: the settle pass after the pause drops it from
    // the value and serves whoever it let in.
    if context::writes_paused() {
        context::notify_module_event(ctx, event, &ctx.create_string(&*entry.key));
        settle::mark_dirty(entry.db, &entry.key);
        return;
    }
    let mut key = LockKey::open(ctx, &entry.key);
    if let Some(Some(_)) = key.apply(|lock, step| lock.cancel_waiter(id, step)) {
        key.notify(event);
    }
}
