//! A host allocator for VMs (rvm.h's `rvm_allocator`) that counts what it gives out and can be
//! told to refuse a request: the soak of `relaxc generate --soak` checks its count after every
//! removed sequence, and the out-of-memory tests make it fail each allocation in turn.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI64, Ordering::SeqCst};

use crate::abi::Allocator;

#[derive(Default)]
struct Counts {
    live: AtomicI64,
    calls: AtomicI64,
    /// The request to refuse (1-based, over all requests so far), or 0.
    fail_at: AtomicI64,
    refused: AtomicI64,
}

unsafe extern "C" fn counting_alloc(ctx: *mut c_void, size: usize, alignment: usize) -> *mut c_void {
    // SAFETY: ctx is the Counts this heap handed out with the function.
    let c = unsafe { &*(ctx as *const Counts) };
    let n = c.calls.fetch_add(1, SeqCst) + 1;
    if n == c.fail_at.load(SeqCst) {
        c.refused.fetch_add(1, SeqCst);
        return std::ptr::null_mut();
    }
    let Some(rounded) = size.max(1).checked_next_multiple_of(alignment) else { return std::ptr::null_mut() };
    // SAFETY: alignment is a power of two (rvm.h) and rounded a multiple of it.
    let p = unsafe { libc::aligned_alloc(alignment, rounded) };
    if !p.is_null() {
        c.live.fetch_add(1, SeqCst);
    }
    p
}

unsafe extern "C" fn counting_free(ctx: *mut c_void, ptr: *mut c_void) {
    // SAFETY: as above; ptr came from counting_alloc.
    let c = unsafe { &*(ctx as *const Counts) };
    c.live.fetch_sub(1, SeqCst);
    unsafe { libc::free(ptr) }
}

/// The allocator and its counters, boxed so that the pointers handed to the runtime stay put.
/// Every VM made with it, and every value those VMs returned, must be gone before it is dropped.
pub struct CountingHeap {
    counts: Box<Counts>,
    allocator: Box<Allocator>,
}

impl Default for CountingHeap {
    fn default() -> CountingHeap {
        CountingHeap::new()
    }
}

impl CountingHeap {
    pub fn new() -> CountingHeap {
        let counts = Box::<Counts>::default();
        let allocator = Box::new(Allocator {
            alloc: Some(counting_alloc),
            free: Some(counting_free),
            ctx: &*counts as *const Counts as *mut c_void,
        });
        CountingHeap { counts, allocator }
    }

    /// What `vm_create_with_allocator` takes.
    pub fn allocator(&self) -> *const Allocator {
        &*self.allocator
    }

    /// Blocks given out and not yet returned.
    pub fn live(&self) -> i64 {
        self.counts.live.load(SeqCst)
    }

    /// Requests so far.
    pub fn calls(&self) -> i64 {
        self.counts.calls.load(SeqCst)
    }

    /// Refuses the nth request from now on (0: none), and forgets earlier refusals.
    pub fn fail_in(&self, n: i64) {
        self.counts.refused.store(0, SeqCst);
        self.counts.fail_at.store(if n == 0 { 0 } else { self.calls() + n }, SeqCst);
    }

    /// Whether a request was refused since the last `fail_in`.
    pub fn refused(&self) -> bool {
        self.counts.refused.load(SeqCst) > 0
    }
}
