//! Running a model built for another CPU (`relaxc compile --target`) on this machine: a runner
//! built for that CPU (src/target/runner.c) loads it under qemu user mode, with the target's
//! libc as qemu's sysroot; arguments and results cross in the runner's "RVMVALS1" files.

use std::path::Path;
use std::process::Command;

use super::{HostError, Input, Output};
use crate::abi::DLDataType;
use crate::target::{Target, TargetError, elf_machine_of};

/// The target of a model file when it is not this machine's CPU.
pub fn foreign_target(path: &Path) -> Option<Target> {
    let mut head = [0u8; 20];
    let mut f = std::fs::File::open(path).ok()?;
    std::io::Read::read_exact(&mut f, &mut head).ok()?;
    let machine = elf_machine_of(&head)?;
    if machine == Target::host().elf_machine() {
        return None;
    }
    let triple = match machine {
        crate::target::EM_AARCH64 => "aarch64-unknown-linux-gnu",
        crate::target::EM_RISCV => "riscv64gc-unknown-linux-gnu",
        crate::target::EM_X86_64 => "x86_64-unknown-linux-gnu",
        _ => return None,
    };
    Target::parse(triple).ok()
}

/// What a foreign run gave: the results (tuples flattened) and what the runner printed.
pub struct ForeignRun {
    pub outputs: Vec<Output>,
    pub stdout: String,
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn encode(inputs: &[Input]) -> Vec<u8> {
    let mut out = b"RVMVALS1".to_vec();
    put_u32(&mut out, inputs.len() as u32);
    for input in inputs {
        match input {
            Input::Int(v) => {
                put_u32(&mut out, 1);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Input::Float(v) => {
                put_u32(&mut out, 3);
                out.extend_from_slice(&v.to_bits().to_le_bytes());
            }
            Input::Tensor(t) => {
                put_u32(&mut out, 4);
                out.extend_from_slice(&[t.dtype.code, t.dtype.bits]);
                out.extend_from_slice(&t.dtype.lanes.to_le_bytes());
                put_u32(&mut out, t.shape.len() as u32);
                for d in &t.shape {
                    out.extend_from_slice(&d.to_le_bytes());
                }
                let data = t.data.as_slice();
                out.extend_from_slice(&(data.len() as u64).to_le_bytes());
                out.extend_from_slice(data);
            }
            Input::Shape(dims) => {
                put_u32(&mut out, 5);
                put_u32(&mut out, dims.len() as u32);
                for d in dims {
                    out.extend_from_slice(&d.to_le_bytes());
                }
            }
        }
    }
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], HostError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else { return Err(HostError::Value("the runner's results are truncated".into())) };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, HostError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, HostError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

fn decode(bytes: &[u8]) -> Result<Vec<Output>, HostError> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(8)? != b"RVMVALS1" {
        return Err(HostError::Value("the runner wrote no results".into()));
    }
    let n = r.u32()?;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(match r.u32()? {
            0 => Output::Other("None".into()),
            1 => Output::Int(r.u64()? as i64),
            2 => Output::Bool(r.u64()? != 0),
            3 => Output::Float(f64::from_bits(r.u64()?)),
            4 => {
                let d = r.take(4)?;
                let dtype = DLDataType { code: d[0], bits: d[1], lanes: u16::from_le_bytes([d[2], d[3]]) };
                let ndim = r.u32()? as usize;
                let shape = (0..ndim).map(|_| r.u64().map(|v| v as i64)).collect::<Result<Vec<_>, _>>()?;
                let nbytes = r.u64()? as usize;
                Output::Tensor { dtype, shape, data: r.take(nbytes)?.to_vec() }
            }
            5 => {
                let k = r.u32()? as usize;
                Output::Shape((0..k).map(|_| r.u64().map(|v| v as i64)).collect::<Result<Vec<_>, _>>()?)
            }
            6 => {
                let len = r.u32()? as usize;
                Output::Other(String::from_utf8_lossy(r.take(len)?).into_owned())
            }
            7 => {
                let len = r.u32()? as usize;
                Output::Other(format!("function {}", String::from_utf8_lossy(r.take(len)?)))
            }
            8 => {
                let len = r.u32()? as usize;
                let kind = String::from_utf8_lossy(r.take(len)?).into_owned();
                let len = r.u32()? as usize;
                Output::Other(format!("error {kind}: {}", String::from_utf8_lossy(r.take(len)?)))
            }
            k => return Err(HostError::Value(format!("the runner wrote an unknown value kind {k}"))),
        });
    }
    Ok(out)
}

fn run_error(target: &Target, message: impl Into<String>) -> HostError {
    HostError::Value(TargetError::Run { target: target.to_string(), message: message.into() }.to_string())
}

/// One function's results under qemu (tuples flattened), or its error as "Kind: message".
pub type Outcome = Result<Vec<Output>, String>;

/// Calls every function of the model with the same inputs under qemu (one qemu start for all):
/// per function, its name and its results (tuples flattened) or its error ("Kind: message").
pub fn run_all(path: &Path, target: &Target, inputs: &[Input]) -> Result<Vec<(String, Outcome)>, HostError> {
    let values = run(path, target, "*", inputs, 0, false)?.outputs;
    let mut out: Vec<(String, Outcome)> = Vec::new();
    for v in values {
        match v {
            Output::Other(s) if s.starts_with("function ") => {
                out.push((s["function ".len()..].to_string(), Ok(Vec::new())))
            }
            Output::Other(s) if s.starts_with("error ") => {
                if let Some(last) = out.last_mut() {
                    last.1 = Err(s["error ".len()..].to_string());
                }
            }
            other => {
                if let Some((_, Ok(results))) = out.last_mut() {
                    results.push(other);
                }
            }
        }
    }
    Ok(out)
}

/// Calls `func` of the model at `path` (built for `target`) under qemu.
pub fn run(
    path: &Path,
    target: &Target,
    func: &str,
    inputs: &[Input],
    bench: usize,
    stats: bool,
) -> Result<ForeignRun, HostError> {
    let qemu = target.qemu();
    if Command::new(&qemu).arg("--version").output().is_err() {
        return Err(run_error(target, format!("{qemu} is not installed (Debian's qemu-user package provides it)")));
    }
    let sysroot = std::env::var_os("QEMU_LD_PREFIX").map(std::path::PathBuf::from).unwrap_or_else(|| target.sysroot());
    if !sysroot.join("lib").exists() {
        return Err(run_error(
            target,
            format!(
                "no {target} libc at {} (install Debian's {}; or set QEMU_LD_PREFIX)",
                sysroot.display(),
                target.sysroot().display()
            ),
        ));
    }
    let tc = crate::target::toolchain(target).map_err(|e| run_error(target, e.to_string()))?;
    let runner = crate::target::shim::runner(target, &tc).map_err(|e| run_error(target, e.to_string()))?;
    let dir = tempfile::tempdir().map_err(|e| HostError::Value(e.to_string()))?;
    let (args_file, results_file) = (dir.path().join("args.bin"), dir.path().join("results.bin"));
    std::fs::write(&args_file, encode(inputs)).map_err(|e| HostError::Value(e.to_string()))?;
    let model = std::path::absolute(path).map_err(|e| HostError::Value(e.to_string()))?;
    let out = Command::new(&qemu)
        .arg("-L")
        .arg(&sysroot)
        .arg(&runner)
        .arg(&model)
        .arg(func)
        .arg(&args_file)
        .arg(&results_file)
        .arg(bench.to_string())
        .arg(if stats { "1" } else { "0" })
        .output()
        .map_err(|e| run_error(target, format!("cannot start {qemu}: {e}")))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(line) = stderr.lines().find(|l| l.starts_with("relaxc-runner-error\t")) {
        let mut parts = line.splitn(3, '\t').skip(1);
        let kind = parts.next().unwrap_or("RuntimeError").to_string();
        let message = parts.next().unwrap_or("").to_string();
        return Err(HostError::Call { kind, message });
    }
    if !out.status.success() {
        return Err(run_error(target, format!("the runner failed ({}): {stderr}", out.status)));
    }
    let bytes = std::fs::read(&results_file).map_err(|e| run_error(target, e.to_string()))?;
    Ok(ForeignRun { outputs: decode(&bytes)?, stdout: String::from_utf8_lossy(&out.stdout).into_owned() })
}
