//! Targets: the CPU a model is built for (`--target`, the host by default), the C toolchain that
//! builds its runtime shim, kernels and final link, and how a model for a foreign CPU is run
//! (qemu user mode). Everything in a model `.so` is built for one target.
//!
//! Toolchains are found in this order: `$CC_<triple>` (the cc crate's convention, dashes as
//! underscores), `$RELAXC_CC`, clang with `--target` when it is installed and can link for the
//! target, then Debian's cross gcc (`aarch64-linux-gnu-gcc`, `riscv64-linux-gnu-gcc`). For the
//! host, `$CC`, then clang, then `cc`, as before.

pub mod shim;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};

use target_lexicon::{Architecture, OperatingSystem, Triple};

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error(
        "unknown target {given:?}: {message} (supported: x86_64-unknown-linux-gnu, aarch64-unknown-linux-gnu, riscv64gc-unknown-linux-gnu)"
    )]
    Parse { given: String, message: String },
    #[error(
        "no C toolchain for {target}: tried {tried}; install Debian's {package} (and {libc}), or set {env} or RELAXC_CC"
    )]
    NoToolchain { target: String, tried: String, package: String, libc: String, env: String },
    #[error("{what}: {message}")]
    Build { what: String, message: String },
    #[error("cannot run a {target} model here: {message}")]
    Run { target: String, message: String },
}

/// A CPU and OS relaxc builds for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub triple: Triple,
}

/// ELF machine numbers (e_machine).
pub const EM_X86_64: u16 = 62;
pub const EM_AARCH64: u16 = 183;
pub const EM_RISCV: u16 = 243;

impl Target {
    pub fn host() -> Target {
        Target { triple: Triple::host() }
    }

    /// A target-lexicon triple relaxc supports: Linux on x86-64, AArch64 or 64-bit RISC-V.
    pub fn parse(s: &str) -> Result<Target, TargetError> {
        let triple =
            Triple::from_str(s).map_err(|e| TargetError::Parse { given: s.to_string(), message: e.to_string() })?;
        let supported =
            matches!(triple.architecture, Architecture::X86_64 | Architecture::Aarch64(_) | Architecture::Riscv64(_))
                && triple.operating_system == OperatingSystem::Linux;
        if !supported {
            return Err(TargetError::Parse {
                given: s.to_string(),
                message: "relaxc builds for Linux on these CPUs".into(),
            });
        }
        Ok(Target { triple })
    }

    pub fn is_host(&self) -> bool {
        self.elf_machine() == Target::host().elf_machine()
    }

    pub fn elf_machine(&self) -> u16 {
        match self.triple.architecture {
            Architecture::Aarch64(_) => EM_AARCH64,
            Architecture::Riscv64(_) => EM_RISCV,
            _ => EM_X86_64,
        }
    }

    /// The GNU name of the target (Debian's cross tools and sysroots use it).
    pub fn gnu_triple(&self) -> &'static str {
        match self.triple.architecture {
            Architecture::Aarch64(_) => "aarch64-linux-gnu",
            Architecture::Riscv64(_) => "riscv64-linux-gnu",
            _ => "x86_64-linux-gnu",
        }
    }

    /// The CPU's short name ("x86_64", "aarch64", "riscv64").
    pub fn cpu(&self) -> &'static str {
        self.gnu_triple().split('-').next().unwrap_or("x86_64")
    }

    /// qemu user mode's program for this CPU.
    pub fn qemu(&self) -> String {
        format!("qemu-{}", self.cpu())
    }

    /// Where Debian's cross libc for this target lives (qemu's -L).
    pub fn sysroot(&self) -> PathBuf {
        PathBuf::from("/usr").join(self.gnu_triple())
    }

    fn env_name(&self) -> String {
        format!("CC_{}", self.triple.to_string().replace('-', "_"))
    }

    fn debian_libc(&self) -> &'static str {
        match self.triple.architecture {
            Architecture::Aarch64(_) => "libc6-dev-arm64-cross",
            Architecture::Riscv64(_) => "libc6-dev-riscv64-cross",
            _ => "libc6-dev",
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.triple)
    }
}

/// The name of an ELF machine number, for messages.
pub fn machine_name(machine: u16) -> String {
    match machine {
        EM_X86_64 => "x86_64".into(),
        EM_AARCH64 => "aarch64".into(),
        EM_RISCV => "riscv64".into(),
        other => format!("ELF machine {other}"),
    }
}

/// The ELF machine of an object or shared library's bytes.
pub fn elf_machine_of(bytes: &[u8]) -> Option<u16> {
    if bytes.len() < 20 || !bytes.starts_with(b"\x7fELF") || bytes[5] != 1 {
        return None;
    }
    Some(u16::from_le_bytes([bytes[18], bytes[19]]))
}

/// A C compiler driver for a target: the program and the arguments that precede every use.
#[derive(Clone, Debug)]
pub struct Toolchain {
    pub program: String,
    pub args: Vec<String>,
}

impl Toolchain {
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args);
        c
    }

    /// The archiver that goes with the compiler (for the cross-built shim).
    pub fn archiver(&self) -> String {
        let out = self.command().arg("-print-prog-name=ar").output();
        match out {
            Ok(o) if o.status.success() => {
                let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
                if p.is_empty() { "ar".into() } else { p }
            }
            _ => "ar".into(),
        }
    }

    /// What identifies the toolchain for caching: the program, its arguments, its version.
    pub fn identity(&self) -> String {
        let version = self
            .command()
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        format!("{} {} {}", self.program, self.args.join(" "), version.lines().next().unwrap_or(""))
    }

    fn plain(program: &str) -> Toolchain {
        Toolchain { program: program.to_string(), args: Vec::new() }
    }
}

fn runs(c: &mut Command) -> bool {
    c.output().map(|o| o.status.success()).unwrap_or(false)
}

fn env_compiler(name: &str) -> Option<Toolchain> {
    let v = std::env::var(name).ok().filter(|s| !s.trim().is_empty())?;
    let mut words = v.split_whitespace().map(String::from);
    let program = words.next()?;
    Some(Toolchain { program, args: words.collect() })
}

/// clang with `--target`, if it can build and link a shared library for the target. The answer
/// is kept for the process: the probe (a compile and a link, 120-150 ms on Zen 3) was about half
/// of every aarch64 model's link, and it ran again for every model a process built.
fn clang_for(target: &Target) -> Option<Toolchain> {
    static PROBED: OnceLock<Mutex<HashMap<&'static str, Option<Toolchain>>>> = OnceLock::new();
    let probed = PROBED.get_or_init(Default::default);
    let triple = target.gnu_triple();
    if let Some(known) = probed.lock().ok().and_then(|p| p.get(triple).cloned()) {
        return known;
    }
    let found = probe_clang(target);
    if let Ok(mut p) = probed.lock() {
        p.insert(triple, found.clone());
    }
    found
}

fn probe_clang(target: &Target) -> Option<Toolchain> {
    let t = Toolchain { program: "clang".into(), args: vec![format!("--target={}", target.gnu_triple())] };
    if !runs(Command::new("clang").arg("--version")) {
        return None;
    }
    let dir = tempfile::tempdir().ok()?;
    let src = dir.path().join("probe.c");
    std::fs::write(&src, "int relaxc_probe(void) { return 0; }\n").ok()?;
    let ok = runs(t.command().args(["-shared", "-fPIC", "-o"]).arg(dir.path().join("probe.so")).arg(&src));
    ok.then_some(t)
}

/// The compiler driver that links host models: `$CC`, else `cc`. The sanitizer runtimes a
/// sanitizer build of relaxc links into models are that driver's.
pub fn host_linker() -> String {
    std::env::var("CC").ok().filter(|s| !s.trim().is_empty()).unwrap_or_else(|| "cc".to_string())
}

/// The C toolchain for a target (see the module comment for the search order).
pub fn toolchain(target: &Target) -> Result<Toolchain, TargetError> {
    static HOST: OnceLock<Toolchain> = OnceLock::new();
    if target.is_host() {
        if let Some(t) = env_compiler("RELAXC_CC") {
            return Ok(t);
        }
        return Ok(HOST
            .get_or_init(|| {
                if let Some(t) = env_compiler("CC") {
                    return t;
                }
                if runs(Command::new("clang").arg("--version")) {
                    Toolchain::plain("clang")
                } else {
                    Toolchain::plain("cc")
                }
            })
            .clone());
    }
    let mut tried = Vec::new();
    for name in [target.env_name(), "RELAXC_CC".to_string()] {
        if let Some(t) = env_compiler(&name) {
            return Ok(t);
        }
        tried.push(format!("${name} (unset)"));
    }
    if let Some(t) = clang_for(target) {
        return Ok(t);
    }
    tried.push(format!("clang --target={} (missing or cannot link for it)", target.gnu_triple()));
    let gcc = format!("{}-gcc", target.gnu_triple());
    if runs(Command::new(&gcc).arg("--version")) {
        return Ok(Toolchain::plain(&gcc));
    }
    tried.push(format!("{gcc} (not found)"));
    Err(TargetError::NoToolchain {
        target: target.to_string(),
        tried: tried.join(", "),
        package: format!("gcc-{}", target.gnu_triple()),
        libc: target.debian_libc().to_string(),
        env: target.env_name(),
    })
}
