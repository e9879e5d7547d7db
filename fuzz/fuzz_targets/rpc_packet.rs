//! The RPC server's packet decoder and request handling (rpc-server/src, C) on arbitrary packet
//! streams; the C side runs with AddressSanitizer and libFuzzer's coverage (fuzz/build.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

unsafe extern "C" {
    fn rpc_fuzz_one(data: *const u8, len: usize) -> i32;
}

fuzz_target!(|data: &[u8]| {
    // SAFETY: the harness reads exactly `len` bytes of `data` and keeps nothing.
    unsafe { rpc_fuzz_one(data.as_ptr(), data.len()) };
});
