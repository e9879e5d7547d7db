//! Inputs and outputs of `relaxc run` as numpy `.npz` files: `argN` (or numpy's positional
//! `arr_N`) is argument N as a tensor, `argN.shape` an int64 1-D array passed as a shape tuple,
//! `argN.prim` a 0-d array passed as a scalar. Results are written as `out0, out1, …`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use npyz::{TypeChar, WriterBuilder};

use super::{HostTensor, Input, Output};
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
    if bytes > 1 && t.endianness() == npyz::Endianness::Big {
        return Err(format!("big-endian dtype {t} is not supported"));
    }
    Ok(DLDataType { code, bits: bytes * 8, lanes: 1 })
}

/// Reads the arguments of a call from an `.npz` file.
pub fn read_inputs(path: &Path) -> Result<Vec<Input>, NpzError> {
    let shown = path.display().to_string();
    let io = |message: String| NpzError::Io { path: shown.clone(), message };
    let file = std::fs::File::open(path).map_err(|e| io(e.to_string()))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| io(format!("not an .npz (zip) file: {e}")))?;
    let mut found: BTreeMap<usize, (String, Input)> = BTreeMap::new();
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| io(e.to_string()))?;
        let key = entry.name().map_err(|e| io(e.to_string()))?.trim_end_matches(".npy").to_string();
        let bad = |message: String| NpzError::Array { path: shown.clone(), key: key.clone(), message };
        let Some((index, kind)) = parse_key(&key) else {
            return Err(bad("unexpected name (use argN, argN.shape or argN.prim)".into()));
        };
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(|e| bad(e.to_string()))?;
        let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| bad(format!("not a .npy array: {e}")))?;
        let npyz::DType::Plain(ts) = npy.dtype() else {
            return Err(bad("structured arrays are not supported".into()));
        };
        let dtype = dl_dtype(&ts).map_err(bad)?;
        let shape: Vec<i64> = npy.shape().iter().map(|&d| d as i64).collect();
        if npy.order() == npyz::Order::Fortran && shape.iter().filter(|&&d| d > 1).count() > 1 {
            return Err(bad("Fortran-order array; save it C-contiguous".into()));
        }
        let elems: i64 = shape.iter().product();
        let nbytes = elems as usize * (dtype.bits as usize / 8);
        let mut data = Vec::with_capacity(nbytes);
        npy.into_inner().read_to_end(&mut data).map_err(|e| bad(e.to_string()))?;
        if data.len() < nbytes {
            return Err(bad(format!("holds {} data bytes, its shape needs {nbytes}", data.len())));
        }
        data.truncate(nbytes);
        let input = match kind {
            Kind::Tensor => Input::Tensor(HostTensor::new(dtype, shape, &data)),
            Kind::Shape => {
                if dtype != (DLDataType { code: 0, bits: 64, lanes: 1 }) || shape.len() != 1 {
                    return Err(bad("a shape must be a 1-D int64 array".into()));
                }
                Input::Shape(data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
            }
            Kind::Prim => {
                if !shape.is_empty() {
                    return Err(bad("a scalar must be a 0-d array".into()));
                }
                scalar(dtype, &data).ok_or_else(|| bad("unsupported scalar dtype".into()))?
            }
        };
        if let Some((other, _)) = found.insert(index, (key.clone(), input)) {
            return Err(bad(format!("argument {index} is given twice (also as {other})")));
        }
    }
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
    let file = std::fs::File::create(path).map_err(|e| io(e.to_string()))?;
    let mut zip = zip::ZipWriter::new(file);
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in arrays {
        zip.start_file(name, options).map_err(|e| io(e.to_string()))?;
        zip.write_all(&bytes).map_err(|e| io(e.to_string()))?;
    }
    zip.finish().map_err(|e| io(e.to_string()))?;
    Ok(())
}

/// An array as stored: dtype descriptor, shape, element bytes.
pub type NpyArray = (String, Vec<u64>, Vec<u8>);

/// Reads every array of an `.npz` file by name (for comparing outputs).
pub fn read_arrays(path: &Path) -> Result<BTreeMap<String, NpyArray>, NpzError> {
    let shown = path.display().to_string();
    let io = |message: String| NpzError::Io { path: shown.clone(), message };
    let file = std::fs::File::open(path).map_err(|e| io(e.to_string()))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| io(e.to_string()))?;
    let mut out = BTreeMap::new();
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| io(e.to_string()))?;
        let key = entry.name().map_err(|e| io(e.to_string()))?.trim_end_matches(".npy").to_string();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(|e| io(e.to_string()))?;
        let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| io(format!("{key}: {e}")))?;
        let dtype = match npy.dtype() {
            npyz::DType::Plain(ts) => ts.to_string(),
            other => other.descr(),
        };
        let shape = npy.shape().to_vec();
        let mut data = Vec::new();
        npy.into_inner().read_to_end(&mut data).map_err(|e| io(e.to_string()))?;
        out.insert(key, (dtype, shape, data));
    }
    Ok(out)
}
