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
    w = {fn: m["relaxc_weights"](GGUF, fn, k) for fn, k in [("embed", 1), ("prefill", 2), ("decode", 2)]}
    kv = m["create_paged_kv_cache"](*[tvm_ffi.Shape([v]) for v in [1, 128, 32, 16, 0]])
    call("vm.builtin.kv_state_add_sequence", kv, 0)

    def step(fn, ids):
        embeds = np.from_dlpack(m["embed"](tvm_ffi.from_dlpack(np.array(ids, "int32")), *w["embed"]))
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
    """The model of the GGUF file in numpy (float64), as llama.cpp computes it: RMS norms, RoPE
    (llama: adjacent pairs of the file's rows, which are in llama.cpp's order; qwen2: NEOX, the two
    halves of Hugging Face's rows), biases where the file has them, grouped-query causal
    attention, SiLU-gated MLP."""
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(path)
    t = {}
    for tensor in reader.tensors:
        values = dequantize(np.array(tensor.data), tensor.tensor_type).astype(np.float64)
        t[tensor.name] = values.reshape([int(d) for d in reversed(tensor.shape)])
    t.setdefault("output.weight", t["token_embd.weight"])  # tied embeddings

    def field(key):
        f = reader.get_field(key)
        return f.parts[f.data[0]].tolist()[0]

    arch_field = reader.get_field("general.architecture")
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    hidden, layers = field(f"{arch}.embedding_length"), field(f"{arch}.block_count")
    heads, kv_heads = (
        field(f"{arch}.attention.head_count"),
        field(f"{arch}.attention.head_count_kv"),
    )
    eps, theta = (
        field(f"{arch}.attention.layer_norm_rms_epsilon"),
        field(f"{arch}.rope.freq_base"),
    )
    hd = hidden // heads
    n = len(prompt)

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x):
        pos = np.arange(n)[:, None, None]
        angle = pos * theta ** (-np.arange(0, hd, 2) / hd)
        if arch == "qwen2":
            first, second = slice(0, hd // 2), slice(hd // 2, hd)
        else:
            first, second = slice(0, hd, 2), slice(1, hd, 2)
        a, b = x[..., first], x[..., second]
        out = np.empty_like(x)
        out[..., first] = a * np.cos(angle) - b * np.sin(angle)
        out[..., second] = a * np.sin(angle) + b * np.cos(angle)
        return out

    def project(h, name):
        y = h @ t[name + ".weight"].T
        return y + t[name + ".bias"] if name + ".bias" in t else y

    x = t["token_embd.weight"][prompt]
    for i in range(layers):
        p = f"blk.{i}."
        h = norm(x, t[p + "attn_norm.weight"])
        q = rope(project(h, p + "attn_q").reshape(n, heads, hd))
        k = rope(project(h, p + "attn_k").reshape(n, kv_heads, hd))
        v = project(h, p + "attn_v").reshape(n, kv_heads, hd)
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


@pytest.mark.parametrize(
    "gguf_file,recorded",
    [("tiny_mixed.gguf", "generate.npz"), ("tiny_qwen2.gguf", "generate_qwen2.npz")],
)
def test_the_model_means_what_llama_cpp_means(gguf_file, recorded):
    """llama (Q and K rows in llama.cpp's order, adjacent pairs rotated) and qwen2 (biases on Q,
    K and V, NEOX RoPE on Hugging Face's rows)."""
    want = np.load(os.path.join(FIXTURE, recorded))
    prompt = [int(i) for i in want["prompt"]]
    reference = reference_first_logits(os.path.join(FIXTURE, gguf_file), prompt)
    got = want["logits"][0].astype(np.float64)  # relaxc's logits (equal to TVM's: the test above)
    err = np.abs(got - reference).max() / np.abs(reference).max()
    assert err < 2e-2, f"first logits {err:.2e} of the largest from the numpy reference"
    assert int(got.argmax()) == int(reference.argmax())
