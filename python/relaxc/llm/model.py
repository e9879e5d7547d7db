"""The Llama family as a TVM nn module over a GGUF file's own tensors.

Each weight is a parameter named as the file names it (``blk.0.attn_q.weight``), with the
dtype and shape its format gives (rvm.h's weights_open passes GGUF tensors that way): f32 and f16
matrices as themselves, block formats (q8_0, q4_0, q4_K, q6_K) as uint8 rows of blocks. Dense
layers call ``relaxc.dense_q`` and the embedding ``relaxc.take_q``, so the weights are used in
place; the feed-forward's gate is ``relaxc.swiglu`` (llama.cpp's arithmetic for silu(gate) * up);
RMS norms become ``relaxc.rms_norm`` in relaxc.tvm's rewrite. RoPE is ``relaxc.rope`` (llama.cpp's
arithmetic, with the file's theta, scale and frequency divisors), and attention runs on TVM's paged
KV cache, as fixtures/tvm/llm.py's Llama does (without RoPE of its own), and the module
follows the same export convention (create_paged_kv_cache, embed, prefill, decode).
"""

from dataclasses import dataclass

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.core import wrap_nested
from tvm.relax.frontend.nn.llm._kernel_common import RopeMode
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, TIRPagedKVCache

import tvm
from tvm import relax, te, tirx

from .quantize import BLOCKS as QUANTIZE_BLOCKS

# GGUF's block formats: values per block and bytes per block.
# The formats relaxc.llm.quantize writes, and what llama.cpp's quantizer falls back to.
BLOCKS = {**QUANTIZE_BLOCKS, "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24)}
FORMATS = ["f32", "f16", *BLOCKS]


def regrouped_type(fmt, rows, k):
    """The shape of a [rows, k] matrix regrouped eight rows at a time (q4_0x8, q8_0x8, q4_Kx8)."""
    values, nbytes = {"q4_0x8": (32, 144), "q8_0x8": (32, 272), "q4_Kx8": (256, 1184)}[fmt]
    return (rows // 8, k // values * nbytes)


def weight_type(fmt, rows, k):
    """(shape, dtype) of a [rows, k] matrix in format fmt, as weights_open passes it."""
    if fmt == "f32":
        return (rows, k), "float32"
    if fmt == "f16":
        return (rows, k), "float16"
    block, nbytes = BLOCKS[fmt]
    return (rows, k // block * nbytes), "uint8"


@dataclass
class Config:
    """What the model needs from the file: sizes, RoPE and each matrix's format."""

    arch: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rms_eps: float
    rope_theta: float
    rope_scale: float  # the file's linear RoPE scaling factor (1: none)
    # Whether the file has rope_freqs.weight: a divisor per frequency of RoPE's angles (Llama 3.1's
    # scaling, as llama.cpp's converter writes it).
    rope_freqs: bool
    context: int
    formats: dict  # tensor name -> format
    qkv_bias: bool
    tied_embeddings: bool
    # How relaxc.rope pairs a head's dimensions, as llama.cpp does for the architecture: "normal"
    # (adjacent pairs) for llama and mistral, whose Q and K rows its converter reordered for
    # that, "neox" (the two halves) for qwen2 and qwen3, whose rows are in Hugging Face's order.
    rope_mode: str
    # Qwen3: each head's Q and K RMS-normed (blk.N.attn_q_norm, attn_k_norm) before RoPE.
    qk_norm: bool = False
    # Phi-3: Q, K and V in one matrix (attn_qkv) and the gate and up in one (ffn_up, gate first);
    # Q scaled by 1 / sqrt(head_dim) before attention, as llama.cpp's graph scales it.
    fused: bool = False


def _extern(name, args, out):
    """``R.call_dps_packed(name, args)``, where None passes None (an absent bias) and a numpy
    array a constant."""
    converted = []
    for a in args:
        if a is None:
            converted.append(relax.op.null_value())
        elif isinstance(a, np.ndarray):
            converted.append(relax.const(a))
        elif isinstance(a, Tensor):
            converted.append(a._expr)
        else:
            converted.append(tvm.ir.StringImm(a))
    return wrap_nested(
        relax.call_dps_packed(name, args=relax.Tuple(converted), out_ty=out._expr.ty),
        name,
    )


# A q4_0, q8_0 or q4_K matrix of a multiple of 8 rows is asked for regrouped eight rows at a time
# (rvm.h's weights_open makes the copy for a parameter named "X#q4_0x8", "X#q8_0x8" or
# "X#q4_Kx8"): decoding reads it 1.2-1.5x faster.
REGROUPED = {"q4_0": "q4_0x8", "q4_K": "q4_Kx8", "q8_0": "q8_0x8"}


def regrouped(fmt, rows):
    """The regrouped format a matrix is read in, or None."""
    return REGROUPED.get(fmt) if rows % 8 == 0 else None


class Linear(nn.Module):
    """x @ W.T (+ b) with W in the file's format, through relaxc.dense_q."""

    def __init__(self, rows, k, fmt, bias=False):
        self.rows, self.fmt, self.name = rows, fmt, "weight"
        if regrouped(fmt, rows):
            self.fmt = regrouped(fmt, rows)
            self.name = "weight#" + self.fmt
            setattr(
                self,
                self.name,
                nn.Parameter(regrouped_type(self.fmt, rows, k), "uint8"),
            )
        else:
            shape, dtype = weight_type(fmt, rows, k)
            self.weight = nn.Parameter(shape, dtype)
        self.bias = nn.Parameter((rows,), "float32") if bias else None

    def matrix(self):
        return getattr(self, self.name)

    def forward(self, x):
        out = Tensor.placeholder([*x.shape[:-1], self.rows], "float32")
        return _extern("relaxc.dense_q", [x, self.matrix(), self.fmt, self.bias], out)


class Embedding(nn.Module):
    def __init__(self, vocab, hidden, fmt, tied=False):
        shape, dtype = weight_type(fmt, vocab, hidden)
        self.hidden, self.fmt, self.vocab = hidden, fmt, vocab
        self.weight = nn.Parameter(shape, dtype)
        self.output_fmt = regrouped(fmt, vocab) if tied else None
        if self.output_fmt:  # the output layer reads the table regrouped
            setattr(
                self,
                "weight#" + self.output_fmt,
                nn.Parameter(regrouped_type(self.output_fmt, vocab, hidden), "uint8"),
            )

    def as_output(self, h):
        """h times the table: the output layer of a model whose embeddings are tied."""
        out = Tensor.placeholder([*h.shape[:-1], self.vocab], "float32")
        if self.output_fmt:
            return _extern(
                "relaxc.dense_q",
                [h, getattr(self, "weight#" + self.output_fmt), self.output_fmt, None],
                out,
            )
        return _extern("relaxc.dense_q", [h, self.weight, self.fmt, None], out)

    def forward(self, ids):
        out = Tensor.placeholder([*ids.shape, self.hidden], "float32")
        return _extern("relaxc.take_q", [self.weight, ids, self.fmt], out)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        self.eps = eps
        self.weight = nn.Parameter((d,), "float32")

    def forward(self, x):
        return op.rms_norm(x, self.weight, axes=[-1], epsilon=self.eps)


class Block(nn.Module):
    """One decoder layer, its tensors named as llama.cpp names them (blk.N.attn_q, ...)."""

    def __init__(self, i, c: Config):
        f = c.formats
        p = f"blk.{i}."
        self.layer, self.c = i, c
        self.attn_norm = RMSNorm(c.hidden, c.rms_eps)
        if c.fused:
            rows = (c.heads + 2 * c.kv_heads) * c.head_dim
            self.attn_qkv = Linear(rows, c.hidden, f[p + "attn_qkv.weight"])
        else:
            self.attn_q = Linear(c.heads * c.head_dim, c.hidden, f[p + "attn_q.weight"], c.qkv_bias)
            self.attn_k = Linear(c.kv_heads * c.head_dim, c.hidden, f[p + "attn_k.weight"], c.qkv_bias)
            self.attn_v = Linear(c.kv_heads * c.head_dim, c.hidden, f[p + "attn_v.weight"], c.qkv_bias)
        self.attn_output = Linear(c.hidden, c.heads * c.head_dim, f[p + "attn_output.weight"])
        if c.qk_norm:
            self.attn_q_norm = RMSNorm(c.head_dim, c.rms_eps)
            self.attn_k_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.ffn_norm = RMSNorm(c.hidden, c.rms_eps)
        if c.fused:
            self.ffn_up = Linear(2 * c.ffn, c.hidden, f[p + "ffn_up.weight"])
        else:
            self.ffn_gate = Linear(c.ffn, c.hidden, f[p + "ffn_gate.weight"])
            self.ffn_up = Linear(c.ffn, c.hidden, f[p + "ffn_up.weight"])
        self.ffn_down = Linear(c.hidden, c.ffn, f[p + "ffn_down.weight"])

    def _rope(self, x, heads, rope, norm=None):
        """relaxc.rope on a Q or K projection, split into heads and each head RMS-normed first
        where the architecture has norm (Qwen3): rope is (positions, frequency divisors or None)."""
        b, s, _ = x.shape
        c = self.c
        x = op.reshape(x, (b, s, heads, c.head_dim))
        if norm is not None:
            x = norm(x)
        params = np.array([c.rope_theta, 1.0 / c.rope_scale, 1.0], np.float32)
        return _extern("relaxc.rope", [x, *rope, c.rope_mode, params], Tensor.placeholder(x.shape, "float32"))

    def forward(self, x, cache: PagedKVCache, rope, keep=None):
        """rope: the step's positions and the frequency divisors (relaxc.rope: llama.cpp's
        arithmetic; the cache applies none of its own). keep (the last layer of a prefill): the
        rows that go on past attention, whose K and V the cache has taken for every row (only
        their logits are asked for)."""
        c = self.c
        b, s, _ = x.shape
        h = self.attn_norm(x)
        if c.fused:
            q_end, k_end = c.heads * c.head_dim, (c.heads + c.kv_heads) * c.head_dim
            q, k, v = op.split(self.attn_qkv(h), [q_end, k_end], axis=2)
        else:
            q, k, v = self.attn_q(h), self.attn_k(h), self.attn_v(h)
        norms = (self.attn_q_norm, self.attn_k_norm) if c.qk_norm else (None, None)
        q, k = self._rope(q, c.heads, rope, norms[0]), self._rope(k, c.kv_heads, rope, norms[1])
        v = op.reshape(v, (b, s, c.kv_heads, c.head_dim))
        sm_scale = c.head_dim**-0.5
        if c.fused:  # Phi-3's graph scales Q itself (a float multiply) and attends at scale 1
            scale = Tensor.from_const(np.array(sm_scale, np.float32))
            q, sm_scale = q * scale, 1.0
        qkv = op.concat([q, k, v], dim=2)
        o = cache.attention_with_fused_qkv(self.layer, qkv, c.heads, sm_scale=sm_scale)
        x = x + self.attn_output(op.reshape(o, (b, s, c.heads * c.head_dim)))
        if keep is not None:
            x = keep(x)
        h = self.ffn_norm(x)
        if c.fused:
            gate, up = op.split(self.ffn_up(h), 2, axis=2)
        else:
            gate, up = self.ffn_gate(h), self.ffn_up(h)
        # silu(gate) * up in llama.cpp's arithmetic (its exp): the down projection quantizes it
        # to int8, where a value one rounding off llama.cpp's flips an int8 now and then.
        gated = _extern("relaxc.swiglu", [gate, up], Tensor.placeholder(gate.shape, "float32"))
        return x + self.ffn_down(gated)


class RopeFreqs(nn.Module):
    """rope_freqs.weight: the divisor of each frequency's angle (llama.cpp's freq_factors)."""

    def __init__(self, pairs):
        self.weight = nn.Parameter((pairs,), "float32")


class LlamaFamily(nn.Module):
    def __init__(self, c: Config):
        self.c = c
        if c.rope_freqs:
            self.rope_freqs = RopeFreqs(c.head_dim // 2)
        self.token_embd = Embedding(c.vocab, c.hidden, c.formats["token_embd.weight"], tied=c.tied_embeddings)
        self.blk = nn.ModuleList([Block(i, c) for i in range(c.layers)])
        self.output_norm = RMSNorm(c.hidden, c.rms_eps)
        if not c.tied_embeddings:
            self.output = Linear(c.vocab, c.hidden, c.formats["output.weight"])

    def _logits(self, h):
        if self.c.tied_embeddings:
            return self.token_embd.as_output(h)
        return self.output(h)

    def _body(self, x, cache, keep=None):
        """The layers; keep selects the rows the last layer's feed-forward runs on, as llama.cpp's
        graph does (a prefill's other rows matter only through the KV cache, filled by then)."""
        b, s, _ = x.shape
        rope = (cache.get_query_positions(b * s), self.rope_freqs.weight if self.c.rope_freqs else None)
        for i, block in enumerate(self.blk):
            x = block(x, cache, rope, keep if i == len(self.blk) - 1 else None)
        return self.output_norm(x)

    def embed(self, input_ids: Tensor):
        return self.token_embd(input_ids)

    def prefill(self, input_embed: Tensor, paged_kv_cache: PagedKVCache):
        def last(x):
            return op.tensor_expr_op(
                lambda x: te.compute(
                    (x.shape[0], 1, x.shape[2]),
                    lambda i, j, k: x[i, x.shape[1] - 1, k],
                    name="last_token",
                ),
                "last_token",
                [x],
            )

        return self._logits(self._body(input_embed, paged_kv_cache, last)), paged_kv_cache

    def decode(self, input_embed: Tensor, paged_kv_cache: PagedKVCache):
        return self._logits(self._body(input_embed, paged_kv_cache)), paged_kv_cache

    def batch_prefill(self, input_embeds: Tensor, logit_positions: Tensor, paged_kv_cache: PagedKVCache):
        """MLC's batch_prefill: several sequences' prompts concatenated in one pass; the logits of
        the tokens at logit_positions (each sequence's last), so a server prefills them together."""
        h = self._body(input_embeds, paged_kv_cache, lambda x: op.take(x, logit_positions, axis=1))
        return self._logits(h), paged_kv_cache

    def create_paged_kv_cache(
        self,
        max_batch_size: tirx.Var,
        max_total_seq_len: tirx.Var,
        prefill_chunk_size: tirx.Var,
        page_size: tirx.Var,
        support_sliding_window: tirx.Var,
    ) -> PagedKVCache:
        c = self.c
        return TIRPagedKVCache(
            attn_kind="mha",
            max_batch_size=max_batch_size,
            max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size,
            page_size=page_size,
            support_sliding_window=support_sliding_window,
            layer_partition=relax.ShapeExpr([0, c.layers]),
            num_hidden_layers=c.layers,
            num_attention_heads=c.heads,
            num_key_value_heads=c.kv_heads,
            qk_head_dim=c.head_dim,
            v_head_dim=c.head_dim,
            mla_original_qk_head_dim=0,
            mla_original_v_head_dim=0,
            rope_mode=RopeMode.NONE,  # relaxc.rope has rotated Q and K
            rope_scale=1,
            rope_theta=c.rope_theta,
            rope_scaling={},
            rope_ext_factors=relax.prim_value(0),
            rotary_dim=c.head_dim,
            enable_disaggregation=False,
            dtype="float32",
            target=tvm.target.Target("llvm"),
        )

    def spec(self):
        plain = {"param_mode": "plain", "effect_mode": "none"}
        cache = nn.spec.Object(object_type=PagedKVCache)
        hidden = self.c.hidden
        return nn.spec.ModuleSpec.from_raw(
            {
                "embed": {
                    "input_ids": nn.spec.Tensor(["seq_len"], "int32"),
                    "$": plain,
                },
                "prefill": {
                    "input_embed": nn.spec.Tensor([1, "seq_len", hidden], "float32"),
                    "paged_kv_cache": cache,
                    "$": plain,
                },
                "decode": {
                    "input_embed": nn.spec.Tensor(["batch_size", 1, hidden], "float32"),
                    "paged_kv_cache": cache,
                    "$": plain,
                },
                "batch_prefill": {
                    "input_embeds": nn.spec.Tensor([1, "seq_len", hidden], "float32"),
                    "logit_positions": nn.spec.Tensor(["batch_size"], "int32"),
                    "paged_kv_cache": cache,
                    "$": plain,
                },
                "create_paged_kv_cache": {
                    "max_batch_size": int,
                    "max_total_seq_len": int,
                    "prefill_chunk_size": int,
                    "page_size": int,
                    "support_sliding_window": int,
                    "$": {"param_mode": "none", "effect_mode": "none"},
                },
            },
            self,
        )
