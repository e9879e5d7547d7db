//! Rust mirror of `runtime-shim/include/rvm.h` (ABI version 2). The layout is checked against
//! the C header by a test that compiles a probe (tests/artifact.rs).

use std::ffi::{c_char, c_int, c_void};

/// The newest version this host speaks.
pub const ABI_VERSION: u32 = 2;
/// The oldest version this host still loads (without the registry).
pub const ABI_VERSION_MIN: u32 = 1;

pub const TYPE_NONE: i32 = 0;
pub const TYPE_INT: i32 = 1;
pub const TYPE_BOOL: i32 = 2;
pub const TYPE_FLOAT: i32 = 3;
pub const TYPE_OPAQUE_PTR: i32 = 4;
pub const TYPE_DATA_TYPE: i32 = 5;
pub const TYPE_DLTENSOR_PTR: i32 = 7;
pub const TYPE_STATIC_OBJECT_BEGIN: i32 = 64;
pub const TYPE_FUNCTION: i32 = 68;
pub const TYPE_SHAPE: i32 = 69;
pub const TYPE_TENSOR: i32 = 70;
pub const TYPE_ARRAY: i32 = 71;

/// TVMFFIAny: type index, padding, and an 8-byte payload.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Any {
    pub type_index: i32,
    pub zero_padding: u32,
    pub payload: u64,
}

impl Any {
    pub fn int(v: i64) -> Any {
        Any { type_index: TYPE_INT, zero_padding: 0, payload: v as u64 }
    }
    pub fn float(v: f64) -> Any {
        Any { type_index: TYPE_FLOAT, zero_padding: 0, payload: v.to_bits() }
    }
    pub fn dltensor(t: *const DLTensor) -> Any {
        Any { type_index: TYPE_DLTENSOR_PTR, zero_padding: 0, payload: t as u64 }
    }
    pub fn is_object(&self) -> bool {
        self.type_index >= TYPE_STATIC_OBJECT_BEGIN
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

#[repr(C)]
#[derive(Debug)]
pub struct ModuleInfo {
    pub abi_version: u32,
    pub exec_mode: u32,
    pub compiler_version: *const c_char,
    pub target_triple: *const c_char,
    pub executable_hash: u64,
    pub num_functions: i32,
    pub instrumented: i32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct VmStats {
    pub live_storage_bytes: u64,
    pub peak_storage_bytes: u64,
    pub storage_allocations: u64,
    pub pool_hits: u64,
}

pub type Module = c_void;
pub type Vm = c_void;

/// The API table as version 1 defined it; later versions only add entries at its end.
#[repr(C)]
pub struct Api {
    pub abi_version: u32,
    pub struct_size: u32,
    pub last_error: unsafe extern "C" fn() -> *const c_char,
    pub last_error_kind: unsafe extern "C" fn() -> *const c_char,
    pub module_open: unsafe extern "C" fn(out: *mut *mut Module) -> c_int,
    pub module_close: unsafe extern "C" fn(m: *mut Module),
    pub module_info: unsafe extern "C" fn(m: *const Module, out: *mut ModuleInfo) -> c_int,
    pub function_name: unsafe extern "C" fn(m: *const Module, index: i32) -> *const c_char,
    pub function_find: unsafe extern "C" fn(m: *const Module, name: *const c_char, out: *mut i32) -> c_int,
    pub function_arity: unsafe extern "C" fn(m: *const Module, index: i32) -> i32,
    pub vm_create: unsafe extern "C" fn(m: *mut Module, out: *mut *mut Vm) -> c_int,
    pub vm_destroy: unsafe extern "C" fn(vm: *mut Vm),
    pub vm_call: unsafe extern "C" fn(vm: *mut Vm, f: i32, args: *const Any, n: i32, result: *mut Any) -> c_int,
    pub vm_call_closure:
        unsafe extern "C" fn(vm: *mut Vm, c: *const Any, args: *const Any, n: i32, result: *mut Any) -> c_int,
    pub vm_stats: unsafe extern "C" fn(vm: *const Vm, out: *mut VmStats),
    pub vm_reset_stats: unsafe extern "C" fn(vm: *mut Vm),
    pub value_release: unsafe extern "C" fn(v: *mut Any),
    pub value_retain: unsafe extern "C" fn(v: *const Any, out: *mut Any),
    pub value_type_name: unsafe extern "C" fn(v: *const Any) -> *const c_char,
    pub shape_new: unsafe extern "C" fn(dims: *const i64, n: i64, out: *mut Any) -> c_int,
    pub shape_view: unsafe extern "C" fn(v: *const Any, dims: *mut *const i64, n: *mut i64) -> c_int,
    pub tuple_new: unsafe extern "C" fn(items: *const Any, n: i64, out: *mut Any) -> c_int,
    pub tuple_size: unsafe extern "C" fn(v: *const Any) -> i64,
    pub tuple_get: unsafe extern "C" fn(v: *const Any, index: i64, out: *mut Any) -> c_int,
    pub tensor_view: unsafe extern "C" fn(v: *const Any) -> *const DLTensor,
    pub tensor_export: unsafe extern "C" fn(v: *const Any, out: *mut *mut c_void) -> c_int,
    pub vm_create_on: unsafe extern "C" fn(m: *mut Module, device: DLDevice, out: *mut *mut Vm) -> c_int,
    pub tensor_to_host: unsafe extern "C" fn(v: *const Any, out: *mut Any) -> c_int,
}

/// The table of ABI version 2: version 1's, then the runtime-function registry.
#[repr(C)]
pub struct ApiV2 {
    pub v1: Api,
    pub function_register: unsafe extern "C" fn(
        name: *const c_char,
        f: SafeCall,
        self_: *mut c_void,
        self_deleter: Option<unsafe extern "C" fn(*mut c_void)>,
        override_: c_int,
    ) -> c_int,
    pub function_get: unsafe extern "C" fn(name: *const c_char, out: *mut Any) -> c_int,
    pub function_call: unsafe extern "C" fn(f: *const Any, args: *const Any, n: i32, result: *mut Any) -> c_int,
    pub error_set: unsafe extern "C" fn(kind: *const c_char, message: *const c_char),
    pub vm_set_instrument: unsafe extern "C" fn(vm: *mut Vm, hook: Option<SafeCall>, self_: *mut c_void) -> c_int,
}

/// The TVM-FFI safe-call signature.
pub type SafeCall = unsafe extern "C" fn(self_: *mut c_void, args: *const Any, n: i32, result: *mut Any) -> c_int;

pub type GetApi = unsafe extern "C" fn(abi_version: u32) -> *const Api;
