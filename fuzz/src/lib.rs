//! The module's pure parts, compiled here from the module's own sources (the module crate is a
//! cdylib, which a fuzz target cannot link): the lock core with its reference model, and the
//! argument parser.

#[path = "../../src/lock/mod.rs"]
pub mod lock;

#[path = "../../src/commands/parse.rs"]
pub mod parse;
