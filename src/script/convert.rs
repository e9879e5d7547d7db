//! TVMScript meaning for the parsed syntax: the `@I.ir_module` class, `@R.function`s, struct-info
//! annotations, the Relax operations of the subset, symbolic shape variables, nested functions
//! (lifted, with their captured variables appended to their parameters, as TVM's LambdaLift
//! does). Everything outside the subset is an error at its span that says what to do instead.

use std::collections::{BTreeSet, HashMap};

use super::parser::{Expr, FunctionDef, Stmt};
use crate::diag::{SourceError, Span};
use crate::ir::{Atom, Binding, Block, Function, Module, Op, PrimExpr, StructInfo, VarId, VarInfo};
use crate::vm::{DType, TensorConst};

mod annotations;
mod calls;
mod ops;

pub use annotations::compatible;

type Result<T> = std::result::Result<T, SourceError>;

fn err<T>(span: Span, message: impl Into<String>) -> Result<T> {
    Err(SourceError::new(span, message))
}

/// Converts a parsed file into Relax IR. `weights` bind tensor parameters by name.
pub fn convert(stmts: &[Stmt], weights: &HashMap<String, TensorConst>) -> Result<Module> {
    let mut class = None;
    for s in stmts {
        match s {
            Stmt::Class { decorators, body, name, span } => {
                if !decorators.iter().any(|d| d.dotted().as_deref() == Some("I.ir_module")) {
                    return err(*span, format!("class {name} is not an `@I.ir_module`"));
                }
                if class.is_some() {
                    return err(*span, "only one `@I.ir_module` class per file");
                }
                class = Some((name.clone(), body));
            }
            Stmt::Skipped(_) => {}
            Stmt::Function(f) => return err(f.name_span, "functions must be inside the `@I.ir_module` class"),
            other => return err(stmt_span(other), "only imports and one `@I.ir_module` class may be at the top level"),
        }
    }
    let Some((class_name, body)) = class else {
        return err(Span::default(), "no `@I.ir_module` class found");
    };
    let mut c = Converter {
        module: Module::default(),
        class_name,
        aliases: BTreeSet::new(),
        function_names: Vec::new(),
        signatures: HashMap::new(),
        scopes: Vec::new(),
        weights,
    };
    let mut defs = Vec::new();
    for s in body {
        match s {
            Stmt::Function(f) => {
                c.check_decorators(f)?;
                if c.signatures.contains_key(&f.name) {
                    return err(f.name_span, format!("function {} is defined twice", f.name));
                }
                let sig = c.signature(f)?;
                c.signatures.insert(f.name.clone(), sig);
                defs.push(f);
            }
            Stmt::Skipped(_) => {}
            other => return err(stmt_span(other), "an `@I.ir_module` class holds only `@R.function`s"),
        }
    }
    for f in defs {
        c.function_names.push(f.name.clone());
        c.function(f, &f.name)?;
        c.function_names.pop();
    }
    Ok(c.module)
}

fn stmt_span(s: &Stmt) -> Span {
    match s {
        Stmt::Assign { span, .. } | Stmt::Return(_, span) | Stmt::If { span, .. } | Stmt::With { span, .. } => *span,
        Stmt::Class { span, .. } | Stmt::Skipped(span) => *span,
        Stmt::Expr(e) => e.span(),
        Stmt::Function(f) => f.span,
    }
}

/// Parameter and return struct info of a module function.
#[derive(Clone)]
struct Signature {
    params: Vec<StructInfo>,
    ret: Option<StructInfo>,
}

/// Names visible in one function being converted.
struct Scope {
    names: HashMap<String, VarId>,
    symbols: BTreeSet<String>,
    /// (outer variable, the parameter standing for it here), for nested functions.
    captures: Vec<(VarId, VarId)>,
    /// Local closures: variable -> lifted function name.
    closures: HashMap<VarId, String>,
    bindings: Vec<Binding>,
}

struct Converter<'w> {
    module: Module,
    class_name: String,
    /// Other names for the module (`cls = Module`).
    aliases: BTreeSet<String>,
    /// The functions being converted, outermost first (names lifted functions).
    function_names: Vec<String>,
    signatures: HashMap<String, Signature>,
    scopes: Vec<Scope>,
    weights: &'w HashMap<String, TensorConst>,
}

impl Converter<'_> {
    fn check_decorators(&self, f: &FunctionDef) -> Result<()> {
        let mut relax = false;
        for d in &f.decorators {
            let (name, kwargs) = match d {
                Expr::Call { func, kwargs, .. } => (func.dotted(), kwargs.as_slice()),
                other => (other.dotted(), &[][..]),
            };
            match name.as_deref() {
                Some("R.function") => {
                    relax = true;
                    for (k, v) in kwargs {
                        if !matches!(k.as_str(), "pure" | "private") || !matches!(v, Expr::Bool(..)) {
                            return err(v.span(), format!("unsupported R.function argument `{k}`"));
                        }
                    }
                }
                Some("T.prim_func") => {
                    return err(
                        d.span(),
                        "T.prim_func is outside relaxc's subset: write the kernel in C (relaxc compile --kernels k.c) \
                         and call it with R.call_dps_packed",
                    );
                }
                _ => return err(d.span(), "unknown decorator (expected @R.function)"),
            }
        }
        if !relax {
            return err(f.name_span, format!("{} needs the @R.function decorator", f.name));
        }
        Ok(())
    }

    fn signature(&mut self, f: &FunctionDef) -> Result<Signature> {
        self.scopes.push(Scope::new());
        let mut params = Vec::new();
        for p in &f.params {
            let Some(a) = &p.annotation else {
                return err(p.span, format!("parameter {} needs an annotation", p.name));
            };
            params.push(self.sinfo(a, true)?);
        }
        let ret = f.ret.as_ref().map(|r| self.sinfo(r, true)).transpose()?;
        self.scopes.pop();
        Ok(Signature { params, ret })
    }

    fn scope(&mut self) -> &mut Scope {
        self.scopes.last_mut().expect("inside a function")
    }

    fn new_var(&mut self, name: &str, sinfo: StructInfo, span: Span) -> VarId {
        self.module.vars.push(VarInfo { name: name.to_string(), sinfo, span });
        self.module.vars.len() - 1
    }

    fn sinfo_of(&self, a: &Atom) -> StructInfo {
        match a {
            Atom::Var(v) => self.module.vars[*v].sinfo.clone(),
            Atom::Const(c) => {
                let t = &self.module.constants[*c];
                StructInfo::tensor(t.shape.iter().map(|d| PrimExpr::Int(*d)).collect(), t.dtype)
            }
            Atom::Prim(_) => StructInfo::Prim(DType::I64),
            Atom::Float(_) => StructInfo::Prim(DType::new(2, 64, 1)),
            Atom::Str(_) => StructInfo::Str,
            Atom::Shape(d) => StructInfo::Shape { ndim: d.len() as i64, dims: Some(d.clone()) },
            Atom::DataType(_) | Atom::None => StructInfo::Object,
            Atom::Func(_) => StructInfo::Callable,
        }
    }

    /// Resolves a name, capturing it from enclosing functions when needed.
    fn lookup(&mut self, name: &str, span: Span) -> Result<VarId> {
        let depth = self.scopes.len();
        let Some(found) = (0..depth).rev().find(|&i| self.scopes[i].names.contains_key(name)) else {
            return err(span, format!("unknown name `{name}`"));
        };
        let mut var = self.scopes[found].names[name];
        for i in found + 1..depth {
            let info = self.module.vars[var].clone();
            let param = self.new_var(&info.name, info.sinfo, info.span);
            self.scopes[i].captures.push((var, param));
            self.scopes[i].names.insert(name.to_string(), param);
            var = param;
        }
        Ok(var)
    }

    fn declare_symbol(&mut self, name: &str) {
        self.scope().symbols.insert(name.to_string());
    }

    fn is_symbol(&self, name: &str) -> bool {
        self.scopes.iter().any(|s| s.symbols.contains(name))
    }

    fn function(&mut self, f: &FunctionDef, name: &str) -> Result<Vec<(VarId, VarId)>> {
        let sig = match self.signatures.get(name) {
            Some(s) => s.clone(),
            None => self.signature(f)?,
        };
        self.scopes.push(Scope::new());
        // Re-declare the symbols the annotations introduce, in this function's scope.
        for p in &f.params {
            if let Some(a) = &p.annotation {
                self.sinfo(a, true)?;
            }
        }
        let mut params = Vec::new();
        let mut bound = Vec::new();
        for (p, s) in f.params.iter().zip(&sig.params) {
            if let Some(w) = self.weights.get(&p.name) {
                let c = self.bind_weight(&p.name, w, s, p.span)?;
                let v = self.new_var(&p.name, s.clone(), p.span);
                bound.push(Binding { var: v, op: Op::Copy(Atom::Const(c)), span: p.span });
                self.scope().names.insert(p.name.clone(), v);
                continue;
            }
            let v = self.new_var(&p.name, s.clone(), p.span);
            self.scope().names.insert(p.name.clone(), v);
            params.push(v);
        }
        self.scope().bindings.extend(bound);
        let result = self.body(&f.body, f.span)?;
        let scope = self.scopes.pop().expect("scope");
        // Captured variables become trailing parameters (TVM's LambdaLift order).
        params.extend(scope.captures.iter().map(|(_, p)| *p));
        let body = Block { bindings: scope.bindings, result };
        self.module.functions.push(Function { name: name.to_string(), params, ret: sig.ret, body, span: f.span });
        Ok(scope.captures)
    }

    fn bind_weight(&mut self, name: &str, w: &TensorConst, s: &StructInfo, span: Span) -> Result<usize> {
        if let StructInfo::Tensor { shape, dtype, ndim } = s {
            let dims_ok = match shape {
                Some(dims) => {
                    dims.len() == w.shape.len()
                        && dims.iter().zip(&w.shape).all(|(d, n)| d.as_int().is_none_or(|v| v == *n))
                }
                None => *ndim < 0 || *ndim == w.shape.len() as i64,
            };
            if dims_ok && dtype.is_none_or(|d| d == w.dtype) {
                self.module.constants.push(w.clone());
                return Ok(self.module.constants.len() - 1);
            }
        }
        err(
            span,
            format!("weight {name} is {} {:?}, which does not fit the annotation {}", w.dtype, w.shape, s.annotation()),
        )
    }

    /// Converts a function body; returns the returned atom.
    fn body(&mut self, stmts: &[Stmt], span: Span) -> Result<Atom> {
        for (i, s) in stmts.iter().enumerate() {
            if let Stmt::Return(value, rspan) = s {
                if i + 1 != stmts.len() {
                    return err(stmt_span(&stmts[i + 1]), "code after `return` never runs");
                }
                return match value {
                    Some(v) => self.atom(v),
                    None => err(*rspan, "`return` needs a value"),
                };
            }
            self.statement(s)?;
        }
        err(span, "the function does not end with `return`")
    }

    fn statement(&mut self, s: &Stmt) -> Result<()> {
        match s {
            Stmt::Skipped(_) => Ok(()),
            Stmt::Assign { targets, annotation, value, span } => {
                self.assign(targets, annotation.as_ref(), value, *span)
            }
            Stmt::With { context, body, span } => {
                let is_df =
                    matches!(context, Expr::Call { func, .. } if func.dotted().as_deref() == Some("R.dataflow"));
                if !is_df {
                    return err(context.span(), "only `with R.dataflow():` blocks are supported");
                }
                for s in body {
                    self.statement(s)?;
                }
                let _ = span;
                Ok(())
            }
            Stmt::Expr(Expr::Call { func, args, .. }) if func.dotted().as_deref() == Some("R.output") => {
                for a in args {
                    match a {
                        Expr::Name(n, span) => {
                            self.lookup(n, *span)?;
                        }
                        other => return err(other.span(), "R.output lists variable names"),
                    }
                }
                Ok(())
            }
            Stmt::Expr(e) => {
                let (op, sinfo) = self.op(e)?;
                let v = self.new_var("_", sinfo, e.span());
                self.scope().bindings.push(Binding { var: v, op, span: e.span() });
                Ok(())
            }
            Stmt::If { cond, then, otherwise, span } => self.if_stmt(cond, then, otherwise, *span),
            Stmt::Function(f) => self.nested_function(f),
            Stmt::Return(_, span) => err(*span, "`return` is only allowed at the end of a function"),
            Stmt::Class { span, .. } => err(*span, "classes cannot be nested"),
        }
    }

    fn nested_function(&mut self, f: &FunctionDef) -> Result<()> {
        self.check_decorators(f)?;
        let parent = self.current_function_name();
        let lifted = format!("{parent}_{}", f.name);
        let sig = self.signature(f)?;
        self.signatures.insert(lifted.clone(), sig);
        self.function_names.push(lifted.clone());
        let captures = self.function(f, &lifted)?;
        self.function_names.pop();
        let captured: Vec<VarId> = captures.iter().map(|(outer, _)| *outer).collect();
        let v = self.new_var(&f.name, StructInfo::Callable, f.name_span);
        self.scope().bindings.push(Binding {
            var: v,
            op: Op::MakeClosure { func: lifted.clone(), captures: captured },
            span: f.span,
        });
        self.scope().names.insert(f.name.clone(), v);
        self.scope().closures.insert(v, lifted);
        Ok(())
    }

    fn current_function_name(&self) -> String {
        self.function_names.last().cloned().unwrap_or_default()
    }

    fn if_stmt(&mut self, cond: &Expr, then: &[Stmt], otherwise: &[Stmt], span: Span) -> Result<()> {
        let cond = self.atom(cond)?;
        let last_target = |b: &[Stmt]| match b.last() {
            Some(Stmt::Assign { targets, .. }) if targets.len() == 1 => Some(targets[0].0.clone()),
            _ => None,
        };
        let (Some(a), Some(b)) = (last_target(then), last_target(otherwise)) else {
            return err(
                span,
                "both branches of `if` must end by assigning the same variable, and there must be an `else`",
            );
        };
        if a != b {
            return err(
                span,
                format!("the branches end by assigning `{a}` and `{b}`; they must assign the same variable"),
            );
        }
        let mut blocks = Vec::new();
        for branch in [then, otherwise] {
            let saved_names = self.scope().names.clone();
            let saved = std::mem::take(&mut self.scope().bindings);
            for s in branch {
                self.statement(s)?;
            }
            let result = Atom::Var(self.lookup(&a, span)?);
            let bindings = std::mem::replace(&mut self.scope().bindings, saved);
            self.scope().names = saved_names;
            blocks.push(Block { bindings, result });
        }
        let otherwise = blocks.pop().expect("else");
        let then = blocks.pop().expect("then");
        let sinfo = self.sinfo_of(&then.result);
        let v = self.new_var(&a, sinfo, span);
        self.scope().bindings.push(Binding { var: v, op: Op::If { cond, then, otherwise }, span });
        self.scope().names.insert(a, v);
        Ok(())
    }

    fn assign(
        &mut self,
        targets: &[(String, Span)],
        annotation: Option<&Expr>,
        value: &Expr,
        span: Span,
    ) -> Result<()> {
        // `n = T.int64()` declares a symbolic variable; `cls = Module` names the module.
        if let Expr::Call { func, args, .. } = value
            && matches!(func.dotted().as_deref(), Some("T.int64" | "T.int32"))
            && args.is_empty()
        {
            for (t, _) in targets {
                self.declare_symbol(t);
            }
            return Ok(());
        }
        if let Expr::Name(n, _) = value
            && *n == self.class_name
            && targets.len() == 1
        {
            self.aliases.insert(targets[0].0.clone());
            return Ok(());
        }
        let (op, mut sinfo) = self.op(value)?;
        if let Some(a) = annotation {
            let declared = self.sinfo(a, true)?;
            if !compatible(&declared, &sinfo) {
                return err(
                    a.span(),
                    format!(
                        "annotation {} does not match the value, which is {}",
                        declared.annotation(),
                        sinfo.annotation()
                    ),
                );
            }
            sinfo = declared;
        }
        if targets.len() == 1 {
            let v = self.new_var(&targets[0].0, sinfo, targets[0].1);
            self.scope().bindings.push(Binding { var: v, op, span });
            self.scope().names.insert(targets[0].0.clone(), v);
            return Ok(());
        }
        let items = match &sinfo {
            StructInfo::Tuple(items) if items.len() == targets.len() => items.clone(),
            StructInfo::Tuple(items) => {
                return err(span, format!("{} names for a tuple of {}", targets.len(), items.len()));
            }
            _ => vec![StructInfo::Object; targets.len()],
        };
        let tuple = self.new_var("_tuple", sinfo, span);
        self.scope().bindings.push(Binding { var: tuple, op, span });
        for (i, ((name, nspan), s)) in targets.iter().zip(items).enumerate() {
            let v = self.new_var(name, s, *nspan);
            self.scope().bindings.push(Binding { var: v, op: Op::GetItem(Atom::Var(tuple), i), span: *nspan });
            self.scope().names.insert(name.clone(), v);
        }
        Ok(())
    }

    /// An operand: names and literals as they are; anything else bound to a fresh variable.
    fn atom(&mut self, e: &Expr) -> Result<Atom> {
        match e {
            Expr::Name(n, span) => {
                if self.signatures.contains_key(n) && !self.scopes.iter().any(|s| s.names.contains_key(n)) {
                    return Ok(Atom::Func(n.clone()));
                }
                Ok(Atom::Var(self.lookup(n, *span)?))
            }
            Expr::Str(s, _) => Ok(Atom::Str(s.clone())),
            Expr::Int(v, _) => Ok(Atom::Prim(PrimExpr::Int(*v))),
            Expr::Bool(b, _) => Ok(Atom::Prim(PrimExpr::Int(*b as i64))),
            Expr::Float(v, _) => Ok(Atom::Float(*v)),
            other => {
                let (op, sinfo) = self.op(other)?;
                let v = self.new_var("_", sinfo, other.span());
                self.scope().bindings.push(Binding { var: v, op, span: other.span() });
                Ok(Atom::Var(v))
            }
        }
    }

    fn atoms(&mut self, items: &[Expr]) -> Result<Vec<Atom>> {
        items.iter().map(|e| self.atom(e)).collect()
    }

    /// The operation an expression performs, and the struct info of its result.
    fn op(&mut self, e: &Expr) -> Result<(Op, StructInfo)> {
        match e {
            Expr::Tuple(items, _) => {
                let atoms = self.atoms(items)?;
                let s = StructInfo::Tuple(atoms.iter().map(|a| self.sinfo_of(a)).collect());
                Ok((Op::Tuple(atoms), s))
            }
            Expr::Subscript { value, index, span } => {
                let Expr::Int(i, _) = **index else {
                    return err(index.span(), "tuple indices must be integer literals");
                };
                let t = self.atom(value)?;
                let item = match self.sinfo_of(&t) {
                    StructInfo::Tuple(items) => match items.get(i as usize) {
                        Some(s) if i >= 0 => s.clone(),
                        _ => return err(*span, format!("index {i} is out of range for a tuple of {}", items.len())),
                    },
                    StructInfo::Object => StructInfo::Object,
                    other => {
                        return err(value.span(), format!("only tuples can be indexed, not {}", other.annotation()));
                    }
                };
                Ok((Op::GetItem(t, i as usize), item))
            }
            Expr::Name(..) | Expr::Int(..) | Expr::Float(..) | Expr::Str(..) | Expr::Bool(..) => {
                let a = self.atom(e)?;
                let s = self.sinfo_of(&a);
                Ok((Op::Copy(a), s))
            }
            Expr::Call { func, args, kwargs, span } => self.call(func, args, kwargs, *span),
            other => err(other.span(), "this expression is outside the subset"),
        }
    }
}

impl Scope {
    fn new() -> Scope {
        Scope {
            names: HashMap::new(),
            symbols: BTreeSet::new(),
            captures: Vec::new(),
            closures: HashMap::new(),
            bindings: Vec::new(),
        }
    }
}
