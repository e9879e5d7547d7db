//! Parameter checks, as TVM's VMShapeLower emits them: check_*_info for every parameter (with
//! TVM's ErrorContext strings), then match_shape storing each symbolic dimension into the shape
//! heap on first sight and asserting it afterwards, then the shape function for the arithmetic,
//! then a second match asserting the computed dims. match_cast uses the same checks.

use super::{FnGen, Result, dims_known, dtype_const, err};
use crate::ir::{PrimExpr, StructInfo};
use crate::vm::{Arg, Constant, VOID_REG};

impl FnGen<'_> {
    pub(super) fn context(&self, loc: &str, sinfo: &StructInfo) -> String {
        format!("ErrorContext(fn={}, {loc}, annotation={}) ", self.f.name, sinfo.annotation())
    }

    /// check_*_info for every parameter, then match_shape for each, then the shape function.
    pub(super) fn params(&mut self) -> Result<()> {
        let mut pending = Vec::new();
        for (i, p) in self.f.params.iter().enumerate() {
            let info = &self.m.vars[*p];
            let ctx = self.context(&format!("loc=param[{i}], param={}", info.name), &info.sinfo);
            let fields = self.check_info(Arg::Reg(i as i64), &info.sinfo, &ctx);
            pending.push((Arg::Reg(i as i64), info.sinfo.clone(), ctx, fields, info.span));
        }
        let mut compound = Vec::new();
        for (value, sinfo, ctx, fields, span) in &pending {
            match (sinfo, fields.is_empty()) {
                (StructInfo::Tuple(items), false) => {
                    for (r, s) in fields.iter().zip(items) {
                        if self.match_dims(Arg::Reg(*r), s, ctx, false)? {
                            compound.push((Arg::Reg(*r), s.clone(), ctx.clone(), *span));
                        }
                    }
                }
                _ => {
                    if self.match_dims(*value, sinfo, ctx, false)? {
                        compound.push((*value, sinfo.clone(), ctx.clone(), *span));
                    }
                }
            }
        }
        self.run_shape_function();
        for (value, sinfo, ctx, span) in compound {
            if !dims_known(&self.heap, &sinfo) {
                return err(span, "this annotation's shape arithmetic uses a symbolic variable no parameter binds");
            }
            self.match_dims(value, &sinfo, &ctx, true)?;
        }
        Ok(())
    }

    /// Emits the type/rank checks; returns the registers of tuple fields (checked too).
    pub(super) fn check_info(&mut self, value: Arg, sinfo: &StructInfo, ctx: &str) -> Vec<i64> {
        let ctx_arg = self.c(Constant::Str(ctx.to_string()));
        match sinfo {
            StructInfo::Tensor { ndim, dtype, .. } => {
                let f = self.builtin("check_tensor_info");
                let dt = match dtype {
                    Some(d) => self.c(dtype_const(*d)),
                    None => Arg::Reg(VOID_REG),
                };
                self.call(VOID_REG, f, vec![value, Arg::Imm(*ndim), dt, ctx_arg]);
            }
            StructInfo::Shape { ndim, .. } => {
                let f = self.builtin("check_shape_info");
                self.call(VOID_REG, f, vec![value, Arg::Imm(*ndim), ctx_arg]);
            }
            StructInfo::Prim(d) => {
                let f = self.builtin("check_prim_value_info");
                let dt = self.c(dtype_const(*d));
                self.call(VOID_REG, f, vec![value, dt, ctx_arg]);
            }
            StructInfo::Tuple(items) => {
                let f = self.builtin("check_tuple_info");
                self.call(VOID_REG, f, vec![value, Arg::Imm(items.len() as i64), ctx_arg]);
                let get = self.builtin("tuple_getitem");
                let mut regs = Vec::new();
                for (k, item) in items.iter().enumerate() {
                    let r = self.reg();
                    self.call(r, get, vec![value, Arg::Imm(k as i64)]);
                    self.check_info(Arg::Reg(r), item, ctx);
                    regs.push(r);
                }
                return regs;
            }
            StructInfo::Callable => {
                let f = self.builtin("check_func_info");
                self.call(VOID_REG, f, vec![value, ctx_arg]);
            }
            StructInfo::Str => {
                let f = self.builtin("check_string_info");
                self.call(VOID_REG, f, vec![value, ctx_arg]);
            }
            StructInfo::Object => {}
        }
        Vec::new()
    }

    /// match_shape for a tensor's or shape's dims. First pass (`assert_compound` false): stores
    /// new variables, asserts known ones, skips compound dims (returns true if there were some);
    /// second pass: asserts the compound dims too.
    pub(super) fn match_dims(
        &mut self,
        value: Arg,
        sinfo: &StructInfo,
        ctx: &str,
        assert_compound: bool,
    ) -> Result<bool> {
        let dims = match sinfo {
            StructInfo::Tensor { shape: Some(d), .. } | StructInfo::Shape { dims: Some(d), .. } => d,
            _ => return Ok(false),
        };
        let mut args = vec![value, self.heap_arg(), Arg::Imm(dims.len() as i64)];
        let mut compound = false;
        for d in dims {
            let (code, v) = match d {
                _ if d.as_int().is_some() => (0, d.as_int().unwrap_or(0)),
                PrimExpr::Var(name) => {
                    let slot = self.heap.slot(d) as i64;
                    if self.heap.bound.insert(name.clone()) { (1, slot) } else { (3, slot) }
                }
                _ if assert_compound => (3, self.heap.slot(d) as i64),
                _ => {
                    compound = true;
                    (2, 0)
                }
            };
            args.extend([Arg::Imm(code), Arg::Imm(v)]);
        }
        args.push(self.c(Constant::Str(ctx.to_string())));
        let f = self.builtin("match_shape");
        self.call(VOID_REG, f, args);
        Ok(compound)
    }
}
