//! Shape functions: the shape arithmetic of a Relax function (`n * 2`, `(n + 1) // 2`) compiled
//! to native code, as TVM compiles its `shape_func` with LLVM. Each is a kernel with the safe-call
//! signature taking the shape heap (an int64 tensor) and writing computed slots from known ones.
//! Division uses floor semantics, like TVM's `floordiv`/`floormod`; a zero divisor at run time is
//! an error, not a trap.

use std::mem::{offset_of, size_of};

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module};
use cranelift_object::ObjectModule;

use super::CodegenError;
use crate::abi::{ANY_PAYLOAD, DLTensor, TENSOR_DLTENSOR};
use crate::ir::{BinOp, ShapeFunc, SlotExpr};
use crate::kernel_object::kernel_symbol;

/// Byte offset of heap slot `slot` (the heap is an int64 tensor).
fn slot_offset(slot: usize) -> i32 {
    (slot * size_of::<i64>()) as i32
}

/// Defines each shape function in the module (local symbols).
pub fn define(module: &mut ObjectModule, funcs: &[ShapeFunc]) -> Result<Vec<FuncId>, CodegenError> {
    let sig = super::shim::packed_signature(module);
    let div_error = super::shim::declare_call(module, "rvm_shape_division_by_zero")?;
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    let mut ids = Vec::new();
    for f in funcs {
        let id = module.declare_function(&kernel_symbol(&f.name), Linkage::Local, &sig)?;
        ctx.func.signature = sig.clone();
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let args = b.block_params(entry)[1];
        let flags = MemFlagsData::trusted();
        // args[0] is the heap: a Tensor object.
        let obj = b.ins().load(types::I64, flags, args, ANY_PAYLOAD);
        let heap = b.ins().load(types::I64, flags, obj, TENSOR_DLTENSOR + offset_of!(DLTensor, data) as i32);
        let fail = module.declare_func_in_func(div_error, b.func);
        b.func.dfg.ext_funcs[fail].colocated = true;
        for (slot, expr) in &f.assignments {
            let v = emit(&mut b, heap, expr, *slot, fail);
            b.ins().store(flags, v, heap, slot_offset(*slot));
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
    e: &SlotExpr,
    slot: usize,
    fail: cranelift_codegen::ir::FuncRef,
) -> Value {
    match e {
        SlotExpr::Int(v) => b.ins().iconst(types::I64, *v),
        SlotExpr::Slot(k) => b.ins().load(types::I64, MemFlagsData::trusted(), heap, slot_offset(*k)),
        SlotExpr::Bin(op, x, y) => {
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
