//! Soak and scale, bounded for CI: a million calls per mode (half of them failing) with the
//! resident set flat, a thousand open/close cycles of one model, and eight different models
//! open at once, each called from two threads, every result checked against TVM's.

mod common;

use relaxc::codegen::ExecMode;
use relaxc::host::{Input, Model, npz};

/// Resident set size in bytes, from /proc/self/statm.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("resident pages");
    pages * 4096
}

/// RSS is the whole process's: the tests of this file run one at a time.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// RSS may not grow by more than this once warmed up (allocator and page-cache noise).
const RSS_SLACK: u64 = 4 << 20;

fn chain_1(mode: ExecMode) -> std::path::PathBuf {
    common::build("chain_1", &common::fixtures_dir().join("chain_1/m.tar"), mode).expect("build chain_1")
}

#[test]
fn a_million_calls_keep_memory_flat() {
    let _alone = alone();
    let inputs = npz::read_inputs(&common::fixtures_dir().join("chain_1/ok_basic.in.npz")).expect("inputs");
    let wrong = [Input::Int(3)];
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let model = Model::load(&chain_1(mode)).expect("load");
        let f = model.find("main").expect("main");
        let mut vm = model.vm().expect("vm");
        let good = vm.prepare(&inputs).expect("prepare");
        let bad = vm.prepare(&wrong).expect("prepare");
        let mut round = |n: usize| {
            for _ in 0..n {
                drop(vm.call_prepared(f, &good).expect("call"));
                assert!(vm.call_prepared(f, &bad).is_err(), "a call with a wrong argument succeeded");
            }
        };
        round(10_000);
        let before = rss();
        round(490_000);
        let after = rss();
        assert!(
            after <= before + RSS_SLACK,
            "{mode:?}: RSS grew from {before} to {after} bytes over 980,000 calls (half failing)"
        );
        eprintln!("{mode:?}: 1,000,000 calls, RSS {before} -> {after} bytes");
    }
}

#[test]
fn a_thousand_open_close_cycles_keep_memory_flat() {
    let _alone = alone();
    let so = chain_1(ExecMode::Compiled);
    let inputs = npz::read_inputs(&common::fixtures_dir().join("chain_1/ok_basic.in.npz")).expect("inputs");
    let cycle = || {
        let model = Model::load(&so).expect("load");
        let mut vm = model.vm().expect("vm");
        drop(vm.call(model.find("main").expect("main"), &inputs).expect("call"));
    };
    for _ in 0..50 {
        cycle();
    }
    let before = rss();
    for _ in 0..950 {
        cycle();
    }
    let after = rss();
    assert!(after <= before + RSS_SLACK, "RSS grew from {before} to {after} bytes over 950 open/close cycles");
}

#[test]
fn eight_models_at_once_each_from_two_threads() {
    let _alone = alone();
    let fixtures: Vec<common::Fixture> = common::fixtures()
        .into_iter()
        .filter(|f| !f.ok_cases.is_empty() && !f.dir.join(format!("ok_{}.out2.npz", f.ok_cases[0])).exists())
        .filter(|f| !["tiny_llama", "parallel_matmul"].contains(&f.name.as_str()))
        .take(8)
        .collect();
    assert_eq!(fixtures.len(), 8, "eight fixtures with a stateless ok case");
    let models: Vec<(usize, Model)> = fixtures
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mode = if i % 2 == 0 { ExecMode::Bytecode } else { ExecMode::Compiled };
            (i, Model::load(&f.build(mode).expect("build")).expect("load"))
        })
        .collect();
    std::thread::scope(|scope| {
        for (i, model) in &models {
            let fixture = &fixtures[*i];
            for _ in 0..2 {
                scope.spawn(move || {
                    let case = &fixture.ok_cases[0];
                    let inputs = npz::read_inputs(&fixture.dir.join(format!("ok_{case}.in.npz"))).expect("inputs");
                    let expected = fixture.dir.join(format!("ok_{case}.out.npz"));
                    let mut vm = model.vm().expect("vm");
                    let f = model.find("main").expect("main");
                    for _ in 0..200 {
                        let out = vm.call(f, &inputs).expect("call").to_output().flatten();
                        common::compare_outputs(&out, &expected).unwrap_or_else(|e| panic!("{}: {e}", fixture.name));
                    }
                });
            }
        }
    });
}
