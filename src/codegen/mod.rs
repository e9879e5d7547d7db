//! Everything relaxc emits into the model object: the program tables both modes read, and
//! (in compiled mode) native code for Relax functions.

pub mod builtins;
pub mod clif_text;
pub mod cuda_tables;
pub mod ffi_entries;
pub mod native;
pub mod shape_func;
pub mod tables;

pub use tables::{ExecMode, TablesError, emit_object};
