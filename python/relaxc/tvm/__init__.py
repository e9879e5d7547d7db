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

# The API needs TVM, which is imported when first used: relaxc.tvm.pack (numpy alone) stays
# importable without it.
__all__ = ["QUANTIZE_FORMATS", "RewriteToLibrary", "build", "build_library", "register_kernels", "target_for"]


def __getattr__(name):
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'relaxc.tvm' has no attribute {name!r}")
