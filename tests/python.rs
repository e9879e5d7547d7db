//! Runs the Python tests (tests/python, pytest) against this build's relaxc: every fixture
//! through `tvm_ffi.load_module`, with numpy and the apache-tvm-ffi wheel alone (no TVM).
//! Where python3 lacks numpy, pytest or tvm_ffi, the test is reported as ignored with the reason
//! in cargo test's own summary (never as `ok`); CI installs them (.ci/run), and there a missing
//! one is a failure.

use std::process::Command;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

fn python_ready() -> Result<(), String> {
    let probe = Command::new("python3").args(["-c", "import numpy, pytest, tvm_ffi"]).output();
    match probe {
        Err(e) => Err(format!("python3 cannot run: {e}")),
        Ok(out) if !out.status.success() => Err(format!(
            "python3 lacks numpy, pytest or apache-tvm-ffi (pip install numpy pytest apache-tvm-ffi): {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        )),
        Ok(_) => Ok(()),
    }
}

fn tvm_ffi_modules_from_python() -> Result<Completion, Failed> {
    if let Err(why) = python_ready() {
        if std::env::var_os("CI").is_some() {
            return Err(format!("CI needs the Python test dependencies: {why}").into());
        }
        return Ok(Completion::ignored_with(format!("Python tests skipped: {why}")));
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("python3")
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/python"])
        .current_dir(root)
        .env("RELAXC", env!("CARGO_BIN_EXE_relaxc"))
        .output()
        .map_err(|e| format!("run pytest: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{}", text.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n"));
    if !out.status.success() {
        return Err(format!("pytest failed:\n{text}").into());
    }
    Ok(Completion::Completed)
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![Trial::ignorable_test("tvm_ffi_modules_from_python", tvm_ffi_modules_from_python)];
    libtest_mimic::run(&args, trials).exit();
}
