//! The calling user's ACL key permissions: which keys the user that runs the current command
//! may read under its key patterns (`~tenantA:*`). LOCK.QUEUES and deadlock detection report
//! and follow only those keys (SPEC.md, "Tenants (ACL)").
//!
//! Redis offers no call that tells whether a user has `allkeys`: each key is checked with
//! `RedisModule_ACLCheckKeyPermissions`, which for such a user returns at its first test (the
//! selector's all-keys flag) before any pattern is matched, so the check costs a string copy of
//! the key and the call.

use std::ptr;

use redis_module::{raw, Context, ContextFlags};

/// The user whose permissions are checked, for as long as the handle lives; the user is freed
/// when it drops. `Unrestricted` is a client that has no user: the replication link and the
/// AOF loader, which Redis lets do everything (and whose user Redis 7.0 would dereference as
/// NULL if asked for its name).
pub enum Caller {
    Unrestricted,
    User(ModuleUser),
}

/// An owned `RedisModuleUser` handle (never null).
pub struct ModuleUser {
    user: ptr::NonNull<raw::RedisModuleUser>,
}

impl Drop for ModuleUser {
    fn drop(&mut self) {
        // SAFETY: the handle came from RedisModule_GetModuleUserFromUserName, which allocates
        // a new wrapper for every call; it is freed exactly once, here (the handle is not
        // Clone and not Copy).
        unsafe {
            if let Some(free) = raw::RedisModule_FreeModuleUser {
                free(self.user.as_ptr());
            }
        }
    }
}

impl Caller {
    /// The user of the client running the current command. A user that no longer exists
    /// (deleted by ACL DELUSER while its connection stays) is `None`: nothing is readable.
    pub fn of_current(ctx: &Context) -> Option<Caller> {
        if ctx
            .get_flags()
            .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
        {
            return Some(Caller::Unrestricted);
        }
        // SAFETY: ctx is the live context of a command sent by a client (the replication link
        // and the AOF loader, whose client has no user, were excluded above), so
        // GetCurrentUserName reads that client's user name; the returned string is ours and is
        // freed below, after GetModuleUserFromUserName has looked the user up by it (the
        // lookup copies nothing from the name).
        let user = unsafe {
            let name = raw::RedisModule_GetCurrentUserName.map_or(ptr::null_mut(), |f| f(ctx.ctx));
            if name.is_null() {
                return None;
            }
            let user =
                raw::RedisModule_GetModuleUserFromUserName.map_or(ptr::null_mut(), |f| f(name));
            if let Some(free) = raw::RedisModule_FreeString {
                free(ptr::null_mut(), name);
            }
            user
        };
        ptr::NonNull::new(user).map(|user| Caller::User(ModuleUser { user }))
    }

    /// May this user read `key` (ACL key patterns with read permission)?
    pub fn may_read(&self, key: &[u8]) -> bool {
        let Caller::User(user) = self else {
            return true;
        };
        // SAFETY: the key string is created without a context, so it is ours alone; it is
        // passed to the check (which only reads it) and freed right after. The user handle is
        // live while `self` is.
        unsafe {
            let Some(create) = raw::RedisModule_CreateString else {
                return false;
            };
            let s = create(ptr::null_mut(), key.as_ptr().cast(), key.len());
            if s.is_null() {
                return false;
            }
            let verdict = raw::RedisModule_ACLCheckKeyPermissions.map_or(1, |check| {
                check(
                    user.user.as_ptr(),
                    s,
                    raw::REDISMODULE_CMD_KEY_ACCESS as i32,
                )
            });
            if let Some(free) = raw::RedisModule_FreeString {
                free(ptr::null_mut(), s);
            }
            verdict == raw::REDISMODULE_OK as i32
        }
    }
}

/// The name of the user running the current command, for the per-user waiter cap; `None`
/// for the replication link and the AOF loader, which have no user.
pub fn current_user_name(ctx: &Context) -> Option<Box<[u8]>> {
    if ctx
        .get_flags()
        .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
    {
        return None;
    }
    // SAFETY: as in `Caller::of_current`; the name's bytes are copied before it is freed.
    unsafe {
        let name = raw::RedisModule_GetCurrentUserName.map_or(ptr::null_mut(), |f| f(ctx.ctx));
        if name.is_null() {
            return None;
        }
        let copy = super::context::with_bytes(name, |b| Box::<[u8]>::from(b));
        if let Some(free) = raw::RedisModule_FreeString {
            free(ptr::null_mut(), name);
        }
        Some(copy)
    }
}
