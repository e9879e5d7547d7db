//! TVM-FFI's value and object layouts (`runtime-shim/include/rvm_kernel.h`): the 16-byte Any,
//! the object header, DLPack's tensor, the Shape cell, and the type indices.

use std::ffi::c_void;

use super::c_struct;

pub const TYPE_NONE: i32 = 0;
pub const TYPE_INT: i32 = 1;
pub const TYPE_BOOL: i32 = 2;
pub const TYPE_FLOAT: i32 = 3;
pub const TYPE_OPAQUE_PTR: i32 = 4;
pub const TYPE_DATA_TYPE: i32 = 5;
pub const TYPE_DLTENSOR_PTR: i32 = 7;
pub const TYPE_STATIC_OBJECT_BEGIN: i32 = 64;
pub const TYPE_STR: i32 = 65;
pub const TYPE_FUNCTION: i32 = 68;
pub const TYPE_SHAPE: i32 = 69;
pub const TYPE_TENSOR: i32 = 70;
pub const TYPE_ARRAY: i32 = 71;

pub(super) fn constants() -> Vec<(&'static str, u64)> {
    [
        ("kTVMFFINone", TYPE_NONE),
        ("kTVMFFIInt", TYPE_INT),
        ("kTVMFFIBool", TYPE_BOOL),
        ("kTVMFFIFloat", TYPE_FLOAT),
        ("kTVMFFIOpaquePtr", TYPE_OPAQUE_PTR),
        ("kTVMFFIDataType", TYPE_DATA_TYPE),
        ("kTVMFFIDLTensorPtr", TYPE_DLTENSOR_PTR),
        ("kTVMFFIStaticObjectBegin", TYPE_STATIC_OBJECT_BEGIN),
        ("kTVMFFIStr", TYPE_STR),
        ("kTVMFFIFunction", TYPE_FUNCTION),
        ("kTVMFFIShape", TYPE_SHAPE),
        ("kTVMFFITensor", TYPE_TENSOR),
        ("kTVMFFIArray", TYPE_ARRAY),
    ]
    .into_iter()
    .map(|(name, v)| (name, v as u64))
    .collect()
}

c_struct! {
    /// TVMFFIAny: type index, padding, and an 8-byte payload (a union in C).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Any = "TVMFFIAny" {
        pub type_index: i32,
        pub zero_padding: u32,
        pub payload: u64 => "v_int64",
    }
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

/// Size of one Any, as generated code steps through arrays of them (registers, arguments).
pub const ANY_SIZE: i32 = std::mem::size_of::<Any>() as i32;
pub const ANY_TYPE_INDEX: i32 = std::mem::offset_of!(Any, type_index) as i32;
pub const ANY_PAYLOAD: i32 = std::mem::offset_of!(Any, payload) as i32;

c_struct! {
    /// The header every reference-counted object starts with.
    #[derive(Debug)]
    pub struct ObjectHeader = "TVMFFIObject" {
        pub combined_ref_count: u64,
        pub type_index: i32,
        pub padding: u32,
        pub deleter: *mut c_void,
    }
}

c_struct! {
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct DLDevice = "DLDevice" {
        pub device_type: i32,
        pub device_id: i32,
    }
}

c_struct! {
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct DLDataType = "DLDataType" {
        pub code: u8,
        pub bits: u8,
        pub lanes: u16,
    }
}

impl DLDataType {
    /// The dtype as generated code stores it: one little-endian 32-bit word.
    pub fn word(self) -> u32 {
        self.code as u32 | (self.bits as u32) << 8 | (self.lanes as u32) << 16
    }
}

c_struct! {
    #[derive(Debug)]
    pub struct DLTensor = "DLTensor" {
        pub data: *mut c_void,
        pub device: DLDevice,
        pub ndim: i32,
        pub dtype: DLDataType,
        pub shape: *mut i64,
        pub strides: *mut i64,
        pub byte_offset: u64,
    }
}

c_struct! {
    /// Body of a Shape object, right after the header.
    #[derive(Debug)]
    pub struct ShapeCell = "TVMFFIShapeCell" {
        pub data: *const i64,
        pub size: u64,
    }
}
