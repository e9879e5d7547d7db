//! Loading a built model `.so` into this process through its C API, the way any C host does:
//! `dlopen`, `rvm_get_api`, one module, VMs, calls. Used by `relaxc run` and the tests.

pub mod external;
pub mod foreign;
pub mod heap;
pub mod llm;
pub mod npz;
pub mod profile;
pub mod soak;

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ffi::{CStr, CString, c_void};
use std::path::Path;

use crate::abi::{self, Any, Api, DLDataType, DLDevice, DLTensor};

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot load {path}: {message}")]
    Load { path: String, message: String },
    #[error("{path} is not a relaxc model: {message}")]
    NotAModel { path: String, message: String },
    #[error("{kind}: {message}")]
    Call { kind: String, message: String },
    #[error("{0}")]
    Value(String),
}

/// 64-byte aligned bytes (what TVM kernels assume of tensor data).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>; shared access only reads.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(len.max(1), 64).expect("buffer layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }
    pub fn from_bytes(bytes: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(bytes.len());
        b.as_mut_slice().copy_from_slice(bytes);
        b
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and self is borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { dealloc(self.ptr, Layout::from_size_align(self.len.max(1), 64).expect("buffer layout")) }
    }
}

/// A CPU tensor owned by the host.
pub struct HostTensor {
    pub dtype: DLDataType,
    pub shape: Vec<i64>,
    pub data: AlignedBuf,
}

impl HostTensor {
    pub fn new(dtype: DLDataType, shape: Vec<i64>, bytes: &[u8]) -> HostTensor {
        HostTensor { dtype, shape, data: AlignedBuf::from_bytes(bytes) }
    }
}

/// A call argument.
pub enum Input {
    Tensor(HostTensor),
    Shape(Vec<i64>),
    Int(i64),
    Float(f64),
}

/// A call result, copied out of the runtime.
#[derive(Debug, PartialEq)]
pub enum Output {
    Tensor {
        dtype: DLDataType,
        shape: Vec<i64>,
        data: Vec<u8>,
    },
    Shape(Vec<i64>),
    Int(i64),
    Bool(bool),
    Float(f64),
    Tuple(Vec<Output>),
    /// Something with no host form (a closure, a string): its type name.
    Other(String),
}

/// A loaded model: the library, its API table and one opened module.
pub struct Model {
    api: *const Api,
    /// The ABI version the library answered for (2 gives the registry as well).
    abi_version: u32,
    module: *mut abi::Module,
    _lib: libloading::Library,
}

/// An error's message followed by its causes' (libloading keeps dlerror()'s text in a source).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text
}

fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the library returns NUL-terminated strings it owns.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

// SAFETY: rvm.h makes a module shareable across threads: it is immutable after module_open and
// its objects are reference counted atomically. VMs (not Send) are what must stay on one thread.
unsafe impl Send for Model {}
// SAFETY: as above.
unsafe impl Sync for Model {}

impl Model {
    pub fn load(path: &Path) -> Result<Model, HostError> {
        let shown = path.display().to_string();
        // dlopen searches the library path for a name without a slash; a user typing `m.so`
        // means the file here.
        let local;
        let path = if path.components().count() == 1 && !path.as_os_str().is_empty() {
            local = Path::new(".").join(path);
            local.as_path()
        } else {
            path
        };
        if let Err(e) = std::fs::metadata(path) {
            return Err(HostError::Load { path: shown, message: e.to_string() });
        }
        // SAFETY: loading a library runs its initialisers; relaxc models have none beyond libc's.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| HostError::Load { path: shown.clone(), message: error_chain(&e) })?;
        // SAFETY: the symbol's type is fixed by rvm.h.
        let get: libloading::Symbol<abi::GetApi> = unsafe { lib.get(b"rvm_get_api\0") }
            .map_err(|e| HostError::NotAModel { path: shown.clone(), message: e.to_string() })?;
        // SAFETY: calling the documented entry point.
        let mut found = None;
        for version in (abi::ABI_VERSION_MIN..=abi::ABI_VERSION).rev() {
            // SAFETY: calling the documented entry point.
            let api = unsafe { get(version) };
            if !api.is_null() {
                found = Some((api, version));
                break;
            }
        }
        let Some((api, abi_version)) = found else {
            let built_by = crate::inspect::identity(path).unwrap_or_else(|| "an unknown relaxc".to_string());
            return Err(HostError::NotAModel {
                path: shown,
                message: format!(
                    "it was built by {built_by}, whose C API this relaxc {} (C API versions {}..={}) does not speak; rebuild it with this relaxc",
                    env!("CARGO_PKG_VERSION"),
                    abi::ABI_VERSION_MIN,
                    abi::ABI_VERSION
                ),
            });
        };
        let mut module = std::ptr::null_mut();
        // SAFETY: api is a valid table for the life of lib.
        let rc = unsafe { ((*api).module_open)(&mut module) };
        let model = Model { api, abi_version, module, _lib: lib };
        if rc != 0 {
            let e = model.error();
            return Err(HostError::NotAModel { path: shown, message: e.to_string() });
        }
        Ok(model)
    }

    fn api(&self) -> &Api {
        // SAFETY: valid while the library is loaded, which self guarantees.
        unsafe { &*self.api }
    }

    /// The table as version `version` defines it (`T`, whose fields begin with the older
    /// versions'), or an error saying the library, built by an older relaxc, has no `lacks`.
    fn api_at<T>(&self, version: u32, lacks: &str) -> Result<&T, HostError> {
        let size = self.api().struct_size as usize;
        if self.abi_version < version || size < std::mem::size_of::<T>() {
            return Err(HostError::Value(format!(
                "this model speaks ABI version {} (built by an older relaxc): it has no {lacks}; rebuild it",
                self.abi_version
            )));
        }
        // SAFETY: the library answered `version` with a table of at least T's size, and T is that
        // version's #[repr(C)] table.
        Ok(unsafe { &*(self.api as *const T) })
    }

    fn api_v2(&self) -> Result<&abi::ApiV2, HostError> {
        self.api_at(2, "runtime-function registry")
    }

    fn error(&self) -> HostError {
        // SAFETY: API calls with no arguments.
        let (kind, message) = unsafe { (cstr((self.api().last_error_kind)()), cstr((self.api().last_error)())) };
        HostError::Call { kind, message }
    }

    fn raw_info(&self) -> abi::ModuleInfo {
        let mut info = abi::ModuleInfo::default();
        // SAFETY: module is open; info is a valid out-pointer.
        unsafe { (self.api().module_info)(self.module, &mut info) };
        info
    }

    /// Whether the model was built with `--instrument` (so a hook can be set).
    pub fn instrumented(&self) -> bool {
        self.abi_version >= 2 && self.raw_info().instrumented != 0
    }

    /// Execution mode, compiler version, target triple and executable hash the model reports.
    pub fn info(&self) -> (u32, String, String, u64) {
        let info = self.raw_info();
        (info.exec_mode, cstr(info.compiler_version), cstr(info.target_triple), info.executable_hash)
    }

    /// Names of the Relax functions, in API index order.
    pub fn functions(&self) -> Vec<String> {
        (0..)
            .map(|i| unsafe { (self.api().function_name)(self.module, i) })
            .take_while(|p| !p.is_null())
            .map(cstr)
            .collect()
    }

    pub fn find(&self, name: &str) -> Result<i32, HostError> {
        let c = CString::new(name).map_err(|_| HostError::Value(format!("bad function name {name:?}")))?;
        let mut index = -1;
        // SAFETY: valid module, NUL-terminated name, valid out-pointer.
        if unsafe { (self.api().function_find)(self.module, c.as_ptr(), &mut index) } != 0 {
            return Err(self.error());
        }
        Ok(index)
    }

    /// Converts inputs into call arguments. Tensors are borrowed: `inputs` must outlive the result.
    pub fn prepare<'a>(&'a self, inputs: &'a [Input]) -> Result<PreparedArgs<'a>, HostError> {
        let model = self;
        let api = model.api();
        let mut args = PreparedArgs { api, anys: Vec::new(), _tensors: Vec::new(), owned: Vec::new() };
        for input in inputs {
            let any = match input {
                Input::Tensor(t) => {
                    args._tensors.push(DLTensor {
                        data: t.data.as_ptr() as *mut c_void,
                        device: DLDevice { device_type: 1, device_id: 0 },
                        ndim: t.shape.len() as i32,
                        dtype: t.dtype,
                        shape: t.shape.as_ptr() as *mut i64,
                        strides: std::ptr::null_mut(),
                        byte_offset: 0,
                    });
                    Any::default() // pointed at its DLTensor below, once the list is complete
                }
                Input::Shape(dims) => {
                    let mut any = Any::default();
                    // SAFETY: dims is a valid slice; any is a valid out-pointer.
                    if unsafe { (api.shape_new)(dims.as_ptr(), dims.len() as i64, &mut any) } != 0 {
                        return Err(self.error());
                    }
                    args.owned.push(args.anys.len());
                    any
                }
                Input::Int(v) => Any::int(*v),
                Input::Float(v) => Any::float(*v),
            };
            args.anys.push(any);
        }
        let slots = inputs.iter().enumerate().filter(|(_, i)| matches!(i, Input::Tensor(_))).map(|(k, _)| k);
        for (slot, dl) in slots.zip(&args._tensors) {
            args.anys[slot] = Any::dltensor(dl);
        }
        Ok(args)
    }

    /// A new Shape value.
    pub fn shape(&self, dims: &[i64]) -> Result<Value<'_>, HostError> {
        let mut out = Any::default();
        // SAFETY: dims is a valid slice; out is a valid out-pointer.
        if unsafe { (self.api().shape_new)(dims.as_ptr(), dims.len() as i64, &mut out) } != 0 {
            return Err(self.error());
        }
        Ok(Value { api: self.api(), any: out })
    }

    /// A runtime function of the library (or one a host registered), by name.
    pub fn function(&self, name: &str) -> Result<Value<'_>, HostError> {
        let c = CString::new(name).map_err(|_| HostError::Value(format!("bad function name {name:?}")))?;
        let mut out = Any::default();
        // SAFETY: NUL-terminated name, valid out-pointer.
        if unsafe { (self.api_v2()?.function_get)(c.as_ptr(), &mut out) } != 0 {
            return Err(self.error());
        }
        Ok(Value { api: self.api(), any: out })
    }

    /// Calls a Function value with raw arguments (borrowed for the call).
    pub fn call_function(&self, f: &Value, args: &[Any]) -> Result<Value<'_>, HostError> {
        let mut out = Any::default();
        // SAFETY: f is a value of this library; args are valid for the call.
        let rc = unsafe { (self.api_v2()?.function_call)(&f.any, args.as_ptr(), args.len() as i32, &mut out) };
        if rc != 0 {
            return Err(self.error());
        }
        Ok(Value { api: self.api(), any: out })
    }

    /// Registers a host function under `name` (see rvm.h's function_register).
    ///
    /// # Safety
    /// `f` must follow the TVM-FFI safe-call convention; `self_` must stay valid while the
    /// library is loaded (it is passed to every call).
    pub unsafe fn register_function(
        &self,
        name: &str,
        f: abi::SafeCall,
        self_: *mut c_void,
        override_: bool,
    ) -> Result<(), HostError> {
        let c = CString::new(name).map_err(|_| HostError::Value(format!("bad function name {name:?}")))?;
        // SAFETY: as the caller promised; the name is copied by the library.
        if unsafe { (self.api_v2()?.function_register)(c.as_ptr(), f, self_, None, override_ as i32) } != 0 {
            return Err(self.error());
        }
        Ok(())
    }

    /// A VM on a device (device type 1 = CPU, 2 = CUDA, and its number).
    pub fn vm_on(&self, device_type: i32, device_id: i32) -> Result<Vm<'_>, HostError> {
        let mut vm = std::ptr::null_mut();
        let device = DLDevice { device_type, device_id };
        // SAFETY: valid module and out-pointer.
        if unsafe { (self.api().vm_create_on)(self.module, device, &mut vm) } != 0 {
            return Err(self.error());
        }
        Ok(Vm { model: self, vm })
    }

    fn api_v3(&self) -> Result<&abi::ApiV3, HostError> {
        self.api_at(3, "host allocators or weights loader")
    }

    /// A CPU VM whose every allocation goes through `allocator` (rvm.h, ABI version 3).
    ///
    /// # Safety
    /// The allocator and its context must stay valid until the VM and every value it returned
    /// are gone, and its functions must honour rvm.h's contract (thread-safe, aligned blocks).
    pub unsafe fn vm_with_allocator(&self, allocator: *const abi::Allocator) -> Result<Vm<'_>, HostError> {
        let mut vm = std::ptr::null_mut();
        // SAFETY: valid module and out-pointer; the allocator as the caller promised.
        if unsafe { (self.api_v3()?.vm_create_with_allocator)(self.module, allocator, &mut vm) } != 0 {
            return Err(self.error());
        }
        Ok(Vm { model: self, vm })
    }

    /// The host allocator that owns a value's memory (None: the library's own malloc).
    pub fn value_allocator(&self, value: &Value) -> Result<Option<*const abi::Allocator>, HostError> {
        // SAFETY: a valid value of this model.
        let a = unsafe { (self.api_v3()?.value_allocator)(&value.any) };
        Ok((!a.is_null()).then_some(a))
    }

    pub fn vm(&self) -> Result<Vm<'_>, HostError> {
        let mut vm = std::ptr::null_mut();
        // SAFETY: valid module and out-pointer.
        if unsafe { (self.api().vm_create)(self.module, &mut vm) } != 0 {
            return Err(self.error());
        }
        Ok(Vm { model: self, vm })
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: closing the module opened in load.
        unsafe { (self.api().module_close)(self.module) }
    }
}

/// A VM on a model (one thread at a time).
pub struct Vm<'m> {
    model: &'m Model,
    vm: *mut abi::Vm,
}

/// Arguments converted for one call, kept alive until it returns.
pub struct PreparedArgs<'a> {
    api: &'a Api,
    anys: Vec<Any>,
    /// Filled once and never grown after the pointers into it are taken.
    _tensors: Vec<DLTensor>,
    owned: Vec<usize>,
}

impl PreparedArgs<'_> {
    /// The arguments as values (borrowed from self).
    pub fn values(&self) -> &[Any] {
        &self.anys
    }
}

impl Drop for PreparedArgs<'_> {
    fn drop(&mut self) {
        for &i in &self.owned {
            // SAFETY: releasing values this struct created.
            unsafe { (self.api.value_release)(&mut self.anys[i]) }
        }
    }
}

impl<'m> Vm<'m> {
    /// Converts inputs into call arguments. Tensors are borrowed: `inputs` must outlive the result.
    pub fn prepare<'a>(&self, inputs: &'a [Input]) -> Result<PreparedArgs<'a>, HostError>
    where
        'm: 'a,
    {
        self.model.prepare(inputs)
    }

    /// Calls function `f` with prepared arguments; the result is owned by the returned value.
    pub fn call_prepared(&mut self, f: i32, args: &PreparedArgs) -> Result<Value<'m>, HostError> {
        let api = self.model.api();
        let mut out = Any::default();
        // SAFETY: valid VM, argument array and out-pointer.
        let rc = unsafe { (api.vm_call)(self.vm, f, args.anys.as_ptr(), args.anys.len() as i32, &mut out) };
        if rc != 0 {
            return Err(self.model.error());
        }
        Ok(Value { api, any: out })
    }

    pub fn call(&mut self, f: i32, inputs: &[Input]) -> Result<Value<'m>, HostError> {
        let api = self.model.api();
        let mut out = Any::default();
        let rc = {
            let args = self.prepare(inputs)?;
            // SAFETY: as in call_prepared.
            unsafe { (api.vm_call)(self.vm, f, args.anys.as_ptr(), args.anys.len() as i32, &mut out) }
        };
        if rc != 0 {
            return Err(self.model.error());
        }
        Ok(Value { api, any: out })
    }

    /// Sets (or, with None, clears) the VM's instrument hook; see rvm.h's vm_set_instrument.
    ///
    /// # Safety
    /// `hook` must follow the safe-call convention and `self_` stay valid while it is set.
    pub unsafe fn set_instrument(&mut self, hook: Option<abi::SafeCall>, self_: *mut c_void) -> Result<(), HostError> {
        let api = self.model.api_v2()?;
        // SAFETY: as the caller promised; the VM is valid.
        if unsafe { (api.vm_set_instrument)(self.vm, hook, self_) } != 0 {
            return Err(self.model.error());
        }
        Ok(())
    }

    /// Calls function `f` with values the caller keeps alive for the call.
    pub fn call_values(&mut self, f: i32, args: &[Any]) -> Result<Value<'m>, HostError> {
        let api = self.model.api();
        let mut out = Any::default();
        // SAFETY: valid VM, argument array and out-pointer.
        let rc = unsafe { (api.vm_call)(self.vm, f, args.as_ptr(), args.len() as i32, &mut out) };
        if rc != 0 {
            return Err(self.model.error());
        }
        Ok(Value { api, any: out })
    }

    pub fn stats(&self) -> abi::VmStats {
        let mut s = abi::VmStats::default();
        // SAFETY: valid VM and out-pointer.
        unsafe { (self.model.api().vm_stats)(self.vm, &mut s) };
        s
    }

    pub fn reset_stats(&mut self) {
        // SAFETY: valid VM.
        unsafe { (self.model.api().vm_reset_stats)(self.vm) }
    }
}

impl Drop for Vm<'_> {
    fn drop(&mut self) {
        // SAFETY: destroying the VM created in Model::vm.
        unsafe { (self.model.api().vm_destroy)(self.vm) }
    }
}

/// An owned result value.
pub struct Value<'m> {
    api: &'m Api,
    any: Any,
}

impl Value<'_> {
    /// The value itself (borrowed: valid while self lives).
    pub fn any(&self) -> Any {
        self.any
    }

    /// Copies the value (recursively) out of the runtime.
    pub fn to_output(&self) -> Output {
        to_output(self.api, &self.any)
    }
}

impl Drop for Value<'_> {
    fn drop(&mut self) {
        // SAFETY: releasing the owned result.
        unsafe { (self.api.value_release)(&mut self.any) }
    }
}

fn to_output(api: &Api, any: &Any) -> Output {
    match any.type_index {
        abi::TYPE_INT => Output::Int(any.payload as i64),
        abi::TYPE_BOOL => Output::Bool(any.payload != 0),
        abi::TYPE_FLOAT => Output::Float(f64::from_bits(any.payload)),
        abi::TYPE_TENSOR | abi::TYPE_DLTENSOR_PTR => {
            // SAFETY: the value is a tensor, so the view is a valid DLTensor.
            let t = unsafe { &*(api.tensor_view)(any) };
            if t.device.device_type != 1 {
                // A device tensor: read a host copy.
                let mut host = Any::default();
                // SAFETY: the value is a tensor; host receives an owned value, released below.
                if unsafe { (api.tensor_to_host)(any, &mut host) } != 0 {
                    return Output::Other(format!(
                        "tensor on device type {} (copy to host failed)",
                        t.device.device_type
                    ));
                }
                let out = to_output(api, &host);
                // SAFETY: releasing the copy made above.
                unsafe { (api.value_release)(&mut host) };
                return out;
            }
            let shape: Vec<i64> = (0..t.ndim as usize).map(|i| unsafe { *t.shape.add(i) }).collect();
            let elems: i64 = shape.iter().product();
            let nbytes = (elems as usize * t.dtype.bits as usize * t.dtype.lanes as usize).div_ceil(8);
            let data = if nbytes == 0 {
                Vec::new()
            } else {
                // SAFETY: compact tensor data of nbytes at data + byte_offset (runtime tensors are compact).
                unsafe { std::slice::from_raw_parts((t.data as *const u8).add(t.byte_offset as usize), nbytes) }
                    .to_vec()
            };
            Output::Tensor { dtype: t.dtype, shape, data }
        }
        abi::TYPE_SHAPE => {
            let (mut dims, mut n) = (std::ptr::null(), 0i64);
            // SAFETY: the value is a Shape.
            unsafe { (api.shape_view)(any, &mut dims, &mut n) };
            Output::Shape((0..n as usize).map(|i| unsafe { *dims.add(i) }).collect())
        }
        abi::TYPE_ARRAY => {
            // SAFETY: the value is a tuple.
            let n = unsafe { (api.tuple_size)(any) };
            Output::Tuple(
                (0..n)
                    .map(|i| {
                        let mut item = Any::default();
                        // SAFETY: i is in range; the item is a borrowed view.
                        unsafe { (api.tuple_get)(any, i, &mut item) };
                        to_output(api, &item)
                    })
                    .collect(),
            )
        }
        // SAFETY: any value has a type name.
        _ => Output::Other(cstr(unsafe { (api.value_type_name)(any) })),
    }
}

impl Output {
    /// Tuples flattened depth-first, as `relaxc run` writes them.
    pub fn flatten(self) -> Vec<Output> {
        match self {
            Output::Tuple(items) => items.into_iter().flat_map(Output::flatten).collect(),
            other => vec![other],
        }
    }
}
