//! Files relaxc writes (models, npz results, CLIF, traces, logits) appear whole or not at all.
//!
//! Each is written to a temporary file beside its destination and renamed over it once complete
//! and flushed to disk: a full disk, a failed write or a process killed at any moment leaves the
//! old file (or none), never a half-written one that a later `dlopen` would crash on. A
//! destination that is not a regular file (`/dev/full`, `/dev/stdout`, a pipe) cannot be
//! renamed over, so it is written directly, and a failed write names it.

use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot write {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("cannot write {path}: it is a directory")]
    Directory { path: String },
}

fn io_error(path: &Path, source: std::io::Error) -> OutputError {
    OutputError::Io { path: path.display().to_string(), source }
}

/// What a destination is: a file to replace, or something to write into as it is.
enum Destination {
    /// A regular file (or none yet) at this path, symbolic links resolved.
    Replace(PathBuf),
    Direct,
}

fn destination(path: &Path) -> Result<Destination, OutputError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(OutputError::Directory { path: path.display().to_string() }),
        Ok(meta) if !meta.is_file() => Ok(Destination::Direct),
        // A link to a file: replace the file it names, keeping the link.
        Ok(_) => Ok(Destination::Replace(std::fs::canonicalize(path).map_err(|e| io_error(path, e))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Destination::Replace(path.to_path_buf())),
        Err(e) => Err(io_error(path, e)),
    }
}

/// The permission bits a new file gets from `open(..., 0666 or 0777)`: the process's umask read
/// from /proc (setting it to read it would race with other threads creating files).
fn fresh_mode(executable: bool) -> u32 {
    let umask = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Umask:").map(|v| v.trim().to_string())))
        .and_then(|v| u32::from_str_radix(&v, 8).ok())
        .unwrap_or(0o022);
    (if executable { 0o777 } else { 0o666 }) & !umask
}

/// Writes `path` through `write`, which gets a path to fill (a temporary file beside `path`, or
/// `path` itself when that is a device or a pipe) and may replace that file (a linker does).
/// `executable`: the new file's mode is that of a program (a `.so`, an emitted server), unless it
/// replaces a file whose mode it keeps.
/// The writer's own errors pass through; its error type takes this module's too.
pub fn write_with<E: From<OutputError>>(
    path: &Path,
    executable: bool,
    write: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), E> {
    let target = match destination(path)? {
        Destination::Direct => return write(path),
        Destination::Replace(target) => target,
    };
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // Hidden, and not ending in the destination's extension: nothing mistakes it for the result.
    let temp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".relaxc-partial")
        .tempfile_in(&dir)
        .map_err(|e| io_error(path, e))?;
    let mode = std::fs::metadata(&target).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()));
    let temp_path = temp.into_temp_path();
    write(&temp_path)?;
    let file = std::fs::OpenOptions::new().write(true).open(&temp_path).map_err(|e| io_error(path, e))?;
    let mode = mode.unwrap_or_else(|_| fresh_mode(executable)) & 0o7777;
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(|e| io_error(path, e))?;
    file.sync_all().map_err(|e| io_error(path, e))?;
    temp_path.persist(&target).map_err(|e| io_error(path, e.error))?;
    // The rename itself is durable once the directory is.
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Writes `bytes` to `path` whole or not at all (see the module's comment).
pub fn write_bytes(path: &Path, bytes: &[u8], executable: bool) -> Result<(), OutputError> {
    write_with(path, executable, |p| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .create(true)
            .open(p)
            .map_err(|e| io_error(path, e))?;
        f.write_all(bytes).and_then(|_| f.flush()).map_err(|e| io_error(path, e))
    })
}
