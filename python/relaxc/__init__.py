"""relaxc from Python.

relaxc itself is a command-line compiler (written in Rust) that turns a Relax program into one
self-contained shared object. This package is what sits on TVM's side of it:

- ``relaxc.tvm``: build TVM models whose operators run on relaxc's kernel library (``api``: the
  build and the registration of the kernels in TVM's own runtime; ``rewrite`` and ``patterns``:
  the rewrite pass and what it recognises; ``pack``: the weights in the kernels' layouts;
  ``library``: the kernel library in TVM's process).
- ``relaxc.llm``: LLMs from GGUF files (``python -m relaxc.llm build``), their tokenizers, and
  the quantized formats in numpy.
- ``relaxc.serve``: models on Ray Serve (``python -m relaxc.serve``): the engine, the Open
  Inference Protocol, OpenAI's completions, the deployment and the command line.

Importing ``relaxc`` imports nothing heavy; ``relaxc.tvm``'s API and ``relaxc.llm``'s builder
need Apache TVM, ``relaxc.serve`` Ray.
"""

import importlib.util
import os
import shutil
import sys
import sysconfig

__all__ = ["MissingExtra", "RelaxcNotFound", "book_page", "exit_without_extra", "find_relaxc", "require_extra"]

# The Python packages behind the import names the commands need, for the fix an error names.
_DISTRIBUTIONS = {"tvm": "apache-tvm", "tvm_ffi": "apache-tvm-ffi", "ray": "ray[serve]"}


def book_page(name):
    """Where the manual's page for a job is: the book in docs/ of relaxc's repository."""
    return f"docs/src/guide/{name}.md in relaxc's repository (the book: mdbook build docs)"


class RelaxcNotFound(RuntimeError):
    """The relaxc command could not be found."""


class MissingExtra(RuntimeError):
    """A command's optional dependencies are not installed; the message names the extra."""


def _importable(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module blocked
        return False


def require_extra(extra, command, modules):
    """Raises MissingExtra naming `pip install relaxc[extra]` unless every module imports."""
    missing = [m for m in modules if not _importable(m)]
    if missing:
        names = ", ".join(_DISTRIBUTIONS.get(m, m) for m in missing)
        raise MissingExtra(
            f"{command} needs {names}, which this Python lacks: pip install 'relaxc[{extra}]' "
            f"(from a checkout: pip install './python[{extra}]')"
        )


def exit_without_extra(extra, command, modules):
    """For a command line: require_extra's message as a one-line error, and exit 1."""
    try:
        require_extra(extra, command, modules)
    except MissingExtra as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def _executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _bundled_relaxc():
    """The relaxc binary the wheel installed with this package: the scripts folder of the
    installation scheme whose library folder holds this file, or None (a source checkout)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for scheme in sysconfig.get_scheme_names():
        paths = sysconfig.get_paths(scheme)
        libraries = {os.path.abspath(paths[k]) for k in ("purelib", "platlib") if k in paths}
        if here in libraries:
            candidate = os.path.join(paths["scripts"], "relaxc")
            if _executable(candidate):
                return candidate
    return None


def find_relaxc() -> str:
    """The relaxc command: ``$RELAXC`` if set (a development build to try), else the binary
    installed with this package, else ``relaxc`` on ``PATH``."""
    explicit = os.environ.get("RELAXC")
    if explicit:
        if not _executable(explicit):
            raise RelaxcNotFound(f"$RELAXC names {explicit!r}, which is not an executable file")
        return explicit
    found = _bundled_relaxc() or shutil.which("relaxc")
    if not found:
        raise RelaxcNotFound(
            "the relaxc command is not installed: `pip install ./python` installs it with this package "
            "(or build it with `cargo build --release` and set RELAXC to target/release/relaxc); "
            f"see {book_page('install')}"
        )
    return found
