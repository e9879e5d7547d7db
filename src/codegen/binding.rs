//! Binding packed functions: every packed entry of the function table becomes a symbol the
//! link resolves (a builtin of the shim or a kernel of the model's objects), or an error naming
//! the first instruction that needs a missing one.

use std::collections::BTreeSet;

use super::CodegenError;
use crate::kernel_object::kernel_symbol;
use crate::vm::{Arg, Executable, FuncKind, Instr};

/// The symbol bound to each function-table entry (`None` for Relax functions).
pub fn bind_packed_functions(
    exec: &Executable,
    kernels: &BTreeSet<String>,
    objects: &str,
) -> Result<Vec<Option<String>>, CodegenError> {
    exec.funcs
        .iter()
        .enumerate()
        .map(|(i, f)| {
            if f.kind != FuncKind::Packed {
                return Ok(None);
            }
            if let Some(b) = super::shim::find_builtin(&f.name) {
                return Ok(Some(b.symbol.clone()));
            }
            if kernels.contains(&f.name) {
                return Ok(Some(kernel_symbol(&f.name)));
            }
            let (function, pc) = first_use(exec, i);
            let name = f.name.clone();
            Err(if name.starts_with("vm.builtin.") {
                CodegenError::UnknownBuiltin { name, function, pc }
            } else if name.starts_with("relax.run.") {
                CodegenError::PythonFunction { name, function, pc }
            } else {
                CodegenError::MissingKernel { name, function, pc, objects: objects.to_string() }
            })
        })
        .collect()
}

/// The first instruction (function name and pc) that calls or names function-table entry
/// `index`, for error messages.
fn first_use(exec: &Executable, index: usize) -> (String, i64) {
    for f in exec.funcs.iter().filter(|f| f.kind == FuncKind::Bytecode) {
        for k in f.start_instr..f.end_instr {
            if let Ok(Instr::Call { func, args, .. }) = exec.instr(k as usize)
                && (func == index as i64 || args.contains(&Arg::Func(index as i64)))
            {
                return (f.name.clone(), k - f.start_instr);
            }
        }
    }
    ("<no caller>".to_string(), -1)
}
