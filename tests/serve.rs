//! Serving on Ray (tests/python_serve, pytest): `python -m relaxc.serve` with a TVM export over
//! the Open Inference Protocol and the tiny Llama over OpenAI's API (the official client), on
//! 127.0.0.1, in a network namespace with only loopback when the system allows one. Where
//! python3 lacks ray[serve] (or numpy, pytest, tvm_ffi) the test is reported as
//! ignored with the reason; CI installs them (.ci/run), and there a missing one is a failure.

mod common;

use std::process::Command;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

fn ray_serve_on_loopback() -> Result<Completion, Failed> {
    let probe = Command::new("python3")
        .args(["-c", "import numpy, pytest, tvm_ffi, ray.serve, starlette, tokenizers, jinja2, openai"])
        .output();
    let missing = match probe {
        Err(e) => Some(format!("python3 cannot run: {e}")),
        Ok(out) if !out.status.success() => Some(format!(
            "python3 lacks ray[serve] (or numpy, pytest, apache-tvm-ffi, tokenizers, jinja2, openai): pip install 'ray[serve]' tokenizers jinja2 openai: {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        )),
        Ok(_) => None,
    };
    if let Some(why) = missing {
        return common::tool_missing(format!("serving tests skipped: {why}"));
    }
    // Ray's own services (GCS, raylet, object manager) listen on every interface, and Ray has no
    // option against it; in a network namespace of their own (`unshare -rn`, where only loopback
    // exists) the tests reach nothing but 127.0.0.1 whatever Ray binds.
    let isolated = Command::new("unshare")
        .args(["-rn", "sh", "-c", "ip link set lo up"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let pytest = "python3 -m pytest -q -p no:cacheprovider tests/python_serve";
    let command = if isolated {
        let mut c = Command::new("unshare");
        c.args(["-rn", "sh", "-c", &format!("ip link set lo up && exec {pytest}")]);
        c
    } else {
        eprintln!(
            "no network namespace (unshare -rn with ip from iproute2 failed): Ray's services listen on all interfaces during this test"
        );
        let mut c = Command::new("sh");
        c.args(["-c", pytest]);
        c
    };
    common::pytest(command)
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![Trial::ignorable_test("ray_serve_on_loopback", ray_serve_on_loopback)];
    libtest_mimic::run(&args, trials).exit();
}
