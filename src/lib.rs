//! redis-lock: distributed locks as a native Redis feature.
//!
//! The map (imports point down this list; docs/design.md has the longer version):
//! - `redis_lock_core` (crate `core/`): the lock state machine, argument parsing and the
//!   `LOCK.SYNC` codec; pure Rust, the clock passed in.
//! - `commands/`: one file per command, and the table they are registered from; `metadata`
//!   describes them (COMMAND DOCS, flags, ACL categories); `errors` holds every reply text.
//! - `keys`: opening a lock key and committing a change (replies to granted waiters,
//!   replication, notifications, INFO figures, key expiry, the timer).
//! - `waiters` (blocked clients), `deadlines` (waking the loop at WAIT deadlines), `timers`
//!   (holder expiry), `settle` (waiters and timers after Redis moved or removed a key,
//!   a bounded slice per turn), `events` (where server events lead), `replication`
//!   (effects to replicas and the AOF), `datatype` (the data type and its RDB codec), `value`
//!   (what a key holds), `stats` (fencing counter and INFO figures), `config`, `eviction`
//!   (the server's maxmemory eviction made visible, and refusable).
//! - `sys/`: every `unsafe` block and raw call, importing nothing from the rest of the crate.
//!
//! The one recursion the domain has: `keys::LockKey::commit` arms a timer (`timers`), and a
//! timer firing commits again through `keys`; likewise `waiters` and `settle` commit through
//! `keys`, which tells `waiters` about grants.

// The Redis side is only registered in the module; unit tests build the rest.
#![cfg_attr(test, allow(dead_code))]

mod blocking;
mod bound;
mod commands;
mod config;
mod contention;
mod datatype;
mod deadlines;
mod deadlock;
mod defrag;
mod errors;
mod events;
mod eviction;
mod keys;
mod metadata;
mod moving;
mod replication;
mod settle;
mod state;
mod stats;
mod sys;
mod timers;
mod users;
mod value;
mod waiters;

#[cfg(not(test))]
mod module {
    use redis_module::configuration::ConfigurationFlags;
    use redis_module::{redis_module, Context, RedisString, Status};

    use crate::sys::{
        api, cluster, commands::add_module_acl_category, context, events, filter, info,
    };
    use crate::value::LOCK_TYPE;
    use crate::{commands, metadata, stats};

    fn init(ctx: &Context, args: &[RedisString]) -> Status {
        match setup(ctx, args) {
            Ok(()) => Status::Ok,
            Err(e) => {
                ctx.log_warning(&format!("lock module: {e}"));
                Status::Err
            }
        }
    }

    fn setup(ctx: &Context, args: &[RedisString]) -> Result<(), String> {
        api::check()?;
        context::init_detached_context(ctx);
        cluster::init(ctx);
        let words: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        // The crate already applied them as the configs' defaults (before this runs); here they
        // are only checked, so a bad one fails the load with its reason.
        crate::config::check_load_args(&words)?;
        // Tokens start above the clock's floor: above anything an earlier run of this server
        // issued, saved or not (an RDB or AOF loaded next can only raise the counter).
        stats::raise_fences_to_clock("at module load");
        // The module's own ACL category, where the server can add one (Redis 7.4+, Valkey 8+).
        let own_category =
            add_module_acl_category(ctx, metadata::ACL_CATEGORY)?.then_some(metadata::ACL_CATEGORY);
        commands::register_all(ctx, own_category)?;
        #[cfg(feature = "test-hooks")]
        commands::debug::register(ctx)?;
        // Valkey 9's atomic slot migration (CLUSTER MIGRATESLOTS): the module takes part in it
        // (see `moving`); only on Valkey, and only where the server knows the option.
        let slot_migration =
            cluster::known_module_options() & cluster::HANDLE_ATOMIC_SLOT_MIGRATION != 0
                && cluster::is_valkey(ctx);
        events::subscribe::<crate::events::Events>(ctx, slot_migration)?;
        // Marks where each command starts, to tell a MIGRATE from a DEL (see `moving`).
        filter::register::<crate::moving::CommandClock>(ctx)?;
        info::register::<stats::InfoFields>(ctx);
        // maxmemory and its policy come from the config file, read before modules load.
        crate::eviction::check_at_load();
        let mut options = redis_module::raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS as i32;
        if slot_migration {
            options |= cluster::HANDLE_ATOMIC_SLOT_MIGRATION;
        }
        cluster::set_module_options(ctx, options);
        Ok(())
    }

    // Test builds count the module's allocations for the leak test (see sys::alloc).
    #[cfg(feature = "test-hooks")]
    use crate::sys::alloc::CountingAlloc as ModuleAlloc;
    #[cfg(not(feature = "test-hooks"))]
    use redis_module::alloc::RedisAlloc as ModuleAlloc;

    redis_module! {
        name: "lock",
        version: metadata::MODULE_VERSION,
        allocator: (ModuleAlloc, ModuleAlloc),
        data_types: [LOCK_TYPE],
        init: init,
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
                [
                    "deadlock-budget",
                    &crate::config::DEADLOCK_BUDGET,
                    crate::config::DEFAULT_DEADLOCK_BUDGET,
                    0,
                    crate::config::MAX_DEADLOCK_BUDGET,
                    ConfigurationFlags::DEFAULT,
                    None
                ],
                [
                    "max-waiters-per-user",
                    &crate::config::MAX_WAITERS_PER_USER,
                    crate::config::DEFAULT_MAX_WAITERS_PER_USER,
                    0,
                    crate::config::MAX_MAX_WAITERS,
                    ConfigurationFlags::DEFAULT,
                    None
                ],
            ],
            // The crate's macro wants every kind listed when any is.
            string: [],
            bool: [
                [
                    "refuse-when-evictable",
                    &crate::config::REFUSE_WHEN_EVICTABLE,
                    crate::config::DEFAULT_REFUSE_WHEN_EVICTABLE,
                    ConfigurationFlags::DEFAULT,
                    None
                ],
                [
                    "legacy-tokens",
                    &crate::config::LEGACY_TOKENS,
                    crate::config::DEFAULT_LEGACY_TOKENS,
                    ConfigurationFlags::DEFAULT,
                    None
                ],
            ],
            enum: [],
            module_args_as_configuration: true,
        ]
    }
}
