//! relaxc command line: compile, run and inspect models. Only argument handling lives here.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

use relaxc::codegen::ExecMode;
use relaxc::host::{Model, npz};

#[derive(Parser)]
#[command(
    name = "relaxc",
    version,
    about = "Ahead-of-time compiler from Relax VM programs to self-contained shared objects",
    long_about = "relaxc turns a Relax program into one self-contained .so: the program, its kernels and a small C \
                  runtime, loadable with dlopen through the C API in rvm.h. No libtvm and no Python are needed to run \
                  it. Input is a TVM 0.27 export (ex.export_library(\"m.tar\")), a TVMScript program (.py) whose \
                  operators are C or CUDA kernels, or relaxc's text form of a program (.rvmasm, from inspect --asm)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile a model into a shared object.
    Compile {
        /// A TVM export (.tar from export_library, built with exec_mode="bytecode"), a
        /// TVMScript program (.py: an @I.ir_module of @R.functions calling C kernels), or relaxc's
        /// text form (.rvmasm, as `relaxc inspect --asm` prints it).
        input: PathBuf,
        /// Kernel sources for a .py or .rvmasm program: C (.c, exporting __tvm_ffi_<name>; see rvm_kernel.h), built
        /// with clang or cc, or CUDA (.cu, with launch metadata; see rvm_cuda.h), built with NVRTC.
        #[arg(long, num_args = 1.., value_name = "FILE.c|FILE.cu")]
        kernels: Vec<PathBuf>,
        /// Weights for a .py program's tensor parameters, bound by parameter name.
        #[arg(long, value_name = "FILE.safetensors")]
        params: Option<PathBuf>,
        /// GPU architecture to build CUBINs of .cu kernels for (repeatable; default sm_80 and
        /// sm_90). PTX for the newest is embedded too, for other GPUs.
        #[arg(long, value_name = "sm_XX")]
        cuda_arch: Vec<String>,
        /// How Relax functions run: the shim's interpreter, or native code.
        #[arg(long, value_enum, default_value = "bytecode")]
        exec_mode: ExecMode,
        /// The shared object to write.
        #[arg(short, long)]
        output: PathBuf,
        /// Print how long each stage took.
        #[arg(short, long)]
        verbose: bool,
        /// In compiled mode, leave this Relax function as bytecode (repeatable).
        #[arg(long, value_name = "FUNCTION")]
        keep_bytecode: Vec<String>,
        /// In compiled mode, call every builtin instead of inlining the simple ones and building
        /// short-lived tensors on the stack (to measure what that is worth).
        #[arg(long)]
        no_specialize: bool,
        /// In compiled mode, also write the Cranelift IR of every native function to FILE, each
        /// bytecode instruction's code headed by a `; pc=N <instruction>` comment.
        #[arg(long, value_name = "FILE")]
        emit_clif: Option<PathBuf>,
        /// The CPU to build for, as a target triple: aarch64-unknown-linux-gnu,
        /// riscv64gc-unknown-linux-gnu or x86_64-unknown-linux-gnu (default: this machine).
        /// Native code, the runtime, kernels and the link are all built for it; the C toolchain
        /// is $CC_<triple>, $RELAXC_CC, clang --target, or Debian's cross gcc.
        #[arg(long, value_name = "TRIPLE")]
        target: Option<String>,
        /// Build a model whose every Call (kernel, builtin, Relax function) reports to an
        /// instrument hook (TVM's set_instrument; `relaxc run --profile` and `--trace` use it),
        /// in both modes. Without it the model has no trace of instrumentation.
        #[arg(long)]
        instrument: bool,
        /// Link every optional runtime function (sort, relax.run.*, the paged KV cache) into the
        /// model, for hosts that call them by name; by default a model gets only those its
        /// program calls and its kernels name.
        #[arg(long)]
        all_runtime_functions: bool,
        /// Threads that compile Relax functions to machine code in compiled mode (default: one
        /// per core). The output is the same for any number.
        #[arg(long, short = 'j', value_name = "N", default_value_t = 0, hide_default_value = true)]
        jobs: usize,
    },
    /// Run a function of a compiled model on inputs from an .npz file.
    Run {
        /// A model built by `relaxc compile`.
        model: PathBuf,
        /// The Relax function to call.
        #[arg(long, default_value = "main")]
        func: String,
        /// Arguments: argN (or arr_N) tensors, argN.shape int64 1-D shape tuples, argN.prim 0-d scalars.
        #[arg(long)]
        inputs: Option<PathBuf>,
        /// Where to write the results (out0, out1, ...; tuples flattened depth-first).
        #[arg(long)]
        outputs: Option<PathBuf>,
        /// Check that the results equal the arrays in this .npz bit for bit (out0, out1, ...).
        #[arg(long)]
        expect: Option<PathBuf>,
        /// After one warm-up call, time N calls and print the median per-call latency.
        #[arg(long, value_name = "N", value_parser = positive_count)]
        bench: Option<usize>,
        /// Print storage statistics of the call (peak bytes held, allocations).
        #[arg(long)]
        stats: bool,
        /// Where to run: cpu, or cuda[:N] for a model with CUDA kernels (default: the model's).
        #[arg(long, value_name = "DEVICE")]
        device: Option<String>,
        /// After a warm-up call, profile N calls (default 10) and print a table per callee: calls,
        /// total and mean time, share of the call time, and the VM's own overhead (call time
        /// minus time in kernels). The model must be built with `relaxc compile --instrument`.
        #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "10")]
        profile: Option<usize>,
        /// Write the profiled calls as a Chrome trace-event file (open it in ui.perfetto.dev or
        /// chrome://tracing): one slice per call of each callee. Implies --profile.
        #[arg(long, value_name = "FILE.json")]
        trace: Option<PathBuf>,
        /// Weights for a model exported with its weights as parameters: a tensor cache
        /// (a directory with tensor-cache.json or ndarray-cache.json and its shards) or safetensors
        /// (a file, or a directory of shards). Memory-mapped; each weight parameter is matched by
        /// name.
        #[arg(long, value_name = "PATH")]
        weights: Option<PathBuf>,
    },
    /// Generate tokens with an LLM (TVM nn / MLC export convention) on relaxc's paged KV cache.
    ///
    /// The model must have create_paged_kv_cache, embed, prefill and decode functions. Decoding
    /// is greedy (argmax): the first new token comes from prefill, the others from decode steps.
    /// Prints the new token ids, the prefill latency and the decode speed.
    Generate {
        /// A model built by `relaxc compile` from an LLM export.
        model: PathBuf,
        /// The prompt's token ids, comma-separated (e.g. 1,17,42).
        #[arg(long, value_delimiter = ',', required = true, num_args = 1..)]
        prompt: Vec<i32>,
        /// How many tokens to generate.
        #[arg(long, default_value_t = 16)]
        max_new_tokens: usize,
        /// Write the logits of every new token to this .npz, as float32 [N, vocab] under `logits`.
        #[arg(long, value_name = "FILE.npz")]
        logits: Option<PathBuf>,
        /// Repeat the generation (after a warm-up run) and report median timings.
        #[arg(long, value_name = "RUNS", num_args = 0..=1, default_missing_value = "10", value_parser = positive_count)]
        bench: Option<usize>,
        /// KV cache: the most tokens held at once, prompt and new tokens included.
        #[arg(long, default_value_t = 2048)]
        max_total_seq_len: i64,
        /// KV cache: the most tokens one prefill step takes; longer prompts go in chunks.
        #[arg(long, default_value_t = 256)]
        prefill_chunk_size: i64,
        /// KV cache: tokens per page (TVM's TIR attention kernels need 16).
        #[arg(long, default_value_t = 16)]
        page_size: i64,
        /// KV cache: sequences decoded together at most (generate uses one).
        #[arg(long, default_value_t = 1)]
        max_batch_size: i64,
        /// The vocabulary size, when it cannot be read from the model's embedding table.
        #[arg(long)]
        vocab_size: Option<usize>,
        /// A long run instead: generate TOKENS tokens in rounds (a sequence added and prefilled
        /// with the prompt, decoded for --max-new-tokens, forked halfway, both decoded as a batch,
        /// both removed) on a VM whose allocations are counted. Fails if a round leaves pages,
        /// storage or allocator blocks behind, or gives other tokens than the first round;
        /// reports the resident set.
        #[arg(long, value_name = "TOKENS")]
        soak: Option<usize>,
        /// Weights for a model exported with its weights as parameters: a tensor cache
        /// (a directory with tensor-cache.json or ndarray-cache.json and its shards) or safetensors
        /// (a file, or a directory of shards). Memory-mapped; each weight parameter is matched by
        /// name.
        #[arg(long, value_name = "PATH")]
        weights: Option<PathBuf>,
    },
    /// Build relaxc's kernel library as a shared object for TVM's own process.
    ///
    /// relaxc.tvm (the Python package in python/) loads it with tvm_ffi.load_module and
    /// registers each kernel under its global name (relaxc.matmul, ...), so that TVM's VM runs a
    /// module rewritten to call the library on the same code a relaxc model links: TVM, relaxc
    /// bytecode and relaxc compiled give the same bits. Prints one line per kernel: its global
    /// name, then its name in the library.
    KernelLibrary {
        /// The shared object to write.
        #[arg(short, long)]
        output: PathBuf,
        /// The CPU to build for (as for compile; default: this machine).
        #[arg(long, value_name = "TRIPLE")]
        target: Option<String>,
    },
    /// Serve relaxc models to TVM's RPC client: a board server needing only libc.
    ///
    /// TVM 0.27's unchanged Python client drives it: `remote = tvm.rpc.connect(host, port,
    /// key=KEY)`, `remote.upload("m.so")`, `rmod = remote.load_module("m.so")`, tensors on
    /// `remote.cpu()`, `rmod["main"](x).numpy()`, `rmod.time_evaluator("main", dev)(x)`. A client
    /// can upload a library and run its code as the server's user, so the server listens on
    /// 127.0.0.1 unless --host says otherwise. One session at a time, each in its own process and
    /// its own upload directory, removed when the session ends.
    ///
    /// With --emit, writes the server as one executable for a board instead (the same options
    /// then apply on the board: `./relaxc-rpc-server --host 0.0.0.0 --key board`). With --target
    /// alone, runs the server for that CPU here under qemu user mode.
    RpcServer {
        /// Address to listen on. Any address other than loopback lets every client that reaches
        /// it upload and run code on this machine.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port to listen on (0 picks a free one; the server prints `listening on HOST:PORT`).
        #[arg(long, default_value_t = 9090)]
        port: u16,
        /// The key clients must give (tvm.rpc.connect(..., key=KEY)); with --tracker, the name
        /// clients request from the tracker.
        #[arg(long, default_value = "")]
        key: String,
        /// Register with TVM's RPC tracker at HOST:PORT (needs --key).
        #[arg(long, value_name = "HOST:PORT")]
        tracker: Option<String>,
        /// The largest file a client may upload (K, M, G suffixes).
        #[arg(long, value_name = "SIZE", default_value = "1G")]
        max_upload: String,
        /// The largest message held in memory; the client splits tensor copies to fit it.
        #[arg(long, value_name = "SIZE", default_value = "16M")]
        max_packet: String,
        /// The most tensor memory a client may allocate at once (default: no limit; a session
        /// that runs the machine out of memory ends alone, the server goes on).
        #[arg(long, value_name = "SIZE")]
        max_memory: Option<String>,
        /// Where each session's private upload directory is made (default $TMPDIR or /tmp).
        #[arg(long, value_name = "DIR")]
        workdir: Option<PathBuf>,
        /// Write the server executable to FILE instead of running it (for --target's CPU).
        #[arg(long, value_name = "FILE")]
        emit: Option<PathBuf>,
        /// The CPU to build the server for (as `compile --target`; default: this machine).
        #[arg(long, value_name = "TRIPLE")]
        target: Option<String>,
    },
    /// Print the listing (as TVM's as_text()) and statistics of a TVM export or a compiled model.
    Inspect {
        /// A TVM export (.tar), relaxc's text form (.rvmasm) or a model built by relaxc (.so).
        input: PathBuf,
        /// Print the builder form (TVM's as_python()) instead of the listing.
        #[arg(long, conflicts_with = "asm")]
        python: bool,
        /// Print relaxc's text form instead: the listing plus constants, scopes, register counts
        /// and parameter names, complete enough to assemble back to the same executable.
        #[arg(long)]
        asm: bool,
    },
}

/// The system allocator, noting when it runs out of memory. Rust's answer to a failed
/// allocation is abort(), a core dump; with the note, the abort becomes what any other error
/// gives: a message and exit status 1 (`out_of_memory_exit`).
struct NotingAllocator;

static ALLOCATION_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

// SAFETY: every method forwards to the system allocator unchanged.
unsafe impl std::alloc::GlobalAlloc for NotingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as the caller promised for this layout.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if p.is_null() {
            ALLOCATION_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if p.is_null() {
            ALLOCATION_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            ALLOCATION_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: NotingAllocator = NotingAllocator;

/// SIGABRT after a failed allocation: say so and exit 1. Any other abort keeps its default.
extern "C" fn out_of_memory_exit(signal: libc::c_int) {
    if ALLOCATION_FAILED.load(std::sync::atomic::Ordering::Relaxed) {
        let message = b"error: out of memory (an allocation failed; raise the memory limit or use a smaller model)\n";
        // SAFETY: write and _exit are async-signal-safe.
        unsafe {
            libc::write(2, message.as_ptr().cast(), message.len());
            libc::_exit(1);
        }
    }
    // SAFETY: back to the default action, then the same signal again.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

fn main() {
    // SAFETY: installing a handler before any thread starts; it only calls async-signal-safe code.
    unsafe { libc::signal(libc::SIGABRT, out_of_memory_exit as *const () as libc::sighandler_t) };
    // Rust ignores SIGPIPE, so printing into a closed pipe (`relaxc inspect m.so | head`) would
    // panic; with the default action the process ends quietly, as other command-line tools do.
    // SAFETY: setting a signal's disposition to the default before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {}", render_error(&e));
        std::process::exit(1);
    }
}

/// The error and its causes, joined by ": ", leaving out a cause that its parent's message
/// already ends with (library errors often print their source themselves).
fn render_error(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The CPU `--target` names, or this machine's.
fn target_or_host(target: Option<String>) -> Result<relaxc::target::Target> {
    Ok(match target {
        Some(t) => relaxc::target::Target::parse(&t)?,
        None => relaxc::target::Target::host(),
    })
}

/// Refuses an output path that names one of the inputs, before anything is written.
fn refuse_overwriting(flag: &str, output: &Path, inputs: &[&Path]) -> Result<()> {
    let Ok(out) = std::fs::canonicalize(output) else { return Ok(()) }; // a new file
    for input in inputs {
        if std::fs::canonicalize(input).is_ok_and(|i| i == out) {
            bail!("{flag} {} is also an input: refusing to overwrite it", output.display());
        }
    }
    Ok(())
}

/// `--bench N` takes N >= 1.
fn positive_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Compile {
            input,
            kernels,
            params,
            cuda_arch,
            exec_mode,
            output,
            verbose,
            keep_bytecode,
            no_specialize,
            emit_clif,
            all_runtime_functions,
            instrument,
            target,
            jobs,
        } => {
            let mut sources: Vec<&Path> = vec![&input];
            sources.extend(kernels.iter().map(PathBuf::as_path));
            sources.extend(params.as_deref());
            refuse_overwriting("-o", &output, &sources)?;
            if let Some(clif) = &emit_clif {
                refuse_overwriting("--emit-clif", clif, &sources)?;
            }
            if emit_clif.is_some() && exec_mode != relaxc::codegen::ExecMode::Compiled {
                anyhow::bail!("--emit-clif needs --exec-mode compiled: bytecode mode generates no CLIF");
            }
            let cuda_archs = cuda_arch.iter().map(|a| relaxc::cuda::parse_arch(a)).collect::<Result<Vec<_>, _>>()?;
            let native = relaxc::codegen::native::NativeOptions {
                keep_bytecode: keep_bytecode.into_iter().collect(),
                inline_builtins: !no_specialize,
                stack_tensors: !no_specialize,
                emit_clif: emit_clif.is_some(),
                jobs,
                instrument,
            };
            let target = target_or_host(target)?;
            let script = relaxc::compile::ScriptInputs { kernels, params, cuda_archs, target: Some(target.clone()) };
            let options = relaxc::compile::Options { mode: exec_mode, native, script, all_runtime_functions, target };
            let report = relaxc::compile::compile_file_with(&input, &options, &output)
                .with_context(|| format!("compiling {}", input.display()))?;
            if let Some(path) = &emit_clif {
                relaxc::outfile::write_bytes(path, report.clif.as_bytes(), false)?;
            }
            for (function, reason) in &report.notes {
                eprintln!("note: {function} runs as bytecode: {reason}");
            }
            if verbose {
                eprintln!(
                    "import {:.2} ms, codegen {:.2} ms ({} bytes of object), link {:.2} ms",
                    report.import.as_secs_f64() * 1e3,
                    report.codegen.as_secs_f64() * 1e3,
                    report.object_bytes,
                    report.link.as_secs_f64() * 1e3
                );
            }
            Ok(())
        }
        Command::Run { model, func, inputs, outputs, expect, bench, stats, device, profile, trace, weights } => {
            let device = device.map(|d| parse_device(&d)).transpose()?;
            let sources: Vec<&Path> =
                [Some(model.as_path()), inputs.as_deref(), expect.as_deref()].into_iter().flatten().collect();
            for (flag, out) in [("--outputs", &outputs), ("--trace", &trace)] {
                if let Some(out) = out {
                    refuse_overwriting(flag, out, &sources)?;
                }
            }
            let profile = profile.or(trace.as_ref().map(|_| 10));
            if weights.is_some() && profile.is_some() {
                bail!("--profile does not take --weights yet");
            }
            let opts = RunOptions { func, inputs, outputs, expect, bench, stats, device, profile, trace, weights };
            run_model(&model, &opts)
        }
        Command::Generate {
            model,
            prompt,
            max_new_tokens,
            logits,
            bench,
            max_total_seq_len,
            prefill_chunk_size,
            page_size,
            max_batch_size,
            vocab_size,
            soak,
            weights,
        } => {
            let config =
                relaxc::host::llm::CacheConfig { max_batch_size, max_total_seq_len, prefill_chunk_size, page_size };
            if let Some(total) = soak {
                if logits.is_some() || bench.is_some() {
                    bail!("--soak runs alone: it takes neither --logits nor --bench");
                }
                return soak_run(&model, config, &prompt, max_new_tokens, total, weights.as_deref());
            }
            if let Some(out) = &logits {
                refuse_overwriting("--logits", out, &[&model])?;
            }
            let opts = GenerateOptions { prompt, max_new_tokens, logits, bench, config, vocab_size, weights };
            generate(&model, &opts)
        }
        Command::KernelLibrary { output, target } => {
            let target = target_or_host(target)?;
            let exports = relaxc::compile::build_kernel_library(&output, &target)
                .with_context(|| format!("building the kernel library {}", output.display()))?;
            for e in exports {
                println!("{}\t{}", e.name, e.export);
            }
            Ok(())
        }
        Command::RpcServer { host, port, key, tracker, max_upload, max_packet, max_memory, workdir, emit, target } => {
            let target = target_or_host(target)?;
            let tc = relaxc::target::toolchain(&target)?;
            let server = relaxc::target::shim::rpc_server(&target, &tc)?;
            if let Some(file) = emit {
                let bytes = std::fs::read(&server).with_context(|| format!("reading {}", server.display()))?;
                relaxc::outfile::write_bytes(&file, &bytes, true)?;
                eprintln!(
                    "wrote {} ({target}, {} KiB, needs only libc): copy it to the board and run it there with the same options",
                    file.display(),
                    bytes.len().div_ceil(1024)
                );
                return Ok(());
            }
            let mut args = vec!["--host".to_string(), host, "--port".into(), port.to_string()];
            args.extend(["--key".into(), key, "--max-upload".into(), max_upload, "--max-packet".into(), max_packet]);
            if let Some(t) = tracker {
                args.extend(["--tracker".into(), t]);
            }
            if let Some(m) = max_memory {
                args.extend(["--max-memory".into(), m]);
            }
            if let Some(dir) = workdir {
                args.extend(["--workdir".into(), dir.display().to_string()]);
            }
            let mut command = if target.is_host() {
                std::process::Command::new(&server)
            } else {
                let mut c = std::process::Command::new(target.qemu());
                c.arg("-L").arg(target.sysroot()).arg(&server);
                c
            };
            command.args(&args);
            // The server takes over this process: its signals, its output and its exit status.
            let error = std::os::unix::process::CommandExt::exec(&mut command);
            bail!("cannot start {}: {error}", command.get_program().to_string_lossy())
        }
        Command::Inspect { input, python, asm } => {
            let exec =
                relaxc::inspect::load_executable(&input).with_context(|| format!("inspecting {}", input.display()))?;
            if asm {
                print!("{}", relaxc::vm::asm::disassemble(&exec));
                return Ok(());
            }
            if python {
                print!("{}", exec.as_python());
            } else {
                print!("{}", exec.as_text());
                print!("{}", exec.stats());
            }
            if let Some(cuda) = relaxc::inspect::cuda_listing(&input)? {
                println!("CUDA:");
                for line in cuda.lines() {
                    println!("  {line}");
                }
            }
            if let Some(identity) = relaxc::inspect::identity(&input) {
                println!("Built by: {identity}");
            }
            if let Some(modes) = relaxc::inspect::function_modes(&input)? {
                println!("Execution:");
                for (name, compiled) in modes {
                    let how = if compiled { format!("compiled (__vmtir__{name})") } else { "bytecode".to_string() };
                    println!("  {name}: {how}");
                }
            }
            Ok(())
        }
    }
}

fn parse_device(s: &str) -> Result<(i32, i32)> {
    match s.split_once(':') {
        None if s == "cpu" => Ok((1, 0)),
        None if s == "cuda" => Ok((2, 0)),
        Some(("cuda", n)) => Ok((2, n.parse().with_context(|| format!("--device {s}: bad device number"))?)),
        _ => bail!("--device {s}: expected cpu, cuda or cuda:N"),
    }
}

struct RunOptions {
    device: Option<(i32, i32)>,
    profile: Option<usize>,
    trace: Option<PathBuf>,
    func: String,
    inputs: Option<PathBuf>,
    outputs: Option<PathBuf>,
    expect: Option<PathBuf>,
    bench: Option<usize>,
    stats: bool,
    weights: Option<PathBuf>,
}

fn run_model(path: &Path, opts: &RunOptions) -> Result<()> {
    if let Some(target) = relaxc::host::foreign::foreign_target(path) {
        return run_foreign(path, &target, opts);
    }
    let RunOptions { func, inputs, outputs, expect, bench, stats, device, profile, trace, weights } = opts;
    let (func, bench, stats) = (func.as_str(), *bench, *stats);
    let model = Model::load(path)?;
    let Ok(f) = model.find(func) else {
        bail!("the model has no function {func:?} (its functions: {})", model.functions().join(", "));
    };
    let args = match inputs.as_deref() {
        Some(p) => npz::read_inputs(p)?,
        None => Vec::new(),
    };
    let mut vm = match device {
        Some((t, id)) => model.vm_on(*t, *id)?,
        None => model.vm()?,
    };
    let weights = weights.as_deref().map(|p| relaxc::host::external::Weights::load(&model, p)).transpose()?;
    let weight_args = match &weights {
        Some(w) => w.arguments(f, args.len())?,
        None => Vec::new(),
    };
    let prepared = vm.prepare(&args)?;
    let mut all = prepared.values().to_vec();
    all.extend_from_slice(&weight_args);
    let result = vm.call_values(f, &all).with_context(|| format!("calling {func}"))?;
    let flat = result.to_output().flatten();
    drop(result);
    if stats {
        let s = vm.stats();
        println!(
            "storage: peak {} bytes held at once, {} allocations ({} from the pool)",
            s.peak_storage_bytes, s.storage_allocations, s.pool_hits
        );
    }
    if let Some(want) = expect {
        check_expected(&flat, want)?;
        println!("results match {} bit for bit", want.display());
    }
    match outputs.as_deref() {
        Some(p) => npz::write_outputs(p, &flat)?,
        None => {
            for (i, o) in flat.iter().enumerate() {
                println!("out{i}: {}", describe(o));
            }
        }
    }
    if let Some(n) = profile {
        profile_calls(&model, &mut vm, f, func, &args, *n, trace.as_deref())?;
    }
    if let Some(n) = bench {
        if n == 0 {
            bail!("--bench needs at least one call");
        }
        drop(vm.call_values(f, &all)?);
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let r = vm.call_values(f, &all)?;
            drop(r);
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        println!("{func}: median {:.3} us per call over {n} calls", times[n / 2]);
    }
    Ok(())
}

/// `generate --soak`: the long run of `relaxc::host::soak`, with progress every tenth of it.
fn soak_run(
    path: &Path,
    mut config: relaxc::host::llm::CacheConfig,
    prompt: &[i32],
    steps: usize,
    total: usize,
    weights: Option<&Path>,
) -> Result<()> {
    let model = Model::load(path)?;
    let weights = weights.map(|p| relaxc::host::external::Weights::load(&model, p)).transpose()?;
    config.max_batch_size = config.max_batch_size.max(2);
    let start = Instant::now();
    let mut next = total / 10;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let plan = relaxc::host::soak::SoakPlan { prompt, steps, total };
    let report = relaxc::host::soak::soak(&model, path, config, &plan, weights.as_ref(), |r| {
        if r.tokens >= next {
            eprintln!(
                "soak: {} of {total} tokens, {} rounds, RSS {:.1} MiB, {} live allocator blocks",
                r.tokens,
                r.rounds,
                mib(relaxc::host::soak::resident_bytes()),
                r.live_blocks
            );
            next += (total / 10).max(1);
        }
    })
    .context("soak")?;
    let growth = report.rss_max.saturating_sub(report.rss_after_first_round);
    println!(
        "soak: {} tokens in {} rounds ({:.1} s); after every round the pages, the storage ({} live allocator blocks) and the tokens were the first round's; RSS {:.1} MiB after the first round, at most {:.1} MiB (+{:.2} MiB)",
        report.tokens,
        report.rounds,
        start.elapsed().as_secs_f64(),
        report.live_blocks,
        mib(report.rss_after_first_round),
        mib(report.rss_max),
        mib(growth)
    );
    // Flat: the allocator's count is exact; the resident set may move by what libc keeps.
    if growth > 4 << 20 {
        bail!("the resident set grew by {:.1} MiB after the first round", mib(growth));
    }
    Ok(())
}

struct GenerateOptions {
    prompt: Vec<i32>,
    max_new_tokens: usize,
    logits: Option<PathBuf>,
    bench: Option<usize>,
    config: relaxc::host::llm::CacheConfig,
    vocab_size: Option<usize>,
    weights: Option<PathBuf>,
}

/// One greedy generation: the new tokens, their logits, the prefill time and the decode time.
struct Generation {
    tokens: Vec<i32>,
    logits: Vec<f32>,
    vocab: usize,
    prefill: std::time::Duration,
    decode: std::time::Duration,
}

fn generate_once(
    model: &Model,
    path: &Path,
    opts: &GenerateOptions,
    weights: Option<&relaxc::host::external::Weights>,
) -> Result<Generation> {
    use relaxc::host::llm::Llm;
    let mut llm = Llm::with_weights(model, path, opts.config, weights)?;
    if opts.vocab_size.is_some() {
        llm.vocab = opts.vocab_size;
    }
    llm.add_sequence(0)?;
    let start = Instant::now();
    let chunk = opts.config.prefill_chunk_size.max(1) as usize;
    let mut last = None;
    for part in opts.prompt.chunks(chunk) {
        last = Some(llm.prefill(&[0], &[part.to_vec()]).context("prefill")?);
    }
    let first = last.context("the prompt is empty")?;
    let prefill = start.elapsed();
    let vocab = first.vocab;
    let mut tokens = vec![first.argmax(0)];
    let mut logits = first.row(0).to_vec();
    let start = Instant::now();
    while tokens.len() < opts.max_new_tokens {
        let step = llm.decode(&[0], &[*tokens.last().context("no token")?]).context("decode")?;
        tokens.push(step.argmax(0));
        logits.extend_from_slice(step.row(0));
    }
    Ok(Generation { tokens, logits, vocab, prefill, decode: start.elapsed() })
}

fn generate(path: &Path, opts: &GenerateOptions) -> Result<()> {
    if opts.prompt.is_empty() {
        bail!("--prompt needs at least one token id");
    }
    if opts.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    let needed = opts.prompt.len() as i64 + opts.max_new_tokens as i64;
    if needed > opts.config.max_total_seq_len {
        bail!(
            "the prompt ({} tokens) and {} new tokens need {needed} tokens of KV cache, more than --max-total-seq-len {}",
            opts.prompt.len(),
            opts.max_new_tokens,
            opts.config.max_total_seq_len
        );
    }
    let model = Model::load(path)?;
    let weights = opts.weights.as_deref().map(|p| relaxc::host::external::Weights::load(&model, p)).transpose()?;
    let run = generate_once(&model, path, opts, weights.as_ref())?;
    let tokens: Vec<String> = run.tokens.iter().map(|t| t.to_string()).collect();
    println!("tokens: {}", tokens.join(" "));
    let (mut prefill, mut decode) = (run.prefill, run.decode);
    if let Some(runs) = opts.bench {
        let (mut p, mut d) = (Vec::new(), Vec::new());
        for _ in 0..runs.max(1) {
            let again = generate_once(&model, path, opts, weights.as_ref())?;
            if again.tokens != run.tokens {
                bail!("a repeated generation gave different tokens");
            }
            p.push(again.prefill);
            d.push(again.decode);
        }
        p.sort();
        d.sort();
        (prefill, decode) = (p[p.len() / 2], d[d.len() / 2]);
    }
    let steps = run.tokens.len().saturating_sub(1);
    let what = if opts.bench.is_some() { "median " } else { "" };
    println!("prefill: {what}{:.3} ms for {} prompt tokens", prefill.as_secs_f64() * 1e3, opts.prompt.len());
    if steps > 0 {
        println!(
            "decode: {what}{:.1} tokens/s ({:.1} us per token, {steps} steps)",
            steps as f64 / decode.as_secs_f64(),
            decode.as_secs_f64() * 1e6 / steps as f64
        );
    }
    if let Some(out) = &opts.logits {
        let data: Vec<u8> = run.logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        let array = relaxc::host::Output::Tensor {
            dtype: relaxc::abi::DLDataType { code: 2, bits: 32, lanes: 1 },
            shape: vec![run.tokens.len() as i64, run.vocab as i64],
            data,
        };
        npz::write_named(out, &[("logits".to_string(), &array)])?;
    }
    Ok(())
}

/// `relaxc run` for a model built for another CPU: the same options and outputs, the call made by
/// a runner under qemu user mode.
fn run_foreign(path: &Path, target: &relaxc::target::Target, opts: &RunOptions) -> Result<()> {
    if opts.device.is_some() || opts.profile.is_some() {
        bail!("--device and --profile are not available for a {target} model run under qemu");
    }
    if opts.bench == Some(0) {
        bail!("--bench needs at least one call");
    }
    let args = match opts.inputs.as_deref() {
        Some(p) => npz::read_inputs(p)?,
        None => Vec::new(),
    };
    let run = relaxc::host::foreign::run(path, target, &opts.func, &args, opts.bench.unwrap_or(0), opts.stats)
        .with_context(|| format!("calling {}", opts.func))?;
    print!(
        "{}",
        run.stdout.lines().filter(|l| l.starts_with("storage:")).map(|l| format!("{l}\n")).collect::<String>()
    );
    if let Some(want) = &opts.expect {
        check_expected(&run.outputs, want)?;
        println!("results match {} bit for bit", want.display());
    }
    match opts.outputs.as_deref() {
        Some(p) => npz::write_outputs(p, &run.outputs)?,
        None => {
            for (i, o) in run.outputs.iter().enumerate() {
                println!("out{i}: {}", describe(o));
            }
        }
    }
    print!("{}", run.stdout.lines().filter(|l| l.contains("median")).map(|l| format!("{l}\n")).collect::<String>());
    Ok(())
}

/// Profiles `n` calls of `f` through the instrument hook and prints the per-callee table.
fn profile_calls(
    model: &Model,
    vm: &mut relaxc::host::Vm,
    f: i32,
    func: &str,
    args: &[relaxc::host::Input],
    n: usize,
    trace: Option<&Path>,
) -> Result<()> {
    use relaxc::host::profile::{Kind, Profiler, hook, trace_json};
    if n == 0 {
        bail!("--profile needs at least one call");
    }
    if !model.instrumented() {
        bail!("the model was built without --instrument: rebuild it with `relaxc compile --instrument` to profile it");
    }
    let prepared = vm.prepare(args)?;
    drop(vm.call_prepared(f, &prepared)?); // warm-up, not profiled
    let mut profiler = Profiler::new(trace.is_some());
    let mut calls = Vec::new();
    // SAFETY: hook is a safe call; the profiler outlives the calls (the hook is cleared below).
    unsafe { vm.set_instrument(Some(hook), profiler.as_self()) }?;
    let mut result = Ok(());
    for _ in 0..n {
        let start = Instant::now();
        let r = vm.call_prepared(f, &prepared);
        let end = Instant::now();
        match r {
            Ok(v) => drop(v),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        calls.push((format!("{func} (call)"), profiler.since_origin(start), end - start));
    }
    // SAFETY: clearing the hook.
    unsafe { vm.set_instrument(None, std::ptr::null_mut()) }?;
    result.with_context(|| format!("calling {func}"))?;
    profiler.finish();
    let total: std::time::Duration = calls.iter().map(|c| c.2).sum();
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    println!("profile of {func}: {n} calls, {:.1} us in all, {:.2} us per call", us(total), us(total) / n as f64);
    println!("| callee | kind | calls | total (us) | mean (us) | share of call time |");
    println!("|---|---|---|---|---|---|");
    for (name, s) in profiler.sorted() {
        println!(
            "| {name} | {} | {} | {:.2} | {:.3} | {:.1}% |",
            s.kind.name(),
            s.calls,
            us(s.total),
            us(s.total) / s.calls as f64,
            100.0 * us(s.total) / us(total).max(1e-9)
        );
    }
    let kernels = profiler.kernel_time();
    let overhead = total.saturating_sub(kernels);
    println!(
        "kernels: {:.2} us; VM overhead (call time - kernel time, builtins and the hook included): {:.2} us ({:.1}%)",
        us(kernels),
        us(overhead),
        100.0 * us(overhead) / us(total).max(1e-9)
    );
    let functions = profiler.stats.values().filter(|s| s.kind == Kind::Function).count();
    if functions > 0 {
        println!("(Relax functions' times include their callees'; kernel time counts each kernel once.)");
    }
    if let Some(path) = trace {
        let events = profiler.events.as_deref().unwrap_or(&[]);
        relaxc::outfile::write_bytes(path, trace_json(events, &calls).as_bytes(), false)?;
        println!(
            "trace: {} slices in {} (open it in ui.perfetto.dev or chrome://tracing)",
            events.len() + calls.len(),
            path.display()
        );
    }
    Ok(())
}

fn check_expected(results: &[relaxc::host::Output], path: &Path) -> Result<()> {
    let want = npz::read_arrays(path)?;
    if want.len() != results.len() {
        bail!("{} results, but {} has {} arrays", results.len(), path.display(), want.len());
    }
    for (i, r) in results.iter().enumerate() {
        let key = format!("out{i}");
        let got = npz::output_array(r).map_err(anyhow::Error::msg).with_context(|| key.clone())?;
        let Some(w) = want.get(&key) else { bail!("{} has no {key}", path.display()) };
        if (&got.0, &got.1) != (&w.0, &w.1) {
            bail!("{key}: got {} {:?}, expected {} {:?}", got.0, got.1, w.0, w.1);
        }
        if got.2 != w.2 {
            let at = got.2.iter().zip(&w.2).position(|(a, b)| a != b).unwrap_or(0);
            bail!("{key}: values differ (first difference at byte {at})");
        }
    }
    Ok(())
}

fn describe(o: &relaxc::host::Output) -> String {
    use relaxc::host::Output;
    match o {
        Output::Tensor { dtype, shape, data } => format!(
            "tensor shape {:?} dtype (code {}, bits {}, lanes {}), {} bytes",
            shape,
            dtype.code,
            dtype.bits,
            dtype.lanes,
            data.len()
        ),
        Output::Shape(d) => format!("shape {d:?}"),
        Output::Int(v) => format!("int {v}"),
        Output::Bool(v) => format!("bool {v}"),
        Output::Float(v) => format!("float {v}"),
        Output::Tuple(_) => "tuple".into(),
        Output::Other(t) => format!("{t} (not representable in .npz)"),
    }
}
