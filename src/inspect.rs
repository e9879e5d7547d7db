//! Reading the executable back out of an input (a TVM export) or a built model (its
//! `.rvm_exec`, `.rvm_modes` and `.rvm_cuda` sections), for `relaxc inspect`.

use std::path::Path;

use object::{Object, ObjectSection};

use crate::abi::{CONSTS_SECTION, EXEC_SECTION, MODES_SECTION};
use crate::tvm::{self, ImportError};
use crate::vm::format;
use crate::vm::{Executable, SharedBytes};

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error("{path}: {source}")]
    Asm { path: String, source: crate::vm::asm::AsmError },
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path} has no {EXEC_SECTION} section: not a model built by relaxc")]
    NotAModel { path: String },
    #[error("{path}: the embedded executable is corrupt: {source}")]
    Corrupt { path: String, source: format::FormatError },
}

/// A built model's file, memory-mapped (a model is as large as its weights: it is never read whole).
fn map_model(path: &Path) -> Result<std::sync::Arc<memmap2::Mmap>, InspectError> {
    let read_err = |message: String| InspectError::Read { path: path.display().to_string(), message };
    let file = std::fs::File::open(path).map_err(|e| read_err(e.to_string()))?;
    // SAFETY: the model is only read; a file changed while it is inspected is the caller's to avoid.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| read_err(e.to_string()))?;
    Ok(std::sync::Arc::new(map))
}

/// The bytes of section `name` of a built model; Ok(None) for a non-ELF file or a missing section.
fn model_section(path: &Path, name: &str) -> Result<Option<Vec<u8>>, InspectError> {
    let read_err = |message: String| InspectError::Read { path: path.display().to_string(), message };
    let bytes = map_model(path)?;
    if !bytes.starts_with(b"\x7fELF") {
        return Ok(None);
    }
    let file = object::File::parse(&**bytes).map_err(|e| read_err(e.to_string()))?;
    let Some(section) = file.section_by_name(name) else { return Ok(None) };
    Ok(Some(section.data().map_err(|e| read_err(e.to_string()))?.to_vec()))
}

/// What built a model, as its identity section says ("relaxc 0.1.0 c-api 2"), if it has one.
pub fn identity(path: &Path) -> Option<String> {
    let bytes = model_section(path, crate::abi::IDENTITY_SECTION).ok()??;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// How each Relax function of a built model runs: (name, compiled natively?).
pub fn function_modes(path: &Path) -> Result<Option<Vec<(String, bool)>>, InspectError> {
    Ok(model_section(path, MODES_SECTION)?.map(|data| {
        String::from_utf8_lossy(&data)
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(name, mode)| (name.to_string(), mode == "compiled"))
            .collect()
    }))
}

/// The CUDA kernels and images embedded in a built model, as listed at build time.
pub fn cuda_listing(path: &Path) -> Result<Option<String>, InspectError> {
    let section = crate::abi::CUDA_LISTING_SECTION;
    Ok(model_section(path, section)?.map(|data| String::from_utf8_lossy(&data).into_owned()))
}

/// The executable of a TVM export (.tar), a text form (.rvmasm) or a model built by relaxc (.so).
pub fn load_executable(path: &Path) -> Result<Executable, InspectError> {
    let shown = path.display().to_string();
    if path.extension().is_some_and(|e| e == "rvmasm") {
        let text = std::fs::read_to_string(path)
            .map_err(|e| InspectError::Read { path: shown.clone(), message: e.to_string() })?;
        return crate::vm::asm::assemble(&text).map_err(|source| InspectError::Asm { path: shown, source });
    }
    let mut magic = [0u8; 4];
    let is_elf = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .map(|()| &magic == b"\x7fELF")
        .unwrap_or(false);
    if !is_elf {
        return Ok(tvm::import_tar(path)?.exec);
    }
    let read_err = |message: String| InspectError::Read { path: shown.clone(), message };
    let bytes = map_model(path)?;
    let file = object::File::parse(&**bytes).map_err(|e| read_err(e.to_string()))?;
    let section = |name: &str| -> Result<Option<&[u8]>, InspectError> {
        match file.section_by_name(name) {
            Some(s) => Ok(Some(s.data().map_err(|e| read_err(e.to_string()))?)),
            None => Ok(None),
        }
    };
    let data = section(EXEC_SECTION)?.ok_or(InspectError::NotAModel { path: shown.clone() })?;
    let corrupt = |source| InspectError::Corrupt { path: shown.clone(), source };
    let Some(consts) = section(CONSTS_SECTION)? else {
        // A model from before tensor constants were stored once: they are in .rvm_exec.
        return format::read_executable(data).map_err(corrupt);
    };
    let words: Vec<u64> = consts.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))).collect();
    let Some((&base, offsets)) = words.split_first() else {
        return Err(read_err(format!("its {CONSTS_SECTION} section is empty")));
    };
    // The elements stay where they are in the mapped file: ranges of it, not copies.
    let shared: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> = bytes.clone();
    let mut elements = |index: usize, size: usize| -> Result<SharedBytes, String> {
        let offset = *offsets.get(index).filter(|o| **o != u64::MAX).ok_or("no place recorded for its elements")?;
        let address = base.checked_add(offset).ok_or("its address overflows")?;
        let at = file_offset_of(&file, address, size)
            .ok_or_else(|| format!("no section holds its {size} bytes at {address:#x}"))?;
        Ok(SharedBytes::slice_of(shared.clone(), at..at + size))
    };
    format::read_executable_elided(data, &mut elements).map_err(corrupt)
}

/// Where in the file the `size` bytes at virtual address `address` of a linked model are.
fn file_offset_of(file: &object::File, address: u64, size: usize) -> Option<usize> {
    let end = address.checked_add(size as u64)?;
    let section = file.sections().find(|s| s.address() <= address && end <= s.address() + s.size())?;
    let (offset, len) = section.file_range()?;
    let start = address - section.address();
    (start + size as u64 <= len).then(|| (offset + start) as usize)
}
