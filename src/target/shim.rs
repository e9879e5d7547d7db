//! The runtime shim for a target: the archives build.rs made for the host, or, for another CPU,
//! the same sources (embedded in relaxc) built with the target's toolchain once and cached in
//! `$RELAXC_CACHE_DIR` (else `$XDG_CACHE_HOME/relaxc`, `~/.cache/relaxc`). The cache key is a
//! hash of the sources, the toolchain and its version, so a changed shim or compiler rebuilds.
//! The runner that `relaxc run` starts under qemu for a foreign model is built the same way.

use std::path::{Path, PathBuf};

use super::{Target, TargetError, Toolchain};

include!(concat!(env!("OUT_DIR"), "/shim_sources.rs"));

/// The runner's source: loads a model, calls a function on inputs from a file, writes the results.
const RUNNER_SOURCE: &str = include_str!("runner.c");

/// The shim's archives for a target: the core (linked whole), the optional functions and the
/// kernel library (files of both taken only when referred to).
pub struct ShimArchives {
    pub core: Vec<u8>,
    pub runtime: Vec<u8>,
    pub kernels: Vec<u8>,
}

fn cache_root() -> PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = env("RELAXC_CACHE_DIR") {
        return d;
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return d.join("relaxc");
    }
    if let Some(h) = env("HOME") {
        return h.join(".cache").join("relaxc");
    }
    std::env::temp_dir().join("relaxc-cache")
}

fn fnv(parts: &[&[u8]]) -> u64 {
    parts.iter().flat_map(|p| p.iter()).fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

fn build_err(what: &str, message: impl Into<String>) -> TargetError {
    TargetError::Build { what: what.to_string(), message: message.into() }
}

fn run(cmd: &mut std::process::Command, what: &str) -> Result<(), TargetError> {
    let out = cmd.output().map_err(|e| build_err(what, format!("cannot run {:?}: {e}", cmd.get_program())))?;
    if !out.status.success() {
        return Err(build_err(what, String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    Ok(())
}

/// A cache directory for `kind` built by `tc` for `target` from `sources`, made by `make` when it
/// is not there yet (built in a temporary directory, then renamed into place).
fn cached(
    kind: &str,
    target: &Target,
    tc: &Toolchain,
    sources: &[&[u8]],
    make: impl FnOnce(&Path) -> Result<(), TargetError>,
) -> Result<PathBuf, TargetError> {
    let identity = tc.identity();
    let mut parts: Vec<&[u8]> = sources.to_vec();
    parts.push(identity.as_bytes());
    parts.push(env!("CARGO_PKG_VERSION").as_bytes());
    let key = format!("{kind}-{}-{:016x}", target.triple, fnv(&parts));
    let root = cache_root();
    let dir = root.join(&key);
    if dir.join("done").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&root).map_err(|e| build_err("the build cache", format!("{}: {e}", root.display())))?;
    let work = tempfile::tempdir_in(&root).map_err(|e| build_err("the build cache", e.to_string()))?;
    eprintln!("relaxc: building the {kind} for {target} with {} (once; cached in {})", tc.program, root.display());
    make(work.path())?;
    std::fs::write(work.path().join("done"), b"").map_err(|e| build_err("the build cache", e.to_string()))?;
    let built = work.keep();
    if std::fs::rename(&built, &dir).is_err() {
        // Another process finished first: use its build.
        let _ = std::fs::remove_dir_all(&built);
    }
    Ok(dir)
}

/// The runtime shim's core built for the host by build.rs; every model links all of it.
pub const HOST_SHIM_ARCHIVE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/librvm_shim.a"));
/// The optional runtime functions (rvm_runtime.def) built for the host; the linker takes a file
/// of it only when the model refers to one of its functions.
pub const HOST_RUNTIME_ARCHIVE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/librvm_runtime.a"));
/// The kernel library (rvm_kernels.def) built for the host; like the optional functions, a file
/// of it is linked only when the model refers to one of its kernels.
pub const HOST_KERNELS_ARCHIVE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/librvm_kernels.a"));

/// The shim's archives for `target` (the embedded host build for the host).
pub fn archives(target: &Target, tc: &Toolchain) -> Result<ShimArchives, TargetError> {
    if target.is_host() {
        return Ok(ShimArchives {
            core: HOST_SHIM_ARCHIVE.to_vec(),
            runtime: HOST_RUNTIME_ARCHIVE.to_vec(),
            kernels: HOST_KERNELS_ARCHIVE.to_vec(),
        });
    }
    let sources: Vec<&[u8]> = SHIM_FILES.iter().map(|(_, _, text)| text.as_bytes()).collect();
    let dir = cached("runtime shim", target, tc, &sources, |work| build_shim(tc, work))?;
    let read = |name: &str| std::fs::read(dir.join(name)).map_err(|e| build_err("the cached shim", e.to_string()));
    Ok(ShimArchives {
        core: read("librvm_shim.a")?,
        runtime: read("librvm_runtime.a")?,
        kernels: read("librvm_kernels.a")?,
    })
}

fn build_shim(tc: &Toolchain, work: &Path) -> Result<(), TargetError> {
    for (name, dir, text) in SHIM_FILES {
        let folder = work.join(dir);
        std::fs::create_dir_all(&folder).map_err(|e| build_err("the shim sources", e.to_string()))?;
        std::fs::write(folder.join(name), text).map_err(|e| build_err("the shim sources", e.to_string()))?;
    }
    let (mut core, mut optional, mut kernels) = (Vec::new(), Vec::new(), Vec::new());
    for (name, dir, _) in SHIM_FILES.iter().filter(|(n, d, _)| n.ends_with(".c") && d.ends_with("src")) {
        let object = work.join(format!("{name}.o"));
        let kernel = dir.starts_with("runtime-kernels");
        let opt = if kernel {
            "-O3"
        } else if SHIM_COLD.contains(name) {
            "-Os"
        } else {
            "-O2"
        };
        let mut cmd = tc.command();
        cmd.args(["-std=c11", opt, "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-c"]);
        if kernel {
            cmd.args(["-ffp-contract=off", "-fno-trapping-math"]);
        }
        for include in ["runtime-shim/include", "runtime-shim/src", "runtime-kernels/include", "runtime-kernels/src"] {
            cmd.arg("-I").arg(work.join(include));
        }
        cmd.arg(work.join(dir).join(name)).arg("-o").arg(&object);
        run(&mut cmd, &format!("compiling the runtime's {dir}/{name}"))?;
        if kernel {
            kernels.push(object);
        } else if SHIM_OPTIONAL.contains(name) {
            optional.push(object)
        } else {
            core.push(object)
        }
    }
    let ar = tc.archiver();
    for (archive, objects) in
        [("librvm_shim.a", &core), ("librvm_runtime.a", &optional), ("librvm_kernels.a", &kernels)]
    {
        let mut cmd = std::process::Command::new(&ar);
        cmd.arg("rcs").arg(work.join(archive)).args(objects.iter());
        run(&mut cmd, &format!("archiving {archive} with {ar}"))?;
    }
    Ok(())
}

/// A C program for `target`, built from `sources` (file name, text) against rvm.h, cached like
/// the shim; returns the executable's path. `flags` are added to the compile.
fn program(
    kind: &str,
    target: &Target,
    tc: &Toolchain,
    sources: &[(&str, &str)],
    executable: &str,
    flags: &[String],
) -> Result<PathBuf, TargetError> {
    let headers: Vec<(&str, &str)> =
        SHIM_FILES.iter().filter(|(_, d, _)| d.ends_with("include")).map(|(n, _, t)| (*n, *t)).collect();
    let mut key: Vec<&[u8]> = headers.iter().chain(sources).flat_map(|(n, t)| [n.as_bytes(), t.as_bytes()]).collect();
    key.extend(flags.iter().map(|f| f.as_bytes()));
    let dir = cached(kind, target, tc, &key, |work| {
        let include = work.join("include");
        let src = work.join("src");
        for (folder, files) in [(&include, &headers), (&src, &sources.to_vec())] {
            std::fs::create_dir_all(folder).map_err(|e| build_err(kind, e.to_string()))?;
            for (name, text) in files.iter() {
                std::fs::write(folder.join(name), text).map_err(|e| build_err(kind, e.to_string()))?;
            }
        }
        let mut cmd = tc.command();
        cmd.args(["-std=c11", "-O2", "-Wall", "-Wextra"]).args(flags).arg("-I").arg(&include).arg("-I").arg(&src);
        cmd.args(sources.iter().filter(|(n, _)| n.ends_with(".c")).map(|(n, _)| src.join(n)));
        cmd.arg("-o").arg(work.join(executable)).arg("-ldl");
        run(&mut cmd, &format!("building the {kind}"))
    })?;
    Ok(dir.join(executable))
}

/// The runner program for `target`: it loads a model and calls it (`relaxc run` under qemu).
pub fn runner(target: &Target, tc: &Toolchain) -> Result<PathBuf, TargetError> {
    program("model runner", target, tc, &[("runner.c", RUNNER_SOURCE)], "rvm-runner", &[])
}

include!(concat!(env!("OUT_DIR"), "/rpc_server_sources.rs"));

/// The RPC server for `target` (`relaxc rpc-server`, rpc-server/src), needing only libc. For the
/// host of a sanitizer build of relaxc it is built with the same sanitizers, by the driver that
/// links the models it will load (their sanitizer runtime must be the executable's).
pub fn rpc_server(target: &Target, tc: &Toolchain) -> Result<PathBuf, TargetError> {
    let sanitizers = env!("RELAXC_SHIM_SANITIZE");
    if target.is_host() && !sanitizers.is_empty() {
        let flags = [format!("-fsanitize={sanitizers}"), "-fno-omit-frame-pointer".to_string()];
        let linker = Toolchain { program: super::host_linker(), args: Vec::new() };
        return program("rpc server", target, &linker, RPC_SERVER_FILES, "relaxc-rpc-server", &flags);
    }
    program("rpc server", target, tc, RPC_SERVER_FILES, "relaxc-rpc-server", &[])
}
