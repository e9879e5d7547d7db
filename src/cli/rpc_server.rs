//! `relaxc rpc-server`: builds the board server for the target (cached) and either writes it out
//! (`--emit`) or becomes it (exec, under qemu for another CPU).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use super::target_or_host;

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on. Any address other than loopback lets every client that reaches
    /// it upload and run code on this machine.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one; the server prints `listening on HOST:PORT`).
    #[arg(long, default_value_t = 9090)]
    port: u16,
    /// The key clients must give (tvm.rpc.connect(..., key=KEY)); with --tracker, the name
    /// clients request from the tracker.
    #[arg(long, default_value = "")]
    key: String,
    /// Register with TVM's RPC tracker at HOST:PORT (needs --key).
    #[arg(long, value_name = "HOST:PORT")]
    tracker: Option<String>,
    /// The largest file a client may upload (K, M, G suffixes).
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    max_upload: String,
    /// The largest message held in memory; the client splits tensor copies to fit it.
    #[arg(long, value_name = "SIZE", default_value = "16M")]
    max_packet: String,
    /// The most tensor memory a client may allocate at once (default: no limit; a session
    /// that runs the machine out of memory ends alone, the server goes on).
    #[arg(long, value_name = "SIZE")]
    max_memory: Option<String>,
    /// Where each session's private upload directory is made (default $TMPDIR or /tmp).
    #[arg(long, value_name = "DIR")]
    workdir: Option<PathBuf>,
    /// Write the server executable to FILE instead of running it (for --target's CPU).
    #[arg(long, value_name = "FILE")]
    emit: Option<PathBuf>,
    /// The CPU to build the server for (as `compile --target`; default: this machine).
    #[arg(long, value_name = "TRIPLE")]
    target: Option<String>,
}

pub fn run(args: Args) -> Result<()> {
    let Args { host, port, key, tracker, max_upload, max_packet, max_memory, workdir, emit, target } = args;
    let target = target_or_host(target)?;
    let tc = relaxc::target::toolchain(&target)?;
    let server = relaxc::target::shim::rpc_server(&target, &tc)?;
    if let Some(file) = emit {
        let bytes = std::fs::read(&server).with_context(|| format!("reading {}", server.display()))?;
        relaxc::outfile::write_bytes(&file, &bytes, true)?;
        eprintln!(
            "wrote {} ({target}, {} KiB, needs only libc): copy it to the board and run it there with the same options",
            file.display(),
            bytes.len().div_ceil(1024)
        );
        return Ok(());
    }
    let mut args = vec!["--host".to_string(), host, "--port".into(), port.to_string()];
    args.extend(["--key".into(), key, "--max-upload".into(), max_upload, "--max-packet".into(), max_packet]);
    if let Some(t) = tracker {
        args.extend(["--tracker".into(), t]);
    }
    if let Some(m) = max_memory {
        args.extend(["--max-memory".into(), m]);
    }
    if let Some(dir) = workdir {
        args.extend(["--workdir".into(), dir.display().to_string()]);
    }
    let mut command = if target.is_host() {
        std::process::Command::new(&server)
    } else {
        let mut c = std::process::Command::new(target.qemu());
        c.arg("-L").arg(target.sysroot()).arg(&server);
        c
    };
    command.args(&args);
    // The server takes over this process: its signals, its output and its exit status.
    let error = std::os::unix::process::CommandExt::exec(&mut command);
    bail!("cannot start {}: {error}", command.get_program().to_string_lossy())
}
