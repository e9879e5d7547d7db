//! The runtime functions models call by name (tvm.contrib.sort.*, relax.run.*), the registry a
//! host reaches them through, and the thread pool of parallel kernels: results, printed text
//! and error texts as TVM's.

mod common;

use std::process::Command;

use relaxc::abi::{Any, DLDataType};
use relaxc::codegen::ExecMode;
use relaxc::host::{HostError, HostTensor, Input, Model, npz};

/// A model with every runtime function linked in (its own program uses none of them).
fn model(mode: ExecMode) -> Model {
    let fixture = common::fixtures_dir().join("mlp_static");
    let options = relaxc::compile::Options { all_runtime_functions: true, ..relaxc::compile::Options::mode(mode) };
    let tag = format!("all-runtime.{}", common::mode_name(mode));
    let so = common::build_with("mlp_static", &fixture.join("m.tar"), &options, &tag).expect("build");
    Model::load(&so).expect("load")
}

fn str_any(s: &'static std::ffi::CStr) -> Any {
    Any { type_index: 8, zero_padding: 0, payload: s.as_ptr() as u64 } // RawStr
}

fn f32_tensor(shape: Vec<i64>, values: &[f32]) -> Input {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Input::Tensor(HostTensor::new(DLDataType { code: 2, bits: 32, lanes: 1 }, shape, &bytes))
}

fn typed_tensor(code: u8, bits: u8, shape: Vec<i64>) -> Input {
    let n: i64 = shape.iter().product();
    Input::Tensor(HostTensor::new(
        DLDataType { code, bits, lanes: 1 },
        shape,
        &vec![0u8; n as usize * bits as usize / 8],
    ))
}

/// Calls a runtime function; tensors come first (as DLTensor*), then the extra values.
fn call(model: &Model, name: &str, tensors: &[Input], extra: &[Any]) -> Result<(), HostError> {
    let f = model.function(name)?;
    let prepared = model.prepare(tensors)?;
    let mut args = prepared.values().to_vec();
    args.extend_from_slice(extra);
    model.call_function(&f, &args).map(drop)
}

fn expect_error(result: Result<(), HostError>, kind: &str, message: &str) {
    match result {
        Err(HostError::Call { kind: k, message: m }) => {
            assert_eq!((k.as_str(), m.as_str()), (kind, message));
        }
        Err(e) => panic!("expected {kind}: {message}, got {e}"),
        Ok(()) => panic!("expected {kind}: {message}, but the call succeeded"),
    }
}

#[test]
fn tensors_render_as_numpy_prints_them() {
    let model = model(ExecMode::Bytecode);
    let dir = common::root().join("fixtures/render");
    let inputs = npz::read_inputs(&dir.join("cases.npz")).expect("cases");
    let expected = std::fs::read_to_string(dir.join("expected.txt")).expect("expected.txt");
    let expected: Vec<&str> = expected.split("\n\u{1e}\n").filter(|s| !s.is_empty()).collect();
    assert_eq!(inputs.len(), expected.len());
    let mut wrong = Vec::new();
    for (i, (input, want)) in inputs.iter().zip(&expected).enumerate() {
        let result = call(&model, "relax.run.assert_op", std::slice::from_ref(input), &[]);
        // assert_op(False, "{}", x) fails with x rendered as its message; the tensor goes last.
        let f = model.function("relax.run.assert_op").expect("assert_op");
        let prepared = model.prepare(std::slice::from_ref(input)).expect("prepare");
        let args = [Any { type_index: 2, zero_padding: 0, payload: 0 }, str_any(c"{}"), prepared.values()[0]];
        drop(result);
        match model.call_function(&f, &args) {
            Err(HostError::Call { kind, message }) if kind == "AssertionError" => {
                if message != *want {
                    wrong.push(format!("case {i}:\n--- numpy\n{want}\n--- relaxc\n{message}"));
                }
            }
            other => panic!("case {i}: expected an AssertionError, got {:?}", other.map(|_| ())),
        }
    }
    assert!(wrong.is_empty(), "{} of {} renderings differ:\n{}", wrong.len(), expected.len(), wrong.join("\n"));
}

#[test]
fn printed_text_is_tvms_in_both_modes() {
    let fixture = common::fixtures_dir().join("print_assert");
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let so = common::build("print_assert", &fixture.join("m.tar"), mode).expect("build");
        for case in ["holds", "small"] {
            let out = Command::new(env!("CARGO_BIN_EXE_relaxc"))
                .arg("run")
                .arg(&so)
                .arg("--inputs")
                .arg(fixture.join(format!("ok_{case}.in.npz")))
                .output()
                .expect("relaxc run");
            assert!(out.status.success(), "{case}: {}", String::from_utf8_lossy(&out.stderr));
            let want = std::fs::read_to_string(fixture.join(format!("ok_{case}.stdout.txt"))).expect("stdout.txt");
            assert_eq!(String::from_utf8_lossy(&out.stderr), want, "{case} ({})", common::mode_name(mode));
        }
    }
}

#[test]
fn sort_functions_reject_bad_arguments_with_tvms_text() {
    let model = model(ExecMode::Bytecode);
    let x = || f32_tensor(vec![2, 3], &[3.0, 1.0, 2.0, 0.0, 5.0, 5.0]);
    let o = || typed_tensor(2, 32, vec![2, 3]);
    let oi = || typed_tensor(0, 32, vec![2, 3]);
    let t = Any { type_index: 2, zero_padding: 0, payload: 1 };
    expect_error(
        call(&model, "tvm.contrib.sort.sort", &[x(), o()], &[Any::int(5), t]),
        "InternalError",
        "Check failed: axis < input->ndim (5 vs. 2) : Axis out of boundary for input ndim 2",
    );
    // TVM crashes here (it reads before the input); relaxc says what is wrong.
    expect_error(
        call(&model, "tvm.contrib.sort.sort", &[x(), o()], &[Any::int(-3), t]),
        "InternalError",
        "Check failed: axis >= 0 (-1 vs. 0) : Axis out of boundary for input ndim 2",
    );
    expect_error(
        call(&model, "tvm.contrib.sort.sort", &[x(), oi()], &[Any::int(1), t]),
        "InternalError",
        "Check failed: data_dtype == out_dtype (float32 vs. int32) : ",
    );
    expect_error(
        call(&model, "tvm.contrib.sort.sort", &[o()], &[Any::int(1), Any::int(1), t]),
        "TypeError",
        "Cannot convert from type `int` to `DLTensor*`",
    );
    expect_error(
        call(&model, "tvm.contrib.sort.sort", &[x(), o()], &[str_any(c"a"), t]),
        "TypeError",
        "Cannot convert from type `const char*` to `int`",
    );
    expect_error(
        call(&model, "tvm.contrib.sort.sort", &[x(), o()], &[]),
        "TypeError",
        "Cannot convert from type `None` to `int`",
    );
    let i8 = || typed_tensor(0, 8, vec![2, 3]);
    expect_error(
        call(&model, "tvm.contrib.sort.sort", &[i8(), i8()], &[Any::int(1), t]),
        "InternalError",
        "Unsupported input dtype: int8",
    );
    expect_error(
        call(&model, "tvm.contrib.sort.argsort", &[x(), i8()], &[Any::int(1), t]),
        "InternalError",
        "Unsupported output dtype: int8",
    );
    expect_error(
        call(&model, "tvm.contrib.sort.topk", &[x(), o(), oi()], &[Any::int(2), Any::int(1), str_any(c"bad"), t]),
        "InternalError",
        "Unsupported ret type: bad",
    );
    expect_error(
        call(&model, "tvm.contrib.sort.topk", &[x(), o(), oi()], &[Any::int(2), Any::int(7), str_any(c"both"), t]),
        "InternalError",
        "Check failed: (axis >= 0 && axis < input->ndim) is false: Axis out of boundary for input ndim 2",
    );
    expect_error(
        call(
            &model,
            "tvm.contrib.sort.topk",
            &[x(), o(), oi()],
            &[Any::int(2), Any::int(1), str_any(c"both"), Any::float(1.5)],
        ),
        "TypeError",
        "Cannot convert from type `float` to `bool`",
    );
}

#[test]
fn relax_run_functions_reject_bad_arguments_with_tvms_text() {
    let model = model(ExecMode::Bytecode);
    let scalar_f32 = || f32_tensor(vec![], &[1.0]);
    let f = Any { type_index: 2, zero_padding: 0, payload: 0 };
    expect_error(
        call(&model, "relax.run.assert_op", &[scalar_f32()], &[str_any(c"x")]),
        "ValueError",
        "The condition must be a bool scalar, but given a float32 tensor",
    );
    let bools = Input::Tensor(HostTensor::new(DLDataType { code: 6, bits: 8, lanes: 1 }, vec![2], &[1, 0]));
    expect_error(
        call(&model, "relax.run.assert_op", &[bools], &[str_any(c"x")]),
        "ValueError",
        "The condition must be a scalar, but it has a shape of (2,)",
    );
    expect_error(call(&model, "relax.run.assert_op", &[], &[f, str_any(c"")]), "AssertionError", "Assertion Failed");
    expect_error(
        call(&model, "relax.run.assert_op", &[], &[f, Any::int(3)]),
        "ValueError",
        "The format string argument to assert must be a string, given <class 'int'>)",
    );
    expect_error(
        call(&model, "relax.run.assert_op", &[], &[str_any(c"s"), str_any(c"")]),
        "ValueError",
        "The condition for relax assert must be a bool, int, or Tensor, but received a <class 'str'>.",
    );
    expect_error(
        call(&model, "relax.run.assert_op", &[], &[f, str_any(c"{} {}"), Any::int(1)]),
        "IndexError",
        "Replacement index 1 out of range for positional args tuple",
    );
    expect_error(
        call(&model, "relax.run.assert_op", &[], &[f]),
        "TypeError",
        "relax_assert_op() missing 1 required positional argument: 'format_str'",
    );
    expect_error(
        call(&model, "relax.run.shape_to_tensor", &[], &[Any::int(3)]),
        "TypeError",
        "'int' object is not iterable",
    );
    expect_error(
        call(&model, "relax.run.nonzero", &[], &[Any::int(3)]),
        "AttributeError",
        "'int' object has no attribute 'numpy'",
    );
    expect_error(
        call(&model, "relax.run.unique", &[scalar_f32()], &[]),
        "TypeError",
        "numpy_unique() missing 4 required positional arguments: 'sorted', 'return_index', 'return_inverse', and 'return_counts'",
    );
    expect_error(
        call(&model, "relax.run.print", &[], &[Any::int(3)]),
        "AttributeError",
        "'int' object has no attribute 'format'",
    );
    expect_error(
        call(&model, "relax.run.print", &[], &[str_any(c"{}")]),
        "IndexError",
        "Replacement index 0 out of range for positional args tuple",
    );
    expect_error(
        call(&model, "vm.builtin.nope", &[], &[]),
        "ValueError",
        "Function vm.builtin.nope is not registered in this library",
    );
}

unsafe extern "C" fn add_offset(self_: *mut std::ffi::c_void, args: *const Any, n: i32, result: *mut Any) -> i32 {
    // SAFETY: the library passes our registration's self and n valid arguments.
    let (offset, args) = unsafe { (*(self_ as *const i64), std::slice::from_raw_parts(args, n as usize)) };
    // SAFETY: result is a valid out-slot.
    unsafe { *result = Any::int(args[0].payload as i64 + offset) };
    0
}

#[test]
fn a_host_registers_functions_and_finds_them_by_name() {
    let model = model(ExecMode::Bytecode);
    static TEN: i64 = 10;
    static HUNDRED: i64 = 100;
    let ten = &TEN as *const i64 as *mut std::ffi::c_void;
    let hundred = &HUNDRED as *const i64 as *mut std::ffi::c_void;
    // SAFETY: add_offset is a safe call; the statics live for ever.
    unsafe { model.register_function("test.add_offset", add_offset, ten, false) }.expect("register");
    let f = model.function("test.add_offset").expect("lookup");
    let r = model.call_function(&f, &[Any::int(5)]).expect("call");
    assert_eq!(r.to_output(), relaxc::host::Output::Int(15));
    // SAFETY: as above.
    let again = unsafe { model.register_function("test.add_offset", add_offset, hundred, false) };
    assert!(
        matches!(again, Err(HostError::Call { ref message, .. }) if message == "Global Function `test.add_offset` is already registered")
    );
    // SAFETY: as above.
    let builtin = unsafe { model.register_function("vm.builtin.copy", add_offset, ten, false) };
    assert!(builtin.is_err(), "a runtime function's name is taken");
    // SAFETY: as above.
    unsafe { model.register_function("test.add_offset", add_offset, hundred, true) }.expect("override");
    let g = model.function("test.add_offset").expect("lookup");
    assert_eq!(model.call_function(&g, &[Any::int(5)]).expect("call").to_output(), relaxc::host::Output::Int(105));
    // The function looked up before the override still works, as a kernel's cached handle would.
    assert_eq!(model.call_function(&f, &[Any::int(5)]).expect("call").to_output(), relaxc::host::Output::Int(15));
}

fn run_with_threads(so: &std::path::Path, expect: &std::path::Path, inputs: &std::path::Path, threads: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_relaxc"))
        .env("TVM_NUM_THREADS", threads)
        .env_remove("OMP_NUM_THREADS")
        .arg("run")
        .arg(so)
        .arg("--inputs")
        .arg(inputs)
        .arg("--expect")
        .arg(expect)
        .output()
        .expect("relaxc run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "TVM_NUM_THREADS={threads}: {stderr}");
    stderr
}

#[test]
fn parallel_kernels_give_tvms_bits_at_any_thread_count() {
    let fixture = common::fixtures_dir().join("parallel_matmul");
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let so = common::build("parallel_matmul", &fixture.join("m.tar"), mode).expect("build");
        let (inputs, expect) = (fixture.join("ok_basic.in.npz"), fixture.join("ok_basic.out.npz"));
        for threads in ["1", "2", "3", "8"] {
            let stderr = run_with_threads(&so, &expect, &inputs, threads);
            assert!(!stderr.contains("warning"), "TVM_NUM_THREADS={threads}: {stderr}");
        }
        for bad in ["0", "-2", "two", "", "3x"] {
            let stderr = run_with_threads(&so, &expect, &inputs, bad);
            let want = format!("warning: TVM_NUM_THREADS=\"{bad}\" is not a positive number of threads; using");
            assert!(stderr.contains(&want), "TVM_NUM_THREADS={bad:?} should warn; stderr: {stderr}");
        }
    }
}

#[test]
fn parallel_kernels_run_from_many_threads_and_models_at_once() {
    let fixture = common::fixtures_dir().join("parallel_matmul");
    let inputs = npz::read_inputs(&fixture.join("ok_basic.in.npz")).expect("inputs");
    let models: Vec<Model> = [ExecMode::Bytecode, ExecMode::Compiled]
        .into_iter()
        .map(|mode| {
            let so = common::build("parallel_matmul", &fixture.join("m.tar"), mode).expect("build");
            Model::load(&so).expect("load")
        })
        .collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (model, inputs, fixture) = (&models[t % 2], &inputs, &fixture);
            s.spawn(move || {
                let mut vm = model.vm().expect("vm");
                let main = model.find("main").expect("main");
                for _ in 0..20 {
                    let out = vm.call(main, inputs).expect("call").to_output().flatten();
                    common::compare_outputs(&out, &fixture.join("ok_basic.out.npz")).expect("TVM's bits");
                }
            });
        }
    });
}

/// `relaxc run --bench` on `so` with the trials reported; the run's stderr.
fn bench_reporting_trials(so: &std::path::Path, fixture: &std::path::Path, trials: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_relaxc"))
        .env("TVM_NUM_THREADS", "2")
        .env("RELAXC_THREAD_TRIALS", trials)
        .arg("run")
        .arg(so)
        .arg("--inputs")
        .arg(fixture.join("ok_basic.in.npz"))
        .arg("--expect")
        .arg(fixture.join("ok_basic.out.npz"))
        .args(["--bench", "30"])
        .output()
        .expect("relaxc run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "RELAXC_THREAD_TRIALS={trials}: {stderr}");
    stderr
}

#[test]
fn a_function_chooses_pool_or_alone_once_with_the_same_bits() {
    let fixture = common::fixtures_dir().join("parallel_matmul");
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let so = common::build("parallel_matmul", &fixture.join("m.tar"), mode).expect("build");
        // Over 30 calls of one function with one set of shapes, exactly one choice is made.
        let stderr = bench_reporting_trials(&so, &fixture, "report");
        let choices: Vec<&str> = stderr.lines().filter(|l| l.starts_with("relaxc runtime: main: ")).collect();
        assert_eq!(choices.len(), 1, "{mode:?}: one choice for main expected; stderr: {stderr}");
        let choice = choices[0];
        assert!(
            choice.contains(": alone (best of 4 calls:")
                || choice.contains(": on the pool (best of 4 calls:")
                || choice.contains(": on the pool (a call took"),
            "{mode:?}: {choice}"
        );
        assert!(bench_reporting_trials(&so, &fixture, "0").trim().is_empty(), "{mode:?}: trials off report nothing");
        let stderr = bench_reporting_trials(&so, &fixture, "sometimes");
        assert!(
            stderr.contains("warning: RELAXC_THREAD_TRIALS=\"sometimes\" is not 0, 1 or report; using 1"),
            "{mode:?}: {stderr}"
        );

        // Every call, through the trials (alone and on the pool) and after them, gives TVM's bits.
        let model = Model::load(&so).expect("load");
        let mut vm = model.vm().expect("vm");
        let main = model.find("main").expect("main");
        let inputs = npz::read_inputs(&fixture.join("ok_basic.in.npz")).expect("inputs");
        for call in 0..40 {
            let out = vm.call(main, &inputs).expect("call").to_output().flatten();
            common::compare_outputs(&out, &fixture.join("ok_basic.out.npz"))
                .unwrap_or_else(|e| panic!("{mode:?}: call {call}: {e}"));
        }
    }
}
