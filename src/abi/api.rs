//! The public C API of every model (`runtime-shim/include/rvm.h`): the versioned table of
//! functions `rvm_get_api` returns, and the structs it fills in.

use std::ffi::{c_char, c_int, c_void};
use std::mem::offset_of;

use super::{Any, DLDevice, DLTensor, c_struct};

/// The newest C API version (`RVM_ABI_VERSION`): what this relaxc's runtime speaks and its
/// hosts ask for.
pub const ABI_VERSION: u32 = 3;
/// The oldest version hosts still load (without the registry).
pub const ABI_VERSION_MIN: u32 = 1;

pub(super) fn constants() -> Vec<(&'static str, u64)> {
    vec![("RVM_ABI_VERSION", ABI_VERSION as u64)]
}

c_struct! {
    /// What `module_info` reports.
    #[derive(Debug)]
    pub struct ModuleInfo = "rvm_module_info" {
        pub abi_version: u32,
        pub exec_mode: u32,
        pub compiler_version: *const c_char,
        pub target_triple: *const c_char,
        pub executable_hash: u64,
        pub num_functions: i32,
        pub instrumented: i32,
    }
}

impl Default for ModuleInfo {
    fn default() -> ModuleInfo {
        ModuleInfo {
            abi_version: 0,
            exec_mode: 0,
            compiler_version: std::ptr::null(),
            target_triple: std::ptr::null(),
            executable_hash: 0,
            num_functions: 0,
            instrumented: 0,
        }
    }
}

c_struct! {
    /// Counters of one VM.
    #[derive(Debug, Default, Clone, Copy)]
    pub struct VmStats = "rvm_vm_stats" {
        pub live_storage_bytes: u64,
        pub peak_storage_bytes: u64,
        pub storage_allocations: u64,
        pub pool_hits: u64,
    }
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

/// The table of ABI version 3: version 2's, then host allocators.
#[repr(C)]
pub struct ApiV3 {
    pub v2: ApiV2,
    pub vm_create_with_allocator:
        unsafe extern "C" fn(m: *mut Module, allocator: *const Allocator, out: *mut *mut Vm) -> c_int,
    pub value_allocator: unsafe extern "C" fn(v: *const Any) -> *const Allocator,
    pub weights_open: unsafe extern "C" fn(m: *mut Module, path: *const c_char, out: *mut *mut c_void) -> c_int,
    pub weights_arguments: unsafe extern "C" fn(
        w: *const c_void,
        function: i32,
        num_inputs: i32,
        args: *mut Any,
        capacity: i32,
        count: *mut i32,
    ) -> c_int,
    pub weights_close: unsafe extern "C" fn(w: *mut c_void),
}

c_struct! {
    /// A host's allocator for a VM (`rvm_allocator`).
    pub struct Allocator = "rvm_allocator" {
        pub alloc: Option<unsafe extern "C" fn(ctx: *mut c_void, size: usize, alignment: usize) -> *mut c_void>,
        pub free: Option<unsafe extern "C" fn(ctx: *mut c_void, ptr: *mut c_void)>,
        pub ctx: *mut c_void,
    }
}

/// The TVM-FFI safe-call signature.
pub type SafeCall = unsafe extern "C" fn(self_: *mut c_void, args: *const Any, n: i32, result: *mut Any) -> c_int;

pub type GetApi = unsafe extern "C" fn(abi_version: u32) -> *const Api;

impl super::CStruct for ApiV3 {
    const C_NAME: &'static str = "rvm_api";
    fn fields() -> Vec<(&'static str, usize)> {
        macro_rules! at {
            ($($f:ident),*) => { vec![$((stringify!($f), offset_of!(Api, $f))),*] };
        }
        let mut fields = at!(
            abi_version,
            struct_size,
            last_error,
            last_error_kind,
            module_open,
            module_close,
            module_info,
            function_name,
            function_find,
            function_arity,
            vm_create,
            vm_destroy,
            vm_call,
            vm_call_closure,
            vm_stats,
            vm_reset_stats,
            value_release,
            value_retain,
            value_type_name,
            shape_new,
            shape_view,
            tuple_new,
            tuple_size,
            tuple_get,
            tensor_view,
            tensor_export,
            vm_create_on,
            tensor_to_host
        );
        macro_rules! at2 {
            ($($f:ident),*) => { vec![$((stringify!($f), offset_of!(ApiV2, $f))),*] };
        }
        fields.extend(at2!(function_register, function_get, function_call, error_set, vm_set_instrument));
        macro_rules! at3 {
            ($($f:ident),*) => { vec![$((stringify!($f), offset_of!(ApiV3, $f))),*] };
        }
        fields.extend(at3!(vm_create_with_allocator, value_allocator, weights_open, weights_arguments, weights_close));
        fields
    }
}
