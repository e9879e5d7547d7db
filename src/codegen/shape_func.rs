//! Shape functions: the shape arithmetic of a Relax function (`n * 2`, `(n + 1) // 2`) compiled
//! to native code, as TVM compiles its `shape_func` with LLVM. Each is a kernel with the safe-call
//! signature taking the shape heap (an int64 tensor) and writing computed slots from known ones.
//! Division uses floor semantics, like TVM's `floordiv`/`floormod`; a zero divisor at run time is
//! an error, not a trap.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{AbiParam, InstBuilder, MemFlagsData, Value, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module};
use cranelift_object::ObjectModule;

use super::TablesError;
use crate::ir::{BinOp, PrimExpr};

/// Heap slots computed from other slots. Expressions use variables named `s<slot>`.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeFunc {
    /// Packed-function name; the symbol is `__tvm_ffi_<name>`.
    pub name: String,
    pub assignments: Vec<(usize, PrimExpr)>,
}

/// The slot a `s<k>` variable reads.
fn slot_of(var: &str) -> usize {
    var.strip_prefix('s').and_then(|k| k.parse().ok()).expect("shape function variables are s<slot>")
}

/// Defines each shape function in the module (local symbols).
pub fn define(module: &mut ObjectModule, funcs: &[ShapeFunc]) -> Result<Vec<FuncId>, TablesError> {
    let sig = super::native::packed_signature(module);
    let mut div_sig = module.make_signature();
    div_sig.params.push(AbiParam::new(types::I64));
    div_sig.returns.push(AbiParam::new(types::I32));
    let div_error = module.declare_function("rvm_shape_division_by_zero", Linkage::Import, &div_sig)?;
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    let mut ids = Vec::new();
    for f in funcs {
        let id = module.declare_function(&format!("{}{}", crate::tvm::KERNEL_PREFIX, f.name), Linkage::Local, &sig)?;
        ctx.func.signature = sig.clone();
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let args = b.block_params(entry)[1];
        let flags = MemFlagsData::trusted();
        // args[0] is the heap: a Tensor object (its DLTensor follows the 24-byte header).
        let obj = b.ins().load(types::I64, flags, args, 8);
        let heap = b.ins().load(types::I64, flags, obj, 24);
        let fail = module.declare_func_in_func(div_error, b.func);
        b.func.dfg.ext_funcs[fail].colocated = true;
        for (slot, expr) in &f.assignments {
            let v = emit(&mut b, heap, expr, *slot, fail);
            b.ins().store(flags, v, heap, (*slot * 8) as i32);
        }
        let zero = b.ins().iconst(types::I32, 0);
        b.ins().return_(&[zero]);
        b.seal_all_blocks();
        b.finalize(module.isa().frontend_config());
        module.define_function(id, &mut ctx)?;
        module.clear_context(&mut ctx);
        ids.push(id);
    }
    Ok(ids)
}

fn emit(
    b: &mut FunctionBuilder,
    heap: Value,
    e: &PrimExpr,
    slot: usize,
    fail: cranelift_codegen::ir::FuncRef,
) -> Value {
    match e {
        PrimExpr::Int(v) => b.ins().iconst(types::I64, *v),
        PrimExpr::Var(v) => b.ins().load(types::I64, MemFlagsData::trusted(), heap, (slot_of(v) * 8) as i32),
        PrimExpr::Bin(op, x, y) => {
            let (x, y) = (emit(b, heap, x, slot, fail), emit(b, heap, y, slot, fail));
            match op {
                BinOp::Add => b.ins().iadd(x, y),
                BinOp::Sub => b.ins().isub(x, y),
                BinOp::Mul => b.ins().imul(x, y),
                BinOp::FloorDiv | BinOp::FloorMod => {
                    let (bad, ok) = (b.create_block(), b.create_block());
                    b.set_cold_block(bad);
                    b.ins().brif(y, ok, &[], bad, &[]);
                    b.switch_to_block(bad);
                    let s = b.ins().iconst(types::I64, slot as i64);
                    let call = b.ins().call(fail, &[s]);
                    let rc = b.inst_results(call)[0];
                    b.ins().return_(&[rc]);
                    b.switch_to_block(ok);
                    // i64::MIN / -1 would trap: its floor quotient wraps, as in TVM's int64 math.
                    let minus_one = b.ins().icmp_imm_s(IntCC::Equal, y, -1);
                    let one = b.ins().iconst(types::I64, 1);
                    let safe_y = b.ins().select(minus_one, one, y);
                    let q0 = b.ins().sdiv(x, safe_y);
                    let neg_x = b.ins().ineg(x);
                    let q = b.ins().select(minus_one, neg_x, q0);
                    let qy = b.ins().imul(q, y);
                    let r = b.ins().isub(x, qy);
                    // Floor: step the truncated quotient down when the remainder's sign differs from y's.
                    let r_nonzero = b.ins().icmp_imm_s(IntCC::NotEqual, r, 0);
                    let signs_differ = b.ins().bxor(r, y);
                    let differ = b.ins().icmp_imm_s(IntCC::SignedLessThan, signs_differ, 0);
                    let adjust = b.ins().band(r_nonzero, differ);
                    let adjust64 = b.ins().uextend(types::I64, adjust);
                    match op {
                        BinOp::FloorDiv => b.ins().isub(q, adjust64),
                        _ => {
                            let add = b.ins().imul(adjust64, y);
                            b.ins().iadd(r, add)
                        }
                    }
                }
            }
        }
    }
}
