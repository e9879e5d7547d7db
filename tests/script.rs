//! The stand-alone front end beyond the differential harness: storage planning, error messages
//! (golden files; `RELAXC_BLESS=1` rewrites them), the older keyword spellings, and a bounded
//! property test: mutated programs must get an error or compile, never a panic.

mod common;

use common::random::Rng;

use std::path::PathBuf;

use relaxc::codegen::ExecMode;
use relaxc::compile::{Options, ScriptInputs, load_script};

fn kernels() -> ScriptInputs {
    ScriptInputs { kernels: vec![common::root().join("fixtures/script/kernels.c")], ..Default::default() }
}

#[test]
fn storage_planning_reuses_storage_across_a_chain() {
    let dir = common::root().join("fixtures/script/chain");
    let program = load_script(&dir.join("m.py"), &kernels()).expect("chain compiles");
    let listing = program.exec.as_text();
    let tensors = listing.matches("vm.builtin.alloc_tensor in:").count();
    let storages = listing.matches("vm.builtin.alloc_storage in:").count();
    assert_eq!(tensors, 20, "{listing}");
    // Two storages serve the 19 temporaries; the returned tensor escapes and gets its own.
    assert!(storages <= 3, "{storages} storages for {tensors} tensors:\n{listing}");
    let mut options = Options::mode(ExecMode::Bytecode);
    options.script = kernels();
    let so = common::build_with("script_chain_stats", &dir.join("m.py"), &options, "bytecode").expect("build");
    let model = relaxc::host::Model::load(&so).expect("load");
    let inputs = relaxc::host::npz::read_inputs(&dir.join("ok_basic.in.npz")).expect("inputs");
    let mut vm = model.vm().expect("vm");
    drop(vm.call(model.find("main").expect("main"), &inputs).expect("call"));
    let peak = vm.stats().peak_storage_bytes;
    let all_temporaries = 20 * 64 * 4;
    eprintln!("chain: peak storage {peak} bytes; all 20 temporaries: {all_temporaries} bytes");
    assert!(peak < all_temporaries as u64 / 4, "peak {peak} is not far below {all_temporaries}");
}

fn error_files() -> Vec<PathBuf> {
    common::files_with_extension(&common::root().join("fixtures/script-errors"), "py")
}

#[test]
fn errors_point_at_their_source_span() {
    let files = error_files();
    assert!(files.len() >= 8);
    let mut failures = Vec::new();
    for py in files {
        let message = match load_script(&py, &kernels()) {
            Ok(_) => panic!("{} compiled, but it is wrong on purpose", py.display()),
            Err(e) => e.to_string().replace(&format!("{}/", common::root().display()), ""),
        };
        if let Err(diff) = common::check_golden(&py.with_extension("err"), &message) {
            failures.push(diff);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn older_keyword_spellings_mean_the_same() {
    let new = std::fs::read_to_string(common::root().join("fixtures/script/packed/m.py")).expect("fixture");
    let old = new.replace("out_ty=", "out_sinfo=").replace("ty_args=", "sinfo_args=");
    assert_ne!(new, old);
    let dir = tempfile::tempdir().expect("tmp");
    let (a, b) = (dir.path().join("new.py"), dir.path().join("old.py"));
    std::fs::write(&a, new).expect("write");
    std::fs::write(&b, old).expect("write");
    let (pa, pb) = (load_script(&a, &kernels()).expect("new"), load_script(&b, &kernels()).expect("old"));
    assert_eq!(pa.exec, pb.exec);
}

fn front_end(src: &str) -> Result<(), String> {
    let stmts = relaxc::script::parser::parse(src).map_err(|e| e.message)?;
    let module = relaxc::script::convert::convert(&stmts, &Default::default()).map_err(|e| e.message)?;
    let lowered = relaxc::lower::lower(&module).map_err(|e| e.message)?;
    // Whatever lowering accepts must be a valid executable: anything else is a lowering bug.
    if let Err(e) = relaxc::vm::verify(&lowered.exec) {
        panic!("lowering produced an invalid executable ({e}) from:\n{src}");
    }
    Ok(())
}

#[test]
fn mutated_programs_never_panic() {
    let sources: Vec<String> =
        common::script_fixtures().iter().map(|f| std::fs::read_to_string(f.source()).expect("read")).collect();
    let snippets =
        ["(", ")", ":", ",", "R.", "x", "\n", "    ", "\"n\"", "//", "[", "if c:\n", "@R.function\n", "0", "-"];
    let count: usize = common::random::fuzz_count(3000);
    let mut rng = Rng::new(0x5c1e_7e57_0000_0001);
    let (mut ok, mut rejected) = (0, 0);
    for _ in 0..count {
        let source = &sources[rng.below(sources.len())];
        let src = common::random::mutate_text(&mut rng, source, &snippets, b"()[]:,.=+-*/%\"' \nxR0");
        match front_end(&src) {
            Ok(()) => ok += 1,
            Err(_) => rejected += 1,
        }
    }
    eprintln!("{count} mutated programs: {ok} still compiled, {rejected} rejected with an error; none panicked");
    assert!(rejected > 0 && ok > 0, "mutations too weak or too strong to exercise the front end");
}

/// A listing from `inspect --asm`, compiled as `.rvmasm`, runs like the program it came from, in
/// both modes; a program whose shape functions the text form cannot carry gets a clear error.
#[test]
fn text_form_compiles_and_runs() {
    let dir = common::root().join("fixtures/script/chain");
    let program = load_script(&dir.join("m.py"), &kernels()).expect("chain compiles");
    let asm_path = common::scratch_dir().join(format!("chain.{}.rvmasm", std::process::id()));
    std::fs::write(&asm_path, relaxc::vm::asm::disassemble(&program.exec)).expect("write");
    let inputs = relaxc::host::npz::read_inputs(&dir.join("ok_basic.in.npz")).expect("inputs");
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let mut options = Options::mode(mode);
        options.script = kernels();
        let so = common::build_with("chain_asm", &asm_path, &options, common::mode_name(mode)).expect("build");
        let model = relaxc::host::Model::load(&so).expect("load");
        let mut vm = model.vm().expect("vm");
        let outputs = vm.call(model.find("main").expect("main"), &inputs).expect("call").to_output().flatten();
        common::compare_outputs(&outputs, &dir.join("ok_basic.out.npz")).expect("outputs");
    }
    let dynamic = load_script(&common::root().join("fixtures/script/dynamic/m.py"), &kernels()).expect("dynamic");
    let asm_path = common::scratch_dir().join(format!("dynamic.{}.rvmasm", std::process::id()));
    std::fs::write(&asm_path, relaxc::vm::asm::disassemble(&dynamic.exec)).expect("write");
    let mut options = Options::mode(ExecMode::Bytecode);
    options.script = kernels();
    let err = common::build_with("dynamic_asm", &asm_path, &options, "bytecode").expect_err("no shape functions");
    assert!(err.contains("shape_func_main_0 is not defined"), "{err}");
}

/// A program of library operators (fixtures/script/ops) needs no C: `relaxc compile` with only its
/// weights, then `relaxc run`, gives TVM's results within the fixture's tolerance, both modes.
#[test]
fn library_operators_need_no_kernels() {
    let dir = common::root().join("fixtures/script/ops");
    let fixture = common::script_fixtures().into_iter().find(|f| f.name == "ops").expect("the ops fixture");
    for mode in ["bytecode", "compiled"] {
        let so = common::scratch_dir().join(format!("ops_no_kernels.{mode}.{}.so", std::process::id()));
        let out = common::scratch_dir().join(format!("ops_no_kernels.{mode}.{}.npz", std::process::id()));
        let compiled = std::process::Command::new(env!("CARGO_BIN_EXE_relaxc"))
            .arg("compile")
            .arg(dir.join("m.py"))
            .arg("--params")
            .arg(dir.join("w.safetensors"))
            .args(["--exec-mode", mode, "-o"])
            .arg(&so)
            .output()
            .expect("relaxc compile");
        assert!(compiled.status.success(), "{}", String::from_utf8_lossy(&compiled.stderr));
        let ran = std::process::Command::new(env!("CARGO_BIN_EXE_relaxc"))
            .arg("run")
            .arg(&so)
            .arg("--inputs")
            .arg(dir.join("ok_n3.in.npz"))
            .arg("--outputs")
            .arg(&out)
            .output()
            .expect("relaxc run");
        assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
        let model = relaxc::host::Model::load(&so).expect("load");
        let inputs = relaxc::host::npz::read_inputs(&dir.join("ok_n3.in.npz")).expect("inputs");
        let mut vm = model.vm().expect("vm");
        let outputs = vm.call(model.find("main").expect("main"), &inputs).expect("call").to_output().flatten();
        fixture.check_outputs(&outputs, "n3").unwrap_or_else(|e| panic!("{mode}: {e}"));
        let _ = std::fs::remove_file(&out);
    }
}
