//! `relaxc kernel-library`: the kernel library as a shared object for TVM's own process, so that
//! TVM's VM runs a module rewritten by relaxc.tvm on the very code relaxc models link.

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::target_or_host;

#[derive(clap::Args)]
pub struct Args {
    /// The shared object to write.
    #[arg(short, long)]
    output: PathBuf,
    /// The CPU to build for (as for compile; default: this machine).
    #[arg(long, value_name = "TRIPLE")]
    target: Option<String>,
}

pub fn run(args: Args) -> Result<()> {
    let Args { output, target } = args;
    let target = target_or_host(target)?;
    let exports = relaxc::compile::build_kernel_library(&output, &target)
        .with_context(|| format!("building the kernel library {}", output.display()))?;
    for e in exports {
        println!("{}\t{}", e.name, e.export);
    }
    Ok(())
}
