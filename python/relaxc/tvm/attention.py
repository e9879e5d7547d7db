"""The paged KV cache's attention on relaxc's kernel library.

TVM's KV cache factory hands the cache runtime TIR kernels for attention, which run one value at
a time on one thread: at a 500-token prompt they were 45% of the mid-size Llama's prefill. Where a
module creates a float32 cache (``vm.builtin.paged_attention_kv_cache_create``), the ragged
prefill, paged prefill and paged decode slots get ``relaxc.attention_ragged``,
``relaxc.attention_paged_prefill`` and ``relaxc.attention_paged_decode`` instead: the same
parameter lists and results (runtime-kernels/src/attention.c), on every core. The sliding-window,
tree and merge slots keep TVM's kernels, and so does a cache whose RoPE runs inside attention.
relaxc.llm's GGUF models ask for the kernels' ``_ggml`` twins (llama.cpp's arithmetic).
"""

from tvm.relax.expr_functor import PyExprMutator, mutator

import tvm
from tvm import relax, tirx

_CREATE = "vm.builtin.paged_attention_kv_cache_create"
# Argument positions in the create call (docs/src/architecture/paged-kv-cache.md 2.1; the call's
# first operand is the function's name), the library kernel for each, and the TIR kernel's
# parameter count.
_SLOTS = {
    16: ("relaxc.attention_ragged", 14),
    17: ("relaxc.attention_paged_prefill", 15),
    18: ("relaxc.attention_paged_decode", 13),
}
_ROPE_MODE = 9  # 0 none, 1 normal (applied before attention), 2 inline (inside the kernels)
_PAGE_DTYPE = 13  # a tensor whose dtype the pages take


def _dtype(expr):
    ty = getattr(expr, "ty", None)
    return getattr(ty, "dtype", None)


def _int(expr):
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def _is_cache_creation(call, arguments):
    """Whether call creates a paged KV cache (`vm.builtin.paged_attention_kv_cache_create` through
    call_pure_packed) with at least `arguments` operands."""
    return (
        isinstance(call, relax.Call)
        and isinstance(call.op, tvm.ir.Op)
        and call.op.name == "relax.call_pure_packed"
        and len(call.args) >= arguments
        and isinstance(call.args[0], relax.ExternFunc)
        and call.args[0].global_symbol == _CREATE
    )


@mutator
class _UseLibraryAttention(PyExprMutator):
    def __init__(self, mod, suffix):
        super().__init__(mod)
        self.mod = mod
        self.suffix = suffix
        self.replaced = set()

    def _tir_kernel(self, slot_tuple, params):
        if not (isinstance(slot_tuple, relax.Tuple) and len(slot_tuple.fields) == 2):
            return None
        tag, gvar = slot_tuple.fields
        if not (isinstance(tag, tvm.ir.StringImm) and tag.value == "tirx" and isinstance(gvar, relax.GlobalVar)):
            return None
        func = self.mod[gvar] if gvar in self.mod.functions else None
        return gvar if isinstance(func, tirx.PrimFunc) and len(func.params) == params else None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        args = list(call.args)
        if not (
            _is_cache_creation(call, max(_SLOTS) + 1)
            and _int(args[_ROPE_MODE]) in (0, 1)
            and _dtype(args[_PAGE_DTYPE]) == "float32"
        ):
            return call
        changed = False
        for position, (kernel, params) in _SLOTS.items():
            gvar = self._tir_kernel(args[position], params)
            if gvar is not None:
                args[position] = relax.Tuple([tvm.ir.StringImm("tirx"), relax.ExternFunc(kernel + self.suffix)])
                self.replaced.add(gvar)
                changed = True
        if not changed:
            return call
        return relax.Call(call.op, args, call.attrs, call.ty_args, call.span)


def use_library_attention(mod, llama_cpp_arithmetic=False):
    """The module with its float32 KV caches' attention on relaxc's kernels (the TIR kernels they
    replace removed when nothing else calls them); with llama_cpp_arithmetic, on their twins that
    reproduce llama.cpp's bits (runtime-kernels/src/attention_ggml.c)."""
    mutator = _UseLibraryAttention(mod, "_ggml" if llama_cpp_arithmetic else "")
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gvar] = mutator.visit_expr(func)
    for gvar in mutator.replaced:
        if not any(_calls(func, gvar) for func in mod.functions.values() if isinstance(func, relax.Function)):
            del mod[gvar]
    return mod


def _calls(func, gvar):
    found = []
    relax.analysis.post_order_visit(func, lambda e: found.append(e) if e.same_as(gvar) else None)
    return bool(found)
