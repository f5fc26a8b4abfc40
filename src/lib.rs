//! redis-lock: distributed locks as a native Redis feature.
//!
//! Layout: `lock` is the state machine (pure Rust, no Redis types); `commands` parses and
//! replies; `keys` opens a lock key and commits changes; `blocking` tracks blocked waiters;
//! `expiry` runs the holder timers; `reconcile` serves waiters whose key was deleted or moved;
//! `datatype` is the module type and its RDB encoding; `metadata` is what COMMAND DOCS, ACL
//! and MODULE LIST learn about the module; `stats` holds the fencing counter and
//! the INFO figures; `ffi` holds every raw call and `extern "C"` callback; `guard` is the
//! panic guard every entry point goes through.

// The Redis side is only compiled into the module; unit tests build the pure parts.
#![cfg_attr(test, allow(dead_code))]

mod blocking;
mod commands;
mod config;
mod datatype;
mod errors;
mod expiry;
mod ffi;
mod guard;
mod keys;
mod metadata;
mod reconcile;
mod replication;
mod stats;

#[cfg(not(test))]
mod module {
    use redis_module::configuration::ConfigurationFlags;
    use redis_module::{redis_module, Context, RedisString, Status};

    use crate::commands;
    use crate::datatype::LOCK_TYPE;
    use crate::ffi;
    use crate::metadata;

    fn init(ctx: &Context, args: &[RedisString]) -> Status {
        ffi::init_detached_context(ctx);
        let words: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        if let Err(e) = crate::config::apply_load_args(&words) {
            ctx.log_warning(&format!("lock module: {e}"));
            return Status::Err;
        }
        // The module's own ACL category, where the server can add one (Redis 7.4+, Valkey 8+).
        let own_category = match ffi::add_module_acl_category(ctx, metadata::ACL_CATEGORY) {
            Ok(added) => added.then_some(metadata::ACL_CATEGORY),
            Err(e) => {
                ctx.log_warning(&format!("lock module: {e}"));
                return Status::Err;
            }
        };
        for doc in metadata::COMMANDS {
            if let Err(e) = ffi::set_command_info(ctx, doc, own_category) {
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
        if let Err(e) = ffi::register_test_commands(ctx) {
            ctx.log_warning(&format!("lock module: {e}"));
            return Status::Err;
        }
        ctx.set_module_options(redis_module::ModuleOptions::HANDLE_IO_ERRORS);
        Status::Ok
    }

    // Test builds count the module's allocations for the leak test (see ffi::CountingAlloc).
    #[cfg(feature = "test-hooks")]
    use crate::ffi::CountingAlloc as ModuleAlloc;
    #[cfg(not(feature = "test-hooks"))]
    use redis_module::alloc::RedisAlloc as ModuleAlloc;

    redis_module! {
        name: "lock",
        version: metadata::MODULE_VERSION,
        allocator: (ModuleAlloc, ModuleAlloc),
        data_types: [LOCK_TYPE],
        init: init,
        commands: [
            ["lock.acquire", commands::acquire, metadata::ACQUIRE.flags, 1, 1, 1, ""],
            ["lock.rwread", commands::rwread, metadata::RWREAD.flags, 1, 1, 1, ""],
            ["lock.release", commands::release, metadata::RELEASE.flags, 1, 1, 1, ""],
            ["lock.extend", commands::extend, metadata::EXTEND.flags, 1, 1, 1, ""],
            ["lock.info", commands::info, metadata::INFO.flags, 1, 1, 1, ""],
            ["lock.sync", commands::sync, metadata::SYNC.flags, 1, 1, 1, ""],
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
