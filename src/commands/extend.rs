//! LOCK.EXTEND: reset an owner's expiry (the watchdog's call).

use redis_lock_core::parse;
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::errors::{arg_error, NOT_OWNER};
use crate::stats;
use crate::sys::commands::Command;

use super::common::{open_held, split_key};

/// LOCK.EXTEND key owner ttl
pub struct Extend;

impl Command for Extend {
    const NAME: &'static str = "LOCK.EXTEND";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        let (key, rest) = split_key(&args)?;
        let (owner, ttl) = parse::extend(&rest).map_err(arg_error)?;
        let mut lock_key = open_held(ctx, key)?;
        let result = lock_key.apply(|lock, step| lock.extend(owner, ttl, step));
        match result {
            Some(Ok(_)) => {
                stats::count_extend();
                lock_key.notify(c"lock.extend");
                Ok(RedisValue::Integer(1))
            }
            _ => Err(RedisError::Str(NOT_OWNER)),
        }
    }
}
