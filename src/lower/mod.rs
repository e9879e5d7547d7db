//! Lowering Relax IR to VM bytecode, in the shape TVM's default pipeline gives it: parameter
//! checks (check_*_info + match_shape, with TVM's ErrorContext strings), a shape heap for
//! symbolic dims with native shape functions for their arithmetic, destination-passing
//! allocation for `call_dps_packed`, static storage planning (one storage reused by tensors of
//! the same size whose lifetimes do not overlap), kills after last use, `if` as
//! read_if_cond/If/Goto with a merge register, tuples, closures, and calls between functions.
//!
//! The passes live one per file: `params` (parameter and match_cast checks), `shapes` (the heap
//! and shape functions), `liveness` (last uses and which tensors may share storage), `alloc`
//! (DPS allocation and storage planning), and this file's code generation, which applies them.

mod alloc;
mod liveness;
mod params;
mod shapes;

use std::collections::{HashMap, HashSet};

use crate::diag::{SourceError, Span};
use crate::ir::{Atom, Block, Function, Module, Op, PrimExpr, ShapeFunc, StructInfo, VarId};
use crate::vm::{Arg, Constant, DType, ExecBuilder, Executable, Instr, VM_REG, VOID_REG};
use shapes::{Dim, ShapeHeap};

/// A lowered module: the executable and the shape functions it calls.
pub struct Lowered {
    pub exec: Executable,
    pub shape_funcs: Vec<ShapeFunc>,
}

type Result<T> = std::result::Result<T, SourceError>;

fn err<T>(span: Span, message: impl Into<String>) -> Result<T> {
    Err(SourceError::new(span, message))
}

pub fn lower(m: &Module) -> Result<Lowered> {
    let mut b = ExecBuilder::new();
    for f in &m.functions {
        let names: Vec<&str> = f.params.iter().map(|p| m.vars[*p].name.as_str()).collect();
        b.declare_function(&f.name, &names);
    }
    let mut shape_funcs = Vec::new();
    for f in &m.functions {
        let g = FnGen::new(m, &mut b, f);
        shape_funcs.extend(g.run()?);
    }
    Ok(Lowered { exec: b.build(), shape_funcs })
}

/// Where a variable's value is: a register, or an operand known at compile time.
#[derive(Clone, Copy)]
enum Place {
    Reg(i64),
    Operand(Arg),
}

/// A storage shared by tensors of one size whose lifetimes do not overlap.
struct Token {
    reg: i64,
    nbytes: i64,
    free: bool,
}

struct FnGen<'a> {
    m: &'a Module,
    b: &'a mut ExecBuilder,
    f: &'a Function,
    places: HashMap<VarId, Place>,
    next_reg: i64,
    heap: ShapeHeap,
    heap_reg: Option<i64>,
    tokens: Vec<Token>,
    tensor_token: HashMap<VarId, usize>,
    plannable: HashSet<VarId>,
}

fn dtype_const(d: DType) -> Constant {
    Constant::DataType(d)
}

impl<'a> FnGen<'a> {
    fn new(m: &'a Module, b: &'a mut ExecBuilder, f: &'a Function) -> FnGen<'a> {
        FnGen {
            m,
            b,
            f,
            places: HashMap::new(),
            next_reg: f.params.len() as i64,
            heap: ShapeHeap::default(),
            heap_reg: None,
            tokens: Vec::new(),
            tensor_token: HashMap::new(),
            plannable: liveness::kernel_only(&f.body),
        }
    }

    fn reg(&mut self) -> i64 {
        self.next_reg += 1;
        self.next_reg - 1
    }

    fn c(&mut self, c: Constant) -> Arg {
        Arg::Const(self.b.constant(c))
    }

    fn builtin(&mut self, name: &str) -> i64 {
        self.b.packed(&format!("vm.builtin.{name}"))
    }

    fn call(&mut self, dst: i64, func: i64, args: Vec<Arg>) {
        self.b.call(dst, func, args);
    }

    fn heap_arg(&self) -> Arg {
        Arg::Reg(self.heap_reg.unwrap_or(VOID_REG))
    }

    fn run(mut self) -> Result<Vec<ShapeFunc>> {
        let names: Vec<&str> = self.f.params.iter().map(|p| self.m.vars[*p].name.as_str()).collect();
        self.b.begin_function(&self.f.name, &names);
        for (i, p) in self.f.params.iter().enumerate() {
            self.places.insert(*p, Place::Reg(i as i64));
        }
        self.intern_all();
        if self.heap.size() > 0 {
            let r = self.reg();
            let f = self.builtin("alloc_shape_heap");
            self.call(r, f, vec![Arg::Reg(VM_REG), Arg::Imm(self.heap.size() as i64)]);
            self.heap_reg = Some(r);
        }
        self.params()?;
        let result = self.block(&self.f.body, true)?;
        self.ret(result)?;
        let regs = self.next_reg;
        self.b.end_function(regs);
        Ok(std::mem::take(&mut self.heap.functions))
    }

    /// Gives every shape expression of the function its heap slot up front (the heap's size is
    /// the first instruction).
    fn intern_all(&mut self) {
        let mut exprs: Vec<PrimExpr> = Vec::new();
        let mut sinfos: Vec<StructInfo> = self.f.params.iter().map(|p| self.m.vars[*p].sinfo.clone()).collect();
        sinfos.extend(self.f.ret.clone());
        fn walk(block: &Block, sinfos: &mut Vec<StructInfo>, exprs: &mut Vec<PrimExpr>) {
            for b in &block.bindings {
                match &b.op {
                    Op::DpsPacked { outs, .. } => {
                        for o in outs {
                            if let StructInfo::Tensor { shape: Some(dims), dtype: Some(dt), .. } = o {
                                exprs.extend(dims.iter().cloned());
                                exprs.push(nbytes_expr(dims, *dt));
                            }
                        }
                    }
                    Op::MatchCast(_, s) => sinfos.push(s.clone()),
                    Op::If { then, otherwise, .. } => {
                        walk(then, sinfos, exprs);
                        walk(otherwise, sinfos, exprs);
                    }
                    _ => {}
                }
                for a in liveness::operands(&b.op) {
                    match a {
                        Atom::Prim(p) => exprs.push(p.clone()),
                        Atom::Shape(d) => exprs.extend(d.iter().cloned()),
                        _ => {}
                    }
                }
            }
            if let Atom::Prim(p) = &block.result {
                exprs.push(p.clone());
            }
        }
        walk(&self.f.body, &mut sinfos, &mut exprs);
        for s in &sinfos {
            dims_of(s, &mut exprs);
        }
        for e in exprs {
            self.heap.intern(&e);
        }
    }

    fn run_shape_function(&mut self) {
        let prefix = format!("shape_func_{}_", self.f.name);
        if let Some(name) = self.heap.new_shape_function(&prefix) {
            let f = self.b.packed(&name);
            let heap = self.heap_arg();
            self.call(VOID_REG, f, vec![heap]);
        }
    }

    fn operand(&self, a: &Atom, span: Span) -> Result<Arg> {
        Ok(match a {
            Atom::Var(v) => match self.places.get(v) {
                Some(Place::Reg(r)) => Arg::Reg(*r),
                Some(Place::Operand(arg)) => *arg,
                None => return err(span, format!("`{}` is used before it is defined", self.m.vars[*v].name)),
            },
            _ => return err(span, "internal: operand() on a non-variable atom"),
        })
    }

    /// An atom as an argument, materializing shapes and prim values that live in the heap.
    fn arg(&mut self, a: &Atom, span: Span) -> Result<Arg> {
        Ok(match a {
            Atom::Var(_) => self.operand(a, span)?,
            Atom::Const(c) => self.c(Constant::Tensor(self.m.constants[*c].clone())),
            Atom::Prim(p) => match p.as_int() {
                Some(v) if v.abs() < (1 << 55) => Arg::Imm(v),
                Some(v) => self.c(Constant::Int(v)),
                None => {
                    let slot = self.ready_slot(p, span)?;
                    let r = self.reg();
                    let f = self.builtin("make_prim_value");
                    let heap = self.heap_arg();
                    self.call(r, f, vec![heap, Arg::Imm(1), Arg::Imm(slot)]);
                    Arg::Reg(r)
                }
            },
            Atom::Float(v) => self.c(Constant::Float(*v)),
            Atom::Str(s) => self.c(Constant::Str(s.clone())),
            Atom::DataType(d) => self.c(dtype_const(*d)),
            Atom::None => Arg::Reg(VOID_REG),
            Atom::Shape(dims) => match dims.iter().map(|d| d.as_int()).collect::<Option<Vec<i64>>>() {
                Some(v) => self.c(Constant::Shape(v)),
                None => {
                    let r = self.reg();
                    self.make_shape(r, dims, span)?;
                    Arg::Reg(r)
                }
            },
            Atom::Func(name) => match self.m.functions.iter().position(|f| &f.name == name) {
                Some(_) => Arg::Func(self.b.packed_or_function(name)),
                None => return err(span, format!("unknown function {name}")),
            },
        })
    }

    fn ready_slot(&mut self, e: &PrimExpr, span: Span) -> Result<i64> {
        if self.heap.dim(e).is_none() && self.heap.known(e) {
            self.run_shape_function();
        }
        match self.heap.dim(e) {
            Some(Dim::Slot(s)) => Ok(s as i64),
            Some(Dim::Imm) => Err(SourceError::new(span, "internal: immediate has no slot")),
            None => err(
                span,
                format!(
                    "`{e}` uses a symbolic variable that nothing binds (bind it with a parameter annotation or R.match_cast)"
                ),
            ),
        }
    }

    fn make_shape(&mut self, dst: i64, dims: &[PrimExpr], span: Span) -> Result<()> {
        let mut args = vec![self.heap_arg(), Arg::Imm(dims.len() as i64)];
        for d in dims {
            match d.as_int() {
                Some(v) => args.extend([Arg::Imm(0), Arg::Imm(v)]),
                None => {
                    let s = self.ready_slot(d, span)?;
                    args.extend([Arg::Imm(1), Arg::Imm(s)]);
                }
            }
        }
        let f = self.builtin("make_shape");
        self.call(dst, f, args);
        Ok(())
    }

    /// Lowers a block; returns where its result is. `top`: the function's own block, where
    /// variables are killed after their last use and storage is planned.
    fn block(&mut self, block: &Block, top: bool) -> Result<Place> {
        let kills = if top { liveness::last_uses(block) } else { HashMap::new() };
        for (i, b) in block.bindings.iter().enumerate() {
            self.binding(b.var, &b.op, b.span, top)?;
            for v in kills.get(&i).into_iter().flatten() {
                self.kill(*v);
            }
        }
        match &block.result {
            Atom::Var(v) => match self.places.get(v) {
                Some(p) => Ok(*p),
                None => err(self.f.span, "internal: result used before definition"),
            },
            other => Ok(Place::Operand(self.arg(other, self.f.span)?)),
        }
    }

    fn kill(&mut self, v: VarId) {
        if self.f.params.contains(&v) {
            return;
        }
        if let Some(Place::Reg(r)) = self.places.get(&v).copied() {
            let f = self.builtin("null_value");
            self.call(r, f, vec![]);
            if let Some(t) = self.tensor_token.remove(&v) {
                self.tokens[t].free = true;
            }
        }
    }

    /// `var = src`: a new reference in a register, or the same compile-time operand.
    fn bind_copy(&mut self, var: VarId, src: Arg) {
        match src {
            Arg::Reg(_) => {
                let f = self.builtin("copy");
                let dst = self.bind_reg(var);
                self.call(dst, f, vec![src]);
            }
            other => {
                self.places.insert(var, Place::Operand(other));
            }
        }
    }

    fn bind_reg(&mut self, var: VarId) -> i64 {
        let r = self.reg();
        self.places.insert(var, Place::Reg(r));
        r
    }

    fn binding(&mut self, var: VarId, op: &Op, span: Span, top: bool) -> Result<()> {
        match op {
            Op::DpsPacked { name, args, outs } => {
                let mut operands = Vec::new();
                for a in args {
                    operands.push(self.arg(a, span)?);
                }
                let single = outs.len() == 1 && !matches!(self.m.vars[var].sinfo, StructInfo::Tuple(_));
                let mut out_regs = Vec::new();
                for o in outs {
                    let plan = top && single && self.plannable.contains(&var);
                    let r = self.alloc_tensor(o, if plan { Some(var) } else { None }, span)?;
                    out_regs.push(r);
                }
                let f = self.b.packed(name);
                let mut all = operands;
                all.extend(out_regs.iter().map(|r| Arg::Reg(*r)));
                self.call(VOID_REG, f, all);
                if single {
                    self.places.insert(var, Place::Reg(out_regs[0]));
                } else {
                    let dst = self.bind_reg(var);
                    let t = self.builtin("make_tuple");
                    self.call(dst, t, out_regs.iter().map(|r| Arg::Reg(*r)).collect());
                    let null = self.builtin("null_value");
                    for r in out_regs {
                        self.call(r, null, vec![]);
                    }
                }
            }
            Op::Packed { name, args } => {
                let operands = args.iter().map(|a| self.arg(a, span)).collect::<Result<Vec<_>>>()?;
                let f = self.b.packed(name);
                let dst = self.bind_reg(var);
                self.call(dst, f, operands);
            }
            Op::CallFunc { name, args } => {
                let operands = args.iter().map(|a| self.arg(a, span)).collect::<Result<Vec<_>>>()?;
                let f = self.b.packed_or_function(name);
                let dst = self.bind_reg(var);
                self.call(dst, f, operands);
            }
            Op::CallClosure { callee, args } => {
                let mut operands = vec![Arg::Reg(VM_REG), self.arg(callee, span)?];
                for a in args {
                    operands.push(self.arg(a, span)?);
                }
                let f = self.builtin("invoke_closure");
                let dst = self.bind_reg(var);
                self.call(dst, f, operands);
            }
            Op::MakeClosure { func, captures } => {
                let mut operands = vec![Arg::Func(self.b.packed_or_function(func))];
                for c in captures {
                    operands.push(self.operand(&Atom::Var(*c), span)?);
                }
                let f = self.builtin("make_closure");
                let dst = self.bind_reg(var);
                self.call(dst, f, operands);
            }
            Op::Tuple(items) => {
                let operands = items.iter().map(|a| self.arg(a, span)).collect::<Result<Vec<_>>>()?;
                let f = self.builtin("make_tuple");
                let dst = self.bind_reg(var);
                self.call(dst, f, operands);
            }
            Op::GetItem(t, k) => {
                let t = self.arg(t, span)?;
                let f = self.builtin("tuple_getitem");
                let dst = self.bind_reg(var);
                self.call(dst, f, vec![t, Arg::Imm(*k as i64)]);
            }
            Op::Copy(Atom::Var(v)) => {
                let src = self.operand(&Atom::Var(*v), span)?;
                self.bind_copy(var, src);
            }
            Op::Copy(atom) => {
                let a = self.arg(atom, span)?;
                self.places.insert(var, Place::Operand(a));
            }
            Op::MatchCast(value, sinfo) => {
                let v = self.arg(value, span)?;
                let ctx = format!("ErrorContext(match_cast, ty={}) ", sinfo.annotation());
                self.check_info(v, sinfo, &ctx);
                let compound = self.match_dims(v, sinfo, &ctx, false)?;
                self.run_shape_function();
                if compound {
                    if !dims_known(&self.heap, sinfo) {
                        return err(span, "this match_cast's shape arithmetic uses a symbolic variable nothing binds");
                    }
                    self.match_dims(v, sinfo, &ctx, true)?;
                }
                self.bind_copy(var, v);
            }
            Op::If { cond, then, otherwise } => {
                let c = self.arg(cond, span)?;
                let creg = self.reg();
                let read = self.builtin("read_if_cond");
                self.call(creg, read, vec![c]);
                let merge = self.bind_reg(var);
                let if_pc = self.b.next_pc();
                self.b.emit(Instr::If { cond: creg, false_offset: 0 });
                let copy = self.builtin("copy");
                let then_place = self.block(then, false)?;
                let src = place_arg(then_place);
                self.call(merge, copy, vec![src]);
                let goto_pc = self.b.next_pc();
                self.b.emit(Instr::Goto { offset: 0 });
                let else_pc = self.b.next_pc();
                self.b.patch_offset(if_pc, else_pc - if_pc);
                let else_place = self.block(otherwise, false)?;
                let src = place_arg(else_place);
                self.call(merge, copy, vec![src]);
                let join = self.b.next_pc();
                self.b.patch_offset(goto_pc, join - goto_pc);
            }
        }
        Ok(())
    }

    /// Checks the result against the return annotation's dims, then returns it.
    fn ret(&mut self, result: Place) -> Result<()> {
        let reg = match result {
            Place::Reg(r) => r,
            Place::Operand(arg) => {
                let r = self.reg();
                let f = self.builtin("copy");
                self.call(r, f, vec![arg]);
                r
            }
        };
        let ret = self.f.ret.clone().filter(|r| {
            matches!(r, StructInfo::Tensor { shape: Some(_), .. } | StructInfo::Shape { dims: Some(_), .. })
                && dims_known(&self.heap, r)
                && has_symbols(r)
        });
        if let Some(ret) = ret {
            let ctx = self.context("loc=return", &ret);
            self.match_dims(Arg::Reg(reg), &ret, &ctx, true)?;
        }
        self.b.emit(Instr::Ret { result: reg });
        Ok(())
    }
}

fn place_arg(p: Place) -> Arg {
    match p {
        Place::Reg(r) => Arg::Reg(r),
        Place::Operand(a) => a,
    }
}

fn has_symbols(s: &StructInfo) -> bool {
    let mut v = std::collections::BTreeSet::new();
    s.vars(&mut v);
    !v.is_empty()
}

fn dims_known(heap: &ShapeHeap, s: &StructInfo) -> bool {
    match s {
        StructInfo::Tensor { shape: Some(d), .. } | StructInfo::Shape { dims: Some(d), .. } => {
            d.iter().all(|e| heap.known(e))
        }
        _ => true,
    }
}

fn dims_of(s: &StructInfo, out: &mut Vec<PrimExpr>) {
    match s {
        StructInfo::Tensor { shape: Some(d), .. } | StructInfo::Shape { dims: Some(d), .. } => {
            out.extend(d.iter().cloned())
        }
        StructInfo::Tuple(items) => items.iter().for_each(|i| dims_of(i, out)),
        _ => {}
    }
}

/// Bytes of a tensor: product of dims times the element size.
fn nbytes_expr(dims: &[PrimExpr], dtype: DType) -> PrimExpr {
    let elem = PrimExpr::Int(dtype.element_bytes() as i64);
    let e = dims.iter().fold(elem, |acc, d| PrimExpr::Bin(crate::ir::BinOp::Mul, Box::new(d.clone()), Box::new(acc)));
    e.as_int().map(PrimExpr::Int).unwrap_or(e)
}
