//! Weights outside the model (`--weights`), through the model's own loader (rvm.h's
//! `weights_open`, runtime-shim/src/weights.c): models exported with their weights as parameters
//! (TVM nn's `export_tvm` without binding, MLC's convention) get them at run time from TVM's
//! tensor cache or from safetensors, memory-mapped and passed in place, each weight parameter
//! matched by name. The CLI, C hosts and Python use one loader, so they accept and refuse the same
//! files with the same messages.

use std::ffi::{CString, c_void};
use std::path::Path;

use super::{HostError, Model};
use crate::abi::{Any, DLTensor};

/// Loaded weights; the values `arguments` gives borrow from them.
pub struct Weights<'m> {
    model: &'m Model,
    handle: *mut c_void,
}

impl<'m> Weights<'m> {
    /// Loads a tensor cache directory, a `.safetensors` file or a directory of them.
    pub fn load(model: &'m Model, path: &Path) -> Result<Weights<'m>, HostError> {
        let api = model.api_v3()?;
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| HostError::Value(format!("{} contains a NUL byte", path.display())))?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: a valid module, a NUL-terminated path and an out-pointer.
        if unsafe { (api.weights_open)(model.module, c_path.as_ptr(), &mut handle) } != 0 {
            return Err(model.error());
        }
        Ok(Weights { model, handle })
    }

    /// The weight arguments of function `f` (an index from `Model::find`): its parameters after
    /// the first `num_inputs`, as DLTensor values borrowed from self.
    pub fn arguments(&self, f: i32, num_inputs: usize) -> Result<Vec<Any>, HostError> {
        let api = self.model.api_v3()?;
        let mut count = 0i32;
        // SAFETY: valid weights; a zero-capacity call only reports the count (and fails).
        unsafe { (api.weights_arguments)(self.handle, f, num_inputs as i32, std::ptr::null_mut(), 0, &mut count) };
        let mut args = vec![Any::default(); count.max(0) as usize];
        // SAFETY: args holds count values.
        if unsafe { (api.weights_arguments)(self.handle, f, num_inputs as i32, args.as_mut_ptr(), count, &mut count) }
            != 0
        {
            return Err(self.model.error());
        }
        Ok(args)
    }
}

impl Drop for Weights<'_> {
    fn drop(&mut self) {
        if let Ok(api) = self.model.api_v3() {
            // SAFETY: closing what load opened; no value from `arguments` outlives self.
            unsafe { (api.weights_close)(self.handle) }
        }
    }
}

/// The shape of a DLTensor value that `arguments` gave.
pub fn shape_of(value: &Any) -> Option<Vec<i64>> {
    if value.type_index != crate::abi::TYPE_DLTENSOR_PTR {
        return None;
    }
    // SAFETY: a DLTensor value from `Weights::arguments`, alive with its Weights.
    let t = unsafe { &*(value.payload as *const DLTensor) };
    // SAFETY: shape holds ndim dims.
    Some(unsafe { std::slice::from_raw_parts(t.shape, t.ndim.max(0) as usize) }.to_vec())
}
