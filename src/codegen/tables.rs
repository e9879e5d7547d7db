//! Emits the object holding a model's program tables (the layout of `rvm_program` in
//! runtime-shim/src/internal.h) with cranelift-object. Function-table entries are relocations
//! straight to kernel and builtin symbols, so nothing is looked up by name at load time.
//! Constant tensors sit 64-byte aligned in writable data (`.data`), used in place: TVM lets
//! in-place kernels write into constants and keeps the change, and a private mapping of `.data`
//! costs nothing until a page is written. Everything else constant is read-only.

use std::collections::{BTreeSet, HashMap};

use cranelift_codegen::isa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_module::{DataDescription, DataId, FuncId, Linkage, Module, ModuleError};
use cranelift_object::{ObjectBuilder, ObjectModule};

use super::builtins;
use crate::tvm::executable::write_executable;
use crate::vm::{Constant, Executable, FuncKind};

/// Layout of the shared tables; the C side asserts the same numbers.
pub mod layout {
    pub const PROGRAM_MAGIC: u64 = 0x31474f52504d5652;
    /// Version of the program tables (`RVM_PROGRAM_VERSION` in internal.h).
    pub const PROGRAM_VERSION: u32 = 1;
    pub const FUNC_INFO_SIZE: usize = 64;
    pub const FUNC_NAME: usize = 0;
    pub const FUNC_PACKED: usize = 8;
    pub const FUNC_PARAM_NAMES: usize = 16;
    pub const FUNC_START: usize = 24;
    pub const FUNC_END: usize = 32;
    pub const FUNC_REGS: usize = 40;
    pub const FUNC_KIND: usize = 48;
    pub const FUNC_NUM_ARGS: usize = 52;
    pub const FUNC_COMPILED: usize = 56;
    pub const CONST_INFO_SIZE: usize = 40;
    pub const CONST_DATA: usize = 0;
    pub const CONST_SHAPE: usize = 8;
    pub const CONST_SIZE: usize = 16;
    pub const CONST_KIND: usize = 24;
    pub const CONST_NDIM: usize = 28;
    pub const CONST_DTYPE: usize = 32;
    pub const PROGRAM_SIZE: usize = 96;
    pub const PROG_MAGIC: usize = 0;
    pub const PROG_ABI: usize = 8;
    pub const PROG_EXEC_MODE: usize = 12;
    pub const PROG_COMPILER_VERSION: usize = 16;
    pub const PROG_TRIPLE: usize = 24;
    pub const PROG_HASH: usize = 32;
    pub const PROG_NUM_FUNCS: usize = 40;
    pub const PROG_FUNCS: usize = 48;
    pub const PROG_NUM_CONSTS: usize = 56;
    pub const PROG_CONSTS: usize = 64;
    pub const PROG_NUM_INSTRS: usize = 72;
    pub const PROG_INSTR_OFFSET: usize = 80;
    pub const PROG_INSTR_DATA: usize = 88;
    /// The program's instrumented flag in its exec_mode word (`RVM_PROGRAM_INSTRUMENTED`).
    pub const PROGRAM_INSTRUMENTED: u32 = 0x100;
    /// Symbol of the program tables (hidden; read by the shim).
    pub const PROGRAM_SYMBOL: &str = "rvm_model_program";
    /// Non-allocated section holding the serialized executable, for `relaxc inspect`.
    pub const EXEC_SECTION: &str = ".rvm_exec";
    /// Non-allocated section listing how each Relax function runs ("name\tcompiled" lines).
    pub const MODES_SECTION: &str = ".rvm_modes";
    /// Non-allocated section naming what built the model ("relaxc <version> c-api <N>"), read by
    /// hosts that find no C API version they speak.
    pub const IDENTITY_SECTION: &str = ".rvm_identity";
    /// The C API version the runtime of this relaxc speaks (`RVM_ABI_VERSION` in rvm.h).
    pub const C_API_VERSION: u32 = 2;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecMode {
    /// Every Relax function runs in the shim's interpreter.
    Bytecode,
    /// Relax functions become native code (Cranelift); those it cannot lower stay bytecode.
    Compiled,
}

#[derive(Debug, thiserror::Error)]
pub enum TablesError {
    #[error("unknown builtin {name} (pc {pc} of {function} calls it): relaxc's runtime does not provide it")]
    UnknownBuiltin { name: String, function: String, pc: i64 },
    #[error(
        "kernel {name} is not defined: no symbol {prefix}{name} in {objects} (called from {function} at pc {pc})",
        prefix = crate::tvm::KERNEL_PREFIX
    )]
    MissingKernel { name: String, objects: String, function: String, pc: i64 },
    #[error(
        "{name} is a Python-registered TVM function, which relaxc does not provide yet (called from {function} at pc {pc})"
    )]
    PythonFunction { name: String, function: String, pc: i64 },
    #[error("cranelift: {0}")]
    Module(Box<ModuleError>),
    #[error("cranelift: {0}")]
    Isa(String),
    #[error("cannot write the object: {0}")]
    Object(String),
}

impl From<ModuleError> for TablesError {
    fn from(e: ModuleError) -> TablesError {
        TablesError::Module(Box::new(e))
    }
}

/// Makes the Cranelift object module for a target.
pub fn object_module(name: &str, triple: &target_lexicon::Triple) -> Result<ObjectModule, TablesError> {
    let mut flags = settings::builder();
    flags.set("is_pic", "true").map_err(|e| TablesError::Isa(e.to_string()))?;
    flags.set("opt_level", "speed").map_err(|e| TablesError::Isa(e.to_string()))?;
    let isa = isa::lookup(triple.clone())
        .map_err(|e| TablesError::Isa(e.to_string()))?
        .finish(settings::Flags::new(flags))
        .map_err(|e| TablesError::Isa(e.to_string()))?;
    let builder = ObjectBuilder::new(isa, name, cranelift_module::default_libcall_names())?;
    Ok(ObjectModule::new(builder))
}

/// Where each call and each packed entry of the program goes: a builtin, a kernel, or an error
/// naming the first instruction that needs a missing one.
pub fn bind_packed_functions(
    exec: &Executable,
    kernels: &BTreeSet<String>,
    objects: &str,
) -> Result<Vec<Option<String>>, TablesError> {
    let first_use = |index: usize| -> (String, i64) {
        for f in exec.funcs.iter().filter(|f| f.kind == FuncKind::Bytecode) {
            for k in f.start_instr..f.end_instr {
                if let Ok(crate::vm::Instr::Call { func, args, .. }) = exec.instr(k as usize) {
                    let named = func == index as i64 || args.contains(&crate::vm::Arg::Func(index as i64));
                    if named {
                        return (f.name.clone(), k - f.start_instr);
                    }
                }
            }
        }
        ("<no caller>".to_string(), -1)
    };
    exec.funcs
        .iter()
        .enumerate()
        .map(|(i, f)| {
            if f.kind != FuncKind::Packed {
                return Ok(None);
            }
            if let Some(b) = builtins::find(&f.name) {
                return Ok(Some(b.symbol.clone()));
            }
            if kernels.contains(&f.name) {
                return Ok(Some(format!("{}{}", crate::tvm::KERNEL_PREFIX, f.name)));
            }
            let (function, pc) = first_use(i);
            let name = f.name.clone();
            Err(if name.starts_with("vm.builtin.") {
                TablesError::UnknownBuiltin { name, function, pc }
            } else if name.starts_with("relax.run.") {
                TablesError::PythonFunction { name, function, pc }
            } else {
                TablesError::MissingKernel { name, function, pc, objects: objects.to_string() }
            })
        })
        .collect()
}

/// A growing data blob whose pointers to itself become relocations.
struct Blob {
    bytes: Vec<u8>,
    self_relocs: Vec<(usize, usize)>,
    func_relocs: Vec<(usize, FuncId)>,
    data_relocs: Vec<(usize, DataId, usize)>,
}

impl Blob {
    fn new() -> Blob {
        Blob { bytes: Vec::new(), self_relocs: Vec::new(), func_relocs: Vec::new(), data_relocs: Vec::new() }
    }
    fn align(&mut self, a: usize) -> usize {
        while !self.bytes.len().is_multiple_of(a) {
            self.bytes.push(0);
        }
        self.bytes.len()
    }
    fn put(&mut self, b: &[u8]) -> usize {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(b);
        at
    }
    fn put_at(&mut self, at: usize, b: &[u8]) {
        self.bytes[at..at + b.len()].copy_from_slice(b);
    }
    fn zeros(&mut self, n: usize) -> usize {
        let at = self.bytes.len();
        self.bytes.resize(at + n, 0);
        at
    }
    fn cstr(&mut self, s: &str) -> usize {
        let at = self.put(s.as_bytes());
        self.bytes.push(0);
        at
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// Adds the program tables for `exec` to `module`. `symbols[i]` is the symbol bound to packed
/// entry i; `compiled[i]` the native body of Relax function i, if it has one.
pub fn define_tables(
    module: &mut ObjectModule,
    exec: &Executable,
    symbols: &[Option<String>],
    compiled: &[Option<FuncId>],
    mode: ExecMode,
    instrument: bool,
    target: &target_lexicon::Triple,
) -> Result<(), TablesError> {
    use layout::*;
    let mut rodata = Blob::new(); // pointer-free read-only data: strings, shapes, code
    let mut tensors = Blob::new(); // constant tensors' elements, writable
    let mut tables = Blob::new(); // the tables proper: full of pointers
    let sig = super::native::packed_signature(module);

    // Strings and arrays first, so the tables can point at them.
    let func_names: Vec<usize> = exec.funcs.iter().map(|f| rodata.cstr(&f.name)).collect();
    let version = rodata.cstr(env!("CARGO_PKG_VERSION"));
    let triple = rodata.cstr(&target.to_string());
    rodata.align(8);
    let instr_offset = rodata.put(&exec.instr_offset.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<_>>());
    let instr_data = rodata.put(&exec.instr_data.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<_>>());
    let rodata_id = module.declare_data("rvm_model_rodata", Linkage::Local, false, false)?;
    let tensors_id = module.declare_data("rvm_model_constants", Linkage::Local, true, false)?;
    let mut const_parts = Vec::new(); // (data, shape offset into rodata)
    for c in &exec.constants {
        let part = match c {
            Constant::Tensor(t) => {
                let shape = rodata.align(8);
                rodata.put(&t.shape.iter().flat_map(|d| d.to_le_bytes()).collect::<Vec<_>>());
                let data = tensors.align(64);
                tensors.put(&t.data);
                (Some((tensors_id, data)), Some(shape))
            }
            Constant::Shape(s) => {
                let at = rodata.align(8);
                rodata.put(&s.iter().flat_map(|d| d.to_le_bytes()).collect::<Vec<_>>());
                (Some((rodata_id, at)), None)
            }
            Constant::Str(s) => (Some((rodata_id, rodata.cstr(s))), None),
            _ => (None, None),
        };
        const_parts.push(part);
    }

    // Parameter-name arrays.
    tables.align(8);
    let mut param_arrays = Vec::new();
    for f in &exec.funcs {
        let at = tables.bytes.len();
        for p in &f.param_names {
            let s = rodata.cstr(p);
            let slot = tables.zeros(8);
            tables.data_relocs.push((slot, rodata_id, s));
        }
        param_arrays.push(at);
    }

    let funcs_at = tables.align(16);
    for (i, f) in exec.funcs.iter().enumerate() {
        let base = tables.zeros(FUNC_INFO_SIZE);
        tables.data_relocs.push((base + FUNC_NAME, rodata_id, func_names[i]));
        if let Some(sym) = &symbols[i] {
            let id = module.declare_function(sym, Linkage::Import, &sig)?;
            tables.func_relocs.push((base + FUNC_PACKED, id));
        }
        if !f.param_names.is_empty() {
            tables.self_relocs.push((base + FUNC_PARAM_NAMES, param_arrays[i]));
        }
        tables.put_at(base + FUNC_START, &f.start_instr.to_le_bytes());
        tables.put_at(base + FUNC_END, &f.end_instr.to_le_bytes());
        tables.put_at(base + FUNC_REGS, &f.register_file_size.to_le_bytes());
        let (kind, id) = match (f.kind, compiled.get(i).copied().flatten()) {
            (FuncKind::Packed, _) => (0i32, None),
            (_, Some(id)) => (2, Some(id)),
            _ => (1, None),
        };
        tables.put_at(base + FUNC_KIND, &kind.to_le_bytes());
        tables.put_at(base + FUNC_NUM_ARGS, &(f.num_args as i32).to_le_bytes());
        if let Some(id) = id {
            tables.func_relocs.push((base + FUNC_COMPILED, id));
        }
    }

    let consts_at = tables.align(16);
    for (c, (data, shape)) in exec.constants.iter().zip(&const_parts) {
        let base = tables.zeros(CONST_INFO_SIZE);
        if let Some((id, d)) = data {
            tables.data_relocs.push((base + CONST_DATA, *id, *d));
        }
        if let Some(s) = shape {
            tables.data_relocs.push((base + CONST_SHAPE, rodata_id, *s));
        }
        let (size, ndim, dtype): (i64, i32, [u8; 4]) = match c {
            Constant::Tensor(t) => (t.data.len() as i64, t.shape.len() as i32, dtype_bytes(t.dtype)),
            Constant::Shape(s) => (s.len() as i64, 0, [0; 4]),
            Constant::Str(s) => (s.len() as i64, 0, [0; 4]),
            Constant::Int(v) => (*v, 0, [0; 4]),
            Constant::Float(v) => (v.to_bits() as i64, 0, [0; 4]),
            Constant::DataType(d) => (0, 0, dtype_bytes(*d)),
        };
        tables.put_at(base + CONST_SIZE, &size.to_le_bytes());
        tables.put_at(base + CONST_KIND, &c.type_index().to_le_bytes());
        tables.put_at(base + CONST_NDIM, &ndim.to_le_bytes());
        tables.put_at(base + CONST_DTYPE, &dtype);
    }

    let exec_bytes = write_executable(exec);
    let prog = tables.align(16);
    tables.zeros(PROGRAM_SIZE);
    tables.put_at(prog + PROG_MAGIC, &PROGRAM_MAGIC.to_le_bytes());
    tables.put_at(prog + PROG_ABI, &PROGRAM_VERSION.to_le_bytes());
    let mode_word: u32 =
        if mode == ExecMode::Compiled { 1 } else { 0 } | if instrument { PROGRAM_INSTRUMENTED } else { 0 };
    tables.put_at(prog + PROG_EXEC_MODE, &mode_word.to_le_bytes());
    tables.data_relocs.push((prog + PROG_COMPILER_VERSION, rodata_id, version));
    tables.data_relocs.push((prog + PROG_TRIPLE, rodata_id, triple));
    tables.put_at(prog + PROG_HASH, &fnv1a(&exec_bytes).to_le_bytes());
    tables.put_at(prog + PROG_NUM_FUNCS, &(exec.funcs.len() as i64).to_le_bytes());
    tables.self_relocs.push((prog + PROG_FUNCS, funcs_at));
    tables.put_at(prog + PROG_NUM_CONSTS, &(exec.constants.len() as i64).to_le_bytes());
    tables.self_relocs.push((prog + PROG_CONSTS, consts_at));
    tables.put_at(prog + PROG_NUM_INSTRS, &(exec.instr_offset.len() as i64).to_le_bytes());
    tables.data_relocs.push((prog + PROG_INSTR_OFFSET, rodata_id, instr_offset));
    tables.data_relocs.push((prog + PROG_INSTR_DATA, rodata_id, instr_data));

    // The tables live in one object whose program header is the exported (hidden) symbol: put
    // the header first by splitting it off as its own data object.
    let tables_id = module.declare_data("rvm_model_tables", Linkage::Local, false, false)?;
    let program_id = module.declare_data(PROGRAM_SYMBOL, Linkage::Hidden, false, false)?;
    let header: Vec<u8> = tables.bytes[prog..prog + PROGRAM_SIZE].to_vec();
    let mut header_desc = DataDescription::new();
    header_desc.define(header.into_boxed_slice());
    header_desc.set_align(16);
    let mut tables_desc = DataDescription::new();
    tables_desc.define(tables.bytes[..prog].to_vec().into_boxed_slice());
    tables_desc.set_align(16);
    let self_gv_t = module.declare_data_in_data(tables_id, &mut tables_desc);
    let tables_gv_h = module.declare_data_in_data(tables_id, &mut header_desc);
    let mut data_gvs_t = HashMap::new();
    let mut data_gvs_h = HashMap::new();
    for (at, target) in &tables.self_relocs {
        if *at >= prog {
            header_desc.write_data_addr((*at - prog) as u32, tables_gv_h, *target as i64);
        } else {
            tables_desc.write_data_addr(*at as u32, self_gv_t, *target as i64);
        }
    }
    for (at, id, target) in &tables.data_relocs {
        if *at >= prog {
            let gv = *data_gvs_h.entry(*id).or_insert_with(|| module.declare_data_in_data(*id, &mut header_desc));
            header_desc.write_data_addr((*at - prog) as u32, gv, *target as i64);
        } else {
            let gv = *data_gvs_t.entry(*id).or_insert_with(|| module.declare_data_in_data(*id, &mut tables_desc));
            tables_desc.write_data_addr(*at as u32, gv, *target as i64);
        }
    }
    for (at, id) in &tables.func_relocs {
        let fref = module.declare_func_in_data(*id, &mut tables_desc);
        tables_desc.write_function_addr(*at as u32, fref);
    }
    module.define_data(tables_id, &tables_desc)?;
    module.define_data(program_id, &header_desc)?;

    let mut rodata_desc = DataDescription::new();
    rodata_desc.define(rodata.bytes.into_boxed_slice());
    rodata_desc.set_align(64);
    module.define_data(rodata_id, &rodata_desc)?;
    let mut tensors_desc = DataDescription::new();
    // An empty object still needs one byte to have an address.
    let tensor_bytes = if tensors.bytes.is_empty() { vec![0] } else { tensors.bytes };
    tensors_desc.define(tensor_bytes.into_boxed_slice());
    tensors_desc.set_align(64);
    module.define_data(tensors_id, &tensors_desc)?;
    Ok(())
}

/// A table of addresses of optional runtime functions the model needs beyond those its bytecode
/// calls (kernels look them up by name): referring to them makes the linker take their files.
fn define_runtime_refs(module: &mut ObjectModule, symbols: &[String]) -> Result<(), TablesError> {
    if symbols.is_empty() {
        return Ok(());
    }
    let sig = super::native::packed_signature(module);
    let id = module.declare_data("rvm_model_runtime_refs", Linkage::Local, false, false)?;
    let mut desc = DataDescription::new();
    desc.define(vec![0u8; 8 * symbols.len()].into_boxed_slice());
    desc.set_align(8);
    for (i, sym) in symbols.iter().enumerate() {
        let f = module.declare_function(sym, Linkage::Import, &sig)?;
        let fref = module.declare_func_in_data(f, &mut desc);
        desc.write_function_addr((8 * i) as u32, fref);
    }
    module.define_data(id, &desc)?;
    Ok(())
}

fn dtype_bytes(d: crate::vm::DType) -> [u8; 4] {
    let l = d.lanes.to_le_bytes();
    [d.code, d.bits, l[0], l[1]]
}

/// What the model object holds and how each Relax function runs.
pub struct EmittedObject {
    pub bytes: Vec<u8>,
    /// The symbols the shared object exports besides `rvm_get_api`: the tvm-ffi entry points.
    pub exports: Vec<String>,
    /// Relax functions left as bytecode in compiled mode, with the reason.
    pub notes: Vec<(String, String)>,
    /// The native functions' CLIF with `; pc=N` comments, when asked for.
    pub clif: String,
}

/// What the model object is made from.
pub struct ObjectInputs<'a> {
    pub exec: &'a Executable,
    /// The symbol bound to each packed function-table entry.
    pub symbols: &'a [Option<String>],
    pub mode: ExecMode,
    pub native: &'a super::native::NativeOptions,
    pub shape_funcs: &'a [super::shape_func::ShapeFunc],
    pub cuda: &'a [crate::cuda::CudaModule],
    /// Optional runtime functions to refer to (so that the link takes their files).
    pub runtime_refs: &'a [String],
    pub target: &'a target_lexicon::Triple,
}

/// Emits the whole model object: the tables, native code in compiled mode, the tvm-ffi entry
/// points, and the serialized executable plus each function's mode and the model's identity in
/// non-allocated sections for `relaxc inspect`.
pub fn emit_object(inputs: &ObjectInputs) -> Result<EmittedObject, TablesError> {
    let ObjectInputs { exec, symbols, mode, native: native_options, shape_funcs, cuda, runtime_refs, target } = *inputs;
    let mut module = object_module("model", target)?;
    define_runtime_refs(&mut module, runtime_refs)?;
    let mut taken: BTreeSet<String> = symbols.iter().flatten().cloned().collect();
    taken.extend(shape_funcs.iter().map(|f| format!("{}{}", crate::tvm::KERNEL_PREFIX, f.name)));
    taken
        .extend(cuda.iter().flat_map(|m| m.kernels.iter().map(|k| format!("{}{}", crate::tvm::KERNEL_PREFIX, k.name))));
    let ffi = super::ffi_entries::define(&mut module, exec, &taken)?;
    super::shape_func::define(&mut module, shape_funcs)?;
    let cuda_listing = super::cuda_tables::define(&mut module, cuda)?;
    let native = match mode {
        ExecMode::Compiled => super::native::compile_functions(&mut module, exec, symbols, native_options)?,
        ExecMode::Bytecode => Default::default(),
    };
    define_tables(&mut module, exec, symbols, &native.compiled, mode, native_options.instrument, target)?;
    let modes: String = exec
        .funcs
        .iter()
        .zip(native.compiled.iter().chain(std::iter::repeat(&None)))
        .filter(|(f, _)| f.kind != FuncKind::Packed)
        .map(|(f, c)| format!("{}\t{}\n", f.name, if c.is_some() { "compiled" } else { "bytecode" }))
        .collect();
    let mut product = module.finish();
    let mut sections =
        vec![(layout::EXEC_SECTION, write_executable(exec)), (layout::MODES_SECTION, modes.into_bytes())];
    let identity = format!("relaxc {} c-api {} target {target}", env!("CARGO_PKG_VERSION"), layout::C_API_VERSION);
    sections.push((layout::IDENTITY_SECTION, identity.into_bytes()));
    if !cuda_listing.is_empty() {
        sections.push((super::cuda_tables::layout::LISTING_SECTION, cuda_listing.into_bytes()));
    }
    for (name, data) in sections {
        let section = product.object.add_section(Vec::new(), name.as_bytes().to_vec(), object::SectionKind::Metadata);
        product.object.append_section_data(section, &data, 8);
    }
    let bytes = product.emit().map_err(|e| TablesError::Object(e.to_string()))?;
    let mut notes = native.notes;
    notes.extend(ffi.skipped.into_iter().map(|(f, why)| (f, format!("no tvm-ffi entry point: {why}"))));
    Ok(EmittedObject { bytes, exports: ffi.symbols, notes, clif: native.clif })
}
