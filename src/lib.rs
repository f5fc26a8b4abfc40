//! redis-lock: distributed locks as a native Redis feature.
//!
//! Layout: `lock` is the state machine (pure Rust, no Redis types); `commands` parses and
//! replies; `keys` opens a lock key and commits changes; `blocking` tracks blocked waiters;
//! `expiry` runs the holder timers; `reconcile` serves waiters whose key was deleted or moved;
//! `datatype` is the module type and its RDB encoding; `stats` holds the fencing counter and
//! the INFO figures; `ffi` holds every raw call and `extern "C"` callback; `guard` is the
//! panic guard every entry point goes through.

// The Redis side is only compiled into the module; unit tests build the pure parts.
#![cfg_attr(test, allow(dead_code))]

pub mod lock;

mod blocking;
mod commands;
mod config;
mod datatype;
mod expiry;
mod ffi;
mod guard;
mod keys;
mod reconcile;
mod replication;
mod stats;

#[cfg(not(test))]
mod module {
    use redis_module::configuration::ConfigurationFlags;
    use redis_module::{redis_module, Context, RedisString, Status};

    use crate::commands;
    use crate::datatype::LOCK_TYPE;
    use crate::ffi::{self, KeyAccess};

    fn init(ctx: &Context, args: &[RedisString]) -> Status {
        ffi::init_detached_context(ctx);
        let words: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        if let Err(e) = crate::config::apply_load_args(&words) {
            ctx.log_warning(&format!("lock module: {e}"));
            return Status::Err;
        }
        let commands: [(&str, i32, KeyAccess); 6] = [
            ("lock.acquire", -4, KeyAccess::ReadWrite),
            ("lock.rwread", -4, KeyAccess::ReadWrite),
            ("lock.release", -3, KeyAccess::ReadWrite),
            ("lock.extend", 4, KeyAccess::ReadWrite),
            ("lock.info", 2, KeyAccess::ReadOnly),
            ("lock.sync", 4, KeyAccess::ReadWrite),
        ];
        for (name, arity, access) in commands {
            if let Err(e) = ffi::set_command_info(ctx, name, arity, access) {
                ctx.log_warning(&format!("lock module: {e}"));
                return Status::Err;
            }
        }
        if let Err(e) = ffi::subscribe_events(ctx) {
            ctx.log_warning(&format!("lock module: {e}"));
            return Status::Err;
        }
        ffi::register_info(ctx);
        #[cfg(feature = "test-hooks")]
        if let Err(e) = ffi::register_debug_panic(ctx) {
            ctx.log_warning(&format!("lock module: {e}"));
            return Status::Err;
        }
        ctx.set_module_options(redis_module::ModuleOptions::HANDLE_IO_ERRORS);
        Status::Ok
    }

    redis_module! {
        name: "lock",
        version: 1,
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [LOCK_TYPE],
        init: init,
        commands: [
            ["lock.acquire", commands::acquire, "write deny-oom", 1, 1, 1, ""],
            ["lock.rwread", commands::rwread, "write deny-oom", 1, 1, 1, ""],
            ["lock.release", commands::release, "write fast", 1, 1, 1, ""],
            ["lock.extend", commands::extend, "write fast", 1, 1, 1, ""],
            ["lock.info", commands::info, "readonly fast", 1, 1, 1, ""],
            ["lock.sync", commands::sync, "write fast", 1, 1, 1, ""],
        ],
        configurations: [
            i64: [
                [
                    "max-waiters",
                    &crate::config::MAX_WAITERS,
                    crate::config::DEFAULT_MAX_WAITERS,
                    1,
                    crate::config::MAX_MAX_WAITERS,
                    ConfigurationFlags::DEFAULT,
                    None
                ],
                [
                    "max-total-waiters",
                    &crate::config::MAX_TOTAL_WAITERS,
                    crate::config::DEFAULT_MAX_TOTAL_WAITERS,
                    1,
                    crate::config::MAX_MAX_WAITERS,
                    ConfigurationFlags::DEFAULT,
                    None
                ],
            ],
            // The crate's macro wants every kind listed when any is.
            string: [],
            bool: [],
            enum: [],
            module_args_as_configuration: false,
        ]
    }
}
