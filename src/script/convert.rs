//! TVMScript meaning for the parsed syntax: the `@I.ir_module` class, `@R.function`s, struct-info
//! annotations, the Relax operations of the subset, symbolic shape variables, nested functions
//! (lifted, with their captured variables appended to their parameters, as TVM's LambdaLift
//! does). Everything outside the subset is an error at its span that says what to do instead.

use std::collections::{BTreeSet, HashMap};

use super::parser::{Expr, FunctionDef, Stmt};
use crate::diag::{SourceError, Span};
use crate::ir::{Atom, BinOp, Binding, Block, Function, Module, Op, PrimExpr, StructInfo, VarId, VarInfo};
use crate::vm::{DType, TensorConst};

mod ops;

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

    /// Struct info from an annotation. `declare`: string dims (and unknown names) become new
    /// symbolic variables, as in parameter annotations and match_cast.
    fn sinfo(&mut self, e: &Expr, declare: bool) -> Result<StructInfo> {
        let (name, args, kwargs) = match e {
            Expr::Call { func, args, kwargs, .. } => (func.dotted(), args.as_slice(), kwargs.as_slice()),
            other => (other.dotted(), &[][..], &[][..]),
        };
        let kw = |k: &str| kwargs.iter().find(|(n, _)| n == k).map(|(_, v)| v);
        match name.as_deref() {
            Some("R.Tensor") => {
                let shape_expr = args.first().or(kw("shape"));
                let dtype_expr = args.get(1).or(kw("dtype"));
                let dtype = match dtype_expr {
                    Some(Expr::Str(s, span)) => {
                        Some(DType::parse(s).ok_or_else(|| SourceError::new(*span, format!("unknown dtype {s:?}")))?)
                    }
                    Some(other) => return err(other.span(), "dtype must be a string like \"float32\""),
                    None => None,
                };
                let (shape, ndim) = match shape_expr {
                    Some(Expr::Tuple(items, _) | Expr::List(items, _)) => {
                        let dims = items.iter().map(|d| self.dim(d, declare)).collect::<Result<Vec<_>>>()?;
                        let n = dims.len() as i64;
                        (Some(dims), n)
                    }
                    Some(other) => return err(other.span(), "a tensor shape is a tuple of dims, like (2, \"n\")"),
                    None => match kw("ndim") {
                        Some(Expr::Int(n, _)) => (None, *n),
                        Some(other) => return err(other.span(), "ndim must be an integer"),
                        None => (None, -1),
                    },
                };
                Ok(StructInfo::Tensor { shape, ndim, dtype })
            }
            Some("R.Shape") => match args.first() {
                Some(Expr::List(items, _) | Expr::Tuple(items, _)) => {
                    let dims = items.iter().map(|d| self.dim(d, declare)).collect::<Result<Vec<_>>>()?;
                    Ok(StructInfo::Shape { ndim: dims.len() as i64, dims: Some(dims) })
                }
                Some(other) => err(other.span(), "R.Shape takes a list of dims, like R.Shape([\"m\", 4])"),
                None => match kw("ndim") {
                    Some(Expr::Int(n, _)) => Ok(StructInfo::Shape { dims: None, ndim: *n }),
                    _ => Ok(StructInfo::Shape { dims: None, ndim: -1 }),
                },
            },
            Some("R.Prim") => match args.first().or(kw("dtype")) {
                Some(Expr::Str(s, span)) => Ok(StructInfo::Prim(
                    DType::parse(s).ok_or_else(|| SourceError::new(*span, format!("unknown dtype {s:?}")))?,
                )),
                _ => err(e.span(), "R.Prim takes a dtype string, like R.Prim(\"int64\")"),
            },
            Some("R.Tuple") => {
                Ok(StructInfo::Tuple(args.iter().map(|a| self.sinfo(a, declare)).collect::<Result<Vec<_>>>()?))
            }
            Some("R.Object") => Ok(StructInfo::Object),
            Some("R.Callable") => Ok(StructInfo::Callable),
            _ => err(e.span(), "expected an annotation: R.Tensor, R.Shape, R.Prim, R.Tuple, R.Object or R.Callable"),
        }
    }

    fn dim(&mut self, e: &Expr, declare: bool) -> Result<PrimExpr> {
        match e {
            Expr::Str(s, span) => {
                if !is_identifier(s) {
                    return err(*span, format!("{s:?} is not a symbolic variable name"));
                }
                if declare {
                    self.declare_symbol(s);
                } else if !self.is_symbol(s) {
                    return err(*span, format!("unknown symbolic variable `{s}`"));
                }
                Ok(PrimExpr::Var(s.clone()))
            }
            Expr::Name(n, _) if declare && !self.is_symbol(n) => {
                self.declare_symbol(n);
                Ok(PrimExpr::Var(n.clone()))
            }
            other => self.prim(other),
        }
    }

    /// Shape arithmetic: ints, declared symbolic variables, + - * // %.
    fn prim(&mut self, e: &Expr) -> Result<PrimExpr> {
        match e {
            Expr::Int(v, _) => Ok(PrimExpr::Int(*v)),
            Expr::Name(n, span) => {
                if self.is_symbol(n) {
                    Ok(PrimExpr::Var(n.clone()))
                } else {
                    err(*span, format!("`{n}` is not a symbolic variable (declare it with `{n} = T.int64()`)"))
                }
            }
            Expr::Neg(inner, _) => {
                Ok(PrimExpr::Bin(BinOp::Sub, Box::new(PrimExpr::Int(0)), Box::new(self.prim(inner)?)))
            }
            Expr::BinOp { op, lhs, rhs, span } => {
                let op = match *op {
                    "+" => BinOp::Add,
                    "-" => BinOp::Sub,
                    "*" => BinOp::Mul,
                    "//" => BinOp::FloorDiv,
                    "%" => BinOp::FloorMod,
                    other => return err(*span, format!("`{other}` is not shape arithmetic (use + - * // %)")),
                };
                let (a, b) = (self.prim(lhs)?, self.prim(rhs)?);
                if matches!(op, BinOp::FloorDiv | BinOp::FloorMod) && b.as_int() == Some(0) {
                    return err(rhs.span(), "division by zero");
                }
                let expr = PrimExpr::Bin(op, Box::new(a), Box::new(b));
                Ok(expr.as_int().map(PrimExpr::Int).unwrap_or(expr))
            }
            Expr::Call { func, args, .. } if matches!(func.dotted().as_deref(), Some("T.int64" | "T.int32")) => {
                match args.as_slice() {
                    [inner] => self.prim(inner),
                    _ => err(e.span(), "T.int64(...) takes one value here"),
                }
            }
            other => err(other.span(), "expected shape arithmetic (integers, symbolic variables, + - * // %)"),
        }
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

    fn call(&mut self, func: &Expr, args: &[Expr], kwargs: &[(String, Expr)], span: Span) -> Result<(Op, StructInfo)> {
        let kw = |names: &[&str]| kwargs.iter().find(|(n, _)| names.contains(&n.as_str())).map(|(_, v)| v);
        let name = func.dotted().unwrap_or_default();
        match name.as_str() {
            "R.call_dps_packed" => {
                let Some(Expr::Str(kernel, _)) = args.first() else {
                    return err(span, "R.call_dps_packed takes the kernel name as a string first");
                };
                let operands = match args.get(1) {
                    Some(Expr::Tuple(items, _) | Expr::List(items, _)) => self.atoms(items)?,
                    Some(single) => vec![self.atom(single)?],
                    None => Vec::new(),
                };
                let Some(out) = args.get(2).or(kw(&["out_ty", "out_sinfo"])) else {
                    return err(span, "R.call_dps_packed needs the output's annotation (out_ty=R.Tensor(...))");
                };
                let outs = match out {
                    Expr::List(items, _) | Expr::Tuple(items, _) => {
                        items.iter().map(|i| self.sinfo(i, false)).collect::<Result<Vec<_>>>()?
                    }
                    single => vec![self.sinfo(single, false)?],
                };
                for (o, expr) in outs.iter().zip(std::iter::repeat(out)) {
                    match o {
                        StructInfo::Tensor { shape: Some(_), dtype: Some(_), .. } => {}
                        _ => return err(expr.span(), "each output must be an R.Tensor with a shape and a dtype"),
                    }
                }
                let s = if outs.len() == 1 && !matches!(out, Expr::List(..)) {
                    outs[0].clone()
                } else {
                    StructInfo::Tuple(outs.clone())
                };
                Ok((Op::DpsPacked { name: kernel.clone(), args: operands, outs }, s))
            }
            "R.call_packed" | "R.call_pure_packed" => {
                let Some(Expr::Str(callee, _)) = args.first() else {
                    return err(span, format!("{name} takes the function name as a string first"));
                };
                let operands = self.atoms(&args[1..])?;
                let s = match kw(&["ty_args", "sinfo_args"]) {
                    Some(Expr::List(items, _) | Expr::Tuple(items, _)) if items.len() == 1 => {
                        self.sinfo(&items[0], false)?
                    }
                    Some(e) => self.sinfo(e, false)?,
                    None => StructInfo::Object,
                };
                Ok((Op::Packed { name: callee.clone(), args: operands }, s))
            }
            "R.match_cast" => {
                let [value, annotation] = args else {
                    return err(span, "R.match_cast takes a value and an annotation");
                };
                let v = self.atom(value)?;
                let s = self.sinfo(annotation, true)?;
                Ok((Op::MatchCast(v, s.clone()), s))
            }
            "R.shape" => match args {
                [Expr::List(items, _) | Expr::Tuple(items, _)] => {
                    let dims = items.iter().map(|d| self.prim(d)).collect::<Result<Vec<_>>>()?;
                    let s = StructInfo::Shape { ndim: dims.len() as i64, dims: Some(dims.clone()) };
                    Ok((Op::Copy(Atom::Shape(dims)), s))
                }
                _ => err(span, "R.shape takes a list of dims, like R.shape([n, 4])"),
            },
            "R.prim_value" => match args {
                [Expr::Float(v, _)] => Ok((Op::Copy(Atom::Float(*v)), StructInfo::Prim(DType::new(2, 64, 1)))),
                [Expr::Bool(b, _)] => {
                    Ok((Op::Copy(Atom::Prim(PrimExpr::Int(*b as i64))), StructInfo::Prim(DType::I64)))
                }
                [v] => {
                    let p = self.prim(v)?;
                    Ok((Op::Copy(Atom::Prim(p)), StructInfo::Prim(DType::I64)))
                }
                _ => err(span, "R.prim_value takes one value"),
            },
            "R.str" => match args {
                [Expr::Str(s, _)] => Ok((Op::Copy(Atom::Str(s.clone())), StructInfo::Str)),
                _ => err(span, "R.str takes one string literal"),
            },
            "R.dtype" => match args {
                [Expr::Str(s, sspan)] => {
                    let d = DType::parse(s).ok_or_else(|| SourceError::new(*sspan, format!("unknown dtype {s:?}")))?;
                    Ok((Op::Copy(Atom::DataType(d)), StructInfo::Object))
                }
                _ => err(span, "R.dtype takes one dtype string"),
            },
            "R.const" => self.scalar_const(args, kwargs, span),
            "R.tuple" => {
                let atoms = self.atoms(args)?;
                let s = StructInfo::Tuple(atoms.iter().map(|a| self.sinfo_of(a)).collect());
                Ok((Op::Tuple(atoms), s))
            }
            _ => match self.library_operator(&name, args, kwargs, span) {
                Some(found) => found,
                None => self.call_function(func, &name, args, span),
            },
        }
    }

    fn scalar_const(&mut self, args: &[Expr], kwargs: &[(String, Expr)], span: Span) -> Result<(Op, StructInfo)> {
        let dtype_expr = args.get(1).or(kwargs.iter().find(|(k, _)| k == "dtype").map(|(_, v)| v));
        let dtype = match dtype_expr {
            Some(Expr::Str(s, sspan)) => {
                DType::parse(s).ok_or_else(|| SourceError::new(*sspan, format!("unknown dtype {s:?}")))?
            }
            Some(other) => return err(other.span(), "dtype must be a string"),
            None => match args.first() {
                Some(Expr::Float(..)) => DType::F32,
                Some(Expr::Bool(..)) => DType::BOOL,
                _ => DType::new(0, 32, 1),
            },
        };
        let value = match args.first() {
            Some(Expr::Int(v, _)) => *v as f64,
            Some(Expr::Float(v, _)) => *v,
            Some(Expr::Bool(b, _)) => *b as i64 as f64,
            Some(other) => {
                return err(
                    other.span(),
                    "R.const takes a scalar literal here (bind tensors with --params weights.safetensors)",
                );
            }
            None => return err(span, "R.const takes a value"),
        };
        let data = match (dtype.code, dtype.bits) {
            (2, 32) => (value as f32).to_le_bytes().to_vec(),
            (2, 64) => value.to_le_bytes().to_vec(),
            (2, 16) => f32_to_f16_bits(value as f32).to_le_bytes().to_vec(),
            (0, 8) | (1, 8) | (6, 8) => vec![value as i64 as u8],
            (0 | 1, 16) => (value as i64 as i16).to_le_bytes().to_vec(),
            (0 | 1, 32) => (value as i64 as i32).to_le_bytes().to_vec(),
            (0 | 1, 64) => (value as i64).to_le_bytes().to_vec(),
            _ => return err(span, format!("R.const of dtype {dtype} is not supported")),
        };
        self.module.constants.push(TensorConst { dtype, shape: vec![], data: data.into() });
        let c = self.module.constants.len() - 1;
        Ok((Op::Copy(Atom::Const(c)), StructInfo::tensor(vec![], dtype)))
    }

    fn call_function(&mut self, func: &Expr, name: &str, args: &[Expr], span: Span) -> Result<(Op, StructInfo)> {
        // cls.f(...), Module.f(...), f(...) for a module function; g(...) for a local closure.
        let target = match func {
            Expr::Attr(base, f, _) => match base.dotted() {
                Some(b) if b == self.class_name || self.aliases.contains(&b) => Some(f.clone()),
                Some(b) if b == "R" || b == "T" || b == "I" => {
                    return err(
                        func.span(),
                        format!(
                            "{name} is outside relaxc's subset: relaxc's kernel library covers R.matmul, R.nn.conv2d, \
                             R.nn.relu, R.nn.gelu, R.nn.gelu_tanh, R.nn.silu, R.sigmoid, R.clip, R.nn.softmax, \
                             R.nn.layer_norm, R.nn.rms_norm, R.nn.max_pool2d, R.nn.avg_pool2d and \
                             R.nn.adaptive_avg_pool2d; implement other operations as a C kernel and call it with \
                             R.call_dps_packed"
                        ),
                    );
                }
                _ => return err(func.span(), format!("unknown function `{name}`")),
            },
            Expr::Name(n, nspan) => {
                if let Some(v) = self.scopes.iter().rev().find_map(|s| s.names.get(n).copied()) {
                    let callee = Atom::Var(self.lookup(n, *nspan)?);
                    let operands = self.atoms(args)?;
                    let ret = self
                        .scopes
                        .iter()
                        .rev()
                        .find_map(|s| s.closures.get(&v))
                        .and_then(|f| self.signatures.get(f))
                        .and_then(|s| s.ret.clone())
                        .unwrap_or(StructInfo::Object);
                    return Ok((Op::CallClosure { callee, args: operands }, ret));
                }
                Some(n.clone())
            }
            _ => None,
        };
        let Some(target) = target else { return err(func.span(), "this call is outside the subset") };
        let Some(sig) = self.signatures.get(&target).cloned() else {
            return err(func.span(), format!("the module has no function `{target}`"));
        };
        if sig.params.len() != args.len() {
            return err(span, format!("{target} takes {} arguments, not {}", sig.params.len(), args.len()));
        }
        let operands = self.atoms(args)?;
        // Bind the callee's symbolic dims from the arguments to type the result.
        let mut env: HashMap<String, PrimExpr> = HashMap::new();
        for (p, a) in sig.params.iter().zip(&operands) {
            let actual = self.sinfo_of(a);
            if !compatible(p, &actual) {
                return err(
                    args[operands.iter().position(|x| x == a).unwrap_or(0)].span(),
                    format!("argument is {}, but {target} expects {}", actual.annotation(), p.annotation()),
                );
            }
            unify(p, &actual, &mut env);
        }
        let ret = sig.ret.map(|r| substitute(&r, &env)).unwrap_or(StructInfo::Object);
        Ok((Op::CallFunc { name: target, args: operands }, ret))
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

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// Whether a value of struct info `actual` can be where `declared` is expected (static facts
/// that disagree are errors; unknowns are checked at run time).
pub fn compatible(declared: &StructInfo, actual: &StructInfo) -> bool {
    match (declared, actual) {
        (StructInfo::Object, _) | (_, StructInfo::Object) => true,
        (
            StructInfo::Tensor { shape: s1, ndim: n1, dtype: d1 },
            StructInfo::Tensor { shape: s2, ndim: n2, dtype: d2 },
        ) => {
            let dtype_ok = d1.is_none() || d2.is_none() || d1 == d2;
            let ndim_ok = *n1 < 0 || *n2 < 0 || n1 == n2;
            let dims_ok = match (s1, s2) {
                (Some(a), Some(b)) => a.iter().zip(b).all(|(x, y)| match (x.as_int(), y.as_int()) {
                    (Some(p), Some(q)) => p == q,
                    _ => true,
                }),
                _ => true,
            };
            dtype_ok && ndim_ok && dims_ok
        }
        (StructInfo::Shape { ndim: a, .. }, StructInfo::Shape { ndim: b, .. }) => *a < 0 || *b < 0 || a == b,
        (StructInfo::Tuple(a), StructInfo::Tuple(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| compatible(x, y))
        }
        (StructInfo::Prim(_), StructInfo::Prim(_)) => true,
        (StructInfo::Callable, StructInfo::Callable) | (StructInfo::Str, StructInfo::Str) => true,
        _ => false,
    }
}

fn unify(p: &StructInfo, a: &StructInfo, env: &mut HashMap<String, PrimExpr>) {
    match (p, a) {
        (StructInfo::Tensor { shape: Some(ps), .. }, StructInfo::Tensor { shape: Some(as_), .. })
        | (StructInfo::Shape { dims: Some(ps), .. }, StructInfo::Shape { dims: Some(as_), .. }) => {
            for (x, y) in ps.iter().zip(as_) {
                if let PrimExpr::Var(v) = x {
                    env.entry(v.clone()).or_insert_with(|| y.clone());
                }
            }
        }
        (StructInfo::Tuple(ps), StructInfo::Tuple(as_)) => ps.iter().zip(as_).for_each(|(x, y)| unify(x, y, env)),
        _ => {}
    }
}

fn subst_prim(e: &PrimExpr, env: &HashMap<String, PrimExpr>) -> PrimExpr {
    let out = match e {
        PrimExpr::Var(v) => env.get(v).cloned().unwrap_or_else(|| e.clone()),
        PrimExpr::Int(_) => e.clone(),
        PrimExpr::Bin(op, a, b) => PrimExpr::Bin(*op, Box::new(subst_prim(a, env)), Box::new(subst_prim(b, env))),
    };
    out.as_int().map(PrimExpr::Int).unwrap_or(out)
}

/// The struct info with symbolic variables replaced; variables left unbound become unknown dims.
fn substitute(s: &StructInfo, env: &HashMap<String, PrimExpr>) -> StructInfo {
    match s {
        StructInfo::Tensor { shape: Some(dims), ndim, dtype } => StructInfo::Tensor {
            shape: Some(dims.iter().map(|d| subst_prim(d, env)).collect()),
            ndim: *ndim,
            dtype: *dtype,
        },
        StructInfo::Shape { dims: Some(dims), ndim } => {
            StructInfo::Shape { dims: Some(dims.iter().map(|d| subst_prim(d, env)).collect()), ndim: *ndim }
        }
        StructInfo::Tuple(items) => StructInfo::Tuple(items.iter().map(|i| substitute(i, env)).collect()),
        other => other.clone(),
    }
}

/// IEEE binary16 bits of an f32 (round to nearest even).
fn f32_to_f16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = (mant | 0x80_0000) >> (1 - e);
        let round = (m & 0x1fff) > 0x1000 || ((m & 0x1fff) == 0x1000 && (m & 0x2000) != 0);
        return sign | ((m >> 13) as u16 + round as u16);
    }
    let round = (mant & 0x1fff) > 0x1000 || ((mant & 0x1fff) == 0x1000 && (mant & 0x2000) != 0);
    let h = sign as u32 | ((e as u32) << 10) | (mant >> 13);
    (h + round as u32) as u16
}
