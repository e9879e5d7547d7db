//! relaxc: an ahead-of-time compiler from Relax VM programs to self-contained shared objects.
//!
//! The pipeline (see DESIGN.md): an input (a TVM export, `tvm`) becomes a [`vm::Executable`],
//! which is verified, turned into tables (and native code) by `codegen`, and linked with its
//! kernels and the C runtime shim by `link`. `host` loads a built model to run it.

pub mod abi;
pub mod codegen;
pub mod compile;
pub mod cuda;
pub mod host;
pub mod inspect;
pub mod ir;
pub mod kernel_object;
pub mod kernels;
pub mod link;
pub mod lower;
pub mod script;
pub mod target;
pub mod tvm;
pub mod vm;
pub mod weights;
