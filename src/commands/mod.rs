//! The commands, one file each: parse every argument, look at the key, run the core, reply.
//! [`TABLE`] pairs each command's description (`metadata`) with its handler; registering from
//! it declares the command, its documentation, key spec and ACL categories in one go.

mod acquire;
mod common;
#[cfg(feature = "test-hooks")]
pub mod debug;
mod extend;
mod info;
mod queues;
mod release;
mod sync;

use redis_module::Context;

use crate::metadata;
use crate::sys::commands::{self, handler, CommandDoc, Handler};

/// Every command the module serves (the test-only hooks are in `debug`).
pub const TABLE: [(&CommandDoc, Handler); 8] = [
    (&metadata::ACQUIRE, handler::<acquire::Acquire>()),
    (&metadata::RWREAD, handler::<acquire::RwRead>()),
    (&metadata::SEMACQUIRE, handler::<acquire::SemAcquire>()),
    (&metadata::RELEASE, handler::<release::Release>()),
    (&metadata::EXTEND, handler::<extend::Extend>()),
    (&metadata::INFO, handler::<info::Info>()),
    (&metadata::SYNC, handler::<sync::Sync>()),
    (&metadata::QUEUES, handler::<queues::Queues>()),
];

/// Registers every command of [`TABLE`]; `module_category` is the module's own ACL category
/// where the server has one.
pub fn register_all(ctx: &Context, module_category: Option<&str>) -> Result<(), String> {
    for (doc, handler) in TABLE {
        commands::register(ctx, doc, handler, module_category)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_documents_its_key_first_and_arity_matches_its_arguments() {
        use crate::sys::commands::{ArgKind, KeyAccess};
        for (c, _) in TABLE {
            assert!(c.name.starts_with("lock."), "{}", c.name);
            // A command with a key has it first; a keyless one (per server) has none.
            let keys = c.args.iter().filter(|a| a.kind == ArgKind::Key).count();
            if c.access == KeyAccess::None {
                assert_eq!(keys, 0, "{}", c.name);
            } else {
                assert_eq!(keys, 1, "{}", c.name);
                assert_eq!(
                    c.args.first().map(|a| a.kind),
                    Some(ArgKind::Key),
                    "{}",
                    c.name
                );
            }
            let required = 1 + c.args.iter().filter(|a| !a.optional).count() as i32;
            if c.arity > 0 {
                assert_eq!(c.arity, required, "{}", c.name);
            } else {
                assert_eq!(-c.arity, required, "{}", c.name);
                assert!(c.args.iter().any(|a| a.optional), "{}", c.name);
            }
            assert!(!c.summary.is_empty() && !c.complexity.is_empty());
            // Blocking commands say so in both places.
            assert_eq!(
                c.flags.contains("blocking"),
                c.acl_categories.contains("blocking"),
                "{}",
                c.name
            );
        }
    }
}
