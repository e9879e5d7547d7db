//! Fuzzes the text-form assembler on arbitrary text: it must return an error or an executable
//! that the verifier judges (accepts or rejects) without panicking, and whatever verifies must
//! write out and read back as the same executable.
//! Run: `fuzz/run.sh assemble` (seed corpus: `relaxc inspect --asm` of the fixtures).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(exec) = relaxc::vm::asm::assemble(text) else { return };
    if relaxc::vm::verify(&exec).is_ok() {
        let bytes = relaxc::vm::format::write_executable(&exec);
        let back = relaxc::vm::format::read_executable(&bytes).expect("a verified executable reads back");
        assert_eq!(relaxc::vm::format::write_executable(&back), bytes);
    }
});
