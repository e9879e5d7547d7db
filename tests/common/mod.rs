//! Helpers shared by the integration tests: the fixture corpus, building models once per test
//! binary, and comparing results with TVM's recorded outputs and errors.
#![allow(dead_code)] // each test binary uses a different part

pub mod random;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use relaxc::codegen::ExecMode;
use relaxc::host::{HostError, Output, npz};

/// Pins the kernel library to its AVX2 kernels on x86-64, as the fixtures' generators do
/// (fixtures/gguf/generate.py, fixtures/tvm/generate_library.py): a few kernels give other bits
/// on AVX-512 (relaxc.dense_q's f32 and f16 tiles take activation rows 4 at a time there, 2 on
/// AVX2; llama.cpp's AVX-512 forms round as its own AVX-512 build does), so a recording holds on
/// every x86-64 CPU only with one instruction set. The AVX-512 kernels have tests of their own.
/// Call first thing in main, before any thread starts.
pub fn pin_recorded_kernels() {
    if cfg!(target_arch = "x86_64") {
        // SAFETY: main calls this before it starts any thread.
        unsafe {
            std::env::set_var("RELAXC_QUANT_ISA", "avx2");
            std::env::set_var("RELAXC_GEMM_AVX512", "0");
        }
    }
}

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

/// A model with inputs and TVM's results: a TVM export (`fixtures/tvm/<name>/m.tar`) or a
/// TVMScript program relaxc compiles itself (`fixtures/script/<name>/m.py`, with the shared
/// `kernels.c` and its `w.safetensors` if any).
#[derive(Clone)]
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

    pub fn is_script(&self) -> bool {
        self.dir.join("m.py").exists()
    }

    /// The model's source: its `m.py` or its `m.tar`.
    pub fn source(&self) -> PathBuf {
        if self.is_script() { self.dir.join("m.py") } else { self.tar() }
    }

    /// Compile options for `mode`: a script's kernels and weights come along.
    pub fn options(&self, mode: ExecMode) -> relaxc::compile::Options {
        let mut options = relaxc::compile::Options::mode(mode);
        if self.is_script() {
            options.script.kernels = vec![root().join("fixtures/script/kernels.c")];
            let weights = self.dir.join("w.safetensors");
            options.script.params = weights.exists().then_some(weights);
        }
        options
    }

    /// The model built in `mode`, once per test binary.
    pub fn build(&self, mode: ExecMode) -> Result<PathBuf, String> {
        let name = if self.is_script() { format!("script_{}", self.name) } else { self.name.clone() };
        build_with(&name, &self.source(), &self.options(mode), mode_name(mode))
    }
}

/// The entries of `dir`, sorted by name.
pub fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    out.sort();
    out
}

/// The files of `dir` whose names end in `.<ext>`, sorted.
pub fn files_with_extension(dir: &Path, ext: &str) -> Vec<PathBuf> {
    entries(dir).into_iter().filter(|p| p.extension().is_some_and(|e| e == ext)).collect()
}

/// The fixtures under `root`: its folders that hold `marker`, with their `ok_<case>.in.npz` and
/// `fail_<case>.in.npz` cases.
fn fixtures_in(root: &Path, marker: &str) -> Vec<Fixture> {
    let mut out = Vec::new();
    for dir in entries(root).into_iter().filter(|d| d.join(marker).exists()) {
        let mut ok_cases = Vec::new();
        let mut fail_cases = Vec::new();
        for path in entries(&dir) {
            let n = path.file_name().expect("name").to_string_lossy().into_owned();
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

/// Every TVM fixture with a `main` (the LLM fixtures have none; tests/llm.rs drives them).
pub fn fixtures() -> Vec<Fixture> {
    fixtures_in(&fixtures_dir(), "m.tar")
        .into_iter()
        .filter(|f| !f.dir.join("scenarios.json").exists() && !f.dir.join("generate.npz").exists())
        .collect()
}

/// Every TVMScript fixture.
pub fn script_fixtures() -> Vec<Fixture> {
    fixtures_in(&root().join("fixtures/script"), "m.py")
}

/// The TVM exports TVM built for `cpu` (`fixtures/tvm-cross/<cpu>`), by fixture name.
pub fn cross_exports(cpu: &str) -> Vec<String> {
    entries(&root().join("fixtures/tvm-cross").join(cpu))
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(String::from))
        .collect()
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

/// Compiles and links a program made in a test (random programs, ExecBuilder programs) in `mode`
/// into the scratch directory as `<name>.<mode>.<pid>.so`.
pub fn link_program(name: &str, program: &relaxc::compile::Program, mode: ExecMode) -> Result<PathBuf, String> {
    link_program_with(name, program, mode).map(|(so, _)| so)
}

/// [`link_program`], also returning the loops compiled mode rolled repeated runs into.
pub fn link_program_with(
    name: &str,
    program: &relaxc::compile::Program,
    mode: ExecMode,
) -> Result<(PathBuf, Vec<relaxc::codegen::native::RolledLoop>), String> {
    let object = relaxc::compile::emit(program, &relaxc::compile::Options::mode(mode)).map_err(|e| e.to_string())?;
    let so = scratch_dir().join(format!("{name}.{}.{}.so", mode_name(mode), std::process::id()));
    relaxc::link::link_shared(&object.link_inputs(&program.kernels), &so).map_err(|e| e.to_string())?;
    Ok((so, object.loops))
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

impl Fixture {
    /// How far results may be from TVM's, relative to each output's largest magnitude: a
    /// `tolerance` file holds it for fixtures whose operators TVM runs on its own kernels and
    /// relaxc on its kernel library (fixtures/script/ops); none means bit for bit.
    pub fn tolerance(&self) -> Option<f64> {
        let text = std::fs::read_to_string(self.dir.join("tolerance")).ok()?;
        Some(text.trim().parse().unwrap_or_else(|_| panic!("{}: tolerance is not a number", self.name)))
    }

    /// The results of case `case` against TVM's: bit for bit, or within the fixture's tolerance.
    pub fn check_outputs(&self, outputs: &[Output], case: &str) -> Result<(), String> {
        let expected = self.dir.join(format!("ok_{case}.out.npz"));
        match self.tolerance() {
            Some(tolerance) => compare_outputs_within(outputs, &expected, tolerance),
            None => compare_outputs(outputs, &expected),
        }
    }
}

/// Each result against TVM's recorded array of the same name, after checking the names, dtypes
/// and shapes agree: `same(key, dtype, got, want)` judges the bytes.
fn compare_arrays(
    outputs: &[Output],
    expected: &Path,
    same: impl Fn(&str, &str, &[u8], &[u8]) -> Result<(), String>,
) -> Result<(), String> {
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
        same(&key, &dtype, &data, wdata)?;
    }
    Ok(())
}

/// Results within `tolerance` of TVM's recorded ones (float32 relative to the output's largest
/// magnitude, at least 1; other dtypes exactly), same names, dtypes and shapes.
pub fn compare_outputs_within(outputs: &[Output], expected: &Path, tolerance: f64) -> Result<(), String> {
    let f32s = |d: &[u8]| -> Vec<f64> {
        d.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect()
    };
    compare_arrays(outputs, expected, |key, dtype, data, wdata| {
        if dtype != "<f4" {
            return if data == wdata { Ok(()) } else { Err(format!("{key}: differs from TVM's")) };
        }
        let (got, reference) = (f32s(data), f32s(wdata));
        let scale = reference.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let worst = got.iter().zip(&reference).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale;
        if worst.is_nan() || worst > tolerance {
            return Err(format!("{key}: {worst:.2e} from TVM's (tolerance {tolerance:e})"));
        }
        Ok(())
    })
}

/// Results equal TVM's recorded ones: same names, dtypes, shapes and bytes.
pub fn compare_outputs(outputs: &[Output], expected: &Path) -> Result<(), String> {
    compare_arrays(outputs, expected, |key, _, data, wdata| {
        if data != wdata {
            let first = data.iter().zip(wdata).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("{key}: bytes differ from TVM's (first at byte {first})"));
        }
        Ok(())
    })
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

/// Builds `tests/c/NAME.c`, a C host of the model API, with the project's warning flags. Under a
/// ThreadSanitizer build of the runtime the host is built with it too: the sanitizer's runtime
/// must be in the program before the models are loaded.
pub fn build_c_host(name: &str) -> PathBuf {
    let exe = scratch_dir().join(format!("{name}.{}", std::process::id()));
    let tsan = relaxc::link::SHIM_SANITIZERS.split(',').any(|s| s.trim() == "thread");
    let status = std::process::Command::new(relaxc::link::linker())
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .args(tsan.then_some("-fsanitize=thread"))
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

/// Compares `actual` with the golden file at `path`; with `RELAXC_BLESS` set, writes it instead.
/// A mismatch is reported as a unified diff (golden first).
pub fn check_golden(path: &Path, actual: &str) -> Result<(), String> {
    if std::env::var_os("RELAXC_BLESS").is_some() {
        std::fs::write(path, actual).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(());
    }
    let want = std::fs::read_to_string(path).unwrap_or_default();
    if want == actual {
        return Ok(());
    }
    let diff = similar::TextDiff::from_lines(want.as_str(), actual);
    let shown = path.display().to_string();
    Err(format!(
        "{}\n(rerun with RELAXC_BLESS=1 to accept the new text)",
        diff.unified_diff().context_radius(3).header(&shown, "produced now")
    ))
}

/// libtest-mimic trials of plain test functions (they pass unless they panic).
pub fn plain_trials(tests: &[(&'static str, fn())]) -> Vec<libtest_mimic::Trial> {
    tests
        .iter()
        .map(|&(name, f)| {
            libtest_mimic::Trial::test(name, move || {
                f();
                Ok(())
            })
        })
        .collect()
}

/// Why this machine cannot build or run for a board `target`, if it cannot: its C toolchain,
/// qemu user mode and its libc are needed.
pub fn board_unavailable(target: &relaxc::target::Target) -> Option<String> {
    if let Err(e) = relaxc::target::toolchain(target) {
        return Some(e.to_string());
    }
    if std::process::Command::new(target.qemu()).arg("--version").output().is_err() {
        return Some(format!("{} is not installed (Debian's qemu-user)", target.qemu()));
    }
    if !target.sysroot().join("lib").exists() {
        return Some(format!("no {target} libc at {}", target.sysroot().display()));
    }
    None
}

/// The shared libraries an ELF file needs (its NEEDED entries, as `readelf -d` lists them).
pub fn needed_libraries(path: &Path) -> Result<Vec<String>, String> {
    let out =
        std::process::Command::new("readelf").arg("-d").arg(path).output().map_err(|e| format!("readelf: {e}"))?;
    if !out.status.success() {
        return Err(format!("readelf -d {}: {}", path.display(), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .map(|line| line.split('[').nth(1).and_then(|s| s.strip_suffix(']')).unwrap_or(line).to_string())
        .collect())
}

/// A test whose tool is missing: ignored with the reason on a developer's machine, a failure in
/// CI (which installs every tool, .ci/run).
pub fn tool_missing(why: String) -> Result<libtest_mimic::Completion, libtest_mimic::Failed> {
    if std::env::var_os("CI").is_some() {
        return Err(format!("CI needs this test's tools: {why}").into());
    }
    Ok(libtest_mimic::Completion::ignored_with(why))
}

/// Runs a pytest command with this build's relaxc ($RELAXC) from the project root: its last
/// lines are printed, and a failure carries its whole output.
pub fn pytest(mut command: std::process::Command) -> Result<libtest_mimic::Completion, libtest_mimic::Failed> {
    let out = command
        .current_dir(root())
        .env("RELAXC", env!("CARGO_BIN_EXE_relaxc"))
        .output()
        .map_err(|e| format!("run pytest: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = text.lines().rev().take(3).collect();
    eprintln!("{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
    if !out.status.success() {
        return Err(format!("pytest failed:\n{text}").into());
    }
    Ok(libtest_mimic::Completion::Completed)
}
