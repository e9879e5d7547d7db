//! The program tables relaxc emits into every model and the shim reads in place
//! (`runtime-shim/src/internal.h`), and the names of the symbols and sections around them.

use std::ffi::{c_char, c_void};

use super::{DLDataType, c_struct};

/// "RVMPROG1", little-endian.
pub const PROGRAM_MAGIC: u64 = 0x3147_4f52_504d_5652;
/// Version of the program tables (`RVM_PROGRAM_VERSION`), independent of the C API's.
pub const PROGRAM_VERSION: u32 = 1;
/// `Program::exec_mode` of a model built with `--instrument` has this bit set.
pub const PROGRAM_INSTRUMENTED: u32 = 0x100;

/// `FuncInfo::kind`.
pub const FUNC_PACKED: i32 = 0;
pub const FUNC_BYTECODE: i32 = 1;
pub const FUNC_COMPILED: i32 = 2;

/// Symbol of the tensor constants' elements (hidden), defined by the constants object relaxc
/// writes beside the model object (`codegen::constants`).
pub const CONSTANTS_SYMBOL: &str = "rvm_model_constants";
/// Symbol of the program tables (hidden; read by the shim).
pub const PROGRAM_SYMBOL: &str = "rvm_model_program";
/// Non-allocated section holding the serialized executable, for `relaxc inspect`. Its tensor
/// constants carry no elements (their size field is `ELIDED_TENSOR_SIZE`): those are stored once,
/// in the model's data, where `CONSTS_SECTION` points.
pub const EXEC_SECTION: &str = ".rvm_exec";
/// Non-allocated section locating the tensor constants' elements: a little-endian u64, the
/// address of the constants' data object (a relocation the linker resolves), then one u64 per
/// constant-pool entry: its offset from there, or u64::MAX for a constant that is no tensor.
pub const CONSTS_SECTION: &str = ".rvm_consts";
/// The data size a tensor record in `EXEC_SECTION` gives when its elements are elsewhere.
pub const ELIDED_TENSOR_SIZE: i64 = -1;
/// Non-allocated section listing how each Relax function runs ("name\tcompiled" lines).
pub const MODES_SECTION: &str = ".rvm_modes";
/// Non-allocated section naming what built the model ("relaxc <version> c-api <N> target <T>"),
/// read by hosts that find no C API version they speak.
pub const IDENTITY_SECTION: &str = ".rvm_identity";
/// Non-allocated section listing a model's CUDA images and kernels.
pub const CUDA_LISTING_SECTION: &str = ".rvm_cuda";
/// The runtime's tvm-ffi entry that loads weights outside the model for Python
/// (runtime-shim/src/ffi_module.c), exported beside the model's functions.
pub const FFI_WEIGHTS_SYMBOL: &str = "__tvm_ffi_relaxc_weights";
/// The runtime's tvm-ffi entry that calls one of the library's runtime functions by name (the KV
/// cache's, for Python), exported beside the model's functions.
pub const FFI_CALL_SYMBOL: &str = "__tvm_ffi_relaxc_call";
/// What every kernel's symbol starts with: TVM-FFI's safe-call entry prefix.
pub const KERNEL_PREFIX: &str = "__tvm_ffi_";

pub(super) fn constants() -> Vec<(&'static str, u64)> {
    vec![
        ("RVM_PROGRAM_MAGIC", PROGRAM_MAGIC),
        ("RVM_PROGRAM_VERSION", PROGRAM_VERSION as u64),
        ("RVM_PROGRAM_INSTRUMENTED", PROGRAM_INSTRUMENTED as u64),
        ("RVM_FUNC_PACKED", FUNC_PACKED as u64),
        ("RVM_FUNC_BYTECODE", FUNC_BYTECODE as u64),
        ("RVM_FUNC_COMPILED", FUNC_COMPILED as u64),
    ]
}

c_struct! {
    /// One function-table entry.
    #[derive(Debug)]
    pub struct FuncInfo = "rvm_func_info" {
        pub name: *const c_char,
        pub packed: *const c_void,
        pub param_names: *const *const c_char,
        pub start_instr: i64,
        pub end_instr: i64,
        pub register_file_size: i64,
        pub kind: i32,
        pub num_args: i32,
        pub compiled: *const c_void,
    }
}

c_struct! {
    /// One constant-pool entry; `kind` is its TVM-FFI type index.
    #[derive(Debug)]
    pub struct ConstInfo = "rvm_const_info" {
        pub data: *const c_void,
        pub shape: *const i64,
        pub size: i64,
        pub kind: i32,
        pub ndim: i32,
        pub dtype: DLDataType,
        pub reserved: i32,
    }
}

c_struct! {
    /// The program header, `rvm_model_program`.
    #[derive(Debug)]
    pub struct Program = "rvm_program" {
        pub magic: u64,
        pub abi_version: u32,
        pub exec_mode: u32,
        pub compiler_version: *const c_char,
        pub target_triple: *const c_char,
        pub executable_hash: u64,
        pub num_funcs: i64,
        pub funcs: *const FuncInfo,
        pub num_consts: i64,
        pub consts: *const ConstInfo,
        pub num_instrs: i64,
        pub instr_offset: *const i64,
        pub instr_data: *const i64,
    }
}
