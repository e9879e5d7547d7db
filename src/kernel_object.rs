//! Kernel objects: relocatable object files holding kernels (TVM's `lib0.o`, C kernels relaxc
//! compiled), with the entry points each defines, and the symbol names kernels go by. The TVM
//! importer and the kernel builder make them; code generation and the link consume them.

use std::collections::BTreeSet;

use object::{Object, ObjectSymbol};

use crate::abi::KERNEL_PREFIX;

/// The symbol of kernel (or packed function) `name`: TVM-FFI's `__tvm_ffi_<name>`.
pub fn kernel_symbol(name: &str) -> String {
    format!("{KERNEL_PREFIX}{name}")
}

/// An object file that cannot serve as a kernel object.
#[derive(Debug, thiserror::Error)]
#[error("{member}: not a usable object file: {message}")]
pub struct KernelObjectError {
    pub member: String,
    pub message: String,
}

/// A relocatable object holding kernels, with the kernel entry points it defines.
#[derive(Clone, Debug)]
pub struct KernelObject {
    pub name: String,
    pub bytes: Vec<u8>,
    pub kernels: BTreeSet<String>,
    /// Its kernels never return an object (TVM's TIR kernels return at most a scalar), so
    /// compiled code need not look for one to release when it drops a call's result.
    pub scalar_results: bool,
}

impl KernelObject {
    /// Reads an ELF relocatable and lists the `__tvm_ffi_<name>` entry points it defines.
    pub fn parse(name: &str, bytes: Vec<u8>) -> Result<KernelObject, KernelObjectError> {
        let err = |message: String| KernelObjectError { member: name.to_string(), message };
        let file = object::File::parse(&*bytes).map_err(|e| err(e.to_string()))?;
        if file.kind() != object::ObjectKind::Relocatable {
            return Err(err(format!("expected a relocatable object, found {:?}", file.kind())));
        }
        let mut kernels = BTreeSet::new();
        for sym in file.symbols() {
            if sym.is_undefined() || !sym.is_global() {
                continue;
            }
            if let Some(k) = sym.name().ok().and_then(|n| n.strip_prefix(KERNEL_PREFIX)) {
                kernels.insert(k.to_string());
            }
        }
        Ok(KernelObject { name: name.to_string(), bytes, kernels, scalar_results: false })
    }

    /// Marks the object as TVM's build of TIR kernels, whose results are never objects.
    pub fn with_scalar_results(mut self) -> KernelObject {
        self.scalar_results = true;
        self
    }
}
