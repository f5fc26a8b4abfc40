//! The module's global allocator in test builds: Redis's own, counting what the module holds.

#![cfg(feature = "test-hooks")]

use std::sync::atomic::{AtomicI64, Ordering};

/// Redis's allocator (so `used_memory`, `maxmemory` and MEMORY USAGE see the module's memory),
/// counting the blocks and bytes the module holds. The leak test reads the counts through
/// LOCK.DEBUG-ALLOC: unlike `used_memory`, they move only with the module's own allocations,
/// not with the server's client pools and crons. Counting is two relaxed atomic adds per call
/// and is compiled only into `test-hooks` builds; release builds use Redis's allocator as is.
pub struct CountingAlloc;

static LIVE_BLOCKS: AtomicI64 = AtomicI64::new(0);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

/// Blocks and bytes the module has allocated and not freed.
pub fn live_allocations() -> (i64, i64) {
    (
        LIVE_BLOCKS.load(Ordering::Relaxed),
        LIVE_BYTES.load(Ordering::Relaxed),
    )
}

fn count_allocation(layout: std::alloc::Layout, sign: i64) {
    let bytes = i64::try_from(layout.size()).unwrap_or(i64::MAX);
    LIVE_BLOCKS.fetch_add(sign, Ordering::Relaxed);
    LIVE_BYTES.fetch_add(sign.saturating_mul(bytes), Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to RedisAlloc, a valid GlobalAlloc; the counters
// are side effects that allocate nothing. `realloc` keeps the default (alloc, copy, dealloc
// through these two methods), so it is counted too.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `layout` is passed on as is.
        let p = unsafe { redis_module::alloc::RedisAlloc.alloc(layout) };
        if !p.is_null() {
            count_allocation(layout, 1);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count_allocation(layout, -1);
        // SAFETY: ptr came from `alloc` above with this layout (the caller's contract).
        unsafe { redis_module::alloc::RedisAlloc.dealloc(ptr, layout) }
    }
}
