//! Compile+link time of chain_N (N tiny adds) in both modes, and the per-call time of what was
//! built. chain_100 and chain_1000 are TVM's exports; chain_10000 is the same program shape
//! (TVM's planned storage alternating between two buffers, one shared kernel) built with
//! relaxc's ExecBuilder and linked with chain_1000's lib0.o, since making it with TVM would take
//! minutes of LLVM and megabytes of fixture. Run: `cargo bench --bench compile_time`.

use std::path::Path;
use std::time::Instant;

use relaxc::abi::DLDataType;
use relaxc::codegen::ExecMode;
use relaxc::compile::{Options, Program, emit, load_tvm_export};
use relaxc::host::{HostTensor, Input, Model};
use relaxc::vm::{Arg, Constant, DType, ExecBuilder, Instr, VM_REG, VOID_REG};

fn chain(n: usize, kernels: Vec<relaxc::kernel_object::KernelObject>) -> Program {
    let mut b = ExecBuilder::new();
    let f32c = b.constant(Constant::DataType(DType::F32));
    let ctx = b.constant(Constant::Str(
        "ErrorContext(fn=main, loc=param[0], param=x, annotation=R.Tensor((1,), dtype=\"float32\")) ".into(),
    ));
    let bytes = b.constant(Constant::Shape(vec![4]));
    let u8c = b.constant(Constant::DataType(DType::U8));
    let global = b.constant(Constant::Str("global".into()));
    let shape = b.constant(Constant::Shape(vec![1]));
    b.begin_function("main", &["x"]);
    let check = b.packed("vm.builtin.check_tensor_info");
    let matchs = b.packed("vm.builtin.match_shape");
    let storage = b.packed("vm.builtin.alloc_storage");
    let tensor = b.packed("vm.builtin.alloc_tensor");
    let add = b.packed("add1");
    let null = b.packed("vm.builtin.null_value");
    b.call(VOID_REG, check, vec![Arg::Reg(0), Arg::Imm(1), Arg::Const(f32c), Arg::Const(ctx)]);
    b.call(
        VOID_REG,
        matchs,
        vec![Arg::Reg(0), Arg::Reg(VOID_REG), Arg::Imm(1), Arg::Imm(0), Arg::Imm(1), Arg::Const(ctx)],
    );
    let stores = [1i64, 2];
    for s in stores {
        let args = vec![Arg::Reg(VM_REG), Arg::Const(bytes), Arg::Imm(0), Arg::Const(u8c), Arg::Const(global)];
        b.call(s, storage, args);
    }
    let mut prev = 0i64;
    let mut next = 3i64;
    for i in 0..n {
        let t = next;
        next += 1;
        b.call(t, tensor, vec![Arg::Reg(stores[i % 2]), Arg::Imm(0), Arg::Const(shape), Arg::Const(f32c)]);
        b.call(VOID_REG, add, vec![Arg::Reg(prev), Arg::Reg(0), Arg::Reg(t)]);
        if prev != 0 {
            b.call(prev, null, vec![]);
        }
        prev = t;
    }
    b.emit(Instr::Ret { result: prev });
    b.end_function(next);
    let exec = relaxc::vm::Verified::new(b.build()).expect("valid chain");
    Program { exec, kernels, shape_funcs: Vec::new(), cuda: Vec::new() }
}

/// Median microseconds per call over 200 calls.
fn time_calls(model: &Model, x: &[Input]) -> f64 {
    let mut vm = model.vm().expect("vm");
    let f = model.find("main").expect("main");
    let args = vm.prepare(x).expect("args");
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        drop(vm.call_prepared(f, &args).expect("call"));
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    median(times)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// chain_1000 compiled-mode compile+link for aarch64 beside the same for the host: the program
/// built with ExecBuilder over each CPU's chain_100 kernels (TVM's exports for both).
fn cross_build_times(root: &Path, dir: &Path) {
    let target = relaxc::target::Target::parse("aarch64-unknown-linux-gnu").expect("target");
    if relaxc::target::toolchain(&target).is_err() {
        println!("\n(aarch64 build time skipped: no aarch64 toolchain; see README, Building for a board)");
        return;
    }
    let mut rows = Vec::new();
    for (label, tar, t) in [
        ("host", root.join("fixtures/tvm/chain_100/m.tar"), relaxc::target::Target::host()),
        ("aarch64", root.join("fixtures/tvm-cross/aarch64/chain_100/m.tar"), target.clone()),
    ] {
        let kernels = relaxc::compile::load_tvm_export_for(&tar, &t).expect("chain_100 export").kernels;
        let program = chain(1000, kernels);
        let mut options = Options::mode(ExecMode::Compiled);
        options.target = t.clone();
        let so = dir.join(format!("cross.{label}.so"));
        // once to fill the shim cache, then five timed builds
        relaxc::link::link_shared_for(&emit(&program, &options).expect("emit").link_inputs(&program.kernels), &so, &t)
            .expect("link");
        let mut total = Vec::new();
        for _ in 0..5 {
            let t0 = Instant::now();
            let object = emit(&program, &options).expect("emit");
            relaxc::link::link_shared_for(&object.link_inputs(&program.kernels), &so, &t).expect("link");
            total.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        rows.push((label, median(total)));
    }
    println!("\nchain_1000 (ExecBuilder over chain_100's kernels), compiled mode, compile+link (ms), median of 5:");
    for (label, ms) in &rows {
        println!("  {label}: {ms:.1}");
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let base = load_tvm_export(&root.join("fixtures/tvm/chain_1000/m.tar")).expect("chain_1000 fixture");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut specialization: Option<(f64, f64, f64)> = None;
    println!("| model | mode | codegen (ms) | link (ms) | compile+link (ms) | per call (us) |");
    println!("|---|---|---|---|---|---|");
    for (label, program) in [
        ("chain_100 (TVM export)", load_tvm_export(&root.join("fixtures/tvm/chain_100/m.tar")).expect("chain_100")),
        ("chain_1000 (TVM export)", load_tvm_export(&root.join("fixtures/tvm/chain_1000/m.tar")).expect("chain_1000")),
        ("chain_10000 (built)", chain(10000, base.kernels.clone())),
    ] {
        for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
            let so = dir.path().join("m.so");
            let (mut codegen, mut link, mut total) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..5 {
                let t0 = Instant::now();
                let object = emit(&program, &Options::mode(mode)).expect("emit");
                let t1 = Instant::now();
                relaxc::link::link_shared(&object.link_inputs(&program.kernels), &so).expect("link");
                let t2 = Instant::now();
                codegen.push((t1 - t0).as_secs_f64() * 1e3);
                link.push((t2 - t1).as_secs_f64() * 1e3);
                total.push((t2 - t0).as_secs_f64() * 1e3);
            }
            let model = Model::load(&so).expect("load");
            let x = [Input::Tensor(HostTensor::new(
                DLDataType { code: 2, bits: 32, lanes: 1 },
                vec![1],
                &0.5f32.to_le_bytes(),
            ))];
            let per_call = time_calls(&model, &x);
            let mode_name = if mode == ExecMode::Bytecode { "bytecode" } else { "compiled" };
            if mode == ExecMode::Compiled && label.starts_with("chain_1000 ") {
                // The same build without each of compiled mode's specializations, to show their worth.
                let variant = |inline_builtins: bool, stack_tensors: bool| {
                    let mut o = Options::mode(mode);
                    o.native.inline_builtins = inline_builtins;
                    o.native.stack_tensors = stack_tensors;
                    let object = emit(&program, &o).expect("emit");
                    let path = dir.path().join(format!("variant{}{}.so", inline_builtins as u8, stack_tensors as u8));
                    relaxc::link::link_shared(&object.link_inputs(&program.kernels), &path).expect("link");
                    time_calls(&Model::load(&path).expect("load"), &x)
                };
                specialization = Some((variant(false, false), variant(true, false), per_call));
            }
            println!(
                "| {label} | {mode_name} | {:.1} | {:.1} | {:.1} | {:.2} |",
                median(codegen),
                median(link),
                median(total),
                per_call
            );
        }
    }
    cross_build_times(root, dir.path());
    if let Some((plain, inlined, all)) = specialization {
        println!(
            "\nchain_1000 compiled, per call: {plain:.2} us calling every builtin; {inlined:.2} us with null_value and \
             copy inlined ({:.2}x); {all:.2} us with stack tensors as well ({:.2}x of the previous)",
            inlined / plain,
            all / inlined
        );
    }
}
