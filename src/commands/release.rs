//! LOCK.RELEASE: drop one hold (or all), and hand the lock to the next waiters in the same
//! step.

use redis_lock_core::parse;
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::errors::{arg_error, NOT_OWNER};
use crate::keys::LockKey;
use crate::settle;
use crate::sys::commands::Command;
use crate::sys::context;

use super::args::slices;

/// LOCK.RELEASE key owner [ALL]
pub struct Release;

impl Command for Release {
    const NAME: &'static str = "LOCK.RELEASE";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        let [_, key_arg, rest @ ..] = &args[..] else {
            return Err(RedisError::WrongArity);
        };
        let key = key_arg.as_slice();
        let rest = slices(rest);
        let rest = &rest[..];
        let (owner, all) = parse::release(rest).map_err(arg_error)?;
        settle::run_for(ctx, context::selected_db(ctx), key);
        let mut lock_key = LockKey::open_arg(ctx, key_arg);
        if lock_key.existing()?.is_none() {
            return Err(RedisError::Str(NOT_OWNER));
        }
        let remaining = lock_key
            .apply(|lock, step| lock.release(owner, all, step))
            .ok_or(RedisError::Str(NOT_OWNER))?
            .map_err(|_| RedisError::Str(NOT_OWNER))?;
        lock_key.notify(c"lock.release");
        Ok(RedisValue::Integer(
            i64::try_from(remaining).unwrap_or(i64::MAX),
        ))
    }
}
