"""relaxc.tvm: TVM models on relaxc's kernel library.

    import relaxc.tvm
    ex = relaxc.tvm.build(mod, target="llvm")   # what relax.build returns
    ex.export_library("m.tar")                   # then: relaxc compile m.tar -o m.so

``build`` rewrites the operators the kernel library covers (matmul and dense layers with their
bias, scale, residual and activation; NCHW conv2d, depthwise included, with batch norm folded in;
pooling; softmax; layer and RMS norm) into ``R.call_dps_packed("relaxc.<kernel>", ...)`` calls,
packing constant weights into the kernels' layout, then builds with TVM's default pipeline:
everything else stays a TVM kernel. ``RewriteToLibrary`` is the rewrite as a pass of its own, for
custom pipelines. ``register_kernels`` makes TVM's own VM run the rewritten module on the very
code relaxc models link, so TVM stays the oracle: TVM, relaxc bytecode and relaxc compiled give
the same bits. ``build`` registers them for you when the relaxc command can be found.
"""

import warnings

import tvm
from tvm import relax

from . import RelaxcNotFound
from ._library import build_library, register_kernels
from ._rewrite import rewrite_module

__all__ = ["build", "RewriteToLibrary", "register_kernels", "build_library"]


QUANTIZE_FORMATS = ("f16", "q8_0", "q4_0", "q4_K", "q6_K")


@tvm.transform.module_pass(opt_level=0, name="relaxc.RewriteToLibrary")
class RewriteToLibrary:
    """Rewrites the Relax operators relaxc's kernel library covers into calls of it; with
    ``quantize``, dense layers' constant weights are quantized to that GGUF format."""

    def __init__(self, quantize=None):
        if quantize is not None and quantize not in QUANTIZE_FORMATS:
            raise ValueError(f"quantize={quantize!r}: the formats are {', '.join(QUANTIZE_FORMATS)}")
        self.quantize = quantize

    def transform_module(self, mod, ctx):  # noqa: ARG002 (the pass context is not needed)
        return rewrite_module(mod, self.quantize)


def build(mod, target="llvm", exec_mode="bytecode", params=None, relax_pipeline="default", tir_pipeline="default",
          register=True, quantize=None):
    """``relax.build`` after RewriteToLibrary: the same executable, with the covered operators
    running on relaxc's kernel library. With ``register`` (the default) the kernels are also
    registered in TVM (this needs the relaxc command), so the result runs in TVM's VM as well.
    ``quantize`` ("f16", "q8_0", "q4_0", "q4_K" or "q6_K") quantizes the weights of dense layers
    (constant [k, n] matrices whose k is a multiple of the format's block: 32, 256 for the K
    formats) into that GGUF format, run by relaxc.dense_q; other layers stay float32."""
    rewritten = RewriteToLibrary(quantize)(mod)
    if register:
        try:
            register_kernels()
        except RelaxcNotFound as e:
            warnings.warn(f"relaxc's kernels are not registered in TVM, so TVM's VM cannot run this build: {e}")
    return relax.build(rewritten, target=target, params=params, relax_pipeline=relax_pipeline,
                       tir_pipeline=tir_pipeline, exec_mode=exec_mode)
