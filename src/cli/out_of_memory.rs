//! Running out of memory ends relaxc like any other error: a message and exit status 1. Rust
//! answers a failed allocation with abort(), a core dump; the global allocator here notes the
//! failure first, and the SIGABRT handler turns the abort that follows into the message.

/// The system allocator, noting when it runs out of memory. Rust's answer to a failed
/// allocation is abort(), a core dump; with the note, the abort becomes what any other error
/// gives: a message and exit status 1 (`out_of_memory_exit`).
struct NotingAllocator;

static ALLOCATION_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

// SAFETY: every method forwards to the system allocator unchanged.
unsafe impl std::alloc::GlobalAlloc for NotingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as the caller promised for this layout.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if p.is_null() {
            ALLOCATION_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if p.is_null() {
            ALLOCATION_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            ALLOCATION_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: NotingAllocator = NotingAllocator;

/// SIGABRT after a failed allocation: say so and exit 1. Any other abort keeps its default.
pub extern "C" fn out_of_memory_exit(signal: libc::c_int) {
    if ALLOCATION_FAILED.load(std::sync::atomic::Ordering::Relaxed) {
        let message = b"error: out of memory (an allocation failed; raise the memory limit or use a smaller model)\n";
        // SAFETY: write and _exit are async-signal-safe.
        unsafe {
            libc::write(2, message.as_ptr().cast(), message.len());
            libc::_exit(1);
        }
    }
    // SAFETY: back to the default action, then the same signal again.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}
