//! The Relax VM program in memory: TVM's instruction and argument encoding, the function table,
//! the constant pool, and a builder. Both front ends (the TVM importer and relaxc's own lowering)
//! end in an [`Executable`]; both execution modes start from one, after [`verify`].
//!
//! # Instruction set
//!
//! TVM's encoding, unchanged. Code is a flat array of i64 words; each function owns the
//! instructions `[start_instr, end_instr)` and a register file of `register_file_size` Any
//! values, arguments in registers `0..num_args`. An instruction is its opcode and its operands:
//!
//! | opcode | words | meaning |
//! |---|---|---|
//! | `Call` | `1 dst func n a_0 .. a_n-1` | `dst = funcs[func](a_0, .., a_n-1)`; failure unwinds with "in f at pc" |
//! | `Ret` | `2 result` | return register `result` (moved out); the frame's registers are released |
//! | `Goto` | `3 offset` | `pc += offset` |
//! | `If` | `4 cond false_offset` | `pc += (cond != 0) ? 1 : false_offset`; `cond` must hold an Int or a Bool |
//!
//! A Call argument word holds its kind in bits 63..56 and a value sign-extended from bits
//! 55..0: `Reg` (0) a register, where [`VOID_REG`] reads as None and [`VM_REG`] as the VM
//! pointer; `Imm` (1) an int64; `Const` (2) an index into the constant pool; `Func` (3) an index
//! into the function table, passed as a function value. Registers own their values: arguments
//! are lent to the callee, `dst` receives an owned result (its old value released), and
//! [`VOID_REG`] as `dst` drops the result. `funcs[func]` is a packed function (kernel or
//! builtin, bound by name at link time) or a Relax function (bytecode or compiled).

pub mod asm;
mod builder;
pub mod format;
mod text;
mod verify;

pub use builder::ExecBuilder;
pub use verify::{Verified, VerifyError, verify};

use std::fmt;

use crate::abi;

/// Register numbers at or above this are special.
pub const SPECIAL_REG_BEGIN: i64 = 1 << 54;
/// `%void`: reads as None; as a destination, the result is dropped.
pub const VOID_REG: i64 = SPECIAL_REG_BEGIN;
/// `%vm`: reads as the VM context pointer.
pub const VM_REG: i64 = SPECIAL_REG_BEGIN + 1;

/// Largest magnitude an argument value can hold (56-bit two's complement, symmetric like TVM).
pub const ARG_VALUE_MAX: i64 = (1 << 55) - 1;

pub const OP_CALL: i64 = 1;
pub const OP_RET: i64 = 2;
pub const OP_GOTO: i64 = 3;
pub const OP_IF: i64 = 4;

/// One operand of a `Call`, packed as kind (bits 63..56) and a sign-extended 56-bit value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arg {
    Reg(i64),
    Imm(i64),
    Const(i64),
    Func(i64),
}

impl Arg {
    pub fn encode(self) -> i64 {
        let (kind, value) = match self {
            Arg::Reg(v) => (0u64, v),
            Arg::Imm(v) => (1, v),
            Arg::Const(v) => (2, v),
            Arg::Func(v) => (3, v),
        };
        ((kind << 56) | (value as u64 & ((1u64 << 56) - 1))) as i64
    }

    /// Decodes an argument word; `None` for an unknown kind.
    pub fn decode(word: i64) -> Option<Arg> {
        let value = ((word as u64) << 8) as i64 >> 8;
        match (word as u64) >> 56 {
            0 => Some(Arg::Reg(value)),
            1 => Some(Arg::Imm(value)),
            2 => Some(Arg::Const(value)),
            3 => Some(Arg::Func(value)),
            _ => None,
        }
    }
}

/// A decoded instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Instr {
    Call { dst: i64, func: i64, args: Vec<Arg> },
    Ret { result: i64 },
    Goto { offset: i64 },
    If { cond: i64, false_offset: i64 },
}

impl Instr {
    /// Appends the instruction's words.
    pub fn encode(&self, out: &mut Vec<i64>) {
        match self {
            Instr::Call { dst, func, args } => {
                out.extend([OP_CALL, *dst, *func, args.len() as i64]);
                out.extend(args.iter().map(|a| a.encode()));
            }
            Instr::Ret { result } => out.extend([OP_RET, *result]),
            Instr::Goto { offset } => out.extend([OP_GOTO, *offset]),
            Instr::If { cond, false_offset } => out.extend([OP_IF, *cond, *false_offset]),
        }
    }

    /// Decodes the instruction starting at `words[0]`; `Err` says what is wrong with it.
    pub fn decode(words: &[i64]) -> Result<(Instr, usize), String> {
        let get =
            |i: usize| words.get(i).copied().ok_or_else(|| "instruction runs past the end of the code".to_string());
        match get(0)? {
            OP_CALL => {
                let n = get(3)?;
                if n < 0 || n as usize > words.len() {
                    return Err(format!("call has a bad argument count {n}"));
                }
                let mut args = Vec::with_capacity(n as usize);
                for i in 0..n as usize {
                    let w = get(4 + i)?;
                    args.push(
                        Arg::decode(w).ok_or_else(|| format!("argument {i} has unknown kind {}", (w as u64) >> 56))?,
                    );
                }
                Ok((Instr::Call { dst: get(1)?, func: get(2)?, args }, 4 + n as usize))
            }
            OP_RET => Ok((Instr::Ret { result: get(1)? }, 2)),
            OP_GOTO => Ok((Instr::Goto { offset: get(1)? }, 2)),
            OP_IF => Ok((Instr::If { cond: get(1)?, false_offset: get(2)? }, 3)),
            op => Err(format!("unknown opcode {op}")),
        }
    }
}

/// What a function-table entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuncKind {
    /// A kernel, builtin or extern, bound by name.
    Packed = 0,
    /// A Relax function as bytecode.
    Bytecode = 1,
    /// A Relax function compiled to native code (TVM's VMTIRFunc).
    Compiled = 2,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncInfo {
    pub kind: FuncKind,
    pub name: String,
    pub start_instr: i64,
    pub end_instr: i64,
    pub num_args: i64,
    pub register_file_size: i64,
    pub param_names: Vec<String>,
}

impl FuncInfo {
    pub fn packed(name: impl Into<String>) -> FuncInfo {
        FuncInfo {
            kind: FuncKind::Packed,
            name: name.into(),
            start_instr: 0,
            end_instr: 0,
            num_args: -2,
            register_file_size: 0,
            param_names: Vec::new(),
        }
    }
}

/// A DLPack data type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

impl DType {
    pub const fn new(code: u8, bits: u8, lanes: u16) -> DType {
        DType { code, bits, lanes }
    }
    pub const F32: DType = DType::new(2, 32, 1);
    pub const I64: DType = DType::new(0, 64, 1);
    pub const U8: DType = DType::new(1, 8, 1);
    pub const BOOL: DType = DType::new(6, 8, 1);

    /// A scalar dtype by its TVMScript name: `bool`, `int8`..`int64`, `uint8`..`uint64`,
    /// `float8`..`float64`, `bfloat16` (and the other `bfloat` widths).
    pub fn parse(s: &str) -> Option<DType> {
        let (code, rest) = if s == "bool" {
            return Some(DType::BOOL);
        } else if let Some(r) = s.strip_prefix("uint") {
            (1, r)
        } else if let Some(r) = s.strip_prefix("int") {
            (0, r)
        } else if let Some(r) = s.strip_prefix("bfloat") {
            (4, r)
        } else if let Some(r) = s.strip_prefix("float") {
            (2, r)
        } else {
            return None;
        };
        let bits: u8 = rest.parse().ok()?;
        matches!(bits, 8 | 16 | 32 | 64).then_some(DType::new(code, bits, 1))
    }

    /// Bytes of one element (lanes included), rounded up.
    pub fn element_bytes(self) -> usize {
        (self.bits as usize * self.lanes as usize).div_ceil(8)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let base = match self.code {
            0 => "int",
            1 => "uint",
            2 => "float",
            3 => "handle",
            4 => "bfloat",
            5 => "complex",
            6 => {
                return if self.lanes > 1 { write!(f, "boolx{}", self.lanes) } else { write!(f, "bool") };
            }
            _ => "custom",
        };
        if self.lanes > 1 { write!(f, "{base}{}x{}", self.bits, self.lanes) } else { write!(f, "{base}{}", self.bits) }
    }
}

/// A tensor constant: row-major little-endian element bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorConst {
    pub dtype: DType,
    pub shape: Vec<i64>,
    pub data: SharedBytes,
}

/// Bytes that may be a range of a larger shared buffer: a tensor constant's elements inside a
/// memory-mapped export, used in place from import to the object file, so that compiling a model
/// never holds its weights more than once. Cloning shares them.
#[derive(Clone)]
pub struct SharedBytes {
    buffer: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: std::ops::Range<usize>,
}

impl SharedBytes {
    /// `range` of `buffer` (clamped to it).
    pub fn slice_of(
        buffer: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>,
        range: std::ops::Range<usize>,
    ) -> SharedBytes {
        let len = (*buffer).as_ref().len();
        let range = range.start.min(len)..range.end.min(len).max(range.start.min(len));
        SharedBytes { buffer, range }
    }
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.buffer).as_ref()[self.range.clone()]
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(bytes: Vec<u8>) -> SharedBytes {
        let range = 0..bytes.len();
        SharedBytes { buffer: std::sync::Arc::new(bytes), range }
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &SharedBytes) -> bool {
        **self == **other
    }
}

impl PartialEq<Vec<u8>> for SharedBytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes>", self.len())
    }
}

/// A constant-pool entry (the kinds TVM can serialize).
#[derive(Clone, Debug, PartialEq)]
pub enum Constant {
    Tensor(TensorConst),
    Shape(Vec<i64>),
    Str(String),
    Int(i64),
    Float(f64),
    DataType(DType),
}

impl Constant {
    /// The TVM-FFI type index that tags this kind in the pool.
    pub fn type_index(&self) -> i32 {
        match self {
            Constant::Tensor(_) => abi::TYPE_TENSOR,
            Constant::Shape(_) => abi::TYPE_SHAPE,
            Constant::Str(_) => abi::TYPE_STR,
            Constant::Int(_) => abi::TYPE_INT,
            Constant::Float(_) => abi::TYPE_FLOAT,
            Constant::DataType(_) => abi::TYPE_DATA_TYPE,
        }
    }
}

/// A whole Relax VM program, laid out as TVM's VMExecutable.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Executable {
    pub funcs: Vec<FuncInfo>,
    /// Constant index to memory scope (kept for round trips; the CPU runtime ignores it).
    pub memory_scopes: Vec<(i64, String)>,
    pub constants: Vec<Constant>,
    /// Word index in `instr_data` where each instruction starts.
    pub instr_offset: Vec<i64>,
    pub instr_data: Vec<i64>,
}

impl Executable {
    /// Decodes instruction `index` (an index into `instr_offset`).
    pub fn instr(&self, index: usize) -> Result<Instr, String> {
        let start = *self.instr_offset.get(index).ok_or_else(|| format!("instruction {index} does not exist"))?;
        if start < 0 || start as usize >= self.instr_data.len() {
            return Err(format!("instruction {index} starts at word {start}, outside the code"));
        }
        Instr::decode(&self.instr_data[start as usize..]).map(|(i, _)| i)
    }

    /// Index of the function-table entry named `name`.
    pub fn func_index(&self, name: &str) -> Option<usize> {
        self.funcs.iter().position(|f| f.name == name)
    }
}
