//! The operators of the script subset that run on relaxc's kernel library (rvm_kernels.def):
//! `R.matmul`, `R.nn.conv2d`, the activations, `R.nn.softmax`, the norms and pooling become
//! `R.call_dps_packed` calls of `relaxc.<kernel>`, so a program made of them needs no C of its
//! own. Result shapes follow TVM's operators (symbolic dims included). Weights bound with
//! `--params` are packed into the kernels' layouts here, at compile time, as relaxc.tvm packs
//! them in Python.

use super::{Converter, Result, err};
use crate::abi::{KERNEL_PANEL_COLUMNS, KERNEL_STRIP_ROWS};
use crate::diag::Span;
use crate::ir::{Atom, BinOp, Op, PrimExpr, StructInfo};
use crate::script::parser::Expr;
use crate::vm::{DType, TensorConst};

/// An operand of an operator: the atom and its dims.
struct Tensor {
    atom: Atom,
    dims: Vec<PrimExpr>,
}

fn arith(op: BinOp, a: &PrimExpr, b: &PrimExpr) -> PrimExpr {
    let e = PrimExpr::Bin(op, Box::new(a.clone()), Box::new(b.clone()));
    e.as_int().map(PrimExpr::Int).unwrap_or(e)
}

/// The extent of a pooled or convolved axis: (in + pads - dilation * (k - 1) - 1) // stride + 1.
fn window_extent(input: &PrimExpr, pads: i64, k: i64, stride: i64, dilation: i64) -> PrimExpr {
    let span = arith(BinOp::Sub, input, &PrimExpr::Int(dilation * (k - 1) + 1 - pads));
    arith(BinOp::Add, &arith(BinOp::FloorDiv, &span, &PrimExpr::Int(stride)), &PrimExpr::Int(1))
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_values(t: &TensorConst) -> Vec<f32> {
    t.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// B [k, n] (row-major) as the kernels' panels [ceil(n / 16), k, 16], zero past n.
fn pack_columns(b: &[f32], k: usize, n: usize) -> (Vec<f32>, Vec<i64>) {
    let panels = n.div_ceil(KERNEL_PANEL_COLUMNS);
    let mut out = vec![0.0; panels * k * KERNEL_PANEL_COLUMNS];
    for kk in 0..k {
        for j in 0..n {
            let (p, c) = (j / KERNEL_PANEL_COLUMNS, j % KERNEL_PANEL_COLUMNS);
            out[(p * k + kk) * KERNEL_PANEL_COLUMNS + c] = b[kk * n + j];
        }
    }
    (out, vec![panels as i64, k as i64, KERNEL_PANEL_COLUMNS as i64])
}

/// Convolution weights [oc, c / g, kh, kw] as the kernels' strips of output channels per group:
/// [g, ceil(oc / g / 6), (c / g) kh kw, 6], zero past the channels.
fn pack_conv(w: &[f32], oc: usize, k: usize, groups: usize) -> (Vec<f32>, Vec<i64>) {
    let per = oc / groups;
    let strips = per.div_ceil(KERNEL_STRIP_ROWS);
    let mut out = vec![0.0; groups * strips * k * KERNEL_STRIP_ROWS];
    for g in 0..groups {
        for o in 0..per {
            let (s, r) = (o / KERNEL_STRIP_ROWS, o % KERNEL_STRIP_ROWS);
            for kk in 0..k {
                out[((g * strips + s) * k + kk) * KERNEL_STRIP_ROWS + r] = w[(g * per + o) * k + kk];
            }
        }
    }
    (out, vec![groups as i64, strips as i64, k as i64, KERNEL_STRIP_ROWS as i64])
}

impl Converter<'_> {
    /// An operator of relaxc's kernel library, if `name` is one: the call and its result.
    pub(super) fn library_operator(
        &mut self,
        name: &str,
        args: &[Expr],
        kwargs: &[(String, Expr)],
        span: Span,
    ) -> Option<Result<(Op, StructInfo)>> {
        let found = match name {
            "R.matmul" => self.matmul(args, kwargs, span),
            "R.nn.conv2d" => self.conv2d(args, kwargs, span),
            "R.nn.relu" | "R.nn.gelu" | "R.nn.gelu_tanh" | "R.nn.silu" | "R.sigmoid" => {
                self.activation(name, args, kwargs, span)
            }
            "R.clip" => self.clip(args, kwargs, span),
            "R.nn.softmax" => self.softmax(args, kwargs, span),
            "R.nn.layer_norm" | "R.nn.rms_norm" => self.norm(name, args, kwargs, span),
            "R.nn.max_pool2d" | "R.nn.avg_pool2d" => self.pool(name, args, kwargs, span),
            "R.nn.adaptive_avg_pool2d" => self.global_pool(args, kwargs, span),
            _ => return None,
        };
        Some(found)
    }

    /// Argument `i` as a float32 tensor of known rank.
    fn tensor_operand(&mut self, op: &str, args: &[Expr], i: usize, span: Span) -> Result<Tensor> {
        let Some(e) = args.get(i) else { return err(span, format!("{op} takes a tensor as argument {}", i + 1)) };
        let atom = self.atom(e)?;
        match self.sinfo_of(&atom) {
            StructInfo::Tensor { shape: Some(dims), dtype: Some(DType::F32), .. } => Ok(Tensor { atom, dims }),
            StructInfo::Tensor { dtype: Some(d), .. } if d != DType::F32 => {
                err(e.span(), format!("{op} runs on relaxc's kernel library, which takes float32 tensors, not {d}"))
            }
            other => err(
                e.span(),
                format!("{op} needs a float32 tensor with a known shape here, not {}", other.annotation()),
            ),
        }
    }

    /// Only these keyword arguments, and only the tensors positionally.
    fn check_arguments(
        &self,
        op: &str,
        args: &[Expr],
        tensors: usize,
        kwargs: &[(String, Expr)],
        known: &[&str],
    ) -> Result<()> {
        if let Some(extra) = args.get(tensors) {
            return err(extra.span(), format!("{op} takes {tensors} tensor(s) positionally; pass the rest by name"));
        }
        for (k, v) in kwargs {
            if !known.contains(&k.as_str()) {
                return err(v.span(), format!("{op} has no argument `{k}` (it takes {})", known.join(", ")));
            }
        }
        Ok(())
    }

    /// The constant a variable was bound to (a weight given with --params), if it was.
    fn bound_constant(&self, atom: &Atom) -> Option<usize> {
        let Atom::Var(v) = atom else { return None };
        self.scopes.iter().rev().flat_map(|s| s.bindings.iter()).find_map(|b| match &b.op {
            Op::Copy(Atom::Const(c)) if b.var == *v => Some(*c),
            _ => None,
        })
    }

    fn constant(&mut self, dtype: DType, shape: Vec<i64>, data: Vec<u8>) -> Atom {
        self.module.constants.push(TensorConst { dtype, shape, data: data.into() });
        Atom::Const(self.module.constants.len() - 1)
    }

    /// The epilogue's `[alpha, lo, hi]`.
    fn scalars(&mut self, alpha: f32, lo: f32, hi: f32) -> Atom {
        self.constant(DType::F32, vec![3], f32_bytes(&[alpha, lo, hi]))
    }

    fn kw<'e>(kwargs: &'e [(String, Expr)], name: &str) -> Option<&'e Expr> {
        kwargs.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// An int, or a list or tuple of ints.
    fn ints(e: &Expr) -> Result<Vec<i64>> {
        let one = |e: &Expr| match e {
            Expr::Int(v, _) => Ok(*v),
            Expr::Neg(inner, _) => match **inner {
                Expr::Int(v, _) => Ok(-v),
                _ => err(e.span(), "expected an integer"),
            },
            other => err(other.span(), "expected an integer"),
        };
        match e {
            Expr::List(items, _) | Expr::Tuple(items, _) => items.iter().map(one).collect(),
            other => Ok(vec![one(other)?]),
        }
    }

    /// A number's value (a literal int or float).
    fn number(e: &Expr) -> Result<f64> {
        match e {
            Expr::Int(v, _) => Ok(*v as f64),
            Expr::Float(v, _) => Ok(*v),
            Expr::Neg(inner, _) => Ok(-Self::number(inner)?),
            other => err(other.span(), "expected a number literal"),
        }
    }

    fn flag(e: Option<&Expr>, default: bool) -> Result<bool> {
        match e {
            None => Ok(default),
            Some(Expr::Bool(b, _)) => Ok(*b),
            Some(other) => err(other.span(), "expected True or False"),
        }
    }

    /// A layout keyword that relaxc's kernels take only as `want`.
    fn layout(op: &str, kwargs: &[(String, Expr)], name: &str, want: &str) -> Result<()> {
        match Self::kw(kwargs, name) {
            None | Some(Expr::None(_)) => Ok(()),
            Some(Expr::Str(s, _)) if s == want => Ok(()),
            Some(other) => err(other.span(), format!("{op}: relaxc's kernels take {name}=\"{want}\" only")),
        }
    }

    /// A spatial attribute of 1, 2 (or, for padding, 4) ints, as (first axis, second axis).
    fn pair(op: &str, kwargs: &[(String, Expr)], name: &str, default: i64) -> Result<(i64, i64)> {
        let Some(e) = Self::kw(kwargs, name) else { return Ok((default, default)) };
        match Self::ints(e)?.as_slice() {
            [v] => Ok((*v, *v)),
            [a, b] => Ok((*a, *b)),
            _ => err(e.span(), format!("{op}: {name} takes 1 or 2 values")),
        }
    }

    /// Padding as (top, left, bottom, right), from 1, 2 or 4 values as TVM reads them.
    fn padding(op: &str, kwargs: &[(String, Expr)]) -> Result<[i64; 4]> {
        let Some(e) = Self::kw(kwargs, "padding") else { return Ok([0; 4]) };
        let p = match Self::ints(e)?.as_slice() {
            [v] => [*v; 4],
            [h, w] => [*h, *w, *h, *w],
            [t, l, b, r] => [*t, *l, *b, *r],
            _ => return err(e.span(), format!("{op}: padding takes 1, 2 or 4 values")),
        };
        if p.iter().any(|v| *v < 0) {
            return err(e.span(), format!("{op}: padding cannot be negative"));
        }
        Ok(p)
    }

    fn dps(name: &str, args: Vec<Atom>, out: StructInfo) -> (Op, StructInfo) {
        (Op::DpsPacked { name: name.to_string(), args, outs: vec![out.clone()] }, out)
    }

    fn matmul(&mut self, args: &[Expr], kwargs: &[(String, Expr)], span: Span) -> Result<(Op, StructInfo)> {
        self.check_arguments("R.matmul", args, 2, kwargs, &["out_dtype"])?;
        let a = self.tensor_operand("R.matmul", args, 0, span)?;
        let b = self.tensor_operand("R.matmul", args, 1, span)?;
        if a.dims.len() < 2 || b.dims.len() < 2 {
            return err(span, "R.matmul on relaxc's kernel library takes operands of rank 2 or more");
        }
        let (m, k) = (&a.dims[a.dims.len() - 2], &a.dims[a.dims.len() - 1]);
        let (k2, n) = (&b.dims[b.dims.len() - 2], &b.dims[b.dims.len() - 1]);
        if let (Some(x), Some(y)) = (k.as_int(), k2.as_int())
            && x != y
        {
            return err(span, format!("R.matmul: the reduction lengths differ ({x} and {y})"));
        }
        let batch_rank = a.dims.len().max(b.dims.len()) - 2;
        let pad = |d: &[PrimExpr]| {
            let mut v = vec![PrimExpr::Int(1); batch_rank + 2 - d.len()];
            v.extend(d[..d.len() - 2].iter().cloned());
            v
        };
        let (ba, bb) = (pad(&a.dims), pad(&b.dims));
        let mut out = Vec::new();
        for (x, y) in ba.iter().zip(&bb) {
            out.push(match (x.as_int(), y.as_int()) {
                _ if x == y => x.clone(),
                (Some(1), _) => y.clone(),
                (_, Some(1)) => x.clone(),
                _ => return err(span, format!("R.matmul: batch dims {x} and {y} do not broadcast")),
            });
        }
        out.extend([m.clone(), n.clone()]);
        let result = StructInfo::tensor(out, DType::F32);
        let scalars = self.scalars(1.0, 0.0, 0.0);
        let act = Atom::Str("none".into());
        if b.dims.len() == 2
            && let Some(c) = self.bound_constant(&b.atom)
            && let (Some(kk), Some(nn)) = (k2.as_int(), n.as_int())
        {
            let values = f32_values(&self.module.constants[c]);
            let (packed, shape) = pack_columns(&values, kk as usize, nn as usize);
            let w = self.constant(DType::F32, shape, f32_bytes(&packed));
            return Ok(Self::dps("relaxc.dense", vec![a.atom, w, Atom::None, Atom::None, act, scalars], result));
        }
        let operands = vec![a.atom, b.atom, Atom::None, Atom::None, Atom::None, Atom::None, Atom::None, act, scalars];
        Ok(Self::dps("relaxc.matmul", operands, result))
    }

    fn conv2d(&mut self, args: &[Expr], kwargs: &[(String, Expr)], span: Span) -> Result<(Op, StructInfo)> {
        let op = "R.nn.conv2d";
        let known =
            ["strides", "padding", "dilation", "groups", "data_layout", "kernel_layout", "out_layout", "out_dtype"];
        self.check_arguments(op, args, 2, kwargs, &known)?;
        Self::layout(op, kwargs, "data_layout", "NCHW")?;
        Self::layout(op, kwargs, "kernel_layout", "OIHW")?;
        Self::layout(op, kwargs, "out_layout", "NCHW")?;
        let x = self.tensor_operand(op, args, 0, span)?;
        let w = self.tensor_operand(op, args, 1, span)?;
        let groups = match Self::kw(kwargs, "groups") {
            Some(e) => Self::ints(e)?.first().copied().unwrap_or(1),
            None => 1,
        };
        let (sh, sw) = Self::pair(op, kwargs, "strides", 1)?;
        let (dh, dw) = Self::pair(op, kwargs, "dilation", 1)?;
        let pads = Self::padding(op, kwargs)?;
        let static_w: Option<Vec<i64>> = w.dims.iter().map(|d| d.as_int()).collect();
        let (Some(wd), 4, Some(c)) = (static_w, x.dims.len(), x.dims.get(1).and_then(|d| d.as_int())) else {
            return err(
                span,
                format!("{op} needs NCHW data with a known channel count and OIHW weights of known shape"),
            );
        };
        let [oc, cg, kh, kw] = [wd[0], wd[1], wd[2], wd[3]];
        if groups < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || c % groups != 0 || oc % groups != 0 || cg * groups != c
        {
            return err(
                span,
                format!("{op}: weights [{oc}, {cg}, {kh}, {kw}] and groups {groups} do not fit {c} channels"),
            );
        }
        let oh = window_extent(&x.dims[2], pads[0] + pads[2], kh, sh, dh);
        let ow = window_extent(&x.dims[3], pads[1] + pads[3], kw, sw, dw);
        let result = StructInfo::tensor(vec![x.dims[0].clone(), PrimExpr::Int(oc), oh, ow], DType::F32);
        let params = [kh, kw, sh, sw, pads[0], pads[1], pads[2], pads[3], dh, dw, groups];
        let params = Atom::Shape(params.iter().map(|v| PrimExpr::Int(*v)).collect());
        let scalars = self.scalars(1.0, 0.0, 0.0);
        let act = Atom::Str("none".into());
        if groups == c && groups == oc && cg == 1 {
            let operands = vec![x.atom, w.atom, Atom::None, Atom::None, params, act, scalars];
            return Ok(Self::dps("relaxc.conv2d_depthwise", operands, result));
        }
        let Some(constant) = self.bound_constant(&w.atom) else {
            return err(
                args[1].span(),
                format!("{op}: relaxc packs convolution weights at compile time; bind them with --params"),
            );
        };
        let values = f32_values(&self.module.constants[constant]);
        let (packed, shape) = pack_conv(&values, oc as usize, (cg * kh * kw) as usize, groups as usize);
        let packed = self.constant(DType::F32, shape, f32_bytes(&packed));
        let operands = vec![x.atom, packed, Atom::None, Atom::None, params, act, scalars];
        Ok(Self::dps("relaxc.conv2d", operands, result))
    }

    fn activation(
        &mut self,
        name: &str,
        args: &[Expr],
        kwargs: &[(String, Expr)],
        span: Span,
    ) -> Result<(Op, StructInfo)> {
        self.check_arguments(name, args, 1, kwargs, &[])?;
        let x = self.tensor_operand(name, args, 0, span)?;
        let act = match name {
            "R.nn.relu" => "relu",
            "R.nn.gelu" => "gelu",
            "R.nn.gelu_tanh" => "gelu_tanh",
            "R.nn.silu" => "silu",
            _ => "sigmoid",
        };
        let scalars = self.scalars(1.0, 0.0, 0.0);
        let out = StructInfo::tensor(x.dims.clone(), DType::F32);
        Ok(Self::dps("relaxc.activation", vec![x.atom, Atom::Str(act.into()), scalars], out))
    }

    fn clip(&mut self, args: &[Expr], kwargs: &[(String, Expr)], span: Span) -> Result<(Op, StructInfo)> {
        let bound = |i: usize, k: &str| match args.get(i).or(Self::kw(kwargs, k)) {
            Some(e) => Self::number(e),
            None => err(span, format!("R.clip needs its {k} bound")),
        };
        let (lo, hi) = (bound(1, "min")?, bound(2, "max")?);
        let x = self.tensor_operand("R.clip", args, 0, span)?;
        let scalars = self.scalars(1.0, lo as f32, hi as f32);
        let out = StructInfo::tensor(x.dims.clone(), DType::F32);
        Ok(Self::dps("relaxc.activation", vec![x.atom, Atom::Str("clip".into()), scalars], out))
    }

    /// `axis` (or the single entry of `axes`) must name the last axis.
    fn last_axis(op: &str, e: Option<&Expr>, rank: usize) -> Result<()> {
        let Some(e) = e else { return Ok(()) };
        match Self::ints(e)?.as_slice() {
            [a] if a.rem_euclid(rank as i64) == rank as i64 - 1 => Ok(()),
            _ => err(e.span(), format!("{op} on relaxc's kernel library works along the last axis only")),
        }
    }

    fn softmax(&mut self, args: &[Expr], kwargs: &[(String, Expr)], span: Span) -> Result<(Op, StructInfo)> {
        self.check_arguments("R.nn.softmax", args, 1, kwargs, &["axis"])?;
        let x = self.tensor_operand("R.nn.softmax", args, 0, span)?;
        Self::last_axis("R.nn.softmax", Self::kw(kwargs, "axis"), x.dims.len().max(1))?;
        let out = StructInfo::tensor(x.dims.clone(), DType::F32);
        Ok(Self::dps("relaxc.softmax", vec![x.atom], out))
    }

    fn norm(&mut self, name: &str, args: &[Expr], kwargs: &[(String, Expr)], span: Span) -> Result<(Op, StructInfo)> {
        let layer = name == "R.nn.layer_norm";
        let tensors = if layer { 3 } else { 2 };
        let known: &[&str] = if layer { &["axes", "epsilon", "center", "scale"] } else { &["axes", "epsilon"] };
        self.check_arguments(name, args, tensors, kwargs, known)?;
        let x = self.tensor_operand(name, args, 0, span)?;
        let gamma = self.tensor_operand(name, args, 1, span)?;
        Self::last_axis(name, Self::kw(kwargs, "axes"), x.dims.len().max(1))?;
        let eps = Self::kw(kwargs, "epsilon").map(Self::number).transpose()?.unwrap_or(1e-5) as f32;
        let eps = self.constant(DType::F32, vec![1], f32_bytes(&[eps]));
        let out = StructInfo::tensor(x.dims.clone(), DType::F32);
        if !layer {
            return Ok(Self::dps("relaxc.rms_norm", vec![x.atom, gamma.atom, eps], out));
        }
        if !Self::flag(Self::kw(kwargs, "scale"), true)? {
            return err(span, "R.nn.layer_norm on relaxc's kernel library needs scale=True");
        }
        let beta = self.tensor_operand(name, args, 2, span)?;
        let beta = if Self::flag(Self::kw(kwargs, "center"), true)? { beta.atom } else { Atom::None };
        Ok(Self::dps("relaxc.layer_norm", vec![x.atom, gamma.atom, beta, eps], out))
    }

    fn pool(&mut self, name: &str, args: &[Expr], kwargs: &[(String, Expr)], span: Span) -> Result<(Op, StructInfo)> {
        let max = name == "R.nn.max_pool2d";
        let mut known = vec!["pool_size", "strides", "padding", "dilation", "ceil_mode", "layout", "out_layout"];
        if !max {
            known.push("count_include_pad");
        }
        self.check_arguments(name, args, 1, kwargs, &known)?;
        Self::layout(name, kwargs, "layout", "NCHW")?;
        Self::layout(name, kwargs, "out_layout", "NCHW")?;
        if Self::flag(Self::kw(kwargs, "ceil_mode"), false)? {
            return err(span, format!("{name} on relaxc's kernel library takes ceil_mode=False only"));
        }
        let x = self.tensor_operand(name, args, 0, span)?;
        if x.dims.len() != 4 {
            return err(span, format!("{name} takes NCHW data"));
        }
        let (kh, kw) = Self::pair(name, kwargs, "pool_size", 1)?;
        let (sh, sw) = Self::pair(name, kwargs, "strides", 1)?;
        let (dh, dw) = Self::pair(name, kwargs, "dilation", 1)?;
        let pads = Self::padding(name, kwargs)?;
        let oh = window_extent(&x.dims[2], pads[0] + pads[2], kh, sh, dh);
        let ow = window_extent(&x.dims[3], pads[1] + pads[3], kw, sw, dw);
        let out = StructInfo::tensor(vec![x.dims[0].clone(), x.dims[1].clone(), oh, ow], DType::F32);
        let params = [kh, kw, sh, sw, pads[0], pads[1], pads[2], pads[3], dh, dw];
        let params = Atom::Shape(params.iter().map(|v| PrimExpr::Int(*v)).collect());
        if max {
            return Ok(Self::dps("relaxc.max_pool2d", vec![x.atom, params], out));
        }
        let include = Self::flag(Self::kw(kwargs, "count_include_pad"), false)? as i64;
        Ok(Self::dps("relaxc.avg_pool2d", vec![x.atom, params, Atom::Prim(PrimExpr::Int(include))], out))
    }

    fn global_pool(&mut self, args: &[Expr], kwargs: &[(String, Expr)], span: Span) -> Result<(Op, StructInfo)> {
        let op = "R.nn.adaptive_avg_pool2d";
        self.check_arguments(op, args, 1, kwargs, &["output_size", "layout", "out_layout"])?;
        Self::layout(op, kwargs, "layout", "NCHW")?;
        Self::layout(op, kwargs, "out_layout", "NCHW")?;
        match Self::kw(kwargs, "output_size") {
            Some(e) if matches!(Self::ints(e)?.as_slice(), [1] | [1, 1]) => {}
            _ => return err(span, format!("{op} on relaxc's kernel library takes output_size=[1, 1] only")),
        }
        let x = self.tensor_operand(op, args, 0, span)?;
        if x.dims.len() != 4 {
            return err(span, format!("{op} takes NCHW data"));
        }
        let out = StructInfo::tensor(
            vec![x.dims[0].clone(), x.dims[1].clone(), PrimExpr::Int(1), PrimExpr::Int(1)],
            DType::F32,
        );
        Ok(Self::dps("relaxc.global_avg_pool2d", vec![x.atom], out))
    }
}
