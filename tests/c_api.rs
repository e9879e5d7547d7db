//! Builds tests/c/api_test.c, a plain C host, and runs it on compiled models: natively, and
//! under valgrind (no leak, no invalid access). In CI valgrind is required; elsewhere a test whose
//! valgrind run could not happen is reported as ignored, with the reason, after its native runs
//! passed (never as `ok`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use relaxc::codegen::ExecMode;

fn fixture_tar(name: &str) -> PathBuf {
    common::fixtures_dir().join(name).join("m.tar")
}

fn build_host() -> PathBuf {
    common::build_c_host("api_test")
}

fn models(mode: ExecMode) -> (PathBuf, PathBuf) {
    let a = common::build("dyn_tuple", &fixture_tar("dyn_tuple"), mode).expect("build dyn_tuple");
    let b = common::build("calls", &fixture_tar("calls"), mode).expect("build calls");
    (a, b)
}

fn check_api(mode: ExecMode) -> Option<String> {
    let exe = build_host();
    let (a, b) = models(mode);
    let out = Command::new(&exe).arg(&a).arg(&b).output().expect("run api_test");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "api_test failed:\n{text}");
    assert!(text.contains(", 0 failed"), "{text}");

    valgrind(&exe, &[&a, &b], &format!("api_test ({})", common::mode_name(mode)))
}

/// tests/c/oom_test.c: a C host gives the VM a failing allocator and walks N over every
/// allocation of a TVM model's first call (mlp_static: weights, kernels, storage; calls: Relax
/// function calls), in both modes, natively and under valgrind.
fn out_of_memory_at_every_allocation_under_valgrind() -> Option<String> {
    let exe = common::build_c_host("oom_test");
    let mut skipped = None;
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        for (fixture, shapes) in [("mlp_static", &["2x4"][..]), ("calls", &["2x3", "2x3"][..])] {
            let so = common::build(fixture, &fixture_tar(fixture), mode).expect("build the model");
            let out = Command::new(&exe).arg(&so).args(shapes).output().expect("run oom_test");
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && text.contains(", 0 failed"), "oom_test {fixture} failed:\n{text}");
            assert!(text.contains("each failed in turn"), "{text}");
            eprint!("{fixture} ({}): {text}", common::mode_name(mode));
            let args: Vec<&Path> = std::iter::once(so.as_path()).chain(shapes.iter().map(Path::new)).collect();
            let what = format!("oom_test on {fixture} ({})", common::mode_name(mode));
            skipped = skipped.or(valgrind(&exe, &args, &what));
        }
    }
    skipped
}

/// Runs exe under valgrind: no invalid access, no definite or indirect leak. Returns why the run
/// could not happen, if it could not.
fn valgrind(exe: &Path, args: &[&Path], what: &str) -> Option<String> {
    if !relaxc::link::SHIM_SANITIZERS.is_empty() {
        return Some(format!(
            "valgrind run of {what} skipped: the shim is built with sanitizers, which check it instead"
        ));
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "valgrind is required in CI (.ci/run installs it)");
        return Some(format!("valgrind run of {what} skipped: valgrind is not installed"));
    }
    let out = Command::new("valgrind")
        .args(["--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect"])
        .arg("--show-leak-kinds=definite,indirect")
        .arg(exe)
        .args(args)
        .output()
        .expect("run valgrind");
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "valgrind found errors or leaks in {what}:\n{text}");
    assert!(text.contains("ERROR SUMMARY: 0 errors"), "{text}");
    eprintln!("{what}: valgrind clean");
    None
}

/// A test's verdict: ignored with the reason when its valgrind runs could not happen.
fn verdict(skipped: Option<String>) -> Result<Completion, Failed> {
    Ok(match skipped {
        Some(why) => Completion::ignored_with(format!("{why}; the native runs passed")),
        None => Completion::Completed,
    })
}

/// A batch of random programs (with the deliberate failures), run under valgrind in both modes.
fn random_programs_under_valgrind() -> Option<String> {
    let batch = common::random::generate(7, 300);
    relaxc::vm::verify(&batch.exec).expect("valid programs");
    let kernels =
        relaxc::kernels::compile_c_host(&common::root().join("tests/kernels/random_kernels.c")).expect("kernels");
    let program = relaxc::compile::Program {
        exec: relaxc::vm::Verified::new(batch.exec).expect("valid programs"),
        kernels: vec![kernels],
        shape_funcs: Vec::new(),
        cuda: Vec::new(),
    };
    let exe = common::build_c_host("run_programs");
    let mut skipped = None;
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let so = common::link_program("random_vg", &program, mode).expect("build");
        let out = Command::new(&exe).arg(&so).output().expect("run_programs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success() && text.contains("600 calls"), "{text}");
        skipped = skipped.or(valgrind(&exe, &[&so], &format!("300 random programs ({})", common::mode_name(mode))));
    }
    skipped
}

/// A C host registers a function; the model's kernel calls it by name (both modes, valgrind).
fn host_registered_function_called_by_a_kernel_under_valgrind() -> Option<String> {
    let exe = common::build_c_host("registry_test");
    let dir = common::root().join("tests/host_call");
    let mut skipped = None;
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let mut options = relaxc::compile::Options::mode(mode);
        options.script.kernels = vec![dir.join("kernels.c")];
        // The host calls tvm.contrib.sort.sort by name, which the program itself does not use.
        options.all_runtime_functions = true;
        let so = common::build_with("host_call", &dir.join("m.py"), &options, common::mode_name(mode)).expect("build");
        let out = Command::new(&exe).arg(&so).output().expect("run registry_test");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains(", 0 failed"),
            "registry_test ({}):\n{text}",
            common::mode_name(mode)
        );
        skipped = skipped.or(valgrind(&exe, &[&so], &format!("registry_test ({})", common::mode_name(mode))));
    }
    skipped
}

/// main(x) = x, built from an ExecBuilder program in `mode`.
fn identity_model(mode: ExecMode) -> PathBuf {
    use relaxc::vm::{ExecBuilder, Instr};
    let mut b = ExecBuilder::new();
    b.begin_function("main", &["x"]);
    b.emit(Instr::Ret { result: 0 });
    b.end_function(1);
    let program = relaxc::compile::Program {
        exec: relaxc::vm::Verified::new(b.build()).expect("valid"),
        kernels: Vec::new(),
        shape_funcs: Vec::new(),
        cuda: Vec::new(),
    };
    common::link_program("identity", &program, mode).expect("build")
}

/// Every rvm.h function with bad arguments, a VM entered from a second thread, and results that
/// must not alias the caller's buffers (tests/c/bad_args_test.c), in both modes and under valgrind.
fn c_api_bad_arguments_are_errors_under_valgrind() -> Option<String> {
    let exe = common::build_c_host("bad_args_test");
    let mut skipped = None;
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let (_, calls) = models(mode);
        let mut options = relaxc::compile::Options::mode(mode);
        options.native.instrument = true;
        let tag = format!("{}_instrumented", common::mode_name(mode));
        let instrumented = common::build_with("calls", &fixture_tar("calls"), &options, &tag).expect("build");
        let identity = identity_model(mode);
        let out = Command::new(&exe).arg(&calls).arg(&instrumented).arg(&identity).output().expect("run bad_args_test");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains(", 0 failed"),
            "bad_args_test ({}):\n{text}",
            common::mode_name(mode)
        );
        let what = format!("bad_args_test ({})", common::mode_name(mode));
        skipped = skipped.or(valgrind(&exe, &[&calls, &instrumented, &identity], &what));
    }
    skipped
}

/// The bad-argument test must reach every entry of the API table: an entry added to `rvm_api`
/// without a bad-argument call there fails here, naming it.
fn bad_args_test_calls_every_api_entry() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(root.join("runtime-shim/include/rvm.h")).expect("read rvm.h");
    let test = std::fs::read_to_string(root.join("tests/c/bad_args_test.c")).expect("read bad_args_test.c");
    let table = header
        .split("typedef struct rvm_api {")
        .nth(1)
        .and_then(|rest| rest.split("} rvm_api;").next())
        .expect("rvm.h defines struct rvm_api");
    // An entry is a line's first `(*name)(`: a callback parameter stands later on its line.
    let entries: Vec<&str> = table
        .lines()
        .filter_map(|line| line.trim_start().split_once("(*").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once(")(").map(|(name, _)| name))
        .collect();
    assert!(entries.len() >= 25, "found only {} entries in rvm_api: {entries:?}", entries.len());
    let missing: Vec<&&str> = entries.iter().filter(|name| !test.contains(&format!("api->{name}("))).collect();
    assert!(missing.is_empty(), "tests/c/bad_args_test.c never calls {missing:?}");
    assert!(test.contains("get_api(0)"), "tests/c/bad_args_test.c never asks rvm_get_api for an unsupported version");
}

fn main() {
    let args = Arguments::from_args();
    let valgrind_trial =
        |name: &'static str, f: fn() -> Option<String>| Trial::ignorable_test(name, move || verdict(f()));
    let trials = vec![
        valgrind_trial("random_programs_under_valgrind", random_programs_under_valgrind),
        valgrind_trial(
            "host_registered_function_called_by_a_kernel_under_valgrind",
            host_registered_function_called_by_a_kernel_under_valgrind,
        ),
        valgrind_trial("c_host_bytecode_under_valgrind", || check_api(ExecMode::Bytecode)),
        valgrind_trial("c_host_compiled_under_valgrind", || check_api(ExecMode::Compiled)),
        valgrind_trial("c_api_bad_arguments_are_errors_under_valgrind", c_api_bad_arguments_are_errors_under_valgrind),
        valgrind_trial(
            "out_of_memory_at_every_allocation_under_valgrind",
            out_of_memory_at_every_allocation_under_valgrind,
        ),
        Trial::test("bad_args_test_calls_every_api_entry", || {
            bad_args_test_calls_every_api_entry();
            Ok(())
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}
