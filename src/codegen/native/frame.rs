//! What the lowering knows about the native frame and the register file as it goes: the words
//! each argument array holds, the view each stack tensor slot holds, which registers are
//! virtual, and where each register lives in the (compacted) register file. Knowing them lets
//! the lowering skip stores whose value is already there, which is most of them in a chain of
//! kernel calls. Also the frame itself: the values every block uses, made in the entry block.

use std::collections::HashMap;

use cranelift_codegen::ir::{Block, InstBuilder, MemFlagsData, StackSlot, StackSlotData, StackSlotKind, Value, types};
use cranelift_frontend::FunctionBuilder;

use crate::abi::{ANY_PAYLOAD, ANY_SIZE, ANY_TYPE_INDEX};

use super::stack_tensors::View;

/// Argument arrays a function stages calls in. With two, calls that alternate between two
/// argument lists (a chain writing into one buffer and then the other, a loop body's ping-pong)
/// find theirs already staged and store nothing; `Lowering::argument_array` picks one.
pub const ARGUMENT_ARRAYS: usize = 2;

/// Stack slots are 16-byte aligned (the shift Cranelift takes).
pub const SLOT_ALIGN_SHIFT: u8 = 4;

/// Calls ahead (in the same block) whose argument lists keep an array from being overwritten.
pub const LOOKAHEAD_CALLS: usize = 8;

/// One 8-byte word of an Any (its type word, or its payload) as the lowering knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Word {
    /// A constant: a type index (with zero padding), an immediate, a float's or dtype's bits.
    Bits(i64),
    /// The same word of register r, of constant c, of function-pool entry g.
    Reg(i64),
    Const(i64),
    Func(i64),
    /// The address of DLTensor slot k.
    Slot(usize),
    /// The VM pointer.
    Vm,
}

/// What the native frame holds at this point of the block, as far as the lowering knows.
#[derive(Clone, Default)]
pub struct Known {
    /// Each word of each argument array: [k][2i] the type word of argument i in array k,
    /// [k][2i + 1] its payload.
    pub argv: Vec<Vec<Option<Word>>>,
    /// The view each DLTensor slot holds.
    pub slots: Vec<Option<View>>,
    /// Virtual registers: the slot whose tensor each holds (the register itself stays None).
    pub virtual_regs: HashMap<i64, usize>,
    /// The result cell may hold the bits of an object nobody here owns (moved out of it, or
    /// never written): it must be cleared before a call whose result is dropped.
    pub ret_dirty: bool,
}

/// [`Known`] without the register numbers of its virtual registers: which slots they hold.
#[derive(PartialEq, Eq)]
pub struct FrameState {
    argv: Vec<Vec<Option<Word>>>,
    slots: Vec<Option<View>>,
    virtual_slots: Vec<usize>,
    ret_dirty: bool,
}

impl Known {
    pub fn new(max_args: usize, slots: usize) -> Known {
        Known {
            argv: vec![vec![None; 2 * max_args]; ARGUMENT_ARRAYS],
            slots: vec![None; slots],
            virtual_regs: HashMap::new(),
            ret_dirty: true,
        }
    }

    /// The argument array to stage a call's `words` in: one that holds them already; else one
    /// no call shortly ahead in the block finds its arguments in, with the fewest stores. A
    /// chain alternating between two argument lists thus settles into one array each. `plan` and
    /// `leader` are the words and block starts of the instructions after the call.
    pub fn argument_array(&self, words: &[Word], plan: &[Option<Vec<Word>>], leader: &[bool]) -> usize {
        let held = &self.argv;
        let holds = |k: usize, ws: &[Word]| ws.iter().zip(&held[k]).all(|(w, h)| *h == Some(*w));
        let stores = |k: usize| words.iter().zip(&held[k]).filter(|(w, h)| **h != Some(**w)).count();
        let ahead: Vec<&Vec<Word>> = plan
            .iter()
            .zip(leader)
            .take_while(|(_, starts_block)| !**starts_block)
            .filter_map(|(words, _)| words.as_ref())
            .take(LOOKAHEAD_CALLS)
            .collect();
        let wanted_ahead = |k: usize| ahead.iter().any(|ws| holds(k, ws));
        (0..ARGUMENT_ARRAYS).min_by_key(|&k| (stores(k) != 0, wanted_ahead(k), stores(k))).unwrap_or(0)
    }

    /// Forgets everything: another path may have left the frame otherwise.
    pub fn forget(&mut self) {
        self.argv.iter_mut().flatten().for_each(|w| *w = None);
        self.slots.iter_mut().for_each(|v| *v = None);
        self.virtual_regs.clear();
        self.ret_dirty = true;
    }

    /// What the next instructions' code depends on: all of it but the register numbers of the
    /// virtual registers (their code names only the slots). Two points of a repeated run with
    /// equal frame states get the same code.
    pub fn frame_state(&self) -> FrameState {
        let mut virtual_slots: Vec<usize> = self.virtual_regs.values().copied().collect();
        virtual_slots.sort_unstable();
        FrameState { argv: self.argv.clone(), slots: self.slots.clone(), virtual_slots, ret_dirty: self.ret_dirty }
    }

    /// Register r was written: copies of it are stale, and it is no longer virtual.
    pub fn written(&mut self, r: i64) {
        for w in self.argv.iter_mut().flatten() {
            if *w == Some(Word::Reg(r)) {
                *w = None;
            }
        }
        self.virtual_regs.remove(&r);
    }
}

/// Where each Relax register lives in a compiled function's register file. Most registers of a
/// compiled function never reach it (virtual registers live in stack slots), yet the shim
/// releases and clears every register of the frame after each call: a frame sized by the
/// bytecode's register count made chain_1000 sweep 16 KB per call. A register gets its place the
/// first time the lowering touches it, numbered after the parameters (which stay where the
/// caller puts them), and the function table gives the shim the compacted size.
pub struct RegisterFile {
    num_args: i64,
    places: HashMap<i64, i64>,
    size: i64,
}

impl RegisterFile {
    pub fn new(num_args: i64) -> RegisterFile {
        RegisterFile { num_args, places: HashMap::new(), size: num_args }
    }

    /// How many registers the compiled function uses (at least its parameters).
    pub fn size(&self) -> i64 {
        self.size
    }

    pub fn place(&mut self, r: i64) -> i64 {
        if r < self.num_args {
            return r;
        }
        *self.places.entry(r).or_insert_with(|| {
            self.size += 1;
            self.size - 1
        })
    }
}

/// Values every block can use (defined in the entry block, which dominates all).
pub struct Env {
    pub vm: Value,
    pub regs: Value,
    pub result: Value,
    pub consts: Value,
    pub funcs: Value,
    /// The argument arrays (see [`ARGUMENT_ARRAYS`]).
    pub argv: Vec<Value>,
    pub ret: Value,
    pub error: Block,
    /// The DLTensor slots of stack tensors.
    pub slots: Vec<StackSlot>,
}

pub fn flags() -> MemFlagsData {
    MemFlagsData::trusted()
}

/// Byte offset of entry `i` of an array of Anys (the constants, the function pool, an argument
/// array). Registers go through [`RegisterFile`] instead.
pub fn any_offset(i: i64) -> i32 {
    (i * ANY_SIZE as i64) as i32
}

/// The entry block: the function's parameters, the argument staging arrays and the result
/// cell on the stack, and the (not yet filled) error block.
///
/// The arrays and the cell share one slot, the cell between the first two arrays, and each
/// array's address is the cell's plus a constant. Every call passes the cell, so its address
/// stays in a register, and Cranelift recomputes an `iadd` of a constant in each block that uses
/// it: a call's argument array becomes a 4-byte `lea` from that register. As values of their
/// own, the arrays' addresses were spilled and reloaded at 8 bytes a call, which made a rolled
/// chain's loop of two calls span two 64-byte lines.
pub fn prologue(b: &mut FunctionBuilder, max_args: usize) -> Env {
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let p = b.block_params(entry).to_vec();
    let array_size = ANY_SIZE as i64 * max_args as i64;
    // Array 0, the cell, then the other arrays.
    let array_offset = |k: usize| if k == 0 { 0 } else { array_size + ANY_SIZE as i64 + (k as i64 - 1) * array_size };
    let ret_offset = array_size;
    let size = (array_size * ARGUMENT_ARRAYS as i64 + ANY_SIZE as i64) as u32;
    let slot = b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, size, SLOT_ALIGN_SHIFT));
    let ret = b.ins().stack_addr(types::I64, slot, ret_offset as i32);
    let argv = (0..ARGUMENT_ARRAYS).map(|k| b.ins().iadd_imm_s(ret, array_offset(k) - ret_offset)).collect();
    let error = b.create_block();
    Env { vm: p[0], regs: p[1], result: p[2], consts: p[3], funcs: p[4], argv, ret, error, slots: Vec::new() }
}

/// Copies the 16-byte Any at `from + from_off` to `to + to_off` (no reference taken).
pub fn copy_any(b: &mut FunctionBuilder, from: Value, from_off: i32, to: Value, to_off: i32) {
    let t = b.ins().load(types::I64, flags(), from, from_off + ANY_TYPE_INDEX);
    let v = b.ins().load(types::I64, flags(), from, from_off + ANY_PAYLOAD);
    b.ins().store(flags(), t, to, to_off + ANY_TYPE_INDEX);
    b.ins().store(flags(), v, to, to_off + ANY_PAYLOAD);
}

/// Stores None at `at + off`.
pub fn zero_any(b: &mut FunctionBuilder, at: Value, off: i32) {
    let z = b.ins().iconst(types::I64, 0);
    b.ins().store(flags(), z, at, off + ANY_TYPE_INDEX);
    b.ins().store(flags(), z, at, off + ANY_PAYLOAD);
}

#[cfg(test)]
mod tests {
    use super::RegisterFile;

    #[test]
    fn registers_are_placed_after_the_parameters_in_order_of_first_use() {
        let mut registers = RegisterFile::new(2);
        let places = [1, 900, 7, 900, 0].map(|r| registers.place(r));
        assert_eq!(places, [1, 2, 3, 2, 0]);
        assert_eq!(registers.size(), 4, "two parameters and two registers used");
    }
}
