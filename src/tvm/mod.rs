//! Importing what TVM 0.27's `export_library("m.tar")` writes: `devc.o` (or `devc.c`) carries
//! the library blob with the `relax.VMExecutable`, `lib0.o` the LLVM-built kernels.

use std::io::Read;
use std::path::Path;

use object::{Object, ObjectSection, ObjectSymbol};

use crate::kernel_object::{KernelObject, KernelObjectError};
use crate::vm::format::{self, FormatError, Reader};
use crate::vm::{Executable, FuncKind};

const LIBRARY_BIN: &str = "__tvm_ffi__library_bin";

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path} is not a readable tar archive: {message}")]
    Tar { path: String, message: String },
    #[error("{path} has no {member} (expected what TVM's export_library writes: devc.o and lib0.o)")]
    MissingMember { path: String, member: String },
    #[error("{member}: not a usable object file: {message}")]
    Object { member: String, message: String },
    #[error(transparent)]
    KernelObject(#[from] KernelObjectError),
    #[error("{member} has no symbol {LIBRARY_BIN} (not a TVM library?)")]
    NoLibraryBlob { member: String },
    #[error("library blob in {member}: {source}")]
    Blob { member: String, source: FormatError },
    #[error("relax.VMExecutable in {member}: {source}")]
    Executable { member: String, source: FormatError },
    #[error(
        "this export was built with exec_mode=\"compiled\": it holds TVM's own native code for {functions} and no bytecode. \
         Export it with relax.build(..., exec_mode=\"bytecode\"); relaxc makes its own compiled mode (--exec-mode compiled)"
    )]
    CompiledModeExport { functions: String },
    #[error("the library holds a {kind} module, which relaxc cannot run (CPU-only export expected)")]
    UnsupportedModule { kind: String },
}

/// What a TVM export holds.
#[derive(Clone, Debug)]
pub struct TvmExport {
    pub exec: Executable,
    /// The VMExecutable bytes exactly as TVM wrote them.
    pub exec_bytes: Vec<u8>,
    pub kernels: Vec<KernelObject>,
}

/// Imports `export_library("x.tar")` output.
pub fn import_tar(path: &Path) -> Result<TvmExport, ImportError> {
    let shown = path.display().to_string();
    let raw = std::fs::read(path).map_err(|source| ImportError::Io { path: shown.clone(), source })?;
    if raw.is_empty() {
        return Err(ImportError::Tar { path: shown, message: "the file is empty".into() });
    }
    let tar_err = |e: std::io::Error| {
        let message = e.to_string();
        // The tar reader's words for an archive that ends inside a block.
        let message = if message.contains("failed to read entire block") {
            format!("the archive is truncated ({message})")
        } else {
            message
        };
        ImportError::Tar { path: shown.clone(), message }
    };
    // TVM writes the archive gzip-compressed; plain tar is accepted too. The whole stream is
    // inflated first so that a damaged or truncated gzip (bad checksum) is an error.
    let inflated;
    let data: &[u8] = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..]).read_to_end(&mut out).map_err(|e| ImportError::Tar {
            path: shown.clone(),
            message: format!("gzip stream is damaged or truncated: {e}"),
        })?;
        inflated = out;
        &inflated
    } else {
        &raw
    };
    let mut archive = tar::Archive::new(data);
    let (mut devc_o, mut devc_c, mut lib0_o, mut lib0_c) = (None, None, None, None);
    for entry in archive.entries().map_err(tar_err)? {
        let mut entry = entry.map_err(tar_err)?;
        let name = entry.path().map_err(tar_err)?.to_string_lossy().trim_start_matches("./").to_string();
        let slot = match name.as_str() {
            "devc.o" => &mut devc_o,
            "devc.c" => &mut devc_c,
            "lib0.o" => &mut lib0_o,
            "lib0.c" => &mut lib0_c,
            _ => continue,
        };
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(tar_err)?;
        *slot = Some(bytes);
    }
    let (member, blob) = match (devc_o, devc_c) {
        (Some(o), _) => ("devc.o", library_blob_from_object(&o)?),
        (None, Some(c)) => ("devc.c", library_blob_from_c(&c)?),
        (None, None) => {
            return Err(ImportError::MissingMember { path: shown, member: "devc.o".into() });
        }
    };
    let exec = executable_from_blob(member, &blob)?;
    let exec_bytes = executable_payload(member, &blob)?.to_vec();
    let mut kernels = Vec::new();
    if let Some(bytes) = lib0_o {
        kernels.push(KernelObject::parse("lib0.o", bytes)?.with_scalar_results());
    } else if let Some(src) = lib0_c {
        if !String::from_utf8_lossy(&src).trim().trim_matches(';').trim().is_empty() {
            return Err(ImportError::Object {
                member: "lib0.c".into(),
                message: "C-source kernel libraries are not supported; build with target=\"llvm\"".into(),
            });
        }
    } else {
        return Err(ImportError::MissingMember { path: shown, member: "lib0.o".into() });
    }
    let compiled: Vec<&str> =
        exec.funcs.iter().filter(|f| f.kind == FuncKind::Compiled).map(|f| f.name.as_str()).collect();
    let has_vmtir = kernels.iter().any(|k| k.kernels.iter().any(|s| s.starts_with("__vmtir__")));
    if !compiled.is_empty() || has_vmtir {
        let functions = if compiled.is_empty() { "its functions".to_string() } else { compiled.join(", ") };
        return Err(ImportError::CompiledModeExport { functions });
    }
    Ok(TvmExport { exec, exec_bytes, kernels })
}

fn library_blob_from_object(bytes: &[u8]) -> Result<Vec<u8>, ImportError> {
    let err = |message: String| ImportError::Object { member: "devc.o".into(), message };
    let file = object::File::parse(bytes).map_err(|e| err(e.to_string()))?;
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(LIBRARY_BIN))
        .ok_or(ImportError::NoLibraryBlob { member: "devc.o".into() })?;
    let section = sym
        .section_index()
        .and_then(|i| file.section_by_index(i).ok())
        .ok_or_else(|| err(format!("{LIBRARY_BIN} is not defined in a section")))?;
    let data = section.data().map_err(|e| err(e.to_string()))?;
    let start = usize::try_from(sym.address().saturating_sub(section.address())).unwrap_or(usize::MAX);
    let end = start.checked_add(sym.size() as usize).filter(|&e| e <= data.len());
    match end {
        Some(end) => Ok(data[start..end].to_vec()),
        None => Err(err(format!("{LIBRARY_BIN} lies outside its section"))),
    }
}

/// `devc.c` as TVM writes it: `... __tvm_ffi__library_bin[N] = {0x.., 0x.., ...};`
fn library_blob_from_c(bytes: &[u8]) -> Result<Vec<u8>, ImportError> {
    let err = |message: &str| ImportError::Object { member: "devc.c".into(), message: message.to_string() };
    let text = String::from_utf8_lossy(bytes);
    let at = text.find(LIBRARY_BIN).ok_or(ImportError::NoLibraryBlob { member: "devc.c".into() })?;
    let open = text[at..].find('{').ok_or_else(|| err("no array initializer"))? + at;
    let close = text[open..].find('}').ok_or_else(|| err("unterminated array initializer"))? + open;
    text[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            let (digits, radix) = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(h) => (h, 16),
                None => (t, 10),
            };
            u8::from_str_radix(digits, radix).map_err(|_| err(&format!("bad byte {t:?} in the array")))
        })
        .collect()
}

/// Parses the library blob and returns its `relax.VMExecutable`.
pub fn executable_from_blob(member: &str, blob: &[u8]) -> Result<Executable, ImportError> {
    let payload = executable_payload(member, blob)?;
    format::read_executable(payload).map_err(|source| ImportError::Executable { member: member.to_string(), source })
}

/// The raw `relax.VMExecutable` payload inside a library blob.
pub fn executable_payload<'a>(member: &str, blob: &'a [u8]) -> Result<&'a [u8], ImportError> {
    let blob_err = |source: FormatError| ImportError::Blob { member: member.to_string(), source };
    let mut r = Reader::new(blob);
    let nbytes = r.u64("blob length").map_err(blob_err)?;
    if nbytes != r.remaining() as u64 {
        return Err(blob_err(r.error("blob length", format!("says {nbytes} bytes but {} follow", r.remaining()))));
    }
    let indptr = r.vec_i64("import tree row pointers").map_err(blob_err)?;
    r.vec_i64("import tree children").map_err(blob_err)?;
    let num_modules = indptr.len().saturating_sub(1);
    let mut exec = None;
    for i in 0..num_modules {
        let kind = r.string(&format!("module {i} kind")).map_err(blob_err)?;
        if kind == "_lib" {
            continue;
        }
        let n = r.count(1, &format!("module {i} ({kind}) payload")).map_err(blob_err)?;
        let payload = r.bytes(n, &format!("module {i} ({kind}) payload")).map_err(blob_err)?;
        match kind.as_str() {
            "relax.VMExecutable" if exec.is_none() => exec = Some(payload),
            // Constants bound through relax.build(params=...): the default pipeline's bytecode does not use them.
            "const_loader" => {}
            _ => return Err(ImportError::UnsupportedModule { kind }),
        }
    }
    exec.ok_or_else(|| blob_err(r.error("library blob", "no relax.VMExecutable module")))
}

/// Wraps an executable into a library blob as TVM's export does (module 0 the executable,
/// importing module 1, the `_lib` placeholder).
pub fn write_library_blob(exec_bytes: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    let put_u64 = |out: &mut Vec<u8>, v: u64| out.extend(v.to_le_bytes());
    put_u64(&mut body, 3);
    for v in [0u64, 1, 1] {
        put_u64(&mut body, v);
    }
    put_u64(&mut body, 1);
    put_u64(&mut body, 1);
    for (kind, payload) in [("relax.VMExecutable", Some(exec_bytes)), ("_lib", None)] {
        put_u64(&mut body, kind.len() as u64);
        body.extend(kind.as_bytes());
        if let Some(p) = payload {
            put_u64(&mut body, p.len() as u64);
            body.extend(p);
        }
    }
    let mut blob = (body.len() as u64).to_le_bytes().to_vec();
    blob.extend(body);
    blob
}
