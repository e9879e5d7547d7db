//! Models built for the boards (aarch64, riscv64) from this x86 machine, run under qemu user
//! mode: TVM's exports built by TVM for each CPU (fixtures/tvm-cross) and the script fixtures, in
//! bytecode and compiled mode, against the x86 results; random programs on aarch64 against the
//! native run; and what a cross `.so` is (machine, exports, dependencies). Where a toolchain or
//! qemu is missing the tests say so and skip; CI installs them (.ci/run) and requires them.

mod common;

use std::path::{Path, PathBuf};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use relaxc::codegen::ExecMode;
use relaxc::host::{Output, npz};
use relaxc::target::Target;

const TARGETS: [(&str, &str); 2] =
    [("aarch64", "aarch64-unknown-linux-gnu"), ("riscv64", "riscv64gc-unknown-linux-gnu")];

fn build(name: &str, input: &Path, target: &Target, mode: ExecMode, script: bool) -> Result<PathBuf, String> {
    let mut options = relaxc::compile::Options::mode(mode);
    options.target = target.clone();
    if script {
        options.script.kernels = vec![common::root().join("fixtures/script/kernels.c")];
        let weights = input.parent().map(|d| d.join("w.safetensors")).filter(|w| w.exists());
        options.script.params = weights;
    }
    common::build_with(name, input, &options, &format!("{}.{}", target.cpu(), common::mode_name(mode)))
}

/// The difference between two float32 tensors relative to the reference's magnitude,
/// max |got - want| / max |want| (elementwise relative error means nothing where a dot product
/// cancels to nearly zero), or None if they are not both float32 tensors of one shape.
fn max_relative(got: &Output, want: &(String, Vec<u64>, Vec<u8>)) -> Option<f64> {
    let Output::Tensor { dtype, data, .. } = got else { return None };
    if dtype.code != 2 || dtype.bits != 32 || want.0 != "<f4" || data.len() != want.2.len() {
        return None;
    }
    let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
    let scale = want.2.chunks_exact(4).map(|b| f(b).abs()).fold(0.0, f64::max).max(f64::MIN_POSITIVE);
    let worst = data.chunks_exact(4).zip(want.2.chunks_exact(4)).map(|(a, b)| (f(a) - f(b)).abs());
    Some(worst.fold(0.0, f64::max) / scale)
}

/// TVM's export for a board against TVM's x86 outputs: bit for bit, or, where TVM's kernels for
/// that CPU contract multiply-adds, within 1e-5 relative (said in the trial's output).
fn tvm_export(cpu: &str, target: &Target, name: &str, mode: ExecMode) -> Result<(), Failed> {
    let tar = common::root().join("fixtures/tvm-cross").join(cpu).join(name).join("m.tar");
    let so = build(&format!("cross_{name}"), &tar, target, mode, false)?;
    let fixture = common::fixtures_dir().join(name);
    for path in common::entries(&fixture) {
        let Some(case) = path.file_name().and_then(|n| n.to_str()?.strip_suffix(".in.npz")) else { continue };
        let inputs = npz::read_inputs(&fixture.join(format!("{case}.in.npz")))?;
        let result = relaxc::host::foreign::run(&so, target, "main", &inputs, 0, false);
        if let Some(fail) = case.strip_prefix("fail_") {
            let err = result.err().ok_or(format!("{case}: the call succeeded; TVM rejected it"))?;
            common::check_error(&err, &fixture.join(format!("fail_{fail}.err")))?;
            continue;
        }
        let outputs: Vec<Output> = result?.outputs;
        let expected = fixture.join(format!("{case}.out.npz"));
        if common::compare_outputs(&outputs, &expected).is_ok() {
            continue;
        }
        let want = npz::read_arrays(&expected)?;
        for (i, out) in outputs.iter().enumerate() {
            let w = want.get(&format!("out{i}")).ok_or(format!("{case}: no out{i}"))?;
            let exact = npz::output_array(out).map(|a| a == *w).unwrap_or(false);
            if exact {
                continue;
            }
            let rel = max_relative(out, w).ok_or(format!("{case} out{i}: differs from x86 and is not float32"))?;
            if rel > 1e-5 {
                return Err(format!("{case} out{i}: {rel:e} relative from x86, more than 1e-5").into());
            }
            eprintln!(
                "{name}::{case} ({cpu}, {}): out{i} within {rel:.1e} relative of x86 (multiply-adds contracted, or sums in another order)",
                common::mode_name(mode)
            );
        }
    }
    Ok(())
}

/// A script fixture built for a board: the same C kernels, so TVM's x86 bits exactly.
fn script(target: &Target, fixture: &common::Fixture, mode: ExecMode) -> Result<(), Failed> {
    let (dir, name) = (&fixture.dir, &fixture.name);
    let so = build(&format!("cross_script_{name}"), &fixture.source(), target, mode, true)?;
    for case in &fixture.ok_cases {
        let inputs = npz::read_inputs(&dir.join(format!("ok_{case}.in.npz")))?;
        let outputs = relaxc::host::foreign::run(&so, target, "main", &inputs, 0, false)?.outputs;
        fixture.check_outputs(&outputs, case).map_err(|e| format!("{case}: {e}"))?;
    }
    for case in &fixture.fail_cases {
        let inputs = npz::read_inputs(&dir.join(format!("fail_{case}.in.npz")))?;
        let result = relaxc::host::foreign::run(&so, target, "main", &inputs, 0, false);
        let err = result.err().ok_or(format!("fail_{case}: the call succeeded; TVM rejected it"))?;
        common::check_error(&err, &dir.join(format!("fail_{case}.err")))?;
    }
    Ok(())
}

/// Random programs built for aarch64 give the native run's results (and errors), in both modes.
fn random_programs(target: &Target, count: usize) -> Result<(), Failed> {
    let batch = common::random::generate(11, count);
    let kernels_src = common::root().join("tests/kernels/random_kernels.c");
    let native_kernels = relaxc::kernels::compile_c_host(&kernels_src).map_err(|e| e.to_string())?;
    let tc = relaxc::target::toolchain(target).map_err(|e| e.to_string())?;
    let cross_kernels = relaxc::kernels::compile_c(&kernels_src, &tc).map_err(|e| e.to_string())?;
    let x: Vec<u8> = [0.5f32, -1.25, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let dtype = relaxc::abi::DLDataType { code: 2, bits: 32, lanes: 1 };
    let inputs =
        [relaxc::host::Input::Tensor(relaxc::host::HostTensor::new(dtype, vec![4], &x)), relaxc::host::Input::Int(2)];
    // Native reference (bytecode).
    let native = relaxc::compile::Program {
        exec: relaxc::vm::Verified::new(batch.exec.clone()).map_err(|e| e.to_string())?,
        kernels: vec![native_kernels],
        shape_funcs: Vec::new(),
        cuda: Vec::new(),
    };
    let object = relaxc::compile::emit(&native, &relaxc::compile::Options::mode(ExecMode::Bytecode))
        .map_err(|e| e.to_string())?;
    let so = common::scratch_dir().join(format!("random_native.{}.so", std::process::id()));
    relaxc::link::link_shared(&object.link_inputs(&native.kernels), &so).map_err(|e| e.to_string())?;
    let model = relaxc::host::Model::load(&so)?;
    let mut want = Vec::new();
    for name in &batch.mains {
        let mut vm = model.vm()?;
        let r = vm.call(model.find(name)?, &inputs).map(|v| v.to_output().flatten()).map_err(|e| match e {
            relaxc::host::HostError::Call { kind, message } => format!("{kind}: {message}"),
            other => other.to_string(),
        });
        want.push((name.clone(), r));
    }
    let program = relaxc::compile::Program {
        exec: relaxc::vm::Verified::new(batch.exec).map_err(|e| e.to_string())?,
        kernels: vec![cross_kernels],
        shape_funcs: Vec::new(),
        cuda: Vec::new(),
    };
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let mut options = relaxc::compile::Options::mode(mode);
        options.target = target.clone();
        let object = relaxc::compile::emit(&program, &options).map_err(|e| e.to_string())?;
        let so = common::scratch_dir().join(format!(
            "random_{}.{}.{}.so",
            target.cpu(),
            common::mode_name(mode),
            std::process::id()
        ));
        relaxc::link::link_shared_for(&object.link_inputs(&program.kernels), &so, target).map_err(|e| e.to_string())?;
        let got = relaxc::host::foreign::run_all(&so, target, &inputs)?;
        let got: Vec<_> = got.into_iter().filter(|(n, _)| batch.mains.contains(n)).collect();
        if got.len() != want.len() {
            return Err(format!("{} functions ran under qemu, {} natively", got.len(), want.len()).into());
        }
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            if g != w {
                return Err(format!("{name} ({}): qemu gave {g:?}, native {w:?}", common::mode_name(mode)).into());
            }
        }
    }
    Ok(())
}

/// A cross `.so` is an ELF for the target that exports what a native one does and needs only
/// libc (and libm).
fn artifact(target: &Target) -> Result<(), Failed> {
    use object::{Object, ObjectSymbol};
    let tar = common::root().join("fixtures/tvm-cross").join(target.cpu()).join("mlp_static/m.tar");
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let so = build("cross_mlp_static", &tar, target, mode, false)?;
        let bytes = std::fs::read(&so)?;
        assert_eq!(relaxc::target::elf_machine_of(&bytes), Some(target.elf_machine()), "ELF machine");
        let file = object::File::parse(&*bytes)?;
        let mut exports: Vec<String> = file
            .dynamic_symbols()
            .filter(|s| s.is_definition() && s.is_global())
            .filter_map(|s| s.name().ok().map(String::from))
            .collect();
        exports.sort();
        let mut want =
            vec!["__tvm_ffi_main", relaxc::abi::FFI_CALL_SYMBOL, relaxc::abi::FFI_WEIGHTS_SYMBOL, "rvm_get_api"];
        want.sort();
        if exports != want {
            return Err(format!("{}: exports {exports:?}", common::mode_name(mode)).into());
        }
        for lib in common::needed_libraries(&so)? {
            let allowed = lib.starts_with("libc.so") || lib.starts_with("libm.so") || lib.starts_with("ld-linux");
            if !allowed {
                return Err(format!("needs {lib}").into());
            }
        }
        let head = std::process::Command::new("readelf").arg("-h").arg(&so).output()?;
        let head = String::from_utf8_lossy(&head.stdout);
        let machine = if target.cpu() == "aarch64" { "AArch64" } else { "RISC-V" };
        if !head.contains(machine) {
            return Err(format!("readelf -h does not show {machine}:\n{head}").into());
        }
    }
    Ok(())
}

/// `relaxc compile --target`, then `relaxc run` (which goes through qemu with the same options)
/// and `relaxc inspect` (which names the target), as a user types them.
fn cli(target: &Target) -> Result<(), Failed> {
    let relaxc = env!("CARGO_BIN_EXE_relaxc");
    let dir = tempfile::tempdir()?;
    let so = dir.path().join("mlp.so");
    let fixture = common::fixtures_dir().join("mlp_static");
    let tar = common::root().join("fixtures/tvm-cross").join(target.cpu()).join("mlp_static/m.tar");
    let st = std::process::Command::new(relaxc)
        .arg("compile")
        .arg(&tar)
        .args(["--exec-mode", "compiled", "--target"])
        .arg(target.to_string())
        .arg("-o")
        .arg(&so)
        .status()?;
    if !st.success() {
        return Err("relaxc compile --target failed".into());
    }
    let out = std::process::Command::new(relaxc)
        .arg("run")
        .arg(&so)
        .arg("--inputs")
        .arg(fixture.join("ok_basic.in.npz"))
        .args(["--stats", "--bench", "10", "--outputs"])
        .arg(dir.path().join("out.npz"))
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !text.contains("storage: peak") || !text.contains("median") {
        return Err(format!("relaxc run under qemu: {text}{}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let got = npz::read_arrays(&dir.path().join("out.npz"))?;
    if !got.contains_key("out0") {
        return Err("no out0 written".into());
    }
    let out = std::process::Command::new(relaxc).arg("inspect").arg(&so).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains(&format!("target {target}")) {
        return Err(format!("inspect does not name the target:\n{text}").into());
    }
    // A TVM export for x86 is refused for this target, naming both.
    let out = std::process::Command::new(relaxc)
        .arg("compile")
        .arg(fixture.join("m.tar"))
        .arg("--target")
        .arg(target.to_string())
        .arg("-o")
        .arg(dir.path().join("wrong.so"))
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !err.contains("holds code for x86_64") || !err.contains(&target.to_string()) {
        return Err(format!("an x86 export for {target}: {err}").into());
    }
    Ok(())
}

/// The quantized models on aarch64: NEON's tiles (quant_neon.c) and the int8 matmul's SDOT path
/// (matmul_int8.c, in lib_int8) give the portable code's bits (`RELAXC_QUANT_ISA=portable`), each
/// run by `relaxc run` under qemu (its default CPU has the dot products).
fn neon_matches_portable(target: &Target) -> Result<(), Failed> {
    let names: Vec<String> =
        common::cross_exports("aarch64").into_iter().filter(|n| n.starts_with("quant_") || n == "lib_int8").collect();
    if !names.iter().any(|n| n == "lib_int8") {
        return Err("no int8 fixture (fixtures/tvm-cross/aarch64/lib_int8)".into());
    }
    if names.is_empty() {
        return Err("no quantized fixtures (fixtures/tvm-cross/aarch64/quant_*)".into());
    }
    let scratch = tempfile::tempdir()?;
    for name in names {
        let tar = common::root().join("fixtures/tvm-cross/aarch64").join(&name).join("m.tar");
        let so = build(&format!("cross_{name}"), &tar, target, ExecMode::Compiled, false)?;
        let case = if name == "lib_int8" { "ok_b6.in.npz" } else { "ok_b3.in.npz" };
        let inputs = common::fixtures_dir().join(&name).join(case);
        let mut outputs = Vec::new();
        for isa in ["", "portable"] {
            let out = scratch.path().join(format!("{name}.{isa}.npz"));
            let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_relaxc"));
            run.arg("run").arg(&so).arg("--inputs").arg(&inputs).arg("--outputs").arg(&out);
            if !isa.is_empty() {
                run.env("RELAXC_QUANT_ISA", isa);
            }
            let done = run.output()?;
            if !done.status.success() {
                return Err(format!("{name}: {}", String::from_utf8_lossy(&done.stderr)).into());
            }
            outputs.push(npz::read_arrays(&out)?);
        }
        if outputs[0] != outputs[1] {
            return Err(format!("{name}: NEON and the portable code give other bits").into());
        }
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for (cpu, triple) in TARGETS {
        let target = Target::parse(triple).expect("supported target");
        if let Some(why) = common::board_unavailable(&target) {
            assert!(std::env::var_os("CI").is_none(), "CI needs the {cpu} toolchain and qemu: {why}");
            let reason = format!("{cpu} cross tests skipped: {why}");
            trials.push(Trial::ignorable_test(format!("{cpu}::skipped"), move || Ok(Completion::ignored_with(reason))));
            continue;
        }
        for name in common::cross_exports(cpu) {
            for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
                let (t, n) = (target.clone(), name.clone());
                trials.push(Trial::test(format!("{cpu}::tvm::{name}::{}", common::mode_name(mode)), move || {
                    tvm_export(cpu, &t, &n, mode)
                }));
            }
        }
        for fixture in common::script_fixtures().into_iter().map(std::sync::Arc::new) {
            for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
                let (t, f) = (target.clone(), fixture.clone());
                trials.push(Trial::test(
                    format!("{cpu}::script::{}::{}", fixture.name, common::mode_name(mode)),
                    move || script(&t, &f, mode),
                ));
            }
        }
        let t = target.clone();
        trials.push(Trial::test(format!("{cpu}::artifact"), move || artifact(&t)));
        let t = target.clone();
        trials.push(Trial::test(format!("{cpu}::cli"), move || cli(&t)));
        if cpu == "aarch64" {
            let count = std::env::var("RELAXC_CROSS_RANDOM_COUNT").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
            let t = target.clone();
            trials.push(Trial::test(format!("{cpu}::random::{count}_programs"), move || random_programs(&t, count)));
            let t = target.clone();
            trials.push(Trial::test(format!("{cpu}::quantized::neon_matches_portable"), move || {
                neon_matches_portable(&t)
            }));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
