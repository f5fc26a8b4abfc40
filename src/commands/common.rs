//! What several commands share: splitting off the key, and opening the key of a command that
//! needs the owner to hold the lock.

use redis_module::{Context, RedisError, RedisString};

use crate::errors::NOT_OWNER;
use crate::keys::LockKey;
use crate::settle;

/// `COMMAND key rest...`: the key argument, and the rest as byte slices for the parsers in
/// `redis_lock_core::parse`. The standard arity error when there is no key.
pub fn split_key(args: &[RedisString]) -> Result<(&RedisString, Vec<&[u8]>), RedisError> {
    let [_, key, rest @ ..] = args else {
        return Err(RedisError::WrongArity);
    };
    Ok((key, slices(rest)))
}

pub fn slices(args: &[RedisString]) -> Vec<&[u8]> {
    args.iter().map(|a| a.as_slice()).collect()
}

/// Opens the key of a command whose owner must hold the lock (RELEASE, EXTEND), after settling
/// it; NOTOWNER when the key holds no lock.
pub fn open_held<'a>(ctx: &'a Context, key: &'a RedisString) -> Result<LockKey<'a>, RedisError> {
    let mut lock_key = settle::open_settled(ctx, key);
    if lock_key.existing()?.is_none() {
        return Err(RedisError::Str(NOT_OWNER));
    }
    Ok(lock_key)
}
