"""LLMs from GGUF files from Python (fixtures/gguf: relaxc.llm's build of a small Llama whose
matrices mix every format): relaxc_weights maps the file and the generation gives TVM's tokens
and logits bit for bit; and the model means what llama.cpp means by the file: an independent
forward pass in numpy over the gguf package's dequantized tensors, with llama.cpp's RoPE on
adjacent pairs of the rows as the file holds them, gives the same first logits within the error
of int8 activations.

Needs numpy, pytest, apache-tvm-ffi and gguf (no TVM).
"""

import os

import numpy as np
import pytest
import tvm_ffi
from test_tvm_ffi import MODES, ROOT, relaxc_binary

gguf = pytest.importorskip(
    "gguf",
    reason="the gguf package (pip install gguf) reads the fixture for the reference",
)

FIXTURE = os.path.join(ROOT, "fixtures", "gguf")
GGUF = os.path.join(FIXTURE, "tiny_mixed.gguf")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import subprocess

    out = tmp_path_factory.mktemp("gguf")
    built = {}
    for mode in MODES:
        so = str(out / f"gguf.{mode}.so")
        subprocess.run(
            [
                relaxc_binary(),
                "compile",
                os.path.join(FIXTURE, "m.tar"),
                "--exec-mode",
                mode,
                "-o",
                so,
            ],
            check=True,
        )
        built[mode] = so
    return built


def generate(m, prompt, n):
    call = m["relaxc_call"]
    w = {
        fn: m["relaxc_weights"](GGUF, fn, k)
        for fn, k in [("embed", 1), ("prefill", 2), ("decode", 2)]
    }
    kv = m["create_paged_kv_cache"](*[tvm_ffi.Shape([v]) for v in [1, 128, 32, 16, 0]])
    call("vm.builtin.kv_state_add_sequence", kv, 0)

    def step(fn, ids):
        embeds = np.from_dlpack(
            m["embed"](tvm_ffi.from_dlpack(np.array(ids, "int32")), *w["embed"])
        )
        embeds = np.ascontiguousarray(embeds.reshape(1, len(ids), -1))
        call(
            "vm.builtin.kv_state_begin_forward",
            kv,
            tvm_ffi.Shape([0]),
            tvm_ffi.Shape([len(ids)]),
        )
        out = m[fn](tvm_ffi.from_dlpack(embeds), kv, *w[fn])
        call("vm.builtin.kv_state_end_forward", kv)
        return np.from_dlpack(out[0])[0, 0].copy()

    logits = [step("prefill", prompt)]
    tokens = [int(logits[-1].argmax())]
    while len(tokens) < n:
        logits.append(step("decode", [tokens[-1]]))
        tokens.append(int(logits[-1].argmax()))
    return tokens, np.stack(logits)


@pytest.mark.parametrize("mode", MODES)
def test_generation_from_python_gives_tvms_tokens(models, mode):
    want = np.load(os.path.join(FIXTURE, "generate.npz"))
    m = tvm_ffi.load_module(models[mode])
    tokens, logits = generate(m, [int(t) for t in want["prompt"]], len(want["tokens"]))
    assert tokens == [int(t) for t in want["tokens"]]
    assert logits.tobytes() == want["logits"].tobytes()
    with pytest.raises(Exception, match="nowhere.gguf"):
        m["relaxc_weights"](os.path.join(FIXTURE, "nowhere.gguf"), "embed", 1)


def reference_first_logits(path, prompt):
    """The model of the GGUF file in numpy (float64), as llama.cpp computes a llama: RMS norms,
    RoPE rotating adjacent pairs (the file's Q and K rows are in that order), grouped-query
    causal attention, SiLU-gated MLP."""
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(path)
    t = {}
    for tensor in reader.tensors:
        values = dequantize(np.array(tensor.data), tensor.tensor_type).astype(
            np.float64
        )
        t[tensor.name] = values.reshape([int(d) for d in reversed(tensor.shape)])

    def field(key):
        f = reader.get_field(key)
        return f.parts[f.data[0]].tolist()[0]

    hidden, layers = field("llama.embedding_length"), field("llama.block_count")
    heads, kv_heads = (
        field("llama.attention.head_count"),
        field("llama.attention.head_count_kv"),
    )
    eps, theta = (
        field("llama.attention.layer_norm_rms_epsilon"),
        field("llama.rope.freq_base"),
    )
    hd = hidden // heads
    n = len(prompt)

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(
        x,
    ):  # x [n, heads, hd], pairs (2i, 2i + 1) rotated by pos * theta^(-2i / hd)
        pos = np.arange(n)[:, None, None]
        freq = theta ** (-np.arange(0, hd, 2) / hd)
        angle = pos * freq
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * np.cos(angle) - b * np.sin(angle)
        out[..., 1::2] = a * np.sin(angle) + b * np.cos(angle)
        return out

    x = t["token_embd.weight"][prompt]
    for i in range(layers):
        p = f"blk.{i}."
        h = norm(x, t[p + "attn_norm.weight"])
        q = rope((h @ t[p + "attn_q.weight"].T).reshape(n, heads, hd))
        k = rope((h @ t[p + "attn_k.weight"].T).reshape(n, kv_heads, hd))
        v = (h @ t[p + "attn_v.weight"].T).reshape(n, kv_heads, hd)
        k, v = (
            np.repeat(k, heads // kv_heads, axis=1),
            np.repeat(v, heads // kv_heads, axis=1),
        )
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", weights, v).reshape(n, hidden)
        x = x + o @ t[p + "attn_output.weight"].T
        h = norm(x, t[p + "ffn_norm.weight"])
        gate, up = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + "ffn_down.weight"].T
    return norm(x, t["output_norm.weight"])[-1] @ t["output.weight"].T


def test_the_model_means_what_llama_cpp_means():
    want = np.load(os.path.join(FIXTURE, "generate.npz"))
    prompt = [int(i) for i in want["prompt"]]
    reference = reference_first_logits(GGUF, prompt)
    got = want["logits"][0].astype(
        np.float64
    )  # relaxc's logits (equal to TVM's: the test above)
    err = np.abs(got - reference).max() / np.abs(reference).max()
    assert err < 2e-2, f"first logits {err:.2e} of the largest from the numpy reference"
    assert int(got.argmax()) == int(reference.argmax())
