//! `relaxc rpc-server`, driven over TVM's RPC protocol on 127.0.0.1: by the protocol client in
//! tests/rpc_client (written from the spec, no TVM needed) and, where TVM 0.27 is installed, by
//! TVM's own Python client (tests/rpc_client/tvm_client.py).
//!
//! - The workflow (upload, load_module, tensors, call, read back, tuples, time_evaluator, errors)
//!   on every TVM fixture in both modes against the native server, and on a set of board exports
//!   against the aarch64 and riscv64 servers under qemu: results bit-identical to TVM's recorded
//!   ones and to running the same .so locally; errors carry relaxc's message and leave the
//!   session usable.
//! - Safety: upload names that could leave the session directory, 1,000 malformed packets,
//!   200 sessions without growth, valgrind on the sessions, limits, timeouts, wrong keys.
//! - The CLI: --emit for the boards (only libc needed), SIGINT/SIGTERM.
//!
//! Every server a test starts listens on 127.0.0.1 with a port the system picks, and is stopped
//! (SIGTERM, then SIGKILL) when its test ends.

mod common;
mod rpc_client;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use relaxc::codegen::ExecMode;
use relaxc::host::{HostError, Input, Model, Output, npz};
use relaxc::target::Target;
use rpc_client::{Client, RpcError, Value};

/// A running server: its process, port, and where its stderr goes.
struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts the server for `target` (under qemu for a board) with `options`, on a free port.
    fn start(target: &Target, options: &[&str]) -> Result<Server, String> {
        let tc = relaxc::target::toolchain(target).map_err(|e| e.to_string())?;
        let exe = relaxc::target::shim::rpc_server(target, &tc).map_err(|e| e.to_string())?;
        let mut command = if target.is_host() {
            Command::new(&exe)
        } else {
            let mut c = Command::new(target.qemu());
            c.arg("-L").arg(target.sysroot()).arg(&exe);
            c
        };
        Server::spawn(command.args(["--host", "127.0.0.1", "--port", "0"]).args(options))
    }

    fn spawn(command: &mut Command) -> Result<Server, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let log = dir.path().join("server.log");
        let stderr = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        // In the sanitizer run the test preloads gcc's ASan runtime; the server carries its own
        // (a sanitizer build of relaxc builds it with the same -fsanitize as the models).
        command.env_remove("LD_PRELOAD");
        let mut child =
            command.stdout(Stdio::piped()).stderr(stderr).spawn().map_err(|e| format!("starting the server: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(120)).unwrap_or_default();
        let port = line.trim().strip_prefix("listening on 127.0.0.1:").and_then(|p| p.parse().ok());
        let Some(port) = port else {
            let _ = child.kill();
            let _ = child.wait();
            let log_text = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("the server did not say where it listens (said {line:?}; stderr: {log_text})"));
        };
        Ok(Server { child, port, log, _dir: dir })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` and waits up to 20 s; returns the exit status.
    fn stop_with(&mut self, signal: i32) -> Result<std::process::ExitStatus, String> {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("the server did not stop within 20 s of signal {signal}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.alive() {
            let _ = self.stop_with(libc::SIGTERM);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test that runs once, on the native server.
type Check = fn() -> Result<(), Failed>;

fn host() -> Target {
    Target::host()
}

/// How a fixture's case runs without RPC: its flattened results or its error as "Kind: message".
type LocalRun = Arc<dyn Fn(&[Input]) -> Result<Vec<Output>, String> + Send + Sync>;

fn native_run(so: PathBuf) -> LocalRun {
    Arc::new(move |inputs: &[Input]| {
        let model = Model::load(&so).map_err(|e| e.to_string())?;
        let mut vm = model.vm().map_err(|e| e.to_string())?;
        let f = model.find("main").map_err(|e| e.to_string())?;
        let value = vm.call(f, inputs).map_err(|e: HostError| e.to_string())?;
        Ok(value.to_output().flatten())
    })
}

fn board_run(so: PathBuf, target: Target) -> LocalRun {
    Arc::new(move |inputs: &[Input]| {
        relaxc::host::foreign::run(&so, &target, "main", inputs, 0, false).map(|r| r.outputs).map_err(|e| e.to_string())
    })
}

/// Calls main remotely: the flattened results, or the server's error.
fn remote_main(client: &mut Client, main: u64, inputs: &[Input]) -> Result<Option<Vec<Output>>, RpcError> {
    let Some((args, tensors)) = client.arguments(inputs)? else { return Ok(None) };
    let reply = client.call(main, &args);
    for t in &tensors {
        client.free_data(t)?;
    }
    let out = client.fetch(&reply?)?;
    Ok(Some(out.flatten()))
}

/// The whole workflow for one model: upload, load, every case of the fixture (failing cases
/// first, so the session must survive them), a timing, then frees and shutdown. With
/// `against_tvm`, results must equal TVM's recorded ones too.
fn workflow(
    port: u16,
    so: &Path,
    fixture: &Path,
    local: &LocalRun,
    against_tvm: Option<&common::Fixture>,
) -> Result<(), Failed> {
    let mut client = rpc_client::connect(port, "")?;
    client.upload("model.so", &std::fs::read(so)?)?;
    let module = client.load_module("model.so")?;
    let main = client.get_function(module, "main")?.ok_or("the module has no main")?;
    if client.get_function(module, "no_such_function")?.is_some() {
        return Err("a missing function came back as a handle".into());
    }
    let mut cases: Vec<(bool, String)> = Vec::new();
    for path in common::entries(fixture) {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if let Some(case) = name.strip_suffix(".in.npz") {
            cases.push((case.starts_with("ok_"), case.to_string()));
        }
    }
    cases.sort();
    let mut timed = false;
    for (ok, case) in cases {
        let inputs = npz::read_inputs(&fixture.join(format!("{case}.in.npz")))?;
        let want = local(&inputs);
        let got = match remote_main(&mut client, main, &inputs) {
            Ok(None) => {
                eprintln!(
                    "{}::{case}: skipped over RPC: a shape-tuple argument (TVM's client cannot send one)",
                    fixture.display()
                );
                continue;
            }
            Ok(Some(got)) => Ok(got),
            Err(RpcError::Remote(message)) => Err(message),
            Err(e) => return Err(e.into()),
        };
        match (got, want) {
            (Ok(got), Ok(want)) => {
                if got != want {
                    return Err(format!("{case}: the remote results differ from the local run").into());
                }
                if let Some(f) = against_tvm {
                    f.check_outputs(&got, case.trim_start_matches("ok_"))?;
                }
                if !ok {
                    return Err(format!("{case}: succeeded; TVM rejected it").into());
                }
                if !timed {
                    timed = true;
                    let (args, tensors) = client.arguments(&inputs)?.ok_or("no arguments")?;
                    let seconds = client.time(module, "main", 2, 3, 0, &args)?;
                    if seconds.len() != 3 || seconds.iter().any(|s| !(*s > 0.0 && *s < 60.0)) {
                        return Err(format!("time_evaluator gave {seconds:?}").into());
                    }
                    for t in &tensors {
                        client.free_data(t)?;
                    }
                }
            }
            (Err(remote), Err(local)) => {
                if remote != local {
                    return Err(format!("{case}: the server said {remote:?}, the local run {local:?}").into());
                }
            }
            (got, want) => return Err(format!("{case}: remote {got:?}, local {want:?}").into()),
        }
    }
    client.free(main)?;
    client.free(module)?;
    client.shutdown()?;
    Ok(())
}

fn native_fixture(fixture: &common::Fixture, mode: ExecMode) -> Result<(), Failed> {
    let so = common::build(&fixture.name, &fixture.tar(), mode)?;
    let server = Server::start(&host(), &[])?;
    let local = native_run(so.clone());
    workflow(server.port, &so, &fixture.dir, &local, Some(fixture))
        .map_err(|e| format!("{}\nserver log:\n{}", e.message().unwrap_or(""), server.log()).into())
}

/// Exports TVM built for the boards, through the board's server under qemu.
const BOARD_FIXTURES: [&str; 6] = ["mlp_static", "calls", "dyn_tuple", "if_cond", "onnx_topk", "lib_mlp_static"];

fn board_fixture(target: &Target, name: &str, mode: ExecMode) -> Result<(), Failed> {
    let tar = common::root().join("fixtures/tvm-cross").join(target.cpu()).join(name).join("m.tar");
    let mut options = relaxc::compile::Options::mode(mode);
    options.target = target.clone();
    let so = common::build_with(
        &format!("rpc_{name}"),
        &tar,
        &options,
        &format!("{}.{}", target.cpu(), common::mode_name(mode)),
    )?;
    let server = Server::start(target, &[])?;
    let local = board_run(so.clone(), target.clone());
    workflow(server.port, &so, &common::fixtures_dir().join(name), &local, None)
}

// ---- Protocol ------------------------------------------------------------------------------------

fn mlp(mode: ExecMode) -> Result<PathBuf, String> {
    common::build("mlp_static", &common::fixtures_dir().join("mlp_static/m.tar"), mode)
}

fn mlp_inputs() -> Result<Vec<Input>, Failed> {
    Ok(npz::read_inputs(&common::fixtures_dir().join("mlp_static/ok_basic.in.npz"))?)
}

fn wrong_key() -> Result<(), Failed> {
    let server = Server::start(&host(), &["--key", "board"])?;
    match rpc_client::handshake(server.port, "client:other")? {
        Err(code) if code == rpc_client::KEY_MISMATCH => {}
        other => return Err(format!("a wrong key was answered {:?}", other.map(|_| "accepted")).into()),
    }
    match rpc_client::handshake(server.port, "client:")? {
        Err(code) if code == rpc_client::KEY_MISMATCH => {}
        _ => return Err("an empty key was accepted by a server with --key".into()),
    }
    rpc_client::connect(server.port, "board -timeout=30")?.shutdown()?;
    rpc_client::connect(server.port, "board")?.shutdown()?;
    Ok(())
}

fn chunked_copies() -> Result<(), Failed> {
    let server = Server::start(&host(), &["--max-packet", "4K"])?;
    let mut client = rpc_client::connect(server.port, "")?;
    let data: Vec<u8> = (0..100_003u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let t = client.tensor((1, 8, 1), &[100_003], &data)?;
    if client.read(&t)? != data {
        return Err("a 100 KB tensor copied in 4 KiB packets came back different".into());
    }
    client.free_data(&t)?;
    // The model itself is over --max-packet: its upload streams to disk.
    let so = mlp(ExecMode::Compiled)?;
    client.upload("mlp.so", &std::fs::read(&so)?)?;
    let module = client.load_module("mlp.so")?;
    let main = client.get_function(module, "main")?.ok_or("no main")?;
    let got = remote_main(&mut client, main, &mlp_inputs()?)?.ok_or("no result")?;
    let want = native_run(so)(&mlp_inputs()?)?;
    if got != want {
        return Err("results differ with 4 KiB packets".into());
    }
    client.shutdown()?;
    Ok(())
}

fn upload_limit() -> Result<(), Failed> {
    let so = mlp(ExecMode::Bytecode)?;
    let bytes = std::fs::read(&so)?;
    for max_packet in ["16M", "4K"] {
        let server = Server::start(&host(), &["--max-upload", "64K", "--max-packet", max_packet])?;
        let mut client = rpc_client::connect(server.port, "")?;
        match client.upload("big.so", &bytes) {
            Err(RpcError::Remote(m)) if m.contains("--max-upload") && m.contains(&bytes.len().to_string()) => {}
            other => return Err(format!("an upload of {} bytes over a 64K limit: {other:?}", bytes.len()).into()),
        }
        client.upload("small.bin", &[7u8; 1000])?;
        match client.load_module("big.so") {
            Err(RpcError::Remote(m)) if m.contains("no uploaded file named \"big.so\"") => {}
            other => return Err(format!("loading a refused upload: {other:?}").into()),
        }
        client.shutdown()?;
    }
    Ok(())
}

/// A file uploaded again under the same name and loaded again is the new file, while the module
/// loaded from the old one keeps working.
fn reupload() -> Result<(), Failed> {
    let server = Server::start(&host(), &[])?;
    let mut client = rpc_client::connect(server.port, "")?;
    let mlp_so = mlp(ExecMode::Bytecode)?;
    let calls_so = common::build("calls", &common::fixtures_dir().join("calls/m.tar"), ExecMode::Bytecode)?;
    let calls_inputs = npz::read_inputs(&common::fixtures_dir().join("calls/ok_basic.in.npz"))?;
    client.upload("m.so", &std::fs::read(&mlp_so)?)?;
    let first = client.load_module("m.so")?;
    client.upload("m.so", &std::fs::read(&calls_so)?)?;
    let second = client.load_module("m.so")?;
    let old_main = client.get_function(first, "main")?.ok_or("no main")?;
    let new_main = client.get_function(second, "main")?.ok_or("no main")?;
    if remote_main(&mut client, new_main, &calls_inputs)? != Some(native_run(calls_so)(&calls_inputs)?) {
        return Err("the second load is not the second upload".into());
    }
    if remote_main(&mut client, old_main, &mlp_inputs()?)? != Some(native_run(mlp_so)(&mlp_inputs()?)?) {
        return Err("the first module changed".into());
    }
    client.shutdown()?;
    Ok(())
}

fn memory_limit() -> Result<(), Failed> {
    let server = Server::start(&host(), &["--max-memory", "1M"])?;
    let mut client = rpc_client::connect(server.port, "")?;
    let over = |r: Result<rpc_client::WireTensor, RpcError>| match r {
        Err(RpcError::Remote(m)) if m.contains("--max-memory") => Ok(()),
        other => Err(format!("an allocation over --max-memory 1M: {other:?}")),
    };
    over(client.tensor((1, 8, 1), &[2 << 20], &vec![0u8; 2 << 20]))?;
    let half = vec![1u8; 512 << 10];
    let a = client.tensor((1, 8, 1), &[512 << 10], &half)?;
    let b = client.tensor((1, 8, 1), &[512 << 10], &half)?;
    over(client.tensor((1, 8, 1), &[16], &[0u8; 16]))?;
    client.free_data(&a)?;
    let c = client.tensor((1, 8, 1), &[512 << 10], &half)?;
    if client.read(&c)? != half || client.read(&b)? != half {
        return Err("tensors changed".into());
    }
    client.shutdown()?;
    Ok(())
}

/// Requests that fail get an exception naming what was wrong, and the session goes on.
fn errors_keep_session() -> Result<(), Failed> {
    let server = Server::start(&host(), &[])?;
    let mut client = rpc_client::connect(server.port, "")?;
    let expect = |r: Result<Vec<Value>, RpcError>, words: &str| -> Result<(), Failed> {
        match r {
            Err(RpcError::Remote(m)) if m.contains(words) => Ok(()),
            other => Err(format!("wanted an error containing {words:?}, got {other:?}").into()),
        }
    };
    if client.get_global("no.such.function")? != 0 {
        return Err("an unknown global function got a handle".into());
    }
    expect(client.call(0xdead_0000_0010, &[]), "unknown function handle")?;
    match client.free(0x1234_0000_0010) {
        Err(RpcError::Remote(m)) if m.contains("unknown handle") => {}
        other => return Err(format!("freeing an unknown handle: {other:?}").into()),
    }
    expect(client.call_global("tvm.rpc.server.load_module", &[Value::Str("missing.so".into())]), "no uploaded file")?;
    client.upload("notamodel.so", b"this is not an ELF file")?;
    expect(
        client.call_global("tvm.rpc.server.load_module", &[Value::Str("notamodel.so".into())]),
        "cannot load notamodel.so",
    )?;
    let t = client.tensor((2, 32, 1), &[4], &[0u8; 16])?;
    let mut past_end = t.clone();
    past_end.byte_offset = 8;
    let mut body = Vec::new();
    rpc_client::put_tensor(&mut body, &past_end);
    body.extend(16u64.to_le_bytes());
    match client.request(rpc_client::code::COPY_FROM_REMOTE, &body) {
        Err(RpcError::Remote(m)) if m.contains("overrun") => {}
        other => return Err(format!("reading past a tensor's end: {other:?}").into()),
    }
    let negative = rpc_client::WireTensor { data: 0, dtype: (2, 32, 1), shape: vec![-4], byte_offset: 0 };
    match client.syscall(rpc_client::code::DEV_ALLOC_DATA_WITH_SCOPE, &[Value::Tensor(negative), Value::None]) {
        Err(RpcError::Remote(m)) if m.contains("negative") => {}
        other => return Err(format!("allocating a negative shape: {other:?}").into()),
    }
    let forged = rpc_client::WireTensor { data: t.data ^ 0x1_0000_0000, ..t.clone() };
    match client.read(&forged) {
        Err(RpcError::Remote(m)) if m.contains("not memory of this session") => {}
        other => return Err(format!("a forged data token: {other:?}").into()),
    }
    client.free_data(&t)?;
    // A wrong shape: relaxc's own message, and the next call works.
    let so = mlp(ExecMode::Compiled)?;
    client.upload("mlp.so", &std::fs::read(&so)?)?;
    let module = client.load_module("mlp.so")?;
    let main = client.get_function(module, "main")?.ok_or("no main")?;
    let bad = vec![Input::Tensor(relaxc::host::HostTensor::new(
        relaxc::abi::DLDataType { code: 2, bits: 32, lanes: 1 },
        vec![3, 4],
        &[0u8; 48],
    ))];
    let local = native_run(so.clone())(&bad).err().ok_or("the wrong shape ran locally")?;
    match remote_main(&mut client, main, &bad) {
        Err(RpcError::Remote(m)) if m == local && m.contains("match_cast") => {}
        other => return Err(format!("a wrong shape: {other:?}, locally {local:?}").into()),
    }
    remote_main(&mut client, main, &mlp_inputs()?)?.ok_or("no result")?;
    client.shutdown()?;
    Ok(())
}

fn session_timeout() -> Result<(), Failed> {
    let server = Server::start(&host(), &[])?;
    let so = mlp(ExecMode::Bytecode)?;
    let mut client = rpc_client::connect(server.port, " -timeout=2")?;
    client.upload("mlp.so", &std::fs::read(&so)?)?;
    let module = client.load_module("mlp.so")?;
    let (args, _) = client.arguments(&mlp_inputs()?)?.ok_or("no arguments")?;
    let start = Instant::now();
    match client.time(module, "main", 1, 1, 60_000, &args) {
        Err(RpcError::Remote(m)) if m.starts_with("RPCSessionTimeoutError: ") => {}
        other => return Err(format!("a 60 s timing in a 2 s session: {other:?}").into()),
    }
    let took = start.elapsed();
    if took > Duration::from_secs(30) {
        return Err(format!("the timeout came after {took:?}").into());
    }
    // The server serves the next client.
    rpc_client::connect(server.port, "")?.shutdown()?;
    Ok(())
}

/// A tracker that speaks TVM's tracker protocol to one server, on its own thread: it answers
/// every message (the pending keys are the last one put) and passes each on to the test.
fn mock_tracker(listener: TcpListener, seen: std::sync::mpsc::Sender<serde_json::Value>) -> Result<(), String> {
    let (mut conn, _) = listener.accept().map_err(|e| e.to_string())?;
    let mut magic = [0u8; 4];
    conn.read_exact(&mut magic).map_err(|e| e.to_string())?;
    if i32::from_le_bytes(magic) != 0x2F271 {
        return Err(format!("tracker magic {magic:?}"));
    }
    conn.write_all(&magic).map_err(|e| e.to_string())?;
    let mut pending = String::from("[]");
    loop {
        let mut len = [0u8; 4];
        if conn.read_exact(&mut len).is_err() {
            return Ok(()); // the server stopped
        }
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        conn.read_exact(&mut body).map_err(|e| e.to_string())?;
        let message: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        let answer = match message[0].as_i64() {
            Some(3) => {
                pending = format!("[{}]", message[2][1]);
                "0".to_string()
            }
            Some(7) => pending.clone(),
            _ => "0".to_string(),
        };
        conn.write_all(&(answer.len() as u32).to_le_bytes())
            .and_then(|_| conn.write_all(answer.as_bytes()))
            .map_err(|e| e.to_string())?;
        let _ = seen.send(message);
    }
}

fn tracker() -> Result<(), Failed> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let tracker_port = listener.local_addr()?.port();
    let (tx, seen) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || mock_tracker(listener, tx));
    let server = Server::start(&host(), &["--key", "board", "--tracker", &format!("127.0.0.1:{tracker_port}")])?;
    let next = |kind: i64| -> Result<serde_json::Value, Failed> {
        loop {
            let m = seen.recv_timeout(Duration::from_secs(30)).map_err(|_| format!("no tracker message {kind}"))?;
            if m[0] == kind {
                return Ok(m);
            }
        }
    };
    let info = next(5)?;
    if info[1]["key"] != "server:board" || info[1]["addr"][1] != server.port {
        return Err(format!("UPDATE_INFO was {info}").into());
    }
    let put = next(3)?;
    let matchkey = put[2][1].as_str().ok_or(format!("PUT was {put}"))?.to_string();
    if put[1] != "board" || put[2][0] != server.port || !matchkey.starts_with("board:") {
        return Err(format!("PUT was {put}").into());
    }
    // A client with the plain key is refused; one with the match key gets the session.
    match rpc_client::handshake(server.port, "client:board")? {
        Err(code) if code == rpc_client::KEY_MISMATCH => {}
        _ => return Err("the plain key was accepted while registered with a tracker".into()),
    }
    rpc_client::connect(server.port, &format!("{matchkey} -timeout=60"))?.shutdown()?;
    // After the session it puts a new key, and while idle it asks which keys are pending.
    let renewed = next(3)?;
    if renewed[2][1] == matchkey.as_str() {
        return Err("the same match key after the session".into());
    }
    next(7)?;
    drop(server);
    thread.join().map_err(|_| "the tracker thread panicked")??;
    Ok(())
}

// ---- Safety --------------------------------------------------------------------------------------

fn upload_names() -> Result<(), Failed> {
    let base = tempfile::tempdir()?;
    let work = base.path().join("work");
    std::fs::create_dir(&work)?;
    let mut server = Server::start(&host(), &["--workdir", &work.display().to_string()])?;
    let mut client = rpc_client::connect(server.port, "")?;
    for name in ["../x", "..", "a/b", "/tmp/x", "", "x/../../y", "..x"] {
        match client.upload(name, b"payload") {
            Err(RpcError::Remote(m)) if m.contains("refused the file name") || m.contains("1 to 255 bytes") => {}
            other => return Err(format!("an upload named {name:?}: {other:?}").into()),
        }
    }
    client.upload("fine.bin", b"payload")?;
    let sessions: Vec<_> = std::fs::read_dir(&work)?.filter_map(|e| e.ok()).collect();
    let [session] = sessions.as_slice() else { return Err(format!("{} session directories", sessions.len()).into()) };
    let files: Vec<_> = std::fs::read_dir(session.path())?.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    if files != ["fine.bin"] {
        return Err(format!("the session directory holds {files:?}").into());
    }
    client.shutdown()?;
    std::thread::sleep(Duration::from_millis(300));
    let left: Vec<_> = std::fs::read_dir(base.path())?.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    let work_left = std::fs::read_dir(&work)?.count();
    if left != ["work"] || work_left != 0 {
        return Err(format!("after the session: {left:?} beside the work directory, {work_left} entries in it").into());
    }
    if !server.alive() {
        return Err("the server died".into());
    }
    Ok(())
}

/// xorshift64*: reproducible bytes for the malformed packets.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// `at_least` plus a random number below `below` of random bytes.
    fn bytes(&mut self, at_least: usize, below: u64) -> Vec<u8> {
        let n = at_least + (self.next() % below) as usize;
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn hello() -> Vec<u8> {
    let mut h = rpc_client::MAGIC.to_le_bytes().to_vec();
    h.extend(7i32.to_le_bytes());
    h.extend(b"client:");
    h
}

/// One malformed conversation, kind `i % 6`; whatever the server answers, it must go on.
fn malformed(port: u16, i: u64, random: &mut Random) -> std::io::Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let init = {
        let mut body = 2i32.to_le_bytes().to_vec();
        body.extend(5u64.to_le_bytes());
        body.extend(b"0.8.0");
        body.extend(0i32.to_le_bytes());
        let mut p = (body.len() as u64).to_le_bytes().to_vec();
        p.extend(body);
        p
    };
    let mut packet = Vec::new();
    match i % 6 {
        0 => packet.extend(random.bytes(1, 64)), // garbage instead of a handshake
        1 => {
            packet.extend(hello());
            packet.extend(random.bytes(1, 300));
        }
        2 => {
            packet.extend(hello());
            packet.extend(init.clone());
            packet.extend((1u64 << 63).to_le_bytes());
            packet.extend(random.bytes(16, 1));
        }
        3 => {
            // A truncated message: its length promises more than comes before the close.
            packet.extend(hello());
            packet.extend(init.clone());
            packet.extend(200u64.to_le_bytes());
            packet.extend(3i32.to_le_bytes());
            packet.extend(random.bytes(0, 150));
        }
        4 => {
            // Well framed, nonsense inside (codes, counts, type indices, lengths of 2^63).
            packet.extend(hello());
            packet.extend(init.clone());
            let mut body = ((random.next() % 22) as i32).to_le_bytes().to_vec();
            let mut rest = random.bytes(0, 120);
            if random.next().is_multiple_of(2) && rest.len() >= 16 {
                rest[4..12].copy_from_slice(&(1u64 << 63).to_le_bytes());
            }
            body.extend(rest);
            packet.extend((body.len() as u64).to_le_bytes());
            packet.extend(body);
        }
        _ => {
            // A key length of 2^31 - 1, then nothing.
            packet.extend(rpc_client::MAGIC.to_le_bytes());
            packet.extend(i32::MAX.to_le_bytes());
        }
    }
    let _ = s.write_all(&packet);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
    Ok(())
}

fn malformed_packets() -> Result<(), Failed> {
    let work = tempfile::tempdir()?;
    let mut server = Server::start(&host(), &["--workdir", &work.path().display().to_string()])?;
    let mut random = Random(0x9E3779B97F4A7C15);
    for i in 0..1000 {
        malformed(server.port, i, &mut random)?;
        if !server.alive() {
            return Err(format!("the server died at malformed conversation {i}:\n{}", server.log()).into());
        }
    }
    // The next client gets the whole workflow.
    let so = mlp(ExecMode::Bytecode)?;
    let fixture = common::fixtures_dir().join("mlp_static");
    workflow(server.port, &so, &fixture, &native_run(so.clone()), None)?;
    std::thread::sleep(Duration::from_millis(300));
    let left = std::fs::read_dir(work.path())?.count();
    if left != 0 {
        return Err(format!("{left} session directories left behind").into());
    }
    Ok(())
}

fn rss_kib(pid: u32) -> Result<u64, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("no VmRSS".into())
}

/// One session of work; every tenth hangs up in the middle of a message.
fn busy_session(port: u16, so_bytes: &[u8], inputs: &[Input], i: usize) -> Result<(), Failed> {
    let mut client = rpc_client::connect(port, "")?;
    client.upload("m.so", so_bytes)?;
    let module = client.load_module("m.so")?;
    let main = client.get_function(module, "main")?.ok_or("no main")?;
    let (args, _tensors) = client.arguments(inputs)?.ok_or("no arguments")?;
    let reply = client.call(main, &args)?;
    if i % 10 == 9 {
        client.stream.write_all(&1000u64.to_le_bytes())?;
        client.stream.write_all(&[3, 0, 0, 0, 1, 2])?;
        return Ok(()); // dropped: the connection closes mid-message, holding a module and tensors
    }
    client.fetch(&reply)?;
    client.shutdown()?;
    Ok(())
}

fn sessions_200() -> Result<(), Failed> {
    let server = Server::start(&host(), &[])?;
    let so = std::fs::read(mlp(ExecMode::Compiled)?)?;
    let inputs = mlp_inputs()?;
    let pid = server.child.id();
    let mut first = 0;
    for i in 0..200 {
        busy_session(server.port, &so, &inputs, i)?;
        if i == 19 {
            first = rss_kib(pid)?;
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let last = rss_kib(pid)?;
    eprintln!("server RSS after 20 sessions {first} KiB, after 200 {last} KiB");
    if last > first + 256 {
        return Err(format!("the server grew from {first} KiB to {last} KiB over 180 sessions").into());
    }
    Ok(())
}

/// The sessions under valgrind: a whole workflow with a tuple result and a timing, a client that
/// disconnects mid-message, and malformed requests; no session may lose memory.
fn valgrind_sessions() -> Result<Completion, Failed> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        return common::tool_missing("valgrind is not installed: the sessions' leak check is skipped".into());
    }
    let tc = relaxc::target::toolchain(&host())?;
    if !relaxc::link::SHIM_SANITIZERS.is_empty() {
        return Ok(Completion::ignored_with("a sanitizer build: valgrind cannot run it"));
    }
    let exe = relaxc::target::shim::rpc_server(&host(), &tc)?;
    let logs = tempfile::tempdir()?;
    let mut command = Command::new("valgrind");
    command
        .args(["--trace-children=yes", "--leak-check=full", "--errors-for-leak-kinds=definite", "--error-exitcode=99"])
        .arg(format!("--log-file={}/vg.%p", logs.path().display()))
        .arg(&exe)
        .args(["--host", "127.0.0.1", "--port", "0"]);
    let mut server = Server::spawn(&mut command)?;
    let calls = common::build("calls", &common::fixtures_dir().join("calls/m.tar"), ExecMode::Compiled)?;
    workflow(server.port, &calls, &common::fixtures_dir().join("calls"), &native_run(calls.clone()), None)?;
    let so = std::fs::read(mlp(ExecMode::Bytecode)?)?;
    busy_session(server.port, &so, &mlp_inputs()?, 9)?;
    let mut random = Random(7);
    for i in 0..6 {
        malformed(server.port, i, &mut random)?;
    }
    rpc_client::connect(server.port, "")?.shutdown()?;
    let status = server.stop_with(libc::SIGTERM).map_err(|e| format!("{e}; its log:\n{}", server.log()))?;
    let mut reports = String::new();
    for entry in std::fs::read_dir(logs.path())? {
        let text = std::fs::read_to_string(entry?.path())?;
        let lost = text.lines().any(|l| l.contains("definitely lost:") && !l.contains("definitely lost: 0 bytes"));
        let errors = text.lines().any(|l| l.contains("ERROR SUMMARY:") && !l.contains("ERROR SUMMARY: 0 errors"));
        if lost || errors {
            reports.push_str(&text);
        }
    }
    if !reports.is_empty() || !status.success() {
        return Err(format!("valgrind (server exit {status}):\n{reports}").into());
    }
    Ok(Completion::Completed)
}

// ---- The command line ----------------------------------------------------------------------------

fn emit(target: &Target) -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("relaxc-rpc-server");
    let out = Command::new(env!("CARGO_BIN_EXE_relaxc"))
        .args(["rpc-server", "--emit"])
        .arg(&file)
        .args(["--target", &target.to_string()])
        .output()?;
    if !out.status.success() {
        return Err(format!("relaxc rpc-server --emit: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let bytes = std::fs::read(&file)?;
    if relaxc::target::elf_machine_of(&bytes) != Some(target.elf_machine()) {
        return Err("the server is not built for the target's CPU".into());
    }
    let needed = common::needed_libraries(&file)?;
    if needed.iter().any(|l| !l.starts_with("libc.so")) || needed.is_empty() {
        return Err(format!("the server needs {needed:?}; only libc is allowed").into());
    }
    // The emitted file is the server: it runs (under qemu for a board) and serves the workflow.
    let mut command = if target.is_host() {
        Command::new(&file)
    } else {
        let mut c = Command::new(target.qemu());
        c.arg("-L").arg(target.sysroot()).arg(&file);
        c
    };
    let server = Server::spawn(command.args(["--port", "0"]))?;
    let mut client = rpc_client::connect(server.port, "")?;
    if client.get_global("tvm.rpc.server.upload")? == 0 {
        return Err("the emitted server has no upload".into());
    }
    client.shutdown()?;
    Ok(())
}

fn signals() -> Result<(), Failed> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let work = tempfile::tempdir()?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_relaxc"));
        command.args(["rpc-server", "--port", "0", "--workdir"]).arg(work.path());
        let mut server = Server::spawn(&mut command)?;
        // A session is open (holding an upload) when the signal comes.
        let mut client = rpc_client::connect(server.port, "")?;
        client.upload("held.bin", b"held")?;
        let status = server.stop_with(signal)?;
        if !status.success() || !server.log().contains("stopped") {
            return Err(format!("after signal {signal}: exit {status}, stderr {:?}", server.log()).into());
        }
        if std::fs::read_dir(work.path())?.count() != 0 {
            return Err(format!("signal {signal} left the session directory behind").into());
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_relaxc")).args(["rpc-server", "--max-upload", "lots"]).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(2) || !err.contains("--max-upload takes a size") {
        return Err(format!("a bad size: exit {:?}, {err}", out.status.code()).into());
    }
    Ok(())
}

// ---- TVM's own client ----------------------------------------------------------------------------

fn tvm_missing() -> Option<String> {
    let probe = Command::new("python3").args(["-c", "import tvm, numpy"]).output();
    match probe {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "python3 cannot import tvm (pip install apache-tvm==0.27.0.post1): {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        )),
        Err(e) => Some(format!("python3 cannot run: {e}")),
    }
}

/// TVM 0.27's unchanged client (tests/rpc_client/tvm_client.py) against the server for
/// `target` started as a user would, with mlp_static and calls in both modes.
fn tvm_client(target: &Target) -> Result<Completion, Failed> {
    if let Some(why) = tvm_missing() {
        return common::tool_missing(format!("TVM's client test skipped: {why}"));
    }
    let mut models = Vec::new();
    for name in ["mlp_static", "calls"] {
        for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
            let so = if target.is_host() {
                common::build(name, &common::fixtures_dir().join(name).join("m.tar"), mode)?
            } else {
                let tar = common::root().join("fixtures/tvm-cross").join(target.cpu()).join(name).join("m.tar");
                let mut options = relaxc::compile::Options::mode(mode);
                options.target = target.clone();
                common::build_with(
                    &format!("rpc_{name}"),
                    &tar,
                    &options,
                    &format!("{}.{}", target.cpu(), common::mode_name(mode)),
                )?
            };
            let inputs = npz::read_inputs(&common::fixtures_dir().join(name).join("ok_basic.in.npz"))?;
            let expected = if target.is_host() {
                native_run(so.clone())(&inputs)?
            } else {
                board_run(so.clone(), target.clone())(&inputs)?
            };
            let expected_file = so.with_extension("expected.npz");
            npz::write_outputs(&expected_file, &expected)?;
            models.push(format!("{}={}={}", name, so.display(), expected_file.display()));
        }
    }
    // As a user starts it: `relaxc rpc-server` here; for a board, the file `--emit` wrote, under qemu.
    let relaxc = env!("CARGO_BIN_EXE_relaxc");
    let emitted = tempfile::tempdir()?;
    let mut command = if target.is_host() {
        let mut c = Command::new(relaxc);
        c.arg("rpc-server");
        c
    } else {
        let file = emitted.path().join("relaxc-rpc-server");
        let st = Command::new(relaxc)
            .args(["rpc-server", "--emit"])
            .arg(&file)
            .args(["--target", &target.to_string()])
            .status()?;
        if !st.success() {
            return Err("relaxc rpc-server --emit failed".into());
        }
        let mut c = Command::new(target.qemu());
        c.arg("-L").arg(target.sysroot()).arg(&file);
        c
    };
    let server = Server::spawn(command.args(["--host", "127.0.0.1", "--port", "0"]))?;
    let script = common::root().join("tests/rpc_client/tvm_client.py");
    let mut command = Command::new("python3");
    command.arg(&script).arg(server.port.to_string()).arg(common::fixtures_dir());
    if target.is_host() {
        command.arg("--exact-tvm");
    }
    let out = command.args(&models).output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("TVM's client failed:\n{text}\nserver log:\n{}", server.log()).into());
    }
    eprintln!("{}", text.trim_end());
    Ok(Completion::Completed)
}

/// A child process killed when the test ends (TVM's tracker).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// TVM's own tracker (python -m tvm.exec.rpc_tracker) with relaxc's server registered under
/// "board", and TVM's client taking its session from the tracker.
fn tvm_tracker() -> Result<Completion, Failed> {
    let missing = tvm_missing().or_else(|| {
        let probe = Command::new("python3").args(["-c", "import tornado"]).output();
        (!probe.is_ok_and(|o| o.status.success()))
            .then(|| "python3 lacks tornado, which TVM's tracker needs".to_string())
    });
    if let Some(why) = missing {
        return common::tool_missing(format!("TVM's tracker test skipped: {why}"));
    }
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let tracker = Command::new("python3")
        .args(["-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--port-end", &(port + 1).to_string(), "--silent"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let _tracker = Reaped(tracker);
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(30) {
            return Err("TVM's tracker did not start".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_relaxc"));
    command.args(["rpc-server", "--host", "127.0.0.1", "--port", "0", "--key", "board"]);
    let server = Server::spawn(command.args(["--tracker", &format!("127.0.0.1:{port}")]))?;
    let so = mlp(ExecMode::Compiled)?;
    let expected = native_run(so.clone())(&mlp_inputs()?)?;
    let expected_file = so.with_extension("tracker-expected.npz");
    npz::write_outputs(&expected_file, &expected)?;
    let model = format!("mlp_static={}={}", so.display(), expected_file.display());
    let out = Command::new("python3")
        .arg(common::root().join("tests/rpc_client/tvm_client.py"))
        .arg(format!("tracker:{port}"))
        .arg(common::fixtures_dir())
        .args(["--exact-tvm", &model])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("TVM's client through TVM's tracker:\n{text}\nserver log:\n{}", server.log()).into());
    }
    eprintln!("through TVM's tracker: {}", text.trim_end());
    Ok(Completion::Completed)
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for fixture in common::fixtures().into_iter().map(Arc::new) {
        for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
            let f = fixture.clone();
            trials.push(Trial::test(format!("native::{}::{}", fixture.name, common::mode_name(mode)), move || {
                native_fixture(&f, mode)
            }));
        }
    }
    let plain: [(&str, Check); 12] = [
        ("protocol::wrong_key", wrong_key),
        ("protocol::chunked_copies", chunked_copies),
        ("protocol::upload_limit", upload_limit),
        ("protocol::memory_limit", memory_limit),
        ("protocol::reupload", reupload),
        ("protocol::errors_keep_session", errors_keep_session),
        ("protocol::session_timeout", session_timeout),
        ("protocol::tracker", tracker),
        ("safety::upload_names", upload_names),
        ("safety::malformed_packets_1000", malformed_packets),
        ("safety::sessions_200", sessions_200),
        ("cli::signals", signals),
    ];
    trials.extend(plain.iter().map(|&(name, f)| Trial::test(name, f)));
    trials.push(Trial::ignorable_test("safety::valgrind_sessions", valgrind_sessions));
    let native = host();
    trials.push(Trial::test("cli::emit::native", move || emit(&native)));
    trials.push(Trial::ignorable_test("tvm_client::native", || tvm_client(&host())));
    trials.push(Trial::ignorable_test("tvm_client::tracker", tvm_tracker));
    for triple in ["aarch64-unknown-linux-gnu", "riscv64gc-unknown-linux-gnu"] {
        let target = Target::parse(triple).expect("supported target");
        let cpu = target.cpu();
        if let Some(why) = common::board_unavailable(&target) {
            assert!(std::env::var_os("CI").is_none(), "CI needs the {cpu} toolchain and qemu: {why}");
            let reason = format!("{cpu} RPC tests skipped: {why}");
            trials.push(Trial::ignorable_test(format!("{cpu}::skipped"), move || Ok(Completion::ignored_with(reason))));
            continue;
        }
        for name in BOARD_FIXTURES {
            for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
                let t = target.clone();
                trials.push(Trial::test(format!("{cpu}::{name}::{}", common::mode_name(mode)), move || {
                    board_fixture(&t, name, mode)
                }));
            }
        }
        let t = target.clone();
        trials.push(Trial::test(format!("{cpu}::cli::emit"), move || emit(&t)));
        if cpu == "aarch64" {
            let t = target.clone();
            trials.push(Trial::ignorable_test(format!("{cpu}::tvm_client"), move || tvm_client(&t)));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
