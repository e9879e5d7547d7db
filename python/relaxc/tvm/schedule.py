"""What stays on TVM's kernels, made to run well: chains of element-wise operators (HardSwish
written out, a residual add, a per-channel scale) fused into one kernel each, as TVM's fusion
passes do, and every fused kernel that only maps elements to elements (no reduction) scheduled
to run on the thread pool (its loops fused, cut into chunks that the pool's threads take, the
inner part vectorized). TVM's default CPU build leaves them one kernel per operator, each a
single-threaded scalar loop, one pass over memory each."""

import tvm
from tvm import relax, tirx

# Elements per chunk a thread takes: big enough that waking a thread pays (tens of microseconds),
# small enough that two threads share a 100 KB tensor.
CHUNK = 16384
LANES = 8


def _schedule(func):
    """func with its element-wise work parallel and vectorized, or None to leave it."""
    from tvm import s_tir

    try:
        sch = s_tir.Schedule(func)
        root = sch.get_sblock("root") if hasattr(sch, "get_sblock") else sch.get_block("root")
        blocks = sch.get_child_blocks(root)
        if not blocks:
            return None
        # Element to element only: a block with a reduction axis stays as TVM made it.
        if any(int(iv.iter_type) != 0 for b in blocks for iv in sch.get(b).iter_vars):
            return None
        for block in blocks[:-1]:
            sch.compute_inline(block)
        last = sch.get_child_blocks(root)
        if len(last) != 1:
            return None
        loops = sch.get_loops(last[0])
        if not loops:
            return None
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        outer, inner = sch.split(fused, factors=[None, CHUNK])
        sch.parallel(outer)
        _, lanes = sch.split(inner, factors=[None, LANES])
        sch.vectorize(lanes)
        return sch.mod["main"].with_attr("tirx.is_scheduled", True)
    except Exception:
        return None


@tvm.transform.module_pass(opt_level=0, name="relaxc.FuseAndParallelize")
class FuseAndParallelize:
    """Legalizes the operators the kernel library did not take, fuses element-wise chains (TVM's
    FuseOps and FuseTIR), and schedules each fused element-wise kernel onto the thread pool."""

    def transform_module(self, mod, ctx):
        mod = tvm.transform.Sequential(
            [
                relax.transform.LegalizeOps(),
                relax.transform.AnnotateTIROpPattern(),
                relax.transform.FoldConstant(),
                relax.transform.FuseOps(),
                relax.transform.FuseTIR(),
                relax.transform.DeadCodeElimination(),
            ]
        )(mod)
        for gvar, func in list(mod.functions.items()):
            if not isinstance(func, tirx.PrimFunc) or (func.attrs is not None and "tirx.is_scheduled" in func.attrs):
                continue
            scheduled = _schedule(func)
            if scheduled is not None:
                mod[gvar] = scheduled
        return mod
