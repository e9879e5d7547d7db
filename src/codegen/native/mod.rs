//! Compiled mode: each Relax function's bytecode becomes one native function,
//! `__vmtir__<name>(vm, regs, result, consts, funcs) -> status`, working on the register file
//! directly (`lower`). Two analyses feed it: which tensors can be built on the native stack
//! (`stack_tensors`) and where a long function is cut into chunks (`chunks`).

mod align;
mod chunks;
mod frame;
mod lower;
mod plan;
mod repeats;
mod stack_tensors;

use std::collections::{BTreeSet, HashSet};

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cranelift_codegen::Context;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::isa::TargetIsa;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module, ModuleReloc};
use cranelift_object::ObjectModule;

use super::CodegenError;
use crate::vm::{FuncKind, Instr, Verified};

/// Symbol of the native body of Relax function `name`.
pub fn native_symbol(name: &str) -> String {
    format!("__vmtir__{name}")
}

/// The native body of a Relax function.
#[derive(Debug, Clone, Copy)]
pub struct NativeBody {
    pub id: FuncId,
    /// Size of the register file it works on: the registers it really uses, which may be far
    /// fewer than the bytecode's (see `frame::RegisterFile`).
    pub registers: i64,
}

/// A run of repeated instructions compiled mode wrote as one copy in a loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolledLoop {
    pub function: String,
    /// The pcs the loop runs: `(pcs.end - pcs.start) / period` times the body's instructions.
    pub pcs: std::ops::Range<usize>,
    pub period: usize,
}

/// What compiled mode did with each function.
#[derive(Debug, Default)]
pub struct NativeResult {
    /// Per function-table entry: the native body, for Relax functions that got one.
    pub compiled: Vec<Option<NativeBody>>,
    /// Functions left as bytecode, with the reason.
    pub notes: Vec<(String, String)>,
    /// The CLIF of every native function before optimization, when asked for.
    pub clif: String,
    /// The loops repeated runs became.
    pub loops: Vec<RolledLoop>,
}

/// Choices of compiled mode.
#[derive(Debug, Clone)]
pub struct NativeOptions {
    /// Relax functions to leave as bytecode.
    pub keep_bytecode: HashSet<String>,
    /// Inline the builtins the shim marks RVM_INLINED. Off only to measure what it is worth.
    pub inline_builtins: bool,
    /// Build non-escaping tensors on the native stack. Off only to measure what it is worth.
    pub stack_tensors: bool,
    /// Write a run of repeated calls as one copy in a loop. Off only to measure what it is worth.
    pub roll_loops: bool,
    /// Keep each function's CLIF as text, with `; pc=N` comments, in [`NativeResult::clif`].
    pub emit_clif: bool,
    /// Threads that compile functions to machine code (0: one per core).
    pub jobs: usize,
    /// Every Call reports to the VM's instrument hook (`--instrument`): calls go through the
    /// shim's `rvm_instrumented_call`, nothing is inlined or built on the stack. In bytecode mode
    /// the flag marks the program so that the interpreter does the same.
    pub instrument: bool,
}

impl Default for NativeOptions {
    fn default() -> NativeOptions {
        NativeOptions {
            keep_bytecode: HashSet::new(),
            inline_builtins: true,
            stack_tensors: true,
            roll_loops: true,
            emit_clif: false,
            jobs: 0,
            instrument: false,
        }
    }
}

/// What every function's lowering shares: the program, the callees and the choices.
struct Shared<'a> {
    exec: &'a Verified,
    symbols: &'a [Option<String>],
    packed: Vec<Option<FuncId>>,
    /// Per function-table entry: a call's result may be an object (to release when dropped).
    returns_objects: Vec<bool>,
    shim: lower::Shim,
    options: &'a NativeOptions,
}

/// Lowers every Relax function of `exec` except those kept as bytecode. Functions (and chunks)
/// are built into Cranelift IR one after another, compiled to machine code on all cores, and
/// defined in the object in their original order, so the object is the same whatever the
/// number of threads.
pub fn compile_functions(
    module: &mut ObjectModule,
    exec: &Verified,
    symbols: &[Option<String>],
    scalar_results: &BTreeSet<String>,
    options: &NativeOptions,
) -> Result<NativeResult, CodegenError> {
    let shim = lower::Shim::declare(module)?;
    let packed_sig = super::shim::packed_signature(module);
    let mut packed = Vec::with_capacity(exec.funcs.len());
    for sym in symbols {
        packed.push(match sym {
            Some(s) => Some(module.declare_function(s, Linkage::Import, &packed_sig)?),
            None => None,
        });
    }
    let returns_objects = exec.funcs.iter().map(|f| !scalar_results.contains(&f.name)).collect();
    let shared = Shared { exec, symbols, packed, returns_objects, shim, options };
    let mut result = NativeResult { compiled: vec![None; exec.funcs.len()], ..Default::default() };
    let mut pending = Vec::new();
    let mut fctx = FunctionBuilderContext::new();
    for (index, f) in exec.funcs.iter().enumerate() {
        if f.kind != FuncKind::Bytecode {
            continue;
        }
        if options.keep_bytecode.contains(&f.name) {
            result.notes.push((f.name.clone(), "kept as bytecode (--keep-bytecode)".to_string()));
            continue;
        }
        result.compiled[index] =
            Some(build_function(module, &shared, index, &mut fctx, &mut pending, &mut result.loops)?);
    }
    let compiled = compile_all(module.isa(), exec, &mut pending, options.jobs)?;
    for (p, code) in pending.iter().zip(compiled) {
        module.define_function_bytes(p.id, code.alignment, &code.bytes, &code.relocs)?;
        result.clif.push_str(&p.clif);
        result.clif.push_str(&code.summary);
    }
    Ok(result)
}

/// A native function built as Cranelift IR, waiting to be compiled.
struct Pending {
    id: FuncId,
    ctx: Context,
    /// Its CLIF text with `; pc=N` comments (with --emit-clif), and the instructions to
    /// summarize its machine code by.
    clif: String,
    source: Option<Vec<Instr>>,
    /// It holds a rolled loop, whose header is worth aligning (align.rs).
    rolled: bool,
}

/// A native function compiled to machine code.
struct Compiled {
    alignment: u64,
    bytes: Vec<u8>,
    relocs: Vec<ModuleReloc>,
    summary: String,
}

/// Builds Relax function `index` as Cranelift IR: one native function, or its chunks and a
/// driver calling them. Returns the function the tables point at.
fn build_function(
    module: &mut ObjectModule,
    shared: &Shared,
    index: usize,
    fctx: &mut FunctionBuilderContext,
    pending: &mut Vec<Pending>,
    loops: &mut Vec<RolledLoop>,
) -> Result<NativeBody, CodegenError> {
    let exec = shared.exec;
    let f = &exec.funcs[index];
    let sig = super::shim::compiled_signature(module);
    let instrs: Vec<Instr> =
        (f.start_instr..f.end_instr).map(|k| exec.instr(k as usize).expect("verified executable")).collect();
    let facts = stack_tensors::FunctionFacts::of(exec, &instrs, f.num_args);
    let bounds = chunks::chunk_bounds(&instrs, &plan::chunk_weights(shared, &facts, &instrs));
    let registers = std::cell::RefCell::new(frame::RegisterFile::new(f.num_args));
    let mut parts = Vec::new();
    for (k, &(lo, hi)) in bounds.iter().enumerate() {
        let symbol =
            if bounds.len() == 1 { native_symbol(&f.name) } else { format!("{}.part{k}", native_symbol(&f.name)) };
        let id = module.declare_function(&symbol, Linkage::Local, &sig)?;
        let mut ctx = module.make_context();
        ctx.func.signature = sig.clone();
        let mut b = FunctionBuilder::new(&mut ctx.func, fctx);
        let before = loops.len();
        loops.extend(lower::Lowering::new(shared, index, module, &registers).lower(&mut b, &instrs, &facts, lo, hi));
        let rolled = loops.len() > before;
        b.finalize(module.isa().frontend_config());
        let mut clif = String::new();
        if shared.options.emit_clif {
            let listing = |pc: u32| instrs.get(pc as usize).map(|i| exec.instr_text(i));
            clif.push_str(&format!("; {symbol}: Relax function {}, pc {lo}..{hi}\n", f.name));
            clif.push_str(&super::clif_text::annotated(&ctx.func, &listing));
            clif.push('\n');
        }
        let source = shared.options.emit_clif.then(|| instrs.clone());
        pending.push(Pending { id, ctx, clif, source, rolled });
        parts.push(id);
    }
    let registers = registers.borrow().size();
    if parts.len() == 1 {
        return Ok(NativeBody { id: parts[0], registers });
    }
    let id = module.declare_function(&native_symbol(&f.name), Linkage::Local, &sig)?;
    let mut ctx = module.make_context();
    ctx.func.signature = sig.clone();
    let mut b = FunctionBuilder::new(&mut ctx.func, fctx);
    chunks::chunk_driver(module, &mut b, &parts);
    b.finalize(module.isa().frontend_config());
    pending.push(Pending { id, ctx, clif: String::new(), source: None, rolled: false });
    Ok(NativeBody { id, registers })
}

/// Compiles every pending function, on up to `jobs` threads (0: one per core).
fn compile_all(
    isa: &dyn TargetIsa,
    exec: &Verified,
    pending: &mut [Pending],
    jobs: usize,
) -> Result<Vec<Compiled>, CodegenError> {
    let jobs = if jobs == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { jobs };
    let jobs = jobs.clamp(1, pending.len().max(1));
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<&mut Pending>> = pending.iter_mut().map(Mutex::new).collect();
    let results: Vec<Mutex<Option<Result<Compiled, CodegenError>>>> = slots.iter().map(|_| Mutex::new(None)).collect();
    let work = || {
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            let Some(slot) = slots.get(k) else { break };
            let mut p = slot.lock().expect("a compile thread panicked");
            let compiled = compile_one(isa, exec, &mut p);
            *results[k].lock().expect("a compile thread panicked") = Some(compiled);
        }
    };
    if jobs == 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                scope.spawn(work);
            }
        });
    }
    results.into_iter().map(|r| r.into_inner().expect("a compile thread panicked").expect("compiled")).collect()
}

fn compile_one(isa: &dyn TargetIsa, exec: &Verified, p: &mut Pending) -> Result<Compiled, CodegenError> {
    p.ctx.compile(isa, &mut ControlPlane::default()).map_err(|e| CodegenError::Compile(format!("{:?}", e.inner)))?;
    let code = p.ctx.compiled_code().expect("just compiled");
    // The ISA's preferred alignment, not the buffer's minimum (1 on x86-64); on x86-64 a
    // function with a loop is aligned further, and padded so that the loop starts on a boundary
    // (align.rs).
    let mut alignment = (code.buffer.alignment as u64).max(isa.function_alignment().preferred as u64);
    let x86 = isa.triple().architecture == target_lexicon::Architecture::X86_64;
    let padding = if p.rolled && x86 { align::loop_padding(code) } else { 0 };
    let mut bytes = align::x86_nops(padding);
    bytes.extend_from_slice(code.buffer.data());
    if p.rolled && x86 {
        align::shorten_back_edges(&mut bytes, code);
    }
    if padding > 0 {
        alignment = alignment.max(align::PADDED_FUNCTION_ALIGN);
    }
    let relocs = code
        .buffer
        .relocs()
        .iter()
        .map(|r| {
            let mut reloc = ModuleReloc::from_mach_reloc(r, &p.ctx.func, p.id);
            reloc.offset += padding as u32;
            reloc
        })
        .collect::<Vec<_>>();
    let summary = match &p.source {
        Some(instrs) => format!("{}\n", size_summary(exec, instrs, code)),
        None => String::new(),
    };
    Ok(Compiled { alignment, bytes, relocs, summary })
}

/// The bytes of machine code per kind of instruction, read from the pc source locations.
fn size_summary(exec: &Verified, instrs: &[Instr], code: &cranelift_codegen::CompiledCode) -> String {
    let kind = |pc: u32| match instrs.get(pc as usize) {
        Some(Instr::Call { func, .. }) => exec.funcs.get(*func as usize).map_or("call", |f| f.name.as_str()),
        Some(Instr::Ret { .. }) => "ret",
        Some(Instr::Goto { .. }) => "goto",
        Some(Instr::If { .. }) => "If",
        None => "?",
    };
    let spans = code.buffer.get_srclocs_sorted().iter().map(|s| (s.loc, s.end - s.start));
    super::clif_text::size_summary(code.code_info().total_size, spans, &kind)
}
