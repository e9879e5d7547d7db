//! Lowering one Relax function (or one chunk of it) to Cranelift IR on the register file. A
//! Call stages its arguments in one of two arrays on the native stack and calls its target directly
//! (kernels and builtins by symbol; Relax functions through `rvm_invoke`); Goto/If become
//! branches; every failing call branches to one error block that records the function and pc,
//! exactly as the interpreter reports them. Builtins the shim marks RVM_INLINED are written
//! inline, and tensors `stack_tensors` finds short-lived are built in the native frame; anything
//! a fast path cannot prove at compile time is checked at run time and falls back to the
//! builtin, which also reports the error exactly as bytecode does. Every offset into a VM
//! structure comes from `crate::abi`.
//!
//! Code size is what limits compiled mode on big models (the code of a long function is
//! streamed through the instruction cache on every call), so within a basic block the lowering
//! remembers what the native frame already holds: each word of the argument array (callees
//! take it as `const` and leave it as it was), each stack tensor's DLTensor, which registers are
//! virtual, and whether the result cell may hold bits of an object we do not own. A store whose
//! value is already there is not emitted. In a chain of kernel calls on stack tensors that leaves
//! the call itself and the argument words that change.

use std::cell::RefCell;
use std::collections::HashMap;
use std::mem::{offset_of, size_of};

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    Block, BlockArg, FuncRef, InstBuilder, SourceLoc, StackSlotData, StackSlotKind, Value, types,
};
use cranelift_frontend::FunctionBuilder;
use cranelift_module::{FuncId, Module};
use cranelift_object::ObjectModule;

use super::frame::{
    ARGUMENT_ARRAYS, Env, Known, LOOKAHEAD_CALLS, RegisterFile, SLOT_ALIGN_SHIFT, Word, any_offset, copy_any, flags,
    prologue, zero_any,
};
use super::stack_tensors::{self, FunctionFacts, Site, View};
use super::{Shared, chunks};
use crate::abi::{self, ANY_PAYLOAD, ANY_TYPE_INDEX, DLTensor};
use crate::codegen::CodegenError;
use crate::codegen::shim::{Builtin, declare_call, find_builtin};
use crate::vm::{Arg, Constant, FuncKind, Instr, VM_REG, VOID_REG};

/// The shim functions compiled code calls.
pub struct Shim {
    alloc_tensor_into: FuncId,
    instrumented_call: FuncId,
    invoke: FuncId,
    fail: FuncId,
    bad_cond: FuncId,
    incref: FuncId,
    decref: FuncId,
}

impl Shim {
    pub fn declare(module: &mut ObjectModule) -> Result<Shim, CodegenError> {
        Ok(Shim {
            alloc_tensor_into: declare_call(module, "rvm_alloc_tensor_into")?,
            instrumented_call: declare_call(module, "rvm_instrumented_call")?,
            invoke: declare_call(module, "rvm_invoke")?,
            fail: declare_call(module, "rvm_compiled_fail")?,
            bad_cond: declare_call(module, "rvm_compiled_bad_cond")?,
            incref: declare_call(module, "rvm_object_incref")?,
            decref: declare_call(module, "rvm_object_decref")?,
        })
    }
}

/// A builtin call compiled mode writes inline.
#[derive(Clone, Copy)]
enum Inlined {
    NullValue,
    /// `copy` of this register.
    Copy(i64),
}

/// The ndim and dtype fields of a DLTensor share one 8-byte word, written with one store.
const NDIM_DTYPE_SHIFT: i64 = 8 * (offset_of!(DLTensor, dtype) - offset_of!(DLTensor, ndim)) as i64;
const _: () = assert!(offset_of!(DLTensor, dtype) == offset_of!(DLTensor, ndim) + size_of::<i32>());
const _: () = assert!(offset_of!(DLTensor, ndim).is_multiple_of(8));
const _: () = assert!(size_of::<abi::DLDevice>() == size_of::<i64>());

pub struct Lowering<'a> {
    shared: &'a Shared<'a>,
    func: usize,
    module: &'a mut ObjectModule,
    /// Each callee declared once per function, not once per call site.
    declared: HashMap<FuncId, FuncRef>,
    known: Known,
    /// Whether `known` may be trusted (not in an instrumented build, whose hook sees every call).
    track: bool,
    /// Shared by the chunks of one function.
    registers: &'a RefCell<RegisterFile>,
    /// Per instruction of the chunk: the words a call will stage (see `plan_calls`).
    plan: Vec<Option<Vec<Word>>>,
    leader: Vec<bool>,
    /// The instruction being lowered (an index into `plan`).
    at: usize,
}

/// Blocks start at jump targets and after control transfers; also returns the most arguments
/// any call passes (the size of the staging array).
pub fn leaders(instrs: &[Instr]) -> (Vec<bool>, usize) {
    let mut leader = vec![false; instrs.len()];
    if let Some(first) = leader.first_mut() {
        *first = true;
    }
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
    (leader, max_args)
}

impl<'a> Lowering<'a> {
    pub fn new(
        shared: &'a Shared<'a>,
        func: usize,
        module: &'a mut ObjectModule,
        registers: &'a RefCell<RegisterFile>,
    ) -> Lowering<'a> {
        let track = !shared.options.instrument;
        Lowering {
            shared,
            func,
            module,
            declared: HashMap::new(),
            known: Known::default(),
            track,
            registers,
            plan: Vec::new(),
            leader: Vec::new(),
            at: 0,
        }
    }

    /// Byte offset of register `r` in the register file.
    fn reg(&self, r: i64) -> i32 {
        any_offset(self.registers.borrow_mut().place(r))
    }

    /// A reference to a function linked into the same shared object (kernels, builtins, the
    /// shim), so the call is a direct PC-relative one rather than through a loaded address.
    fn callee(&mut self, id: FuncId, b: &mut FunctionBuilder) -> FuncRef {
        if let Some(&fref) = self.declared.get(&id) {
            return fref;
        }
        let fref = self.module.declare_func_in_func(id, b.func);
        b.func.dfg.ext_funcs[fref].colocated = true;
        self.declared.insert(id, fref);
        fref
    }

    fn builtin(&self, callee: i64) -> Option<&'static Builtin> {
        let f = &self.shared.exec.funcs[callee as usize];
        if f.kind == FuncKind::Packed { find_builtin(&f.name) } else { None }
    }

    /// Lowers instructions [lo, hi) of the function. The native function returns 0 after Ret,
    /// -1 on error, and [`chunks::CONTINUE`] when execution runs past `hi` into the next chunk.
    pub fn lower(mut self, b: &mut FunctionBuilder, all: &[Instr], facts: &FunctionFacts, lo: usize, hi: usize) {
        let instrs = &all[lo..hi];
        let (leader, max_args) = leaders(instrs);
        let options = self.shared.options;
        let sites = if options.stack_tensors && !options.instrument {
            stack_tensors::sites(self.shared.exec, self.shared.symbols, facts, instrs, lo, &leader)
        } else {
            HashMap::new()
        };
        let mut env = prologue(b, max_args);
        let mut tensor_slots: HashMap<usize, (usize, Site)> = HashMap::new();
        for (site, slot) in stack_tensors::assign_slots(&sites) {
            while env.slots.len() <= slot {
                let size = size_of::<DLTensor>() as u32;
                let data = StackSlotData::new(StackSlotKind::ExplicitSlot, size, SLOT_ALIGN_SHIFT);
                env.slots.push(b.create_sized_stack_slot(data));
            }
            tensor_slots.insert(site, (slot, sites[&site]));
        }
        self.known = Known::new(max_args, env.slots.len());
        self.plan = self.plan_calls(instrs, &leader, &tensor_slots);
        let blocks: Vec<Option<Block>> = leader.iter().map(|&l| l.then(|| b.create_block())).collect();
        self.leader = leader;
        b.ins().jump(blocks[0].expect("first block"), &[]);
        let mut open = false;
        for (i, ins) in instrs.iter().enumerate() {
            if let Some(block) = blocks[i] {
                if open {
                    b.ins().jump(block, &[]);
                }
                b.switch_to_block(block);
                self.known.forget();
                open = true;
            }
            if !open {
                continue; // unreachable: nothing jumps here
            }
            let pc = (lo + i) as i64;
            // The pc rides on every CLIF instruction made for this one (see clif_text).
            b.set_srcloc(SourceLoc::new(pc as u32));
            let target = |off: i64| blocks[(i as i64 + off) as usize].expect("jump targets are leaders");
            self.at = i;
            match ins {
                Instr::Call { dst, func, args } => match tensor_slots.get(&i) {
                    Some(&(slot, site)) if site.proven => self.proven_tensor(b, &env, *dst, slot, site.view),
                    Some(&(slot, site)) => self.checked_tensor(b, &env, pc, *dst, args, slot, site.end),
                    None => self.call(b, &env, pc, *dst, *func, args),
                },
                Instr::Ret { result } => {
                    self.ret(b, &env, *result);
                    open = false;
                }
                Instr::Goto { offset } => {
                    b.ins().jump(target(*offset), &[]);
                    open = false;
                }
                Instr::If { cond, false_offset } => {
                    self.branch(b, &env, pc, *cond, target(1), target(*false_offset));
                    open = false;
                }
            }
            if !self.track {
                self.known.forget();
            }
        }

        b.set_srcloc(SourceLoc::default());
        if open {
            let more = b.ins().iconst(types::I32, chunks::CONTINUE);
            b.ins().return_(&[more]);
        }
        self.error_block(b, &env);
        b.seal_all_blocks();
    }

    /// Ret: moves the result register into *result.
    fn ret(&mut self, b: &mut FunctionBuilder, env: &Env, result: i64) {
        debug_assert!(!self.known.virtual_regs.contains_key(&result), "a virtual register never reaches a Ret");
        if result < VOID_REG {
            copy_any(b, env.regs, self.reg(result), env.result, 0);
            zero_any(b, env.regs, self.reg(result));
        } else {
            zero_any(b, env.result, 0);
        }
        let zero = b.ins().iconst(types::I32, 0);
        b.ins().return_(&[zero]);
    }

    /// If: branches on an Int or Bool register; anything else is If's TypeError.
    fn branch(&mut self, b: &mut FunctionBuilder, env: &Env, pc: i64, cond: i64, then: Block, otherwise: Block) {
        let off = self.reg(cond);
        let t = b.ins().load(types::I32, flags(), env.regs, off + ANY_TYPE_INDEX);
        let is_int = b.ins().icmp_imm_s(IntCC::Equal, t, abi::TYPE_INT as i64);
        let is_bool = b.ins().icmp_imm_s(IntCC::Equal, t, abi::TYPE_BOOL as i64);
        let ok = b.ins().bor(is_int, is_bool);
        let (good, bad) = (b.create_block(), b.create_block());
        b.ins().brif(ok, good, &[], bad, &[]);
        b.set_cold_block(bad);
        b.switch_to_block(bad);
        let bad_cond = self.callee(self.shared.shim.bad_cond, b);
        let (fidx, pcv) = (b.ins().iconst(types::I64, self.func as i64), b.ins().iconst(types::I64, pc));
        let addr = b.ins().iadd_imm_s(env.regs, off as i64);
        let call = b.ins().call(bad_cond, &[env.vm, fidx, pcv, addr]);
        let rc = b.inst_results(call)[0];
        b.ins().return_(&[rc]);
        b.switch_to_block(good);
        let v = b.ins().load(types::I64, flags(), env.regs, off + ANY_PAYLOAD);
        b.ins().brif(v, then, &[], otherwise, &[]);
    }

    /// The one error path: records where (the failing call's pc arrives as a block argument; the
    /// shim reads the callee from the instruction), then returns the failure.
    fn error_block(&mut self, b: &mut FunctionBuilder, env: &Env) {
        b.append_block_param(env.error, types::I64);
        b.set_cold_block(env.error);
        b.switch_to_block(env.error);
        let pc = b.block_params(env.error)[0];
        let fail = self.callee(self.shared.shim.fail, b);
        let fidx = b.ins().iconst(types::I64, self.func as i64);
        let call = b.ins().call(fail, &[env.vm, fidx, pc]);
        let rc = b.inst_results(call)[0];
        b.ins().return_(&[rc]);
    }

    /// A stack tensor proven at compile time: its DLTensor is written where it differs from what
    /// the slot already holds, and its register becomes virtual.
    fn proven_tensor(&mut self, b: &mut FunctionBuilder, env: &Env, dst: i64, slot: usize, view: View) {
        let previous = self.known.slots[slot];
        if previous != Some(view) {
            let t_addr = b.ins().stack_addr(types::I64, env.slots[slot], 0);
            let differs = |field: fn(&View) -> i64| previous.is_none_or(|p| field(&p) != field(&view));
            if differs(|v| v.storage) {
                let storage = b.ins().load(types::I64, flags(), env.regs, self.reg(view.storage) + ANY_PAYLOAD);
                let data = b.ins().load(types::I64, flags(), storage, abi::STORAGE_DATA);
                b.ins().store(flags(), data, t_addr, offset_of!(DLTensor, data) as i32);
                // The storage's device: the CPU, or the VM's CUDA device.
                let device = b.ins().load(types::I64, flags(), storage, abi::STORAGE_DEVICE);
                b.ins().store(flags(), device, t_addr, offset_of!(DLTensor, device) as i32);
            }
            self.write_view_constants(b, env, t_addr, view, previous);
            self.known.slots[slot] = Some(view);
        }
        self.known.virtual_regs.insert(dst, slot);
    }

    /// The DLTensor fields that come from the view's constants (shape, ndim and dtype, strides,
    /// byte offset), where they differ from the slot's previous view.
    fn write_view_constants(
        &mut self,
        b: &mut FunctionBuilder,
        env: &Env,
        t_addr: Value,
        view: View,
        previous: Option<View>,
    ) {
        let constants = &self.shared.exec.constants;
        let (Constant::Shape(dims), Constant::DataType(dtype)) =
            (&constants[view.shape as usize], &constants[view.dtype as usize])
        else {
            unreachable!("checked by stack_tensors::sites")
        };
        let differs = |field: fn(&View) -> i64| previous.is_none_or(|p| field(&p) != field(&view));
        if differs(|v| v.shape) {
            let shape_obj = b.ins().load(types::I64, flags(), env.consts, any_offset(view.shape) + ANY_PAYLOAD);
            let shape_ptr = b.ins().load(types::I64, flags(), shape_obj, abi::SHAPE_DIMS);
            b.ins().store(flags(), shape_ptr, t_addr, offset_of!(DLTensor, shape) as i32);
        }
        if differs(|v| v.shape) || differs(|v| v.dtype) {
            let dtype_word = abi::DLDataType { code: dtype.code, bits: dtype.bits, lanes: dtype.lanes }.word() as i64;
            let ndim_dtype = b.ins().iconst(types::I64, dims.len() as i64 | dtype_word << NDIM_DTYPE_SHIFT);
            b.ins().store(flags(), ndim_dtype, t_addr, offset_of!(DLTensor, ndim) as i32);
        }
        if previous.is_none() {
            let zero = b.ins().iconst(types::I64, 0);
            b.ins().store(flags(), zero, t_addr, offset_of!(DLTensor, strides) as i32);
        }
        if differs(|v| v.offset) {
            let off = b.ins().iconst(types::I64, view.offset);
            b.ins().store(flags(), off, t_addr, offset_of!(DLTensor, byte_offset) as i32);
        }
    }

    /// alloc_tensor(storage, offset, shape, dtype) as a DLTensor in the native frame, checked at
    /// run time: the builtin runs instead when the storage register does not hold a Storage the
    /// view fits in. The register holds the tensor either way.
    #[allow(clippy::too_many_arguments)]
    fn checked_tensor(
        &mut self,
        b: &mut FunctionBuilder,
        env: &Env,
        pc: i64,
        dst: i64,
        args: &[Arg],
        slot: usize,
        end: i64,
    ) {
        let [Arg::Reg(s), Arg::Imm(offset), Arg::Const(shape_c), Arg::Const(dtype_c)] = *args else {
            unreachable!("checked by stack_tensors::sites")
        };
        let (fast, slow, join) = (b.create_block(), b.create_block(), b.create_block());
        let t = b.ins().load(types::I32, flags(), env.regs, self.reg(s) + ANY_TYPE_INDEX);
        let is_storage = b.ins().icmp_imm_s(IntCC::Equal, t, abi::TYPE_STORAGE as i64);
        let check = b.create_block();
        b.ins().brif(is_storage, check, &[], slow, &[]);
        b.switch_to_block(check);
        let storage = b.ins().load(types::I64, flags(), env.regs, self.reg(s) + ANY_PAYLOAD);
        let size = b.ins().load(types::I64, flags(), storage, abi::STORAGE_NBYTES);
        let fits = b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, size, end);
        b.ins().brif(fits, fast, &[], slow, &[]);

        b.switch_to_block(fast);
        let t_addr = b.ins().stack_addr(types::I64, env.slots[slot], 0);
        let data = b.ins().load(types::I64, flags(), storage, abi::STORAGE_DATA);
        b.ins().store(flags(), data, t_addr, offset_of!(DLTensor, data) as i32);
        let device = b.ins().load(types::I64, flags(), storage, abi::STORAGE_DEVICE);
        b.ins().store(flags(), device, t_addr, offset_of!(DLTensor, device) as i32);
        let view = View { storage: s, offset, shape: shape_c, dtype: dtype_c };
        self.write_view_constants(b, env, t_addr, view, None);
        self.release(b, env.regs, self.reg(dst));
        let dltensor_ptr = b.ins().iconst(types::I64, abi::TYPE_DLTENSOR_PTR as i64);
        b.ins().store(flags(), dltensor_ptr, env.regs, self.reg(dst) + ANY_TYPE_INDEX);
        b.ins().store(flags(), t_addr, env.regs, self.reg(dst) + ANY_PAYLOAD);
        b.ins().jump(join, &[]);

        b.set_cold_block(slow);
        b.switch_to_block(slow);
        let into = self.callee(self.shared.shim.alloc_tensor_into, b);
        let dst_addr = b.ins().iadd_imm_s(env.regs, self.reg(dst) as i64);
        let storage_addr = b.ins().iadd_imm_s(env.regs, self.reg(s) as i64);
        let shape_addr = b.ins().iadd_imm_s(env.consts, any_offset(shape_c) as i64);
        let dtype_addr = b.ins().iadd_imm_s(env.consts, any_offset(dtype_c) as i64);
        let off = b.ins().iconst(types::I64, offset);
        let call = b.ins().call(into, &[dst_addr, storage_addr, off, shape_addr, dtype_addr]);
        let rc = b.inst_results(call)[0];
        self.branch_on_failure(b, env, rc, pc, join);
        b.switch_to_block(join);
        // Only the fast path wrote the slot.
        self.known.slots[slot] = None;
        self.known.written(dst);
    }

    /// The builtin compiled mode writes inline that this call is, if it is one.
    fn inlined(&self, callee: i64, args: &[Arg]) -> Option<Inlined> {
        let options = self.shared.options;
        if !options.inline_builtins || options.instrument {
            return None;
        }
        match self.builtin(callee).filter(|b| b.inlined).map(|b| (b.name, args)) {
            Some(("vm.builtin.null_value", [])) => Some(Inlined::NullValue),
            Some(("vm.builtin.copy", [Arg::Reg(src)])) if *src < VOID_REG => Some(Inlined::Copy(*src)),
            _ => None,
        }
    }

    /// A builtin's work written inline; false when `callee` is not one compiled mode inlines.
    fn inline_builtin(&mut self, b: &mut FunctionBuilder, env: &Env, dst: i64, callee: i64, args: &[Arg]) -> bool {
        let Some(inlined) = self.inlined(callee, args) else {
            return false;
        };
        match inlined {
            // Drop what dst holds (a virtual register already holds None).
            Inlined::NullValue => {
                if self.known.virtual_regs.remove(&dst).is_none() && dst < VOID_REG {
                    self.release(b, env.regs, self.reg(dst));
                    zero_any(b, env.regs, self.reg(dst));
                    self.known.written(dst);
                }
                true
            }
            // dst = a new reference to src.
            Inlined::Copy(src) => {
                debug_assert!(!self.known.virtual_regs.contains_key(&src), "only kernels read virtual registers");
                if dst < VOID_REG {
                    let t = b.ins().load(types::I64, flags(), env.regs, self.reg(src) + ANY_TYPE_INDEX);
                    let v = b.ins().load(types::I64, flags(), env.regs, self.reg(src) + ANY_PAYLOAD);
                    self.retain(b, t, v);
                    self.release(b, env.regs, self.reg(dst));
                    b.ins().store(flags(), t, env.regs, self.reg(dst) + ANY_TYPE_INDEX);
                    b.ins().store(flags(), v, env.regs, self.reg(dst) + ANY_PAYLOAD);
                    self.known.written(dst);
                }
                true
            }
        }
    }

    fn call(&mut self, b: &mut FunctionBuilder, env: &Env, pc: i64, dst: i64, callee: i64, args: &[Arg]) {
        if self.inline_builtin(b, env, dst, callee, args) {
            return;
        }
        let words = self.call_words(args, &self.known.virtual_regs);
        let array = self.argument_array(&words);
        self.stage(b, env, array, &words);
        let argv = env.argv[array];
        if dst < VOID_REG || self.known.ret_dirty {
            // A callee that writes no result leaves None.
            let zero = b.ins().iconst(types::I64, 0);
            b.ins().store(flags(), zero, env.ret, ANY_TYPE_INDEX);
            self.known.ret_dirty = false;
        }
        let nargs = b.ins().iconst(types::I32, args.len() as i64);
        let shared = self.shared;
        let call = match &shared.packed[callee as usize] {
            _ if shared.options.instrument => {
                let fref = self.callee(shared.shim.instrumented_call, b);
                let index = b.ins().iconst(types::I64, callee);
                b.ins().call(fref, &[env.vm, index, argv, nargs, env.ret])
            }
            Some(id) if shared.symbols[callee as usize].is_some() => {
                let fref = self.callee(*id, b);
                let null = b.ins().iconst(types::I64, 0);
                b.ins().call(fref, &[null, argv, nargs, env.ret])
            }
            _ => {
                let fref = self.callee(shared.shim.invoke, b);
                let index = b.ins().iconst(types::I64, callee);
                b.ins().call(fref, &[env.vm, index, argv, nargs, env.ret])
            }
        };
        let rc = b.inst_results(call)[0];
        let cont = b.create_block();
        self.branch_on_failure(b, env, rc, pc, cont);
        b.switch_to_block(cont);
        if dst < VOID_REG {
            self.release(b, env.regs, self.reg(dst));
            copy_any(b, env.ret, 0, env.regs, self.reg(dst));
            self.known.written(dst);
            // The result cell still holds the bits of what dst now owns.
            self.known.ret_dirty = true;
        } else if shared.returns_objects[callee as usize] {
            self.drop_result(b, env);
        }
    }

    /// Releases the result of a call whose result is dropped, if it is an object (a cold path
    /// that also clears the cell, so the next such call need not).
    fn drop_result(&mut self, b: &mut FunctionBuilder, env: &Env) {
        let t = b.ins().load(types::I32, flags(), env.ret, ANY_TYPE_INDEX);
        let is_obj = b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, t, abi::TYPE_STATIC_OBJECT_BEGIN as i64);
        let (drop_block, after) = (b.create_block(), b.create_block());
        b.ins().brif(is_obj, drop_block, &[], after, &[]);
        b.set_cold_block(drop_block);
        b.switch_to_block(drop_block);
        let obj = b.ins().load(types::I64, flags(), env.ret, ANY_PAYLOAD);
        let decref = self.callee(self.shared.shim.decref, b);
        b.ins().call(decref, &[obj]);
        let zero = b.ins().iconst(types::I64, 0);
        b.ins().store(flags(), zero, env.ret, ANY_TYPE_INDEX);
        b.ins().jump(after, &[]);
        b.switch_to_block(after);
    }

    /// The two words argument `a` is staged as, given which registers are virtual.
    fn arg_words(&self, a: Arg, virtual_regs: &HashMap<i64, usize>) -> (Word, Word) {
        match a {
            Arg::Reg(VOID_REG) => (Word::Bits(abi::TYPE_NONE as i64), Word::Bits(0)),
            Arg::Reg(VM_REG) => (Word::Bits(abi::TYPE_OPAQUE_PTR as i64), Word::Vm),
            Arg::Reg(r) => match virtual_regs.get(&r) {
                Some(&slot) => (Word::Bits(abi::TYPE_DLTENSOR_PTR as i64), Word::Slot(slot)),
                None => (Word::Reg(r), Word::Reg(r)),
            },
            Arg::Imm(v) => (Word::Bits(abi::TYPE_INT as i64), Word::Bits(v)),
            // Values known at compile time are written as immediates.
            Arg::Const(c) => match &self.shared.exec.constants[c as usize] {
                Constant::Int(v) => (Word::Bits(abi::TYPE_INT as i64), Word::Bits(*v)),
                Constant::Float(v) => (Word::Bits(abi::TYPE_FLOAT as i64), Word::Bits(v.to_bits() as i64)),
                Constant::DataType(d) => {
                    let word = abi::DLDataType { code: d.code, bits: d.bits, lanes: d.lanes }.word();
                    (Word::Bits(abi::TYPE_DATA_TYPE as i64), Word::Bits(word as i64))
                }
                _ => (Word::Const(c), Word::Const(c)),
            },
            Arg::Func(g) => (Word::Func(g), Word::Func(g)),
        }
    }

    /// The words of a call's argument array: each argument's type word, then its payload.
    fn call_words(&self, args: &[Arg], virtual_regs: &HashMap<i64, usize>) -> Vec<Word> {
        args.iter().flat_map(|&a| <[Word; 2]>::from(self.arg_words(a, virtual_regs))).collect()
    }

    /// The words each call of the chunk will stage, by a pass ahead of the lowering that tracks
    /// virtual registers as the lowering will (stack tensors make them, writes and block starts
    /// end them). Only `argument_array` reads it, so a wrong guess costs stores, never bits.
    fn plan_calls(
        &self,
        instrs: &[Instr],
        leader: &[bool],
        tensor_slots: &HashMap<usize, (usize, Site)>,
    ) -> Vec<Option<Vec<Word>>> {
        let mut virtual_regs = HashMap::new();
        let mut plan = Vec::with_capacity(instrs.len());
        for (i, ins) in instrs.iter().enumerate() {
            if leader[i] || !self.track {
                virtual_regs.clear();
            }
            plan.push(match ins {
                Instr::Call { dst, func, args } => match tensor_slots.get(&i) {
                    Some(&(slot, site)) if site.proven => {
                        virtual_regs.insert(*dst, slot);
                        None
                    }
                    Some(_) => {
                        virtual_regs.remove(dst);
                        None
                    }
                    None => {
                        let words = self.inlined(*func, args).is_none().then(|| self.call_words(args, &virtual_regs));
                        virtual_regs.remove(dst);
                        words
                    }
                },
                _ => None,
            });
        }
        plan
    }

    /// The argument array to stage a call's `words` in: one that holds them already; else one
    /// no call shortly ahead in the block finds its arguments in, with the fewest stores. A
    /// chain alternating between two argument lists thus settles into one array each.
    fn argument_array(&self, words: &[Word]) -> usize {
        if !self.track {
            return 0;
        }
        let held = &self.known.argv;
        let holds = |k: usize, ws: &[Word]| ws.iter().zip(&held[k]).all(|(w, h)| *h == Some(*w));
        let stores = |k: usize| words.iter().zip(&held[k]).filter(|(w, h)| **h != Some(**w)).count();
        let ahead: Vec<&Vec<Word>> = self.plan[self.at + 1..]
            .iter()
            .zip(&self.leader[self.at + 1..])
            .take_while(|(_, starts_block)| !**starts_block)
            .filter_map(|(words, _)| words.as_ref())
            .take(LOOKAHEAD_CALLS)
            .collect();
        let wanted_ahead = |k: usize| ahead.iter().any(|ws| holds(k, ws));
        (0..ARGUMENT_ARRAYS).min_by_key(|&k| (stores(k) != 0, wanted_ahead(k), stores(k))).unwrap_or(0)
    }

    /// Writes a call's argument words (borrowed views) into argument array `array`, storing
    /// only the words it does not already hold.
    fn stage(&mut self, b: &mut FunctionBuilder, env: &Env, array: usize, words: &[Word]) {
        for (j, &word) in words.iter().enumerate() {
            if self.track && self.known.argv[array][j] == Some(word) {
                continue;
            }
            let field = if j % 2 == 0 { ANY_TYPE_INDEX } else { ANY_PAYLOAD };
            let value = match word {
                Word::Bits(v) => b.ins().iconst(types::I64, v),
                Word::Reg(r) => b.ins().load(types::I64, flags(), env.regs, self.reg(r) + field),
                Word::Const(c) => b.ins().load(types::I64, flags(), env.consts, any_offset(c) + field),
                Word::Func(g) => b.ins().load(types::I64, flags(), env.funcs, any_offset(g) + field),
                Word::Slot(slot) => b.ins().stack_addr(types::I64, env.slots[slot], 0),
                Word::Vm => env.vm,
            };
            b.ins().store(flags(), value, env.argv[array], any_offset(j as i64 / 2) + field);
            self.known.argv[array][j] = Some(word);
        }
    }

    /// Continues at `next` when `rc` is 0; otherwise a cold stub passes this call's pc to the
    /// shared error block (keeping the constant off the hot path).
    fn branch_on_failure(&self, b: &mut FunctionBuilder, env: &Env, rc: Value, pc: i64, next: Block) {
        let stub = b.create_block();
        b.set_cold_block(stub);
        b.ins().brif(rc, stub, &[], next, &[]);
        b.switch_to_block(stub);
        let pcv = b.ins().iconst(types::I64, pc);
        b.ins().jump(env.error, &[BlockArg::Value(pcv)]);
    }

    /// Drops the reference held by the Any at `at + off`, if it holds an object.
    fn release(&mut self, b: &mut FunctionBuilder, at: Value, off: i32) {
        let t = b.ins().load(types::I32, flags(), at, off + ANY_TYPE_INDEX);
        let is_obj = b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, t, abi::TYPE_STATIC_OBJECT_BEGIN as i64);
        let (drop_block, after) = (b.create_block(), b.create_block());
        b.ins().brif(is_obj, drop_block, &[], after, &[]);
        b.switch_to_block(drop_block);
        let obj = b.ins().load(types::I64, flags(), at, off + ANY_PAYLOAD);
        let decref = self.callee(self.shared.shim.decref, b);
        b.ins().call(decref, &[obj]);
        b.ins().jump(after, &[]);
        b.switch_to_block(after);
    }

    /// Adds a reference if (type word, payload) is an object.
    fn retain(&mut self, b: &mut FunctionBuilder, type_word: Value, payload: Value) {
        let t = b.ins().ireduce(types::I32, type_word);
        let is_obj = b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, t, abi::TYPE_STATIC_OBJECT_BEGIN as i64);
        let (inc_block, after) = (b.create_block(), b.create_block());
        b.ins().brif(is_obj, inc_block, &[], after, &[]);
        b.switch_to_block(inc_block);
        let incref = self.callee(self.shared.shim.incref, b);
        b.ins().call(incref, &[payload]);
        b.ins().jump(after, &[]);
        b.switch_to_block(after);
    }
}
