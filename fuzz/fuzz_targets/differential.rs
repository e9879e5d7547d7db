//! Structure-aware differential fuzzing: the input picks a random valid program (the generator of
//! tests/differential.rs), its arguments and, now and then, an argument of the wrong shape or a
//! negative count. The program is compiled and linked in bytecode and in compiled mode and run in
//! both; results, or error messages, must be identical, and every byte of storage must be back
//! once the result is released. Slow per input (two builds), so it runs ~10-20 inputs a second.
//! Run: `fuzz/run.sh differential`.
#![no_main]

#[path = "../../tests/common/random.rs"]
#[allow(dead_code)]
mod random;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use relaxc::abi::DLDataType;
use relaxc::codegen::ExecMode;
use relaxc::host::{HostTensor, Input, Model};
use relaxc::kernel_object::KernelObject;

fn kernels() -> &'static KernelObject {
    static KERNELS: OnceLock<KernelObject> = OnceLock::new();
    KERNELS.get_or_init(|| {
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/kernels/random_kernels.c");
        relaxc::kernels::compile_c_host(&source).expect("the test kernels build")
    })
}

fn scratch() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
}

fn word(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, slot) in b.iter_mut().enumerate() {
        *slot = data.get(at + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    let batch = random::generate(word(data, 0), 1);
    let exec = relaxc::vm::Verified::new(batch.exec).expect("the generator makes valid programs");
    let program =
        relaxc::compile::Program { exec, kernels: vec![kernels().clone()], shape_funcs: Vec::new(), cuda: Vec::new() };
    // Arguments: x is float32[4] (or, 1 time in 8, a tensor of another length), k a small int
    // (now and then negative or large).
    let control = word(data, 8);
    let len = if control % 8 == 0 { (control >> 3) % 7 } else { 4 };
    let x: Vec<u8> = (0..len as usize)
        .flat_map(|i| {
            let bits = word(data, 16 + 4 * i) as u32;
            // Keep values finite and small so both modes see the same rounding paths.
            ((bits % 2001) as f32 / 100.0 - 10.0).to_le_bytes()
        })
        .collect();
    let k = match (control >> 6) % 16 {
        0 => -((control >> 10) as i64 % 5) - 1,
        1 => (control >> 10) as i64 % 1000,
        n => n as i64 % 5,
    };
    let inputs = [
        Input::Tensor(HostTensor::new(DLDataType { code: 2, bits: 32, lanes: 1 }, vec![len as i64], &x)),
        Input::Int(k),
    ];
    let mut seen = Vec::new();
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let object = relaxc::compile::emit(&program, &relaxc::compile::Options::mode(mode)).expect("codegen");
        let so = scratch().path().join(format!("{mode:?}.so"));
        relaxc::link::link_shared(&object.link_inputs(&program.kernels), &so).expect("link");
        let model = Model::load(&so).expect("load");
        let mut vm = model.vm().expect("vm");
        let f = model.find(&batch.mains[0]).expect("main");
        let outcome = vm.call(f, &inputs).map(|v| v.to_output().flatten()).map_err(|e| e.to_string());
        assert_eq!(vm.stats().live_storage_bytes, 0, "{mode:?}: storage still held after the result was released");
        seen.push(outcome);
    }
    assert_eq!(seen[0], seen[1], "bytecode and compiled mode disagree");
});
