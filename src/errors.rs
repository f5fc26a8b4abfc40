//! Every reply text the module sends, in one place, and the one mapping from an argument
//! error to its reply. Texts never repeat the user's arguments: owners are binary and may hold
//! anything, CRLF included.

use redis_lock_core::parse::ArgError;
use redis_lock_core::{Acquired, Refusal};
use redis_module::RedisError;

pub const NOT_OWNER: &str =
    "NOTOWNER the owner does not hold this lock (never acquired, released or expired)";
pub const TOO_MANY_WAITERS: &str =
    "MAXWAITERS the server-wide waiter limit is reached (lock.max-total-waiters); retry later or raise the limit";
pub const QUEUE_FULL: &str =
    "MAXWAITERS the lock's wait queue is full (lock.max-waiters); retry later or raise the limit";
pub const DEADLOCK: &str =
    "DEADLOCK the owner holds this lock shared and asked for it exclusively; release the read hold first";
pub const DEADLOCK_CYCLE: &str =
    "DEADLOCK waiting would close a cycle: the owners this request waits for wait, directly or through others, for a lock this owner holds; nothing was queued";
pub const COUNT_OVERFLOW: &str = "ERR hold count overflow";
pub const KEY_VANISHED: &str = "ERR the lock key vanished";
pub const KEY_NOT_CREATED: &str = "ERR could not create the lock key";
pub const SYNC_IS_INTERNAL: &str =
    "ERR LOCK.SYNC is internal: it is accepted only from a master or while loading the AOF";
pub const SYNC_TOKEN_REFUSED: &str =
    "ERR LOCK.SYNC state carries a fencing token above what this server accepts (2^53-1 without lock.legacy-tokens); the server log names the key";
pub const SYNC_CONFLICT: &str =
    "ERR LOCK.SYNC state conflicts with the key's other holders (a writer beside another holder)";

/// The reply to a malformed argument list: the standard arity error, or the parser's text.
pub fn arg_error(e: ArgError) -> RedisError {
    match e {
        ArgError::Arity => RedisError::WrongArity,
        other => RedisError::Str(other.message()),
    }
}

pub const BIND_IN_SCRIPT: &str =
    "ERR BIND is not allowed in scripts and functions: their connection never closes";
pub const NOT_A_SEMAPHORE: &str =
    "WRONGKIND the key holds a lock, not a semaphore (LOCK.SEMACQUIRE is for semaphore keys)";
pub const NOT_A_LOCK: &str =
    "WRONGKIND the key holds a semaphore, not a lock (use LOCK.SEMACQUIRE)";
pub const CAPACITY_MISMATCH: &str =
    "ERR the semaphore has another capacity (LOCK.INFO shows it); a key keeps its capacity while it exists";

/// The error a waiter gets when its key was replaced by one of another kind or capacity (a
/// waiter is a permit request exactly when the key it finds is a lock, or the reverse).
pub fn refusal_text(refusal: Acquired) -> &'static str {
    match refusal {
        Acquired::CapacityMismatch => CAPACITY_MISMATCH,
        _ => WAITER_WRONG_KIND,
    }
}

pub const WAITER_WRONG_KIND: &str =
    "WRONGKIND the key was replaced by one of the other kind (a lock for a semaphore or the reverse) while this request waited";

/// The text for a grant the core refused (a direct request, or a waiter at its turn).
pub fn refusal_reason(reason: Refusal) -> &'static str {
    match reason {
        Refusal::Evictable => EVICTABLE_REFUSED,
        Refusal::TokensExhausted
            if redis_lock_core::MAX_EXACT_TOKEN < crate::stats::last_token() =>
        {
            TOKENS_EXHAUSTED_LEGACY
        }
        Refusal::TokensExhausted => TOKENS_EXHAUSTED,
    }
}

pub const TOKENS_EXHAUSTED: &str =
    "ERR the fencing-token counter is at its end (2^53-1) and never repeats a token, so no new hold can be granted (re-entries of held locks still are); see the operations guide, \"Fencing tokens\"";

pub const TOKENS_EXHAUSTED_LEGACY: &str =
    "ERR the fencing-token counter is in the legacy range above 2^53-1 and cannot issue another token (at 2^63-1, or lock.legacy-tokens is off), so no new hold can be granted; see the operations guide, \"Fencing tokens\"";

pub const EVICTABLE_REFUSED: &str =
    "ERR lock.refuse-when-evictable is on and the server can evict keys (maxmemory is set and maxmemory-policy is not noeviction), so a lock could vanish: set maxmemory-policy noeviction, or turn the option off";

/// The error a waiter gets when MIGRATE moved its key to another server (`moving`). TRYAGAIN is
/// the code Redis Cluster uses for "not now, ask again": cluster clients resend the request,
/// and the node that no longer has the key redirects it (ASK or MOVED) to the one that has it.
pub const KEY_MOVED: &str =
    "TRYAGAIN the key was moved to another server (MIGRATE) while this request waited; send the request again where the key now lives";

pub const SLOT_ELSEWHERE: &str =
    "TRYAGAIN the key's hash slot is now served by another node (or by none) while this request waited; send the request again where the key now lives";

pub const USER_WAITERS_FULL: &str =
    "MAXWAITERS this ACL user's waiter limit is reached (lock.max-waiters-per-user); retry later or raise the limit";
