//! Test support: a global allocator that counts the allocations each
//! thread makes, so that a test can show a path allocates nothing
//! (`get_into`), and keeps the largest single allocation of the process,
//! so that a test can show a path never buffers a whole file (snapshots).
//! A test binary installs it with
//! `#[global_allocator] static ALLOC: CountingAllocator = CountingAllocator;`
//! (the `unsafe` of an allocator stays in this crate).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The largest allocation (or reallocation) of any thread since the last
/// `reset_largest_allocation`, in bytes.
static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting allocations and reallocations per thread.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAllocator;

impl CountingAllocator {
    /// Allocations (and reallocations) made by this thread so far.
    pub fn allocations_on_this_thread() -> u64 {
        ALLOCATIONS.try_with(Cell::get).unwrap_or(0)
    }

    /// The largest single allocation of the process since the last reset.
    pub fn largest_allocation() -> usize {
        LARGEST.load(Ordering::Relaxed)
    }

    pub fn reset_largest_allocation() {
        LARGEST.store(0, Ordering::Relaxed);
    }
}

fn count(bytes: usize) {
    // `try_with`: during thread teardown the count is simply not kept.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    LARGEST.fetch_max(bytes, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are the caller's; the counting
// touches a const-initialised thread-local `Cell` and a static atomic
// only, neither of which allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}
