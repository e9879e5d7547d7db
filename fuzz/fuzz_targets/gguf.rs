//! The GGUF reader behind rvm.h's weights_open (runtime-shim/src/gguf.c, C) on arbitrary bytes;
//! the C side runs with AddressSanitizer and libFuzzer's coverage (fuzz/build.rs), and the
//! harness reads every tensor range the reader reports.
#![no_main]

use libfuzzer_sys::fuzz_target;

unsafe extern "C" {
    fn gguf_fuzz_one(data: *const u8, len: usize) -> i32;
}

fuzz_target!(|data: &[u8]| {
    // SAFETY: the harness reads at most `len` bytes of `data` and keeps nothing.
    unsafe { gguf_fuzz_one(data.as_ptr(), data.len()) };
});
