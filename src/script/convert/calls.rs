//! Calls in the script: operators (the builtins of the subset and the kernel library's), `R.const`,
//! `R.call_dps_packed` of C and CUDA kernels, and calls of the module's own Relax functions with
//! their struct info checked and their symbolic dims substituted.

use super::annotations::{compatible, substitute, unify};
use std::collections::HashMap;

use super::{Converter, Result, err};
use crate::diag::{SourceError, Span};
use crate::ir::{Atom, Op, PrimExpr, StructInfo};
use crate::script::parser::Expr;
use crate::vm::{DType, TensorConst};

impl Converter<'_> {
    pub(super) fn call(
        &mut self,
        func: &Expr,
        args: &[Expr],
        kwargs: &[(String, Expr)],
        span: Span,
    ) -> Result<(Op, StructInfo)> {
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
