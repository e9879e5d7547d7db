"""relaxc.tvm.rope: the KV cache's RoPE with each angle computed once gives TVM's fused_rope's bits,
and replaces a module's kernel only where that kernel is TVM's own for the creation's values.

Needs TVM (skips otherwise): both kernels are compiled by it and run on the same inputs.
"""

import numpy as np
import pytest

tvm = pytest.importorskip("tvm", reason="the kernels compared are TVM PrimFuncs, compiled by TVM")
from relaxc.tvm.rope import rope_once_per_position, use_rope_once_per_position
from tvm.relax.frontend.nn.llm.position_embedding import llama_rope_with_position_map

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def run(func, qkv, positions, q_heads, kv_heads, apply_rope):
    ex = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    n, _, d = qkv.shape
    outs = [tvm.runtime.tensor(np.zeros((n, h, d), np.float32)) for h in (q_heads, kv_heads, kv_heads)]
    ex["main"](tvm.runtime.tensor(qkv), tvm.runtime.tensor(positions), *outs, apply_rope)
    return [o.numpy() for o in outs]


@pytest.mark.parametrize(
    "theta, scale, scaling, head_dim, rotary_dim",
    [(10000.0, 1.0, {}, 64, None), (500000.0, 1.0, LLAMA3, 64, None), (1e6, 0.5, {}, 128, 64)],
)
@pytest.mark.parametrize("apply_rope", [1, 0])
def test_same_bits_as_tvms_fused_rope(theta, scale, scaling, head_dim, rotary_dim, apply_rope):
    rng = np.random.default_rng(3)
    q_heads, kv_heads, n = 4, 2, 37
    qkv = rng.standard_normal((n, q_heads + 2 * kv_heads, head_dim)).astype(np.float32)
    positions = rng.integers(0, 3000, n).astype(np.int32)
    shape = (theta, scale, head_dim, q_heads, kv_heads, "float32", scaling, rotary_dim)
    theirs = run(llama_rope_with_position_map(*shape), qkv, positions, q_heads, kv_heads, apply_rope)
    ours = run(rope_once_per_position(*shape), qkv, positions, q_heads, kv_heads, apply_rope)
    for name, a, b in zip("qkv", ours, theirs):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{name} differs from TVM's"


def tiny_llama_module(theta, rope_scaling):
    """A one-layer model on TVM's paged KV cache, exported with nn: its creation call and RoPE kernel."""
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn.llm.kv_cache import RopeMode, TIRPagedKVCache

    from tvm import relax

    class Model(nn.Module):
        def create_paged_kv_cache(self, max_batch_size: tvm.tirx.Var, max_total_seq_len: tvm.tirx.Var):
            return TIRPagedKVCache(
                attn_kind="mha",
                max_batch_size=max_batch_size,
                max_total_seq_len=max_total_seq_len,
                prefill_chunk_size=32,
                page_size=16,
                support_sliding_window=0,
                layer_partition=relax.ShapeExpr([0, 1]),
                num_hidden_layers=1,
                num_attention_heads=4,
                num_key_value_heads=2,
                qk_head_dim=64,
                v_head_dim=64,
                mla_original_qk_head_dim=0,
                mla_original_v_head_dim=0,
                rope_mode=RopeMode.NORMAL,
                rope_scale=1,
                rope_theta=theta,
                rope_scaling=rope_scaling,
                rope_ext_factors=relax.prim_value(0),
                rotary_dim=64,
                enable_disaggregation=False,
                dtype="float32",
                target=tvm.target.Target("llvm"),
            )

    spec = {
        "create_paged_kv_cache": {
            "max_batch_size": int,
            "max_total_seq_len": int,
            "$": {"param_mode": "none", "effect_mode": "none"},
        }
    }
    mod, _ = Model().export_tvm(spec=nn.spec.ModuleSpec.from_raw(spec, Model()))
    return mod


def rope_kernels(mod):
    return [f for g, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc) and "rope" in g.name_hint]


def replaced(mod):
    """Whether the module's RoPE kernel is now rope_once_per_position's (its positions parallel)."""
    (kernel,) = rope_kernels(mod)
    return "T.parallel" in kernel.script()


def test_replaces_only_tvms_own_kernel():
    mod = tiny_llama_module(10000.0, {})
    assert not replaced(mod)
    assert replaced(use_rope_once_per_position(mod.clone()))
    # llama3's kernel is replaced only when the caller names that scaling (its frequencies are
    # not the default's: the structural check refuses them otherwise).
    mod3 = tiny_llama_module(500000.0, LLAMA3)
    assert not replaced(use_rope_once_per_position(mod3.clone()))
    assert replaced(use_rope_once_per_position(mod3.clone(), LLAMA3))
    # gptj pairs neighbouring values, which the kernel here does not: left alone.
    gptj = tiny_llama_module(10000.0, {"rope_type": "gptj"})
    assert not replaced(use_rope_once_per_position(gptj.clone(), {"rope_type": "gptj"}))
