"""relaxc.tvm's API (re-exported by the package, which imports it only when used): the build,
the rewrite as a pass of its own, and the kernels' registration in TVM."""

import warnings

import tvm
from tvm import relax

from .. import RelaxcNotFound
from .library import build_library, register_kernels
from .rewrite import rewrite_module

__all__ = ["RewriteToLibrary", "build", "build_library", "register_kernels", "target_for"]


QUANTIZE_FORMATS = ("f16", "q8_0", "q4_0", "q4_K", "q6_K")


@tvm.transform.module_pass(opt_level=0, name="relaxc.RewriteToLibrary")
class RewriteToLibrary:
    """Rewrites the Relax operators relaxc's kernel library covers into calls of it; with
    ``quantize``, dense layers' constant weights are quantized to that GGUF format."""

    def __init__(self, quantize=None):
        if quantize is not None and quantize not in QUANTIZE_FORMATS:
            raise ValueError(f"quantize={quantize!r}: the formats are {', '.join(QUANTIZE_FORMATS)}")
        self.quantize = quantize

    def transform_module(self, mod, ctx):
        return rewrite_module(mod, self.quantize)


def build(
    mod,
    target="llvm",
    exec_mode="bytecode",
    params=None,
    relax_pipeline="default",
    tir_pipeline="default",
    register=True,
    quantize=None,
    parallel=True,
):
    """``relax.build`` after RewriteToLibrary: the same executable, with the covered operators
    running on relaxc's kernel library. With ``register`` (the default) the kernels are also
    registered in TVM (this needs the relaxc command), so the result runs in TVM's VM as well.
    ``quantize`` ("f16", "q8_0", "q4_0", "q4_K" or "q6_K") quantizes the weights of dense layers
    (constant [k, n] matrices whose k is a multiple of the format's block: 32, 256 for the K
    formats) into that GGUF format, run by relaxc.dense_q; other layers stay float32.
    ``parallel`` (the default) fuses the element-wise chains left to TVM's kernels into one
    kernel each and schedules those onto the thread pool, vectorized (relaxc.tvm.schedule)."""
    rewritten = RewriteToLibrary(quantize)(mod)
    if parallel:
        from .schedule import FuseAndParallelize

        rewritten = FuseAndParallelize()(rewritten)
    if register:
        try:
            register_kernels()
        except RelaxcNotFound as e:
            warnings.warn(
                f"relaxc's kernels are not registered in TVM, so TVM's VM cannot run this build: {e}", stacklevel=2
            )
    return relax.build(
        rewritten,
        target=target,
        params=params,
        relax_pipeline=relax_pipeline,
        tir_pipeline=tir_pipeline,
        exec_mode=exec_mode,
    )


def target_for(triple=None):
    """TVM's LLVM target for the kernels of a target triple as relaxc compile takes it (None: this
    machine), for boards as the book's board page (docs/src/guide/boards.md) spells them."""
    if triple is None:
        return "llvm"
    if triple.startswith("aarch64"):
        return tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})
    if triple.startswith("riscv64"):
        return tvm.target.Target(
            {
                "kind": "llvm",
                "mtriple": "riscv64-linux-gnu",
                "mattr": ["+m", "+a", "+f", "+d", "+c"],
                "mabi": "lp64d",
            }
        )
    return "llvm"
