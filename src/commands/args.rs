//! The command arguments as byte slices, for the parsers in `redis_lock_core::parse`.

use redis_module::RedisString;

pub fn slices(args: &[RedisString]) -> Vec<&[u8]> {
    args.iter().map(|a| a.as_slice()).collect()
}
