//! Compiles the C runtime shim into a static archive that relaxc embeds (src/link), so one
//! relaxc binary can build models without the shim's sources.

use std::path::Path;

fn main() {
    let src = Path::new("runtime-shim/src");
    let mut files: Vec<_> = std::fs::read_dir(src)
        .expect("runtime-shim/src")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    files.sort();
    let mut build = cc::Build::new();
    build
        .files(&files)
        .include("runtime-shim/include")
        .include("runtime-shim/src")
        .flag("-std=c11")
        .flag("-Wall")
        .flag("-Wextra")
        .flag("-fvisibility=hidden")
        .warnings_into_errors(true)
        .pic(true)
        .opt_level(2)
        .debug(false)
        .cargo_metadata(false);
    build.compile("rvm_shim");
    println!("cargo:rerun-if-changed=runtime-shim");
}
