//! Compiled mode: each Relax function's bytecode becomes one native function,
//! `__vmtir__<name>(vm, regs, result, consts, funcs) -> status`, working on the register file
//! directly (`lower`). Two analyses feed it: which tensors can be built on the native stack
//! (`stack_tensors`) and where a long function is cut into chunks (`chunks`).

mod chunks;
mod lower;
mod stack_tensors;

use std::collections::HashSet;

use cranelift_codegen::Context;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module};
use cranelift_object::ObjectModule;

use super::CodegenError;
use crate::vm::{FuncKind, Instr, Verified};

/// Symbol of the native body of Relax function `name`.
pub fn native_symbol(name: &str) -> String {
    format!("__vmtir__{name}")
}

/// What compiled mode did with each function.
#[derive(Debug, Default)]
pub struct NativeResult {
    /// Per function-table entry: the native body, for Relax functions that got one.
    pub compiled: Vec<Option<FuncId>>,
    /// Functions left as bytecode, with the reason.
    pub notes: Vec<(String, String)>,
    /// The CLIF of every native function before optimization, when asked for.
    pub clif: String,
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
    /// Keep each function's CLIF as text, with `; pc=N` comments, in [`NativeResult::clif`].
    pub emit_clif: bool,
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
            emit_clif: false,
            instrument: false,
        }
    }
}

/// What every function's lowering shares: the program, the callees and the choices.
struct Shared<'a> {
    exec: &'a Verified,
    symbols: &'a [Option<String>],
    packed: Vec<Option<FuncId>>,
    shim: lower::Shim,
    options: &'a NativeOptions,
}

/// Lowers every Relax function of `exec` except those kept as bytecode.
pub fn compile_functions(
    module: &mut ObjectModule,
    exec: &Verified,
    symbols: &[Option<String>],
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
    let shared = Shared { exec, symbols, packed, shim, options };
    let mut result = NativeResult { compiled: vec![None; exec.funcs.len()], notes: Vec::new(), clif: String::new() };
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    for (index, f) in exec.funcs.iter().enumerate() {
        if f.kind != FuncKind::Bytecode {
            continue;
        }
        if options.keep_bytecode.contains(&f.name) {
            result.notes.push((f.name.clone(), "kept as bytecode (--keep-bytecode)".to_string()));
            continue;
        }
        let id = compile_function(module, &shared, index, &mut ctx, &mut fctx, &mut result.clif)?;
        result.compiled[index] = Some(id);
    }
    Ok(result)
}

/// Lowers Relax function `index`: one native function, or its chunks and a driver calling them.
fn compile_function(
    module: &mut ObjectModule,
    shared: &Shared,
    index: usize,
    ctx: &mut Context,
    fctx: &mut FunctionBuilderContext,
    clif: &mut String,
) -> Result<FuncId, CodegenError> {
    let exec = shared.exec;
    let f = &exec.funcs[index];
    let sig = super::shim::compiled_signature(module);
    let instrs: Vec<Instr> =
        (f.start_instr..f.end_instr).map(|k| exec.instr(k as usize).expect("verified executable")).collect();
    let bounds = chunks::chunk_bounds(&instrs);
    let mut parts = Vec::new();
    for (k, &(lo, hi)) in bounds.iter().enumerate() {
        let symbol =
            if bounds.len() == 1 { native_symbol(&f.name) } else { format!("{}.part{k}", native_symbol(&f.name)) };
        let id = module.declare_function(&symbol, Linkage::Local, &sig)?;
        ctx.func.signature = sig.clone();
        let mut b = FunctionBuilder::new(&mut ctx.func, fctx);
        lower::Lowering::new(shared, index, module).lower(&mut b, &instrs, lo, hi);
        b.finalize(module.isa().frontend_config());
        if shared.options.emit_clif {
            let listing = |pc: u32| instrs.get(pc as usize).map(|i| exec.instr_text(i));
            clif.push_str(&format!("; {symbol}: Relax function {}, pc {lo}..{hi}\n", f.name));
            clif.push_str(&super::clif_text::annotated(&ctx.func, &listing));
            clif.push('\n');
        }
        module.define_function(id, ctx)?;
        if shared.options.emit_clif
            && let Some(code) = ctx.compiled_code()
        {
            clif.push_str(&size_summary(exec, &instrs, code));
            clif.push('\n');
        }
        module.clear_context(ctx);
        parts.push(id);
    }
    if parts.len() == 1 {
        return Ok(parts[0]);
    }
    let id = module.declare_function(&native_symbol(&f.name), Linkage::Local, &sig)?;
    ctx.func.signature = sig.clone();
    let mut b = FunctionBuilder::new(&mut ctx.func, fctx);
    chunks::chunk_driver(module, &mut b, &parts);
    b.finalize(module.isa().frontend_config());
    module.define_function(id, ctx)?;
    module.clear_context(ctx);
    Ok(id)
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
