//! The kernel library on whole models (fixtures/tvm/lib_*: ONNX and TVMScript models built with
//! relaxc.tvm.build; quant_*: with its dense layers quantized): every case at 1, 2 and 3 threads of
//! the runtime's pool, in both modes, gives the bits TVM's VM gave on the same kernels (what
//! differential.rs checks at the default thread count), and those are within 1e-4 of TVM's
//! default kernels on the same model (quantized models: within the format's error).
//!
//! The thread count is read once per process, so each run is a `relaxc run` of its own.

mod common;

use std::path::Path;
use std::process::Command;

use libtest_mimic::{Arguments, Failed, Trial};
use relaxc::codegen::ExecMode;
use relaxc::host::npz;

/// Fixtures of the kernel library: those that record TVM's default kernels' outputs too.
fn library_fixtures() -> Vec<common::Fixture> {
    common::fixtures().into_iter().filter(|f| f.name.starts_with("lib_") || f.name.starts_with("quant_")).collect()
}

/// How far a fixture's results may be from TVM's default kernels on the float model, relative to
/// the largest output: float32 kernels round differently; quantized weights are that far off.
fn tolerance_of(name: &str) -> f32 {
    match name {
        n if n.ends_with("q6_K") => 5e-2,
        n if n.starts_with("quant_") => 2e-1,
        _ => 1e-4,
    }
}

fn run_at(so: &Path, inputs: &Path, out: &Path, threads: usize) -> Result<(), Failed> {
    let done = Command::new(env!("CARGO_BIN_EXE_relaxc"))
        .arg("run")
        .arg(so)
        .arg("--inputs")
        .arg(inputs)
        .arg("--outputs")
        .arg(out)
        .env("TVM_NUM_THREADS", threads.to_string())
        .env_remove("OMP_NUM_THREADS")
        .output()?;
    if !done.status.success() {
        return Err(format!("relaxc run at {threads} threads: {}", String::from_utf8_lossy(&done.stderr)).into());
    }
    Ok(())
}

/// Same arrays, byte for byte.
fn same_bytes(got: &Path, want: &Path) -> Result<(), String> {
    let got = npz::read_arrays(got).map_err(|e| e.to_string())?;
    let want = npz::read_arrays(want).map_err(|e| e.to_string())?;
    if got.len() != want.len() {
        return Err(format!("{} results, TVM gave {}", got.len(), want.len()));
    }
    for (key, (dtype, shape, data)) in &want {
        let Some((gdtype, gshape, gdata)) = got.get(key) else {
            return Err(format!("no {key}"));
        };
        if gdtype != dtype || gshape != shape {
            return Err(format!("{key}: {gdtype} {gshape:?}, TVM gave {dtype} {shape:?}"));
        }
        if gdata != data {
            let first = gdata.iter().zip(data).position(|(a, b)| a != b).unwrap_or(0) / 4;
            return Err(format!("{key}: differs from TVM's at element {first}"));
        }
    }
    Ok(())
}

fn threads_case(fixture: &common::Fixture, case: &str, mode: ExecMode) -> Result<(), Failed> {
    let so = fixture.build(mode)?;
    let inputs = fixture.dir.join(format!("ok_{case}.in.npz"));
    let want = fixture.dir.join(format!("ok_{case}.out.npz"));
    for threads in [1, 2, 3] {
        let out = common::scratch_dir().join(format!(
            "{}.{case}.{}.t{threads}.{}.npz",
            fixture.name,
            common::mode_name(mode),
            std::process::id()
        ));
        run_at(&so, &inputs, &out, threads)?;
        let checked = same_bytes(&out, &want).map_err(|e| format!("at {threads} threads: {e}"));
        let _ = std::fs::remove_file(&out);
        checked?;
    }
    Ok(())
}

fn f32s(data: &[u8]) -> Vec<f32> {
    data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// The library's results (TVM's VM on its kernels) against TVM's default kernels.
fn tolerance_case(fixture: &common::Fixture, case: &str) -> Result<(), Failed> {
    let got = npz::read_arrays(&fixture.dir.join(format!("ok_{case}.out.npz")))?;
    let want = npz::read_arrays(&fixture.dir.join(format!("ok_{case}.tvm.npz")))?;
    for (key, (dtype, shape, data)) in &want {
        let (gdtype, gshape, gdata) = got.get(key).ok_or_else(|| format!("no {key}"))?;
        if gdtype != dtype || gshape != shape {
            return Err(format!("{key}: {gdtype} {gshape:?} against {dtype} {shape:?}").into());
        }
        if dtype != "<f4" {
            if gdata != data {
                return Err(format!("{key} ({dtype}) differs from TVM's default kernels").into());
            }
            continue;
        }
        let (g, w) = (f32s(gdata), f32s(data));
        let scale = w.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max) / scale;
        if worst.is_nan() || worst > tolerance_of(&fixture.name) {
            return Err(format!("{key}: {worst:.2e} from TVM's default kernels (relative to {scale})").into());
        }
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for fixture in library_fixtures() {
        for case in fixture.ok_cases.clone() {
            for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
                let (f, c) = (fixture.clone(), case.clone());
                let name = format!("{}::{case}::{}::threads_1_2_3", fixture.name, common::mode_name(mode));
                trials.push(Trial::test(name, move || threads_case(&f, &c, mode)));
            }
            let (f, c) = (fixture.clone(), case.clone());
            let within = format!("{}::{case}::within_{:e}_of_tvm", fixture.name, tolerance_of(&fixture.name));
            trials.push(Trial::test(within, move || tolerance_case(&f, &c)));
        }
    }
    assert!(!trials.is_empty(), "no fixtures/tvm/lib_* fixtures");
    libtest_mimic::run(&args, trials).exit();
}
