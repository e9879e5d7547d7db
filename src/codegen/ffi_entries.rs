//! The model's tvm-ffi entry points: `__tvm_ffi_<name>` for each Relax function, a trampoline
//! that calls the shim's `rvm_ffi_call` with the function's C API index. They make the `.so` a
//! module `tvm_ffi.load_module` accepts (apache/tvm-ffi src/ffi/extra/library_module.cc); the link exports them
//! and nothing else beside `rvm_get_api`.

use std::collections::BTreeSet;

use cranelift_module::Linkage;
use cranelift_object::ObjectModule;

use super::CodegenError;
use super::trampoline::{self, Forward};
use crate::kernel_object::kernel_symbol;
use crate::vm::{Executable, FuncKind};

/// Entry points defined, and Relax functions left without one (with the reason).
pub struct FfiEntries {
    pub symbols: Vec<String>,
    pub skipped: Vec<(String, String)>,
}

/// Defines `__tvm_ffi_<name>` for every Relax function whose name can carry one and whose
/// symbol is not `taken` by a kernel.
pub fn define(
    module: &mut ObjectModule,
    exec: &Executable,
    taken: &BTreeSet<String>,
) -> Result<FfiEntries, CodegenError> {
    let ffi_call = super::shim::declare_call(module, "rvm_ffi_call")?;
    let mut out = FfiEntries { symbols: Vec::new(), skipped: Vec::new() };
    let relax = exec.funcs.iter().filter(|f| f.kind != FuncKind::Packed);
    for (index, f) in relax.enumerate() {
        let symbol = kernel_symbol(&f.name);
        if f.name.starts_with('_') || !f.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            out.skipped.push((f.name.clone(), "its name is not a plain identifier tvm-ffi can look up".into()));
            continue;
        }
        if taken.contains(&symbol) {
            out.skipped.push((f.name.clone(), format!("a kernel already defines {symbol}")));
            continue;
        }
        trampoline::define(module, &symbol, Linkage::Export, ffi_call, index as i64, Forward::ArgsAndResult)?;
        out.symbols.push(symbol);
    }
    Ok(out)
}
