//! The compile driver: input → verified executable → model object → linked `.so`.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::codegen::native::NativeOptions;

use crate::codegen::{self, CodegenError, ExecMode};
use crate::ir::ShapeFunc;
use crate::kernel_object::{KernelObject, kernel_symbol};
use crate::link::{self, LinkError};
use crate::tvm::{self, ImportError};
use crate::vm::{Verified, VerifyError};

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error("the executable is malformed: {0}")]
    Verify(#[from] VerifyError),
    #[error(transparent)]
    Tables(#[from] CodegenError),
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("--keep-bytecode {0}: the program has no Relax function of that name")]
    NoSuchFunction(String),
    /// An error in a script, rendered with its source line.
    #[error("{0}")]
    Script(String),
    #[error(transparent)]
    Kernel(#[from] crate::kernels::KernelError),
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    #[error("{path}: {message}")]
    Params { path: String, message: String },
    #[error("{path}: {source}")]
    Asm { path: String, source: crate::vm::asm::AsmError },
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error(transparent)]
    Target(#[from] crate::target::TargetError),
    #[error(
        "{member} holds code for {found}, but the model is being built for {target} (--target): export the model for {target} (relax.build with target={{\"kind\": \"llvm\", \"mtriple\": \"{gnu}\"}}) or build with --target for {found}"
    )]
    WrongArchitecture { member: String, found: String, target: String, gnu: String },
}

/// Inputs of a script compile besides the script itself.
#[derive(Debug, Clone, Default)]
pub struct ScriptInputs {
    /// C kernel sources (`--kernels`).
    pub kernels: Vec<std::path::PathBuf>,
    /// Weights bound to tensor parameters by name (`--params`).
    pub params: Option<std::path::PathBuf>,
    /// CUDA architectures to build CUBINs for (`--cuda-arch`; default sm_80 and sm_90).
    pub cuda_archs: Vec<u32>,
    /// The CPU the kernels are built for.
    pub target: Option<crate::target::Target>,
}

/// Parses, converts and lowers a TVMScript program, and builds its kernels.
pub fn load_script(path: &Path, inputs: &ScriptInputs) -> Result<Program, CompileError> {
    let shown = path.display().to_string();
    let src = std::fs::read_to_string(path).map_err(|source| CompileError::Read { path: shown.clone(), source })?;
    let weights = match &inputs.params {
        Some(p) => crate::weights::load_safetensors(p)
            .map_err(|message| CompileError::Params { path: p.display().to_string(), message })?,
        None => Default::default(),
    };
    let render = |e: crate::diag::SourceError| CompileError::Script(e.render(&shown, &src));
    let stmts = crate::script::parser::parse(&src).map_err(render)?;
    let module = crate::script::convert::convert(&stmts, &weights).map_err(render)?;
    let lowered = crate::lower::lower(&module).map_err(render)?;
    let exec = Verified::new(lowered.exec)?;
    let (kernels, cuda) = build_kernels(inputs)?;
    let mut available: BTreeSet<String> = kernels.iter().flat_map(|k| k.kernels.iter().cloned()).collect();
    available.extend(cuda.iter().flat_map(|m| m.kernels.iter().map(|k| k.name.clone())));
    check_kernels(&module, &available, &inputs.kernels).map_err(render)?;
    Ok(Program { exec, kernels, shape_funcs: lowered.shape_funcs, cuda })
}

/// Builds the `--kernels` sources: C with clang, CUDA with NVRTC.
fn build_kernels(inputs: &ScriptInputs) -> Result<(Vec<KernelObject>, Vec<crate::cuda::CudaModule>), CompileError> {
    let (cu, c): (Vec<_>, Vec<_>) = inputs.kernels.iter().partition(|k| k.extension().is_some_and(|e| e == "cu"));
    let target = inputs.target.clone().unwrap_or_else(crate::target::Target::host);
    let kernels = if c.is_empty() {
        Vec::new()
    } else {
        let tc = crate::target::toolchain(&target)?;
        c.iter().map(|k| crate::kernels::compile_c(k, &tc)).collect::<Result<Vec<_>, _>>()?
    };
    let mut cuda = Vec::new();
    if !cu.is_empty() {
        let nvrtc = crate::cuda::nvrtc::Nvrtc::load().map_err(crate::cuda::CudaError::from)?;
        let archs = if inputs.cuda_archs.is_empty() { vec![80, 90] } else { inputs.cuda_archs.clone() };
        for source in cu {
            cuda.push(crate::cuda::build(&nvrtc, source, &archs)?);
        }
    }
    Ok((kernels, cuda))
}

/// Assembles relaxc's text form (`.rvmasm`, as `relaxc inspect --asm` prints it), verifies it and
/// builds its kernels; a hand-written program or a hand-edited listing compiles like any other.
pub fn load_asm(path: &Path, inputs: &ScriptInputs) -> Result<Program, CompileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| CompileError::Read { path: shown.clone(), source })?;
    let exec = crate::vm::asm::assemble(&text).map_err(|e| CompileError::Asm { path: shown, source: e })?;
    let exec = Verified::new(exec)?;
    let (kernels, cuda) = build_kernels(inputs)?;
    Ok(Program { exec, kernels, shape_funcs: Vec::new(), cuda })
}

/// Every kernel a script calls must be defined by one of its kernel sources.
fn check_kernels(
    module: &crate::ir::Module,
    available: &BTreeSet<String>,
    sources: &[std::path::PathBuf],
) -> Result<(), crate::diag::SourceError> {
    fn walk(
        block: &crate::ir::Block,
        f: &mut dyn FnMut(&str, crate::diag::Span) -> Result<(), crate::diag::SourceError>,
    ) -> Result<(), crate::diag::SourceError> {
        for b in &block.bindings {
            match &b.op {
                crate::ir::Op::DpsPacked { name, .. } | crate::ir::Op::Packed { name, .. } => f(name, b.span)?,
                crate::ir::Op::If { then, otherwise, .. } => {
                    walk(then, f)?;
                    walk(otherwise, f)?;
                }
                _ => {}
            }
        }
        Ok(())
    }
    let listed = sources.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    for func in &module.functions {
        walk(&func.body, &mut |name, span| {
            if available.contains(name) || crate::codegen::shim::find_builtin(name).is_some() {
                return Ok(());
            }
            let symbol = kernel_symbol(name);
            let why = if sources.is_empty() {
                format!("no --kernels source was given to define {symbol}")
            } else {
                format!("{symbol} is defined in none of: {listed}")
            };
            Err(crate::diag::SourceError::new(span, format!("kernel `{name}` is not provided: {why}")))
        })?;
    }
    Ok(())
}

/// What a compile did, for `--verbose` and benchmarks.
#[derive(Debug, Default)]
pub struct CompileReport {
    pub import: Duration,
    pub codegen: Duration,
    pub link: Duration,
    pub object_bytes: usize,
    /// Relax functions that stayed bytecode in compiled mode, with the reason.
    pub notes: Vec<(String, String)>,
    /// The native functions' CLIF with `; pc=N` comments, when `emit_clif` was set.
    pub clif: String,
    /// The loops compiled mode rolled repeated runs into.
    pub loops: Vec<crate::codegen::native::RolledLoop>,
}

/// How to compile.
#[derive(Debug, Clone)]
pub struct Options {
    pub mode: ExecMode,
    /// Compiled mode's choices (functions kept as bytecode, specializations).
    pub native: NativeOptions,
    /// Kernels and weights of a script.
    pub script: ScriptInputs,
    /// Link every optional runtime function (rvm_runtime.def) into the model, not only those
    /// its bytecode calls and its kernels name: for hosts that call them by name.
    pub all_runtime_functions: bool,
    /// The CPU the model is for (`--target`; the host by default).
    pub target: crate::target::Target,
}

impl Options {
    pub fn mode(mode: ExecMode) -> Options {
        Options {
            mode,
            native: NativeOptions::default(),
            script: ScriptInputs::default(),
            all_runtime_functions: false,
            target: crate::target::Target::host(),
        }
    }
}

/// The optional runtime functions a program's kernels name (a kernel that looks one up carries
/// its name as a string), or all of them: their symbols, for the model object to refer to.
fn runtime_references(kernels: &[KernelObject], all: bool) -> Vec<String> {
    let contains = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
    codegen::shim::builtins()
        .iter()
        .filter(|b| b.optional)
        .filter(|b| {
            let name = format!("{}\0", b.name);
            all || kernels.iter().any(|k| contains(&k.bytes, name.as_bytes()))
        })
        .map(|b| b.symbol.clone())
        .collect()
}

/// A program ready for code generation: the verified executable, the kernel objects it needs,
/// and the shape functions relaxc generates for it.
pub struct Program {
    pub exec: Verified,
    pub kernels: Vec<KernelObject>,
    pub shape_funcs: Vec<ShapeFunc>,
    /// CUDA modules built from `.cu` kernel sources.
    pub cuda: Vec<crate::cuda::CudaModule>,
}

/// Loads a TVM export (`.tar`) and verifies it.
pub fn load_tvm_export(input: &Path) -> Result<Program, CompileError> {
    load_tvm_export_for(input, &crate::target::Target::host())
}

/// Loads a TVM export built for `target` (its kernel objects must be for that CPU).
pub fn load_tvm_export_for(input: &Path, target: &crate::target::Target) -> Result<Program, CompileError> {
    let export = tvm::import_tar(input)?;
    for k in &export.kernels {
        if let Some(machine) = crate::target::elf_machine_of(&k.bytes)
            && machine != target.elf_machine()
        {
            return Err(CompileError::WrongArchitecture {
                member: k.name.clone(),
                found: crate::target::machine_name(machine),
                target: target.to_string(),
                gnu: target.gnu_triple().to_string(),
            });
        }
    }
    Ok(Program {
        exec: Verified::new(export.exec)?,
        kernels: export.kernels,
        shape_funcs: Vec::new(),
        cuda: Vec::new(),
    })
}

/// Emits the model object for a program.
pub fn emit(program: &Program, options: &Options) -> Result<codegen::EmittedObject, CompileError> {
    let mut available: BTreeSet<String> = program.kernels.iter().flat_map(|k| k.kernels.iter().cloned()).collect();
    available.extend(program.shape_funcs.iter().map(|f| f.name.clone()));
    available.extend(program.cuda.iter().flat_map(|m| m.kernels.iter().map(|k| k.name.clone())));
    let objects = if program.kernels.is_empty() {
        "the kernel objects (there are none)".to_string()
    } else {
        program.kernels.iter().map(|k| k.name.as_str()).collect::<Vec<_>>().join(", ")
    };
    let symbols = codegen::bind_packed_functions(&program.exec, &available, &objects)?;
    for name in &options.native.keep_bytecode {
        if !program.exec.funcs.iter().any(|f| &f.name == name && f.kind != crate::vm::FuncKind::Packed) {
            return Err(CompileError::NoSuchFunction(name.clone()));
        }
    }
    let runtime_refs = runtime_references(&program.kernels, options.all_runtime_functions);
    let scalar_results: BTreeSet<String> =
        program.kernels.iter().filter(|k| k.scalar_results).flat_map(|k| k.kernels.iter().cloned()).collect();
    Ok(codegen::emit_object(&codegen::ObjectInputs {
        exec: &program.exec,
        symbols: &symbols,
        mode: options.mode,
        native: &options.native,
        shape_funcs: &program.shape_funcs,
        cuda: &program.cuda,
        runtime_refs: &runtime_refs,
        scalar_results: &scalar_results,
        target: &options.target.triple,
    })?)
}

/// Compiles `input` into the shared object `out`.
pub fn compile_file(input: &Path, mode: ExecMode, out: &Path) -> Result<CompileReport, CompileError> {
    compile_file_with(input, &Options::mode(mode), out)
}

/// Compiles `input` into the shared object `out` with options.
pub fn compile_file_with(input: &Path, options: &Options, out: &Path) -> Result<CompileReport, CompileError> {
    let mut report = CompileReport::default();
    let t = Instant::now();
    let mut script = options.script.clone();
    script.target = Some(options.target.clone());
    let program = if input.extension().is_some_and(|e| e == "py") {
        load_script(input, &script)?
    } else if input.extension().is_some_and(|e| e == "rvmasm") {
        load_asm(input, &script)?
    } else {
        load_tvm_export_for(input, &options.target)?
    };
    report.import = t.elapsed();
    let t = Instant::now();
    let mut object = emit(&program, options)?;
    report.codegen = t.elapsed();
    report.object_bytes = object.bytes.len();
    report.notes = std::mem::take(&mut object.notes);
    report.clif = std::mem::take(&mut object.clif);
    report.loops = std::mem::take(&mut object.loops);
    let t = Instant::now();
    link::link_shared_for(&object.link_inputs(&program.kernels), out, &options.target)?;
    report.link = t.elapsed();
    Ok(report)
}

/// A kernel of the kernel library as the library for TVM exports it.
#[derive(Debug, Clone)]
pub struct LibraryExport {
    /// The global name TVM calls it by (`relaxc.matmul`).
    pub name: String,
    /// The tvm-ffi name in the library (`kl_matmul`: the symbol `__tvm_ffi_kl_matmul`).
    pub export: String,
}

/// The kernels `build_kernel_library` exports.
pub fn library_exports() -> Vec<LibraryExport> {
    codegen::shim::library_kernels()
        .map(|k| {
            let export = k.symbol.strip_prefix("rvm_builtin_").unwrap_or(&k.symbol).to_string();
            LibraryExport { name: k.name.to_string(), export }
        })
        .collect()
}

/// Builds the kernel library as a shared object for TVM's process (relaxc.tvm registers its
/// kernels in TVM, so TVM's VM runs a rewritten module on the code relaxc models link): every
/// kernel exported as `__tvm_ffi_<export>`, with the runtime it needs and no program.
pub fn build_kernel_library(out: &Path, target: &crate::target::Target) -> Result<Vec<LibraryExport>, CompileError> {
    let program = Program {
        exec: Verified::new(crate::vm::ExecBuilder::new().build())?,
        kernels: Vec::new(),
        shape_funcs: Vec::new(),
        cuda: Vec::new(),
    };
    let mut options = Options::mode(ExecMode::Bytecode);
    options.target = target.clone();
    let object = emit(&program, &options)?;
    let exports = library_exports();
    let symbols: Vec<String> = exports.iter().map(|e| format!("__tvm_ffi_{}", e.export)).collect();
    let inputs = link::LinkInputs {
        object: &object.bytes,
        streamed: &object.streamed,
        exports: &symbols,
        kernels: &[],
        undefined: &symbols,
    };
    link::link_shared_for(&inputs, out, target)?;
    Ok(exports)
}
