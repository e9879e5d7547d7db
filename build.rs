//! Compiles the C runtime shim into static archives that relaxc embeds (src/link), so one relaxc
//! binary can build models anywhere: the core every model links whole, the optional runtime
//! functions (rvm_runtime.def) and the kernel library (runtime-kernels/, rvm_kernels.def), both
//! of which the linker takes a file of only when a model refers to one of its functions.
//!
//! The shim is linked into every model, so its size matters (64 KiB of code at most for the core:
//! docs/src/architecture/decisions.md, decision 1). Files on the path of every call (interpreter,
//! objects, allocator, builtins, thread pool) are optimised for speed; the rest — runtime functions models call rarely,
//! rendering, the CUDA driver glue, the registry, errors — for size, which saves about a fifth
//! of their code.

use std::path::{Path, PathBuf};

/// Files whose code runs off the hot path, built with -Os.
const COLD: &[&str] =
    &["sort.c", "render.c", "relax_run.c", "cuda.c", "registry.c", "error.c", "kv_cache.c", "weights.c", "json.c"];

/// Files of the optional archive (the functions of rvm_runtime.def, and what only they use).
const OPTIONAL: &[&str] = &["sort.c", "render.c", "relax_run.c", "kv_cache.c"];

/// The board server's sources (`relaxc rpc-server`), embedded and built per target at run time.
const RPC_SERVER_DIR: &str = "rpc-server/src";

/// Every directory of C sources, headers and tables embedded in relaxc.
const SOURCE_DIRS: [&str; 4] =
    ["runtime-shim/include", "runtime-shim/src", "runtime-kernels/include", "runtime-kernels/src"];

fn shim_build() -> cc::Build {
    let mut build = cc::Build::new();
    build
        .include("runtime-shim/include")
        .include("runtime-shim/src")
        .include("runtime-kernels/include")
        .include("runtime-kernels/src")
        .flag("-std=c11")
        .flag("-Wall")
        .flag("-Wextra")
        .flag("-fvisibility=hidden")
        .warnings_into_errors(true)
        .pic(true)
        .debug(false)
        .cargo_metadata(false);
    if let Some(sanitizers) = sanitizers() {
        build
            .flag(format!("-fsanitize={sanitizers}"))
            .flag("-fno-omit-frame-pointer")
            .flag("-fno-sanitize-recover=all");
        build.debug(true);
    } else if std::env::var("CARGO_CFG_SANITIZE").is_ok_and(|s| !s.is_empty()) {
        // A sanitizer build of relaxc itself (cargo fuzz): cc would instrument the shim too, and
        // every model linked from it would then need a sanitizer runtime it does not link.
        build.flag("-fno-sanitize=address");
    }
    build
}

/// `RELAXC_SANITIZE` (e.g. `address,undefined`): build the embedded shim with these sanitizers,
/// for the sanitizer test run; relaxc then links every model with the same `-fsanitize`.
fn sanitizers() -> Option<String> {
    std::env::var("RELAXC_SANITIZE").ok().filter(|s| !s.trim().is_empty())
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

/// The kernel library, optimised for speed (-O3 vectorizes its portable loops) and with no
/// contraction of multiply-adds but those its code asks for, so its bits follow from its source.
/// `-fno-trapping-math` (no kernel reads the floating-point flags) lets the compiler turn the
/// selects of rk_math.h's functions into blends, so that their loops vectorize; no value changes.
fn kernel_archive(files: &[PathBuf]) {
    shim_build().files(files).opt_level(3).flag("-ffp-contract=off").flag("-fno-trapping-math").compile("rvm_kernels");
}

/// Writes `shim_sources.rs` into OUT_DIR: every file of the shim (sources, headers, tables) and
/// the build's file lists, so that relaxc can build the shim for another target at run time.
fn embed_sources() {
    let mut entries = Vec::new();
    for dir in SOURCE_DIRS {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("shim directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "c" || x == "h" || x == "def"))
            .collect();
        files.sort();
        for f in files {
            let name = f.file_name().expect("name").to_string_lossy().into_owned();
            let absolute = std::fs::canonicalize(&f).expect("canonical path");
            entries.push(format!("    ({name:?}, {dir:?}, include_str!({:?})),", absolute.display().to_string()));
        }
    }
    let list = |xs: &[&str]| xs.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", ");
    let code = format!(
        "/// (file name, directory, contents) of every shim file.\npub const SHIM_FILES: &[(&str, &str, &str)] = &[\n{}\n];\n\
         /// Files built for size rather than speed.\npub const SHIM_COLD: &[&str] = &[{}];\n\
         /// Files of the optional archive.\npub const SHIM_OPTIONAL: &[&str] = &[{}];\n",
        entries.join("\n"),
        list(COLD),
        list(OPTIONAL)
    );
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("shim_sources.rs");
    std::fs::write(out, code).expect("write shim_sources.rs");

    let mut server = Vec::new();
    for f in std::fs::read_dir(RPC_SERVER_DIR).expect("rpc-server directory").filter_map(|e| e.ok().map(|e| e.path())) {
        if f.extension().is_some_and(|x| x == "c" || x == "h") {
            let name = f.file_name().expect("name").to_string_lossy().into_owned();
            let absolute = std::fs::canonicalize(&f).expect("canonical path");
            server.push(format!("    ({name:?}, include_str!({:?})),", absolute.display().to_string()));
        }
    }
    server.sort();
    let code = format!(
        "/// (file name, contents) of every source of the RPC server (rpc-server/src).\npub const RPC_SERVER_FILES: &[(&str, &str)] = &[\n{}\n];\n",
        server.join("\n")
    );
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("rpc_server_sources.rs");
    std::fs::write(out, code).expect("write rpc_server_sources.rs");
}

fn c_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect(dir)
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    files.sort();
    files
}

fn main() {
    embed_sources();
    let (optional, core): (Vec<PathBuf>, Vec<PathBuf>) =
        c_files("runtime-shim/src").into_iter().partition(|p| named(p, OPTIONAL));
    archive(&core, "rvm_shim");
    archive(&optional, "rvm_runtime");
    kernel_archive(&c_files("runtime-kernels/src"));
    // The RPC server is built at run time for each target (src/target/shim.rs); compiling it here
    // holds it to the project's -Werror on every build. The archive is not linked into relaxc.
    cc::Build::new()
        .include("runtime-shim/include")
        .include(RPC_SERVER_DIR)
        .flag("-std=c11")
        .flag("-Wall")
        .flag("-Wextra")
        .warnings_into_errors(true)
        .cargo_metadata(false)
        .files(c_files(RPC_SERVER_DIR))
        .compile("rpc_server_check");
    println!("cargo:rerun-if-changed=runtime-shim");
    println!("cargo:rerun-if-changed=runtime-kernels");
    println!("cargo:rerun-if-changed=rpc-server");
    println!("cargo:rerun-if-env-changed=RELAXC_SANITIZE");
    println!("cargo:rustc-env=RELAXC_SHIM_SANITIZE={}", sanitizers().unwrap_or_default());
}
