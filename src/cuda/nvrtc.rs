//! NVRTC, loaded with dlopen at build time only: a model build needs no CUDA toolkit, and a
//! relaxc binary does not depend on CUDA. Search order (the first that loads wins):
//!
//! 1. `$RELAXC_NVRTC`: a path to libnvrtc;
//! 2. `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64`, `/usr/local/cuda/lib64` (a CUDA toolkit);
//! 3. the `nvidia-cuda-nvrtc-cu12` wheel of `python3` (`nvidia/cuda_nvrtc/lib`);
//! 4. `libnvrtc.so.12` and `libnvrtc.so` on the system library path.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    #[error(
        "NVRTC not found; looked for:\n  {}\ninstall the NVRTC wheel (pip install nvidia-cuda-nvrtc-cu12), a CUDA toolkit, or set RELAXC_NVRTC",
        .tried.join("\n  ")
    )]
    NotFound { tried: Vec<String> },
    #[error("{path} is not a usable NVRTC: {message}")]
    Unusable { path: String, message: String },
    #[error("{source_name}: NVRTC failed for {target}: {message}\n{log}")]
    Compile { source_name: String, target: String, message: String, log: String },
}

type Program = *mut c_void;
type CreateProgram = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileProgram = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type GetSize = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type GetBytes = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type DestroyProgram = unsafe extern "C" fn(*mut Program) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

pub struct Nvrtc {
    pub path: String,
    lib: libloading::Library,
}

/// Where NVRTC may be, in search order.
pub fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("RELAXC_NVRTC") {
        out.push(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            out.push(PathBuf::from(&home).join("lib64/libnvrtc.so"));
        }
    }
    out.push(PathBuf::from("/usr/local/cuda/lib64/libnvrtc.so"));
    let python = Command::new("python3")
        .args(["-c", "import nvidia.cuda_nvrtc as m; print(m.__path__[0])"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(dir) = python {
        out.push(PathBuf::from(dir).join("lib/libnvrtc.so.12"));
    }
    out.push(PathBuf::from("libnvrtc.so.12"));
    out.push(PathBuf::from("libnvrtc.so"));
    out
}

impl Nvrtc {
    pub fn load() -> Result<Nvrtc, NvrtcError> {
        let mut tried = Vec::new();
        for path in candidates() {
            let shown = path.display().to_string();
            let is_bare = path.components().count() == 1;
            if !is_bare && !path.exists() {
                tried.push(format!("{shown} (absent)"));
                continue;
            }
            // SAFETY: loading NVRTC runs its initialisers, which only set up its own state.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => {
                    let nvrtc = Nvrtc { path: shown.clone(), lib };
                    nvrtc.version().map_err(|message| NvrtcError::Unusable { path: shown, message })?;
                    return Ok(nvrtc);
                }
                Err(e) => tried.push(format!("{shown} ({e})")),
            }
        }
        Err(NvrtcError::NotFound { tried })
    }

    fn sym<T: Copy>(&self, name: &[u8]) -> Result<T, String> {
        // SAFETY: the caller names a symbol of the documented NVRTC C API with its type.
        unsafe { self.lib.get::<T>(name).map(|s| *s).map_err(|e| e.to_string()) }
    }

    pub fn version(&self) -> Result<(i32, i32), String> {
        let f: Version = self.sym(b"nvrtcVersion\0")?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers.
        let rc = unsafe { f(&mut major, &mut minor) };
        if rc != 0 {
            return Err(format!("nvrtcVersion returned {rc}"));
        }
        Ok((major, minor))
    }

    /// Compiles CUDA source for one target: `sm_XX` gives a CUBIN, `compute_XX` PTX.
    pub fn compile(&self, source_name: &str, source: &str, target: &str) -> Result<Vec<u8>, NvrtcError> {
        let fail = |message: String, log: String| NvrtcError::Compile {
            source_name: source_name.to_string(),
            target: target.to_string(),
            message,
            log,
        };
        let api = || -> Result<_, String> {
            Ok((
                self.sym::<CreateProgram>(b"nvrtcCreateProgram\0")?,
                self.sym::<CompileProgram>(b"nvrtcCompileProgram\0")?,
                self.sym::<GetSize>(b"nvrtcGetProgramLogSize\0")?,
                self.sym::<GetBytes>(b"nvrtcGetProgramLog\0")?,
                self.sym::<DestroyProgram>(b"nvrtcDestroyProgram\0")?,
                self.sym::<ErrorString>(b"nvrtcGetErrorString\0")?,
            ))
        };
        let (create, compile, log_size, get_log, destroy, error_string) = api().map_err(|m| fail(m, String::new()))?;
        let is_ptx = target.starts_with("compute_");
        let (size_fn, get_fn): (GetSize, GetBytes) = if is_ptx {
            (
                self.sym(b"nvrtcGetPTXSize\0").map_err(|m| fail(m, String::new()))?,
                self.sym(b"nvrtcGetPTX\0").map_err(|m| fail(m, String::new()))?,
            )
        } else {
            (
                self.sym(b"nvrtcGetCUBINSize\0").map_err(|m| fail(m, String::new()))?,
                self.sym(b"nvrtcGetCUBIN\0").map_err(|m| fail(m, String::new()))?,
            )
        };
        let src = CString::new(source).map_err(|_| fail("the source contains a NUL byte".into(), String::new()))?;
        let name = CString::new(source_name).unwrap_or_default();
        let options = [format!("--gpu-architecture={target}"), "--std=c++17".to_string()];
        let options: Vec<CString> = options.iter().map(|o| CString::new(o.as_str()).unwrap_or_default()).collect();
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let describe = |rc: c_int| {
            // SAFETY: nvrtcGetErrorString returns a static string for any code.
            unsafe { CStr::from_ptr(error_string(rc)) }.to_string_lossy().into_owned()
        };
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: NVRTC API calls with valid pointers; the program is destroyed below.
        unsafe {
            let rc = create(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null());
            if rc != 0 {
                return Err(fail(describe(rc), String::new()));
            }
            let rc = compile(prog, option_ptrs.len() as c_int, option_ptrs.as_ptr());
            let mut n = 0usize;
            let mut log = String::new();
            if log_size(prog, &mut n) == 0 && n > 1 {
                let mut buf = vec![0u8; n];
                if get_log(prog, buf.as_mut_ptr() as *mut c_char) == 0 {
                    log = String::from_utf8_lossy(&buf[..n - 1]).into_owned();
                }
            }
            if rc != 0 {
                destroy(&mut prog);
                return Err(fail(describe(rc), log));
            }
            let mut size = 0usize;
            let rc = size_fn(prog, &mut size);
            let mut out = vec![0u8; size];
            let rc = if rc == 0 { get_fn(prog, out.as_mut_ptr() as *mut c_char) } else { rc };
            destroy(&mut prog);
            if rc != 0 {
                return Err(fail(describe(rc), log));
            }
            if is_ptx && out.last() == Some(&0) {
                out.pop();
            }
            Ok(out)
        }
    }
}
