//! Weights from a `.safetensors` file, bound to tensor parameters by name at compile time.

use std::collections::HashMap;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use crate::vm::{DType, TensorConst};

/// Reads every tensor of a `.safetensors` file by name.
pub fn load_safetensors(path: &Path) -> Result<HashMap<String, TensorConst>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    safetensors_from_bytes(&bytes)
}

/// Reads every tensor of a `.safetensors` image by name. The safetensors crate checks that each
/// tensor's byte range matches its shape and lies inside the file; dimensions are checked here
/// to fit the runtime's int64.
pub fn safetensors_from_bytes(bytes: &[u8]) -> Result<HashMap<String, TensorConst>, String> {
    let file = SafeTensors::deserialize(bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
    let mut out = HashMap::new();
    for (name, view) in file.tensors() {
        let dtype = match view.dtype() {
            Dtype::BOOL => DType::BOOL,
            Dtype::U8 => DType::U8,
            Dtype::I8 => DType::new(0, 8, 1),
            Dtype::I16 => DType::new(0, 16, 1),
            Dtype::U16 => DType::new(1, 16, 1),
            Dtype::I32 => DType::new(0, 32, 1),
            Dtype::U32 => DType::new(1, 32, 1),
            Dtype::I64 => DType::I64,
            Dtype::U64 => DType::new(1, 64, 1),
            Dtype::F16 => DType::new(2, 16, 1),
            Dtype::BF16 => DType::new(4, 16, 1),
            Dtype::F32 => DType::F32,
            Dtype::F64 => DType::new(2, 64, 1),
            other => return Err(format!("{name}: dtype {other:?} is not supported")),
        };
        let shape = view
            .shape()
            .iter()
            .map(|&d| i64::try_from(d).map_err(|_| format!("{name}: dimension {d} is larger than an int64")))
            .collect::<Result<_, _>>()?;
        out.insert(name.to_string(), TensorConst { dtype, shape, data: view.data().to_vec().into() });
    }
    Ok(out)
}
