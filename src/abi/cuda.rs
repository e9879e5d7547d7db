//! The CUDA kernel table a model carries (`runtime-shim/include/rvm_cuda.h`).

use std::ffi::{c_char, c_void};

use super::c_struct;

/// Symbol of the model's kernel table.
pub const CUDA_TABLE_SYMBOL: &str = "rvm_model_cuda";

pub(super) fn constants() -> Vec<(&'static str, u64)> {
    vec![
        ("RVM_CUDA_ELEMENTWISE", CUDA_ELEMENTWISE as u64),
        ("RVM_CUDA_MATMUL", CUDA_MATMUL as u64),
        ("RVM_CUDA_ROWS", CUDA_ROWS as u64),
        ("RVM_CUDA_TILE", CUDA_TILE as u64),
        ("RVM_CUDA_BLOCK", CUDA_BLOCK as u64),
    ]
}

/// Launch conventions (`RVM_CUDA_*`).
pub const CUDA_ELEMENTWISE: i32 = 0;
pub const CUDA_MATMUL: i32 = 1;
pub const CUDA_ROWS: i32 = 2;
/// Tile edge of the matmul convention and block size of the others.
pub const CUDA_TILE: u32 = 16;
pub const CUDA_BLOCK: u32 = 256;

c_struct! {
    /// One compiled image of a CUDA module: a CUBIN for one architecture, or PTX.
    #[derive(Debug)]
    pub struct CudaImage = "rvm_cuda_image" {
        pub data: *const u8,
        pub size: u64,
        pub sm: i32,
        pub is_ptx: i32,
    }
}

c_struct! {
    /// A kernel: its module's images and its launch convention.
    #[derive(Debug)]
    pub struct CudaKernel = "rvm_cuda_kernel" {
        pub name: *const c_char,
        pub images: *const c_void,
        pub num_images: i64,
        pub launch: i32,
        pub num_inputs: i32,
        pub num_outputs: i32,
        pub module_index: i32,
    }
}

c_struct! {
    /// The model's kernel table, `rvm_model_cuda`.
    #[derive(Debug)]
    pub struct CudaTable = "rvm_cuda_table" {
        pub num_kernels: i64,
        pub kernels: *const CudaKernel,
    }
}
