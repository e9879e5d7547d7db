//! Inputs and outputs of `relaxc run` as numpy `.npz` files: `argN` (or numpy's positional
//! `arr_N`) is argument N as a tensor, `argN.shape` an int64 1-D array passed as a shape tuple,
//! `argN.prim` a 0-d array passed as a scalar. Results are written as `out0, out1, …`.

use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::path::Path;

use npyz::{TypeChar, WriterBuilder};

use super::{AlignedBuf, HostTensor, Input, Output};
use crate::abi::DLDataType;

#[derive(Debug, thiserror::Error)]
pub enum NpzError {
    #[error("cannot open {path}: {message}")]
    Io { path: String, message: String },
    #[error("{path}: {key}: {message}")]
    Array { path: String, key: String, message: String },
    #[error("{path}: {message}")]
    Layout { path: String, message: String },
    #[error("cannot write result {index}: {message}")]
    Output { index: usize, message: String },
    #[error(transparent)]
    Write(#[from] crate::outfile::OutputError),
}

enum Kind {
    Tensor,
    Shape,
    Prim,
}

/// Parses an entry name into (argument index, kind).
fn parse_key(key: &str) -> Option<(usize, Kind)> {
    let (base, kind) = match key.rsplit_once('.') {
        Some((b, "shape")) => (b, Kind::Shape),
        Some((b, "prim")) => (b, Kind::Prim),
        _ => (key, Kind::Tensor),
    };
    let index = base.strip_prefix("arg").or_else(|| base.strip_prefix("arr_"))?;
    Some((index.parse().ok()?, kind))
}

fn dl_dtype(t: &npyz::TypeStr) -> Result<DLDataType, String> {
    let bytes = t.size_field() as u8;
    let code = match t.type_char() {
        TypeChar::Bool => {
            return Ok(DLDataType { code: 6, bits: 8, lanes: 1 });
        }
        TypeChar::Int => 0,
        TypeChar::Uint => 1,
        TypeChar::Float => 2,
        _ => return Err(format!("dtype {t} is not supported (use bool, int, uint or float)")),
    };
    if !matches!(bytes, 1 | 2 | 4 | 8) {
        return Err(format!("dtype {t} is not supported (elements of 1, 2, 4 or 8 bytes)"));
    }
    Ok(DLDataType { code, bits: bytes * 8, lanes: 1 })
}

/// Deflate expands at most 1032:1; an entry that declares more than that is lying about its size.
const DEFLATE_MAX_RATIO: u64 = 1032;

/// One array of an `.npz` file, checked against its entry's sizes and converted to what the
/// runtime takes: little-endian, C order.
struct Array {
    dtype: DLDataType,
    shape: Vec<i64>,
    data: AlignedBuf,
}

/// Reads one `.npy` entry. Sizes are checked before anything is allocated: the header's shape
/// must fit in i64 dims and a byte count that does not wrap, the entry must declare at least that
/// many bytes, and the declaration must be possible for the entry's compressed size; reading
/// stops at the array's size, so a deflate bomb costs no more than the array it claims to be.
fn read_array<R: Read>(entry: zip::read::ZipFile<'_, R>) -> Result<Array, String> {
    let (declared, compressed) = (entry.size(), entry.compressed_size());
    let ceiling = match entry.compression() {
        zip::CompressionMethod::Stored => compressed,
        _ => compressed.saturating_mul(DEFLATE_MAX_RATIO).saturating_add(1024),
    };
    if declared > ceiling {
        return Err(format!("the entry declares {declared} bytes but its {compressed} stored bytes cannot hold that"));
    }
    let mut entry = entry;
    let header = read_header(&mut entry)?;
    let ts: npyz::TypeStr = header
        .descr
        .parse()
        .map_err(|_| format!("dtype {:?} is not supported (use bool, int, uint or float)", header.descr))?;
    let dtype = dl_dtype(&ts)?;
    let item = dtype.bits as u64 / 8;
    let mut shape = Vec::with_capacity(header.shape.len());
    for (axis, &dim) in header.shape.iter().enumerate() {
        let dim = i64::try_from(dim).map_err(|_| format!("dimension {axis} ({dim}) is larger than an int64"))?;
        shape.push(dim);
    }
    let nbytes = header
        .shape
        .iter()
        .try_fold(item, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= isize::MAX as u64)
        .ok_or_else(|| format!("shape {:?} of {ts} overflows a 64-bit byte count", header.shape))?;
    let holds = declared.saturating_sub(header.size);
    if nbytes > holds {
        return Err(format!("its shape {shape:?} of {ts} needs {nbytes} bytes but the entry holds {holds}"));
    }
    let fortran = header.fortran_order;
    let mut data = AlignedBuf::zeroed(nbytes as usize);
    let mut body = entry.take(nbytes);
    let mut filled = 0;
    while filled < data.as_slice().len() {
        match body.read(&mut data.as_mut_slice()[filled..]) {
            Ok(0) => return Err(format!("holds {filled} data bytes, its shape needs {nbytes}")),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    if item > 1 && ts.endianness() == npyz::Endianness::Big {
        for element in data.as_mut_slice().chunks_exact_mut(item as usize) {
            element.reverse();
        }
    }
    if fortran && shape.iter().filter(|&&d| d > 1).count() > 1 {
        data = fortran_to_c(&data, &shape, item as usize);
    }
    Ok(Array { dtype, shape, data })
}

/// What an `.npy` header says.
struct NpyHeader {
    /// Bytes of the magic, version, length and dictionary: where the data starts.
    size: u64,
    descr: String,
    fortran_order: bool,
    shape: Vec<u64>,
}

/// Headers longer than this are not numpy's (it pads to 64 bytes and writes a few hundred).
const MAX_HEADER: usize = 1 << 16;

/// Reads the `.npy` magic and header dictionary (`{'descr': '<f4', 'fortran_order': False,
/// 'shape': (2, 3), }`). Read here rather than by npyz, whose reader multiplies the shape out
/// unchecked (a panic or a wrapped count on a hostile header).
fn read_header(r: &mut impl Read) -> Result<NpyHeader, String> {
    let bad = |what: &str| format!("not a .npy array: {what}");
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(|_| bad("too short"))?;
    if &magic[..6] != b"\x93NUMPY" {
        return Err(bad("no NUMPY magic"));
    }
    let (len, len_bytes) = match magic[6] {
        1 => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b).map_err(|_| bad("truncated header"))?;
            (u16::from_le_bytes(b) as usize, 2)
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b).map_err(|_| bad("truncated header"))?;
            (u32::from_le_bytes(b) as usize, 4)
        }
        v => return Err(bad(&format!("format version {v} is not supported"))),
    };
    if len > MAX_HEADER {
        return Err(bad(&format!("a {len}-byte header")));
    }
    let mut text = vec![0u8; len];
    r.read_exact(&mut text).map_err(|_| bad("truncated header"))?;
    let text = String::from_utf8(text).map_err(|_| bad("the header is not text"))?;
    let value = |key: &str| -> Result<&str, String> {
        let at = text.find(&format!("'{key}'")).ok_or_else(|| bad(&format!("no '{key}' in the header")))?;
        let rest = text[at + key.len() + 2..].trim_start();
        Ok(rest.strip_prefix(':').ok_or_else(|| bad("malformed header"))?.trim_start())
    };
    let descr = value("descr")?;
    let descr = match descr.chars().next() {
        Some(q @ ('\'' | '"')) => descr[1..].split(q).next().ok_or_else(|| bad("malformed descr"))?.to_string(),
        _ => return Err("structured arrays are not supported".into()),
    };
    let fortran_order = match value("fortran_order")? {
        v if v.starts_with("True") => true,
        v if v.starts_with("False") => false,
        _ => return Err(bad("malformed fortran_order")),
    };
    let dims =
        value("shape")?.strip_prefix('(').and_then(|v| v.split_once(')')).ok_or_else(|| bad("malformed shape"))?.0;
    let shape = dims
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.trim_end_matches('L').parse::<u64>().map_err(|_| bad(&format!("dimension {d:?} is not a count"))))
        .collect::<Result<_, _>>()?;
    Ok(NpyHeader { size: (magic.len() + len_bytes + len) as u64, descr, fortran_order, shape })
}

/// Reorders a column-major array into row-major order.
fn fortran_to_c(data: &AlignedBuf, shape: &[i64], item: usize) -> AlignedBuf {
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    // Column-major strides in elements: axis 0 varies fastest.
    let mut strides = vec![1usize; dims.len()];
    for axis in 1..dims.len() {
        strides[axis] = strides[axis - 1] * dims[axis - 1];
    }
    let mut out = AlignedBuf::zeroed(data.as_slice().len());
    let (src, dst) = (data.as_slice(), out.as_mut_slice());
    let mut index = vec![0usize; dims.len()];
    for element in dst.chunks_exact_mut(item) {
        let at: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>() * item;
        element.copy_from_slice(&src[at..at + item]);
        // Advance the row-major index: the last axis varies fastest.
        for axis in (0..dims.len()).rev() {
            index[axis] += 1;
            if index[axis] < dims[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    out
}

/// Visits every array of an `.npz` file by entry name (without `.npy`).
fn for_each_array(path: &Path, visit: impl FnMut(String, Array) -> Result<(), NpzError>) -> Result<(), NpzError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| NpzError::Io { path: shown.clone(), message: e.to_string() })?;
    for_each_array_in(file, &shown, visit)
}

/// Visits every array of an `.npz` image; `shown` names it in errors.
fn for_each_array_in<R: Read + Seek>(
    file: R,
    shown: &str,
    mut visit: impl FnMut(String, Array) -> Result<(), NpzError>,
) -> Result<(), NpzError> {
    let io = |message: String| NpzError::Io { path: shown.to_string(), message };
    let mut zip = zip::ZipArchive::new(file).map_err(|e| io(format!("not an .npz (zip) file: {e}")))?;
    for i in 0..zip.len() {
        let entry = zip.by_index(i).map_err(|e| io(e.to_string()))?;
        let key = entry.name().map_err(|e| io(e.to_string()))?.trim_end_matches(".npy").to_string();
        let array = read_array(entry).map_err(|message| NpzError::Array {
            path: shown.to_string(),
            key: key.clone(),
            message,
        })?;
        visit(key, array)?;
    }
    Ok(())
}

/// Reads the arguments of a call from an `.npz` file.
pub fn read_inputs(path: &Path) -> Result<Vec<Input>, NpzError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| NpzError::Io { path: shown.clone(), message: e.to_string() })?;
    read_inputs_from(file, &shown)
}

/// Reads the arguments of a call from an `.npz` image; `shown` names it in errors.
pub fn read_inputs_from<R: Read + Seek>(file: R, shown: &str) -> Result<Vec<Input>, NpzError> {
    let shown = shown.to_string();
    let mut found: BTreeMap<usize, (String, Input)> = BTreeMap::new();
    for_each_array_in(file, &shown, |key, array| {
        let bad = |message: String| NpzError::Array { path: shown.clone(), key: key.clone(), message };
        let Some((index, kind)) = parse_key(&key) else {
            return Err(bad("unexpected name (use argN, argN.shape or argN.prim)".into()));
        };
        let input = match kind {
            Kind::Tensor => Input::Tensor(HostTensor { dtype: array.dtype, shape: array.shape, data: array.data }),
            Kind::Shape => {
                if array.dtype != (DLDataType { code: 0, bits: 64, lanes: 1 }) || array.shape.len() != 1 {
                    return Err(bad("a shape must be a 1-D int64 array".into()));
                }
                let dims: Vec<i64> = array
                    .data
                    .as_slice()
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect();
                if let Some(d) = dims.iter().find(|&&d| d < 0) {
                    return Err(bad(format!("a shape cannot have a negative dimension ({d})")));
                }
                Input::Shape(dims)
            }
            Kind::Prim => {
                if !array.shape.is_empty() {
                    return Err(bad("a scalar must be a 0-d array".into()));
                }
                scalar(array.dtype, array.data.as_slice()).ok_or_else(|| bad("unsupported scalar dtype".into()))?
            }
        };
        if let Some((other, _)) = found.insert(index, (key.clone(), input)) {
            return Err(bad(format!("argument {index} is given twice (also as {other})")));
        }
        Ok(())
    })?;
    let mut inputs = Vec::new();
    for (expect, (index, (_, input))) in found.into_iter().enumerate() {
        if index != expect {
            return Err(NpzError::Layout {
                path: shown,
                message: format!("argument {expect} is missing (found argument {index})"),
            });
        }
        inputs.push(input);
    }
    Ok(inputs)
}

fn scalar(dtype: DLDataType, data: &[u8]) -> Option<Input> {
    let mut b = [0u8; 8];
    let n = dtype.bits as usize / 8;
    b[..n].copy_from_slice(data.get(..n)?);
    Some(match (dtype.code, dtype.bits) {
        (2, 64) => Input::Float(f64::from_le_bytes(b)),
        (2, 32) => Input::Float(f32::from_le_bytes(b[..4].try_into().ok()?) as f64),
        (2, _) => return None,
        (0, bits) => {
            let shift = 64 - bits as u32;
            Input::Int((i64::from_le_bytes(b) << shift) >> shift)
        }
        _ => Input::Int(i64::from_le_bytes(b)),
    })
}

fn type_str(dtype: DLDataType) -> Result<npyz::TypeStr, String> {
    let bytes = dtype.bits / 8;
    let s = match (dtype.code, dtype.bits, dtype.lanes) {
        (6, 8, 1) => "|b1".to_string(),
        (0, 8, 1) => "|i1".to_string(),
        (1, 8, 1) => "|u1".to_string(),
        (0, 16 | 32 | 64, 1) => format!("<i{bytes}"),
        (1, 16 | 32 | 64, 1) => format!("<u{bytes}"),
        (2, 16 | 32 | 64, 1) => format!("<f{bytes}"),
        _ => {
            return Err(format!(
                "dtype (code {}, bits {}, lanes {}) has no numpy equivalent",
                dtype.code, dtype.bits, dtype.lanes
            ));
        }
    };
    s.parse().map_err(|e| format!("{e}"))
}

/// One result as a numpy array: dtype descriptor (`<f4`, `|b1`, …), shape, element bytes.
pub fn output_array(out: &Output) -> Result<(String, Vec<u64>, Vec<u8>), String> {
    let (dtype, shape, data): (DLDataType, Vec<u64>, Vec<u8>) = match out {
        Output::Tensor { dtype, shape, data } => (*dtype, shape.iter().map(|&d| d as u64).collect(), data.clone()),
        Output::Shape(dims) => (
            DLDataType { code: 0, bits: 64, lanes: 1 },
            vec![dims.len() as u64],
            dims.iter().flat_map(|d| d.to_le_bytes()).collect(),
        ),
        Output::Int(v) => (DLDataType { code: 0, bits: 64, lanes: 1 }, vec![], v.to_le_bytes().to_vec()),
        Output::Bool(v) => (DLDataType { code: 6, bits: 8, lanes: 1 }, vec![], vec![*v as u8]),
        Output::Float(v) => (DLDataType { code: 2, bits: 64, lanes: 1 }, vec![], v.to_le_bytes().to_vec()),
        Output::Tuple(_) => return Err("nested tuple (flatten first)".into()),
        Output::Other(t) => return Err(format!("a value of type {t} cannot be stored in .npz")),
    };
    Ok((type_str(dtype)?.to_string(), shape, data))
}

/// Writes flattened results as `out0, out1, …` to an `.npz` file.
pub fn write_outputs(path: &Path, outputs: &[Output]) -> Result<(), NpzError> {
    let named: Vec<(String, &Output)> = outputs.iter().enumerate().map(|(i, o)| (format!("out{i}"), o)).collect();
    write_named(path, &named)
}

/// Writes arrays under the given names to an `.npz` file.
pub fn write_named(path: &Path, outputs: &[(String, &Output)]) -> Result<(), NpzError> {
    let shown = path.display().to_string();
    let io = |message: String| NpzError::Io { path: shown.clone(), message };
    let mut arrays = Vec::new();
    for (index, (name, out)) in outputs.iter().enumerate() {
        let err = |message: String| NpzError::Output { index, message };
        let (descr, shape, data) = output_array(out).map_err(err)?;
        let ts: npyz::TypeStr = descr.parse().map_err(|e| err(format!("{e}")))?;
        let mut npy = Vec::new();
        npyz::WriteOptions::new_header_only()
            .dtype(npyz::DType::Plain(ts))
            .shape(&shape)
            .writer(&mut npy)
            .write_header_only()
            .map_err(|e| err(e.to_string()))?;
        npy.extend_from_slice(&data);
        arrays.push((format!("{name}.npy"), npy));
    }
    // Built in memory, then written whole (crate::outfile): a failed write leaves no torn archive.
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in arrays {
        zip.start_file(name, options).map_err(|e| io(e.to_string()))?;
        zip.write_all(&bytes).map_err(|e| io(e.to_string()))?;
    }
    let archive = zip.finish().map_err(|e| io(e.to_string()))?.into_inner();
    crate::outfile::write_bytes(path, &archive, false)?;
    Ok(())
}

/// An array as stored: dtype descriptor, shape, element bytes.
pub type NpyArray = (String, Vec<u64>, Vec<u8>);

/// Reads every array of an `.npz` file by name (for comparing outputs), in the form
/// [`output_array`] gives: little-endian descriptor, C order.
pub fn read_arrays(path: &Path) -> Result<BTreeMap<String, NpyArray>, NpzError> {
    let shown = path.display().to_string();
    let mut out = BTreeMap::new();
    for_each_array(path, |key, array| {
        let descr = type_str(array.dtype)
            .map_err(|message| NpzError::Array { path: shown.clone(), key: key.clone(), message })?
            .to_string();
        let shape = array.shape.iter().map(|&d| d as u64).collect();
        out.insert(key, (descr, shape, array.data.as_slice().to_vec()));
        Ok(())
    })?;
    Ok(out)
}
