//! The CUDA part of a model object: `rvm_model_cuda` (the kernel table of rvm_cuda.h, its
//! images in read-only data, PTX NUL-terminated for the driver's JIT), one launch trampoline
//! per kernel (`__tvm_ffi_<name>`, so bytecode and compiled code call CUDA kernels like any
//! other), and a `.rvm_cuda` listing for `relaxc inspect`.

use cranelift_codegen::ir::{AbiParam, InstBuilder, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{DataDescription, Linkage, Module};
use cranelift_object::ObjectModule;

use super::TablesError;
use crate::cuda::CudaModule;

/// Layout of rvm_cuda_kernel and rvm_cuda_image (checked by tests/artifact.rs).
pub mod layout {
    pub const KERNEL_SIZE: usize = 40;
    pub const KERNEL_NAME: usize = 0;
    pub const KERNEL_IMAGES: usize = 8;
    pub const KERNEL_NUM_IMAGES: usize = 16;
    pub const KERNEL_LAUNCH: usize = 24;
    pub const KERNEL_INPUTS: usize = 28;
    pub const KERNEL_OUTPUTS: usize = 32;
    pub const KERNEL_MODULE: usize = 36;
    pub const IMAGE_SIZE: usize = 24;
    pub const IMAGE_DATA: usize = 0;
    pub const IMAGE_BYTES: usize = 8;
    pub const IMAGE_SM: usize = 16;
    pub const IMAGE_PTX: usize = 20;
    pub const TABLE_SYMBOL: &str = "rvm_model_cuda";
    pub const LISTING_SECTION: &str = ".rvm_cuda";
}

/// Defines the table, images and trampolines; returns the `.rvm_cuda` listing.
pub fn define(module: &mut ObjectModule, modules: &[CudaModule]) -> Result<String, TablesError> {
    use layout::*;
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
            while !blob.len().is_multiple_of(64) {
                blob.push(0);
            }
            let at = blob.len();
            blob.extend(&image.bytes);
            if image.ptx {
                blob.push(0);
            }
            let rec = images_table.len();
            images_table.resize(rec + IMAGE_SIZE, 0);
            blob_relocs.push((rec + IMAGE_DATA, at));
            images_table[rec + IMAGE_BYTES..rec + IMAGE_BYTES + 8]
                .copy_from_slice(&(image.bytes.len() as u64).to_le_bytes());
            images_table[rec + IMAGE_SM..rec + IMAGE_SM + 4].copy_from_slice(&(image.sm as i32).to_le_bytes());
            images_table[rec + IMAGE_PTX..rec + IMAGE_PTX + 4].copy_from_slice(&(image.ptx as i32).to_le_bytes());
            let kind = if image.ptx { format!("compute_{} PTX", image.sm) } else { format!("sm_{} CUBIN", image.sm) };
            listing.push_str(&format!("image {} {kind} {} bytes\n", cm.source, image.bytes.len()));
        }
        for k in &cm.kernels {
            let name_at = blob.len();
            blob.extend(k.name.as_bytes());
            blob.push(0);
            let rec = kernels.len();
            kernels.resize(rec + KERNEL_SIZE, 0);
            kernel_relocs.push((rec + KERNEL_NAME, false, name_at));
            kernel_relocs.push((rec + KERNEL_IMAGES, true, first_image));
            let put32 =
                |buf: &mut Vec<u8>, off: usize, v: i32| buf[rec + off..rec + off + 4].copy_from_slice(&v.to_le_bytes());
            kernels[rec + KERNEL_NUM_IMAGES..rec + KERNEL_NUM_IMAGES + 8]
                .copy_from_slice(&(cm.images.len() as i64).to_le_bytes());
            put32(&mut kernels, KERNEL_LAUNCH, k.launch as i32);
            put32(&mut kernels, KERNEL_INPUTS, k.inputs as i32);
            put32(&mut kernels, KERNEL_OUTPUTS, k.outputs as i32);
            put32(&mut kernels, KERNEL_MODULE, m as i32);
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
    let table_id = module.declare_data(TABLE_SYMBOL, Linkage::Hidden, false, false)?;

    let mut d = DataDescription::new();
    d.define(blob.into_boxed_slice());
    d.set_align(64);
    module.define_data(blob_id, &d)?;

    let mut d = DataDescription::new();
    d.define(images_table.into_boxed_slice());
    d.set_align(8);
    let gv = module.declare_data_in_data(blob_id, &mut d);
    for (at, target) in blob_relocs {
        d.write_data_addr(at as u32, gv, target as i64);
    }
    module.define_data(images_id, &d)?;

    let mut d = DataDescription::new();
    d.define(kernels.into_boxed_slice());
    d.set_align(8);
    let blob_gv = module.declare_data_in_data(blob_id, &mut d);
    let images_gv = module.declare_data_in_data(images_id, &mut d);
    for (at, to_images, target) in kernel_relocs {
        let gv = if to_images { images_gv } else { blob_gv };
        d.write_data_addr(at as u32, gv, target as i64);
    }
    module.define_data(kernels_id, &d)?;

    let mut table = vec![0u8; 16];
    table[..8].copy_from_slice(&(names.len() as i64).to_le_bytes());
    let mut d = DataDescription::new();
    d.define(table.into_boxed_slice());
    d.set_align(8);
    let gv = module.declare_data_in_data(kernels_id, &mut d);
    d.write_data_addr(8, gv, 0);
    module.define_data(table_id, &d)?;

    // Trampolines: __tvm_ffi_<name>(self, args, n, result) -> rvm_cuda_call(k, args, n).
    let sig = super::native::packed_signature(module);
    let mut call_sig = module.make_signature();
    call_sig.params.extend([types::I64, types::I64, types::I32].map(AbiParam::new));
    call_sig.returns.push(AbiParam::new(types::I32));
    let cuda_call = module.declare_function("rvm_cuda_call", Linkage::Import, &call_sig)?;
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    for (k, name) in names.iter().enumerate() {
        let id = module.declare_function(&format!("{}{name}", crate::tvm::KERNEL_PREFIX), Linkage::Local, &sig)?;
        ctx.func.signature = sig.clone();
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let p = b.block_params(entry).to_vec();
        let callee = module.declare_func_in_func(cuda_call, b.func);
        b.func.dfg.ext_funcs[callee].colocated = true;
        let index = b.ins().iconst(types::I64, k as i64);
        let call = b.ins().call(callee, &[index, p[1], p[2]]);
        let rc = b.inst_results(call)[0];
        b.ins().return_(&[rc]);
        b.seal_all_blocks();
        b.finalize(module.isa().frontend_config());
        module.define_function(id, &mut ctx)?;
        module.clear_context(&mut ctx);
    }
    Ok(listing)
}
