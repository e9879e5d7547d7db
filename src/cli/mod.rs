//! The commands of the relaxc binary, one module each: a command's `Args` (its options, with
//! the help text `relaxc CMD --help` prints) and its `run`. What several commands share lives
//! here: the target option, the refusal to overwrite an input, `.npz` checks and descriptions.

pub mod compile;
pub mod generate;
pub mod inspect;
pub mod kernel_library;
pub mod out_of_memory;
pub mod rpc_server;
pub mod run;

use std::path::Path;

use anyhow::{Context, Result, bail};

use relaxc::host::npz;

/// The CPU `--target` names, or this machine's.
pub fn target_or_host(target: Option<String>) -> Result<relaxc::target::Target> {
    Ok(match target {
        Some(t) => relaxc::target::Target::parse(&t)?,
        None => relaxc::target::Target::host(),
    })
}

/// Refuses an output path that names one of the inputs, before anything is written.
pub fn refuse_overwriting(flag: &str, output: &Path, inputs: &[&Path]) -> Result<()> {
    let Ok(out) = std::fs::canonicalize(output) else { return Ok(()) }; // a new file
    for input in inputs {
        if std::fs::canonicalize(input).is_ok_and(|i| i == out) {
            bail!("{flag} {} is also an input: refusing to overwrite it", output.display());
        }
    }
    Ok(())
}

/// `--bench N` takes N >= 1.
pub fn positive_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

pub fn check_expected(results: &[relaxc::host::Output], path: &Path) -> Result<()> {
    let want = npz::read_arrays(path)?;
    if want.len() != results.len() {
        bail!("{} results, but {} has {} arrays", results.len(), path.display(), want.len());
    }
    for (i, r) in results.iter().enumerate() {
        let key = format!("out{i}");
        let got = npz::output_array(r).map_err(anyhow::Error::msg).with_context(|| key.clone())?;
        let Some(w) = want.get(&key) else { bail!("{} has no {key}", path.display()) };
        if (&got.0, &got.1) != (&w.0, &w.1) {
            bail!("{key}: got {} {:?}, expected {} {:?}", got.0, got.1, w.0, w.1);
        }
        if got.2 != w.2 {
            let at = got.2.iter().zip(&w.2).position(|(a, b)| a != b).unwrap_or(0);
            bail!("{key}: values differ (first difference at byte {at})");
        }
    }
    Ok(())
}

pub fn describe(o: &relaxc::host::Output) -> String {
    use relaxc::host::Output;
    match o {
        Output::Tensor { dtype, shape, data } => format!(
            "tensor shape {:?} dtype (code {}, bits {}, lanes {}), {} bytes",
            shape,
            dtype.code,
            dtype.bits,
            dtype.lanes,
            data.len()
        ),
        Output::Shape(d) => format!("shape {d:?}"),
        Output::Int(v) => format!("int {v}"),
        Output::Bool(v) => format!("bool {v}"),
        Output::Float(v) => format!("float {v}"),
        Output::Tuple(_) => "tuple".into(),
        Output::Other(t) => format!("{t} (not representable in .npz)"),
    }
}
