//! Lowering one Relax function (or one chunk of it) to Cranelift IR on the register file. A Call
//! stages its arguments in one of two arrays on the native stack and calls its target directly
//! (kernels and builtins by symbol; Relax functions through `rvm_invoke`); Goto/If become branches;
//! every failing call branches to one error block that records the function and pc, exactly as the
//! interpreter reports them. Builtins the shim marks RVM_INLINED are written inline, and tensors
//! `stack_tensors` finds short-lived are built in the native frame; anything a fast path cannot
//! prove at compile time is checked at run time and falls back to the builtin, which also reports
//! the error exactly as bytecode does. Every offset into a VM structure comes from `crate::abi`.
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

use super::frame::{Env, Known, RegisterFile, SLOT_ALIGN_SHIFT, Word, any_offset, copy_any, flags, prologue, zero_any};
use super::plan::{self, Inlined, leaders};
use super::repeats::{self, MAX_WARMUP, Run};
use super::stack_tensors::{DeferredKills, FunctionFacts, Site, View};
use super::{RolledLoop, Shared, chunks};
use crate::abi::{self, ANY_PAYLOAD, ANY_TYPE_INDEX, DLTensor};
use crate::codegen::CodegenError;
use crate::codegen::shim::declare_call;
use crate::vm::{Arg, Constant, Instr, VOID_REG};

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

/// A loop the lowering is writing the body of: its counter (0 on the first time through) and
/// how many instructions one time through stands for, so that a failing call reports its pc.
#[derive(Clone, Copy)]
struct Rolled {
    remaining: Value, // times through still to run, this one included (`times` on the first)
    times: i64,
    period: i64,
}

/// The ndim and dtype fields of a DLTensor share one 8-byte word, written with one store.
const NDIM_DTYPE_SHIFT: i64 = 8 * (offset_of!(DLTensor, dtype) - offset_of!(DLTensor, ndim)) as i64;
const _: () = assert!(offset_of!(DLTensor, dtype) == offset_of!(DLTensor, ndim) + size_of::<i32>());
const _: () = assert!(offset_of!(DLTensor, ndim).is_multiple_of(8));
const _: () = assert!(size_of::<abi::DLDevice>() == size_of::<i64>());

/// The chunk being lowered, as each instruction's lowering needs it.
struct ChunkCx<'i> {
    instrs: &'i [Instr],
    /// The function-relative pc of the chunk's first instruction.
    lo: usize,
    env: Env,
    /// The block each leader starts.
    blocks: Vec<Option<Block>>,
    tensor_slots: HashMap<usize, (usize, Site)>,
    deferred: DeferredKills,
    /// The current block is still open (the last instruction did not end it).
    open: bool,
}

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
    /// The loop whose body is being written, if any.
    rolled: Option<Rolled>,
    /// The loops written so far.
    loops: Vec<RolledLoop>,
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
            rolled: None,
            loops: Vec::new(),
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

    /// Lowers instructions [lo, hi) of the function. The native function returns 0 after Ret,
    /// -1 on error, and [`chunks::CONTINUE`] when execution runs past `hi` into the next chunk.
    /// Returns the loops it rolled repeated runs into.
    pub fn lower(
        mut self,
        b: &mut FunctionBuilder,
        all: &[Instr],
        facts: &FunctionFacts,
        lo: usize,
        hi: usize,
    ) -> Vec<RolledLoop> {
        let instrs = &all[lo..hi];
        let (leader, max_args) = leaders(instrs);
        let tensor_slots = plan::tensor_slots(self.shared, facts, instrs, lo, &leader);
        let mut env = prologue(b, max_args);
        let slots = tensor_slots.values().map(|&(slot, _)| slot + 1).max().unwrap_or(0);
        for _ in 0..slots {
            let size = size_of::<DLTensor>() as u32;
            let data = StackSlotData::new(StackSlotKind::ExplicitSlot, size, SLOT_ALIGN_SHIFT);
            env.slots.push(b.create_sized_stack_slot(data));
        }
        self.known = Known::new(max_args, env.slots.len());
        let plan = plan::plan_chunk(self.shared, instrs, &leader, &tensor_slots);
        self.plan = plan.words;
        let runs =
            if self.shared.options.roll_loops && self.track { repeats::find_runs(&plan.keys) } else { Vec::new() };
        let blocks: Vec<Option<Block>> = leader.iter().map(|&l| l.then(|| b.create_block())).collect();
        self.leader = leader;
        b.ins().jump(blocks[0].expect("first block"), &[]);
        let mut cx = ChunkCx { instrs, lo, env, blocks, tensor_slots, deferred: plan.deferred, open: false };
        let mut runs = runs.into_iter().peekable();
        let mut i = 0;
        while i < instrs.len() {
            match runs.next_if(|run| run.start == i) {
                Some(run) => i = self.lower_run(b, &mut cx, run, &plan.virtual_before),
                None => {
                    self.lower_instr(b, &mut cx, i);
                    i += 1;
                }
            }
        }
        let (open, env) = (cx.open, cx.env);

        b.set_srcloc(SourceLoc::default());
        if open {
            let more = b.ins().iconst(types::I32, chunks::CONTINUE);
            b.ins().return_(&[more]);
        }
        self.error_block(b, &env);
        b.seal_all_blocks();
        self.loops
    }

    /// Lowers chunk instruction `i`: switches to its block if it starts one, then writes its code.
    fn lower_instr(&mut self, b: &mut FunctionBuilder, cx: &mut ChunkCx, i: usize) {
        if let Some(block) = cx.blocks[i] {
            if cx.open {
                b.ins().jump(block, &[]);
            }
            b.switch_to_block(block);
            self.known.forget();
            cx.open = true;
        }
        if !cx.open {
            return; // unreachable: nothing jumps here
        }
        let pc = (cx.lo + i) as i64;
        // The pc rides on every CLIF instruction made for this one (see clif_text).
        b.set_srcloc(SourceLoc::new(pc as u32));
        let blocks = &cx.blocks;
        let target = |off: i64| blocks[(i as i64 + off) as usize].expect("jump targets are leaders");
        self.at = i;
        let env = &cx.env;
        match &cx.instrs[i] {
            // The Storage dies after the stack tensor that views it (stack_tensors::deferred_kills).
            Instr::Call { .. } if cx.deferred.waiting.contains(&i) => {}
            Instr::Call { dst, func, args } => {
                match cx.tensor_slots.get(&i) {
                    Some(&(slot, site)) if site.proven => self.proven_tensor(b, env, *dst, slot, site.view),
                    Some(&(slot, site)) => self.checked_tensor(b, env, pc, *dst, args, slot, site.end),
                    None => self.call(b, env, pc, *dst, *func, args),
                }
                for &storage in cx.deferred.after.get(&i).into_iter().flatten() {
                    self.kill(b, env, storage);
                }
            }
            Instr::Ret { result } => {
                self.ret(b, env, *result);
                cx.open = false;
            }
            Instr::Goto { offset } => {
                b.ins().jump(target(*offset), &[]);
                cx.open = false;
            }
            Instr::If { cond, false_offset } => {
                self.branch(b, env, pc, *cond, target(1), target(*false_offset));
                cx.open = false;
            }
        }
        if !self.track {
            self.known.forget();
        }
    }

    /// Lowers a run of repeated instructions: the first iterations written out until the frame
    /// state at an iteration's start repeats (so that the loop's entry and back edge agree and
    /// the back edge stores nothing), then the rest as one copy of an iteration in a loop.
    /// Returns the index after the run.
    fn lower_run(
        &mut self,
        b: &mut FunctionBuilder,
        cx: &mut ChunkCx,
        run: Run,
        virtual_before: &[HashMap<i64, usize>],
    ) -> usize {
        let iteration = |k: usize| run.start + k * run.period..run.start + (k + 1) * run.period;
        let mut state = self.known.frame_state();
        let mut done = 0;
        let mut repeated = false;
        while !repeated && done < MAX_WARMUP.min(run.repeats) {
            for i in iteration(done) {
                self.lower_instr(b, cx, i);
            }
            done += 1;
            let now = self.known.frame_state();
            repeated = now == state;
            state = now;
        }
        let left = run.repeats - done;
        if !repeated || left < 2 || !cx.open {
            for i in run.start + done * run.period..run.end() {
                self.lower_instr(b, cx, i);
            }
            return run.end();
        }
        let entry = self.known.clone();
        // A count down to 0: the back edge is one jump on the step's result (an up-count compared
        // with its limit kept the old count live, costing a copy and a second jump each time).
        let header = b.create_block();
        let remaining = b.append_block_param(header, types::I64);
        let all = b.ins().iconst(types::I64, left as i64);
        b.ins().jump(header, &[BlockArg::Value(all)]);
        b.switch_to_block(header);
        self.rolled = Some(Rolled { remaining, times: left as i64, period: run.period as i64 });
        let first = cx.lo + run.start + done * run.period;
        let function = self.shared.exec.funcs[self.func].name.clone();
        self.loops.push(RolledLoop { function, pcs: first..cx.lo + run.end(), period: run.period });
        for i in iteration(done) {
            self.lower_instr(b, cx, i);
        }
        self.rolled = None;
        self.reconcile(b, &cx.env, &entry);
        let exit = b.create_block();
        super::align::back_edge(b, remaining, header, exit);
        b.switch_to_block(exit);
        // The frame holds what it held on entry; the virtual registers are the last iteration's.
        self.known = entry;
        self.known.virtual_regs = virtual_before[run.end()].clone();
        run.end()
    }

    /// Brings the frame back to what `to` says it holds, at a loop's back edge (the body's code
    /// assumed `to`): the argument words and DLTensor views it names, and a clear result cell.
    /// A loop is only written once the state at an iteration's start has repeated, and the
    /// body's code depends on nothing else that changes between iterations, so this stores
    /// nothing; it is here so that the loop is right by construction, not by that argument.
    fn reconcile(&mut self, b: &mut FunctionBuilder, env: &Env, to: &Known) {
        for (array, words) in to.argv.iter().enumerate() {
            for (j, word) in words.iter().enumerate() {
                if let Some(word) = *word
                    && self.known.argv[array][j] != Some(word)
                {
                    self.store_word(b, env, array, j, word);
                }
            }
        }
        for (slot, view) in to.slots.iter().enumerate() {
            if let Some(view) = *view {
                self.write_view(b, env, slot, view);
            }
        }
        if !to.ret_dirty && self.known.ret_dirty {
            let zero = b.ins().iconst(types::I64, 0);
            b.ins().store(flags(), zero, env.ret, ANY_TYPE_INDEX);
            self.known.ret_dirty = false;
        }
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
        self.write_view(b, env, slot, view);
        self.known.virtual_regs.insert(dst, slot);
    }

    /// Makes slot `slot` hold `view`'s DLTensor, writing the fields that differ from the view
    /// it holds.
    fn write_view(&mut self, b: &mut FunctionBuilder, env: &Env, slot: usize, view: View) {
        let previous = self.known.slots[slot];
        if previous == Some(view) {
            return;
        }
        let t_addr = b.ins().stack_addr(types::I64, env.slots[slot], 0);
        if previous.is_none_or(|p| p.storage != view.storage) {
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

    /// A builtin's work written inline; false when `callee` is not one compiled mode inlines.
    fn inline_builtin(&mut self, b: &mut FunctionBuilder, env: &Env, dst: i64, callee: i64, args: &[Arg]) -> bool {
        let Some(inlined) = plan::inlined(self.shared, callee, args) else {
            return false;
        };
        match inlined {
            // Drop what dst holds (a virtual register already holds None).
            Inlined::NullValue => {
                if self.known.virtual_regs.remove(&dst).is_none() && dst < VOID_REG {
                    self.kill(b, env, dst);
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

    /// Releases what register `r` (not a virtual one) holds and leaves None.
    fn kill(&mut self, b: &mut FunctionBuilder, env: &Env, r: i64) {
        self.release(b, env.regs, self.reg(r));
        zero_any(b, env.regs, self.reg(r));
        self.known.written(r);
    }

    fn call(&mut self, b: &mut FunctionBuilder, env: &Env, pc: i64, dst: i64, callee: i64, args: &[Arg]) {
        if self.inline_builtin(b, env, dst, callee, args) {
            return;
        }
        let words = plan::call_words(self.shared, args, &self.known.virtual_regs);
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

    /// The argument array to stage a call's `words` in (see `Known::argument_array`).
    fn argument_array(&self, words: &[Word]) -> usize {
        if !self.track {
            return 0;
        }
        self.known.argument_array(words, &self.plan[self.at + 1..], &self.leader[self.at + 1..])
    }

    /// Writes a call's argument words (borrowed views) into argument array `array`, storing
    /// only the words it does not already hold.
    fn stage(&mut self, b: &mut FunctionBuilder, env: &Env, array: usize, words: &[Word]) {
        for (j, &word) in words.iter().enumerate() {
            if self.track && self.known.argv[array][j] == Some(word) {
                continue;
            }
            self.store_word(b, env, array, j, word);
        }
    }

    /// Stores `word` as word `j` of argument array `array`.
    fn store_word(&mut self, b: &mut FunctionBuilder, env: &Env, array: usize, j: usize, word: Word) {
        let field = if j.is_multiple_of(2) { ANY_TYPE_INDEX } else { ANY_PAYLOAD };
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

    /// Continues at `next` when `rc` is 0; otherwise a cold stub passes this call's pc to the
    /// shared error block (keeping the constant off the hot path).
    fn branch_on_failure(&self, b: &mut FunctionBuilder, env: &Env, rc: Value, pc: i64, next: Block) {
        let stub = b.create_block();
        b.set_cold_block(stub);
        b.ins().brif(rc, stub, &[], next, &[]);
        b.switch_to_block(stub);
        let mut pcv = b.ins().iconst(types::I64, pc);
        if let Some(rolled) = self.rolled {
            // The body is written as its first time through: later times are `period` further on.
            let to_go = b.ins().iadd_imm_s(rolled.remaining, -rolled.times); // minus the times done
            let step = b.ins().imul_imm_s(to_go, -rolled.period);
            pcv = b.ins().iadd(pcv, step);
        }
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
