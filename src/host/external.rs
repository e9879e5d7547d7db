//! Weights outside the model (`--weights`): models exported with their weights as parameters
//! (TVM nn's `export_tvm` without binding, MLC's convention) get them at run time from TVM's
//! tensor cache (a directory with `tensor-cache.json` or `ndarray-cache.json` and its shards) or
//! from safetensors (one file, or a directory of shards).
//!
//! Every file is memory-mapped once and each tensor is passed to the model in place, as a
//! DLTensor over the mapping; only a tensor that is not 64-byte aligned in its file (the runtime
//! would otherwise copy it on every call) is copied, once, at load. A weight parameter is matched
//! by name: the function's parameter names are the weights' names. Everything read from the files
//! is checked before use, and an error names the tensor and the file.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};

use crate::abi::{Any, DLDataType, DLDevice, DLTensor};
use crate::host::AlignedBuf;

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {message}")]
    Index { path: String, message: String },
    #[error("weight {name} in {path}: {message}")]
    Tensor { name: String, path: String, message: String },
    #[error(
        "{path} is neither a tensor cache (a directory with tensor-cache.json or ndarray-cache.json) nor safetensors (a .safetensors file or a directory of them)"
    )]
    Unknown { path: String },
    #[error("{function} takes weight {name}, which {path} does not have")]
    Missing { function: String, name: String, path: String },
}

/// One weight: where its elements are and what they are.
struct Weight {
    dtype: DLDataType,
    shape: Vec<i64>,
    data: *const u8,
    file: PathBuf,
}

/// Loaded weights, by name. DLTensors handed out point into the mappings and copies held here.
pub struct Weights {
    path: PathBuf,
    weights: BTreeMap<String, Weight>,
    /// Kept alive for the pointers above.
    _maps: Vec<memmap2::Mmap>,
    _copies: Vec<AlignedBuf>,
    /// One DLTensor per weight, by name (stable addresses: never grown after load).
    tensors: BTreeMap<String, Box<DLTensor>>,
    /// How many weights were copied for alignment, and their bytes.
    pub copied: (usize, usize),
}

// SAFETY: the pointers are into mappings and buffers this value owns, which are only read.
unsafe impl Send for Weights {}
// SAFETY: as above.
unsafe impl Sync for Weights {}

fn io(path: &Path, source: std::io::Error) -> WeightsError {
    WeightsError::Io { path: path.display().to_string(), source }
}

/// A dtype by the names the tensor cache (numpy's) and safetensors use.
fn dtype_of(name: &str) -> Option<DLDataType> {
    let (code, bits) = match name {
        "float32" | "F32" => (2, 32),
        "float16" | "F16" => (2, 16),
        "float64" | "F64" => (2, 64),
        "bfloat16" | "BF16" => (4, 16),
        "int8" | "I8" => (0, 8),
        "int16" | "I16" => (0, 16),
        "int32" | "I32" => (0, 32),
        "int64" | "I64" => (0, 64),
        "uint8" | "U8" => (1, 8),
        "uint16" | "U16" => (1, 16),
        "uint32" | "U32" => (1, 32),
        "uint64" | "U64" => (1, 64),
        "bool" | "BOOL" => (6, 8),
        _ => return None,
    };
    Some(DLDataType { code, bits, lanes: 1 })
}

fn map(path: &Path) -> Result<memmap2::Mmap, WeightsError> {
    let file = std::fs::File::open(path).map_err(|e| io(path, e))?;
    // SAFETY: the file is only read; a file changed under a running model is the caller's to avoid.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io(path, e))
}

/// A tensor's bytes from its shape and dtype, checked.
fn byte_size(shape: &[i64], dtype: DLDataType) -> Option<usize> {
    shape.iter().try_fold(dtype.bits as usize / 8, |n, &d| usize::try_from(d).ok().and_then(|d| n.checked_mul(d)))
}

impl Weights {
    /// Loads a tensor cache directory, a `.safetensors` file or a directory of them.
    pub fn load(path: &Path) -> Result<Weights, WeightsError> {
        let mut w = Weights {
            path: path.to_path_buf(),
            weights: BTreeMap::new(),
            _maps: Vec::new(),
            _copies: Vec::new(),
            tensors: BTreeMap::new(),
            copied: (0, 0),
        };
        let meta = std::fs::metadata(path).map_err(|e| io(path, e))?;
        if meta.is_dir() {
            let index = ["tensor-cache.json", "ndarray-cache.json"].iter().map(|n| path.join(n)).find(|p| p.exists());
            if let Some(index) = index {
                w.load_tensor_cache(path, &index)?;
            } else {
                let mut shards: Vec<PathBuf> = std::fs::read_dir(path)
                    .map_err(|e| io(path, e))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                    .collect();
                shards.sort();
                if shards.is_empty() {
                    return Err(WeightsError::Unknown { path: path.display().to_string() });
                }
                for shard in shards {
                    w.load_safetensors(&shard)?;
                }
            }
        } else if path.extension().is_some_and(|x| x == "safetensors") {
            w.load_safetensors(path)?;
        } else {
            return Err(WeightsError::Unknown { path: path.display().to_string() });
        }
        w.make_tensors();
        Ok(w)
    }

    fn add(
        &mut self,
        name: String,
        dtype: DLDataType,
        shape: Vec<i64>,
        bytes: &[u8],
        file: &Path,
    ) -> Result<(), WeightsError> {
        if self.weights.contains_key(&name) {
            return Err(WeightsError::Tensor {
                name,
                path: file.display().to_string(),
                message: "appears twice".into(),
            });
        }
        let data = if (bytes.as_ptr() as usize).is_multiple_of(64) {
            bytes.as_ptr()
        } else {
            let copy = AlignedBuf::from_bytes(bytes);
            let p = copy.as_ptr() as *const u8;
            self.copied = (self.copied.0 + 1, self.copied.1 + bytes.len());
            self._copies.push(copy);
            p
        };
        self.weights.insert(name, Weight { dtype, shape, data, file: file.to_path_buf() });
        Ok(())
    }

    fn load_tensor_cache(&mut self, dir: &Path, index: &Path) -> Result<(), WeightsError> {
        let shown = index.display().to_string();
        let bad = |message: String| WeightsError::Index { path: shown.clone(), message };
        let text = std::fs::read_to_string(index).map_err(|e| io(index, e))?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let shards = json.get("records").and_then(|r| r.as_array()).ok_or_else(|| bad("no \"records\" list".into()))?;
        for (s, shard) in shards.iter().enumerate() {
            let file_name = shard
                .get("dataPath")
                .and_then(|p| p.as_str())
                .ok_or_else(|| bad(format!("shard {s} has no \"dataPath\"")))?;
            if file_name.contains('/') || file_name.contains("..") {
                return Err(bad(format!("shard {s}'s dataPath {file_name:?} leaves the cache's directory")));
            }
            let file = dir.join(file_name);
            let mapped = map(&file)?;
            let records = shard
                .get("records")
                .and_then(|r| r.as_array())
                .ok_or_else(|| bad(format!("shard {s} ({file_name}) has no \"records\" list")))?;
            for (k, r) in records.iter().enumerate() {
                let name = r
                    .get("name")
                    .and_then(|n| n.as_str())
                    .ok_or_else(|| bad(format!("record {k} of shard {s} has no name")))?
                    .to_string();
                let tensor_err = |message: String| WeightsError::Tensor {
                    name: name.clone(),
                    path: file.display().to_string(),
                    message,
                };
                let format = r.get("format").and_then(|f| f.as_str()).unwrap_or("raw");
                if format != "raw" {
                    return Err(tensor_err(format!("is stored as {format:?}; only \"raw\" tensors load")));
                }
                let dtype_name = r.get("dtype").and_then(|d| d.as_str()).unwrap_or("");
                let dtype = dtype_of(dtype_name).ok_or_else(|| tensor_err(format!("unknown dtype {dtype_name:?}")))?;
                let shape: Vec<i64> = r
                    .get("shape")
                    .and_then(|s| s.as_array())
                    .and_then(|s| s.iter().map(|d| d.as_i64()).collect())
                    .ok_or_else(|| tensor_err("has no list of integer dims as its shape".into()))?;
                let nbytes =
                    r.get("nbytes").and_then(|n| n.as_u64()).ok_or_else(|| tensor_err("has no nbytes".into()))?;
                let offset = r
                    .get("byteOffset")
                    .and_then(|n| n.as_u64())
                    .ok_or_else(|| tensor_err("has no byteOffset".into()))?;
                let need =
                    byte_size(&shape, dtype).ok_or_else(|| tensor_err(format!("shape {shape:?} is not a tensor's")))?;
                if need as u64 != nbytes {
                    return Err(tensor_err(format!(
                        "{nbytes} bytes for shape {shape:?} of {dtype_name}, which needs {need}"
                    )));
                }
                let end = offset.checked_add(nbytes).filter(|&e| e <= mapped.len() as u64).ok_or_else(|| {
                    tensor_err(format!(
                        "its bytes {offset}..{} lie past the end of the shard ({} bytes): the shard is truncated or the index is wrong",
                        offset.saturating_add(nbytes),
                        mapped.len()
                    ))
                })?;
                // Only the address is kept; the mapping moves into self below and its pages never move.
                self.add(name, dtype, shape, &mapped[offset as usize..end as usize], &file)?;
            }
            self._maps.push(mapped);
        }
        Ok(())
    }

    fn load_safetensors(&mut self, file: &Path) -> Result<(), WeightsError> {
        let mapped = map(file)?;
        let shown = file.display().to_string();
        let (header_len, meta) = safetensors::SafeTensors::read_metadata(&mapped).map_err(|e| WeightsError::Index {
            path: shown.clone(),
            message: format!("not a valid safetensors file: {e}"),
        })?;
        let data_start = 8 + header_len;
        for (name, info) in meta.tensors() {
            let tensor_err =
                |message: String| WeightsError::Tensor { name: name.clone(), path: shown.clone(), message };
            let dtype_name = format!("{:?}", info.dtype);
            let dtype = dtype_of(&dtype_name).ok_or_else(|| tensor_err(format!("unsupported dtype {dtype_name}")))?;
            let shape: Vec<i64> = info.shape.iter().map(|&d| d as i64).collect();
            let (begin, end) = info.data_offsets;
            let need =
                byte_size(&shape, dtype).ok_or_else(|| tensor_err(format!("shape {shape:?} is not a tensor's")))?;
            if end.checked_sub(begin) != Some(need) {
                return Err(tensor_err(format!(
                    "its data_offsets {begin}..{end} do not hold the {need} bytes of {shape:?}"
                )));
            }
            let (begin, end) = (data_start + begin, data_start + end);
            if end > mapped.len() || begin > end {
                return Err(tensor_err(format!(
                    "its bytes lie past the end of the file ({} bytes): truncated?",
                    mapped.len()
                )));
            }
            self.add(name.to_string(), dtype, shape, &mapped[begin..end], file)?;
        }
        self._maps.push(mapped);
        Ok(())
    }

    fn make_tensors(&mut self) {
        for (name, w) in &self.weights {
            let t = Box::new(DLTensor {
                data: w.data as *mut c_void,
                device: DLDevice { device_type: 1, device_id: 0 },
                ndim: w.shape.len() as i32,
                dtype: w.dtype,
                shape: w.shape.as_ptr() as *mut i64,
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            });
            self.tensors.insert(name.clone(), t);
        }
    }

    /// How many weights there are.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }

    /// The weight arguments of `function` whose parameter names are `params` (the names after
    /// the function's own inputs), as DLTensor values borrowed from self.
    pub fn arguments(&self, function: &str, params: &[String]) -> Result<Vec<Any>, WeightsError> {
        params
            .iter()
            .map(|name| {
                self.tensors.get(name).map(|t| Any::dltensor(&**t)).ok_or_else(|| WeightsError::Missing {
                    function: function.to_string(),
                    name: name.clone(),
                    path: self.path.display().to_string(),
                })
            })
            .collect()
    }

    /// A weight's shape.
    pub fn shape_of(&self, name: &str) -> Option<&[i64]> {
        self.weights.get(name).map(|w| w.shape.as_slice())
    }

    /// The file a weight came from.
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        self.weights.get(name).map(|w| w.file.as_path())
    }
}
