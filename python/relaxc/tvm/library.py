"""The kernel library in TVM's process.

``relaxc kernel-library`` links the kernels a relaxc model links, with the runtime they need,
into a shared object that exports each as a tvm-ffi function. It is built once per relaxc binary
(cached beside relaxc's other builds) and loaded with tvm_ffi.load_module; each kernel is then
registered under its global name (``relaxc.matmul``, ...), which is what a rewritten module's
``R.call_dps_packed`` calls. TVM's VM thus runs the very code a relaxc model runs: same bits.
"""

import hashlib
import os
import subprocess
import tempfile
import threading

from .. import find_relaxc

_lock = threading.Lock()
_loaded = {}  # library path -> (tvm-ffi module, {global name: export})


def _cache_dir() -> str:
    for var, suffix in (("RELAXC_CACHE_DIR", ""), ("XDG_CACHE_HOME", "relaxc")):
        if os.environ.get(var):
            return os.path.join(os.environ[var], suffix)
    return os.path.join(os.path.expanduser("~"), ".cache", "relaxc")


def _fingerprint(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def build_library(relaxc: str | None = None) -> tuple:
    """Builds (or finds in the cache) the kernel library of this relaxc: (path, {name: export})."""
    relaxc = relaxc or find_relaxc()
    folder = os.path.join(_cache_dir(), "kernel-library-" + _fingerprint(relaxc))
    path = os.path.join(folder, "librelaxc_kernels.so")
    names = os.path.join(folder, "kernels.tsv")
    if not (os.path.exists(path) and os.path.exists(names)):
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as work:
            lib = os.path.join(work, "librelaxc_kernels.so")
            done = subprocess.run([relaxc, "kernel-library", "-o", lib], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"relaxc kernel-library failed:\n{done.stderr}")
            with open(os.path.join(work, "kernels.tsv"), "w") as f:
                f.write(done.stdout)
            # Rename into place, names last: a reader that sees the names finds the library.
            os.replace(lib, path)
            os.replace(os.path.join(work, "kernels.tsv"), names)
    table = {}
    with open(names) as f:
        for line in f:
            if line.strip():
                name, export = line.rstrip("\n").split("\t")
                table[name] = export
    return path, table


def register_kernels(relaxc: str | None = None) -> dict:
    """Registers every kernel of the library as a TVM global function (``relaxc.matmul``, ...)
    and returns {global name: tvm-ffi Function}. Safe to call again: the library loads once."""
    import tvm_ffi

    path, table = build_library(relaxc)
    with _lock:
        if path not in _loaded:
            module = tvm_ffi.load_module(path)
            functions = {name: module[export] for name, export in table.items()}
            for name, function in functions.items():
                tvm_ffi.register_global_func(name, function, override=True)
            _loaded[path] = (module, functions)
        return dict(_loaded[path][1])
