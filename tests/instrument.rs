//! The instrument hook of models built with --instrument (TVM's set_instrument), in bytecode and
//! compiled mode alike: the same reports in the same order, skipping, hook errors; and the
//! profiler and trace of `relaxc run` on top of it.

mod common;

use std::ffi::{CStr, c_void};
use std::process::Command;

use relaxc::abi::Any;
use relaxc::codegen::ExecMode;
use relaxc::host::{HostError, Model, Output, npz};

fn build(name: &str, mode: ExecMode, instrument: bool) -> std::path::PathBuf {
    let mut options = relaxc::compile::Options::mode(mode);
    options.native.instrument = instrument;
    let tag = format!("{}{}", common::mode_name(mode), if instrument { ".instrumented" } else { "" });
    common::build_with(name, &common::fixtures_dir().join(name).join("m.tar"), &options, &tag).expect("build")
}

/// What a recording hook saw: (name, before, number of call arguments, the result's type after).
#[derive(Default)]
struct Recorder {
    events: Vec<(String, bool, usize, i32)>,
    skip: Option<String>,
    fail_on: Option<String>,
}

unsafe extern "C" fn record(self_: *mut c_void, args: *const Any, n: i32, result: *mut Any) -> i32 {
    // SAFETY: the runtime passes our Recorder and n arguments.
    let (rec, args) = unsafe { (&mut *(self_ as *mut Recorder), std::slice::from_raw_parts(args, n as usize)) };
    // SAFETY: the name is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(args[1].payload as *const std::ffi::c_char) }.to_string_lossy().into_owned();
    let before = args[2].payload != 0;
    rec.events.push((name.clone(), before, args.len() - 4, args[3].type_index));
    let verdict = if before && rec.skip.as_deref() == Some(name.as_str()) { 1 } else { 0 };
    // SAFETY: result is a valid out-slot.
    unsafe { *result = Any::int(verdict) };
    if before && rec.fail_on.as_deref() == Some(name.as_str()) {
        return -1; // no error message set: the runtime still reports the call as failed
    }
    0
}

fn run_recorded(name: &str, mode: ExecMode, rec: &mut Recorder) -> Result<Output, HostError> {
    let so = build(name, mode, true);
    let model = Model::load(&so).expect("load");
    assert!(model.instrumented());
    let inputs = npz::read_inputs(&common::fixtures_dir().join(name).join("ok_basic.in.npz")).expect("inputs");
    let mut vm = model.vm().expect("vm");
    // SAFETY: record is a safe call; rec outlives the call.
    unsafe { vm.set_instrument(Some(record), rec as *mut Recorder as *mut c_void) }.expect("set");
    let out = vm.call(model.find("main").expect("main"), &inputs).map(|v| v.to_output());
    // SAFETY: clearing.
    unsafe { vm.set_instrument(None, std::ptr::null_mut()) }.expect("clear");
    out
}

#[test]
fn both_modes_report_the_same_calls_in_the_same_order() {
    for fixture in ["calls", "mlp_static", "shapes"] {
        let mut seen = Vec::new();
        for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
            let mut rec = Recorder::default();
            let out = if fixture == "shapes" {
                let so = build(fixture, mode, true);
                let model = Model::load(&so).expect("load");
                let inputs =
                    npz::read_inputs(&common::fixtures_dir().join(fixture).join("ok_n2.in.npz")).expect("inputs");
                let mut vm = model.vm().expect("vm");
                // SAFETY: as in run_recorded.
                unsafe { vm.set_instrument(Some(record), &mut rec as *mut Recorder as *mut c_void) }.expect("set");
                vm.call(model.find("main").expect("main"), &inputs).map(|v| v.to_output())
            } else {
                run_recorded(fixture, mode, &mut rec)
            };
            let out = out.expect("instrumented call");
            let case = if fixture == "shapes" { "ok_n2" } else { "ok_basic" };
            common::compare_outputs(
                &out.flatten(),
                &common::fixtures_dir().join(fixture).join(format!("{case}.out.npz")),
            )
            .expect("an instrumented model gives TVM's results");
            // Every before has its after, properly nested, and the after carries a result slot.
            let mut open = Vec::new();
            for (name, before, _, _) in &rec.events {
                if *before {
                    open.push(name.clone());
                } else {
                    assert_eq!(open.pop().as_deref(), Some(name.as_str()), "{fixture}: unbalanced report for {name}");
                }
            }
            assert!(open.is_empty());
            assert!(rec.events.iter().any(|e| e.0 == "vm.builtin.alloc_storage"), "builtins report too");
            seen.push(rec.events);
        }
        assert_eq!(seen[0], seen[1], "{fixture}: bytecode and compiled mode report differently");
    }
}

#[test]
fn dtype_arguments_reach_the_hook_as_strings() {
    let so = build("mlp_static", ExecMode::Compiled, true);
    let model = Model::load(&so).expect("load");
    unsafe extern "C" fn check(self_: *mut c_void, args: *const Any, n: i32, result: *mut Any) -> i32 {
        // SAFETY: as in record.
        let (found, args) = unsafe { (&mut *(self_ as *mut bool), std::slice::from_raw_parts(args, n as usize)) };
        for a in &args[4..] {
            assert_ne!(a.type_index, 5, "a DataType reached the hook");
            if a.type_index == 8 {
                // SAFETY: a RawStr argument.
                *found |= unsafe { CStr::from_ptr(a.payload as *const std::ffi::c_char) }.to_str() == Ok("float32");
            }
        }
        // SAFETY: valid out-slot.
        unsafe { *result = Any::int(0) };
        0
    }
    let mut found = false;
    let mut vm = model.vm().expect("vm");
    // SAFETY: check is a safe call; found outlives the call.
    unsafe { vm.set_instrument(Some(check), &mut found as *mut bool as *mut c_void) }.expect("set");
    let inputs = npz::read_inputs(&common::fixtures_dir().join("mlp_static/ok_basic.in.npz")).expect("inputs");
    vm.call(model.find("main").expect("main"), &inputs).expect("call");
    assert!(found, "alloc_tensor's dtype arrived as the string float32");
}

#[test]
fn the_hook_can_skip_a_call() {
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let mut rec = Recorder { skip: Some("vm.builtin.make_tuple".into()), ..Default::default() };
        let out = run_recorded("misc_consts", mode, &mut rec).expect("call");
        // misc_consts returns the tuple make_tuple builds: skipped, its register holds None.
        assert_eq!(out, Output::Other("None".into()), "{}", common::mode_name(mode));
        let reports: Vec<bool> = rec.events.iter().filter(|e| e.0 == "vm.builtin.make_tuple").map(|e| e.1).collect();
        assert_eq!(reports, vec![true], "a skipped call has no after report");
    }
}

#[test]
fn a_failing_hook_fails_the_call_and_a_plain_model_refuses_a_hook() {
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let mut rec = Recorder { fail_on: Some("matmul".into()), ..Default::default() };
        let err = run_recorded("mlp_static", mode, &mut rec).expect_err("the hook failed the call");
        assert!(err.to_string().contains("in main at pc"), "located like any failed call: {err}");
        let so = build("mlp_static", mode, false);
        let model = Model::load(&so).expect("load");
        assert!(!model.instrumented());
        let mut vm = model.vm().expect("vm");
        let mut rec = Recorder::default();
        // SAFETY: the call must fail before it stores anything.
        let r = unsafe { vm.set_instrument(Some(record), &mut rec as *mut Recorder as *mut c_void) };
        assert!(r.expect_err("refused").to_string().contains("built without --instrument"));
    }
}

/// `relaxc run --profile` on the transformer fixture lists every kernel, its kernel times plus the
/// overhead make the call time, and `--trace` writes trace-event JSON.
#[test]
fn profile_lists_every_kernel_and_adds_up() {
    let fixture = common::fixtures_dir().join("onnx_transformer");
    let exec = relaxc::inspect::load_executable(&fixture.join("m.tar")).expect("exec");
    let kernels: Vec<String> = exec
        .funcs
        .iter()
        .filter(|f| f.kind == relaxc::vm::FuncKind::Packed && !f.name.starts_with("vm.builtin."))
        .map(|f| f.name.clone())
        .collect();
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let so = build("onnx_transformer", mode, true);
        let trace =
            common::scratch_dir().join(format!("trace.{}.{}.json", common::mode_name(mode), std::process::id()));
        let out = Command::new(env!("CARGO_BIN_EXE_relaxc"))
            .arg("run")
            .arg(&so)
            .arg("--inputs")
            .arg(fixture.join("ok_b2s7.in.npz"))
            .args(["--profile", "5", "--trace"])
            .arg(&trace)
            .output()
            .expect("relaxc run");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let rows: Vec<Vec<&str>> = text
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| callee"))
            .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
            .collect();
        for k in &kernels {
            assert!(rows.iter().any(|r| r[0] == k && r[1] == "kernel"), "{k} missing from the profile:\n{text}");
        }
        let number = |line: &str, key: &str| -> f64 {
            let at = line.find(key).expect(key) + key.len();
            line[at..].split_whitespace().next().expect("number").parse().expect("float")
        };
        let head = text.lines().find(|l| l.starts_with("profile of")).expect("header");
        let total = number(head, "calls,");
        let summary = text.lines().find(|l| l.starts_with("kernels:")).expect("summary");
        let (kernel_us, overhead) = (number(summary, "kernels:"), number(summary, "included):"));
        let listed: f64 = rows.iter().filter(|r| r[1] == "kernel").map(|r| r[3].parse::<f64>().expect("total")).sum();
        assert!(
            (listed - kernel_us).abs() < 0.05 * kernels.len() as f64,
            "kernel rows add up to {listed}, summary says {kernel_us}"
        );
        assert!(
            (kernel_us + overhead - total).abs() < 0.1,
            "kernels {kernel_us} + overhead {overhead} != call time {total}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace")).expect("trace is JSON");
        let events = json["traceEvents"].as_array().expect("a traceEvents list");
        assert!(events.len() > kernels.len() * 5, "one slice per call");
        assert!(events.iter().all(|e| e["ph"] == "X" && e["dur"].as_f64().is_some()));
    }
}

/// `relaxc run --profile` names the path each family of library kernels took (on stderr): the
/// f32 kernels, the encoder attention and the int8 matmul, as the library decided them.
#[test]
fn profile_names_the_kernel_paths() {
    for (name, case, families) in [
        ("lib_onnx_transformer", "ok_b2s7", &["f32 kernels (GEMM", "encoder attention (relaxc.attention) on "][..]),
        ("lib_int8", "ok_b6", &["int8 matmul (MatMulInteger) on "][..]),
    ] {
        let so = build(name, ExecMode::Compiled, true);
        let out = Command::new(env!("CARGO_BIN_EXE_relaxc"))
            .arg("run")
            .arg(&so)
            .arg("--inputs")
            .arg(common::fixtures_dir().join(name).join(format!("{case}.in.npz")))
            .args(["--profile", "2"])
            .env_remove("RELAXC_KERNEL_PATHS")
            .output()
            .expect("relaxc run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        for family in families {
            let line = err.lines().find(|l| l.starts_with("relaxc kernels: ") && l.contains(family));
            assert!(line.is_some(), "{name}: no path named for {family:?}:\n{err}");
        }
    }
}
