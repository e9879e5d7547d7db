//! relaxc: an ahead-of-time compiler from Relax VM programs to self-contained shared objects.
//!
//! The pipeline (docs/src/architecture/overview.md): an input — a TVM export (`tvm`), a
//! TVMScript program (`script` into `ir`, lowered by `lower`) or relaxc's text form
//! (`vm::asm`) — becomes a verified [`vm::Executable`] with its kernel objects (`kernels`,
//! `cuda`); `codegen` turns it into one
//! object (tables, and native code in compiled mode) and `link` links that with the kernels and
//! the C runtime shim for the `target`. `compile` drives it all; `inspect` reads a model back;
//! `host` loads a built model to run it. `abi` holds every layout shared with the shim.
//! Modules use only lower layers (tests/architecture.rs; docs/src/architecture/overview.md lists them).

pub mod abi;
pub mod codegen;
pub mod compile;
pub mod cuda;
pub mod diag;
pub mod host;
pub mod inspect;
pub mod ir;
pub mod kernel_object;
pub mod kernels;
pub mod link;
pub mod lower;
pub mod outfile;
pub mod script;
pub mod target;
pub mod tvm;
pub mod vm;
pub mod weights;
