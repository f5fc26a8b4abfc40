//! The system layer: every `unsafe` block and every raw call into the Redis module API that the
//! safe `redis-module` crate does not wrap, and every `extern "C"` callback Redis calls into the
//! module. Nothing here imports from the rest of the crate; the layers above reach it through:
//!
//! - plain functions over the current context (`context`): clock, databases, client ids,
//!   replication, notifications, logging;
//! - handles that cannot be misused: [`key::RawKey`] gives typed access to the values of one
//!   [`datatype::ValueType`] only, [`blocked::BlockedClient`] is owned (not `Copy`) and is
//!   consumed by the one `unblock` it allows;
//! - generic trampolines: each callback kind (blocked clients, data-type methods, server and
//!   keyspace events, INFO, commands) is an `extern "C"` function generic over a handler trait
//!   defined here and implemented above, so a callback hands a typed event upward without
//!   this layer naming its receiver;
//! - [`guard`]: the panic guard every trampoline runs its handler in.
//!
//! Every `unsafe` block carries a `// SAFETY:` comment. [`api::check`] makes sure at load that
//! every API function used here exists, so the `map_or` defaults below never apply at run time.

pub mod acl;
pub mod alloc;
pub mod api;
pub mod blocked;
pub mod cluster;
pub mod commands;
pub mod context;
pub mod datatype;
pub mod defrag;
pub mod events;
pub mod filter;
pub mod guard;
pub mod info;
pub mod key;
pub mod scan;
