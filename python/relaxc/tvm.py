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


@tvm.transform.module_pass(opt_level=0, name="relaxc.RewriteToLibrary")
class RewriteToLibrary:
    """Rewrites the Relax operators relaxc's kernel library covers into calls of it."""

    def transform_module(self, mod, ctx):  # noqa: ARG002 (the pass context is not needed)
        return rewrite_module(mod)


def build(mod, target="llvm", exec_mode="bytecode", params=None, relax_pipeline="default", tir_pipeline="default",
          register=True):
    """``relax.build`` after RewriteToLibrary: the same executable, with the covered operators
    running on relaxc's kernel library. With ``register`` (the default) the kernels are also
    registered in TVM (this needs the relaxc command), so the result runs in TVM's VM as well."""
    rewritten = RewriteToLibrary()(mod)
    if register:
        try:
            register_kernels()
        except RelaxcNotFound as e:
            warnings.warn(f"relaxc's kernels are not registered in TVM, so TVM's VM cannot run this build: {e}")
    return relax.build(rewritten, target=target, params=params, relax_pipeline=relax_pipeline,
                       tir_pipeline=tir_pipeline, exec_mode=exec_mode)
