//! rvm.h's threading contract: one module shared by many threads, one VM per thread. Four
//! threads call the same model at once, in both modes, and every result equals TVM's.
//!
//! `c_hosts_under_load` does the same from C hosts (pthreads): the thread pool launched from four
//! VMs at once, nested launches, instrument hooks, the function registry from several threads,
//! and four KV caches generating on four threads. `.ci/sanitize` runs it on a ThreadSanitizer
//! build of the runtime (RELAXC_SANITIZE=thread), where any report fails it.

mod common;

use relaxc::codegen::ExecMode;
use relaxc::host::{Model, npz};

#[test]
fn one_module_many_threads() {
    for (fixture, case) in [("mlp_static", "basic"), ("calls", "basic"), ("dyn_tuple", "n3")] {
        for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
            let dir = common::fixtures_dir().join(fixture);
            let so = common::build(fixture, &dir.join("m.tar"), mode).expect("build");
            let model = Model::load(&so).expect("load");
            let inputs = npz::read_inputs(&dir.join(format!("ok_{case}.in.npz"))).expect("inputs");
            let expected = dir.join(format!("ok_{case}.out.npz"));
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        let mut vm = model.vm().expect("vm");
                        let main = model.find("main").expect("main");
                        for _ in 0..200 {
                            let out = vm.call(main, &inputs).expect("call").to_output().flatten();
                            common::compare_outputs(&out, &expected).expect("same as TVM");
                        }
                        assert_eq!(vm.stats().live_storage_bytes, 0, "storage left held");
                    });
                }
            });
        }
    }
}

/// Runs a C host; its checks must all hold (and, under ThreadSanitizer, it must report nothing:
/// a report makes the sanitizer exit with an error).
fn run_host(exe: &std::path::Path, args: &[&std::ffi::OsStr], what: &str) {
    let out = std::process::Command::new(exe)
        .args(args)
        .env("TSAN_OPTIONS", "halt_on_error=1:exitcode=66")
        .output()
        .expect("run the C host");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what}: {}\n{text}", out.status);
    assert!(!text.contains("ThreadSanitizer"), "{what}:\n{text}");
    eprint!("{what}: {text}");
}

#[test]
fn c_hosts_under_load() {
    let threads_test = common::build_c_host("threads_test");
    let llm_test = common::build_c_host("llm_test");
    let root = common::root();
    let nested_source = root.join("tests/threads/m.py");
    let parallel = common::fixtures_dir().join("parallel_matmul/m.tar");
    let library = common::fixtures_dir().join("lib_mlp_static/m.tar");
    let llm = common::fixtures_dir().join("tiny_llama");
    let want = npz::read_arrays(&llm.join("generate.npz")).expect("generate.npz");
    let ids = |bytes: &[u8]| -> String {
        bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let (prompt, tokens) = (ids(&want["prompt"].2), ids(&want["tokens"].2));
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let m = common::mode_name(mode);
        let mut options = relaxc::compile::Options::mode(mode);
        options.script.kernels = vec![root.join("tests/threads/kernels.c")];
        let nested = common::build_with("threads_nested", &nested_source, &options, m).expect("build the nested model");
        run_host(
            &threads_test,
            &["--affine".as_ref(), "--registry".as_ref(), nested.as_os_str(), "64x64".as_ref()],
            &format!("nested launches ({m})"),
        );
        let mut options = relaxc::compile::Options::mode(mode);
        options.native.instrument = true;
        let instrumented =
            common::build_with("parallel_matmul", &parallel, &options, &format!("{m}.instrumented")).expect("build");
        let shapes: [&std::ffi::OsStr; 2] = ["128x128".as_ref(), "128x128".as_ref()];
        let mut args = vec!["--instrument".as_ref(), "--registry".as_ref(), instrumented.as_os_str()];
        args.extend(shapes);
        run_host(&threads_test, &args, &format!("pool, hooks and registry ({m})"));
        let lib = common::build("lib_mlp_static", &library, mode).expect("build");
        run_host(&threads_test, &[lib.as_os_str(), "2x4".as_ref()], &format!("kernel library ({m})"));
        let so = common::build("tiny_llama", &llm.join("m.tar"), mode).expect("build");
        run_host(
            &llm_test,
            &[so.as_os_str(), prompt.as_ref(), tokens.as_ref(), "4".as_ref()],
            &format!("four KV caches ({m})"),
        );
    }
}
