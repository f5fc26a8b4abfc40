//! LOCK.RELEASE: drop one hold (or all), and hand the lock to the next waiters in the same
//! step.

use redis_lock_core::parse;
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::errors::{arg_error, NOT_OWNER};
use crate::sys::commands::Command;

use super::common::{open_held, split_key};

/// LOCK.RELEASE key owner [ALL]
pub struct Release;

impl Command for Release {
    const NAME: &'static str = "LOCK.RELEASE";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        let (key, rest) = split_key(&args)?;
        let (owner, all) = parse::release(&rest).map_err(arg_error)?;
        let mut lock_key = open_held(ctx, key)?;
        let remaining = lock_key
            .apply(|lock, step| lock.release(owner, all, step))
            .ok_or(RedisError::Str(NOT_OWNER))?
            .map_err(|_| RedisError::Str(NOT_OWNER))?;
        crate::stats::count_release();
        lock_key.notify(c"lock.release");
        Ok(RedisValue::Integer(
            i64::try_from(remaining).unwrap_or(i64::MAX),
        ))
    }
}
