//! Building kernel sources into objects that link into a model: C through clang (LLVM) when it
//! is installed, else the system C compiler. Kernel authors include `rvm_kernel.h` (written next
//! to the sources' build, so no install is needed) and export `__tvm_ffi_<name>`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tvm::{ImportError, KernelObject};

/// The kernel ABI header, embedded so that relaxc can build kernels anywhere.
pub const KERNEL_HEADER: &str = include_str!("../../runtime-shim/include/rvm_kernel.h");

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("cannot write {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("cannot run the C compiler {compiler:?}: {source}")]
    Spawn { compiler: String, source: std::io::Error },
    #[error("{source_file}: the C compiler failed:\n{stderr}")]
    Compile { source_file: String, stderr: String },
    #[error(transparent)]
    Object(#[from] ImportError),
}

/// The C compiler for kernels: $CC, else clang if installed, else cc.
pub fn c_compiler() -> String {
    if let Some(cc) = std::env::var("CC").ok().filter(|s| !s.trim().is_empty()) {
        return cc;
    }
    let has_clang = Command::new("clang").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    if has_clang { "clang".into() } else { "cc".into() }
}

/// Compiles one C kernel source into a relocatable object.
pub fn compile_c(source: &Path) -> Result<KernelObject, KernelError> {
    let dir = tempfile::tempdir().map_err(|source| KernelError::Io { path: "temporary directory".into(), source })?;
    let header = dir.path().join("rvm_kernel.h");
    std::fs::write(&header, KERNEL_HEADER)
        .map_err(|source| KernelError::Io { path: header.display().to_string(), source })?;
    let object: PathBuf = dir.path().join("kernel.o");
    let compiler = c_compiler();
    let out = Command::new(&compiler)
        .args(["-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-c"])
        .arg("-I")
        .arg(dir.path())
        .arg(source)
        .arg("-o")
        .arg(&object)
        .output()
        .map_err(|source| KernelError::Spawn { compiler: compiler.clone(), source })?;
    if !out.status.success() {
        return Err(KernelError::Compile {
            source_file: source.display().to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let bytes =
        std::fs::read(&object).map_err(|source| KernelError::Io { path: object.display().to_string(), source })?;
    let name = source.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "kernel.c".into());
    Ok(KernelObject::parse(&name, bytes)?)
}
