//! Compiles the C runtime shim into two static archives that relaxc embeds (src/link), so one
//! relaxc binary can build models anywhere: the core every model links whole, and the optional
//! runtime functions (rvm_runtime.def) that the linker takes only when a model refers to them.
//!
//! The shim is linked into every model, so its size matters (DESIGN.md: 64 KiB of code at most
//! for the core). Files on the path of every call (interpreter, objects, allocator, builtins,
//! thread pool) are optimised for speed; the rest — runtime functions models call rarely,
//! rendering, the CUDA driver glue, the registry, errors — for size, which saves about a fifth
//! of their code.

use std::path::{Path, PathBuf};

/// Files whose code runs off the hot path, built with -Os.
const COLD: &[&str] = &["sort.c", "render.c", "relax_run.c", "cuda.c", "registry.c", "error.c", "kv_cache.c"];

/// Files of the optional archive (the functions of rvm_runtime.def, and what only they use).
const OPTIONAL: &[&str] = &["sort.c", "render.c", "relax_run.c", "kv_cache.c"];

fn shim_build() -> cc::Build {
    let mut build = cc::Build::new();
    build
        .include("runtime-shim/include")
        .include("runtime-shim/src")
        .flag("-std=c11")
        .flag("-Wall")
        .flag("-Wextra")
        .flag("-fvisibility=hidden")
        .warnings_into_errors(true)
        .pic(true)
        .debug(false)
        .cargo_metadata(false);
    build
}

fn named(p: &Path, list: &[&str]) -> bool {
    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| list.contains(&n))
}

/// Compiles `files` into an archive `name`, each file at the optimisation its kind wants.
fn archive(files: &[PathBuf], name: &str) {
    let (cold, hot): (Vec<&PathBuf>, Vec<&PathBuf>) = files.iter().partition(|p| named(p, COLD));
    let cold_objects =
        if cold.is_empty() { Vec::new() } else { shim_build().files(cold).opt_level_str("s").compile_intermediates() };
    shim_build().files(hot).opt_level(2).objects(&cold_objects).compile(name);
}

fn main() {
    let src = Path::new("runtime-shim/src");
    let mut files: Vec<PathBuf> = std::fs::read_dir(src)
        .expect("runtime-shim/src")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    files.sort();
    let (optional, core): (Vec<PathBuf>, Vec<PathBuf>) = files.into_iter().partition(|p| named(p, OPTIONAL));
    archive(&core, "rvm_shim");
    archive(&optional, "rvm_runtime");
    println!("cargo:rerun-if-changed=runtime-shim");
}
