//! The VMExecutable byte stream (format 0.14, magic V1 or V2), read and written exactly as
//! TVM 0.27 does (apache/tvm src/runtime/vm/executable.cc). Input is untrusted: every count is
//! checked against the bytes left before anything is allocated, and every error names the
//! section and the byte offset.

use std::sync::Arc;

use super::{Constant, DType, Executable, FuncInfo, FuncKind, SharedBytes, TensorConst};

pub const MAGIC_V1: u64 = 0xD225DE2F4214151D;
pub const MAGIC_V2: u64 = 0xD225DE2F4214151E;
pub const VERSION: &str = "0.14";
const TENSOR_MAGIC: u64 = 0xDD5E40F096B4A13F;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{what} at byte {offset}: {message}")]
pub struct FormatError {
    pub what: String,
    pub offset: usize,
    pub message: String,
}

/// The shared buffer an executable's bytes are part of, and where they start in it.
pub type Backing<'a> = (&'a Arc<dyn AsRef<[u8]> + Send + Sync>, usize);

/// A cursor over untrusted little-endian bytes.
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    /// When `data` is part of a shared buffer: tensor elements are taken as ranges of it.
    backing: Option<Backing<'a>>,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Reader<'a> {
        Reader { data, pos: 0, backing: None }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    pub fn error(&self, what: &str, message: impl Into<String>) -> FormatError {
        FormatError { what: what.to_string(), offset: self.pos, message: message.into() }
    }

    pub fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], FormatError> {
        if n > self.remaining() {
            return Err(
                self.error(what, format!("needs {n} bytes but only {} are left (truncated?)", self.remaining()))
            );
        }
        let out = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], FormatError> {
        let b = self.bytes(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8, FormatError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub fn u16(&mut self, what: &str) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub fn i32(&mut self, what: &str) -> Result<i32, FormatError> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }
    pub fn u64(&mut self, what: &str) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    pub fn i64(&mut self, what: &str) -> Result<i64, FormatError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    pub fn f64(&mut self, what: &str) -> Result<f64, FormatError> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    /// A count of items each at least `item_size` bytes long, checked against what is left.
    pub fn count(&mut self, item_size: usize, what: &str) -> Result<usize, FormatError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let fits = usize::try_from(n).ok().filter(|n| n.saturating_mul(item_size.max(1)) <= self.remaining());
        fits.ok_or_else(|| FormatError {
            what: what.to_string(),
            offset: at,
            message: format!("count {n} does not fit in the {} bytes left", self.remaining()),
        })
    }

    pub fn string(&mut self, what: &str) -> Result<String, FormatError> {
        let n = self.count(1, what)?;
        let at = self.pos;
        let b = self.bytes(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| FormatError {
            what: what.to_string(),
            offset: at,
            message: "is not valid UTF-8".into(),
        })
    }

    pub fn vec_i64(&mut self, what: &str) -> Result<Vec<i64>, FormatError> {
        let n = self.count(8, what)?;
        (0..n).map(|_| self.i64(what)).collect()
    }

    pub fn dtype(&mut self, what: &str) -> Result<DType, FormatError> {
        Ok(DType { code: self.u8(what)?, bits: self.u8(what)?, lanes: self.u16(what)? })
    }
}

/// Supplies the elements of an elided tensor constant: (constant index, byte size) -> bytes.
pub type ElidedData<'a> = &'a mut dyn FnMut(usize, usize) -> Result<SharedBytes, String>;

/// Reads one tensor record (TVM's stand-alone tensor format), as nested in the constant pool.
pub fn read_tensor(r: &mut Reader, what: &str) -> Result<TensorConst, FormatError> {
    read_tensor_record(r, what, None)
}

/// A tensor record; with `elided` = (index, source), one without elements takes them from there.
fn read_tensor_record(
    r: &mut Reader,
    what: &str,
    elided: Option<(usize, &mut ElidedData)>,
) -> Result<TensorConst, FormatError> {
    if r.u64(what)? != TENSOR_MAGIC {
        return Err(r.error(what, "bad tensor magic"));
    }
    r.u64(what)?; // reserved
    let (dev_type, dev_id) = (r.i32(what)?, r.i32(what)?);
    if (dev_type, dev_id) != (1, 0) {
        return Err(
            r.error(what, format!("tensor saved for device ({dev_type}, {dev_id}); only CPU tensors can be loaded"))
        );
    }
    let ndim = r.i32(what)?;
    if !(0..=64).contains(&ndim) {
        return Err(r.error(what, format!("tensor ndim {ndim} is out of range")));
    }
    let dtype = r.dtype(what)?;
    if dtype.lanes == 0 || dtype.bits == 0 {
        return Err(r.error(what, format!("tensor dtype {dtype} is not valid")));
    }
    let mut shape = Vec::with_capacity(ndim as usize);
    let mut elems: i64 = 1;
    for _ in 0..ndim {
        let d = r.i64(what)?;
        if d < 0 {
            return Err(r.error(what, format!("negative tensor dimension {d}")));
        }
        elems = elems.checked_mul(d).ok_or_else(|| r.error(what, "tensor size overflows"))?;
        shape.push(d);
    }
    let size = r.i64(what)?;
    // TVM ignores lanes in this formula; so do we, to accept exactly what TVM writes.
    let expect =
        elems.checked_mul(dtype.bits.div_ceil(8) as i64).ok_or_else(|| r.error(what, "tensor size overflows"))?;
    if size == crate::abi::ELIDED_TENSOR_SIZE
        && let Some((index, source)) = elided
    {
        let data = source(index, expect as usize).map_err(|m| r.error(what, m))?;
        if data.len() as i64 != expect {
            return Err(r.error(what, format!("{} bytes of elements found, the shape needs {expect}", data.len())));
        }
        return Ok(TensorConst { dtype, shape, data });
    }
    if size != expect {
        return Err(r.error(what, format!("tensor data size {size} does not match shape and dtype ({expect} bytes)")));
    }
    let start = r.pos();
    let bytes = r.bytes(size as usize, what)?;
    let data = match r.backing {
        Some((buffer, offset)) => {
            SharedBytes::slice_of(Arc::clone(buffer), offset + start..offset + start + bytes.len())
        }
        None => bytes.to_vec().into(),
    };
    Ok(TensorConst { dtype, shape, data })
}

pub fn write_tensor(out: &mut Vec<u8>, t: &TensorConst) {
    write_tensor_record(out, t, false)
}

/// A tensor record; `elided`: without its elements (size `ELIDED_TENSOR_SIZE`).
fn write_tensor_record(out: &mut Vec<u8>, t: &TensorConst, elided: bool) {
    out.extend(TENSOR_MAGIC.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend(1i32.to_le_bytes());
    out.extend(0i32.to_le_bytes());
    out.extend((t.shape.len() as i32).to_le_bytes());
    out.extend([t.dtype.code, t.dtype.bits]);
    out.extend(t.dtype.lanes.to_le_bytes());
    for d in &t.shape {
        out.extend(d.to_le_bytes());
    }
    if elided {
        out.extend(crate::abi::ELIDED_TENSOR_SIZE.to_le_bytes());
    } else {
        out.extend((t.data.len() as i64).to_le_bytes());
        out.extend_from_slice(&t.data);
    }
}

/// Parses a VMExecutable byte stream.
pub fn read_executable(bytes: &[u8]) -> Result<Executable, FormatError> {
    read_executable_with(bytes, None)
}

/// Parses one written by `write_executable_elided`, taking each tensor constant's elements from
/// `source` (a plain executable reads the same).
pub fn read_executable_elided(bytes: &[u8], source: ElidedData) -> Result<Executable, FormatError> {
    read_executable_with(bytes, Some(source))
}

/// Parses `buffer[range]`, whose tensor constants keep their elements in `buffer` (shared, not
/// copied: a memory-mapped export stays the only copy of the weights).
pub fn read_executable_shared(
    buffer: &Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: std::ops::Range<usize>,
) -> Result<Executable, FormatError> {
    let bytes = (**buffer).as_ref().get(range.clone()).ok_or_else(|| FormatError {
        what: "executable".into(),
        offset: 0,
        message: "lies outside its buffer".into(),
    })?;
    let mut r = Reader::new(bytes);
    r.backing = Some((buffer, range.start));
    read_executable_from(r, None)
}

fn read_executable_with(bytes: &[u8], source: Option<ElidedData>) -> Result<Executable, FormatError> {
    read_executable_from(Reader::new(bytes), source)
}

fn read_executable_from(mut r: Reader, mut source: Option<ElidedData>) -> Result<Executable, FormatError> {
    let magic = r.u64("header magic")?;
    if magic != MAGIC_V1 && magic != MAGIC_V2 {
        return Err(FormatError {
            what: "header".into(),
            offset: 0,
            message: format!("magic {magic:#x} is not a Relax VM executable"),
        });
    }
    let version = r.string("header version")?;
    if version != VERSION {
        return Err(r.error("header version", format!("version {version:?}, expected {VERSION:?}")));
    }
    let mut exec = Executable::default();
    let nfuncs = r.count(4 + 8 * 6, "function table")?;
    for i in 0..nfuncs {
        let what = format!("function table entry {i}");
        let kind = match r.i32(&what)? {
            0 => FuncKind::Packed,
            1 => FuncKind::Bytecode,
            2 => FuncKind::Compiled,
            k => return Err(r.error(&what, format!("unknown function kind {k}"))),
        };
        let name = r.string(&what)?;
        let start_instr = r.i64(&what)?;
        let end_instr = r.i64(&what)?;
        let num_args = r.i64(&what)?;
        let register_file_size = r.i64(&what)?;
        let nparams = r.count(8, &what)?;
        let param_names = (0..nparams).map(|_| r.string(&what)).collect::<Result<_, _>>()?;
        exec.funcs.push(FuncInfo { kind, name, start_instr, end_instr, num_args, register_file_size, param_names });
    }
    if magic == MAGIC_V2 {
        let n = r.count(16, "memory scopes")?;
        for _ in 0..n {
            let index = r.i64("memory scopes")?;
            exec.memory_scopes.push((index, r.string("memory scopes")?));
        }
    }
    let nconsts = r.count(4, "constant pool")?;
    for i in 0..nconsts {
        let what = format!("constant {i}");
        let c = match r.i32(&what)? {
            70 => Constant::Tensor(read_tensor_record(&mut r, &what, source.as_mut().map(|s| (i, s)))?),
            69 => Constant::Shape(r.vec_i64(&what)?),
            65 => Constant::Str(r.string(&what)?),
            1 => Constant::Int(r.i64(&what)?),
            3 => Constant::Float(r.f64(&what)?),
            5 => Constant::DataType(r.dtype(&what)?),
            tag => return Err(r.error(&what, format!("constant kind {tag} cannot be in a constant pool"))),
        };
        exec.constants.push(c);
    }
    exec.instr_offset = r.vec_i64("code section: instruction offsets")?;
    exec.instr_data = r.vec_i64("code section: instruction words")?;
    Ok(exec)
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// Serializes an executable as TVM 0.27 writes it (magic V2, version 0.14).
pub fn write_executable(exec: &Executable) -> Vec<u8> {
    write_executable_with(exec, false)
}

/// The same with every tensor constant's elements left out (a built model's `.rvm_exec`: the
/// elements are in the model's data once). `read_executable_elided` reads it back.
pub fn write_executable_elided(exec: &Executable) -> Vec<u8> {
    write_executable_with(exec, true)
}

fn write_executable_with(exec: &Executable, elide_tensors: bool) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(MAGIC_V2.to_le_bytes());
    put_str(&mut out, VERSION);
    out.extend((exec.funcs.len() as u64).to_le_bytes());
    for f in &exec.funcs {
        out.extend((f.kind as i32).to_le_bytes());
        put_str(&mut out, &f.name);
        for v in [f.start_instr, f.end_instr, f.num_args, f.register_file_size] {
            out.extend(v.to_le_bytes());
        }
        out.extend((f.param_names.len() as u64).to_le_bytes());
        for p in &f.param_names {
            put_str(&mut out, p);
        }
    }
    out.extend((exec.memory_scopes.len() as u64).to_le_bytes());
    for (i, s) in &exec.memory_scopes {
        out.extend(i.to_le_bytes());
        put_str(&mut out, s);
    }
    out.extend((exec.constants.len() as u64).to_le_bytes());
    for c in &exec.constants {
        out.extend(c.type_index().to_le_bytes());
        match c {
            Constant::Tensor(t) => write_tensor_record(&mut out, t, elide_tensors),
            Constant::Shape(s) => {
                out.extend((s.len() as u64).to_le_bytes());
                for d in s {
                    out.extend(d.to_le_bytes());
                }
            }
            Constant::Str(s) => put_str(&mut out, s),
            Constant::Int(v) => out.extend(v.to_le_bytes()),
            Constant::Float(v) => out.extend(v.to_le_bytes()),
            Constant::DataType(d) => {
                out.extend([d.code, d.bits]);
                out.extend(d.lanes.to_le_bytes());
            }
        }
    }
    for v in [&exec.instr_offset, &exec.instr_data] {
        out.extend((v.len() as u64).to_le_bytes());
        for w in v.iter() {
            out.extend(w.to_le_bytes());
        }
    }
    out
}
