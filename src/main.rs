//! relaxc command line: parses the arguments, hands them to the command's module under `cli/`
//! and renders what fails. Each command owns its options and its implementation there.

mod cli;

use clap::{Parser, Subcommand};

/// The line `--help` ends with: the book's page for the job (the book is docs/ in relaxc's
/// repository; `mdbook build docs` renders it).
macro_rules! book {
    ($page:literal, $what:literal) => {
        concat!(
            "The manual's page on ",
            $what,
            ": docs/src/",
            $page,
            " in relaxc's repository (mdbook build docs renders the book)."
        )
    };
}

#[derive(Parser)]
#[command(
    name = "relaxc",
    version,
    about = "Ahead-of-time compiler from Relax VM programs to self-contained shared objects",
    long_about = "relaxc turns a Relax program into one self-contained .so: the program, its kernels and a small C \
                  runtime, loadable with dlopen through the C API in rvm.h. No libtvm and no Python are needed to run \
                  it. Input is a TVM 0.27 export (ex.export_library(\"m.tar\")), a TVMScript program (.py) whose \
                  operators are C or CUDA kernels, or relaxc's text form of a program (.rvmasm, from inspect --asm).",
    after_help = book!("introduction.md", "what relaxc is, with every job's page")
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile a model into a shared object.
    #[command(after_help = book!("guide/tvm-export.md", "compiling a TVM export"))]
    Compile(cli::compile::Args),
    /// Run a function of a compiled model on inputs from an .npz file.
    #[command(after_help = book!("guide/tvm-export.md", "running, and guide/profiling.md for --profile"))]
    Run(cli::run::Args),
    /// Generate tokens with an LLM (TVM nn / MLC export convention) on relaxc's paged KV cache.
    ///
    /// The model must have create_paged_kv_cache, embed, prefill and decode functions. Decoding
    /// is greedy (argmax): the first new token comes from prefill, the others from decode steps.
    /// A decode whose batch the export fixed runs its sequences that many at a time. Prints the
    /// new token ids (with --tokenizer, first the text as it is generated), the prefill latency
    /// and the decode speed.
    #[command(after_help = book!("guide/llm.md", "LLMs, and guide/gguf.md for GGUF files"))]
    Generate(cli::generate::Args),
    /// Build relaxc's kernel library as a shared object for TVM's own process.
    ///
    /// relaxc.tvm (the Python package in python/) loads it with tvm_ffi.load_module and
    /// registers each kernel under its global name (relaxc.matmul, ...), so that TVM's VM runs a
    /// module rewritten to call the library on the same code a relaxc model links: TVM, relaxc
    /// bytecode and relaxc compiled give the same bits. Prints one line per kernel: its global
    /// name, then its name in the library.
    #[command(after_help = book!("guide/kernel-library.md", "the kernel library in TVM"))]
    KernelLibrary(cli::kernel_library::Args),
    /// Serve relaxc models to TVM's RPC client: a board server needing only libc.
    ///
    /// TVM 0.27's unchanged Python client drives it: `remote = tvm.rpc.connect(host, port,
    /// key=KEY)`, `remote.upload("m.so")`, `rmod = remote.load_module("m.so")`, tensors on
    /// `remote.cpu()`, `rmod["main"](x).numpy()`, `rmod.time_evaluator("main", dev)(x)`. A client
    /// can upload a library and run its code as the server's user, so the server listens on
    /// 127.0.0.1 unless --host says otherwise. One session at a time, each in its own process and
    /// its own upload directory, removed when the session ends.
    ///
    /// With --emit, writes the server as one executable for a board instead (the same options
    /// then apply on the board: `./relaxc-rpc-server --host 0.0.0.0 --key board`). With --target
    /// alone, runs the server for that CPU here under qemu user mode.
    #[command(after_help = book!("guide/boards.md", "boards and TVM's RPC"))]
    RpcServer(cli::rpc_server::Args),
    /// Print the listing (as TVM's as_text()) and statistics of a TVM export or a compiled model.
    #[command(after_help = book!("guide/tvm-export.md", "inspecting"))]
    Inspect(cli::inspect::Args),
}

fn main() {
    // SAFETY: installing a handler before any thread starts; it only calls async-signal-safe code.
    unsafe { libc::signal(libc::SIGABRT, cli::out_of_memory::out_of_memory_exit as *const () as libc::sighandler_t) };
    // Rust ignores SIGPIPE, so printing into a closed pipe (`relaxc inspect m.so | head`) would
    // panic; with the default action the process ends quietly, as other command-line tools do.
    // SAFETY: setting a signal's disposition to the default before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let result = match Cli::parse().command {
        Command::Compile(args) => cli::compile::run(args),
        Command::Run(args) => cli::run::run(args),
        Command::Generate(args) => cli::generate::run(args),
        Command::KernelLibrary(args) => cli::kernel_library::run(args),
        Command::RpcServer(args) => cli::rpc_server::run(args),
        Command::Inspect(args) => cli::inspect::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {}", render_error(&e));
        std::process::exit(1);
    }
}

/// The error and its causes, joined by ": ", leaving out a cause that its parent's message
/// already ends with (library errors often print their source themselves).
fn render_error(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
