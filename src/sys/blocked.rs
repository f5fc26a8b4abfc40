//! Clients blocked natively by the module: the handle, and the three callbacks Redis makes for
//! a blocked client, as trampolines generic over a [`BlockedHandler`].

use std::ffi::c_int;
use std::ptr::{self, NonNull};

use redis_module::{raw, Context, RedisResult, RedisValue};

use super::guard::guard;

/// Identifies a blocked client while Redis holds it blocked: what the callbacks report, for
/// looking up the owned [`BlockedClient`]. Carries no power to act on the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockedClientId(usize);

/// The handle of a client the module blocked. Not `Copy` or `Clone`: [`BlockedClient::unblock`]
/// consumes it, so a client is unblocked at most once; dropping it without unblocking leaves
/// the client to its timeout or disconnect callback.
#[derive(Debug)]
pub struct BlockedClient(NonNull<raw::RedisModuleBlockedClient>);

impl BlockedClient {
    pub fn id(&self) -> BlockedClientId {
        BlockedClientId(self.0.as_ptr() as usize)
    }

    /// Tells Redis the client is done: its reply callback runs shortly (if the client is still
    /// connected) and Redis frees the handle.
    pub fn unblock(self) {
        // SAFETY: the handle is live (Redis frees it only after this call) and, since `self`
        // is consumed, this is the only unblock for it.
        unsafe {
            if let Some(f) = raw::RedisModule_UnblockClient {
                f(self.0.as_ptr(), ptr::null_mut());
            }
        }
    }
}

/// What happens to blocked clients. Every method runs inside the panic guard.
pub trait BlockedHandler: 'static {
    /// The client was unblocked by the module and is still connected: its reply.
    fn on_reply(ctx: &Context, client: BlockedClientId) -> RedisResult;
    /// Its timeout passed (or CLIENT UNBLOCK). Redis replies with what the handler sends
    /// through `ctx`, or nil.
    fn on_timeout(ctx: &Context, client: BlockedClientId);
    /// Its connection closed before its reply was sent (see the handler for the one other
    /// case Redis 7.0 uses this callback for).
    fn on_disconnect(ctx: &Context, client: BlockedClientId);
}

/// Blocks the client running the current command, with `H`'s callbacks. `timeout_ms` 0 means
/// no time limit. `None` if Redis refused.
pub fn block_client<H: BlockedHandler>(ctx: &Context, timeout_ms: u64) -> Option<BlockedClient> {
    let timeout = i64::try_from(timeout_ms).unwrap_or(i64::MAX);
    // SAFETY: called from a command callback with its live ctx; no private data (so no free
    // callback); the callbacks are the guarded trampolines below.
    let bc = unsafe {
        raw::RedisModule_BlockClient?(
            ctx.ctx,
            Some(on_reply::<H>),
            Some(on_timeout::<H>),
            None,
            timeout,
        )
    };
    let bc = NonNull::new(bc)?;
    // SAFETY: bc was just returned by BlockClient and is live.
    unsafe {
        if let Some(f) = raw::RedisModule_SetDisconnectCallback {
            f(bc.as_ptr(), Some(on_disconnect::<H>));
        }
    }
    Some(BlockedClient(bc))
}

fn blocked_id(ctx: *mut raw::RedisModuleCtx) -> BlockedClientId {
    // SAFETY: only called from reply/timeout callbacks, whose ctx carries the handle.
    let bc = unsafe { raw::RedisModule_GetBlockedClientHandle.map_or(ptr::null_mut(), |f| f(ctx)) };
    BlockedClientId(bc as usize)
}

/// Called by Redis (main thread) for a blocked client after `unblock`, if it is still
/// connected.
extern "C" fn on_reply<H: BlockedHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let reply = guard("blocked reply", || H::on_reply(&context, blocked_id(ctx)));
    context.reply(reply) as c_int
}

/// Called by Redis when a blocked client's timeout passes (or CLIENT UNBLOCK). Not called once
/// the module has unblocked the client.
extern "C" fn on_timeout<H: BlockedHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let id = blocked_id(ctx);
    let reply = guard("blocked timeout", || {
        H::on_timeout(&context, id);
        Ok(RedisValue::Null)
    });
    context.reply(reply) as c_int
}

/// Called by Redis when a blocked client's connection closes before its reply was sent. The
/// client context is going away; Redis frees the handle after it is unblocked.
extern "C" fn on_disconnect<H: BlockedHandler>(
    ctx: *mut raw::RedisModuleCtx,
    bc: *mut raw::RedisModuleBlockedClient,
) {
    let context = Context::new(ctx);
    let _ = guard("blocked disconnect", || {
        H::on_disconnect(&context, BlockedClientId(bc as usize));
        Ok(RedisValue::Null)
    });
}
