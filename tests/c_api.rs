//! Builds tests/c/api_test.c, a plain C host, and runs it on compiled models: natively, and
//! under valgrind (no leak, no invalid access). In CI valgrind is required; elsewhere a missing
//! valgrind is reported as a skip.

mod common;

use std::path::PathBuf;
use std::process::Command;

use relaxc::codegen::ExecMode;

fn fixture_tar(name: &str) -> PathBuf {
    common::fixtures_dir().join(name).join("m.tar")
}

fn build_host() -> PathBuf {
    let exe = common::scratch_dir().join(format!("api_test.{}", std::process::id()));
    let status = Command::new(relaxc::link::linker())
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .arg("-I")
        .arg(common::root().join("runtime-shim/include"))
        .arg(common::root().join("tests/c/api_test.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "api_test.c does not build");
    exe
}

fn models(mode: ExecMode) -> (PathBuf, PathBuf) {
    let a = common::build("dyn_tuple", &fixture_tar("dyn_tuple"), mode).expect("build dyn_tuple");
    let b = common::build("calls", &fixture_tar("calls"), mode).expect("build calls");
    (a, b)
}

fn check_api(mode: ExecMode) {
    let exe = build_host();
    let (a, b) = models(mode);
    let out = Command::new(&exe).arg(&a).arg(&b).output().expect("run api_test");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "api_test failed:\n{text}");
    assert!(text.contains(", 0 failed"), "{text}");

    if Command::new("valgrind").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "valgrind is required in CI (.ci/run installs it)"
        );
        eprintln!(
            "SKIPPED: valgrind run of api_test ({}): valgrind is not installed",
            common::mode_name(mode)
        );
        return;
    }
    let out = Command::new("valgrind")
        .args([
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
            "--show-leak-kinds=definite,indirect",
        ])
        .arg(&exe)
        .arg(&a)
        .arg(&b)
        .output()
        .expect("run valgrind");
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "valgrind found errors or leaks:\n{text}");
    assert!(text.contains("ERROR SUMMARY: 0 errors"), "{text}");
}

#[test]
fn c_host_bytecode_under_valgrind() {
    check_api(ExecMode::Bytecode);
}

#[test]
fn c_host_compiled_under_valgrind() {
    check_api(ExecMode::Compiled);
}
