//! The model's tvm-ffi entry points: `__tvm_ffi_<name>` for each Relax function, a stub with the
//! safe-call signature that calls the shim's `rvm_ffi_call` with the function's C API index.
//! They make the `.so` a module `tvm_ffi.load_module` accepts (shared/spec/tvm-ffi-module.md);
//! the link exports them and nothing else beside `rvm_get_api`.

use std::collections::BTreeSet;

use cranelift_codegen::ir::{AbiParam, InstBuilder, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{Linkage, Module};
use cranelift_object::ObjectModule;

use super::TablesError;
use crate::vm::{Executable, FuncKind};

/// Entry points defined, and Relax functions left without one (with the reason).
pub struct FfiEntries {
    pub symbols: Vec<String>,
    pub skipped: Vec<(String, String)>,
}

/// Defines `__tvm_ffi_<name>` for every Relax function whose name can carry one.
pub fn define(
    module: &mut ObjectModule,
    exec: &Executable,
    taken: &BTreeSet<String>,
) -> Result<FfiEntries, TablesError> {
    let call = super::native::shim_calls().get("rvm_ffi_call").expect("rvm_ffi_call in rvm_calls.def");
    let mut call_sig = module.make_signature();
    call_sig.params.extend(call.params.iter().map(|t| AbiParam::new(*t)));
    call_sig.returns.extend(call.ret.map(AbiParam::new));
    let call_id = module.declare_function(&call.name, Linkage::Import, &call_sig)?;
    let sig = super::native::packed_signature(module);
    let mut out = FfiEntries { symbols: Vec::new(), skipped: Vec::new() };
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    let relax = exec.funcs.iter().filter(|f| f.kind != FuncKind::Packed);
    for (index, f) in relax.enumerate() {
        let symbol = format!("{}{}", crate::tvm::KERNEL_PREFIX, f.name);
        if f.name.starts_with('_') || !f.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            out.skipped.push((f.name.clone(), "its name is not a plain identifier tvm-ffi can look up".into()));
            continue;
        }
        if taken.contains(&symbol) {
            out.skipped.push((f.name.clone(), format!("a kernel already defines {symbol}")));
            continue;
        }
        let id = module.declare_function(&symbol, Linkage::Export, &sig)?;
        ctx.func.signature = sig.clone();
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let entry = b.create_block();
            b.append_block_params_for_function_params(entry);
            b.switch_to_block(entry);
            let p = b.block_params(entry).to_vec();
            let callee = module.declare_func_in_func(call_id, b.func);
            b.func.dfg.ext_funcs[callee].colocated = true;
            let index = b.ins().iconst(types::I64, index as i64);
            let rc = b.ins().call(callee, &[index, p[1], p[2], p[3]]);
            let rc = b.inst_results(rc)[0];
            b.ins().return_(&[rc]);
            b.seal_all_blocks();
            b.finalize(module.isa().frontend_config());
        }
        module.define_function(id, &mut ctx)?;
        module.clear_context(&mut ctx);
        out.symbols.push(symbol);
    }
    Ok(out)
}
