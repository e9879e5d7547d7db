//! The whole model object: runtime references, tvm-ffi entry points, shape functions, CUDA
//! launchers, native code in compiled mode and the program tables, emitted by one
//! cranelift-object module, plus non-allocated sections (the serialized executable, how each
//! function runs, the model's identity) for `relaxc inspect` and hosts.

use std::collections::BTreeSet;

use cranelift_module::{DataDescription, Linkage, Module};
use cranelift_object::ObjectModule;

use super::native::NativeOptions;
use super::tables::TensorPlacement;
use super::{CodegenError, ExecMode};
use crate::abi;
use crate::cuda::CudaModule;
use crate::ir::ShapeFunc;
use crate::kernel_object::{KernelObject, kernel_symbol};
use crate::link::LinkInputs;
use crate::vm::format::write_executable_elided;
use crate::vm::{FuncKind, Verified};

/// Alignment of the non-allocated sections' data.
const METADATA_ALIGN: u64 = 8;

/// What the model object holds and how each Relax function runs.
pub struct EmittedObject {
    pub bytes: Vec<u8>,
    /// Objects the link writes from data kept out of `bytes`: the tensor constants.
    pub streamed: Vec<Box<dyn crate::link::StreamedObject>>,
    /// The symbols the shared object exports besides `rvm_get_api`: the tvm-ffi entry points.
    pub exports: Vec<String>,
    /// Relax functions left as bytecode in compiled mode, with the reason.
    pub notes: Vec<(String, String)>,
    /// The native functions' CLIF with `; pc=N` comments, when asked for.
    pub clif: String,
    /// The loops compiled mode rolled repeated runs into.
    pub loops: Vec<super::native::RolledLoop>,
}

impl EmittedObject {
    /// What the link needs of this object, with the kernel objects to link beside it.
    pub fn link_inputs<'a>(&'a self, kernels: &'a [KernelObject]) -> LinkInputs<'a> {
        LinkInputs { object: &self.bytes, streamed: &self.streamed, exports: &self.exports, kernels, undefined: &[] }
    }
}

/// What the model object is made from.
pub struct ObjectInputs<'a> {
    pub exec: &'a Verified,
    /// The symbol bound to each packed function-table entry.
    pub symbols: &'a [Option<String>],
    pub mode: ExecMode,
    pub native: &'a NativeOptions,
    pub shape_funcs: &'a [ShapeFunc],
    pub cuda: &'a [CudaModule],
    /// Optional runtime functions to refer to (so that the link takes their files).
    pub runtime_refs: &'a [String],
    /// Packed functions whose results are never objects (TVM's TIR kernels), by name.
    pub scalar_results: &'a BTreeSet<String>,
    pub target: &'a target_lexicon::Triple,
}

/// Emits the whole model object.
pub fn emit_object(inputs: &ObjectInputs) -> Result<EmittedObject, CodegenError> {
    let ObjectInputs {
        exec,
        symbols,
        mode,
        native: native_options,
        shape_funcs,
        cuda,
        runtime_refs,
        scalar_results,
        target,
    } = *inputs;
    let mut module = super::object_module("model", target)?;
    define_runtime_refs(&mut module, runtime_refs)?;
    let mut taken: BTreeSet<String> = symbols.iter().flatten().cloned().collect();
    taken.extend(shape_funcs.iter().map(|f| kernel_symbol(&f.name)));
    taken.extend(cuda.iter().flat_map(|m| m.kernels.iter().map(|k| kernel_symbol(&k.name))));
    let ffi = super::ffi_entries::define(&mut module, exec, &taken)?;
    super::shape_func::define(&mut module, shape_funcs)?;
    let cuda_listing = super::cuda_tables::define(&mut module, cuda)?;
    let native = match mode {
        ExecMode::Compiled => {
            let mut scalar: BTreeSet<String> = scalar_results.clone();
            // relaxc's own shape functions and CUDA launchers return nothing.
            scalar.extend(shape_funcs.iter().map(|f| f.name.clone()));
            scalar.extend(cuda.iter().flat_map(|m| m.kernels.iter().map(|k| k.name.clone())));
            super::native::compile_functions(&mut module, exec, symbols, &scalar, native_options)?
        }
        ExecMode::Bytecode => Default::default(),
    };
    let mut mode_word = if mode == ExecMode::Compiled { 1 } else { 0 };
    if native_options.instrument {
        mode_word |= abi::PROGRAM_INSTRUMENTED;
    }
    let tensors = super::tables::define_tables(&mut module, exec, symbols, &native.compiled, mode_word, target)?;
    let mut product = module.finish();
    for (name, data) in metadata_sections(exec, &native.compiled, target, cuda_listing) {
        let section = product.object.add_section(Vec::new(), name.as_bytes().to_vec(), object::SectionKind::Metadata);
        product.object.append_section_data(section, &data, METADATA_ALIGN);
    }
    add_consts_section(&mut product, &tensors)?;
    let constants = super::constants::ConstantsObject::new(exec, &tensors, target);
    let bytes = product.emit().map_err(|e| CodegenError::Object(e.to_string()))?;
    let mut exports = ffi.symbols;
    // The runtime's own tvm-ffi entries, for Python (ffi_module.c): weights outside the model,
    // and runtime functions by name.
    for symbol in [abi::FFI_WEIGHTS_SYMBOL, abi::FFI_CALL_SYMBOL] {
        if !exports.is_empty() && !taken.contains(symbol) {
            exports.push(symbol.to_string());
        }
    }
    let mut notes = native.notes;
    notes.extend(ffi.skipped.into_iter().map(|(f, why)| (f, format!("no tvm-ffi entry point: {why}"))));
    Ok(EmittedObject {
        bytes,
        streamed: vec![Box::new(constants)],
        exports,
        notes,
        clif: native.clif,
        loops: native.loops,
    })
}

/// The non-allocated sections: the serialized executable, each Relax function's mode, the
/// identity of the relaxc that built the model, and the CUDA listing if there is one.
fn metadata_sections(
    exec: &Verified,
    compiled: &[Option<super::native::NativeBody>],
    target: &target_lexicon::Triple,
    cuda_listing: String,
) -> Vec<(&'static str, Vec<u8>)> {
    let modes: String = exec
        .funcs
        .iter()
        .zip(compiled.iter().chain(std::iter::repeat(&None)))
        .filter(|(f, _)| f.kind != FuncKind::Packed)
        .map(|(f, c)| format!("{}\t{}\n", f.name, if c.is_some() { "compiled" } else { "bytecode" }))
        .collect();
    let identity = format!("relaxc {} c-api {} target {target}", env!("CARGO_PKG_VERSION"), abi::ABI_VERSION);
    let mut sections = vec![
        (abi::EXEC_SECTION, write_executable_elided(exec)),
        (abi::MODES_SECTION, modes.into_bytes()),
        (abi::IDENTITY_SECTION, identity.into_bytes()),
    ];
    if !cuda_listing.is_empty() {
        sections.push((abi::CUDA_LISTING_SECTION, cuda_listing.into_bytes()));
    }
    sections
}

/// The `.rvm_consts` section (see `abi::CONSTS_SECTION`): where each tensor constant's elements
/// are in the linked model, so that they are stored once and `inspect` still finds them. The
/// base address is an absolute relocation against the constants' data object, which the linker
/// resolves in a non-allocated section as it does for debug information.
fn add_consts_section(
    product: &mut cranelift_object::ObjectProduct,
    tensors: &TensorPlacement,
) -> Result<(), CodegenError> {
    use cranelift_object::object::write::{Relocation, SectionKind};
    use cranelift_object::object::{RelocationEncoding, RelocationFlags, RelocationKind};
    let mut data = vec![0u8; 8];
    for offset in &tensors.offsets {
        data.extend(offset.unwrap_or(u64::MAX).to_le_bytes());
    }
    let symbol = product.data_symbol(tensors.data);
    let object = &mut product.object;
    let section = object.add_section(Vec::new(), abi::CONSTS_SECTION.as_bytes().to_vec(), SectionKind::Metadata);
    object.append_section_data(section, &data, METADATA_ALIGN);
    let flags =
        RelocationFlags::Generic { kind: RelocationKind::Absolute, encoding: RelocationEncoding::Generic, size: 64 };
    object
        .add_relocation(section, Relocation { offset: 0, symbol, addend: 0, flags })
        .map_err(|e| CodegenError::Object(e.to_string()))
}

/// A table of addresses of optional runtime functions the model needs beyond those its bytecode
/// calls (kernels look them up by name): referring to them makes the linker take their files.
fn define_runtime_refs(module: &mut ObjectModule, symbols: &[String]) -> Result<(), CodegenError> {
    if symbols.is_empty() {
        return Ok(());
    }
    let sig = super::shim::packed_signature(module);
    let id = module.declare_data("rvm_model_runtime_refs", Linkage::Local, false, false)?;
    let mut desc = DataDescription::new();
    desc.define(vec![0u8; abi::POINTER_SIZE * symbols.len()].into_boxed_slice());
    desc.set_align(abi::POINTER_SIZE as u64);
    for (i, sym) in symbols.iter().enumerate() {
        let f = module.declare_function(sym, Linkage::Import, &sig)?;
        let fref = module.declare_func_in_data(f, &mut desc);
        desc.write_function_addr((abi::POINTER_SIZE * i) as u32, fref);
    }
    module.define_data(id, &desc)?;
    Ok(())
}
