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

import os
import shutil

__all__ = ["RelaxcNotFound", "find_relaxc"]


class RelaxcNotFound(RuntimeError):
    """The relaxc command could not be found."""


def find_relaxc() -> str:
    """The relaxc command: ``$RELAXC`` if set, else ``relaxc`` on ``PATH``."""
    explicit = os.environ.get("RELAXC")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise RelaxcNotFound(f"$RELAXC names {explicit!r}, which is not an executable file")
        return explicit
    found = shutil.which("relaxc")
    if not found:
        raise RelaxcNotFound(
            "the relaxc command is not on PATH; build it (cargo build --release) and put target/release on PATH, "
            "or set RELAXC to its path"
        )
    return found
