//! Runs the Python tests (tests/python, pytest) against this build's relaxc: every fixture
//! through `tvm_ffi.load_module`, with numpy and the apache-tvm-ffi wheel alone (no TVM).
//! Where python3 lacks numpy, pytest or tvm_ffi, the test is reported as ignored with the reason
//! in cargo test's own summary (never as `ok`); CI installs them (.ci/run), and there a missing
//! one is a failure.

mod common;

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
        return common::tool_missing(format!("Python tests skipped: {why}"));
    }
    let mut pytest = Command::new("python3");
    pytest.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/python"]);
    common::pytest(pytest)
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![Trial::ignorable_test("tvm_ffi_modules_from_python", tvm_ffi_modules_from_python)];
    libtest_mimic::run(&args, trials).exit();
}
