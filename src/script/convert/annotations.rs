//! Struct-info annotations (`R.Tensor((n, 4), "float32")`, `R.Shape`, `R.Tuple`, ...) and the
//! shape arithmetic inside them, read into IR struct info; and whether one struct info can stand
//! where another is declared (with the substitution of a callee's symbolic dims).

use std::collections::HashMap;

use super::{Converter, Result, err};
use crate::diag::SourceError;
use crate::ir::{BinOp, PrimExpr, StructInfo};
use crate::script::parser::Expr;
use crate::vm::DType;

impl Converter<'_> {
    /// Struct info from an annotation. `declare`: string dims (and unknown names) become new
    /// symbolic variables, as in parameter annotations and match_cast.
    pub(super) fn sinfo(&mut self, e: &Expr, declare: bool) -> Result<StructInfo> {
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

    pub(super) fn dim(&mut self, e: &Expr, declare: bool) -> Result<PrimExpr> {
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
    pub(super) fn prim(&mut self, e: &Expr) -> Result<PrimExpr> {
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

pub(super) fn unify(p: &StructInfo, a: &StructInfo, env: &mut HashMap<String, PrimExpr>) {
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
pub(super) fn substitute(s: &StructInfo, env: &HashMap<String, PrimExpr>) -> StructInfo {
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
