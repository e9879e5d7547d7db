//! The command line as users type it: model paths of every form, and what a bad path says.

mod common;

use std::process::Command;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use relaxc::codegen::ExecMode;

fn relaxc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_relaxc"))
}

fn run_and_inspect_open_bare_relative_and_absolute_paths() {
    let fixture = common::fixtures_dir().join("mlp_static");
    let so = common::build("mlp_static", &fixture.join("m.tar"), ExecMode::Compiled).expect("build");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("sub")).expect("sub");
    std::fs::copy(&so, dir.path().join("sub/m.so")).expect("copy");
    let inputs = fixture.join("ok_basic.in.npz");
    let expect = fixture.join("ok_basic.out.npz");
    for (cwd, path) in [
        (dir.path().join("sub"), "m.so".to_string()),
        (dir.path().to_path_buf(), "sub/m.so".to_string()),
        (dir.path().join("sub"), "./m.so".to_string()),
        (dir.path().to_path_buf(), dir.path().join("sub/m.so").display().to_string()),
    ] {
        let out = relaxc()
            .current_dir(&cwd)
            .args(["run", &path, "--inputs"])
            .arg(&inputs)
            .arg("--expect")
            .arg(&expect)
            .output()
            .expect("relaxc run");
        assert!(out.status.success(), "run {path} in {}: {}", cwd.display(), String::from_utf8_lossy(&out.stderr));
        let out = relaxc().current_dir(&cwd).args(["inspect", &path]).output().expect("relaxc inspect");
        assert!(out.status.success(), "inspect {path}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

fn a_bad_model_path_names_the_file_and_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = relaxc().current_dir(dir.path()).args(["run", "nonexistent.so"]).output().expect("relaxc run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot load nonexistent.so: No such file or directory"), "{err}");
    std::fs::write(dir.path().join("garbage.so"), b"not an ELF file").expect("write");
    let out = relaxc().current_dir(dir.path()).args(["run", "garbage.so"]).output().expect("relaxc run");
    let err = String::from_utf8_lossy(&out.stderr);
    // dlerror()'s own reason follows relaxc's words.
    assert!(err.contains("cannot load garbage.so: dlopen failed: ./garbage.so:"), "{err}");
    assert!(err.contains("file too short") || err.contains("invalid ELF header"), "{err}");
}

fn a_model_built_by_an_older_relaxc_still_runs() -> Completion {
    if !cfg!(target_arch = "x86_64") {
        return Completion::ignored_with("the ABI-1 model fixture is an x86-64 library");
    }
    let fixture = common::fixtures_dir().join("mlp_static");
    let out = relaxc()
        .arg("run")
        .arg(common::root().join("fixtures/compat/mlp_static.abi1.x86_64.so"))
        .arg("--inputs")
        .arg(fixture.join("ok_basic.in.npz"))
        .arg("--expect")
        .arg(fixture.join("ok_basic.out.npz"))
        .output()
        .expect("relaxc run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let model =
        relaxc::host::Model::load(&common::root().join("fixtures/compat/mlp_static.abi1.x86_64.so")).expect("load");
    let err = model.function("vm.builtin.copy").err().expect("no registry in ABI 1");
    assert!(err.to_string().contains("speaks ABI version 1"), "{err}");
    Completion::Completed
}

/// A library built by a relaxc whose C API this one does not speak is refused, naming what built
/// it (simulated: a library whose rvm_get_api answers no version, with an identity section).
fn a_model_from_an_incompatible_relaxc_is_refused_by_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("future.c");
    std::fs::write(
        &src,
        "const void *rvm_get_api(unsigned v) { (void)v; return 0; }\n\
         __attribute__((section(\".rvm_identity\"), used)) static const char id[] = \"relaxc 9.0.0 c-api 7\";\n",
    )
    .expect("write");
    let so = dir.path().join("future.so");
    let status =
        Command::new(relaxc::link::linker()).args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&src).status().expect("cc");
    assert!(status.success());
    let out = relaxc().arg("run").arg(&so).output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("built by relaxc 9.0.0 c-api 7"), "{err}");
    let versions = format!("C API versions {}..={}", relaxc::abi::ABI_VERSION_MIN, relaxc::abi::ABI_VERSION);
    assert!(err.contains(&versions), "{err}");
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Output paths that name an input are refused before anything is written: `run m.so --outputs
/// m.so` once overwrote the model with an npz and died of SIGBUS; `compile x.tar -o x.tar`
/// replaced its input.
fn outputs_that_name_an_input_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = dir.path().join("m.tar");
    std::fs::copy(common::fixtures_dir().join("chain_1/m.tar"), &tar).expect("copy");
    let before = std::fs::read(&tar).expect("read");
    let out = relaxc().arg("compile").arg(&tar).arg("-o").arg(&tar).output().expect("relaxc compile");
    assert!(!out.status.success() && stderr_of(&out).contains("is also an input"), "{}", stderr_of(&out));
    assert_eq!(std::fs::read(&tar).expect("read"), before, "the input was changed");
    let so = dir.path().join("m.so");
    assert!(relaxc().arg("compile").arg(&tar).arg("-o").arg(&so).status().expect("compile").success());
    let model = std::fs::read(&so).expect("read");
    let inputs = common::fixtures_dir().join("chain_1/ok_basic.in.npz");
    for outputs in [&so, &inputs] {
        let out = relaxc()
            .arg("run")
            .arg(&so)
            .arg("--inputs")
            .arg(&inputs)
            .arg("--outputs")
            .arg(outputs)
            .output()
            .expect("run");
        assert!(!out.status.success() && stderr_of(&out).contains("is also an input"), "{}", stderr_of(&out));
    }
    assert_eq!(std::fs::read(&so).expect("read"), model, "the model was changed");
}

/// Messages say what was wrong first and once; `--bench 0` is refused before the call; a closed
/// pipe ends `inspect` quietly instead of a panic.
fn messages_name_the_problem_once() {
    let so =
        common::build("chain_1", &common::fixtures_dir().join("chain_1/m.tar"), ExecMode::Bytecode).expect("build");
    let inputs = common::fixtures_dir().join("chain_1/ok_basic.in.npz");
    let out = relaxc().arg("run").arg(&so).arg("--inputs").arg(&inputs).args(["--func", "nope"]).output().expect("run");
    assert!(
        stderr_of(&out).starts_with("error: the model has no function \"nope\" (its functions: main)"),
        "{}",
        stderr_of(&out)
    );
    let out = relaxc().arg("run").arg(&so).arg("--inputs").arg(&inputs).args(["--bench", "0"]).output().expect("run");
    assert!(
        !out.status.success() && out.stdout.is_empty(),
        "--bench 0 printed {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr_of(&out).contains("must be at least 1"), "{}", stderr_of(&out));
    let out = relaxc().args(["compile", "/nonexistent/m.tar", "-o", "/nonexistent/m.so"]).output().expect("compile");
    let message = stderr_of(&out);
    assert_eq!(message.matches("No such file or directory").count(), 1, "{message}");
    // inspect into a pipe closed after the first line.
    let mut child = relaxc()
        .arg("inspect")
        .arg(&so)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("inspect");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    assert!(!stderr_of(&out).contains("panicked"), "{}", stderr_of(&out));
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test("run_and_inspect_open_bare_relative_and_absolute_paths", || {
            run_and_inspect_open_bare_relative_and_absolute_paths();
            Ok(())
        }),
        Trial::test("a_bad_model_path_names_the_file_and_the_reason", || {
            a_bad_model_path_names_the_file_and_the_reason();
            Ok(())
        }),
        Trial::ignorable_test("a_model_built_by_an_older_relaxc_still_runs", || {
            Ok::<_, Failed>(a_model_built_by_an_older_relaxc_still_runs())
        }),
        Trial::test("a_model_from_an_incompatible_relaxc_is_refused_by_version", || {
            a_model_from_an_incompatible_relaxc_is_refused_by_version();
            Ok(())
        }),
        Trial::test("outputs_that_name_an_input_are_refused", || {
            outputs_that_name_an_input_are_refused();
            Ok(())
        }),
        Trial::test("messages_name_the_problem_once", || {
            messages_name_the_problem_once();
            Ok(())
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}
