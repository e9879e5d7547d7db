//! `relaxc inspect`: a TVM export, a text form or a built model read back: TVM's listing and
//! statistics, the builder form or relaxc's text form, and for a `.so` how it was built.

use std::path::PathBuf;

use anyhow::{Context, Result};

#[derive(clap::Args)]
pub struct Args {
    /// A TVM export (.tar), relaxc's text form (.rvmasm) or a model built by relaxc (.so).
    input: PathBuf,
    /// Print the builder form (TVM's as_python()) instead of the listing.
    #[arg(long, conflicts_with = "asm")]
    python: bool,
    /// Print relaxc's text form instead: the listing plus constants, scopes, register counts
    /// and parameter names, complete enough to assemble back to the same executable.
    #[arg(long)]
    asm: bool,
}

pub fn run(args: Args) -> Result<()> {
    let Args { input, python, asm } = args;
    let exec = relaxc::inspect::load_executable(&input).with_context(|| format!("inspecting {}", input.display()))?;
    if asm {
        print!("{}", relaxc::vm::asm::disassemble(&exec));
        return Ok(());
    }
    if python {
        print!("{}", exec.as_python());
    } else {
        print!("{}", exec.as_text());
        print!("{}", exec.stats());
    }
    if let Some(cuda) = relaxc::inspect::cuda_listing(&input)? {
        println!("CUDA:");
        for line in cuda.lines() {
            println!("  {line}");
        }
    }
    if let Some(identity) = relaxc::inspect::identity(&input) {
        println!("Built by: {identity}");
    }
    if let Some(modes) = relaxc::inspect::function_modes(&input)? {
        println!("Execution:");
        for (name, compiled) in modes {
            let how = if compiled { format!("compiled (__vmtir__{name})") } else { "bytecode".to_string() };
            println!("  {name}: {how}");
        }
    }
    Ok(())
}
