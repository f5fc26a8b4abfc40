//! Active defragmentation of lock values: what `INFO lock` reports about it.
//!
//! The moving itself is `sys::defrag` (the handle that moves allocations) and the data type's
//! defrag callback in `sys::datatype`, which moves each lock value's own 64-byte box when the
//! server's allocator suggests it. A compact value (one holder, an owner of up to 32 bytes:
//! most locks) is that one box, so it is moved whole. A value in the full form (several
//! holders, waiters, a timer) also owns inner boxes, which stay where they are unless the
//! value's layout (`value`) moves them through `TypeHandler::defrag`.

/// Lock-value allocations moved by active defragmentation since the module loaded
/// (`INFO lock` field `defrag_moves_total`).
pub fn moves_total() -> u64 {
    crate::sys::defrag::moved_total()
}
