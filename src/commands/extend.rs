//! LOCK.EXTEND: reset an owner's expiry (the watchdog's call).

use redis_lock_core::parse;
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::errors::{arg_error, NOT_OWNER};
use crate::keys::LockKey;
use crate::settle;
use crate::sys::commands::Command;
use crate::sys::context;

use super::args::slices;

/// LOCK.EXTEND key owner ttl
pub struct Extend;

impl Command for Extend {
    const NAME: &'static str = "LOCK.EXTEND";
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        let [_, key_arg, rest @ ..] = &args[..] else {
            return Err(RedisError::WrongArity);
        };
        let key = key_arg.as_slice();
        let rest = slices(rest);
        let rest = &rest[..];
        let (owner, ttl) = parse::extend(rest).map_err(arg_error)?;
        settle::run_for(ctx, context::selected_db(ctx), key);
        let mut lock_key = LockKey::open_arg(ctx, key_arg);
        if lock_key.existing()?.is_none() {
            return Err(RedisError::Str(NOT_OWNER));
        }
        let result = lock_key.apply(|lock, step| lock.extend(owner, ttl, step));
        match result {
            Some(Ok(_)) => Ok(RedisValue::Integer(1)),
            _ => Err(RedisError::Str(NOT_OWNER)),
        }
    }
}
