//! Fuzzes everything relaxc reads from an untrusted TVM export: the library blob, the
//! VMExecutable inside it, the verifier, and the text forms of whatever verifies.
//! Run: `fuzz/run.sh import_blob` (seed corpus: the fixtures' devc.o blobs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for exec in [relaxc::tvm::executable_from_blob("fuzz", data).ok(), relaxc::vm::format::read_executable(data).ok()]
        .into_iter()
        .flatten()
    {
        let _ = exec.as_text();
        let _ = exec.stats();
        let _ = relaxc::vm::asm::disassemble(&exec);
        if relaxc::vm::verify(&exec).is_ok() {
            let _ = relaxc::codegen::bind_packed_functions(&exec, &Default::default(), "fuzz");
            let _ = exec.as_python();
        }
    }
});
