//! Compiled mode: each Relax function's bytecode becomes one native function,
//! `__vmtir__<name>(vm, regs, result, consts, funcs) -> status`, working on the register file
//! directly. A Call stages its arguments in a stack array and calls its target directly (kernels
//! and builtins by symbol; Relax functions through `rvm_invoke`); Goto/If become branches; every
//! failing call branches to one error block that records the function and pc, exactly as the
//! interpreter reports them. Builtins whose work is a few loads and stores (null_value, copy)
//! are inlined.
//!
//! Stack tensors: an `alloc_tensor` whose result only feeds kernels and read-only checks and is
//! killed in the same basic block, while the storage register it views stays untouched, needs no
//! object at all: its DLTensor is built in the native frame and passed as a `DLTensor*`. That
//! removes an allocation and three atomic reference-count updates per operator. Anything the
//! fast path cannot prove at run time (a register not holding a Storage, a view that does not
//! fit) falls back to the builtin, which also reports the error exactly as bytecode does.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    AbiParam, Block, BlockArg, InstBuilder, MemFlagsData, Signature, SourceLoc, StackSlotData, StackSlotKind, Type,
    Value, types,
};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module};
use cranelift_object::ObjectModule;

use super::TablesError;
use crate::host::ffi;
use crate::vm::{Arg, Constant, Executable, FuncKind, Instr, VM_REG, VOID_REG};

const SHIM_CALLS: &str = include_str!("../../runtime-shim/include/rvm_calls.def");

/// One call from generated code into the shim, parsed from `rvm_calls.def`.
#[derive(Debug, Clone)]
pub struct ShimCall {
    pub name: String,
    pub params: Vec<Type>,
    pub ret: Option<Type>,
}

fn c_type(t: &str) -> Option<Type> {
    let t = t.trim();
    if t.ends_with('*') {
        return Some(types::I64);
    }
    match t.split_whitespace().last().unwrap_or("") {
        "int" | "int32_t" => Some(types::I32),
        "int64_t" => Some(types::I64),
        _ => None,
    }
}

/// The shim calls, by name.
pub fn shim_calls() -> &'static HashMap<String, ShimCall> {
    static CALLS: OnceLock<HashMap<String, ShimCall>> = OnceLock::new();
    CALLS.get_or_init(|| {
        SHIM_CALLS
            .lines()
            .filter_map(|l| {
                let body = l.trim().strip_prefix("RVM_CALL(")?;
                let (ret, rest) = body.split_once(',')?;
                let (name, rest) = rest.split_once(',')?;
                let params = rest.trim().strip_prefix('(')?.split_once(')')?.0;
                // Each parameter is "<type> <name>"; dropping the name leaves the type.
                let params = params
                    .split(',')
                    .map(|p| {
                        let ty =
                            if p.contains('*') { "void *" } else { p.trim().rsplit_once(' ').map_or(p, |(t, _)| t) };
                        c_type(ty).expect("rvm_calls.def: unknown parameter type")
                    })
                    .collect();
                let ret =
                    if ret.trim() == "void" { None } else { Some(c_type(ret).expect("rvm_calls.def: return type")) };
                Some((name.trim().to_string(), ShimCall { name: name.trim().to_string(), params, ret }))
            })
            .collect()
    })
}

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

struct Shim {
    alloc_tensor_into: FuncId,
    instrumented_call: FuncId,
    invoke: FuncId,
    fail: FuncId,
    bad_cond: FuncId,
    incref: FuncId,
    decref: FuncId,
}

fn declare_shim(module: &mut ObjectModule) -> Result<Shim, TablesError> {
    let calls = shim_calls();
    let mut declare = |name: &str| -> Result<FuncId, TablesError> {
        let c = calls.get(name).unwrap_or_else(|| panic!("{name} missing from rvm_calls.def"));
        let mut sig = module.make_signature();
        sig.params.extend(c.params.iter().map(|t| AbiParam::new(*t)));
        sig.returns.extend(c.ret.map(AbiParam::new));
        Ok(module.declare_function(&c.name, Linkage::Import, &sig)?)
    };
    Ok(Shim {
        alloc_tensor_into: declare("rvm_alloc_tensor_into")?,
        instrumented_call: declare("rvm_instrumented_call")?,
        invoke: declare("rvm_invoke")?,
        fail: declare("rvm_compiled_fail")?,
        bad_cond: declare("rvm_compiled_bad_cond")?,
        incref: declare("rvm_object_incref")?,
        decref: declare("rvm_object_decref")?,
    })
}

/// The TVM-FFI safe-call signature of kernels and builtins.
pub fn packed_signature(module: &ObjectModule) -> Signature {
    let mut sig = module.make_signature();
    sig.params.extend([types::I64, types::I64, types::I32, types::I64].map(AbiParam::new));
    sig.returns.push(AbiParam::new(types::I32));
    sig
}

fn compiled_signature(module: &ObjectModule) -> Signature {
    let mut sig = module.make_signature();
    sig.params.extend([types::I64; 5].map(AbiParam::new));
    sig.returns.push(AbiParam::new(types::I32));
    sig
}

/// Choices of compiled mode.
#[derive(Debug, Clone)]
pub struct NativeOptions {
    /// Relax functions to leave as bytecode.
    pub keep_bytecode: HashSet<String>,
    /// Inline null_value and copy. Off only to measure what it is worth.
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

/// Lowers every Relax function of `exec` except those kept as bytecode.
pub fn compile_functions(
    module: &mut ObjectModule,
    exec: &Executable,
    symbols: &[Option<String>],
    options: &NativeOptions,
) -> Result<NativeResult, TablesError> {
    let keep_bytecode = &options.keep_bytecode;
    let shim = declare_shim(module)?;
    let packed_sig = packed_signature(module);
    let mut packed = Vec::with_capacity(exec.funcs.len());
    for sym in symbols {
        packed.push(match sym {
            Some(s) => Some(module.declare_function(s, Linkage::Import, &packed_sig)?),
            None => None,
        });
    }
    let mut result = NativeResult { compiled: vec![None; exec.funcs.len()], notes: Vec::new(), clif: String::new() };
    let sig = compiled_signature(module);
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    for (index, f) in exec.funcs.iter().enumerate() {
        if f.kind != FuncKind::Bytecode {
            continue;
        }
        if keep_bytecode.contains(&f.name) {
            result.notes.push((f.name.clone(), "kept as bytecode (--keep-bytecode)".to_string()));
            continue;
        }
        let instrs: Vec<Instr> =
            (f.start_instr..f.end_instr).map(|k| exec.instr(k as usize).expect("verified executable")).collect();
        let chunks = chunk_bounds(&instrs);
        let mut parts = Vec::new();
        for (k, &(lo, hi)) in chunks.iter().enumerate() {
            let symbol =
                if chunks.len() == 1 { native_symbol(&f.name) } else { format!("{}.part{k}", native_symbol(&f.name)) };
            let id = module.declare_function(&symbol, Linkage::Local, &sig)?;
            ctx.func.signature = sig.clone();
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let lowering = Lowering {
                exec,
                func: index,
                symbols,
                packed: &packed,
                shim: &shim,
                module,
                options,
                declared: HashMap::new(),
            };
            lowering.lower(&mut b, &instrs, lo, hi);
            b.finalize(module.isa().frontend_config());
            if options.emit_clif {
                let listing = |pc: u32| instrs.get(pc as usize).map(|i| exec.instr_text(i));
                result.clif.push_str(&format!("; {symbol}: Relax function {}, pc {lo}..{hi}\n", f.name));
                result.clif.push_str(&super::clif_text::annotated(&ctx.func, &listing));
                result.clif.push('\n');
            }
            module.define_function(id, &mut ctx)?;
            if options.emit_clif
                && let Some(code) = ctx.compiled_code()
            {
                let kind = |pc: u32| match instrs.get(pc as usize) {
                    Some(Instr::Call { func, .. }) => {
                        exec.funcs.get(*func as usize).map_or("call", |f| f.name.as_str())
                    }
                    Some(Instr::Ret { .. }) => "ret",
                    Some(Instr::Goto { .. }) => "goto",
                    Some(Instr::If { .. }) => "If",
                    None => "?",
                };
                let spans = code.buffer.get_srclocs_sorted().iter().map(|s| (s.loc, s.end - s.start));
                result.clif.push_str(&super::clif_text::size_summary(code.code_info().total_size, spans, &kind));
                result.clif.push('\n');
            }
            module.clear_context(&mut ctx);
            parts.push(id);
        }
        let id = if parts.len() == 1 {
            parts[0]
        } else {
            let id = module.declare_function(&native_symbol(&f.name), Linkage::Local, &sig)?;
            ctx.func.signature = sig.clone();
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            chunk_driver(module, &mut b, &parts);
            b.finalize(module.isa().frontend_config());
            module.define_function(id, &mut ctx)?;
            module.clear_context(&mut ctx);
            id
        };
        result.compiled[index] = Some(id);
    }
    Ok(result)
}

struct Lowering<'a> {
    exec: &'a Executable,
    func: usize,
    symbols: &'a [Option<String>],
    packed: &'a [Option<FuncId>],
    shim: &'a Shim,
    module: &'a mut ObjectModule,
    options: &'a NativeOptions,
    /// Each callee declared once per function, not once per call site.
    declared: HashMap<FuncId, cranelift_codegen::ir::FuncRef>,
}

/// Values every block can use (defined in the entry block, which dominates all).
struct Env {
    vm: Value,
    regs: Value,
    result: Value,
    consts: Value,
    funcs: Value,
    argv: Value,
    ret: Value,
    error: Block,
}

const ANY: i32 = 16;
const DLTENSOR_SIZE: u32 = 48;

fn flags() -> MemFlagsData {
    MemFlagsData::trusted()
}

impl Lowering<'_> {
    /// A reference to a function linked into the same shared object (kernels, builtins, the
    /// shim), so the call is a direct PC-relative one rather than through a loaded address.
    fn callee(&mut self, id: FuncId, b: &mut FunctionBuilder) -> cranelift_codegen::ir::FuncRef {
        if let Some(&fref) = self.declared.get(&id) {
            return fref;
        }
        let fref = self.module.declare_func_in_func(id, b.func);
        b.func.dfg.ext_funcs[fref].colocated = true;
        self.declared.insert(id, fref);
        fref
    }

    fn builtin(&self, callee: i64) -> Option<&str> {
        let f = &self.exec.funcs[callee as usize];
        (f.kind == FuncKind::Packed).then_some(f.name.as_str())
    }

    /// Lowers instructions [lo, hi) of the function. Returns 0 after Ret, -1 on error, and 1 when
    /// execution runs past `hi` into the next chunk.
    fn lower(mut self, b: &mut FunctionBuilder, all: &[Instr], lo: usize, hi: usize) {
        let instrs = &all[lo..hi];
        let n = instrs.len();
        let mut leader = vec![false; n];
        leader[0] = true;
        let mut max_args = 1;
        for (i, ins) in instrs.iter().enumerate() {
            let mut mark = |t: i64| {
                if let Some(l) = leader.get_mut((i as i64 + t) as usize) {
                    *l = true;
                }
            };
            match ins {
                Instr::Goto { offset } => {
                    mark(*offset);
                    mark(1);
                }
                Instr::If { false_offset, .. } => {
                    mark(1);
                    mark(*false_offset);
                }
                Instr::Ret { .. } => mark(1),
                Instr::Call { args, .. } => max_args = max_args.max(args.len()),
            }
        }

        let sites = if self.options.stack_tensors && !self.options.instrument {
            stack_tensor_sites(self.exec, self.symbols, instrs, &leader)
        } else {
            HashMap::new()
        };

        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let p = b.block_params(entry).to_vec();
        let argv_slot = b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (ANY as u32) * max_args as u32,
            4,
        ));
        let ret_slot = b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, ANY as u32, 4));
        let argv = b.ins().stack_addr(types::I64, argv_slot, 0);
        let ret = b.ins().stack_addr(types::I64, ret_slot, 0);
        let error = b.create_block();
        let env = Env { vm: p[0], regs: p[1], result: p[2], consts: p[3], funcs: p[4], argv, ret, error };
        let mut slots = Vec::new();
        let mut tensor_slots = HashMap::new();
        for (site, slot) in assign_slots(&sites) {
            while slots.len() <= slot {
                let data = StackSlotData::new(StackSlotKind::ExplicitSlot, DLTENSOR_SIZE, 4);
                slots.push(b.create_sized_stack_slot(data));
            }
            tensor_slots.insert(site, slots[slot]);
        }

        let blocks: Vec<Option<Block>> = leader.iter().map(|&l| l.then(|| b.create_block())).collect();
        b.ins().jump(blocks[0].expect("first block"), &[]);
        let mut open = false;
        for (i, ins) in instrs.iter().enumerate() {
            if let Some(block) = blocks[i] {
                if open {
                    b.ins().jump(block, &[]);
                }
                b.switch_to_block(block);
                open = true;
            }
            if !open {
                continue; // unreachable: nothing jumps here
            }
            let pc = (lo + i) as i64;
            // The pc rides on every CLIF instruction made for this one (see clif_text).
            b.set_srcloc(SourceLoc::new(pc as u32));
            let target = |off: i64| blocks[(i as i64 + off) as usize].expect("jump targets are leaders");
            match ins {
                Instr::Call { dst, func, args } => match tensor_slots.get(&i) {
                    Some(slot) => self.stack_tensor(b, &env, pc, *dst, *func, args, *slot),
                    None => self.call(b, &env, pc, *dst, *func, args),
                },
                Instr::Ret { result } => {
                    if *result < VOID_REG {
                        self.copy_any(b, env.regs, reg_offset(*result), env.result, 0);
                        self.zero_any(b, env.regs, reg_offset(*result));
                    } else {
                        self.zero_any(b, env.result, 0);
                    }
                    let zero = b.ins().iconst(types::I32, 0);
                    b.ins().return_(&[zero]);
                    open = false;
                }
                Instr::Goto { offset } => {
                    b.ins().jump(target(*offset), &[]);
                    open = false;
                }
                Instr::If { cond, false_offset } => {
                    let off = reg_offset(*cond);
                    let t = b.ins().load(types::I32, flags(), env.regs, off);
                    let is_int = b.ins().icmp_imm_s(IntCC::Equal, t, ffi::TYPE_INT as i64);
                    let is_bool = b.ins().icmp_imm_s(IntCC::Equal, t, ffi::TYPE_BOOL as i64);
                    let ok = b.ins().bor(is_int, is_bool);
                    let (good, bad) = (b.create_block(), b.create_block());
                    b.ins().brif(ok, good, &[], bad, &[]);
                    b.set_cold_block(bad);
                    b.switch_to_block(bad);
                    let bad_cond = self.callee(self.shim.bad_cond, b);
                    let (fidx, pcv) = (b.ins().iconst(types::I64, self.func as i64), b.ins().iconst(types::I64, pc));
                    let addr = b.ins().iadd_imm_s(env.regs, off as i64);
                    let call = b.ins().call(bad_cond, &[env.vm, fidx, pcv, addr]);
                    let rc = b.inst_results(call)[0];
                    b.ins().return_(&[rc]);
                    b.switch_to_block(good);
                    let v = b.ins().load(types::I64, flags(), env.regs, off + 8);
                    b.ins().brif(v, target(1), &[], target(*false_offset), &[]);
                    open = false;
                }
            }
        }

        b.set_srcloc(SourceLoc::default());
        if open {
            // Execution continues in the next chunk.
            let one = b.ins().iconst(types::I32, 1);
            b.ins().return_(&[one]);
        }

        // The one error path: record where, then return the failure.
        b.append_block_param(env.error, types::I64);
        b.append_block_param(env.error, types::I64);
        b.set_cold_block(env.error);
        b.switch_to_block(env.error);
        let ep = b.block_params(env.error).to_vec();
        let fail = self.callee(self.shim.fail, b);
        let fidx = b.ins().iconst(types::I64, self.func as i64);
        let call = b.ins().call(fail, &[env.vm, fidx, ep[0], ep[1]]);
        let rc = b.inst_results(call)[0];
        b.ins().return_(&[rc]);
        b.seal_all_blocks();
        let _ = (env.consts, env.funcs);
    }

    /// alloc_tensor(storage, offset, shape, dtype) as a DLTensor in the native frame; the builtin
    /// runs instead when the storage register does not hold a Storage the view fits in.
    #[allow(clippy::too_many_arguments)]
    fn stack_tensor(
        &mut self,
        b: &mut FunctionBuilder,
        env: &Env,
        pc: i64,
        dst: i64,
        callee: i64,
        args: &[Arg],
        slot: cranelift_codegen::ir::StackSlot,
    ) {
        let [Arg::Reg(s), Arg::Imm(offset), Arg::Const(shape_c), Arg::Const(dtype_c)] = *args else {
            unreachable!("checked by stack_tensor_sites")
        };
        let (Constant::Shape(dims), Constant::DataType(dtype)) =
            (&self.exec.constants[shape_c as usize], &self.exec.constants[dtype_c as usize])
        else {
            unreachable!("checked by stack_tensor_sites")
        };
        let elems = dims.iter().try_fold(1i64, |a, &d| if d < 0 { None } else { a.checked_mul(d) });
        let nbytes = elems.and_then(|e| e.checked_mul(dtype.bits as i64 * dtype.lanes as i64)).map(|b| (b + 7) / 8);
        let Some(end) = nbytes.and_then(|n| n.checked_add(offset)) else {
            return self.call(b, env, pc, dst, callee, args); // the builtin reports the bad size
        };
        let (fast, slow, join) = (b.create_block(), b.create_block(), b.create_block());
        let t = b.ins().load(types::I32, flags(), env.regs, reg_offset(s));
        let is_storage = b.ins().icmp_imm_s(IntCC::Equal, t, layout::STORAGE_TYPE_INDEX);
        let check = b.create_block();
        b.ins().brif(is_storage, check, &[], slow, &[]);
        b.switch_to_block(check);
        let storage = b.ins().load(types::I64, flags(), env.regs, reg_offset(s) + 8);
        let size = b.ins().load(types::I64, flags(), storage, layout::STORAGE_NBYTES);
        let fits = b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, size, end);
        b.ins().brif(fits, fast, &[], slow, &[]);

        b.switch_to_block(fast);
        let data = b.ins().load(types::I64, flags(), storage, layout::STORAGE_DATA);
        let shape_obj = b.ins().load(types::I64, flags(), env.consts, shape_c as i32 * ANY + 8);
        let shape_ptr = b.ins().load(types::I64, flags(), shape_obj, layout::SHAPE_DATA);
        let t_addr = b.ins().stack_addr(types::I64, slot, 0);
        let word = |b: &mut FunctionBuilder, v: i64| b.ins().iconst(types::I64, v);
        // The storage's device: the CPU, or the VM's CUDA device.
        let device = b.ins().load(types::I64, flags(), storage, layout::STORAGE_DEVICE);
        let ndim_dtype = word(
            b,
            dims.len() as i64 | (dtype.code as i64) << 32 | (dtype.bits as i64) << 40 | (dtype.lanes as i64) << 48,
        );
        let zero = word(b, 0);
        let off = word(b, offset);
        for (at, v) in [(0, data), (8, device), (16, ndim_dtype), (24, shape_ptr), (32, zero), (40, off)] {
            b.ins().store(flags(), v, t_addr, at);
        }
        self.release(b, env.regs, reg_offset(dst));
        let dltensor_ptr = word(b, ffi::TYPE_DLTENSOR_PTR as i64);
        b.ins().store(flags(), dltensor_ptr, env.regs, reg_offset(dst));
        b.ins().store(flags(), t_addr, env.regs, reg_offset(dst) + 8);
        b.ins().jump(join, &[]);

        b.set_cold_block(slow);
        b.switch_to_block(slow);
        let into = self.callee(self.shim.alloc_tensor_into, b);
        let dst_addr = b.ins().iadd_imm_s(env.regs, reg_offset(dst) as i64);
        let storage_addr = b.ins().iadd_imm_s(env.regs, reg_offset(s) as i64);
        let shape_addr = b.ins().iadd_imm_s(env.consts, (shape_c as i32 * ANY) as i64);
        let dtype_addr = b.ins().iadd_imm_s(env.consts, (dtype_c as i32 * ANY) as i64);
        let off = b.ins().iconst(types::I64, offset);
        let call = b.ins().call(into, &[dst_addr, storage_addr, off, shape_addr, dtype_addr]);
        let rc = b.inst_results(call)[0];
        self.branch_on_failure(b, env, rc, pc, callee, join);
        b.switch_to_block(join);
    }

    fn call(&mut self, b: &mut FunctionBuilder, env: &Env, pc: i64, dst: i64, callee: i64, args: &[Arg]) {
        let inline = self.options.inline_builtins && !self.options.instrument;
        match (self.builtin(callee).filter(|_| inline), args) {
            // Inlined: drop what dst holds.
            (Some("vm.builtin.null_value"), []) => {
                if dst < VOID_REG {
                    self.release(b, env.regs, reg_offset(dst));
                    self.zero_any(b, env.regs, reg_offset(dst));
                }
                return;
            }
            // Inlined: dst = a new reference to src.
            (Some("vm.builtin.copy"), [Arg::Reg(src)]) if *src < VOID_REG => {
                if dst < VOID_REG {
                    let t = b.ins().load(types::I64, flags(), env.regs, reg_offset(*src));
                    let v = b.ins().load(types::I64, flags(), env.regs, reg_offset(*src) + 8);
                    self.retain(b, t, v);
                    self.release(b, env.regs, reg_offset(dst));
                    b.ins().store(flags(), t, env.regs, reg_offset(dst));
                    b.ins().store(flags(), v, env.regs, reg_offset(dst) + 8);
                }
                return;
            }
            _ => {}
        }
        for (i, a) in args.iter().enumerate() {
            self.stage_arg(b, env, i as i32 * ANY, *a);
        }
        let zero = b.ins().iconst(types::I64, 0);
        b.ins().store(flags(), zero, env.ret, 0);
        let nargs = b.ins().iconst(types::I32, args.len() as i64);
        let call = match &self.packed[callee as usize] {
            _ if self.options.instrument => {
                let fref = self.callee(self.shim.instrumented_call, b);
                let index = b.ins().iconst(types::I64, callee);
                b.ins().call(fref, &[env.vm, index, env.argv, nargs, env.ret])
            }
            Some(id) if self.symbols[callee as usize].is_some() => {
                let fref = self.callee(*id, b);
                let null = b.ins().iconst(types::I64, 0);
                b.ins().call(fref, &[null, env.argv, nargs, env.ret])
            }
            _ => {
                let fref = self.callee(self.shim.invoke, b);
                let index = b.ins().iconst(types::I64, callee);
                b.ins().call(fref, &[env.vm, index, env.argv, nargs, env.ret])
            }
        };
        let rc = b.inst_results(call)[0];
        let cont = b.create_block();
        self.branch_on_failure(b, env, rc, pc, callee, cont);
        b.switch_to_block(cont);
        if dst < VOID_REG {
            self.release(b, env.regs, reg_offset(dst));
            self.copy_any(b, env.ret, 0, env.regs, reg_offset(dst));
        } else {
            self.release(b, env.ret, 0);
        }
    }

    /// Writes argument `a` as a borrowed view at argv + at.
    fn stage_arg(&mut self, b: &mut FunctionBuilder, env: &Env, at: i32, a: Arg) {
        let pod = |b: &mut FunctionBuilder, type_index: i32, payload: Value| {
            let t = b.ins().iconst(types::I64, type_index as i64);
            b.ins().store(flags(), t, env.argv, at);
            b.ins().store(flags(), payload, env.argv, at + 8);
        };
        match a {
            Arg::Reg(VOID_REG) => {
                let z = b.ins().iconst(types::I64, 0);
                pod(b, ffi::TYPE_NONE, z);
            }
            Arg::Reg(VM_REG) => pod(b, ffi::TYPE_OPAQUE_PTR, env.vm),
            Arg::Reg(r) => self.copy_any(b, env.regs, reg_offset(r), env.argv, at),
            Arg::Imm(v) => {
                let v = b.ins().iconst(types::I64, v);
                pod(b, ffi::TYPE_INT, v);
            }
            Arg::Const(c) => match &self.exec.constants[c as usize] {
                // Values known at compile time are written as immediates.
                Constant::Int(v) => {
                    let v = b.ins().iconst(types::I64, *v);
                    pod(b, ffi::TYPE_INT, v);
                }
                Constant::Float(v) => {
                    let v = b.ins().iconst(types::I64, v.to_bits() as i64);
                    pod(b, ffi::TYPE_FLOAT, v);
                }
                Constant::DataType(d) => {
                    let bits = d.code as i64 | (d.bits as i64) << 8 | (d.lanes as i64) << 16;
                    let v = b.ins().iconst(types::I64, bits);
                    pod(b, ffi::TYPE_DATA_TYPE, v);
                }
                _ => self.copy_any(b, env.consts, c as i32 * ANY, env.argv, at),
            },
            Arg::Func(g) => self.copy_any(b, env.funcs, g as i32 * ANY, env.argv, at),
        }
    }

    /// Continues at `next` when `rc` is 0; otherwise a cold stub passes this call's pc and callee
    /// to the shared error block (keeping those constants off the hot path).
    fn branch_on_failure(&self, b: &mut FunctionBuilder, env: &Env, rc: Value, pc: i64, callee: i64, next: Block) {
        let stub = b.create_block();
        b.set_cold_block(stub);
        b.ins().brif(rc, stub, &[], next, &[]);
        b.switch_to_block(stub);
        let (pcv, cv) = (b.ins().iconst(types::I64, pc), b.ins().iconst(types::I64, callee));
        b.ins().jump(env.error, &[BlockArg::Value(pcv), BlockArg::Value(cv)]);
    }

    fn copy_any(&self, b: &mut FunctionBuilder, from: Value, from_off: i32, to: Value, to_off: i32) {
        let t = b.ins().load(types::I64, flags(), from, from_off);
        let v = b.ins().load(types::I64, flags(), from, from_off + 8);
        b.ins().store(flags(), t, to, to_off);
        b.ins().store(flags(), v, to, to_off + 8);
    }

    fn zero_any(&self, b: &mut FunctionBuilder, at: Value, off: i32) {
        let z = b.ins().iconst(types::I64, 0);
        b.ins().store(flags(), z, at, off);
        b.ins().store(flags(), z, at, off + 8);
    }

    /// Drops the reference held by the Any at `at + off`, if it holds an object.
    fn release(&mut self, b: &mut FunctionBuilder, at: Value, off: i32) {
        let t = b.ins().load(types::I32, flags(), at, off);
        let is_obj = b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, t, ffi::TYPE_STATIC_OBJECT_BEGIN as i64);
        let (drop_block, after) = (b.create_block(), b.create_block());
        b.ins().brif(is_obj, drop_block, &[], after, &[]);
        b.switch_to_block(drop_block);
        let obj = b.ins().load(types::I64, flags(), at, off + 8);
        let decref = self.callee(self.shim.decref, b);
        b.ins().call(decref, &[obj]);
        b.ins().jump(after, &[]);
        b.switch_to_block(after);
    }

    /// Adds a reference if (type word, payload) is an object.
    fn retain(&mut self, b: &mut FunctionBuilder, type_word: Value, payload: Value) {
        let t = b.ins().ireduce(types::I32, type_word);
        let is_obj = b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, t, ffi::TYPE_STATIC_OBJECT_BEGIN as i64);
        let (inc_block, after) = (b.create_block(), b.create_block());
        b.ins().brif(is_obj, inc_block, &[], after, &[]);
        b.switch_to_block(inc_block);
        let incref = self.callee(self.shim.incref, b);
        b.ins().call(incref, &[payload]);
        b.ins().jump(after, &[]);
        b.switch_to_block(after);
    }
}

/// Offsets compiled code reads inside shim objects; checked against the C layouts by
/// tests/artifact.rs.
pub mod layout {
    pub const STORAGE_TYPE_INDEX: i64 = 0x7fff_0000;
    pub const STORAGE_DATA: i32 = 24;
    pub const STORAGE_NBYTES: i32 = 32;
    pub const STORAGE_DEVICE: i32 = 40;
    /// Shape object: the pointer to its dims.
    pub const SHAPE_DATA: i32 = 24;
}

/// Builtins that only read their tensor arguments and never keep them.
const READ_ONLY_BUILTINS: &[&str] = &["vm.builtin.check_tensor_info", "vm.builtin.match_shape"];

/// Gives each stack-tensor site a slot, reusing slots whose tensor is dead: the live ranges are
/// [site, kill], so straight-line code needs only as many slots as tensors alive at once.
fn assign_slots(sites: &HashMap<usize, usize>) -> Vec<(usize, usize)> {
    let mut ranges: Vec<(usize, usize)> = sites.iter().map(|(&s, &k)| (s, k)).collect();
    ranges.sort_unstable();
    let mut busy: Vec<(usize, usize)> = Vec::new(); // (kill, slot)
    let mut free: Vec<usize> = Vec::new();
    let mut next = 0;
    let mut out = Vec::with_capacity(ranges.len());
    for (site, kill) in ranges {
        busy.retain(|&(k, slot)| {
            let live = k >= site;
            if !live {
                free.push(slot);
            }
            live
        });
        let slot = free.pop().unwrap_or_else(|| {
            next += 1;
            next - 1
        });
        busy.push((kill, slot));
        out.push((site, slot));
    }
    out
}

/// Most instructions lowered into one native function. Cranelift's register allocator is
/// superlinear in function size, so longer functions are cut where no jump crosses, into
/// chunks called in turn by a small driver.
const CHUNK_INSTRS: usize = 1500;

fn chunk_bounds(instrs: &[Instr]) -> Vec<(usize, usize)> {
    let n = instrs.len();
    // crossed[p]: some jump spans the boundary between p-1 and p.
    let mut delta = vec![0i64; n + 2];
    for (i, ins) in instrs.iter().enumerate() {
        let off = match ins {
            Instr::Goto { offset } => *offset,
            Instr::If { false_offset, .. } => *false_offset,
            _ => continue,
        };
        let t = (i as i64 + off) as usize;
        let (a, b) = (i.min(t), i.max(t));
        delta[a + 1] += 1;
        delta[b + 1] -= 1;
    }
    let mut crossed = vec![false; n + 1];
    let mut depth = 0;
    for (p, c) in crossed.iter_mut().enumerate() {
        depth += delta[p];
        *c = depth > 0;
    }
    let mut bounds = Vec::new();
    let mut start = 0;
    while n - start > CHUNK_INSTRS {
        let cut = (start + 1..=start + CHUNK_INSTRS)
            .rev()
            .find(|&p| !crossed[p])
            .or_else(|| (start + CHUNK_INSTRS + 1..n).find(|&p| !crossed[p]))
            .unwrap_or(n);
        bounds.push((start, cut));
        start = cut;
    }
    if start < n {
        bounds.push((start, n));
    }
    bounds
}

/// The native function of a chunked Relax function: runs the chunks until one returns or fails.
fn chunk_driver(module: &mut ObjectModule, b: &mut FunctionBuilder, parts: &[FuncId]) {
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry).to_vec();
    for (k, part) in parts.iter().enumerate() {
        let f = module.declare_func_in_func(*part, b.func);
        b.func.dfg.ext_funcs[f].colocated = true;
        let call = b.ins().call(f, &params);
        let rc = b.inst_results(call)[0];
        if k + 1 == parts.len() {
            b.ins().return_(&[rc]);
        } else {
            let (next, done) = (b.create_block(), b.create_block());
            let more = b.ins().icmp_imm_s(IntCC::Equal, rc, 1);
            b.ins().brif(more, next, &[], done, &[]);
            b.switch_to_block(done);
            b.ins().return_(&[rc]);
            b.switch_to_block(next);
        }
    }
    b.seal_all_blocks();
}

/// The alloc_tensor instructions (by chunk-relative pc) whose tensors can live on the stack,
/// with the pc of the null_value that kills each.
fn stack_tensor_sites(
    exec: &Executable,
    symbols: &[Option<String>],
    instrs: &[Instr],
    leader: &[bool],
) -> HashMap<usize, usize> {
    let name = |f: i64| exec.funcs[f as usize].name.as_str();
    let is_kernel = |f: i64| {
        let info = &exec.funcs[f as usize];
        info.kind == FuncKind::Packed && symbols[f as usize].is_some() && super::builtins::find(&info.name).is_none()
    };
    let mut sites = HashMap::new();
    for (i, ins) in instrs.iter().enumerate() {
        let Instr::Call { dst: t, func, args } = ins else {
            continue;
        };
        let (t, s) = match args.as_slice() {
            [Arg::Reg(s), Arg::Imm(off), Arg::Const(shape), Arg::Const(dtype)]
                if name(*func) == "vm.builtin.alloc_tensor"
                    && *off >= 0
                    && *s < VOID_REG
                    && *t < VOID_REG
                    && t != s
                    && matches!(exec.constants[*shape as usize], Constant::Shape(_))
                    && matches!(exec.constants[*dtype as usize], Constant::DataType(_)) =>
            {
                (*t, *s)
            }
            _ => continue,
        };
        let mut kill = None;
        for (j, next) in instrs.iter().enumerate().skip(i + 1) {
            if leader[j] {
                break; // the tensor must die in its own block
            }
            match next {
                Instr::Call { dst, func, args } => {
                    let uses_t = args.contains(&Arg::Reg(t));
                    if uses_t && !(is_kernel(*func) || READ_ONLY_BUILTINS.contains(&name(*func))) {
                        break;
                    }
                    if *dst == s {
                        break; // the storage could be released while the tensor lives
                    }
                    if *dst == t {
                        let is_kill = !uses_t && args.is_empty() && name(*func) == "vm.builtin.null_value";
                        kill = is_kill.then_some(j);
                        break;
                    }
                }
                _ => break, // Ret, Goto and If end the block
            }
        }
        if let Some(k) = kill {
            sites.insert(i, k);
        }
    }
    sites
}

fn reg_offset(r: i64) -> i32 {
    (r * ANY as i64) as i32
}

#[cfg(test)]
mod tests {
    #[test]
    fn shim_call_table_parses() {
        let calls = super::shim_calls();
        let invoke = &calls["rvm_invoke"];
        assert_eq!(invoke.params.len(), 5);
        assert_eq!(invoke.params[3], cranelift_codegen::ir::types::I32);
        assert!(calls["rvm_object_decref"].ret.is_none());
    }
}
