//! Weights from a `.safetensors` file, bound to tensor parameters by name at compile time.

use std::collections::HashMap;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use crate::vm::{DType, TensorConst};

pub fn load_safetensors(path: &Path) -> Result<HashMap<String, TensorConst>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
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
        let shape = view.shape().iter().map(|&d| d as i64).collect();
        out.insert(name.to_string(), TensorConst { dtype, shape, data: view.data().to_vec() });
    }
    Ok(out)
}
