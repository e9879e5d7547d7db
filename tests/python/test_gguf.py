"""LLMs from GGUF files from Python (fixtures/gguf: relaxc.llm's build of a small Llama whose
matrices mix every format): relaxc_weights maps the file and the generation gives TVM's tokens
and logits bit for bit; and the model means what llama.cpp means by the file: an independent
forward pass in numpy over the gguf package's dequantized tensors, with llama.cpp's RoPE on
adjacent pairs of the rows as the file holds them (each frequency divided by the file's
rope_freqs.weight where it has one, as Llama 3's files do), gives the same first logits within
the error of int8 activations.

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


# Weight formats whose dot products llama.cpp takes against activations quantized to int8 per
# block: 32 values (q8_0's blocks) or 256 (q8_K's).
ACTIVATION_BLOCK = {"Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q4_K": 256, "Q6_K": 256}


def int8_activations(x, block):
    """x as llama.cpp's activation quantizers leave it (float32 arithmetic, values rounded to
    even): per 32, scale amax/127 in half precision and values x * 127/amax; per 256, values x *
    -127/max (max the value of largest magnitude, signed) and scale its reciprocal."""
    b = x.astype(np.float32).reshape(x.shape[0], -1, block)
    if block == 32:
        amax = np.abs(b).max(-1, keepdims=True)
        scale = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
        inverse = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    else:
        peak = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)
        inverse = np.where(peak != 0, np.float32(-127) / np.where(peak != 0, peak, 1), 0).astype(np.float32)
        scale = np.where(inverse != 0, np.float32(1) / np.where(inverse != 0, inverse, 1), 0).astype(np.float32)
    q = np.minimum(np.rint(b * inverse), 127)
    return (q * scale).reshape(x.shape).astype(np.float64)


def reference_first_logits(path, prompt, quantize_activations=False, perturbation=0.0, seed=0):
    """The model of the GGUF file in numpy (float64), as llama.cpp computes it: RMS norms, RoPE
    (llama: adjacent pairs of the file's rows, which are in llama.cpp's order; qwen2: NEOX, the two
    halves of Hugging Face's rows), biases where the file has them, grouped-query causal
    attention, SiLU-gated MLP.

    With quantize_activations, the inputs of the quantized matrices are rounded to int8 as
    llama.cpp rounds them; perturbation then scales them by 1 + perturbation * N(0, 1) first, to
    measure how far a float32 rounding's worth of difference moves the logits."""
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(path)
    t, blocks = {}, {}
    rng = np.random.default_rng(seed)
    for tensor in reader.tensors:
        values = dequantize(np.array(tensor.data), tensor.tensor_type).astype(np.float64)
        t[tensor.name] = values.reshape([int(d) for d in reversed(tensor.shape)])
        if quantize_activations and tensor.tensor_type.name in ACTIVATION_BLOCK:
            blocks[tensor.name] = ACTIVATION_BLOCK[tensor.tensor_type.name]
    if "output.weight" not in t:  # tied embeddings
        t["output.weight"] = t["token_embd.weight"]
        if "token_embd.weight" in blocks:
            blocks["output.weight"] = blocks["token_embd.weight"]

    def matmul(h, name):
        if name in blocks:
            if perturbation:
                h = h * (1 + perturbation * rng.standard_normal(h.shape))
            h = int8_activations(h, blocks[name])
        return h @ t[name].T

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
    key_length = reader.get_field(f"{arch}.attention.key_length")
    hd = field(f"{arch}.attention.key_length") if key_length else hidden // heads
    n = len(prompt)

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x):
        pos = np.arange(n)[:, None, None]
        angle = pos * theta ** (-np.arange(0, hd, 2) / hd)
        if "rope_freqs.weight" in t:  # llama3's scaling: each frequency divided by its factor
            angle = angle / t["rope_freqs.weight"]
        if arch in ("qwen2", "qwen3", "phi3"):
            first, second = slice(0, hd // 2), slice(hd // 2, hd)
        else:
            first, second = slice(0, hd, 2), slice(1, hd, 2)
        a, b = x[..., first], x[..., second]
        out = np.empty_like(x)
        out[..., first] = a * np.cos(angle) - b * np.sin(angle)
        out[..., second] = a * np.sin(angle) + b * np.cos(angle)
        return out

    def project(h, name):
        y = matmul(h, name + ".weight")
        return y + t[name + ".bias"] if name + ".bias" in t else y

    x = t["token_embd.weight"][prompt]
    for i in range(layers):
        p = f"blk.{i}."
        h = norm(x, t[p + "attn_norm.weight"])
        if p + "attn_qkv.weight" in t:  # phi3: Q, K and V rows in one matrix
            qkv = matmul(h, p + "attn_qkv.weight")
            q, k, v = np.split(qkv, [heads * hd, (heads + kv_heads) * hd], axis=-1)
            q, k, v = q.reshape(n, heads, hd), k.reshape(n, kv_heads, hd), v.reshape(n, kv_heads, hd)
        else:
            q = project(h, p + "attn_q").reshape(n, heads, hd)
            k = project(h, p + "attn_k").reshape(n, kv_heads, hd)
            v = project(h, p + "attn_v").reshape(n, kv_heads, hd)
        if p + "attn_q_norm.weight" in t:  # qwen3: each head normed before RoPE
            q, k = norm(q, t[p + "attn_q_norm.weight"]), norm(k, t[p + "attn_k_norm.weight"])
        q, k = rope(q), rope(k)
        k, v = (
            np.repeat(k, heads // kv_heads, axis=1),
            np.repeat(v, heads // kv_heads, axis=1),
        )
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", weights, v).reshape(n, heads * hd)
        x = x + matmul(o, p + "attn_output.weight")
        h = norm(x, t[p + "ffn_norm.weight"])
        if p + "ffn_gate.weight" in t:
            gate, up = matmul(h, p + "ffn_gate.weight"), matmul(h, p + "ffn_up.weight")
        else:  # phi3: the gate is the first half of ffn_up's rows
            gate, up = np.split(matmul(h, p + "ffn_up.weight"), 2, axis=-1)
        x = x + matmul(gate / (1 + np.exp(-gate)) * up, p + "ffn_down.weight")
    return matmul(norm(x, t["output_norm.weight"])[-1:], "output.weight")[0]


# Each fixture file and TVM's generation on it (fixtures/gguf/generate.py).
RECORDED = [
    ("tiny_mixed.gguf", "generate.npz"),
    ("tiny_qwen2.gguf", "generate_qwen2.npz"),
    ("tiny_llama3.gguf", "generate_llama3.npz"),
    ("tiny_qwen3.gguf", "generate_qwen3.npz"),
    ("tiny_phi3.gguf", "generate_phi3.npz"),
]


@pytest.mark.parametrize("gguf_file,recorded", RECORDED)
def test_the_model_means_what_llama_cpp_means(gguf_file, recorded):
    """llama (Q and K rows in llama.cpp's order, adjacent pairs rotated), qwen2 (biases on Q, K
    and V, NEOX RoPE on Hugging Face's rows), qwen3 (each head's Q and K RMS-normed, heads wider
    than hidden / heads), phi3 (Q, K and V in one matrix, the gate and up in another) and Llama 3 (RoPE frequency factors, which move these
    logits by 4.3e-2 if they are ignored; tied embeddings)."""
    want = np.load(os.path.join(FIXTURE, recorded))
    prompt = [int(i) for i in want["prompt"]]
    reference = reference_first_logits(os.path.join(FIXTURE, gguf_file), prompt)
    got = want["logits"][0].astype(np.float64)  # relaxc's logits (equal to TVM's: the test above)
    err = np.abs(got - reference).max() / np.abs(reference).max()
    assert err < 2e-2, f"first logits {err:.2e} of the largest from the numpy reference"
    assert int(got.argmax()) == int(reference.argmax())


@pytest.mark.parametrize(
    "gguf_file,recorded",
    [
        ("tiny_mixed.gguf", "generate.npz"),
        ("tiny_qwen2.gguf", "generate_qwen2.npz"),
        ("tiny_qwen3.gguf", "generate_qwen3.npz"),
        ("tiny_phi3.gguf", "generate_phi3.npz"),
    ],
)
def test_activations_are_rounded_as_llama_cpp_rounds_them(gguf_file, recorded):
    """With the reference's activations rounded to int8 as llama.cpp's quantizers round them,
    relaxc's logits come within float32 noise of it: the same blocks, scales and roundings.
    (Not the Llama 3 fixture: TVM evaluates Llama 3's RoPE scaling in float32 in a few more steps,
    enough to send an activation across a rounding boundary, 4.6e-3 here; llama.cpp itself is
    7.1e-3 from this reference on that file.)"""
    want = np.load(os.path.join(FIXTURE, recorded))
    prompt = [int(i) for i in want["prompt"]]
    reference = reference_first_logits(os.path.join(FIXTURE, gguf_file), prompt, quantize_activations=True)
    got = want["logits"][0].astype(np.float64)
    err = np.abs(got - reference).max() / np.abs(reference).max()
    assert err < 1e-5, f"first logits {err:.2e} of the largest from the int8-activation reference"


# llama-cpp-python 0.3.36 does not load the tiny phi3 file (its vocabulary loader fails on it).
@pytest.mark.parametrize("gguf_file,recorded", [r for r in RECORDED if "phi3" not in r[0]])
def test_llama_cpp_itself_gives_the_same_first_logits(gguf_file, recorded):
    """llama.cpp (llama-cpp-python, its KV cache in f32 as relaxc's) on the same file: the first
    logits within 5e-2 of the largest and the same argmax (bit for bit where its build sums as
    relaxc's AVX2 kernels do; an AVX-512 build rounds its int8 activations' sums otherwise)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the peer compared with")
    want = np.load(os.path.join(FIXTURE, recorded))
    prompt = [int(i) for i in want["prompt"]]
    llm = llama_cpp.Llama(
        model_path=os.path.join(FIXTURE, gguf_file),
        n_ctx=64,
        logits_all=True,
        verbose=False,
        n_threads=1,
        type_k=0,  # GGML_TYPE_F32
        type_v=0,
    )
    llm.eval(prompt)
    theirs = np.array(llm.scores[len(prompt) - 1], np.float64)
    got = want["logits"][0].astype(np.float64)
    err = np.abs(got - theirs).max() / np.abs(theirs).max()
    print(f"{gguf_file}: first logits {err:.2e} of the largest from llama.cpp's")
    assert err < 5e-2 and int(got.argmax()) == int(theirs.argmax())
