//! `relaxc run`: one function of a model on `.npz` inputs, here or under qemu for a model built
//! for another CPU, with checks against expected outputs, timing, storage statistics and the
//! per-callee profile of an instrumented model.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use relaxc::host::{Model, npz};

use super::{check_expected, describe, positive_count, refuse_overwriting};

#[derive(clap::Args)]
pub struct Args {
    /// A model built by `relaxc compile`.
    model: PathBuf,
    /// The Relax function to call.
    #[arg(long, default_value = "main")]
    func: String,
    /// Arguments: argN (or arr_N) tensors, argN.shape int64 1-D shape tuples, argN.prim 0-d scalars.
    #[arg(long)]
    inputs: Option<PathBuf>,
    /// Where to write the results (out0, out1, ...; tuples flattened depth-first).
    #[arg(long)]
    outputs: Option<PathBuf>,
    /// Check that the results equal the arrays in this .npz bit for bit (out0, out1, ...).
    #[arg(long)]
    expect: Option<PathBuf>,
    /// After warm-up calls, time N calls and print the median per-call latency.
    #[arg(long, value_name = "N", value_parser = positive_count)]
    bench: Option<usize>,
    /// Print storage statistics of the call (peak bytes held, allocations).
    #[arg(long)]
    stats: bool,
    /// Where to run: cpu, or cuda[:N] for a model with CUDA kernels (default: the model's).
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    /// After a warm-up call, profile N calls (default 10) and print a table per callee: calls,
    /// total and mean time, share of the call time, and the VM's own overhead (call time
    /// minus time in kernels). The model must be built with `relaxc compile --instrument`.
    /// stderr names the instruction-set path each family of library kernels takes
    /// (RELAXC_KERNEL_PATHS=report does that for any run).
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "10")]
    profile: Option<usize>,
    /// Write the profiled calls as a Chrome trace-event file (open it in ui.perfetto.dev or
    /// chrome://tracing): one slice per call of each callee. Implies --profile.
    #[arg(long, value_name = "FILE.json")]
    trace: Option<PathBuf>,
    /// Weights for a model exported with its weights as parameters: a tensor cache
    /// (a directory with tensor-cache.json or ndarray-cache.json and its shards), safetensors
    /// (a file, or a directory of shards) or GGUF (a .gguf file, for models built by
    /// `python -m relaxc.llm build`). Memory-mapped; each weight parameter is matched by name.
    #[arg(long, value_name = "PATH")]
    weights: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    let Args { model, func, inputs, outputs, expect, bench, stats, device, profile, trace, weights } = args;
    let device = device.map(|d| parse_device(&d)).transpose()?;
    let sources: Vec<&Path> =
        [Some(model.as_path()), inputs.as_deref(), expect.as_deref()].into_iter().flatten().collect();
    for (flag, out) in [("--outputs", &outputs), ("--trace", &trace)] {
        if let Some(out) = out {
            refuse_overwriting(flag, out, &sources)?;
        }
    }
    let profile = profile.or(trace.as_ref().map(|_| 10));
    if weights.is_some() && profile.is_some() {
        bail!("--profile does not take --weights yet");
    }
    if profile.is_some() && std::env::var_os("RELAXC_KERNEL_PATHS").is_none() {
        // The kernel library says which instruction-set path each family of kernels takes as it
        // decides (on stderr, beside the table). SAFETY: no other thread runs yet: the model,
        // and with it the runtime's pool, is loaded below.
        unsafe { std::env::set_var("RELAXC_KERNEL_PATHS", "report") };
    }
    let opts = RunOptions { func, inputs, outputs, expect, bench, stats, device, profile, trace, weights };
    run_model(&model, &opts)
}

fn parse_device(s: &str) -> Result<(i32, i32)> {
    match s.split_once(':') {
        None if s == "cpu" => Ok((1, 0)),
        None if s == "cuda" => Ok((2, 0)),
        Some(("cuda", n)) => Ok((2, n.parse().with_context(|| format!("--device {s}: bad device number"))?)),
        _ => bail!("--device {s}: expected cpu, cuda or cuda:N"),
    }
}

struct RunOptions {
    device: Option<(i32, i32)>,
    profile: Option<usize>,
    trace: Option<PathBuf>,
    func: String,
    inputs: Option<PathBuf>,
    outputs: Option<PathBuf>,
    expect: Option<PathBuf>,
    bench: Option<usize>,
    stats: bool,
    weights: Option<PathBuf>,
}

fn run_model(path: &Path, opts: &RunOptions) -> Result<()> {
    if let Some(target) = relaxc::host::foreign::foreign_target(path) {
        return run_foreign(path, &target, opts);
    }
    let RunOptions { func, inputs, outputs, expect, bench, stats, device, profile, trace, weights } = opts;
    let (func, bench, stats) = (func.as_str(), *bench, *stats);
    let model = Model::load(path)?;
    let Ok(f) = model.find(func) else {
        bail!("the model has no function {func:?} (its functions: {})", model.functions().join(", "));
    };
    let args = match inputs.as_deref() {
        Some(p) => npz::read_inputs(p)?,
        None => Vec::new(),
    };
    let mut vm = match device {
        Some((t, id)) => model.vm_on(*t, *id)?,
        None => model.vm()?,
    };
    let weights = weights.as_deref().map(|p| relaxc::host::external::Weights::load(&model, p)).transpose()?;
    let weight_args = match &weights {
        Some(w) => w.arguments(f, args.len())?,
        None => Vec::new(),
    };
    let prepared = vm.prepare(&args)?;
    let mut all = prepared.values().to_vec();
    all.extend_from_slice(&weight_args);
    let result = vm.call_values(f, &all).with_context(|| format!("calling {func}"))?;
    let flat = result.to_output().flatten();
    drop(result);
    if stats {
        let s = vm.stats();
        println!(
            "storage: peak {} bytes held at once, {} allocations ({} from the pool)",
            s.peak_storage_bytes, s.storage_allocations, s.pool_hits
        );
    }
    if let Some(want) = expect {
        check_expected(&flat, want)?;
        println!("results match {} bit for bit", want.display());
    }
    match outputs.as_deref() {
        Some(p) => npz::write_outputs(p, &flat)?,
        None => {
            for (i, o) in flat.iter().enumerate() {
                println!("out{i}: {}", describe(o));
            }
        }
    }
    if let Some(n) = profile {
        profile_calls(&model, &mut vm, f, func, &args, *n, trace.as_deref())?;
    }
    if let Some(n) = bench {
        if n == 0 {
            bail!("--bench needs at least one call");
        }
        // The runtime tries a short function's first 18 calls alone and on its thread pool,
        // then keeps the faster way: those calls are warm-up, not timed.
        let t = Instant::now();
        drop(vm.call_values(f, &all)?);
        if t.elapsed().as_secs_f64() < 20e-3 {
            for _ in 0..18 {
                drop(vm.call_values(f, &all)?);
            }
        }
        let t = Instant::now();
        drop(vm.call_values(f, &all)?);
        // Calls shorter than the clock resolves well are timed in groups of about 20 us (each
        // sample is a group's mean), so that a few nanoseconds of difference still show.
        let group = (20e-6 / t.elapsed().as_secs_f64().max(1e-9)).clamp(1.0, 1000.0) as usize;
        let samples = n.div_ceil(group);
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            let t = Instant::now();
            for _ in 0..group {
                drop(vm.call_values(f, &all)?);
            }
            times.push(t.elapsed().as_secs_f64() * 1e6 / group as f64);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let grouped = if group > 1 { format!(" (timed in groups of {group})") } else { String::new() };
        println!("{func}: median {:.4} us per call over {} calls{grouped}", times[samples / 2], samples * group);
    }
    Ok(())
}

/// `relaxc run` for a model built for another CPU: the same options and outputs, the call made by
/// a runner under qemu user mode.
fn run_foreign(path: &Path, target: &relaxc::target::Target, opts: &RunOptions) -> Result<()> {
    if opts.device.is_some() || opts.profile.is_some() {
        bail!("--device and --profile are not available for a {target} model run under qemu");
    }
    if opts.bench == Some(0) {
        bail!("--bench needs at least one call");
    }
    let args = match opts.inputs.as_deref() {
        Some(p) => npz::read_inputs(p)?,
        None => Vec::new(),
    };
    let run = relaxc::host::foreign::run(path, target, &opts.func, &args, opts.bench.unwrap_or(0), opts.stats)
        .with_context(|| format!("calling {}", opts.func))?;
    print!(
        "{}",
        run.stdout.lines().filter(|l| l.starts_with("storage:")).map(|l| format!("{l}\n")).collect::<String>()
    );
    if let Some(want) = &opts.expect {
        check_expected(&run.outputs, want)?;
        println!("results match {} bit for bit", want.display());
    }
    match opts.outputs.as_deref() {
        Some(p) => npz::write_outputs(p, &run.outputs)?,
        None => {
            for (i, o) in run.outputs.iter().enumerate() {
                println!("out{i}: {}", describe(o));
            }
        }
    }
    print!("{}", run.stdout.lines().filter(|l| l.contains("median")).map(|l| format!("{l}\n")).collect::<String>());
    Ok(())
}

/// Profiles `n` calls of `f` through the instrument hook and prints the per-callee table.
fn profile_calls(
    model: &Model,
    vm: &mut relaxc::host::Vm,
    f: i32,
    func: &str,
    args: &[relaxc::host::Input],
    n: usize,
    trace: Option<&Path>,
) -> Result<()> {
    use relaxc::host::profile::{Kind, Profiler, hook, trace_json};
    if n == 0 {
        bail!("--profile needs at least one call");
    }
    if !model.instrumented() {
        bail!("the model was built without --instrument: rebuild it with `relaxc compile --instrument` to profile it");
    }
    let prepared = vm.prepare(args)?;
    drop(vm.call_prepared(f, &prepared)?); // warm-up, not profiled
    let mut profiler = Profiler::new(trace.is_some());
    let mut calls = Vec::new();
    // SAFETY: hook is a safe call; the profiler outlives the calls (the hook is cleared below).
    unsafe { vm.set_instrument(Some(hook), profiler.as_self()) }?;
    let mut result = Ok(());
    for _ in 0..n {
        let start = Instant::now();
        let r = vm.call_prepared(f, &prepared);
        let end = Instant::now();
        match r {
            Ok(v) => drop(v),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        calls.push((format!("{func} (call)"), profiler.since_origin(start), end - start));
    }
    // SAFETY: clearing the hook.
    unsafe { vm.set_instrument(None, std::ptr::null_mut()) }?;
    result.with_context(|| format!("calling {func}"))?;
    profiler.finish();
    let total: std::time::Duration = calls.iter().map(|c| c.2).sum();
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    println!("profile of {func}: {n} calls, {:.1} us in all, {:.2} us per call", us(total), us(total) / n as f64);
    println!("| callee | kind | calls | total (us) | mean (us) | share of call time |");
    println!("|---|---|---|---|---|---|");
    for (name, s) in profiler.sorted() {
        println!(
            "| {name} | {} | {} | {:.2} | {:.3} | {:.1}% |",
            s.kind.name(),
            s.calls,
            us(s.total),
            us(s.total) / s.calls as f64,
            100.0 * us(s.total) / us(total).max(1e-9)
        );
    }
    let kernels = profiler.kernel_time();
    let overhead = total.saturating_sub(kernels);
    println!(
        "kernels: {:.2} us; VM overhead (call time - kernel time, builtins and the hook included): {:.2} us ({:.1}%)",
        us(kernels),
        us(overhead),
        100.0 * us(overhead) / us(total).max(1e-9)
    );
    let functions = profiler.stats.values().filter(|s| s.kind == Kind::Function).count();
    if functions > 0 {
        println!("(Relax functions' times include their callees'; kernel time counts each kernel once.)");
    }
    if let Some(path) = trace {
        let events = profiler.events.as_deref().unwrap_or(&[]);
        relaxc::outfile::write_bytes(path, trace_json(events, &calls).as_bytes(), false)?;
        println!(
            "trace: {} slices in {} (open it in ui.perfetto.dev or chrome://tracing)",
            events.len() + calls.len(),
            path.display()
        );
    }
    Ok(())
}
