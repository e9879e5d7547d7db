//! The final link: the model object, the kernel objects and the runtime shim (embedded in
//! relaxc at build time) become one shared object with the system C compiler driver. A version
//! script keeps every symbol but the C API's entry point local, so many models load in one
//! process without clashing.

use std::path::{Path, PathBuf};

use crate::codegen::tables::EmittedObject;
use crate::tvm::KernelObject;

/// The runtime shim's core, compiled by build.rs; every model links all of it.
pub const SHIM_ARCHIVE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/librvm_shim.a"));
/// The optional runtime functions (rvm_runtime.def); the linker takes a file of it only when the
/// model refers to one of its functions.
pub const RUNTIME_ARCHIVE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/librvm_runtime.a"));

/// The version script: a model exports the C API's entry point and its tvm-ffi entry points,
/// nothing else (kernels and the runtime stay local, so many models load in one process).
fn version_script(exports: &[String]) -> String {
    let mut s = String::from("{\n  global:\n    rvm_get_api;\n");
    for e in exports {
        s.push_str(&format!("    {e};\n"));
    }
    s.push_str("  local: *;\n};\n");
    s
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot write temporary file {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("cannot run the linker {linker:?}: {source} (set CC to a C compiler driver)")]
    Spawn { linker: String, source: std::io::Error },
    #[error("the link failed ({linker} {status}):\n{stderr}")]
    Failed { linker: String, status: String, stderr: String },
    #[error(transparent)]
    Target(#[from] crate::target::TargetError),
}

/// The C compiler driver used to link for the host: $CC, else `cc`.
pub fn linker() -> String {
    std::env::var("CC").ok().filter(|s| !s.trim().is_empty()).unwrap_or_else(|| "cc".to_string())
}

/// Links the model object with `kernels` and the shim into `out`, for the host.
pub fn link_shared(object: &EmittedObject, kernels: &[KernelObject], out: &Path) -> Result<(), LinkError> {
    link_shared_for(object, kernels, out, &crate::target::Target::host())
}

/// Links the model object with `kernels` and the target's shim into `out` with the target's
/// toolchain.
pub fn link_shared_for(
    object: &EmittedObject,
    kernels: &[KernelObject],
    out: &Path,
    target: &crate::target::Target,
) -> Result<(), LinkError> {
    let (tc, archives) = if target.is_host() {
        let tc = crate::target::Toolchain { program: linker(), args: Vec::new() };
        let archives =
            crate::target::shim::ShimArchives { core: SHIM_ARCHIVE.to_vec(), runtime: RUNTIME_ARCHIVE.to_vec() };
        (tc, archives)
    } else {
        let tc = crate::target::toolchain(target)?;
        let archives = crate::target::shim::archives(target, &tc)?;
        (tc, archives)
    };
    let model_object = &object.bytes;
    let dir = tempfile::tempdir().map_err(|source| LinkError::Io { path: "temporary directory".into(), source })?;
    let write = |name: &str, bytes: &[u8]| -> Result<PathBuf, LinkError> {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).map_err(|source| LinkError::Io { path: path.display().to_string(), source })?;
        Ok(path)
    };
    let model = write("model.o", model_object)?;
    let shim = write("librvm_shim.a", &archives.core)?;
    let runtime = write("librvm_runtime.a", &archives.runtime)?;
    let script = write("exports.map", version_script(&object.exports).as_bytes())?;
    let mut kernel_paths = Vec::new();
    for (i, k) in kernels.iter().enumerate() {
        kernel_paths.push(write(&format!("kernels{i}.o"), &k.bytes)?);
    }
    let linker = tc.program.clone();
    let mut cmd = tc.command();
    cmd.arg("-shared").arg("-o").arg(out).arg(&model).args(&kernel_paths);
    cmd.arg("-Wl,--whole-archive").arg(&shim).arg("-Wl,--no-whole-archive").arg(&runtime);
    cmd.arg(format!("-Wl,--version-script={}", script.display()));
    cmd.args(["-Wl,--no-undefined", "-Wl,-z,noexecstack", "-Wl,-z,relro", "-Wl,-z,now", "-lm"]);
    let output = cmd.output().map_err(|source| LinkError::Spawn { linker: linker.clone(), source })?;
    if !output.status.success() {
        return Err(LinkError::Failed {
            linker,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(())
}
