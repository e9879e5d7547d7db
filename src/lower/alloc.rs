//! Destination-passing allocation for `call_dps_packed` outputs, with static storage planning:
//! an output of static size whose tensor only feeds kernels takes a free storage of its size
//! (kept alive in a register for reuse) instead of a new one, so a chain of temporaries holds
//! two storages instead of one per step. Other outputs get their own storage, released as soon
//! as the tensor holds it (dynamic sizes come from the shape heap).

use super::{FnGen, Result, Token, dtype_const, err, nbytes_expr};
use crate::diag::Span;
use crate::ir::{StructInfo, VarId};
use crate::vm::{Arg, Constant, DType, VM_REG};

impl FnGen<'_> {
    /// Storage and a tensor for one DPS output. With `plan`, a static-size output takes a free
    /// storage of its size (or a new one kept for reuse); otherwise it gets its own.
    pub(super) fn alloc_tensor(&mut self, out: &StructInfo, plan: Option<VarId>, span: Span) -> Result<i64> {
        let StructInfo::Tensor { shape: Some(dims), dtype: Some(dtype), .. } = out else {
            return err(span, "outputs need a shape and a dtype");
        };
        let u8c = self.c(dtype_const(DType::U8));
        let global = self.c(Constant::Str("global".into()));
        let dt = self.c(dtype_const(*dtype));
        let alloc_storage = self.builtin("alloc_storage");
        let alloc_tensor = self.builtin("alloc_tensor");
        let null = self.builtin("null_value");
        let t = self.reg();
        match dims.iter().map(|d| d.as_int()).collect::<Option<Vec<i64>>>() {
            Some(static_dims) => {
                if static_dims.iter().any(|d| *d < 0) {
                    return err(span, "negative dimension in an output shape");
                }
                let nbytes = nbytes_expr(dims, *dtype).as_int().unwrap_or(0);
                let shape = self.c(Constant::Shape(static_dims));
                let size = self.c(Constant::Shape(vec![nbytes]));
                match plan {
                    Some(var) => {
                        let token = match self.tokens.iter().position(|k| k.free && k.nbytes == nbytes) {
                            Some(k) => k,
                            None => {
                                let s = self.reg();
                                self.call(s, alloc_storage, vec![Arg::Reg(VM_REG), size, Arg::Imm(0), u8c, global]);
                                self.tokens.push(Token { reg: s, nbytes, free: true });
                                self.tokens.len() - 1
                            }
                        };
                        self.tokens[token].free = false;
                        self.tensor_token.insert(var, token);
                        let s = self.tokens[token].reg;
                        self.call(t, alloc_tensor, vec![Arg::Reg(s), Arg::Imm(0), shape, dt]);
                    }
                    None => {
                        let s = self.reg();
                        self.call(s, alloc_storage, vec![Arg::Reg(VM_REG), size, Arg::Imm(0), u8c, global]);
                        self.call(t, alloc_tensor, vec![Arg::Reg(s), Arg::Imm(0), shape, dt]);
                        self.call(s, null, vec![]);
                    }
                }
            }
            None => {
                for d in dims.iter().filter(|d| d.as_int().is_none()) {
                    self.ready_slot(d, span)?;
                }
                let (size, shape, s) = (self.reg(), self.reg(), self.reg());
                self.make_shape(size, &[nbytes_expr(dims, *dtype)], span)?;
                self.call(s, alloc_storage, vec![Arg::Reg(VM_REG), Arg::Reg(size), Arg::Imm(0), u8c, global]);
                self.make_shape(shape, dims, span)?;
                self.call(t, alloc_tensor, vec![Arg::Reg(s), Arg::Imm(0), Arg::Reg(shape), dt]);
                for r in [s, size, shape] {
                    self.call(r, null, vec![]);
                }
            }
        }
        Ok(t)
    }
}
