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
/// when it drops. `Unrestricted` is a client that has no user of its own, which the server
/// lets do everything (see `ClientUser::None`).
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
        let name = match client_user_name(ctx) {
            ClientUser::None => return Some(Caller::Unrestricted),
            ClientUser::Named(name) => name,
        };
        // SAFETY: `name` is a string we own (from GetClientUserNameById); it is freed right
        // after GetModuleUserFromUserName has looked the user up by it (the lookup copies
        // nothing from the name).
        let user = unsafe {
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
/// for a client that has no user of its own (see [`client_user_name`]).
pub fn current_user_name(ctx: &Context) -> Option<Box<[u8]>> {
    let ClientUser::Named(name) = client_user_name(ctx) else {
        return None;
    };
    // SAFETY: `name` is a string we own; its bytes are copied before it is freed, once.
    unsafe {
        let copy = super::context::with_bytes(name, |b| Box::<[u8]>::from(b));
        if let Some(free) = raw::RedisModule_FreeString {
            free(ptr::null_mut(), name);
        }
        Some(copy)
    }
}

/// Lends the name of the user running the current command to `f` (`None` for a client that
/// has no user of its own, see [`client_user_name`]), without copying it.
pub fn with_current_user_name<R>(ctx: &Context, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
    let ClientUser::Named(name) = client_user_name(ctx) else {
        return f(None);
    };
    let r = super::context::with_bytes(name, |b| f(Some(b)));
    // SAFETY: `name` is a string we own (see `client_user_name`), freed once, here, after
    // the borrow lent to `f` has ended.
    unsafe {
        if let Some(free) = raw::RedisModule_FreeString {
            free(ptr::null_mut(), name);
        }
    }
    r
}

/// The user of the client running the current command.
enum ClientUser {
    /// A client without a user of its own, which the server lets do everything: the
    /// replication link, the AOF loader, and the temporary client of another module's
    /// `RedisModule_Call` (which runs as the superuser unless that module asked the server to
    /// check a user's permissions, which the server then did for the command itself).
    None,
    /// The user's name, a string the caller owns and must free.
    Named(*mut raw::RedisModuleString),
}

/// Looks the user up by the client's id (`GetClientUserNameById`), never through
/// `GetCurrentUserName`: that one dereferences the client's user, which is NULL for the
/// clients listed under [`ClientUser::None`] (Redis 7.0 and Valkey 8 crash there), while the
/// lookup by id answers NULL for a client that is not a registered connection or has no user.
/// Scripts cannot get here: LOCK.QUEUES is `deny-script`, and nothing else asks for the user
/// unless the request may block, which it may not in a script.
fn client_user_name(ctx: &Context) -> ClientUser {
    if ctx
        .get_flags()
        .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
    {
        return ClientUser::None;
    }
    // SAFETY: ctx is the live context of the current command; GetClientId reads its client's
    // id, and GetClientUserNameById looks that id up among the registered connections,
    // returning NULL (not crashing) when there is none or it has no user. The returned string
    // is created without auto-memory (the module never enables it), so the caller owns it.
    let name = unsafe {
        let id = raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx));
        if id == 0 {
            return ClientUser::None;
        }
        raw::RedisModule_GetClientUserNameById.map_or(ptr::null_mut(), |f| f(ctx.ctx, id))
    };
    if name.is_null() {
        ClientUser::None
    } else {
        ClientUser::Named(name)
    }
}
