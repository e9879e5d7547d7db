//! Relax IR as relaxc's front end builds it: functions of bindings in A-normal form (every
//! operation's operands are atoms: variables or constants), struct info with symbolic shapes,
//! and shape arithmetic. Lowering (`crate::lower`) turns it into VM bytecode.

use std::collections::BTreeSet;
use std::fmt;

use crate::diag::Span;
use crate::vm::{DType, TensorConst};

/// Shape arithmetic over symbolic variables (int64).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PrimExpr {
    Int(i64),
    Var(String),
    Bin(BinOp, Box<PrimExpr>, Box<PrimExpr>),
}

/// Shape arithmetic over the slots of a function's shape heap (int64), as a shape function
/// computes it at run time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotExpr {
    Int(i64),
    Slot(usize),
    Bin(BinOp, Box<SlotExpr>, Box<SlotExpr>),
}

/// A shape function: heap slots computed from other slots, called as a kernel (TVM compiles its
/// `shape_func` the same way).
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeFunc {
    /// Packed-function name; the symbol is `__tvm_ffi_<name>`.
    pub name: String,
    /// (slot, value) in the order they are computed.
    pub assignments: Vec<(usize, SlotExpr)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    FloorDiv,
    FloorMod,
}

impl PrimExpr {
    pub fn vars(&self, out: &mut BTreeSet<String>) {
        match self {
            PrimExpr::Int(_) => {}
            PrimExpr::Var(v) => {
                out.insert(v.clone());
            }
            PrimExpr::Bin(_, a, b) => {
                a.vars(out);
                b.vars(out);
            }
        }
    }

    /// The value with the given variables, if all are known and it is defined.
    pub fn eval(&self, env: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        match self {
            PrimExpr::Int(v) => Some(*v),
            PrimExpr::Var(v) => env(v),
            PrimExpr::Bin(op, a, b) => {
                let (a, b) = (a.eval(env)?, b.eval(env)?);
                match op {
                    BinOp::Add => a.checked_add(b),
                    BinOp::Sub => a.checked_sub(b),
                    BinOp::Mul => a.checked_mul(b),
                    BinOp::FloorDiv => {
                        (b != 0).then(|| a.div_euclid(b) - if b < 0 && a.rem_euclid(b) != 0 { 1 } else { 0 })
                    }
                    BinOp::FloorMod => {
                        (b != 0).then(|| a - b * (a.div_euclid(b) - if b < 0 && a.rem_euclid(b) != 0 { 1 } else { 0 }))
                    }
                }
            }
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        self.eval(&|_| None)
    }
}

impl fmt::Display for PrimExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrimExpr::Int(v) => write!(f, "{v}"),
            PrimExpr::Var(v) => write!(f, "{v}"),
            PrimExpr::Bin(op, a, b) => {
                let sym = match op {
                    BinOp::Add => "+",
                    BinOp::Sub => "-",
                    BinOp::Mul => "*",
                    BinOp::FloorDiv => "//",
                    BinOp::FloorMod => "%",
                };
                let wrap = |e: &PrimExpr| match e {
                    PrimExpr::Bin(..) => format!("({e})"),
                    _ => e.to_string(),
                };
                write!(f, "{} {sym} {}", wrap(a), wrap(b))
            }
        }
    }
}

/// What a value is known to be.
#[derive(Clone, Debug, PartialEq)]
pub enum StructInfo {
    /// `shape` None: unknown dims (`ndim` -1: unknown rank); `dtype` None: any.
    Tensor {
        shape: Option<Vec<PrimExpr>>,
        ndim: i64,
        dtype: Option<DType>,
    },
    Shape {
        dims: Option<Vec<PrimExpr>>,
        ndim: i64,
    },
    Prim(DType),
    Tuple(Vec<StructInfo>),
    Str,
    Object,
    Callable,
}

impl StructInfo {
    pub fn tensor(shape: Vec<PrimExpr>, dtype: DType) -> StructInfo {
        StructInfo::Tensor { ndim: shape.len() as i64, shape: Some(shape), dtype: Some(dtype) }
    }

    /// Symbolic variables the struct info mentions.
    pub fn vars(&self, out: &mut BTreeSet<String>) {
        match self {
            StructInfo::Tensor { shape: Some(s), .. } | StructInfo::Shape { dims: Some(s), .. } => {
                s.iter().for_each(|e| e.vars(out))
            }
            StructInfo::Tuple(items) => items.iter().for_each(|i| i.vars(out)),
            _ => {}
        }
    }

    /// TVM's annotation text, as it appears in ErrorContext strings.
    pub fn annotation(&self) -> String {
        let dims = |s: &[PrimExpr]| match s.len() {
            1 => format!("({},)", s[0]),
            _ => format!("({})", s.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ")),
        };
        match self {
            // TVM's order: the shape, then dtype (unless any), then ndim (when the shape is
            // unknown and the rank known); no parentheses when there is nothing to say.
            StructInfo::Tensor { shape, ndim, dtype } => {
                let mut args = Vec::new();
                if let Some(s) = shape {
                    args.push(dims(s));
                }
                if let Some(d) = dtype {
                    args.push(format!("dtype=\"{d}\""));
                }
                if shape.is_none() && *ndim >= 0 {
                    args.push(format!("ndim={ndim}"));
                }
                if args.is_empty() { "R.Tensor".into() } else { format!("R.Tensor({})", args.join(", ")) }
            }
            StructInfo::Shape { dims: Some(d), .. } => {
                format!("R.Shape([{}])", d.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", "))
            }
            StructInfo::Shape { ndim, .. } => format!("R.Shape(ndim={ndim})"),
            StructInfo::Prim(d) => format!("T.{d}"),
            StructInfo::Tuple(items) => {
                format!("R.Tuple({})", items.iter().map(|i| i.annotation()).collect::<Vec<_>>().join(", "))
            }
            StructInfo::Str => "R.Str".into(),
            StructInfo::Object => "R.Object".into(),
            StructInfo::Callable => "R.Callable".into(),
        }
    }
}

pub type VarId = usize;

#[derive(Clone, Debug)]
pub struct VarInfo {
    pub name: String,
    pub sinfo: StructInfo,
    pub span: Span,
}

/// An operand.
#[derive(Clone, Debug, PartialEq)]
pub enum Atom {
    Var(VarId),
    /// A tensor constant (index into `Module::constants`).
    Const(usize),
    /// A scalar PrimValue: an int literal or shape arithmetic over symbolic variables.
    Prim(PrimExpr),
    Float(f64),
    Str(String),
    Shape(Vec<PrimExpr>),
    DataType(DType),
    /// A module function used as a value.
    Func(String),
    /// None: an optional argument left out (a kernel's bias), passed as TVM passes it, %void.
    None,
}

#[derive(Clone, Debug)]
pub enum Op {
    /// `R.call_dps_packed(name, args, out_ty)`: outputs allocated by the caller.
    DpsPacked {
        name: String,
        args: Vec<Atom>,
        outs: Vec<StructInfo>,
    },
    /// `R.call_packed` / `R.call_pure_packed`: the callee returns its result.
    Packed {
        name: String,
        args: Vec<Atom>,
    },
    /// A call of a module function.
    CallFunc {
        name: String,
        args: Vec<Atom>,
    },
    /// A call of a closure value.
    CallClosure {
        callee: Atom,
        args: Vec<Atom>,
    },
    /// A lifted nested function with its captured variables.
    MakeClosure {
        func: String,
        captures: Vec<VarId>,
    },
    Tuple(Vec<Atom>),
    GetItem(Atom, usize),
    /// `y = x`, `y = R.shape([...])`, `y = R.const(...)`: the atom itself.
    Copy(Atom),
    MatchCast(Atom, StructInfo),
    If {
        cond: Atom,
        then: Block,
        otherwise: Block,
    },
}

#[derive(Clone, Debug)]
pub struct Block {
    pub bindings: Vec<Binding>,
    pub result: Atom,
}

#[derive(Clone, Debug)]
pub struct Binding {
    pub var: VarId,
    pub op: Op,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Function {
    pub name: String,
    pub params: Vec<VarId>,
    pub ret: Option<StructInfo>,
    pub body: Block,
    pub span: Span,
}

#[derive(Clone, Debug, Default)]
pub struct Module {
    pub functions: Vec<Function>,
    pub vars: Vec<VarInfo>,
    pub constants: Vec<TensorConst>,
}

impl Module {
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::{PrimExpr, StructInfo};
    use crate::vm::DType;

    /// TVM 0.27's own texts for these annotations, read from its ErrorContext messages.
    #[test]
    fn annotations_read_as_tvm_prints_them() {
        let tensor = |shape: Option<Vec<i64>>, ndim, dtype| StructInfo::Tensor {
            shape: shape.map(|s| s.into_iter().map(PrimExpr::Int).collect()),
            ndim,
            dtype,
        };
        let f32 = Some(DType::F32);
        for (info, tvm) in [
            (tensor(None, 2, None), "R.Tensor(ndim=2)"),
            (tensor(Some(vec![2, 3]), 2, None), "R.Tensor((2, 3))"),
            (tensor(None, -1, None), "R.Tensor"),
            (tensor(None, -1, Some(DType::new(0, 8, 1))), "R.Tensor(dtype=\"int8\")"),
            (tensor(None, 2, f32), "R.Tensor(dtype=\"float32\", ndim=2)"),
            (tensor(Some(vec![2, 4]), 2, f32), "R.Tensor((2, 4), dtype=\"float32\")"),
            (StructInfo::Shape { dims: None, ndim: -1 }, "R.Shape(ndim=-1)"),
            (StructInfo::Shape { dims: None, ndim: 2 }, "R.Shape(ndim=2)"),
        ] {
            assert_eq!(info.annotation(), tvm);
        }
    }
}
