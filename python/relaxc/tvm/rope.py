"""RoPE for the paged KV cache with each angle's sine and cosine computed once.

TVM's KV cache rotates queries and keys with ``llama_rope_with_position_map``'s ``fused_rope``,
which computes the frequency (a ``powf``), its sine and its cosine for every value of every head:
at a 500-token prompt of the mid-size Llama those libm calls were about 12% of the prefill. The
kernel here takes the same parameters, computes the same expressions (TVM's own frequency
functions, the same products and sums, so the same bits), but once per position and pair of
dimensions for all heads, with the positions spread over the cores.

``use_rope_once_per_position`` (called by relaxc.tvm's rewrite, and by relaxc.llm with the file's
RoPE scaling) puts it in place of a KV cache creation's RoPE kernel (slot 24, ``f_split_rotary``)
where that kernel is exactly TVM's for the creation's values and a frequency kind whose sine and
cosine depend on the position and the pair alone: the default, "llama3" and "llama4". Others
(gptj pairs neighbours; longrope takes extension factors) keep TVM's kernel.
"""

import tvm_ffi
from tvm.relax.frontend.nn.llm.position_embedding import llama_rope_with_position_map, switch_rope_freq_func
from tvm.script import tirx as T

from tvm import relax, tirx

from .attention import _PAGE_DTYPE, _ROPE_MODE, _dtype, _is_cache_creation

# The creation call's constants this kernel is built from, by argument position
# (docs/src/architecture/paged-kv-cache.md 2.1: slot + 1, the call's first operand being the
# builtin's name; attention.py names the rest), and the RoPE kernel's position.
_CONSTANTS = {"q_heads": 3, "kv_heads": 4, "head_dim": 5, "rope_mode": _ROPE_MODE, "scale": 10, "theta": 11}
_SPLIT_ROTARY = 25
_ONCE_PER_POSITION = (None, "llama3", "llama4")


def rope_once_per_position(theta, scale, head_dim, num_q_heads, num_kv_heads, dtype, rope_scaling, rotary_dim=None):
    """``fused_rope``'s parameters and results (qkv [n, Hq + 2 Hkv, D] split into q, k, v; q and
    k rotated at position_map's positions where apply_rope > 0), each angle computed once."""
    fused_heads = num_q_heads + num_kv_heads * 2
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    half = rotary_dim // 2
    scale = tirx.const(scale, "float32")
    freq = switch_rope_freq_func(rope_scaling)

    def cos_sin(pos, d):
        cos_freq, sin_freq, var_map = freq(pos * scale, d, rotary_dim, theta, "float32")
        for var, value in var_map.items():
            cos_freq, sin_freq = tirx.Let(var, value, cos_freq), tirx.Let(var, value, sin_freq)
        return cos_freq, sin_freq

    @T.prim_func(private=True)
    def fused_rope(
        var_qkv: T.handle,
        var_position_map: T.handle,
        var_q: T.handle,
        var_k: T.handle,
        var_v: T.handle,
        apply_rope: T.int64,
    ):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True})
        seq_len = T.int32()
        position_map_elem_offset = T.int32()
        qkv = T.match_buffer(var_qkv, (seq_len, fused_heads, head_dim), dtype)
        q = T.match_buffer(var_q, (seq_len, num_q_heads, head_dim), dtype)
        k = T.match_buffer(var_k, (seq_len, num_kv_heads, head_dim), dtype)
        v = T.match_buffer(var_v, (seq_len, num_kv_heads, head_dim), dtype)
        position_map = T.match_buffer(var_position_map, (seq_len,), "int32", elem_offset=position_map_elem_offset)
        for s in T.parallel(seq_len):
            for h, d in T.grid(num_kv_heads, head_dim):
                v[s, h, d] = qkv[s, num_q_heads + num_kv_heads + h, d]
            if apply_rope > 0:
                for d in range(half):
                    c: T.float32 = cos_sin(position_map[s], d)[0]
                    n: T.float32 = cos_sin(position_map[s], d)[1]
                    for h in range(num_q_heads):
                        q[s, h, d] = T.Cast(
                            dtype, c * T.Cast("float32", qkv[s, h, d]) + n * T.Cast("float32", -qkv[s, h, d + half])
                        )
                        q[s, h, d + half] = T.Cast(
                            dtype, c * T.Cast("float32", qkv[s, h, d + half]) + n * T.Cast("float32", qkv[s, h, d])
                        )
                    for h in range(num_kv_heads):
                        k[s, h, d] = T.Cast(
                            dtype,
                            c * T.Cast("float32", qkv[s, num_q_heads + h, d])
                            + n * T.Cast("float32", -qkv[s, num_q_heads + h, d + half]),
                        )
                        k[s, h, d + half] = T.Cast(
                            dtype,
                            c * T.Cast("float32", qkv[s, num_q_heads + h, d + half])
                            + n * T.Cast("float32", qkv[s, num_q_heads + h, d]),
                        )
                for h, d in T.grid(num_q_heads, head_dim - rotary_dim):
                    q[s, h, rotary_dim + d] = qkv[s, h, rotary_dim + d]
                for h, d in T.grid(num_kv_heads, head_dim - rotary_dim):
                    k[s, h, rotary_dim + d] = qkv[s, num_q_heads + h, rotary_dim + d]
            else:
                for h, d in T.grid(num_q_heads, head_dim):
                    q[s, h, d] = qkv[s, h, d]
                for h, d in T.grid(num_kv_heads, head_dim):
                    k[s, h, d] = qkv[s, num_q_heads + h, d]

    return fused_rope


def _cache_creations(mod):
    """(the RoPE kernel's GlobalVar, the creation call's arguments) of each KV cache creation."""
    found = {}

    def visit(expr):
        if _is_cache_creation(expr, _SPLIT_ROTARY + 1) and isinstance(expr.args[_SPLIT_ROTARY], relax.GlobalVar):
            found[expr.args[_SPLIT_ROTARY]] = expr.args

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found.items()


def _constant(expr):
    return expr.value if isinstance(expr, (tirx.IntImm, tirx.FloatImm)) else None


def use_rope_once_per_position(mod, rope_scaling=None):
    """mod with each KV cache's RoPE kernel replaced by rope_once_per_position's where it is TVM's
    ``fused_rope`` built from the creation's own theta, scale and heads with this rope_scaling
    (default: none) and no partial rotary dimension: the module's kernel must be structurally
    equal to the one TVM would build, so nothing else is ever replaced."""
    rope_scaling = rope_scaling or {}
    if rope_scaling.get("rope_type") not in _ONCE_PER_POSITION:
        return mod
    for gvar, args in _cache_creations(mod):
        values = {name: _constant(args[at]) for name, at in _CONSTANTS.items()}
        dtype = _dtype(args[_PAGE_DTYPE])
        if (
            values["rope_mode"] != 1
            or None in values.values()
            or dtype is None
            or not isinstance(mod[gvar], tirx.PrimFunc)
        ):
            continue
        shape = (values["theta"], values["scale"], values["head_dim"], values["q_heads"], values["kv_heads"], dtype)
        theirs = llama_rope_with_position_map(*shape, rope_scaling, None)
        old = mod[gvar]
        if not tvm_ffi.structural_equal(old.with_attr("global_symbol", "f"), theirs.with_attr("global_symbol", "f")):
            continue
        symbol = (
            old.attrs["global_symbol"] if old.attrs is not None and "global_symbol" in old.attrs else gvar.name_hint
        )
        mod[gvar] = rope_once_per_position(*shape, rope_scaling).with_attr("global_symbol", symbol)
    return mod
