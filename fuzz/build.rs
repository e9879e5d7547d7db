//! Builds the RPC server's C sources (rpc_packet) and the GGUF reader (gguf) into the fuzz targets. Under `cargo fuzz` the C
//! code gets the same AddressSanitizer and libFuzzer coverage as the Rust code, so the fuzzer
//! steers by branches in the decoder; clang is needed for that coverage.

fn main() {
    let mut build = cc::Build::new();
    build
        .compiler("clang")
        .include("../runtime-shim/include")
        .include("../rpc-server/src")
        .include("../runtime-shim/src")
        .flag("-std=c11")
        .warnings_into_errors(true)
        .files(["c/rpc_packet.c", "../rpc-server/src/codec.c", "../rpc-server/src/session.c", "../rpc-server/src/served.c", "../rpc-server/src/transport.c", "c/gguf.c", "../runtime-shim/src/gguf.c"]);
    if std::env::var("CARGO_CFG_SANITIZE").is_ok_and(|s| s.contains("address")) {
        build.flag("-fsanitize=address").flag("-fsanitize-coverage=inline-8bit-counters,pc-table,trace-cmp");
    }
    build.compile("rpc_server");
    println!("cargo:rustc-link-lib=dl");
    println!("cargo:rerun-if-changed=c");
    println!("cargo:rerun-if-changed=../rpc-server/src");
    println!("cargo:rerun-if-changed=../runtime-shim/src/gguf.c");
}
