//! `relaxc compile`: a TVM export, a TVMScript program or a `.rvmasm` text form into a model `.so`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use relaxc::codegen::ExecMode;

use super::{refuse_overwriting, target_or_host};

#[derive(clap::Args)]
pub struct Args {
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
    /// In compiled mode, call every builtin instead of inlining the simple ones, building
    /// short-lived tensors on the stack and rolling repeated calls into loops (to measure what
    /// that is worth).
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
}

pub fn run(args: Args) -> Result<()> {
    let Args {
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
    } = args;
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
        roll_loops: !no_specialize,
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
        for l in &report.loops {
            let times = (l.pcs.end - l.pcs.start) / l.period;
            eprintln!(
                "{}: pcs {}..{} run as a loop of {times} times {} instructions",
                l.function, l.pcs.start, l.pcs.end, l.period
            );
        }
    }
    Ok(())
}
