//! Active defragmentation of the module's values: the handle a data type's defrag callback
//! lends its handler, which moves the handler's own allocations to less fragmented memory.
//!
//! How it works (Redis 7.0 `defrag.c`/`module.c`, Valkey 8.0 the same): with `activedefrag
//! yes` and enough fragmentation, the server's cron walks the keyspace and, for a key of a
//! module type, moves its own wrapper and then calls the type's `defrag` callback with the
//! slot that holds the value pointer. `RedisModule_DefragAlloc(ptr)` asks the allocator
//! (jemalloc's defrag hint) whether `ptr` sits in a sparsely used page; if so it allocates the
//! same size elsewhere (bypassing the thread cache), copies the bytes, frees the old block and
//! returns the new address, else NULL.
//!
//! Why that is sound for Rust memory here: the module's global allocator forwards every Rust
//! allocation to `RedisModule_Alloc`/`RedisModule_Free` (`redis_module::alloc::RedisAlloc` in
//! release builds, `sys::alloc::CountingAlloc` wrapping it in test builds; the `allocator:`
//! line of `redis_module!` in lib.rs), so a `Box` or `Vec` buffer is a block of the server's
//! jemalloc, which is what `DefragAlloc` takes. The new block has the old one's usable size
//! (at least the Rust layout's size) and the same size class, hence the same alignment; it is
//! later freed through the same global allocator. A Rust value may be moved by copying its
//! bytes, unless something holds its address: a `&mut Box<T>` (or `&mut Vec<T>`, `&mut
//! Box<[T]>`) proves no reference into the allocation is alive, and the module keeps no raw
//! pointer into its values past the command or callback that read it (`moving` compares
//! addresses only within one command). The server runs a defrag pass from its cron, or while a
//! long script or a load keeps it busy (between the script's own commands); never while one of
//! the module's commands or callbacks runs (the module neither yields nor calls into the
//! server's command table), and never in another thread. A server without the
//! defrag hint (a system jemalloc, libc malloc) refuses `activedefrag yes`, so none of this
//! runs there.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::raw;

/// Allocations moved by active defragmentation since the module loaded.
static MOVED: AtomicU64 = AtomicU64::new(0);

/// How many of the module's allocations active defragmentation has moved (values and what
/// they own) since the module loaded.
pub fn moved_total() -> u64 {
    MOVED.load(Ordering::Relaxed)
}

/// Moves allocations during one defrag callback.
pub struct Mover<'a> {
    ctx: *mut raw::RedisModuleDefragCtx,
    _callback: PhantomData<&'a mut ()>,
}

impl Mover<'_> {
    /// # Safety
    /// `ctx` must be the live context of the current defrag callback, and the handle must not
    /// outlive the callback.
    pub(super) unsafe fn new(ctx: *mut raw::RedisModuleDefragCtx) -> Self {
        Mover {
            ctx,
            _callback: PhantomData,
        }
    }

    /// Moves the block at `ptr` if the allocator suggests it; the new address, or `None` when
    /// it stays where it is.
    ///
    /// # Safety
    /// `ptr` must be a live block from the global allocator (so from `RedisModule_Alloc`, see
    /// the module comment) that nothing reads or writes during the call; when `Some` is
    /// returned the old block is freed and every owner of `ptr` must take the new address.
    pub(super) unsafe fn move_block(&mut self, ptr: NonNull<u8>) -> Option<NonNull<u8>> {
        // SAFETY: ctx is live (constructor's contract); ptr is a Redis-allocated block (this
        // function's contract), which is what DefragAlloc takes.
        let new = unsafe { raw::RedisModule_DefragAlloc.map(|f| f(self.ctx, ptr.as_ptr().cast())) }
            .and_then(|p| NonNull::new(p.cast::<u8>()))?;
        MOVED.fetch_add(1, Ordering::Relaxed);
        Some(new)
    }

    /// Moves the allocation behind `b`, if the allocator suggests it. True when it moved.
    pub fn boxed<T>(&mut self, b: &mut Box<T>) -> bool {
        if std::mem::size_of::<T>() == 0 {
            return false; // a zero-sized box owns no allocation
        }
        let old = NonNull::from(&mut **b).cast::<u8>();
        // SAFETY: a Box of a sized, non-zero-sized T owns a block from the global allocator,
        // i.e. from RedisModule_Alloc; `&mut` means nothing else touches it now.
        let Some(new) = (unsafe { self.move_block(old) }) else {
            return false;
        };
        // SAFETY: `new` holds a bitwise copy of the T (same size class, same alignment), the
        // old block is already freed: the box must forget it without dropping or freeing it,
        // hence `ptr::write` over the old Box value instead of an assignment.
        unsafe { std::ptr::write(b, Box::from_raw(new.as_ptr().cast::<T>())) };
        true
    }
}
