//! The CUDA part of a model object: `rvm_model_cuda` (the kernel table of rvm_cuda.h, its
//! images in read-only data, PTX NUL-terminated for the driver's JIT), one launch trampoline
//! per kernel (`__tvm_ffi_<name>`, so bytecode and compiled code call CUDA kernels like any
//! other), and a `.rvm_cuda` listing for `relaxc inspect`.

use std::mem::{offset_of, size_of};

use cranelift_module::{DataDescription, Linkage, Module};
use cranelift_object::ObjectModule;

use super::CodegenError;
use super::trampoline::{self, Forward};
use crate::abi::{self, CudaImage, CudaKernel, CudaTable};
use crate::cuda::CudaModule;
use crate::kernel_object::kernel_symbol;

/// Defines the table, images and trampolines; returns the `.rvm_cuda` listing.
pub fn define(module: &mut ObjectModule, modules: &[CudaModule]) -> Result<String, CodegenError> {
    let mut listing = String::new();
    if modules.is_empty() {
        return Ok(listing);
    }
    let mut blob: Vec<u8> = Vec::new(); // images and names
    let mut kernels: Vec<u8> = Vec::new();
    let mut images_table: Vec<u8> = Vec::new();
    let mut blob_relocs: Vec<(usize, usize)> = Vec::new(); // (offset in images_table, offset in blob)
    let mut kernel_relocs: Vec<(usize, bool, usize)> = Vec::new(); // (offset in kernels, to images_table?, target)
    let mut names = Vec::new();
    for (m, cm) in modules.iter().enumerate() {
        let first_image = images_table.len();
        for image in &cm.images {
            while !blob.len().is_multiple_of(IMAGE_ALIGN) {
                blob.push(0);
            }
            let at = blob.len();
            blob.extend(&image.bytes);
            if image.ptx {
                blob.push(0);
            }
            let rec = images_table.len();
            images_table.resize(rec + size_of::<CudaImage>(), 0);
            blob_relocs.push((rec + offset_of!(CudaImage, data), at));
            put(&mut images_table, rec + offset_of!(CudaImage, size), &(image.bytes.len() as u64).to_le_bytes());
            put(&mut images_table, rec + offset_of!(CudaImage, sm), &(image.sm as i32).to_le_bytes());
            put(&mut images_table, rec + offset_of!(CudaImage, is_ptx), &(image.ptx as i32).to_le_bytes());
            let kind = if image.ptx { format!("compute_{} PTX", image.sm) } else { format!("sm_{} CUBIN", image.sm) };
            listing.push_str(&format!("image {} {kind} {} bytes\n", cm.source, image.bytes.len()));
        }
        for k in &cm.kernels {
            let name_at = blob.len();
            blob.extend(k.name.as_bytes());
            blob.push(0);
            let rec = kernels.len();
            kernels.resize(rec + size_of::<CudaKernel>(), 0);
            kernel_relocs.push((rec + offset_of!(CudaKernel, name), false, name_at));
            kernel_relocs.push((rec + offset_of!(CudaKernel, images), true, first_image));
            put(&mut kernels, rec + offset_of!(CudaKernel, num_images), &(cm.images.len() as i64).to_le_bytes());
            put(&mut kernels, rec + offset_of!(CudaKernel, launch), &(k.launch as i32).to_le_bytes());
            put(&mut kernels, rec + offset_of!(CudaKernel, num_inputs), &(k.inputs as i32).to_le_bytes());
            put(&mut kernels, rec + offset_of!(CudaKernel, num_outputs), &(k.outputs as i32).to_le_bytes());
            put(&mut kernels, rec + offset_of!(CudaKernel, module_index), &(m as i32).to_le_bytes());
            listing.push_str(&format!(
                "kernel {} launch={:?} inputs={} outputs={} in {}\n",
                k.name, k.launch, k.inputs, k.outputs, cm.source
            ));
            names.push(k.name.clone());
        }
    }
    let blob_id = module.declare_data("rvm_cuda_blob", Linkage::Local, false, false)?;
    let images_id = module.declare_data("rvm_cuda_images", Linkage::Local, false, false)?;
    let kernels_id = module.declare_data("rvm_cuda_kernels", Linkage::Local, false, false)?;
    let table_id = module.declare_data(abi::CUDA_TABLE_SYMBOL, Linkage::Hidden, false, false)?;

    let mut d = DataDescription::new();
    d.define(blob.into_boxed_slice());
    d.set_align(IMAGE_ALIGN as u64);
    module.define_data(blob_id, &d)?;

    let mut d = DataDescription::new();
    d.define(images_table.into_boxed_slice());
    d.set_align(abi::POINTER_SIZE as u64);
    let gv = module.declare_data_in_data(blob_id, &mut d);
    for (at, target) in blob_relocs {
        d.write_data_addr(at as u32, gv, target as i64);
    }
    module.define_data(images_id, &d)?;

    let mut d = DataDescription::new();
    d.define(kernels.into_boxed_slice());
    d.set_align(abi::POINTER_SIZE as u64);
    let blob_gv = module.declare_data_in_data(blob_id, &mut d);
    let images_gv = module.declare_data_in_data(images_id, &mut d);
    for (at, to_images, target) in kernel_relocs {
        let gv = if to_images { images_gv } else { blob_gv };
        d.write_data_addr(at as u32, gv, target as i64);
    }
    module.define_data(kernels_id, &d)?;

    let mut table = vec![0u8; size_of::<CudaTable>()];
    put(&mut table, offset_of!(CudaTable, num_kernels), &(names.len() as i64).to_le_bytes());
    let mut d = DataDescription::new();
    d.define(table.into_boxed_slice());
    d.set_align(abi::POINTER_SIZE as u64);
    let gv = module.declare_data_in_data(kernels_id, &mut d);
    d.write_data_addr(offset_of!(CudaTable, kernels) as u32, gv, 0);
    module.define_data(table_id, &d)?;

    // Launchers: __tvm_ffi_<name>(self, args, n, result) -> rvm_cuda_call(k, args, n).
    let cuda_call = super::shim::declare_call(module, "rvm_cuda_call")?;
    for (k, name) in names.iter().enumerate() {
        trampoline::define(module, &kernel_symbol(name), Linkage::Local, cuda_call, k as i64, Forward::Args)?;
    }
    Ok(listing)
}

/// CUBIN and PTX images start 64-byte aligned.
const IMAGE_ALIGN: usize = 64;

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}
