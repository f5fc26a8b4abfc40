//! ACL users as small numbers: deadlock detection tells owners apart by (user, owner name)
//! (SPEC.md, "Tenants, version 4"), so each hold and each queued request records the user of
//! the connection that made it, as a number that fits in what would be padding of a holder.
//!
//! The numbers are handed out in the order users are first seen and never reused while the
//! server runs (the table lives in memory only: a restarted server numbers afresh, and holds
//! it loads carry no user, see `contention`). A user deleted and created again under its name
//! keeps its number. Past 65,535 distinct names, further users get
//! [`UNKNOWN_USER`]: their holds are then on nobody's walk, as loaded ones are.

use redis_lock_core::{UserId, UNKNOWN_USER};
use redis_module::Context;

use crate::state::with_users;
use crate::sys::acl;

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
/// a user of its own: the replication link, the AOF loader, another module's call).
pub fn current(ctx: &Context) -> UserId {
    acl::with_current_user_name(ctx, |name| name.map_or(UNKNOWN_USER, intern))
}
