//! Building kernel sources into objects that link into a model: C through clang (LLVM) when it
//! is installed, else the system C compiler. Kernel authors include `rvm_kernel.h` (written next
//! to the sources' build, so no install is needed) and export `__tvm_ffi_<name>`.

use std::path::{Path, PathBuf};

use crate::kernel_object::{KernelObject, KernelObjectError};

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
    Object(#[from] KernelObjectError),
}

/// Compiles one C kernel source into a relocatable object for the host.
pub fn compile_c_host(source: &Path) -> Result<KernelObject, KernelError> {
    let tc = crate::target::toolchain(&crate::target::Target::host())
        .map_err(|e| KernelError::Compile { source_file: source.display().to_string(), stderr: e.to_string() })?;
    compile_c(source, &tc)
}

/// Compiles one C kernel source into a relocatable object with a target's toolchain. Floating
/// point contraction is off, so that the same C gives the same bits on every CPU (aarch64 and
/// riscv64 compilers fuse multiply-adds by default; x86-64 without FMA cannot).
pub fn compile_c(source: &Path, tc: &crate::target::Toolchain) -> Result<KernelObject, KernelError> {
    let dir = tempfile::tempdir().map_err(|source| KernelError::Io { path: "temporary directory".into(), source })?;
    let header = dir.path().join("rvm_kernel.h");
    std::fs::write(&header, KERNEL_HEADER)
        .map_err(|source| KernelError::Io { path: header.display().to_string(), source })?;
    let object: PathBuf = dir.path().join("kernel.o");
    let compiler = tc.program.clone();
    let out = tc
        .command()
        .args(["-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off", "-Wall", "-c"])
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
