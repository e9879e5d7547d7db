//! Everything relaxc emits into the model object: the program tables both modes read
//! (`tables`), native code for Relax functions in compiled mode (`native`), shape functions,
//! tvm-ffi entry points and CUDA launchers, all in one object built with cranelift-object
//! (`object`). Packed functions are bound to symbols first (`binding`); what the shim offers
//! generated code comes from its own `.def` tables (`shim`).

pub mod binding;
pub mod clif_text;
pub mod constants;
pub mod cuda_tables;
pub mod ffi_entries;
pub mod native;
pub mod object;
pub mod shape_func;
pub mod shim;
pub mod tables;
mod trampoline;

pub use binding::bind_packed_functions;
pub use object::{EmittedObject, ObjectInputs, emit_object};

use cranelift_codegen::isa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_module::ModuleError;
use cranelift_object::{ObjectBuilder, ObjectModule};

/// How a model's Relax functions run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum ExecMode {
    /// Every Relax function runs in the shim's interpreter.
    Bytecode,
    /// Relax functions become native code (Cranelift); those it cannot lower stay bytecode.
    Compiled,
}

#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("unknown builtin {name} (pc {pc} of {function} calls it): relaxc's runtime does not provide it")]
    UnknownBuiltin { name: String, function: String, pc: i64 },
    #[error(
        "kernel {name} is not defined: no symbol {prefix}{name} in {objects} (called from {function} at pc {pc})",
        prefix = crate::abi::KERNEL_PREFIX
    )]
    MissingKernel { name: String, objects: String, function: String, pc: i64 },
    #[error(
        "{name} is a Python-registered TVM function, which relaxc does not provide yet (called from {function} at pc {pc})"
    )]
    PythonFunction { name: String, function: String, pc: i64 },
    #[error("cranelift: {0}")]
    Module(Box<ModuleError>),
    #[error("cranelift: {0}")]
    Isa(String),
    #[error("cranelift could not compile a function: {0}")]
    Compile(String),
    #[error("cannot write the object: {0}")]
    Object(String),
}

impl From<ModuleError> for CodegenError {
    fn from(e: ModuleError) -> CodegenError {
        CodegenError::Module(Box::new(e))
    }
}

/// Makes the Cranelift object module for a target.
pub fn object_module(name: &str, triple: &target_lexicon::Triple) -> Result<ObjectModule, CodegenError> {
    let mut flags = settings::builder();
    flags.set("is_pic", "true").map_err(|e| CodegenError::Isa(e.to_string()))?;
    flags.set("opt_level", "speed").map_err(|e| CodegenError::Isa(e.to_string()))?;
    // Cranelift checks its IR after every pass unless told not to: worth it in the tests, a
    // tenth of the compile time otherwise.
    let verify = if cfg!(debug_assertions) { "true" } else { "false" };
    flags.set("enable_verifier", verify).map_err(|e| CodegenError::Isa(e.to_string()))?;
    let isa = isa::lookup(triple.clone())
        .map_err(|e| CodegenError::Isa(e.to_string()))?
        .finish(settings::Flags::new(flags))
        .map_err(|e| CodegenError::Isa(e.to_string()))?;
    let builder = ObjectBuilder::new(isa, name, cranelift_module::default_libcall_names())?;
    Ok(ObjectModule::new(builder))
}
