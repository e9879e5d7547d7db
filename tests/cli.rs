//! The command line as users type it: model paths of every form, and what a bad path says.

mod common;

use std::process::Command;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use relaxc::codegen::ExecMode;

fn relaxc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_relaxc"))
}

/// `relaxc run MODEL` on a fixture's `ok_basic` case, its outputs checked against TVM's.
fn run_basic_case(model: &std::path::Path, fixture: &std::path::Path) -> std::process::Output {
    let (inputs, expect) = (fixture.join("ok_basic.in.npz"), fixture.join("ok_basic.out.npz"));
    let args = argv(&[&"run", &model.display(), &"--inputs", &inputs.display(), &"--expect", &expect.display()]);
    relaxc().args(args).output().expect("relaxc run")
}

/// A command line from words and paths alike (anything that prints).
fn argv(parts: &[&dyn std::fmt::Display]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

fn run_and_inspect_open_bare_relative_and_absolute_paths() {
    let fixture = common::fixtures_dir().join("mlp_static");
    let so = common::build("mlp_static", &fixture.join("m.tar"), ExecMode::Compiled).expect("build");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("sub")).expect("sub");
    std::fs::copy(&so, dir.path().join("sub/m.so")).expect("copy");
    let inputs = fixture.join("ok_basic.in.npz");
    let expect = fixture.join("ok_basic.out.npz");
    for (cwd, path) in [
        (dir.path().join("sub"), "m.so".to_string()),
        (dir.path().to_path_buf(), "sub/m.so".to_string()),
        (dir.path().join("sub"), "./m.so".to_string()),
        (dir.path().to_path_buf(), dir.path().join("sub/m.so").display().to_string()),
    ] {
        let out = relaxc()
            .current_dir(&cwd)
            .args(["run", &path, "--inputs"])
            .arg(&inputs)
            .arg("--expect")
            .arg(&expect)
            .output()
            .expect("relaxc run");
        assert!(out.status.success(), "run {path} in {}: {}", cwd.display(), String::from_utf8_lossy(&out.stderr));
        let out = relaxc().current_dir(&cwd).args(["inspect", &path]).output().expect("relaxc inspect");
        assert!(out.status.success(), "inspect {path}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

fn a_bad_model_path_names_the_file_and_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = relaxc().current_dir(dir.path()).args(["run", "nonexistent.so"]).output().expect("relaxc run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot load nonexistent.so: No such file or directory"), "{err}");
    std::fs::write(dir.path().join("garbage.so"), b"not an ELF file").expect("write");
    let out = relaxc().current_dir(dir.path()).args(["run", "garbage.so"]).output().expect("relaxc run");
    let err = String::from_utf8_lossy(&out.stderr);
    // dlerror()'s own reason follows relaxc's words.
    assert!(err.contains("cannot load garbage.so: dlopen failed: ./garbage.so:"), "{err}");
    assert!(err.contains("file too short") || err.contains("invalid ELF header"), "{err}");
}

fn a_model_built_by_an_older_relaxc_still_runs() -> Completion {
    if !cfg!(target_arch = "x86_64") {
        return Completion::ignored_with("the ABI-1 model fixture is an x86-64 library");
    }
    let fixture = common::fixtures_dir().join("mlp_static");
    let out = run_basic_case(&common::root().join("fixtures/compat/mlp_static.abi1.x86_64.so"), &fixture);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let model =
        relaxc::host::Model::load(&common::root().join("fixtures/compat/mlp_static.abi1.x86_64.so")).expect("load");
    let err = model.function("vm.builtin.copy").err().expect("no registry in ABI 1");
    assert!(err.to_string().contains("speaks ABI version 1"), "{err}");
    Completion::Completed
}

/// A library built by a relaxc whose C API this one does not speak is refused, naming what built
/// it (simulated: a library whose rvm_get_api answers no version, with an identity section).
fn a_model_from_an_incompatible_relaxc_is_refused_by_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("future.c");
    std::fs::write(
        &src,
        "const void *rvm_get_api(unsigned v) { (void)v; return 0; }\n\
         __attribute__((section(\".rvm_identity\"), used)) static const char id[] = \"relaxc 9.0.0 c-api 7\";\n",
    )
    .expect("write");
    let so = dir.path().join("future.so");
    let status =
        Command::new(relaxc::link::linker()).args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&src).status().expect("cc");
    assert!(status.success());
    let out = relaxc().arg("run").arg(&so).output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("built by relaxc 9.0.0 c-api 7"), "{err}");
    let versions = format!("C API versions {}..={}", relaxc::abi::ABI_VERSION_MIN, relaxc::abi::ABI_VERSION);
    assert!(err.contains(&versions), "{err}");
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Output paths that name an input are refused before anything is written: `run m.so --outputs
/// m.so` once overwrote the model with an npz and died of SIGBUS; `compile x.tar -o x.tar`
/// replaced its input.
fn outputs_that_name_an_input_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = dir.path().join("m.tar");
    std::fs::copy(common::fixtures_dir().join("chain_1/m.tar"), &tar).expect("copy");
    let before = std::fs::read(&tar).expect("read");
    let out = relaxc().arg("compile").arg(&tar).arg("-o").arg(&tar).output().expect("relaxc compile");
    assert!(!out.status.success() && stderr_of(&out).contains("is also an input"), "{}", stderr_of(&out));
    assert_eq!(std::fs::read(&tar).expect("read"), before, "the input was changed");
    let so = dir.path().join("m.so");
    assert!(relaxc().arg("compile").arg(&tar).arg("-o").arg(&so).status().expect("compile").success());
    let model = std::fs::read(&so).expect("read");
    let inputs = common::fixtures_dir().join("chain_1/ok_basic.in.npz");
    for outputs in [&so, &inputs] {
        let out = relaxc()
            .arg("run")
            .arg(&so)
            .arg("--inputs")
            .arg(&inputs)
            .arg("--outputs")
            .arg(outputs)
            .output()
            .expect("run");
        assert!(!out.status.success() && stderr_of(&out).contains("is also an input"), "{}", stderr_of(&out));
    }
    assert_eq!(std::fs::read(&so).expect("read"), model, "the model was changed");
}

/// Messages say what was wrong first and once; `--bench 0` is refused before the call; a closed
/// pipe ends `inspect` quietly instead of a panic.
fn messages_name_the_problem_once() {
    let so =
        common::build("chain_1", &common::fixtures_dir().join("chain_1/m.tar"), ExecMode::Bytecode).expect("build");
    let inputs = common::fixtures_dir().join("chain_1/ok_basic.in.npz");
    let out = relaxc().arg("run").arg(&so).arg("--inputs").arg(&inputs).args(["--func", "nope"]).output().expect("run");
    assert!(
        stderr_of(&out).starts_with("error: the model has no function \"nope\" (its functions: main)"),
        "{}",
        stderr_of(&out)
    );
    let out = relaxc().arg("run").arg(&so).arg("--inputs").arg(&inputs).args(["--bench", "0"]).output().expect("run");
    assert!(
        !out.status.success() && out.stdout.is_empty(),
        "--bench 0 printed {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr_of(&out).contains("must be at least 1"), "{}", stderr_of(&out));
    let out = relaxc().args(["compile", "/nonexistent/m.tar", "-o", "/nonexistent/m.so"]).output().expect("compile");
    let message = stderr_of(&out);
    assert_eq!(message.matches("No such file or directory").count(), 1, "{message}");
    // inspect into a pipe closed after the first line.
    let mut child = relaxc()
        .arg("inspect")
        .arg(&so)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("inspect");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    assert!(!stderr_of(&out).contains("panicked"), "{}", stderr_of(&out));
}

/// The files of `dir`, by name.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Every file relaxc writes is whole or absent: writing into `/dev/full` fails with the reason,
/// and a write cut short (a file size limit standing in for a full disk) leaves the old file as
/// it was and no partial file beside it.
fn a_failed_write_leaves_no_partial_file() {
    use std::os::unix::process::CommandExt;
    let fixture = common::fixtures_dir().join("mlp_static");
    let tar = fixture.join("m.tar");
    let so = common::build("mlp_static", &tar, ExecMode::Compiled).expect("build");
    let inputs = fixture.join("ok_basic.in.npz");
    let (tar_path, so_path, inputs_path) = (tar.display(), so.display(), inputs.display());
    for (what, args) in [
        ("compile -o", argv(&[&"compile", &tar_path, &"-o", &"/dev/full"])),
        ("run --outputs", argv(&[&"run", &so_path, &"--inputs", &inputs_path, &"--outputs", &"/dev/full"])),
    ] {
        let out = relaxc().args(&args).output().expect("relaxc");
        assert_eq!(out.status.code(), Some(1), "{what} /dev/full: {}", stderr_of(&out));
        assert!(stderr_of(&out).contains("No space left on device"), "{what} /dev/full: {}", stderr_of(&out));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let old = b"the previous contents".to_vec();
    let target = |name: &str| dir.path().join(name);
    let cases: Vec<(&str, Vec<String>, std::path::PathBuf)> = vec![
        ("compile -o", argv(&[&"compile", &tar_path, &"-o"]), target("m.so")),
        (
            "compile --emit-clif",
            argv(&[&"compile", &tar_path, &"--exec-mode", &"compiled", &"-o", &"/dev/null", &"--emit-clif"]),
            target("m.clif"),
        ),
        ("run --outputs", argv(&[&"run", &so_path, &"--inputs", &inputs_path, &"--outputs"]), target("out.npz")),
    ];
    for (what, args, path) in cases {
        std::fs::write(&path, &old).expect("write the old file");
        let before = names_in(dir.path());
        let mut cmd = relaxc();
        cmd.args(&args).arg(&path);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // Writes past 64 bytes fail with EFBIG instead of killing the process.
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let limit = libc::rlimit { rlim_cur: 64, rlim_max: 64 };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = cmd.output().expect("relaxc");
        assert_eq!(out.status.code(), Some(1), "{what} past the size limit: {}", stderr_of(&out));
        assert!(stderr_of(&out).contains("File too large"), "{what}: {}", stderr_of(&out));
        assert_eq!(std::fs::read(&path).expect("read"), old, "{what} changed the old file");
        assert_eq!(names_in(dir.path()), before, "{what} left a file behind");
        std::fs::remove_file(&path).expect("remove");
    }
}

/// `relaxc compile` killed with SIGKILL at random moments, 50 times, over an older model: the
/// output is always the old model or the new one whole (it loads and gives TVM's results).
fn a_compile_killed_at_random_moments_leaves_the_old_or_the_new_model() {
    let fixture = common::fixtures_dir().join("mlp_static");
    let old =
        common::build("chain_1", &common::fixtures_dir().join("chain_1/m.tar"), ExecMode::Bytecode).expect("build");
    let old_bytes = std::fs::read(&old).expect("read");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("m.so");
    let compile = || {
        let mut cmd = relaxc();
        cmd.arg("compile").arg(fixture.join("m.tar")).args(["--exec-mode", "compiled", "-o"]).arg(&out);
        cmd
    };
    // The median of three compiles; kills fall in [0.3, 1.5] of it, most of them in the link and
    // around the rename, where a torn file could appear.
    let mut times: Vec<std::time::Duration> = (0..3)
        .map(|_| {
            let start = std::time::Instant::now();
            assert!(compile().status().expect("compile").success());
            start.elapsed()
        })
        .collect();
    times.sort();
    let full = times[1];
    let new_bytes = std::fs::read(&out).expect("read");
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
    eprintln!("a full compile takes {full:?}; kill times from seed {seed}");
    let mut state = seed;
    let (mut old_left, mut new_found) = (0, 0);
    for round in 0..50 {
        std::fs::write(&out, &old_bytes).expect("put the old model back");
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let delay = full.mul_f64(0.3 + (state % 1000) as f64 / 1000.0 * 1.2);
        let mut child =
            compile().stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("spawn");
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        let now = std::fs::read(&out).expect("the output is gone");
        if now == old_bytes {
            old_left += 1;
        } else {
            assert_eq!(
                now, new_bytes,
                "round {round} (killed after {delay:?}): the output is neither the old model nor the new one"
            );
            new_found += 1;
        }
        for name in names_in(dir.path()) {
            assert!(!name.ends_with(".so") || name == "m.so", "round {round}: {name} looks like a model");
        }
    }
    // The new model, whole, is a working one.
    std::fs::write(&out, &new_bytes).expect("write");
    let run = run_basic_case(&out, &fixture);
    assert!(run.status.success(), "{}", stderr_of(&run));
    eprintln!("50 kills: the old model left {old_left} times, the new one whole {new_found} times");
}

/// `relaxc run` and `relaxc generate` under an address-space limit (`ulimit -v`), swept from the
/// least that lets relaxc start to the least that lets the job finish: every run that fails says
/// so and exits with status 1 (never a signal, never a core).
fn a_memory_limit_gives_a_clean_error() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let llm = common::build("tiny_llama", &common::fixtures_dir().join("tiny_llama/m.tar"), ExecMode::Compiled)
        .expect("build");
    let cnn = common::fixtures_dir().join("lib_mobilenet");
    let cnn_so = common::build("lib_mobilenet", &cnn.join("m.tar"), ExecMode::Bytecode).expect("build");
    let limited = |kib: u64, args: &[&std::ffi::OsStr]| {
        let mut cmd = relaxc();
        cmd.args(args);
        let bytes = kib << 10;
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
                if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.output().expect("relaxc")
    };
    let cnn_inputs = cnn.join("ok_n4.in.npz");
    let jobs: Vec<(&str, Vec<&std::ffi::OsStr>)> = vec![
        (
            "generate",
            vec![
                "generate".as_ref(),
                llm.as_os_str(),
                "--prompt".as_ref(),
                "1,17,42".as_ref(),
                "--max-new-tokens".as_ref(),
                "4".as_ref(),
                "--max-total-seq-len".as_ref(),
                "16384".as_ref(),
            ],
        ),
        ("run", vec!["run".as_ref(), cnn_so.as_os_str(), "--inputs".as_ref(), cnn_inputs.as_os_str()]),
    ];
    // Below this the dynamic loader cannot map relaxc itself, before any of its code runs. Right
    // at that edge the loader's own mappings fail or not with address randomisation, and then
    // crash before relaxc runs (a SIGSEGV with nothing printed), so the sweep starts where five
    // starts in a row succeed, plus a margin: what it tests is relaxc's handling, not the loader's.
    let start = (16..4096)
        .map(|quarter| quarter << 8)
        .find(|&kib| (0..5).all(|_| limited(kib, &["--version".as_ref()]).status.success()))
        .expect("relaxc never starts")
        + 512;
    for (what, args) in jobs {
        let mut failures = 0;
        let mut kib = start;
        loop {
            let out = limited(kib, &args);
            let err = stderr_of(&out);
            assert_eq!(out.status.signal(), None, "{what} under {kib} KiB died of a signal: {err}");
            if out.status.success() {
                break;
            }
            assert_eq!(out.status.code(), Some(1), "{what} under {kib} KiB: {err}");
            let said = ["out of memory", "MemoryError", "Cannot allocate memory", "failed to map segment"];
            assert!(said.iter().any(|s| err.contains(s)), "{what} under {kib} KiB does not say memory ran out: {err}");
            failures += 1;
            kib += 256;
            assert!(kib < 4 << 20, "{what} never finished under a memory limit");
        }
        eprintln!("{what}: {failures} limits from {start} KiB failed cleanly; it finishes in {kib} KiB");
        assert!(failures > 0, "{what} finished under the smallest limit: the sweep tested nothing");
    }
}

/// `relaxc --help` and each command's `--help` end by naming the book's page for the job, and
/// that page exists.
fn help_names_the_books_page_for_each_job() {
    for command in ["", "compile", "run", "generate", "kernel-library", "rpc-server", "inspect"] {
        let mut args: Vec<&str> = command.split_whitespace().collect();
        args.push("--help");
        let out = relaxc().args(&args).output().expect("relaxc --help");
        assert!(out.status.success(), "relaxc {command} --help failed");
        let text = String::from_utf8_lossy(&out.stdout);
        let page = text
            .split_whitespace()
            .find(|w| w.starts_with("docs/src/"))
            .unwrap_or_else(|| panic!("relaxc {command} --help names no page of the book:\n{text}"));
        assert!(common::root().join(page).is_file(), "relaxc {command} --help names {page}, which does not exist");
    }
}

fn main() {
    let args = Arguments::from_args();
    let plain: [(&str, fn()); 9] = [
        ("help_names_the_books_page_for_each_job", help_names_the_books_page_for_each_job),
        ("a_memory_limit_gives_a_clean_error", a_memory_limit_gives_a_clean_error),
        ("a_failed_write_leaves_no_partial_file", a_failed_write_leaves_no_partial_file),
        (
            "a_compile_killed_at_random_moments_leaves_the_old_or_the_new_model",
            a_compile_killed_at_random_moments_leaves_the_old_or_the_new_model,
        ),
        (
            "run_and_inspect_open_bare_relative_and_absolute_paths",
            run_and_inspect_open_bare_relative_and_absolute_paths,
        ),
        ("a_bad_model_path_names_the_file_and_the_reason", a_bad_model_path_names_the_file_and_the_reason),
        (
            "a_model_from_an_incompatible_relaxc_is_refused_by_version",
            a_model_from_an_incompatible_relaxc_is_refused_by_version,
        ),
        ("outputs_that_name_an_input_are_refused", outputs_that_name_an_input_are_refused),
        ("messages_name_the_problem_once", messages_name_the_problem_once),
    ];
    let mut trials = common::plain_trials(&plain);
    // The ABI-1 fixture is an x86-64 library: elsewhere the test is listed as ignored, with why.
    trials.push(Trial::ignorable_test("a_model_built_by_an_older_relaxc_still_runs", || {
        Ok::<_, Failed>(a_model_built_by_an_older_relaxc_still_runs())
    }));
    libtest_mimic::run(&args, trials).exit();
}
