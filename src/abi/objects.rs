//! The shim's own object layouts that generated code reads (`runtime-shim/src/internal.h`):
//! storage, tensors and shapes.

use std::ffi::c_void;
use std::mem::offset_of;

use super::{DLDevice, DLTensor, ObjectHeader, ShapeCell, c_struct};

/// Type index of Storage objects: fixed, far above any index tvm-ffi allocates.
pub const TYPE_STORAGE: i32 = 0x7fff_0000;

pub(super) fn constants() -> Vec<(&'static str, u64)> {
    vec![("RVM_TYPE_STORAGE", TYPE_STORAGE as u64)]
}

c_struct! {
    /// A 64-byte aligned buffer shared by the tensors viewing it.
    #[derive(Debug)]
    pub struct Storage = "rvm_storage" {
        pub header: ObjectHeader,
        pub data: *mut c_void,
        pub nbytes: u64,
        pub device: DLDevice,
        pub allocator: *mut c_void,
        pub cuda: *mut c_void,
    }
}

c_struct! {
    /// A Tensor object: the header, then the DLTensor (TVM-FFI's layout), then relaxc's fields.
    #[derive(Debug)]
    pub struct TensorObject = "rvm_tensor" {
        pub header: ObjectHeader,
        pub dl: DLTensor,
        pub owner: *mut c_void,
        pub home: *mut c_void,
    }
}

c_struct! {
    /// A Shape object: the header, then the cell pointing at its dims.
    #[derive(Debug)]
    pub struct ShapeObject = "rvm_shape" {
        pub header: ObjectHeader,
        pub cell: ShapeCell,
    }
}

/// Offsets generated code uses inside these objects.
pub const STORAGE_DATA: i32 = offset_of!(Storage, data) as i32;
pub const STORAGE_NBYTES: i32 = offset_of!(Storage, nbytes) as i32;
pub const STORAGE_DEVICE: i32 = offset_of!(Storage, device) as i32;
/// Where a Tensor object's DLTensor starts.
pub const TENSOR_DLTENSOR: i32 = offset_of!(TensorObject, dl) as i32;
/// A Shape object's pointer to its dims.
pub const SHAPE_DIMS: i32 = (offset_of!(ShapeObject, cell) + offset_of!(ShapeCell, data)) as i32;
