//! The program tables of a model (`rvm_program` and what it points at, laid out as the
//! mirrors in `abi` say), emitted as data with cranelift-object. Function-table entries are
//! relocations straight to kernel and builtin symbols, so nothing is looked up by name at load
//! time. Constant tensors sit 64-byte aligned in writable data (`.data`), used in place: TVM
//! lets in-place kernels write into constants and keeps the change, and a private mapping of
//! `.data` costs nothing until a page is written. Everything else constant is read-only.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};

use cranelift_module::{DataDescription, DataId, FuncId, Linkage, Module};
use cranelift_object::ObjectModule;

use super::CodegenError;
use super::native::NativeBody;
use crate::abi::{self, ConstInfo, FuncInfo, Program};
use crate::vm::format::write_executable_elided;
use crate::vm::{Constant, Executable, FuncKind};

/// Alignment of constant tensors' elements (what TVM's kernels assume).
const TENSOR_ALIGN: usize = 64;
/// Alignment of each table and of the program header.
const TABLE_ALIGN: usize = 16;

/// A growing data blob whose pointers to itself and to other data become relocations.
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
    fn words(&mut self, words: &[i64]) -> usize {
        self.put(&words.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<_>>())
    }
}

const FNV_OFFSET: u64 = 0xcbf29ce484222325;

/// FNV-1a over `bytes`, continuing from `hash`.
fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// The three data objects the tables are made of, while they are being written.
struct Writer {
    /// Pointer-free read-only data: strings, shapes, code.
    rodata: Blob,
    /// The bytes the constant tensors' elements take, laid out one after another.
    tensors_len: usize,
    /// The tables proper: full of pointers.
    tables: Blob,
    rodata_id: DataId,
    tensors_id: DataId,
}

/// Where a constant's data went (which object, where) and, for a tensor, its shape in rodata.
#[derive(Clone, Copy)]
struct ConstData {
    data: Option<(DataId, usize)>,
    shape: Option<usize>,
}

/// Where the strings and arrays the tables point at were put.
struct Pointees {
    func_names: Vec<usize>,
    version: usize,
    triple: usize,
    instr_offset: usize,
    instr_data: usize,
    consts: Vec<ConstData>,
    /// Per function: where its parameter-name array starts in the tables.
    param_arrays: Vec<usize>,
}

/// Adds the program tables for `exec` to `module`. `symbols[i]` is the symbol bound to packed
/// entry i; `compiled[i]` the native body of Relax function i, if it has one; `mode_word` is
/// `rvm_program.exec_mode`.
pub fn define_tables(
    module: &mut ObjectModule,
    exec: &Executable,
    symbols: &[Option<String>],
    compiled: &[Option<NativeBody>],
    mode_word: u32,
    target: &target_lexicon::Triple,
) -> Result<TensorPlacement, CodegenError> {
    let mut rodata = Blob::new();
    let func_names: Vec<usize> = exec.funcs.iter().map(|f| rodata.cstr(&f.name)).collect();
    let version = rodata.cstr(env!("CARGO_PKG_VERSION"));
    let triple = rodata.cstr(&target.to_string());
    rodata.align(size_of::<i64>());
    let instr_offset = rodata.words(&exec.instr_offset);
    let instr_data = rodata.words(&exec.instr_data);
    let rodata_id = module.declare_data("rvm_model_rodata", Linkage::Local, false, false)?;
    let tensors_id = module.declare_data(abi::CONSTANTS_SYMBOL, Linkage::Import, true, false)?;
    let mut w = Writer { rodata, tensors_len: 0, tables: Blob::new(), rodata_id, tensors_id };
    let consts = w.constant_data(exec);
    let param_arrays = w.param_name_arrays(exec);
    let at = Pointees { func_names, version, triple, instr_offset, instr_data, consts, param_arrays };
    let funcs_at = w.function_table(module, exec, symbols, compiled, &at)?;
    let consts_at = w.constant_table(exec, &at);
    let prog = w.program_header(exec, mode_word, &at, funcs_at, consts_at);
    let offsets = exec
        .constants
        .iter()
        .zip(&at.consts)
        .map(|(c, d)| match (c, d.data) {
            (Constant::Tensor(_), Some((_, offset))) => Some(offset as u64),
            _ => None,
        })
        .collect();
    let size = w.tensors_len as u64;
    w.define(module, prog)?;
    Ok(TensorPlacement { data: tensors_id, offsets, size })
}

/// Where the tensor constants' elements go: the constants object's one symbol, each constant's
/// offset from it (None for other kinds), and the bytes they take. The model's `.rvm_consts`
/// section points `inspect` there too.
pub struct TensorPlacement {
    pub data: DataId,
    pub offsets: Vec<Option<u64>>,
    pub size: u64,
}

impl Writer {
    /// Tensor elements, shapes and strings of the constant pool.
    fn constant_data(&mut self, exec: &Executable) -> Vec<ConstData> {
        let mut parts = Vec::new();
        for c in &exec.constants {
            let part = match c {
                Constant::Tensor(t) => {
                    let shape = self.rodata.align(size_of::<i64>());
                    self.rodata.words(&t.shape);
                    // Only the place: the elements go to the constants object (super::constants).
                    let data = self.tensors_len.next_multiple_of(TENSOR_ALIGN);
                    self.tensors_len = data + t.data.len();
                    ConstData { data: Some((self.tensors_id, data)), shape: Some(shape) }
                }
                Constant::Shape(s) => {
                    let at = self.rodata.align(size_of::<i64>());
                    self.rodata.words(s);
                    ConstData { data: Some((self.rodata_id, at)), shape: None }
                }
                Constant::Str(s) => ConstData { data: Some((self.rodata_id, self.rodata.cstr(s))), shape: None },
                _ => ConstData { data: None, shape: None },
            };
            parts.push(part);
        }
        parts
    }

    /// Each function's array of pointers to its parameter names.
    fn param_name_arrays(&mut self, exec: &Executable) -> Vec<usize> {
        self.tables.align(abi::POINTER_SIZE);
        let mut arrays = Vec::new();
        for f in &exec.funcs {
            let at = self.tables.bytes.len();
            for p in &f.param_names {
                let s = self.rodata.cstr(p);
                let slot = self.tables.zeros(abi::POINTER_SIZE);
                self.tables.data_relocs.push((slot, self.rodata_id, s));
            }
            arrays.push(at);
        }
        arrays
    }

    /// One `rvm_func_info` per function-table entry; returns where the table starts.
    fn function_table(
        &mut self,
        module: &mut ObjectModule,
        exec: &Executable,
        symbols: &[Option<String>],
        compiled: &[Option<NativeBody>],
        at: &Pointees,
    ) -> Result<usize, CodegenError> {
        let sig = super::shim::packed_signature(module);
        let t = &mut self.tables;
        let funcs_at = t.align(TABLE_ALIGN);
        for (i, f) in exec.funcs.iter().enumerate() {
            let base = t.zeros(size_of::<FuncInfo>());
            t.data_relocs.push((base + offset_of!(FuncInfo, name), self.rodata_id, at.func_names[i]));
            if let Some(sym) = &symbols[i] {
                let id = module.declare_function(sym, Linkage::Import, &sig)?;
                t.func_relocs.push((base + offset_of!(FuncInfo, packed), id));
            }
            if !f.param_names.is_empty() {
                t.self_relocs.push((base + offset_of!(FuncInfo, param_names), at.param_arrays[i]));
            }
            t.put_at(base + offset_of!(FuncInfo, start_instr), &f.start_instr.to_le_bytes());
            t.put_at(base + offset_of!(FuncInfo, end_instr), &f.end_instr.to_le_bytes());
            let body = compiled.get(i).copied().flatten();
            let registers = body.map_or(f.register_file_size, |body| body.registers);
            t.put_at(base + offset_of!(FuncInfo, register_file_size), &registers.to_le_bytes());
            let (kind, id) = match (f.kind, body) {
                (FuncKind::Packed, _) => (abi::FUNC_PACKED, None),
                (_, Some(body)) => (abi::FUNC_COMPILED, Some(body.id)),
                _ => (abi::FUNC_BYTECODE, None),
            };
            t.put_at(base + offset_of!(FuncInfo, kind), &kind.to_le_bytes());
            t.put_at(base + offset_of!(FuncInfo, num_args), &(f.num_args as i32).to_le_bytes());
            if let Some(id) = id {
                t.func_relocs.push((base + offset_of!(FuncInfo, compiled), id));
            }
        }
        Ok(funcs_at)
    }

    /// One `rvm_const_info` per constant; returns where the table starts.
    fn constant_table(&mut self, exec: &Executable, at: &Pointees) -> usize {
        let t = &mut self.tables;
        let consts_at = t.align(TABLE_ALIGN);
        for (c, ConstData { data, shape }) in exec.constants.iter().zip(&at.consts) {
            let base = t.zeros(size_of::<ConstInfo>());
            if let Some((id, d)) = data {
                t.data_relocs.push((base + offset_of!(ConstInfo, data), *id, *d));
            }
            if let Some(s) = shape {
                t.data_relocs.push((base + offset_of!(ConstInfo, shape), self.rodata_id, *s));
            }
            let (size, ndim, dtype): (i64, i32, [u8; 4]) = match c {
                Constant::Tensor(t) => (t.data.len() as i64, t.shape.len() as i32, dtype_bytes(t.dtype)),
                Constant::Shape(s) => (s.len() as i64, 0, [0; 4]),
                Constant::Str(s) => (s.len() as i64, 0, [0; 4]),
                Constant::Int(v) => (*v, 0, [0; 4]),
                Constant::Float(v) => (v.to_bits() as i64, 0, [0; 4]),
                Constant::DataType(d) => (0, 0, dtype_bytes(*d)),
            };
            t.put_at(base + offset_of!(ConstInfo, size), &size.to_le_bytes());
            t.put_at(base + offset_of!(ConstInfo, kind), &c.type_index().to_le_bytes());
            t.put_at(base + offset_of!(ConstInfo, ndim), &ndim.to_le_bytes());
            t.put_at(base + offset_of!(ConstInfo, dtype), &dtype);
        }
        consts_at
    }

    /// The `rvm_program` header, last in the tables; returns where it starts.
    fn program_header(
        &mut self,
        exec: &Executable,
        mode_word: u32,
        at: &Pointees,
        funcs_at: usize,
        consts_at: usize,
    ) -> usize {
        // The hash covers the whole executable, elements included, without serializing it whole.
        let mut hash = fnv1a(FNV_OFFSET, &write_executable_elided(exec));
        for c in &exec.constants {
            if let Constant::Tensor(t) = c {
                hash = fnv1a(hash, &t.data);
            }
        }
        let t = &mut self.tables;
        let prog = t.align(TABLE_ALIGN);
        t.zeros(size_of::<Program>());
        let field = |offset: usize| prog + offset;
        t.put_at(field(offset_of!(Program, magic)), &abi::PROGRAM_MAGIC.to_le_bytes());
        t.put_at(field(offset_of!(Program, abi_version)), &abi::PROGRAM_VERSION.to_le_bytes());
        t.put_at(field(offset_of!(Program, exec_mode)), &mode_word.to_le_bytes());
        t.data_relocs.push((field(offset_of!(Program, compiler_version)), self.rodata_id, at.version));
        t.data_relocs.push((field(offset_of!(Program, target_triple)), self.rodata_id, at.triple));
        t.put_at(field(offset_of!(Program, executable_hash)), &hash.to_le_bytes());
        t.put_at(field(offset_of!(Program, num_funcs)), &(exec.funcs.len() as i64).to_le_bytes());
        t.self_relocs.push((field(offset_of!(Program, funcs)), funcs_at));
        t.put_at(field(offset_of!(Program, num_consts)), &(exec.constants.len() as i64).to_le_bytes());
        t.self_relocs.push((field(offset_of!(Program, consts)), consts_at));
        t.put_at(field(offset_of!(Program, num_instrs)), &(exec.instr_offset.len() as i64).to_le_bytes());
        t.data_relocs.push((field(offset_of!(Program, instr_offset)), self.rodata_id, at.instr_offset));
        t.data_relocs.push((field(offset_of!(Program, instr_data)), self.rodata_id, at.instr_data));
        prog
    }

    /// Defines the data objects. The program header is the exported (hidden) symbol: it is
    /// split off the tables as its own data object, so that it comes first in it.
    fn define(self, module: &mut ObjectModule, prog: usize) -> Result<(), CodegenError> {
        let Writer { rodata, tables, rodata_id, .. } = self;
        let tables_id = module.declare_data("rvm_model_tables", Linkage::Local, false, false)?;
        let program_id = module.declare_data(abi::PROGRAM_SYMBOL, Linkage::Hidden, false, false)?;
        let header: Vec<u8> = tables.bytes[prog..prog + size_of::<Program>()].to_vec();
        let mut header_desc = DataDescription::new();
        header_desc.define(header.into_boxed_slice());
        header_desc.set_align(TABLE_ALIGN as u64);
        let mut tables_desc = DataDescription::new();
        tables_desc.define(tables.bytes[..prog].to_vec().into_boxed_slice());
        tables_desc.set_align(TABLE_ALIGN as u64);
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
        define_blob(module, rodata_id, rodata.bytes, TENSOR_ALIGN as u64)
    }
}

fn define_blob(module: &mut ObjectModule, id: DataId, bytes: Vec<u8>, align: u64) -> Result<(), CodegenError> {
    let mut desc = DataDescription::new();
    desc.define(bytes.into_boxed_slice());
    desc.set_align(align);
    module.define_data(id, &desc)?;
    Ok(())
}

fn dtype_bytes(d: crate::vm::DType) -> [u8; 4] {
    let l = d.lanes.to_le_bytes();
    [d.code, d.bits, l[0], l[1]]
}
