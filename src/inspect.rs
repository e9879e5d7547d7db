//! Reading the executable back out of an input (a TVM export) or a built model (its
//! `.rvm_exec` section), for `relaxc inspect`.

use std::path::Path;

use object::{Object, ObjectSection};

use crate::codegen::tables::layout::{EXEC_SECTION, MODES_SECTION};
use crate::tvm::{self, ImportError, executable};
use crate::vm::Executable;

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path} has no {EXEC_SECTION} section: not a model built by relaxc")]
    NotAModel { path: String },
    #[error("{path}: the embedded executable is corrupt: {source}")]
    Corrupt { path: String, source: executable::FormatError },
}

/// How each Relax function of a built model runs: (name, compiled natively?).
pub fn function_modes(path: &Path) -> Result<Option<Vec<(String, bool)>>, InspectError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| InspectError::Read { path: shown.clone(), message: e.to_string() })?;
    if !bytes.starts_with(b"\x7fELF") {
        return Ok(None);
    }
    let file =
        object::File::parse(&*bytes).map_err(|e| InspectError::Read { path: shown.clone(), message: e.to_string() })?;
    let Some(section) = file.section_by_name(MODES_SECTION) else {
        return Ok(None);
    };
    let data = section.data().map_err(|e| InspectError::Read { path: shown, message: e.to_string() })?;
    Ok(Some(
        String::from_utf8_lossy(data)
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(name, mode)| (name.to_string(), mode == "compiled"))
            .collect(),
    ))
}

/// The CUDA kernels and images embedded in a built model, as listed at build time.
pub fn cuda_listing(path: &Path) -> Result<Option<String>, InspectError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| InspectError::Read { path: shown.clone(), message: e.to_string() })?;
    if !bytes.starts_with(b"\x7fELF") {
        return Ok(None);
    }
    let file =
        object::File::parse(&*bytes).map_err(|e| InspectError::Read { path: shown.clone(), message: e.to_string() })?;
    let Some(section) = file.section_by_name(crate::codegen::cuda_tables::layout::LISTING_SECTION) else {
        return Ok(None);
    };
    let data = section.data().map_err(|e| InspectError::Read { path: shown, message: e.to_string() })?;
    Ok(Some(String::from_utf8_lossy(data).into_owned()))
}

pub fn load_executable(path: &Path) -> Result<Executable, InspectError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| InspectError::Read { path: shown.clone(), message: e.to_string() })?;
    if !bytes.starts_with(b"\x7fELF") {
        return Ok(tvm::import_tar(path)?.exec);
    }
    let file =
        object::File::parse(&*bytes).map_err(|e| InspectError::Read { path: shown.clone(), message: e.to_string() })?;
    let section = file.section_by_name(EXEC_SECTION).ok_or(InspectError::NotAModel { path: shown.clone() })?;
    let data = section.data().map_err(|e| InspectError::Read { path: shown.clone(), message: e.to_string() })?;
    executable::read_executable(data).map_err(|source| InspectError::Corrupt { path: shown, source })
}
