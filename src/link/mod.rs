//! The final link: the model object, the kernel objects and the runtime shim (embedded in
//! relaxc at build time) become one shared object with the system C compiler driver. A version
//! script keeps every symbol but the C API's entry point local, so many models load in one
//! process without clashing.

use std::path::{Path, PathBuf};

use crate::kernel_object::KernelObject;
use crate::target::{Target, Toolchain};

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
    #[error(transparent)]
    Output(#[from] crate::outfile::OutputError),
}

/// The sanitizers the embedded host shim was built with (`RELAXC_SANITIZE` at build time; empty
/// for a normal build). Models linked by such a relaxc need the sanitizer runtime loaded first
/// (`LD_PRELOAD=$(cc -print-file-name=libasan.so)`), which `.ci/sanitize` arranges.
pub const SHIM_SANITIZERS: &str = env!("RELAXC_SHIM_SANITIZE");

/// The C compiler driver used to link for the host: $CC, else `cc`.
pub fn linker() -> String {
    crate::target::host_linker()
}

/// An object file the link writes itself just before it runs, from data too large to hold in
/// memory once more (the model's weights).
pub trait StreamedObject {
    fn write_to(&self, path: &Path) -> std::io::Result<()>;
}

/// What the link makes a model of besides the shim.
pub struct LinkInputs<'a> {
    /// The model object (relaxc's code generation output).
    pub object: &'a [u8],
    /// Objects written straight to disk (the model's constants).
    pub streamed: &'a [Box<dyn StreamedObject>],
    /// Symbols the `.so` exports besides `rvm_get_api`.
    pub exports: &'a [String],
    pub kernels: &'a [KernelObject],
    /// Symbols the link must take from the runtime's archives even though nothing refers to
    /// them (the kernel library's tvm-ffi exports).
    pub undefined: &'a [String],
}

/// Links a model for the host into `out`.
pub fn link_shared(inputs: &LinkInputs, out: &Path) -> Result<(), LinkError> {
    link_shared_for(inputs, out, &Target::host())
}

/// Links a model for `target` into `out`, with the target's toolchain and its build of the
/// shim.
pub fn link_shared_for(inputs: &LinkInputs, out: &Path, target: &Target) -> Result<(), LinkError> {
    let tc = if target.is_host() {
        Toolchain { program: linker(), args: Vec::new() }
    } else {
        crate::target::toolchain(target)?
    };
    let archives = crate::target::shim::archives(target, &tc)?;
    let LinkInputs { object: model_object, streamed, exports, kernels, undefined } = *inputs;
    let dir = tempfile::tempdir().map_err(|source| LinkError::Io { path: "temporary directory".into(), source })?;
    let write = |name: &str, bytes: &[u8]| -> Result<PathBuf, LinkError> {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).map_err(|source| LinkError::Io { path: path.display().to_string(), source })?;
        Ok(path)
    };
    let model = write("model.o", model_object)?;
    let shim = write("librvm_shim.a", &archives.core)?;
    let runtime = write("librvm_runtime.a", &archives.runtime)?;
    let kernel_library = write("librvm_kernels.a", &archives.kernels)?;
    let script = write("exports.map", version_script(exports).as_bytes())?;
    let mut kernel_paths = Vec::new();
    for (i, k) in kernels.iter().enumerate() {
        kernel_paths.push(write(&format!("kernels{i}.o"), &k.bytes)?);
    }
    for (i, object) in streamed.iter().enumerate() {
        let path = dir.path().join(format!("streamed{i}.o"));
        object.write_to(&path).map_err(|source| LinkError::Io { path: path.display().to_string(), source })?;
        kernel_paths.push(path);
    }
    // The linker writes a file beside `out` that replaces it once complete (crate::outfile).
    let files = LinkFiles { model, kernels: kernel_paths, shim, runtime, kernel_library, script };
    crate::outfile::write_with(out, true, |partial| run_linker(&tc, target, partial, &files, undefined))
}

/// The link's inputs, written out for the linker.
struct LinkFiles {
    model: PathBuf,
    kernels: Vec<PathBuf>,
    shim: PathBuf,
    runtime: PathBuf,
    kernel_library: PathBuf,
    script: PathBuf,
}

fn run_linker(
    tc: &Toolchain,
    target: &Target,
    out: &Path,
    files: &LinkFiles,
    undefined: &[String],
) -> Result<(), LinkError> {
    let LinkFiles { model, kernels: kernel_paths, shim, runtime, kernel_library, script } = files;
    let linker = tc.program.clone();
    let mut cmd = tc.command();
    // Kernels first: their addresses (and so their code's alignment, which moved a kernel-bound
    // chain by up to 15% on Zen 3) then do not change with the size of the generated code.
    cmd.arg("-shared").arg("-o").arg(out).args(kernel_paths).arg(model);
    cmd.args(undefined.iter().map(|u| format!("-Wl,--undefined={u}")));
    cmd.arg("-Wl,--whole-archive").arg(shim).arg("-Wl,--no-whole-archive").arg(runtime).arg(kernel_library);
    cmd.arg(format!("-Wl,--version-script={}", script.display()));
    cmd.args(["-Wl,--no-undefined", "-Wl,-z,noexecstack", "-Wl,-z,relro", "-Wl,-z,now", "-lm"]);
    // A relaxc built with RELAXC_SANITIZE embeds a sanitized shim (host only): link its runtimes.
    if target.is_host() && !SHIM_SANITIZERS.is_empty() {
        cmd.arg(format!("-fsanitize={SHIM_SANITIZERS}"));
    }
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
