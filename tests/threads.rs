//! rvm.h's threading contract: one module shared by many threads, one VM per thread. Four
//! threads call the same model at once, in both modes, and every result equals TVM's.

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
