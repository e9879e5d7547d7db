//! The pass ahead of the lowering of a chunk: which tensors live in which stack slot, the words
//! each call will stage, and a key for each instruction that stands for the code it becomes, so
//! that repeated runs can share one copy of their code in a loop (`repeats`). It tracks virtual
//! registers exactly as the lowering will; the chunk cutter runs it over a whole function to
//! know which instructions a loop will fold away.

use std::collections::HashMap;

use super::Shared;
use super::frame::Word;
use super::repeats::{self, MAX_WARMUP};
use super::stack_tensors::{self, DeferredKills, FunctionFacts, Site, View};
use crate::abi;
use crate::codegen::shim::find_builtin;
use crate::vm::{Arg, Constant, FuncKind, Instr, VM_REG, VOID_REG};

/// A builtin call compiled mode writes inline.
#[derive(Clone, Copy)]
pub enum Inlined {
    NullValue,
    /// `copy` of this register.
    Copy(i64),
}

/// What an instruction's code depends on besides the frame state (`Known::frame_state`) and the
/// calls ahead: two instructions with equal keys, lowered from equal states, get the same code
/// but for the pc in their error stubs. Virtual registers appear as their slots, as their code
/// names them; everything else the code reads or writes by register number is in the key.
#[derive(Clone, PartialEq, Eq, Hash)]
enum CodeKey {
    ProvenTensor {
        slot: usize,
        view: View,
    },
    CheckedTensor {
        slot: usize,
        dst: i64,
        args: Vec<Arg>,
    },
    /// A `null_value` of a virtual register: no code, the slot is free again.
    KillVirtual {
        slot: usize,
    },
    /// A storage register's `null_value` that waits for a stack tensor's kill: no code here.
    WaitingKill,
    Inlined {
        dst: i64,
        callee: i64,
        args: Vec<Arg>,
    },
    Call {
        dst: i64,
        dst_slot: Option<usize>,
        callee: i64,
        words: Vec<Word>,
    },
}

/// What the pass ahead of the lowering finds for a chunk (see [`plan_chunk`]).
pub struct Plan {
    /// Per instruction: the words a call will stage.
    pub words: Vec<Option<Vec<Word>>>,
    /// Per instruction: its [`CodeKey`] as a number, None when it cannot be in a rolled loop.
    pub keys: Vec<Option<u32>>,
    /// Per instruction, and one past the last: the virtual registers just before it.
    pub virtual_before: Vec<HashMap<i64, usize>>,
    /// The storage kills that wait for stack tensors, and where they happen instead.
    pub deferred: DeferredKills,
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

/// The builtin compiled mode writes inline that this call is, if it is one.
pub fn inlined(shared: &Shared, callee: i64, args: &[Arg]) -> Option<Inlined> {
    let options = shared.options;
    if !options.inline_builtins || options.instrument {
        return None;
    }
    let f = &shared.exec.funcs[callee as usize];
    let builtin = if f.kind == FuncKind::Packed { find_builtin(&f.name) } else { None };
    match builtin.filter(|b| b.inlined).map(|b| (b.name, args)) {
        Some(("vm.builtin.null_value", [])) => Some(Inlined::NullValue),
        Some(("vm.builtin.copy", [Arg::Reg(src)])) if *src < VOID_REG => Some(Inlined::Copy(*src)),
        _ => None,
    }
}

/// The alloc_tensor instructions of chunk `instrs` (function pcs from `lo`) built on the stack,
/// each with its slot: by chunk-relative pc.
pub fn tensor_slots(
    shared: &Shared,
    facts: &FunctionFacts,
    instrs: &[Instr],
    lo: usize,
    leader: &[bool],
) -> HashMap<usize, (usize, Site)> {
    let options = shared.options;
    if !options.stack_tensors || options.instrument {
        return HashMap::new();
    }
    let sites = stack_tensors::sites(shared.exec, shared.symbols, facts, instrs, lo, leader);
    stack_tensors::assign_slots(&sites).into_iter().map(|(site, slot)| (site, (slot, sites[&site]))).collect()
}

/// The two words argument `a` is staged as, given which registers are virtual.
fn arg_words(shared: &Shared, a: Arg, virtual_regs: &HashMap<i64, usize>) -> (Word, Word) {
    match a {
        Arg::Reg(VOID_REG) => (Word::Bits(abi::TYPE_NONE as i64), Word::Bits(0)),
        Arg::Reg(VM_REG) => (Word::Bits(abi::TYPE_OPAQUE_PTR as i64), Word::Vm),
        Arg::Reg(r) => match virtual_regs.get(&r) {
            Some(&slot) => (Word::Bits(abi::TYPE_DLTENSOR_PTR as i64), Word::Slot(slot)),
            None => (Word::Reg(r), Word::Reg(r)),
        },
        Arg::Imm(v) => (Word::Bits(abi::TYPE_INT as i64), Word::Bits(v)),
        // Values known at compile time are written as immediates.
        Arg::Const(c) => match &shared.exec.constants[c as usize] {
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
pub fn call_words(shared: &Shared, args: &[Arg], virtual_regs: &HashMap<i64, usize>) -> Vec<Word> {
    args.iter().flat_map(|&a| <[Word; 2]>::from(arg_words(shared, a, virtual_regs))).collect()
}

/// The words each call of the chunk will stage and each instruction's [`CodeKey`], by a
/// pass ahead of the lowering that tracks virtual registers as the lowering will (stack
/// tensors make them, writes and block starts end them). The words only steer
/// `argument_array`, so a wrong guess there costs stores, never bits; the keys decide which
/// instructions share one copy of code in a loop, so they name everything the code reads.
pub fn plan_chunk(
    shared: &Shared,
    instrs: &[Instr],
    leader: &[bool],
    tensor_slots: &HashMap<usize, (usize, Site)>,
) -> Plan {
    let track = !shared.options.instrument;
    let mut virtual_regs = HashMap::new();
    // A key with the storage registers killed after the instruction, as its code does.
    let mut interned: HashMap<(CodeKey, Vec<i64>), u32> = HashMap::new();
    let mut plan = Plan {
        words: Vec::with_capacity(instrs.len()),
        keys: Vec::with_capacity(instrs.len()),
        virtual_before: Vec::with_capacity(instrs.len() + 1),
        deferred: stack_tensors::deferred_kills(tensor_slots.values().map(|(_, site)| site)),
    };
    for (i, ins) in instrs.iter().enumerate() {
        plan.virtual_before.push(virtual_regs.clone());
        if leader[i] || !track {
            virtual_regs.clear();
        }
        let (words, key) = match ins {
            Instr::Call { .. } if plan.deferred.waiting.contains(&i) => (None, Some(CodeKey::WaitingKill)),
            Instr::Call { dst, func, args } => match tensor_slots.get(&i) {
                Some(&(slot, site)) if site.proven => {
                    virtual_regs.insert(*dst, slot);
                    (None, Some(CodeKey::ProvenTensor { slot, view: site.view }))
                }
                Some(&(slot, _)) => {
                    virtual_regs.remove(dst);
                    (None, Some(CodeKey::CheckedTensor { slot, dst: *dst, args: args.clone() }))
                }
                None => {
                    let dst_slot = virtual_regs.remove(dst);
                    match (inlined(shared, *func, args), dst_slot) {
                        (Some(Inlined::NullValue), Some(slot)) => (None, Some(CodeKey::KillVirtual { slot })),
                        (Some(_), _) => (None, Some(CodeKey::Inlined { dst: *dst, callee: *func, args: args.clone() })),
                        (None, _) => {
                            let words = call_words(shared, args, &virtual_regs);
                            let key = CodeKey::Call { dst: *dst, dst_slot, callee: *func, words: words.clone() };
                            (Some(words), Some(key))
                        }
                    }
                }
            },
            _ => (None, None),
        };
        plan.words.push(words);
        let next = interned.len() as u32;
        let killed_after = plan.deferred.after.get(&i).cloned().unwrap_or_default();
        plan.keys.push(key.filter(|_| !leader[i]).map(|k| *interned.entry((k, killed_after)).or_insert(next)));
    }
    plan.virtual_before.push(virtual_regs);
    plan
}

/// The weight of each instruction of a function when it is cut into chunks: 1, or 0 for the
/// instructions a rolled loop folds away (all iterations of a run but the few written out before
/// its loop and the loop's body), so that a long run costs its chunk what its code does.
pub fn chunk_weights(shared: &Shared, facts: &FunctionFacts, instrs: &[Instr]) -> Vec<u32> {
    let mut weights = vec![1; instrs.len()];
    if !shared.options.roll_loops || shared.options.instrument {
        return weights;
    }
    let leader = leaders(instrs).0;
    let slots = tensor_slots(shared, facts, instrs, 0, &leader);
    let plan = plan_chunk(shared, instrs, &leader, &slots);
    for run in repeats::find_runs(&plan.keys) {
        let written = (MAX_WARMUP + 1).min(run.repeats) * run.period;
        weights[run.start + written..run.end()].iter_mut().for_each(|w| *w = 0);
    }
    weights
}
