//! ACL users as small numbers: deadlock detection tells owners apart by (user, owner name)
//! (docs/commands.md, "Deadlock detection"), so each hold and each queued request records the user of
//! the connection that made it, as a number that fits in what would be padding of a holder.
//!
//! The numbers are handed out in the order users are first seen and never reused while the
//! server runs (the table lives in memory only: a restarted server numbers afresh, and holds
//! it loads carry no user, see `contention`). A user deleted and created again under its name
//! keeps its number. Past 65,535 distinct names, further users get
//! [`UNKNOWN_USER`]: their holds are then on nobody's walk, as loaded ones are.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU16, AtomicU64};

use redis_lock_core::{UserId, UNKNOWN_USER};
use redis_module::{Context, ContextFlags};

use crate::state::{with_user_of, with_users};
use crate::sys::{acl, context};

/// The number of user `name`, given it a new one the first time.
pub fn intern(name: &[u8]) -> UserId {
    with_users(|users| {
        if let Some(id) = users.get(name) {
            return *id;
        }
        let next = users
            .len()
            .checked_add(1)
            .and_then(|n| UserId::try_from(n).ok());
        match next {
            Some(id) => {
                users.insert(name.into(), id);
                id
            }
            None => UNKNOWN_USER,
        }
    })
}

/// The user running the current command, as a number ([`UNKNOWN_USER`] for a client without
/// a user of its own: the replication link, the AOF loader, another module's call, a script).
/// `flags`: the command's context flags, read by the caller already.
///
/// Asking the server costs about 1,400 instructions (a lookup of the connection, a copy of the
/// name, the table): more than 5 % of a lock and release. So the answer is kept per
/// connection, and forgotten when the connection closes or any command that can change a
/// connection's user (`AUTH`, `HELLO`, `RESET`) is about to run or be queued (the command
/// filter, `sys::filter`): the next request of every connection asks again. Inside MULTI the
/// server is always asked and nothing is kept, since a queued AUTH runs only at EXEC, after the
/// filter saw it.
pub fn current(ctx: &Context, flags: &ContextFlags) -> UserId {
    if flags.intersects(ContextFlags::MULTI | ContextFlags::LUA) {
        return ask(ctx);
    }
    let id = context::client_id(ctx);
    // The last connection asked, in plain statics (a thread-local costs a call in a shared
    // library): a connection sending requests in a row costs two loads.
    if id != 0 && LAST_CLIENT.load(Relaxed) == id {
        return LAST_USER.load(Relaxed);
    }
    let user = match with_user_of(|u| u.get(&id).copied()) {
        Some(user) => user,
        None => {
            let user = ask(ctx);
            if user != UNKNOWN_USER && id != 0 {
                with_user_of(|u| u.insert(id, user));
            }
            user
        }
    };
    if user != UNKNOWN_USER && id != 0 {
        LAST_USER.store(user, Relaxed);
        LAST_CLIENT.store(id, Relaxed);
    }
    user
}

/// The connection [`current`] last answered for (0: none) and its user. Only the main thread
/// uses them, as it does the thread-locals.
static LAST_CLIENT: AtomicU64 = AtomicU64::new(0);
static LAST_USER: AtomicU16 = AtomicU16::new(UNKNOWN_USER);

fn ask(ctx: &Context) -> UserId {
    acl::with_current_user_name(ctx, |name| name.map_or(UNKNOWN_USER, intern))
}

/// Connection `client_id` closed.
pub fn forget_connection(client_id: u64) {
    if LAST_CLIENT.load(Relaxed) == client_id {
        LAST_CLIENT.store(0, Relaxed);
    }
    with_user_of(|u| u.remove(&client_id));
}

/// A command that may change a connection's user is coming: every connection's is asked
/// again.
pub fn forget_connections() {
    LAST_CLIENT.store(0, Relaxed);
    with_user_of(|u| {
        u.clear();
        // Give the memory back once a crowd of connections is gone.
        if u.capacity() > 1024 {
            u.shrink_to_fit();
        }
    });
}
