//! The differential harness: every fixture, every input set, in every execution mode, against
//! TVM's recorded outputs and errors. Trials are named `<fixture>::<case>::<mode>`, so
//! `cargo test --test differential -- mlp_static` selects one fixture.

mod common;

use std::sync::OnceLock;

use libtest_mimic::{Arguments, Failed, Trial};
use relaxc::abi::DLDataType;
use relaxc::codegen::ExecMode;
use relaxc::host::{HostTensor, Input, Model, Output, npz};

fn run_case(fixture: &common::Fixture, case: &str, ok: bool, mode: ExecMode) -> Result<(), Failed> {
    let so = fixture.build(mode)?;
    let second = fixture.dir.join(format!("ok_{case}.out2.npz"));
    if ok && second.exists() {
        return stateful_case(fixture, case, &so, &second);
    }
    let model = Model::load(&so)?;
    let prefix = if ok { "ok" } else { "fail" };
    let inputs = npz::read_inputs(&fixture.dir.join(format!("{prefix}_{case}.in.npz")))?;
    let main = model.find("main")?;
    let mut vm = model.vm()?;
    let result = vm.call(main, &inputs);
    if ok {
        let outputs = result?.to_output().flatten();
        fixture.check_outputs(&outputs, case)?;
        // A second call on the same VM reuses pooled storage and must give the same bytes.
        let again = vm.call(main, &inputs)?.to_output().flatten();
        if again != outputs {
            return Err("a second call gave different results".into());
        }
        if mode != ExecMode::Bytecode {
            let reference = bytecode_outputs(fixture, &format!("ok_{case}"))?;
            if reference != outputs {
                return Err("results differ from bytecode mode's".into());
            }
        }
    } else {
        match result {
            Ok(_) => return Err(format!("{case}: the call succeeded; TVM rejected it").into()),
            Err(e) => {
                common::check_error(&e, &fixture.dir.join(format!("fail_{case}.err")))?;
                if mode != ExecMode::Bytecode {
                    let reference = bytecode_error(fixture, case)?;
                    if reference != e.to_string() {
                        return Err(format!("error differs from bytecode mode's:\n  {e}\n  {reference}").into());
                    }
                }
            }
        }
    }
    Ok(())
}

/// A model whose kernels write its constants: the first call gives TVM's first outputs and a
/// second call in the same process TVM's second ones. The library is loaded from a private copy,
/// so that no other trial's calls have changed its constants.
fn stateful_case(
    fixture: &common::Fixture,
    case: &str,
    so: &std::path::Path,
    second: &std::path::Path,
) -> Result<(), Failed> {
    let private = common::private_copy(so)?;
    let model = Model::load(&private)?;
    let inputs = npz::read_inputs(&fixture.dir.join(format!("ok_{case}.in.npz")))?;
    let main = model.find("main")?;
    let mut vm = model.vm()?;
    let first = vm.call(main, &inputs)?.to_output().flatten();
    common::compare_outputs(&first, &fixture.dir.join(format!("ok_{case}.out.npz")))
        .map_err(|e| format!("first call: {e}"))?;
    let again = vm.call(main, &inputs)?.to_output().flatten();
    common::compare_outputs(&again, second).map_err(|e| format!("second call: {e}"))?;
    Ok(())
}

fn bytecode_outputs(fixture: &common::Fixture, input: &str) -> Result<Vec<relaxc::host::Output>, Failed> {
    let so = fixture.build(ExecMode::Bytecode)?;
    let model = Model::load(&so)?;
    let inputs = npz::read_inputs(&fixture.dir.join(format!("{input}.in.npz")))?;
    let mut vm = model.vm()?;
    Ok(vm.call(model.find("main")?, &inputs)?.to_output().flatten())
}

fn bytecode_error(fixture: &common::Fixture, case: &str) -> Result<String, Failed> {
    let so = fixture.build(ExecMode::Bytecode)?;
    let model = Model::load(&so)?;
    let inputs = npz::read_inputs(&fixture.dir.join(format!("fail_{case}.in.npz")))?;
    let mut vm = model.vm()?;
    match vm.call(model.find("main")?, &inputs) {
        Ok(_) => Err("bytecode mode accepted the input".into()),
        Err(e) => Ok(e.to_string()),
    }
}

fn inspect_matches_tvm(fixture: &common::Fixture) -> Result<(), Failed> {
    let expected = std::fs::read_to_string(fixture.dir.join("as_text.txt"))?
        + &std::fs::read_to_string(fixture.dir.join("stats.txt"))?;
    let exec = relaxc::inspect::load_executable(&fixture.tar())?;
    let got = exec.as_text() + &exec.stats();
    if got != expected {
        return Err(
            format!("listing differs from TVM's as_text()/stats():\n--- TVM\n{expected}\n--- relaxc\n{got}").into()
        );
    }
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let so = common::build(&fixture.name, &fixture.tar(), mode)?;
        let from_so = relaxc::inspect::load_executable(&so)?;
        if from_so != exec {
            return Err("the executable embedded in the .so differs from the imported one".into());
        }
    }
    Ok(())
}

/// The random programs, built once per mode into one model each.
struct RandomModels {
    mains: Vec<String>,
    models: Vec<(ExecMode, Model)>,
    /// The loops compiled mode rolled repeated runs into.
    loops: Vec<relaxc::codegen::native::RolledLoop>,
}

fn random_models(seed: u64, count: usize) -> Result<&'static RandomModels, String> {
    static MODELS: OnceLock<Result<RandomModels, String>> = OnceLock::new();
    MODELS
        .get_or_init(|| {
            let batch = common::random::generate(seed, count);
            relaxc::vm::verify(&batch.exec).map_err(|e| format!("the generator made an invalid program: {e}"))?;
            let kernels = relaxc::kernels::compile_c_host(&common::root().join("tests/kernels/random_kernels.c"))
                .map_err(|e| e.to_string())?;
            let program = relaxc::compile::Program {
                exec: relaxc::vm::Verified::new(batch.exec).map_err(|e| e.to_string())?,
                kernels: vec![kernels],
                shape_funcs: Vec::new(),
                cuda: Vec::new(),
            };
            let mut models = Vec::new();
            let mut loops = Vec::new();
            for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
                let (so, rolled) = common::link_program_with(&format!("random.{seed}"), &program, mode)?;
                models.push((mode, Model::load(&so).map_err(|e| e.to_string())?));
                loops.extend(rolled);
            }
            Ok(RandomModels { mains: batch.mains, models, loops })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// One random program: identical results (or identical errors) in every mode, and every byte of
/// storage back in the pool once the result is released.
fn random_trial(seed: u64, count: usize, index: usize) -> Result<(), Failed> {
    let models = random_models(seed, count)?;
    let name = &models.mains[index];
    let x: Vec<u8> = [0.5f32, -1.25, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let inputs =
        [Input::Tensor(HostTensor::new(DLDataType { code: 2, bits: 32, lanes: 1 }, vec![4], &x)), Input::Int(2)];
    let mut seen: Vec<(ExecMode, Result<Vec<Output>, String>)> = Vec::new();
    for (mode, model) in &models.models {
        let mut vm = model.vm()?;
        let outcome = vm.call(model.find(name)?, &inputs).map(|v| v.to_output().flatten()).map_err(|e| e.to_string());
        let live = vm.stats().live_storage_bytes;
        if live != 0 {
            return Err(format!(
                "{name} ({}): {live} bytes of storage still held after the result was released",
                common::mode_name(*mode)
            )
            .into());
        }
        seen.push((*mode, outcome));
    }
    let (first_mode, first) = &seen[0];
    for (mode, other) in &seen[1..] {
        if other != first {
            return Err(format!(
                "{name}: {} and {} disagree:\n  {first:?}\n  {other:?}",
                common::mode_name(*first_mode),
                common::mode_name(*mode)
            )
            .into());
        }
    }
    Ok(())
}

/// The random programs exercise compiled mode's rolled loops: some runs became loops, and some
/// program fails inside one after its first time through, where the pc it reports is computed
/// from the loop's counter (and the differential trials check it against bytecode's).
fn rolled_loops_covered(seed: u64, count: usize) -> Result<(), Failed> {
    let models = random_models(seed, count)?;
    if models.loops.is_empty() {
        return Err("compiled mode rolled no run of the random programs into a loop".into());
    }
    let (_, compiled) =
        models.models.iter().find(|(mode, _)| *mode == ExecMode::Compiled).ok_or("no compiled model")?;
    let x: Vec<u8> = [0.5f32, -1.25, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let inputs =
        [Input::Tensor(HostTensor::new(DLDataType { code: 2, bits: 32, lanes: 1 }, vec![4], &x)), Input::Int(2)];
    let mut deep_failures = 0;
    for name in &models.mains {
        let mut vm = compiled.vm()?;
        let Err(e) = vm.call(compiled.find(name)?, &inputs) else { continue };
        let message = e.to_string();
        let Some(pc) = message.split(&format!("in {name} at pc ")).nth(1).and_then(|rest| {
            rest.split(|c: char| !c.is_ascii_digit()).next().and_then(|digits| digits.parse::<usize>().ok())
        }) else {
            continue;
        };
        let later_time = |l: &&relaxc::codegen::native::RolledLoop| {
            l.function == *name && pc >= l.pcs.start + l.period && pc < l.pcs.end
        };
        deep_failures += models.loops.iter().filter(later_time).count();
    }
    if deep_failures == 0 {
        return Err(format!(
            "{} rolled loops, but no random program fails inside one after its first time through",
            models.loops.len()
        )
        .into());
    }
    Ok(())
}

fn relax_function_names(fixture: &common::Fixture) -> Vec<String> {
    let exec = relaxc::inspect::load_executable(&fixture.tar()).expect("fixture imports");
    exec.funcs.iter().filter(|f| f.kind != relaxc::vm::FuncKind::Packed).map(|f| f.name.clone()).collect()
}

/// A mixed-mode build gives the same bytes as TVM, and the functions run as asked.
fn mixed_case(fixture: &common::Fixture, case: &str, tag: &str, keep: Vec<String>) -> Result<(), Failed> {
    if fixture.dir.join(format!("ok_{case}.out2.npz")).exists() {
        return Ok(()); // stateful: covered by stateful_case
    }
    let native =
        relaxc::codegen::native::NativeOptions { keep_bytecode: keep.iter().cloned().collect(), ..Default::default() };
    let options = relaxc::compile::Options { native, ..relaxc::compile::Options::mode(ExecMode::Compiled) };
    let so = common::build_with(&fixture.name, &fixture.tar(), &options, tag)?;
    let modes = relaxc::inspect::function_modes(&so)?.ok_or("no modes section")?;
    for (name, compiled) in &modes {
        if *compiled == keep.contains(name) {
            return Err(format!("{name} runs {}", if *compiled { "compiled" } else { "as bytecode" }).into());
        }
    }
    let model = Model::load(&so)?;
    let inputs = npz::read_inputs(&fixture.dir.join(format!("ok_{case}.in.npz")))?;
    let mut vm = model.vm()?;
    let outputs = vm.call(model.find("main")?, &inputs)?.to_output().flatten();
    fixture.check_outputs(&outputs, case)?;
    Ok(())
}

/// A trial per case and mode: `<prefix><fixture>::<case>::<mode>`, fail cases as `fail_<case>`.
fn case_trials(trials: &mut Vec<Trial>, fixture: std::sync::Arc<common::Fixture>, prefix: &str) {
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let cases = fixture
            .ok_cases
            .iter()
            .map(|c| (c.clone(), true))
            .chain(fixture.fail_cases.iter().map(|c| (format!("fail_{c}"), false)));
        for (label, ok) in cases {
            let f = fixture.clone();
            let case = label.trim_start_matches("fail_").to_string();
            let name = format!("{prefix}{}::{label}::{}", fixture.name, common::mode_name(mode));
            trials.push(Trial::test(name, move || run_case(&f, &case, ok, mode)));
        }
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    let seed = env_number("RELAXC_DIFF_SEED", 20261121);
    let count = env_number("RELAXC_DIFF_COUNT", 2000) as usize;
    for fixture in common::script_fixtures() {
        case_trials(&mut trials, std::sync::Arc::new(fixture), "script::");
    }
    for index in 0..count {
        trials.push(Trial::test(format!("random::seed{seed}::p{index}"), move || random_trial(seed, count, index)));
    }
    trials.push(Trial::test(format!("random::seed{seed}::rolled_loops"), move || rolled_loops_covered(seed, count)));
    for fixture in common::fixtures() {
        let fixture = std::sync::Arc::new(fixture);
        case_trials(&mut trials, fixture.clone(), "");
        let f = fixture.clone();
        trials.push(Trial::test(format!("{}::inspect", fixture.name), move || inspect_matches_tvm(&f)));
        // Mixed mode, both ways: main native calling bytecode functions, and the reverse.
        let relax_functions = relax_function_names(&fixture);
        if relax_functions.len() > 1 {
            for (tag, keep) in [
                ("mixed-main-bytecode", vec!["main".to_string()]),
                ("mixed-main-native", relax_functions.iter().filter(|n| *n != "main").cloned().collect()),
            ] {
                for case in fixture.ok_cases.clone() {
                    let (f, keep) = (fixture.clone(), keep.clone());
                    let name = format!("{}::{case}::{tag}", fixture.name);
                    trials.push(Trial::test(name, move || mixed_case(&f, &case, tag, keep)));
                }
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
