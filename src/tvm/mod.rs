//! Importing what TVM 0.27's `export_library("m.tar")` writes: `devc.o` (or `devc.c`) carries
//! the library blob with the `relax.VMExecutable`, `lib0.o` the LLVM-built kernels.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSymbol};

use crate::kernel_object::{KernelObject, KernelObjectError};
use crate::vm::format::{self, FormatError, Reader};
use crate::vm::{Executable, FuncKind, SharedBytes};

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
    /// The VMExecutable bytes exactly as TVM wrote them (tensor constants' elements are ranges of
    /// these).
    pub exec_bytes: SharedBytes,
    pub kernels: Vec<KernelObject>,
}

/// A member's bytes: read into memory, or (devc.o, which holds the weights) spooled to an
/// unnamed temporary file and memory-mapped, so that the weights are in memory once, as pages of
/// that file, from here to the object file relaxc writes.
type Member = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Imports `export_library("x.tar")` output.
pub fn import_tar(path: &Path) -> Result<TvmExport, ImportError> {
    let shown = path.display().to_string();
    let io_err = |source: std::io::Error| ImportError::Io { path: shown.clone(), source };
    let file = std::fs::File::open(path).map_err(io_err)?;
    if file.metadata().map_err(io_err)?.len() == 0 {
        return Err(ImportError::Tar { path: shown, message: "the file is empty".into() });
    }
    let mut input = std::io::BufReader::new(file);
    let gzip = std::io::BufRead::fill_buf(&mut input).map_err(io_err)?.starts_with(&[0x1f, 0x8b]);
    // TVM writes the archive gzip-compressed; plain tar is accepted too. The stream is read once:
    // the members relaxc needs are taken as they pass, and the rest of a gzip stream is read to
    // its end so that a damaged or truncated one (bad checksum) is an error.
    let stream: Box<dyn Read> = if gzip { Box::new(flate2::read::GzDecoder::new(input)) } else { Box::new(input) };
    let tar_err = |e: std::io::Error| {
        let message = e.to_string();
        if gzip && (e.kind() == std::io::ErrorKind::InvalidData || e.kind() == std::io::ErrorKind::InvalidInput) {
            return ImportError::Tar {
                path: shown.clone(),
                message: format!("gzip stream is damaged or truncated: {message}"),
            };
        }
        // The tar reader's words for an archive that ends inside a block.
        let message =
            if message.contains("failed to read entire block") || e.kind() == std::io::ErrorKind::UnexpectedEof {
                format!("the archive is truncated ({message})")
            } else {
                message
            };
        ImportError::Tar { path: shown.clone(), message }
    };
    let mut archive = tar::Archive::new(stream);
    let (mut devc_o, mut devc_c, mut lib0_o, mut lib0_c): (Option<Member>, _, _, _) = (None, None, None, None);
    for entry in archive.entries().map_err(tar_err)? {
        let mut entry = entry.map_err(tar_err)?;
        let name = entry.path().map_err(tar_err)?.to_string_lossy().trim_start_matches("./").to_string();
        match name.as_str() {
            "devc.o" => devc_o = Some(spool(&mut entry).map_err(tar_err)?),
            "devc.c" | "lib0.o" | "lib0.c" => {
                let mut bytes = Vec::new();
                entry.read_to_end(&mut bytes).map_err(tar_err)?;
                let slot = match name.as_str() {
                    "devc.c" => &mut devc_c,
                    "lib0.o" => &mut lib0_o,
                    _ => &mut lib0_c,
                };
                *slot = Some(bytes);
            }
            _ => continue,
        }
    }
    std::io::copy(&mut archive.into_inner(), &mut std::io::sink()).map_err(tar_err)?;
    let (member, blob): (&str, Member) = match (devc_o, devc_c) {
        (Some(o), _) => {
            let range = library_blob_from_object((*o).as_ref())?;
            ("devc.o", Arc::new(SharedBytes::slice_of(o, range)))
        }
        (None, Some(c)) => ("devc.c", Arc::new(library_blob_from_c(&c)?)),
        (None, None) => {
            return Err(ImportError::MissingMember { path: shown, member: "devc.o".into() });
        }
    };
    let payload = executable_range(member, (*blob).as_ref())?;
    let exec = format::read_executable_shared(&blob, payload.clone())
        .map_err(|source| ImportError::Executable { member: member.to_string(), source })?;
    let exec_bytes = SharedBytes::slice_of(blob, payload);
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

/// Copies a member into an unnamed temporary file and maps it.
fn spool(entry: &mut impl Read) -> std::io::Result<Member> {
    let mut file = tempfile::tempfile()?;
    std::io::copy(entry, &mut file)?;
    // SAFETY: the file is unnamed and private to this process: nothing else can change it.
    let map = unsafe { memmap2::Mmap::map(&file) }?;
    Ok(Arc::new(map))
}

/// Where the library blob lies in devc.o's bytes.
fn library_blob_from_object(bytes: &[u8]) -> Result<std::ops::Range<usize>, ImportError> {
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
    let (file_offset, _) =
        section.file_range().ok_or_else(|| err(format!("{LIBRARY_BIN}'s section has no bytes in the file")))?;
    let start = usize::try_from(sym.address().saturating_sub(section.address())).unwrap_or(usize::MAX);
    let end = start.checked_add(sym.size() as usize).filter(|&e| e <= data.len());
    match end {
        Some(end) => Ok(file_offset as usize + start..file_offset as usize + end),
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

/// Where the `relax.VMExecutable` payload lies in a library blob.
fn executable_range(member: &str, blob: &[u8]) -> Result<std::ops::Range<usize>, ImportError> {
    let payload = executable_payload(member, blob)?;
    let start = payload.as_ptr() as usize - blob.as_ptr() as usize;
    Ok(start..start + payload.len())
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
