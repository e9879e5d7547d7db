//! The chain benchmark: chain_N is N tiny adds on 1-element tensors through one shared kernel,
//! so per-call time is dispatch and nothing else. It prints, in one run, on this machine:
//!
//! - per-call medians for chain_100, chain_1000 and chain_10000: the floor (bench/floor.c: the
//!   chain's N kernel calls from a loop through the same safe-call ABI on tensors allocated
//!   once, no VM; and the same calls written out in a straight line, a call site per operator),
//!   relaxc compiled, relaxc bytecode, and TVM 0.27's bytecode and compiled VM
//!   when `import tvm` works (bench/tvm_chain.py), in interleaved rounds, with the ratios. The
//!   floor is loaded into this process and takes turns with relaxc's two modes a block of chains
//!   at a time, so that all three are timed on the same machine state (bench/floor.c says why).
//!   The ratios among them are paired: the median, over every turn, of the ratio of the two
//!   runtimes' median chains in that turn, so that the machine's drift from turn to turn cancels;
//! - compile+link time per mode up to chain_100000, with TVM's own build times beside them;
//! - bytes of native code per operator in compiled mode;
//! - chain_1000's build for aarch64 beside the host's, and what each of compiled mode's
//!   specializations is worth.
//!
//! chain_100 and chain_1000 are TVM's exports (fixtures); longer chains are the same program
//! shape (TVM's planned storage alternating between two buffers) built with relaxc's ExecBuilder
//! over chain_1000's lib0.o, since TVM would take minutes of LLVM to make them.
//! Run: `cargo bench --bench chain` (RELAXC_BENCH_ROUNDS, default 5).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use relaxc::abi::DLDataType;
use relaxc::codegen::ExecMode;
use relaxc::compile::{Options, Program, emit, load_tvm_export};
use relaxc::host::{HostTensor, Input, Model};
use relaxc::kernel_object::KernelObject;
use relaxc::vm::{Arg, Constant, DType, ExecBuilder, Instr, VM_REG, VOID_REG};

/// chain_n built with ExecBuilder over `kernels` (which define `add1`).
fn chain(n: usize, kernels: Vec<KernelObject>) -> Program {
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn rounds() -> usize {
    std::env::var("RELAXC_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).filter(|&r| r > 0).unwrap_or(5)
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model =
        cpuinfo.lines().find_map(|l| l.strip_prefix("model name")).map(|m| m.trim_start_matches([' ', '\t', ':']));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{}, {cores} cores", model.unwrap_or(std::env::consts::ARCH))
}

/// A model built once, with its build times and native code size.
struct Built {
    so: PathBuf,
    codegen_ms: f64,
    link_ms: f64,
    total_ms: f64,
    code_bytes: u64,
}

/// Builds `program` in `mode` `runs` times (medians), the last build kept at `so`.
fn build(program: &Program, options: &Options, so: &Path, runs: usize) -> Built {
    let (mut codegen, mut link, mut total) = (Vec::new(), Vec::new(), Vec::new());
    let mut code_bytes = 0;
    for _ in 0..runs {
        let t0 = Instant::now();
        let object = emit(program, options).expect("emit");
        let t1 = Instant::now();
        relaxc::link::link_shared(&object.link_inputs(&program.kernels), so).expect("link");
        let t2 = Instant::now();
        codegen.push((t1 - t0).as_secs_f64() * 1e3);
        link.push((t2 - t1).as_secs_f64() * 1e3);
        total.push((t2 - t0).as_secs_f64() * 1e3);
        code_bytes = native_code_bytes(&object.bytes);
    }
    Built {
        so: so.to_path_buf(),
        codegen_ms: median(codegen),
        link_ms: median(link),
        total_ms: median(total),
        code_bytes,
    }
}

/// Bytes of compiled Relax functions (`__vmtir__*`) in a model object.
fn native_code_bytes(object_bytes: &[u8]) -> u64 {
    use object::{Object, ObjectSymbol};
    let file = object::File::parse(object_bytes).expect("model object");
    file.symbols().filter(|s| s.name().is_ok_and(|n| n.starts_with("__vmtir__"))).map(|s| s.size()).sum()
}

/// Median microseconds per call of `main` over `calls` calls.
fn time_calls(model: &Model, calls: usize) -> f64 {
    let x =
        [Input::Tensor(HostTensor::new(DLDataType { code: 2, bits: 32, lanes: 1 }, vec![1], &0.5f32.to_le_bytes()))];
    let mut vm = model.vm().expect("vm");
    let f = model.find("main").expect("main");
    let args = vm.prepare(&x).expect("args");
    drop(vm.call_prepared(f, &args).expect("warm-up call"));
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        drop(vm.call_prepared(f, &args).expect("call"));
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    median(times)
}

/// The chain's N calls of `add1` in a straight line, as bench/floor.c declares `floor_chain`:
/// each call site as small as C makes it (a failure jumps to one shared return).
fn floor_calls_source(n: usize) -> String {
    let mut c = String::from(
        "/* Generated by benches/chain.rs for bench/floor.c. */\n#include \"rvm_kernel.h\"\n\
         __attribute__((visibility(\"hidden\"))) int __tvm_ffi_add1(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result);\n",
    );
    c += &format!("const long floor_chain_length = {n};\n");
    c += "int floor_chain(const TVMFFIAny *first, const TVMFFIAny *into_b, const TVMFFIAny *into_a, TVMFFIAny *result) {\n";
    c += "  if (__tvm_ffi_add1(0, first, 3, result)) goto fail;\n";
    for i in 1..n {
        let args = if i % 2 == 1 { "into_b" } else { "into_a" };
        c += &format!("  if (__tvm_ffi_add1(0, {args}, 3, result)) goto fail;\n");
    }
    c += "  return 0;\nfail:\n  return 1;\n}\n";
    c
}

/// bench/floor.c for chain_n as a shared library, built against `lib0.o`, its generated calls and
/// the runtime shim (for the symbols TVM's kernels import, kept inside the library). `shift`
/// bytes (a multiple of 16) of padding go before lib0.o, moving the kernel by that much.
fn build_floor(root: &Path, dir: &Path, kernels: &[KernelObject], n: usize, shift: usize) -> PathBuf {
    let lib0 = dir.join("lib0.o");
    std::fs::write(&lib0, &kernels[0].bytes).expect("write lib0.o");
    let shim = dir.join("librvm_shim.a");
    std::fs::write(&shim, relaxc::target::shim::HOST_SHIM_ARCHIVE).expect("write the shim");
    let calls = dir.join(format!("floor_chain_{n}.c"));
    std::fs::write(&calls, floor_calls_source(n)).expect("write the floor's calls");
    let lib = dir.join(format!("libfloor_{n}_{shift}.so"));
    // The kernel first, as relaxc links a model's kernels: it lands at the same address in both.
    let mut inputs = Vec::new();
    if shift > 0 {
        // A function of `shift` bytes (its nops and its ret), 16-byte aligned like lib0.o's text.
        let pad = dir.join(format!("floor_shift_{shift}.c"));
        std::fs::write(&pad, shift_source(shift)).expect("write the floor's padding");
        inputs.push(pad);
    }
    inputs.extend([lib0, root.join("bench/floor.c"), calls]);
    // The floor's loop starts a 64-byte line, as compiled mode's rolled loops do (bench/floor.c).
    let status = Command::new(relaxc::link::linker())
        .args(["-O2", "-falign-loops=64", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"])
        .args(["-fvisibility=hidden", "-I"])
        .arg(root.join("runtime-shim/include"))
        .args(&inputs)
        .arg(&shim)
        .args(["-Wl,--exclude-libs,ALL", "-lm", "-ldl", "-lpthread", "-o"])
        .arg(&lib)
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "bench/floor.c does not build");
    lib
}

/// The floor of one chain_n, loaded into this process (bench/floor.c).
struct Floor {
    n: usize,
    loop_chain: unsafe extern "C" fn(std::ffi::c_long) -> i32,
    straight: unsafe extern "C" fn() -> i32,
    last: unsafe extern "C" fn(std::ffi::c_long) -> f32,
    _lib: libloading::Library,
}

impl Floor {
    fn load(lib: &Path, n: usize) -> Floor {
        // SAFETY: the library is bench/floor.c, built above; its functions have these signatures.
        unsafe {
            let library = libloading::Library::new(lib).expect("load the floor");
            let setup =
                *library.get::<unsafe extern "C" fn() -> std::ffi::c_long>(b"floor_setup").expect("floor_setup");
            assert_eq!(setup() as usize, n, "the floor's straight line is chain_{n}'s");
            let loop_chain = *library.get(b"floor_loop").expect("floor_loop");
            let straight = *library.get(b"floor_straight").expect("floor_straight");
            let last = *library.get(b"floor_last").expect("floor_last");
            Floor { n, loop_chain, straight, last, _lib: library }
        }
    }

    /// Runs one chain, from the loop or the straight line; returns the kernel's nonzero code on
    /// failure.
    fn run(&self, straight: bool) -> i32 {
        // SAFETY: set up in `load`; the functions only touch the library's own data.
        unsafe { if straight { (self.straight)() } else { (self.loop_chain)(self.n as std::ffi::c_long) } }
    }

    /// Panics unless the last chain computed 0.5 * (n + 1), its kernel calls all succeeding.
    fn check(&self, rc: i32) {
        // SAFETY: as in `run`.
        let last = unsafe { (self.last)(self.n as std::ffi::c_long) };
        assert!(rc == 0 && last == 0.5 * (self.n + 1) as f32, "floor of chain_{}: rc {rc}, last value {last}", self.n);
    }
}

/// Chains per block when the runtimes take turns: enough for each to run from warm caches
/// (the first chain of a block pays for the others' code), few enough that every runtime sees the
/// machine of the same few milliseconds.
const BLOCK: usize = 16;

/// Per-chain times (us) of the loop floor, the straight-line floor, and each model (in that
/// order), over `calls` chains apiece, taken in turns of BLOCK chains: the medians, and the mean
/// of each turn.
fn time_side_by_side(floor: &Floor, models: &[&Model], calls: usize) -> (Vec<f64>, Vec<Vec<f64>>) {
    let x =
        [Input::Tensor(HostTensor::new(DLDataType { code: 2, bits: 32, lanes: 1 }, vec![1], &0.5f32.to_le_bytes()))];
    let mut vms: Vec<_> = models.iter().map(|m| m.vm().expect("vm")).collect();
    let fs: Vec<i32> = models.iter().map(|m| m.find("main").expect("main")).collect();
    let args: Vec<_> = vms.iter().map(|vm| vm.prepare(&x).expect("args")).collect();
    let mut times = vec![Vec::with_capacity(calls); 2 + models.len()];
    let mut turns = vec![Vec::new(); 2 + models.len()];
    let mut done = 0;
    while done < calls {
        let block = BLOCK.min(calls - done);
        for (who, samples) in times.iter_mut().enumerate() {
            if who < 2 {
                floor_turn(floor, who == 1, block, samples);
            } else {
                for _ in 0..block {
                    let t = Instant::now();
                    // The result's release counts: a caller pays for it on every call.
                    drop(vms[who - 2].call_prepared(fs[who - 2], &args[who - 2]).expect("call"));
                    samples.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            turns[who].push(median(samples[samples.len() - block..].to_vec()));
        }
        done += block;
    }
    (times.into_iter().map(median).collect(), turns)
}

/// Times `block` chains on the floor (its straight line when `straight`) into `samples`, in µs.
fn floor_turn(floor: &Floor, straight: bool, block: usize, samples: &mut Vec<f64>) {
    for _ in 0..block {
        let t = Instant::now();
        let rc = floor.run(straight);
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        floor.check(rc);
    }
}

/// TVM's side, when TVM is installed: a helper process that built its models and times them
/// one round per line we send.
struct Tvm {
    child: std::process::Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    build_s: serde_json::Value,
}

impl Tvm {
    fn start(root: &Path, sizes: &[usize]) -> Option<Tvm> {
        let probe = Command::new("python3").args(["-c", "import tvm"]).stderr(Stdio::null()).status();
        if !probe.is_ok_and(|s| s.success()) {
            println!("(TVM columns skipped: `import tvm` fails; pip install apache-tvm==0.27.0.post1)");
            return None;
        }
        eprintln!("building chain_N with TVM (its compiled mode takes LLVM a while)...");
        let mut child = Command::new("python3")
            .arg(root.join("bench/tvm_chain.py"))
            .args(sizes.iter().map(|n| n.to_string()))
            .args(["--compiled-max", "1000", "--number", "50"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let mut lines = BufReader::new(child.stdout.take()?).lines();
        let first: serde_json::Value = serde_json::from_str(&lines.next()?.ok()?).ok()?;
        Some(Tvm { child, lines, build_s: first["build_s"].clone() })
    }

    fn round(&mut self) -> serde_json::Value {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "round").expect("to TVM helper");
        stdin.flush().expect("flush");
        let line = self.lines.next().expect("TVM helper answers").expect("line");
        serde_json::from_str::<serde_json::Value>(&line).expect("json")["us"].clone()
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("temp dir");
    println!("machine: {}", machine());
    let chain_100 = load_tvm_export(&root.join("fixtures/tvm/chain_100/m.tar")).expect("chain_100");
    let chain_1000 = load_tvm_export(&root.join("fixtures/tvm/chain_1000/m.tar")).expect("chain_1000");
    let kernels = chain_1000.kernels.clone();
    let programs = [
        (100, chain_100),
        (1000, chain_1000),
        (10000, chain(10000, kernels.clone())),
        (100000, chain(100000, kernels.clone())),
    ];
    let timed_sizes = [100, 1000, 10000];
    let mut tvm = Tvm::start(root, &timed_sizes);

    // Builds, and bytes of code per operator.
    eprintln!("building...");
    let mut built = std::collections::BTreeMap::new();
    for (n, program) in &programs {
        for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
            let so = dir.path().join(format!("chain_{n}.{mode:?}.so"));
            let runs = if *n >= 100000 { 3 } else { 5 };
            built.insert((*n, mode), build(program, &Options::mode(mode), &so, runs));
        }
    }

    // Per-call times, in interleaved rounds.
    eprintln!("building the floors...");
    let shifts: std::collections::BTreeMap<usize, usize> = timed_sizes
        .iter()
        .map(|&n| (n, floor_shift(root, dir.path(), &kernels, n, &built[&(n, ExecMode::Compiled)].so)))
        .collect();
    let floors: std::collections::BTreeMap<usize, Floor> = timed_sizes
        .iter()
        .map(|&n| {
            let lib = build_floor(root, dir.path(), &kernels, n, shifts[&n]);
            let page_offset = |so: &Path| symbol_address(so, KERNEL) % PAGE;
            let at = page_offset(&built[&(n, ExecMode::Compiled)].so);
            assert_eq!(page_offset(&lib), at, "chain_{n}: the floor's kernel is not where relaxc's is");
            eprintln!("chain_{n}: add1 at page offset {at:#x}; the floor's moved {} bytes to match", shifts[&n]);
            (n, Floor::load(&lib, n))
        })
        .collect();
    let calls = |n: usize| (2_000_000 / n).clamp(100, 20000);
    let models: Vec<(usize, Model, Model)> = timed_sizes
        .iter()
        .map(|&n| {
            let load = |mode| Model::load(&built[&(n, mode)].so).expect("load");
            (n, load(ExecMode::Bytecode), load(ExecMode::Compiled))
        })
        .collect();
    let mut samples: std::collections::BTreeMap<(usize, &str), Vec<f64>> = Default::default();
    // Per-turn ratios of runtimes timed side by side, by (n, numerator, denominator).
    let mut paired: std::collections::BTreeMap<(usize, &str, &str), Vec<f64>> = Default::default();
    for round in 0..rounds() {
        eprintln!("round {}...", round + 1);
        for (n, bytecode, compiled) in &models {
            let (us, turns) = time_side_by_side(&floors[n], &[compiled, bytecode], calls(*n));
            let names = ["floor", "straight", "compiled", "bytecode"];
            for (what, us) in names.into_iter().zip(us) {
                samples.entry((*n, what)).or_default().push(us);
            }
            for (a, b) in PAIRED {
                let at = |w: &str| names.iter().position(|x| *x == w).expect("a timed runtime");
                let ratios = turns[at(a)].iter().zip(&turns[at(b)]).map(|(x, y)| x / y);
                paired.entry((*n, a, b)).or_default().extend(ratios);
            }
        }
        if let Some(t) = tvm.as_mut() {
            let us = t.round();
            for n in timed_sizes {
                for mode in ["bytecode", "compiled"] {
                    if let Some(v) = us[format!("{mode}/{n}")].as_f64() {
                        samples
                            .entry((n, if mode == "bytecode" { "tvm bytecode" } else { "tvm compiled" }))
                            .or_default()
                            .push(v);
                    }
                }
            }
        }
    }
    let result = |n: usize, what: &str| samples.get(&(n, what)).map(|v| median(v.clone()));
    let pair = |n: usize, a: &str, b: &str| paired.get(&(n, a, b)).map(|v| median(v.clone()));
    report_calls(&timed_sizes, &result, &pair);
    report_builds(&programs.iter().map(|(n, _)| *n).collect::<Vec<_>>(), &built, tvm.as_ref().map(|t| &t.build_s));
    report_targets(&result, &pair, &built, tvm.as_ref().map(|t| &t.build_s));
    cross_build_times(root, dir.path());
    specializations(&programs[1].1, dir.path());
    placements(root, dir.path(), &kernels, &floors[&1000], shifts[&1000]);
}

/// How far where the kernel lies moves chain_1000's times: the floor, and relaxc compiled, with
/// `add1` 16, 32 and 48 bytes further on (padding linked before lib0.o), each timed in turns with
/// the floor of the table (paired ratios). Neither side chooses where its kernel and loop fall, so
/// a compiled / floor ratio is only as exact as this spread.
fn placements(root: &Path, dir: &Path, kernels: &[KernelObject], floor: &Floor, floor_base: usize) {
    println!("\nchain_1000 with the kernel moved (paired ratios to the table's floor):");
    println!("| kernel moved by | floor | relaxc compiled |");
    println!("|---|---|---|");
    for shift in [0, 16, 32, 48] {
        let shifted_floor = Floor::load(&build_floor(root, dir, kernels, 1000, (floor_base + shift) % PAGE), 1000);
        let mut program = load_tvm_export(&root.join("fixtures/tvm/chain_1000/m.tar")).expect("chain_1000");
        if shift > 0 {
            let pad = KernelObject {
                name: format!("shift{shift}.o"),
                bytes: shift_object(dir, shift),
                kernels: Default::default(),
                scalar_results: true,
            };
            program.kernels.insert(0, pad);
        }
        let so = dir.join(format!("chain_1000_shift{shift}.so"));
        let compiled = Model::load(&build(&program, &Options::mode(ExecMode::Compiled), &so, 1).so).expect("load");
        let (mut floors, mut models) = (Vec::new(), Vec::new());
        for _ in 0..rounds() {
            let (_, turns) = time_side_by_side(floor, &[&compiled], 2000);
            models.extend(turns[2].iter().zip(&turns[0]).map(|(m, f)| m / f));
            let turn = |f: &Floor| {
                let mut us = Vec::with_capacity(BLOCK);
                floor_turn(f, false, BLOCK, &mut us);
                median(us)
            };
            for _ in 0..2000 / BLOCK {
                let base = turn(floor);
                floors.push(turn(&shifted_floor) / base);
            }
        }
        println!("| {shift} bytes | {:.3}x | {:.3}x |", median(floors), median(models));
    }
}

/// The kernel every chain calls.
const KERNEL: &str = "__tvm_ffi_add1";

/// Kernel placements repeat with the page: a kernel's alignment, and the bits of its address that
/// branch predictors index by, are those of its offset in a 4 KiB page.
const PAGE: usize = 4096;

/// The address of `symbol` in the shared library at `so`.
fn symbol_address(so: &Path, symbol: &str) -> usize {
    use object::{Object, ObjectSymbol};
    let bytes = std::fs::read(so).expect("read the library");
    let file = object::File::parse(&*bytes).expect("parse the library");
    let found =
        file.symbols().find(|s| s.name() == Ok(symbol)).unwrap_or_else(|| panic!("no {symbol} in {}", so.display()));
    found.address() as usize
}

/// The padding that puts the floor's kernel where chain_n's compiled model has it, modulo a page.
/// Where a kernel lies moved chain_1000 by up to 15% on Zen 3 (`placements`), for the floor and
/// for relaxc alike, so a floor with its kernel elsewhere measures the two placements as well as
/// the dispatch: a compiled / floor of 0.97x came from that.
fn floor_shift(root: &Path, dir: &Path, kernels: &[KernelObject], n: usize, compiled: &Path) -> usize {
    let unshifted = symbol_address(&build_floor(root, dir, kernels, n, 0), KERNEL);
    (symbol_address(compiled, KERNEL) + PAGE - unshifted % PAGE) % PAGE
}

/// The C source of `shift` bytes of code (nops and a ret; 16-byte aligned like lib0.o's text).
fn shift_source(shift: usize) -> String {
    format!("void floor_shift(void);\nvoid floor_shift(void) {{ __asm__ volatile(\".skip {}, 0x90\"); }}\n", shift - 1)
}

/// `shift_source` compiled to an object, for relaxc's link.
fn shift_object(dir: &Path, shift: usize) -> Vec<u8> {
    let source = dir.join(format!("shift{shift}.c"));
    std::fs::write(&source, shift_source(shift)).expect("write the padding");
    let object = dir.join(format!("shift{shift}.o"));
    let status = Command::new(relaxc::link::linker())
        .args(["-O2", "-fPIC", "-fno-asynchronous-unwind-tables", "-c"])
        .arg(&source)
        .arg("-o")
        .arg(&object)
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "the padding does not build");
    std::fs::read(&object).expect("read the padding")
}

/// The ratios taken turn by turn (numerator, denominator): runtimes timed side by side.
const PAIRED: [(&str, &str); 3] = [("compiled", "floor"), ("compiled", "straight"), ("bytecode", "floor")];

/// A paired ratio (see [`PAIRED`]), as a ratio is printed.
type Pair<'a> = &'a dyn Fn(usize, &str, &str) -> Option<f64>;

fn times(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.2}x"))
}

fn fmt(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.2}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    times(a.zip(b).map(|(a, b)| a / b))
}

fn report_calls(sizes: &[usize], result: &dyn Fn(usize, &str) -> Option<f64>, pair: Pair) {
    println!(
        "\nper call (us, medians of {} interleaved rounds; compiled / floor, compiled / straight-line C and \
         bytecode / floor are medians of per-turn ratios):\n",
        rounds()
    );
    println!(
        "| model | floor | straight-line C | relaxc compiled | relaxc bytecode | TVM compiled | TVM bytecode | compiled / floor | compiled / straight-line C | bytecode / floor | relaxc compiled / TVM compiled | relaxc bytecode / TVM bytecode | compiled / bytecode |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &n in sizes {
        let [floor, straight, compiled, bytecode, tvm_c, tvm_b] =
            ["floor", "straight", "compiled", "bytecode", "tvm compiled", "tvm bytecode"].map(|w| result(n, w));
        println!(
            "| chain_{n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            fmt(floor),
            fmt(straight),
            fmt(compiled),
            fmt(bytecode),
            fmt(tvm_c),
            fmt(tvm_b),
            times(pair(n, "compiled", "floor")),
            times(pair(n, "compiled", "straight")),
            times(pair(n, "bytecode", "floor")),
            ratio(compiled, tvm_c),
            ratio(bytecode, tvm_b),
            ratio(compiled, bytecode),
        );
    }
}

fn report_builds(
    sizes: &[usize],
    built: &std::collections::BTreeMap<(usize, ExecMode), Built>,
    tvm: Option<&serde_json::Value>,
) {
    println!("\nbuild (ms, medians of 5; 3 for chain_100000; compile = import excluded, codegen + link):\n");
    println!("| model | mode | codegen | link | compile+link | vs chain_1000 | native code (bytes/op) | TVM build |");
    println!("|---|---|---|---|---|---|---|---|");
    for &n in sizes {
        for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
            let b = &built[&(n, mode)];
            let base = built[&(1000, mode)].total_ms;
            let per_op = if mode == ExecMode::Compiled {
                format!("{:.0}", b.code_bytes as f64 / n as f64)
            } else {
                "—".into()
            };
            let key = format!("{}/{n}", if mode == ExecMode::Bytecode { "bytecode" } else { "compiled" });
            let tvm_ms = tvm.and_then(|t| t[&key].as_f64()).map(|s| format!("{:.0}", s * 1e3)).unwrap_or("—".into());
            println!(
                "| chain_{n} | {mode:?} | {:.1} | {:.1} | {:.1} | {:.2}x | {per_op} | {tvm_ms} |",
                b.codegen_ms,
                b.link_ms,
                b.total_ms,
                b.total_ms / base
            );
        }
    }
}

/// The targets, measured in this run.
fn report_targets(
    result: &dyn Fn(usize, &str) -> Option<f64>,
    pair: Pair,
    built: &std::collections::BTreeMap<(usize, ExecMode), Built>,
    tvm: Option<&serde_json::Value>,
) {
    let c = ExecMode::Compiled;
    let tvm_bytecode_build = tvm.and_then(|t| t["bytecode/1000"].as_f64()).map(|s| s * 1e3);
    println!("\ntargets:");
    for n in [100, 1000, 10000] {
        let goal = if n == 100 { ">= 1.0x" } else { "1.0x to 1.10x" };
        println!("  chain_{n} compiled / floor: {} (goal {goal})", times(pair(n, "compiled", "floor")));
    }
    println!(
        "  chain_1000 relaxc compiled / TVM compiled: {} (goal <= 0.08x)",
        ratio(result(1000, "compiled"), result(1000, "tvm compiled"))
    );
    println!(
        "  chain_10000 compiled / bytecode: {} (goal <= 0.5x)",
        ratio(result(10000, "compiled"), result(10000, "bytecode"))
    );
    println!("  chain_1000 native code: {:.0} bytes/op (goal <= 150)", built[&(1000, c)].code_bytes as f64 / 1000.0);
    println!(
        "  chain_1000 compiled compile+link / TVM bytecode build: {} (goal <= 0.2x)",
        ratio(Some(built[&(1000, c)].total_ms), tvm_bytecode_build)
    );
    for n in [10000, 100000] {
        println!(
            "  chain_{n} / chain_1000 compiled compile+link: {:.2}x (goal <= {}x)",
            built[&(n, c)].total_ms / built[&(1000, c)].total_ms,
            if n == 10000 { "10.5" } else { "110" }
        );
    }
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

/// chain_1000 compiled with each specialization turned off, one by one.
fn specializations(program: &Program, dir: &Path) {
    let variant = |inline_builtins: bool, stack_tensors: bool, roll_loops: bool| {
        let mut o = Options::mode(ExecMode::Compiled);
        o.native.inline_builtins = inline_builtins;
        o.native.stack_tensors = stack_tensors;
        o.native.roll_loops = roll_loops;
        let tag = [inline_builtins, stack_tensors, roll_loops].map(|b| if b { '1' } else { '0' });
        let so = dir.join(format!("variant{}.so", String::from_iter(tag)));
        let b = build(program, &o, &so, 1);
        let model = Model::load(&b.so).expect("load");
        let us = median((0..rounds()).map(|_| time_calls(&model, 2000)).collect());
        (us, b.code_bytes as f64 / 1000.0)
    };
    let plain = variant(false, false, false);
    let inlined = variant(true, false, false);
    let stack = variant(true, true, false);
    let all = variant(true, true, true);
    println!("\nchain_1000 compiled, per call (us) and native code (bytes/op), each specialization added in turn:");
    println!("  calling every builtin: {:.2} us, {:.0} B/op", plain.0, plain.1);
    println!("  null_value and copy inlined: {:.2} us, {:.0} B/op", inlined.0, inlined.1);
    println!("  stack tensors as well: {:.2} us, {:.0} B/op", stack.0, stack.1);
    println!("  repeated calls rolled into a loop as well: {:.2} us, {:.1} B/op", all.0, all.1);
}
