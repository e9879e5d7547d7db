//! Trampolines: safe-call functions whose whole body hands a fixed index and the caller's
//! arguments to one shim function. The tvm-ffi entry points (`rvm_ffi_call`) and the CUDA
//! kernel launchers (`rvm_cuda_call`) are made of them.

use cranelift_codegen::ir::{InstBuilder, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module};
use cranelift_object::ObjectModule;

use super::CodegenError;

/// The safe-call argument the shim function receives after the index.
pub enum Forward {
    /// `(index, args, num_args)`
    Args,
    /// `(index, args, num_args, result)`
    ArgsAndResult,
}

/// Defines `symbol(self, args, num_args, result)` as `return shim(index, ...)`.
pub fn define(
    module: &mut ObjectModule,
    symbol: &str,
    linkage: Linkage,
    shim: FuncId,
    index: i64,
    forward: Forward,
) -> Result<FuncId, CodegenError> {
    let sig = super::shim::packed_signature(module);
    let id = module.declare_function(symbol, linkage, &sig)?;
    let mut ctx = module.make_context();
    ctx.func.signature = sig;
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let p = b.block_params(entry).to_vec();
    let callee = module.declare_func_in_func(shim, b.func);
    b.func.dfg.ext_funcs[callee].colocated = true;
    let index = b.ins().iconst(types::I64, index);
    let args = match forward {
        Forward::Args => vec![index, p[1], p[2]],
        Forward::ArgsAndResult => vec![index, p[1], p[2], p[3]],
    };
    let call = b.ins().call(callee, &args);
    let rc = b.inst_results(call)[0];
    b.ins().return_(&[rc]);
    b.seal_all_blocks();
    b.finalize(module.isa().frontend_config());
    module.define_function(id, &mut ctx)?;
    Ok(id)
}
