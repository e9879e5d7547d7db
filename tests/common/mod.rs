//! Helpers shared by the integration tests: the fixture corpus, building models once per test
//! binary, and comparing results with TVM's recorded outputs and errors.
#![allow(dead_code)] // each test binary uses a different part

pub mod random;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use relaxc::codegen::ExecMode;
use relaxc::host::{HostError, Output, npz};

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixtures_dir() -> PathBuf {
    root().join("fixtures/tvm")
}

/// Where built models go (kept between runs, rebuilt by every run).
pub fn scratch_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("relaxc-tests");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

pub struct Fixture {
    pub name: String,
    pub dir: PathBuf,
    pub ok_cases: Vec<String>,
    pub fail_cases: Vec<String>,
}

impl Fixture {
    pub fn tar(&self) -> PathBuf {
        self.dir.join("m.tar")
    }
}

/// Every TVM fixture, with its input cases.
pub fn fixtures() -> Vec<Fixture> {
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .expect("fixtures/tvm")
        .filter_map(|e| e.ok().map(|e| e.path()))
        // The LLM fixtures have no `main`; tests/llm.rs drives them.
        .filter(|p| p.join("m.tar").exists() && !p.join("scenarios.json").exists())
        .collect();
    dirs.sort();
    for dir in dirs {
        let mut ok_cases = Vec::new();
        let mut fail_cases = Vec::new();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .expect("fixture dir")
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        for n in names {
            if let Some(case) = n.strip_prefix("ok_").and_then(|c| c.strip_suffix(".in.npz")) {
                ok_cases.push(case.to_string());
            }
            if let Some(case) = n.strip_prefix("fail_").and_then(|c| c.strip_suffix(".in.npz")) {
                fail_cases.push(case.to_string());
            }
        }
        let name = dir.file_name().expect("name").to_string_lossy().into_owned();
        out.push(Fixture { name, dir, ok_cases, fail_cases });
    }
    out
}

pub fn mode_name(mode: ExecMode) -> &'static str {
    match mode {
        ExecMode::Bytecode => "bytecode",
        ExecMode::Compiled => "compiled",
    }
}

type BuildCell = Arc<OnceLock<Result<PathBuf, String>>>;

/// Builds `tar` in `mode` once per test binary; concurrent callers wait for the same build.
pub fn build(name: &str, tar: &Path, mode: ExecMode) -> Result<PathBuf, String> {
    build_with(name, tar, &relaxc::compile::Options::mode(mode), mode_name(mode))
}

/// Builds `tar` with `options` once per (name, tag) per test binary.
pub fn build_with(name: &str, tar: &Path, options: &relaxc::compile::Options, tag: &str) -> Result<PathBuf, String> {
    static CACHE: OnceLock<Mutex<HashMap<(String, String), BuildCell>>> = OnceLock::new();
    let cell = {
        let mut map = CACHE.get_or_init(Default::default).lock().expect("build cache");
        map.entry((name.to_string(), tag.to_string())).or_default().clone()
    };
    cell.get_or_init(|| {
        let out = scratch_dir().join(format!("{name}.{tag}.{}.so", std::process::id()));
        relaxc::compile::compile_file_with(tar, options, &out).map_err(|e| format!("{e}"))?;
        Ok(out)
    })
    .clone()
}

/// A copy of a built model under a new name, so that loading it gives a library of its own (its
/// writable constants untouched by other loads of the original).
pub fn private_copy(so: &Path) -> Result<PathBuf, String> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let copy = so.with_extension(format!("private{n}.so"));
    std::fs::copy(so, &copy).map_err(|e| format!("copying {}: {e}", so.display()))?;
    Ok(copy)
}

/// Results equal TVM's recorded ones: same names, dtypes, shapes and bytes.
pub fn compare_outputs(outputs: &[Output], expected: &Path) -> Result<(), String> {
    let want = npz::read_arrays(expected).map_err(|e| e.to_string())?;
    if outputs.len() != want.len() {
        return Err(format!("{} results, TVM gave {}", outputs.len(), want.len()));
    }
    for (i, out) in outputs.iter().enumerate() {
        let key = format!("out{i}");
        let (dtype, shape, data) = npz::output_array(out).map_err(|e| format!("{key}: {e}"))?;
        let (wdtype, wshape, wdata) = want.get(&key).ok_or_else(|| format!("TVM has no {key}"))?;
        if dtype != *wdtype || shape != *wshape {
            return Err(format!("{key}: got {dtype} {shape:?}, TVM gave {wdtype} {wshape:?}"));
        }
        if data != *wdata {
            let first = data.iter().zip(wdata).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("{key}: bytes differ from TVM's (first at byte {first})"));
        }
    }
    Ok(())
}

/// Strips relaxc's location prefix ("in main at pc 3 (callee): ").
pub fn strip_location(message: &str) -> &str {
    match message.find("): ") {
        Some(at) if message.starts_with("in ") => &message[at + 3..],
        _ => message,
    }
}

/// The error matches TVM's recorded one: same kind (TVM's InternalError excepted, where relaxc
/// reports what the user did wrong), and the same message, or TVM's message is ours behind
/// TVM's C++ "Check failed: ... : " preamble.
pub fn check_error(err: &HostError, expected: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(expected).map_err(|e| e.to_string())?;
    let (want_kind, want_msg) = text.split_once('\n').unwrap_or((text.as_str(), ""));
    let want_msg = want_msg.strip_suffix('\n').unwrap_or(want_msg);
    let HostError::Call { kind, message } = err else {
        return Err(format!("expected a call error, got: {err}"));
    };
    if want_kind != "InternalError" && kind != want_kind {
        return Err(format!("error kind {kind}, TVM raised {want_kind} ({message})"));
    }
    let ours = strip_location(message);
    if ours != want_msg && !want_msg.ends_with(&format!(": {ours}")) {
        return Err(format!("message differs:\n  relaxc: {ours}\n  TVM:    {want_msg}"));
    }
    Ok(())
}

/// Builds `tests/c/NAME.c`, a C host of the model API, with the project's warning flags.
pub fn build_c_host(name: &str) -> PathBuf {
    let exe = scratch_dir().join(format!("{name}.{}", std::process::id()));
    let status = std::process::Command::new(relaxc::link::linker())
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .arg("-I")
        .arg(root().join("runtime-shim/include"))
        .arg(root().join(format!("tests/c/{name}.c")))
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "{name}.c does not build");
    exe
}
