"""The kernels that reproduce llama.cpp's arithmetic for relaxc.llm's GGUF models, bit for bit
against numpy models of what llama.cpp computes, in each of the forms its x86 build has:
- relaxc.swiglu: ggml's vector exp (the 16-lane AVX-512 form, the 8-lane AVX2 one whose bits the
  4-lane NEON and portable forms share), libm's expf on each row's tail;
- relaxc.rope: angles multiplied up from the position pair by pair (libm's powf, sinf, cosf),
  two fused multiply-adds per pair, adjacent pairs ("normal") or halves ("neox"), frequency
  divisors and a linear scale;
- the attention kernels' _ggml twins: ggml_vec_dot_f32's four accumulators and its reduction
  tree, the softmax's register sums added in double, tinyBLAS's lane accumulators and hsum
  (ragged prefill, causal, and paged decode; head dims with and without a tail).
Each form runs in a process of its own (RELAXC_QUANT_ISA picks a lesser one than the CPU's), at
1, 2 and 3 threads. bench/llm_gguf.py checks the whole model against llama.cpp's logits, and
tests/python/test_llama_cpp_kernels.py compares relaxc.swiglu with llama.cpp's own function
where llama-cpp-python is installed.

The model's fused multiply-adds are computed in float64 and rounded once to float32: the product
of two floats is exact there, so only a sum landing on a float32 tie could round twice, which
these fixed inputs do not do (the reference would then disagree on that one value, and say so).
Needs numpy, pytest and apache-tvm-ffi (no TVM).
"""

import ctypes
import ctypes.util
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_each_raises, build_kernel_library, unpinned_env
from test_attention import page_table
from test_kernels import t

F32, U32 = np.float32, np.uint32
# ggml's exp constants (Arm's expf), as float32.
C = {
    name: np.float32(float.fromhex(v))
    for name, v in {
        "shift": "0x1.8p23",
        "log2e": "0x1.715476p+0",
        "ln2_hi": "0x1.62e4p-1",
        "ln2_lo": "0x1.7f7d1cp-20",
        "c1": "0x1.ffffecp-1",
        "c2": "0x1.fffdb6p-2",
        "c3": "0x1.555e66p-3",
        "c4": "0x1.573e2ep-5",
        "c5": "0x1.0e4020p-7",
    }.items()
}

SCRIPT = r"""
import sys, numpy as np, tvm_ffi
path, dest = sys.argv[1], sys.argv[2]
names = dict(l.split("\t") for l in open(path + ".tsv").read().splitlines())
lib = tvm_ffi.load_module(path)
swiglu, rope = lib[names["relaxc.swiglu"]], lib[names["relaxc.rope"]]
ragged, decode = lib[names["relaxc.attention_ragged_ggml"]], lib[names["relaxc.attention_paged_decode_ggml"]]
t = lambda a: tvm_ffi.from_dlpack(np.ascontiguousarray(a))
cases = np.load(dest + ".in.npz")
res = {}
for name in cases.files:
    if name.startswith("swiglu_") and not name.endswith("_up"):
        out = np.zeros_like(cases[name])
        swiglu(t(cases[name]), t(cases[name + "_up"]), t(out))
        res[name] = out
    if name.startswith("rope_") and name.endswith("_x"):
        case = name[:-2]
        out = np.zeros_like(cases[name])
        factors = cases[case + "_factors"] if case + "_factors" in cases.files else None
        mode = "neox" if "neox" in case else "normal"
        rope(t(cases[name]), t(cases[case + "_positions"]), None if factors is None else t(factors), mode,
             t(cases[case + "_params"]), t(out))
        res[case] = out
    if name.startswith("ragged_") and name.endswith("_q"):
        case = name[:-2]
        q, k, v = cases[name], cases[case + "_k"], cases[case + "_v"]
        out, lse = np.zeros_like(q), np.zeros(q.shape[:2], np.float32)
        ind = np.array([0, len(q)], np.int32)
        zeros = t(np.zeros(len(q), np.int32))
        ragged(t(q), t(ind), t(k), t(v), t(ind), zeros, t(np.zeros(1, np.int32)), t(out), t(lse), 1, 0, 1.0, 1e4,
               float(cases[case + "_scale"]))
        res[case] = out
    if name.startswith("decode_") and name.endswith("_q"):
        case = name[:-2]
        q = cases[name]
        out, lse = np.zeros_like(q), np.zeros(q.shape[:2], np.float32)
        zeros = t(np.zeros(len(q), np.int32))
        decode(t(q), t(cases[case + "_pages"]), t(cases[case + "_indptr"]), t(cases[case + "_ids"]),
               t(cases[case + "_last"]), zeros, zeros, t(out), t(lse), 0, 1.0, 1e4, float(cases[case + "_scale"]))
        res[case] = out
np.savez(dest, **res)
"""


def fma(a, b, c):
    """a * b + c rounded once to float32 (see the module's note)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F32)


def ggml_exp(x, form):
    """ggml_v_expf lane by lane: "avx512" (the 1 inside the polynomial, scaled by vscalefps) or
    "fma" (the AVX2 and NEON form: the 1 in the last multiply-add, 2^n built in the exponent)."""
    with np.errstate(over="ignore", invalid="ignore"):
        z = fma(x, C["log2e"], C["shift"])
        n = z - C["shift"]
        b = fma(-n, C["ln2_lo"], fma(-n, C["ln2_hi"], x))
        u = b * b
        poly = fma(fma(C["c5"], b, C["c4"]), u, fma(C["c3"], b, C["c2"]))
        if form == "avx512":
            j = fma(poly, u, fma(C["c1"], b, np.float32(1)))
            out = np.ldexp(j, n.astype(np.int32)).astype(F32)
            return np.where(np.abs(n) > 192, np.where(n <= 0, F32(0), F32(np.inf)), out).astype(F32)
        e = z.view(U32) << U32(23)
        k = (e + np.float32(1).view(U32)).view(F32)
        j = fma(poly, u, C["c1"] * b)
        out = fma(j, k, k)
        g = np.where(n <= 0, U32(0x82000000), U32(0)).astype(U32)
        s1, s2 = (g + U32(0x7F000000)).view(F32), (e - g).view(F32)
        out = np.where(np.abs(n) > 126, fma(s2, j, s2) * s1, out)
        return np.where(np.abs(n) > 192, s1 * s1, out).astype(F32)


def libm_expf():
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    return libm.expf


def reference(gate, up, form, lanes):
    """ggml_vec_swiglu_f32 row by row: whole registers by the vector exp, the tail by expf."""
    cols = gate.shape[-1]
    whole = cols - cols % lanes
    out = np.empty_like(gate)
    with np.errstate(over="ignore"):
        e = ggml_exp((F32(0) - gate[..., :whole]).astype(F32), form)
        out[..., :whole] = gate[..., :whole] / (F32(1) + e) * up[..., :whole]
    expf = libm_expf()
    for idx in np.ndindex(*gate.shape[:-1], cols - whole):
        at = (*idx[:-1], whole + idx[-1])
        g = gate[at]
        out[at] = g / (F32(1) + F32(expf(float(-g)))) * up[at]
    return out


def libm_function(name, nargs):
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    fn = getattr(libm, name)
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float] * nargs
    return fn


def rope_reference(x, positions, params, factors, mode):
    """ggml's rope_f32: per position, the angle multiplied by theta^(-2/d) pair by pair."""
    powf, cosf, sinf = libm_function("powf", 2), libm_function("cosf", 1), libm_function("sinf", 1)
    theta_base, freq_scale, attn_factor = (F32(v) for v in params)
    d = x.shape[-1]
    half = d // 2
    theta_scale = F32(powf(theta_base, F32(-2.0) / F32(d)))
    out = np.empty_like(x)
    for row, position in enumerate(positions):
        theta, cos, sin = F32(position), np.empty(half, F32), np.empty(half, F32)
        for i in range(half):
            extrapolated = theta / factors[i] if factors is not None else theta
            angle = F32(freq_scale * F32(extrapolated))
            cos[i], sin[i] = F32(cosf(angle)) * attn_factor, F32(sinf(angle)) * attn_factor
            theta = F32(theta * theta_scale)
        heads = x[0, row]
        first, second = (heads[:, 0::2], heads[:, 1::2]) if mode == "normal" else (heads[:, :half], heads[:, half:])
        rotated = (fma(first, cos, -(second * sin)), fma(first, sin, second * cos))
        if mode == "normal":
            out[0, row, :, 0::2], out[0, row, :, 1::2] = rotated
        else:
            out[0, row, :, :half], out[0, row, :, half:] = rotated
    return out


def tree8(lanes):
    """tinyBLAS's and the softmax's hsum of 8 lanes (the last axis)."""
    x = lanes
    return ((x[..., 0] + x[..., 4]) + (x[..., 2] + x[..., 6])) + ((x[..., 1] + x[..., 5]) + (x[..., 3] + x[..., 7]))


def reduce16(lanes):
    """GCC's _mm512_reduce_add_ps over the last axis: halves, quarters, then (0 + 2) + (1 + 3)."""
    half = lanes[..., 8:] + lanes[..., :8]
    quarter = half[..., 4:] + half[..., :4]
    return (quarter[..., 0] + quarter[..., 2]) + (quarter[..., 1] + quarter[..., 3])


def dot_reference(x, y, lanes):
    """ggml_vec_dot_f32 along the last axis: four accumulators over runs of 4 registers, (0 + 2)
    + (1 + 3), the register's lanes (AVX2: the halves, then two horizontal adds), the rest one
    fused product at a time."""
    x, y = np.broadcast_arrays(x, y)
    n, step = x.shape[-1], 4 * lanes
    whole = n - n % step
    acc = np.zeros(x.shape[:-1] + (4, lanes), F32)
    for i in range(0, whole, step):
        for a in range(4):
            at = slice(i + a * lanes, i + (a + 1) * lanes)
            acc[..., a, :] = fma(x[..., at], y[..., at], acc[..., a, :])
    lane = (acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])
    if lanes == 16:
        total = reduce16(lane)
    else:
        half = lane[..., :4] + lane[..., 4:]
        total = (half[..., 0] + half[..., 1]) + (half[..., 2] + half[..., 3])
    for i in range(whole, n):
        total = fma(x[..., i], y[..., i], total)
    return total.astype(F32)


def attention_reference(q, keys, values, scale, form):
    """One query row's heads [hq, d] against its visible key and value rows [n, hkv, d], as
    llama.cpp computes them (f32 KV cache, no flash attention)."""
    lanes = 16 if form == "avx512" else 8
    tree = reduce16 if lanes == 16 else tree8
    hq, hkv, n = q.shape[0], keys.shape[1], keys.shape[0]
    out = np.empty_like(q)
    for h in range(hq):
        g = h // (hq // hkv)
        s = (dot_reference(keys[:, g, :], q[h][None, :], lanes) * F32(scale)).astype(F32)
        e = ggml_exp((s - s.max()).astype(F32), "avx512" if form == "avx512" else "fma")
        padded = np.zeros(-(-n // lanes) * lanes, F32)
        padded[:n] = e
        total = 0.0
        for chunk in tree(padded.reshape(-1, lanes)):
            total += float(chunk)
        p = (e * F32(1.0 / total)).astype(F32)
        acc = np.zeros((lanes, q.shape[1]), F32)
        for r in range(n):
            acc[r % lanes] = fma(values[r, g], p[r], acc[r % lanes])
        out[h] = tree(acc.T)
    return out


def expected(inputs, case, isa):
    """What llama.cpp's arithmetic gives for a case of cases(), in the form relaxc runs with isa."""
    form, lanes = form_of(isa)
    if case.startswith("swiglu_"):
        return reference(inputs[case], inputs[case + "_up"], form, lanes)
    if case.startswith("rope_"):
        factors = inputs.get(case + "_factors")
        mode = "neox" if "neox" in case else "normal"
        return rope_reference(inputs[case + "_x"], inputs[case + "_positions"], inputs[case + "_params"], factors, mode)
    attention_form = "avx512" if form == "avx512" else "avx2"
    q, scale = inputs[case + "_q"], inputs[case + "_scale"]
    out = np.empty_like(q)
    if case.startswith("ragged_"):
        k, v = inputs[case + "_k"], inputs[case + "_v"]
        for row in range(len(q)):
            out[row] = attention_reference(q[row], k[: row + 1], v[: row + 1], scale, attention_form)
        return out
    for b in range(len(q)):
        out[b] = attention_reference(
            q[b], inputs[f"{case}_keys{b}"], inputs[f"{case}_values{b}"], scale, attention_form
        )
    return out


def cases():
    rng = np.random.default_rng(29)
    special = np.array(
        [
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            0.5,
            -0.5,
            9.0,
            -9.0,
            20.0,
            -20.0,
            80.0,
            -80.0,
            87.0,
            -87.0,
            88.5,
            -88.5,
            95.0,
            -95.0,
            104.0,
            -104.0,
            130.0,
            -130.0,
            200.0,
            -200.0,
        ],
        F32,
    )
    wide = np.concatenate([special, *(rng.standard_normal(400) * s for s in (1, 3, 10, 40))]).astype(F32)
    out = {
        "swiglu_decode": rng.standard_normal((1, 2816)).astype(F32) * 3,  # whole registers only
        "swiglu_tails": rng.standard_normal((7, 45)).astype(F32) * 4,  # 45 = 2*16 + 13 = 5*8 + 5 = 11*4 + 1
        "swiglu_wide": wide.reshape(1, -1),
        "swiglu_batch": rng.standard_normal((3, 5, 301)).astype(F32),
        "swiglu_prefill": rng.standard_normal((40, 1000)).astype(F32),  # several units of work per thread
    }
    for name in list(out):
        out[name + "_up"] = rng.standard_normal(out[name].shape).astype(F32)
    for case, heads, d, factors, scale, theta in [
        ("rope_normal", 4, 64, None, 1.0, 10000.0),
        ("rope_neox", 3, 128, None, 1.0, 1e6),
        ("rope_normal_factors", 2, 64, 1.0 + rng.random(32).astype(F32) * 7, 1.0, 5e5),
        ("rope_neox_linear", 2, 32, None, 4.0, 10000.0),
    ]:
        positions = np.concatenate([np.arange(9), [100, 4095, 70000]]).astype(np.int32)
        out[case + "_x"] = (rng.standard_normal((1, len(positions), heads, d)) * 2).astype(F32)
        out[case + "_positions"] = positions
        out[case + "_params"] = np.array([theta, 1.0 / scale, 1.0], F32)
        if factors is not None:
            out[case + "_factors"] = factors.astype(F32)
    for case, rows, hq, hkv, d in [
        ("ragged_64", 37, 4, 2, 64),
        ("ragged_80", 21, 6, 2, 80),
        ("ragged_128", 19, 2, 1, 128),
        ("ragged_40", 23, 10, 2, 40),  # five heads a KV head: four side by side, then one; a lone register
        ("ragged_44", 9, 3, 1, 44),  # three heads a KV head; a head dim past the last register
    ]:
        out[case + "_q"] = rng.standard_normal((rows, hq, d)).astype(F32)
        out[case + "_k"] = rng.standard_normal((rows, hkv, d)).astype(F32)
        out[case + "_v"] = rng.standard_normal((rows, hkv, d)).astype(F32)
        out[case + "_scale"] = np.float32(1.0) / np.sqrt(np.float32(d))
    for case, lengths, hq, hkv, d in [
        ("decode_64", [21, 40, 3, 150], 8, 2, 64),  # 150: value rows in three blocks, the last partial
        ("decode_48", [33], 4, 4, 48),
        ("decode_160", [70], 4, 1, 160),  # values in two runs of columns
    ]:
        pages, indptr, ids, last, keys, values = page_table(rng, lengths, hkv, d, 16)
        out[case + "_q"] = rng.standard_normal((len(lengths), hq, d)).astype(F32)
        out.update({case + "_pages": pages, case + "_indptr": indptr, case + "_ids": ids, case + "_last": last})
        out[case + "_scale"] = np.float32(1.0) / np.sqrt(np.float32(d))
        for b, (k, v) in enumerate(zip(keys, values)):
            out[f"{case}_keys{b}"], out[f"{case}_values{b}"] = k, v
    return out


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def form_of(isa):
    """(form, lanes) relaxc.swiglu runs with RELAXC_QUANT_ISA=isa (None: the CPU's best)."""
    flags = cpu_flags()
    x86_avx2 = {"avx2", "fma"} <= flags
    if x86_avx2 and isa is None and {"avx512f", "avx512dq"} <= flags:
        return "avx512", 16
    if x86_avx2 and isa in (None, "avx2"):
        return "fma", 8
    return "fma", 4


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("swiglu")
    path = str(tmp / "lib.so")
    build_kernel_library(path)
    (tmp / "run.py").write_text(SCRIPT)
    inputs = cases()

    def run(isa, threads):
        dest = str(tmp / f"{isa}_{threads}.npz")
        np.savez(dest + ".in.npz", **inputs)
        env = unpinned_env(TVM_NUM_THREADS=str(threads))
        if isa:
            env["RELAXC_QUANT_ISA"] = isa
        subprocess.run([sys.executable, str(tmp / "run.py"), path, dest], check=True, env=env)
        return dict(np.load(dest))

    return inputs, run


@pytest.mark.parametrize("isa", [None, "avx2", "portable"])
def test_each_form_gives_ggml_bits_at_any_thread_count(runner, isa):
    inputs, run = runner
    form, lanes = form_of(isa)
    by_threads = {threads: run(isa, threads) for threads in (1, 2, 3)}
    for name, got in by_threads[1].items():
        want = expected(inputs, name, isa)
        differ = np.flatnonzero(got.view(U32) != want.view(U32))
        assert differ.size == 0, (
            f"{name} ({form}, {lanes} lanes): {differ.size} of {got.size} values differ from llama.cpp's "
            f"arithmetic, first at flat index {differ[0]}: {got.flat[differ[0]]!r} against {want.flat[differ[0]]!r}"
        )
        for threads in (2, 3):
            assert np.array_equal(got.view(U32), by_threads[threads][name].view(U32)), f"{name}: {threads} threads"


def test_swiglu_close_to_the_formula(library):
    rng = np.random.default_rng(4)
    gate, up = rng.standard_normal((9, 77)).astype(F32) * 5, rng.standard_normal((9, 77)).astype(F32)
    out = np.zeros_like(gate)
    library["relaxc.swiglu"](t(gate), t(up), t(out))
    g = gate.astype(np.float64)
    want = g / (1 + np.exp(-g)) * up
    assert np.abs(out - want).max() <= 1e-6 * np.abs(want).max()


def test_swiglu_errors_name_the_argument(library):
    swiglu = library["relaxc.swiglu"]
    x = np.zeros((2, 8), F32)
    cases = [
        (lambda: swiglu(t(x), t(np.zeros((2, 9), F32)), t(x)), ValueError, "up must have gate's shape"),
        (lambda: swiglu(t(x), t(x), t(np.zeros((8,), F32))), ValueError, "out must have gate's shape"),
        (lambda: swiglu(t(x), t(x.astype(np.float16)), t(x)), TypeError, "up"),
        (lambda: swiglu(t(x), t(x)), TypeError, "expects 3 arguments, got 2"),
    ]
    assert_each_raises(cases)


def test_rope_errors_name_the_argument(library):
    rope = library["relaxc.rope"]
    x = np.zeros((1, 3, 2, 8), F32)
    positions, params = np.arange(3, dtype=np.int32), np.array([1e4, 1, 1], F32)

    def call(x=x, positions=positions, factors=None, mode="normal", params=params, out=None):
        out = np.zeros_like(x) if out is None else out
        return lambda: rope(t(x), t(positions), None if factors is None else t(factors), mode, t(params), t(out))

    cases = [
        (call(mode="gptj"), ValueError, "mode"),
        (call(positions=np.arange(4, dtype=np.int32)), ValueError, "one position per row of x"),
        (call(positions=np.arange(3, dtype=np.int64)), TypeError, "positions"),
        (call(factors=np.ones(3, F32)), ValueError, "freq_factors must hold head_dim / 2 values"),
        (call(x=np.zeros((1, 3, 2, 7), F32), out=np.zeros((1, 3, 2, 7), F32)), ValueError, "even"),
        (call(out=np.zeros((1, 3, 2, 6), F32)), ValueError, "out must have x's shape"),
        (call(params=np.ones(2, F32)), ValueError, "[theta, freq_scale, attn_factor]"),
    ]
    assert_each_raises(cases)
