//! Every memory layout and constant that relaxc shares with the C runtime shim, defined once.
//!
//! The shim's headers are the source of truth (`runtime-shim/include/*.h`,
//! `runtime-shim/src/internal.h`); each struct here is a `#[repr(C)]` mirror of one of them, and
//! code generation takes every offset from these mirrors with `offset_of!` rather than writing
//! numbers. [`c_structs`] and [`c_constants`] list every mirrored field and constant with its C
//! name, so a test (tests/artifact.rs) can compile a probe with the C compiler and compare each
//! one: a field moved on either side fails it. Only 64-bit targets are supported, so pointer
//! fields have the host's size.

mod api;
mod cuda;
mod kernels;
mod objects;
mod program;
mod tvm_ffi;

pub use api::*;
pub use cuda::*;
pub use kernels::*;
pub use objects::*;
pub use program::*;
pub use tvm_ffi::*;

/// Size of a pointer on every supported target (relaxc builds for 64-bit CPUs only).
pub const POINTER_SIZE: usize = std::mem::size_of::<*const u8>();
const _: () = assert!(POINTER_SIZE == 8, "relaxc supports 64-bit hosts and targets only");

/// A Rust mirror of a C struct: its C type name and each field's C name and offset.
pub trait CStruct: Sized {
    const C_NAME: &'static str;
    fn fields() -> Vec<(&'static str, usize)>;
}

/// One mirrored struct, as the probe test sees it.
#[derive(Debug, Clone)]
pub struct StructLayout {
    pub c_name: &'static str,
    pub size: usize,
    pub fields: Vec<(&'static str, usize)>,
}

fn layout_of<T: CStruct>() -> StructLayout {
    StructLayout { c_name: T::C_NAME, size: std::mem::size_of::<T>(), fields: T::fields() }
}

/// Defines a `#[repr(C)]` struct and its [`CStruct`] listing for the probe test. A field is
/// listed under its Rust name, or under the C name written after it as `=> "c_name"`.
macro_rules! c_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident = $c_name:literal {
            $( $(#[$field_meta:meta])* pub $field:ident : $ty:ty $(=> $c_field:literal)? ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        pub struct $name {
            $( $(#[$field_meta])* pub $field: $ty ),*
        }
        impl $crate::abi::CStruct for $name {
            const C_NAME: &'static str = $c_name;
            fn fields() -> Vec<(&'static str, usize)> {
                vec![$( ($crate::abi::c_field_name!(stringify!($field) $(, $c_field)?), ::std::mem::offset_of!($name, $field)) ),*]
            }
        }
    };
}
pub(crate) use c_struct;

/// A field's C name: the Rust name unless the mirror gives another (`=> "name"`).
macro_rules! c_field_name {
    ($rust:expr) => {
        $rust
    };
    ($rust:expr, $c:literal) => {
        $c
    };
}
pub(crate) use c_field_name;

/// Every mirrored struct.
pub fn c_structs() -> Vec<StructLayout> {
    vec![
        layout_of::<Any>(),
        layout_of::<ObjectHeader>(),
        layout_of::<DLDevice>(),
        layout_of::<DLDataType>(),
        layout_of::<DLTensor>(),
        layout_of::<ShapeCell>(),
        layout_of::<Storage>(),
        layout_of::<TensorObject>(),
        layout_of::<ShapeObject>(),
        layout_of::<FuncInfo>(),
        layout_of::<ConstInfo>(),
        layout_of::<Program>(),
        layout_of::<CudaImage>(),
        layout_of::<CudaKernel>(),
        layout_of::<CudaTable>(),
        layout_of::<ModuleInfo>(),
        layout_of::<VmStats>(),
        layout_of::<Allocator>(),
        layout_of::<ApiV3>(),
    ]
}

/// Every constant shared with the C side: its C expression and its value here.
pub fn c_constants() -> Vec<(&'static str, u64)> {
    let mut all = tvm_ffi::constants();
    all.extend(program::constants());
    all.extend(objects::constants());
    all.extend(cuda::constants());
    all.extend(api::constants());
    all.extend(kernels::constants());
    all
}
