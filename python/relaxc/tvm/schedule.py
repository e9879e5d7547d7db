"""What stays on TVM's kernels, made to run well: chains of element-wise operators (HardSwish
written out, a residual add, a per-channel scale) fused into one kernel each, as TVM's fusion
passes do, and every fused kernel that only maps elements to elements (no reduction) scheduled
to run on the thread pool (its loops fused, cut into chunks that the pool's threads take, the
inner part vectorized). TVM's default CPU build leaves them one kernel per operator, each a
single-threaded scalar loop, one pass over memory each. A reduction (a sum, a max) has its
outputs split between the threads, each output reduced as TVM reduces it."""

import math

import tvm
from tvm import relax, tirx

# Elements per chunk a thread takes: big enough that waking a thread pays (tens of microseconds),
# small enough that two threads share a 100 KB tensor.
CHUNK = 16384
LANES = 8
# A last axis at least this long is vectorized on its own (see _schedule).
INNER_ROW = 64


def _schedule(func):
    """func with its element-wise work parallel and vectorized, or None to leave it."""
    from tvm import s_tir

    try:
        sch = s_tir.Schedule(func)
        root = sch.get_sblock("root") if hasattr(sch, "get_sblock") else sch.get_block("root")
        blocks = sch.get_child_blocks(root)
        if not blocks:
            return None
        reduction = any(int(iv.iter_type) != 0 for b in blocks for iv in sch.get(b).iter_vars)
        last = _only_block(sch, root, blocks)
        if last is None:
            return None
        if reduction:
            return _schedule_reduction(sch, last)
        loops = sch.get_loops(last)
        if not loops:
            return None
        innermost = sch.get(loops[-1]).extent
        if len(loops) > 1 and isinstance(innermost, tirx.IntImm) and int(innermost.value) >= INNER_ROW:
            # Rows of a broadcast (a per-channel bias, a one-hot): the last axis vectorized as it
            # is, the others fused and cut into chunks. Fusing every axis made each lane divide
            # its index by the row length to find its operands (magika's one-hot, 257 wide).
            tasks, _ = sch.split(_fused(sch, loops[:-1]), factors=[None, max(1, CHUNK // int(innermost.value))])
            row = loops[-1]
        else:
            tasks, row = sch.split(_fused(sch, loops), factors=[None, CHUNK])
        # One chunk in all: no launch at all. The pool's launch wakes every thread for a loop of
        # one task (TVM's kernels ask for all of them), and a kernel of a few microseconds then
        # takes longer at 2 threads than at 1 (an int8 classifier's 200 small kernels: 1.45 ms
        # at 1 thread, 1.98 ms at 2).
        extent = sch.get(tasks).extent
        if not (isinstance(extent, tirx.IntImm) and int(extent.value) == 1):
            sch.parallel(tasks)
        _, lanes = sch.split(row, factors=[None, LANES])
        sch.vectorize(lanes)
        return sch.mod["main"].with_attr("tirx.is_scheduled", True)
    except Exception:
        return None


def _fused(sch, loops):
    """One loop over the given loops' iterations (the loop itself when there is one)."""
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def _only_block(sch, root, blocks):
    """The kernel's last block once every block before it is inlined into it, or None when more
    than one is left."""
    for block in blocks[:-1]:
        sch.compute_inline(block)
    last = sch.get_child_blocks(root)
    return last[0] if len(last) == 1 else None


def _schedule_reduction(sch, last):
    """A reduction (a sum or a max over some axes, the element-wise work before it inlined) with its
    outputs split between the pool's threads: each output still reduces its values in TVM's
    order, on one thread, so the bits are TVM's. magika's global max pooling and its layer
    norms' sums ran on one thread. None where the kernel is not that."""
    loops = sch.get_loops(last)
    kinds = [int(iv.iter_type) for iv in sch.get(last).iter_vars]
    spatial = kinds.index(2) if 2 in kinds else len(kinds)
    # Spatial axes first, then the reduced ones, one loop each (as TVM legalizes sum and max).
    if len(loops) != len(kinds) or spatial == 0 or any(k != 0 for k in kinds[:spatial]):
        return None
    if any(k != 2 for k in kinds[spatial:]):
        return None
    extents = [sch.get(loop).extent for loop in loops]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    outputs = math.prod(int(e.value) for e in extents[:spatial])
    work = outputs * math.prod(int(e.value) for e in extents[spatial:])
    # Chunks of about CHUNK values reduced, as the element-wise kernels take.
    per_task = max(1, CHUNK * outputs // work)
    if outputs < 2 or work < CHUNK or per_task >= outputs:
        return None
    tasks, _ = sch.split(_fused(sch, loops[:spatial]), factors=[None, per_task])
    sch.parallel(tasks)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


@tvm.transform.module_pass(opt_level=0, name="relaxc.FuseAndParallelize")
class FuseAndParallelize:
    """Legalizes the operators the kernel library did not take, fuses element-wise chains (TVM's
    FuseOps and FuseTIR), and schedules each fused element-wise kernel and each reduction onto the
    thread pool."""

    def transform_module(self, mod, ctx):
        # Kernels the module brought (the paged KV cache's attention, a TVMScript program's own
        # PrimFuncs) are scheduled by their authors: only what legalization and fusion made here
        # is ours to schedule. The mid-size Llama's prefill attention broke when it was touched.
        written = {gvar.name_hint for gvar, func in mod.functions.items() if isinstance(func, tirx.PrimFunc)}
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
            if not isinstance(func, tirx.PrimFunc) or gvar.name_hint in written:
                continue
            if func.attrs is not None and "tirx.is_scheduled" in func.attrs:
                continue
            scheduled = _schedule(func)
            if scheduled is not None:
                mod[gvar] = scheduled
        return mod
