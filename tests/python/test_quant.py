"""relaxc's quantized kernels (relaxc.dense_q, relaxc.take_q) against the gguf package's own
dequantization: weights in GGUF's formats (f32, f16, q8_0, q4_0, q4_K, q6_K) used in place, at
decode shapes (one row) and prefill shapes (many), with a bias, batch axes, errors, and the same
bits at 1, 2 and 3 threads.

The integer formats quantize the activations first (int8, one scale per 32 values for q8_0 and
q4_0, per 256 for the K formats), as llama.cpp does; the reference here quantizes them the same
way in numpy and multiplies by the exactly dequantized weights, so what remains is float
rounding: a wrong bit in the unpacking or the integer sums would show as an error of the order
of the weights. Needs numpy, pytest, apache-tvm-ffi and gguf (no TVM).
"""

import os
import platform
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_each_raises, unpinned_env
from test_ggml_arithmetic import cpu_flags, fma, tree8
from test_kernels import ROOT as _ROOT
from test_kernels import t
from test_tvm_ffi import relaxc_binary

gguf = pytest.importorskip(
    "gguf",
    reason="the gguf package (pip install gguf) is the reference for GGUF's formats",
)
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize
from relaxc.llm.quantize import REGROUPINGS

FORMATS = {
    "f32": T.F32,
    "f16": T.F16,
    "q8_0": T.Q8_0,
    "q4_0": T.Q4_0,
    "q4_K": T.Q4_K,
    "q6_K": T.Q6_K,
    # What llama.cpp's quantizer falls back to where rows are not whole 256-value super-blocks.
    "q4_1": T.Q4_1,
    "q5_0": T.Q5_0,
    "q5_1": T.Q5_1,
}
# Values per scale of the quantized activations, per format; per block of weights.
ACT_BLOCK = {
    "q8_0": 32,
    "q4_0": 32,
    "q4_K": 256,
    "q6_K": 256,
    "q4_1": 32,
    "q5_0": 32,
    "q5_1": 32,
}
BLOCK = {"f32": 1, "f16": 1, **ACT_BLOCK}


def random_k_blocks(rng, rows, k, fmt):
    """Rows of random K-format super-blocks with sane scales (the gguf package cannot quantize
    these): random bits everywhere, then the f16 scales set to small positive values."""
    size = {"q4_K": 144, "q6_K": 210}[fmt]
    raw = rng.integers(0, 256, (rows, k // 256, size), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.5, (rows, k // 256)) * 1e-2).astype(np.float16).view(np.uint8).reshape(rows, k // 256, 2)
    if fmt == "q4_K":
        raw[:, :, 0:2] = d
        dmin = (
            (rng.uniform(0.5, 1.5, (rows, k // 256)) * 1e-2)
            .astype(np.float16)
            .view(np.uint8)
            .reshape(rows, k // 256, 2)
        )
        raw[:, :, 2:4] = dmin
    else:
        raw[:, :, 208:210] = d
    return raw.reshape(rows, -1)


def weights(rng, n, k, fmt):
    """(the weights as the kernel takes them, their exact values as float64)."""
    if fmt in ("q4_K", "q6_K"):
        w = random_k_blocks(rng, n, k, fmt)
    else:
        w = quantize(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k), FORMATS[fmt])
    return w, dequantize(w, FORMATS[fmt]).astype(np.float64)


def quantized_activations(x, block):
    """x as the kernel sees it, quantized as llama.cpp quantizes activations: per 32 values the
    scale amax / 127 in half precision, per 256 the float 1 / (-127 / max) of the signed value of
    largest magnitude; values rounded to even."""
    rows = x.reshape(-1, block).astype(np.float32)
    at = np.abs(rows).argmax(axis=1)
    signed_max = rows[np.arange(len(rows)), at][:, None]
    amax = np.abs(signed_max)
    safe = np.where(amax > 0, amax, 1).astype(np.float32)
    if block == 32:
        inverse = np.where(amax > 0, np.float32(127) / safe, 0).astype(np.float32)
        scale = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    else:
        inverse = np.where(amax > 0, np.float32(-127) / np.where(amax > 0, signed_max, 1), 0).astype(np.float32)
        scale = np.where(amax > 0, np.float32(1) / np.where(amax > 0, inverse, 1), 0).astype(np.float32)
    q = np.minimum(np.rint(rows * inverse), 127)
    return (q.astype(np.float64) * scale.astype(np.float64)).reshape(x.shape)


def dense_reference(x, w_exact, fmt, bias=None):
    xs = x if fmt not in ACT_BLOCK else quantized_activations(x, ACT_BLOCK[fmt])
    y = xs.astype(np.float64) @ w_exact.T
    return y if bias is None else y + bias


def assert_close(got, want, tol):
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= tol * scale, f"{err:.3e} from the reference (scale {scale:.3g})"


@pytest.mark.parametrize("fmt", list(FORMATS))
def dense_matches_reference(library, rng, fmt, m, n, k):
    """relaxc.dense_q on random rows and weights in fmt, with a bias, against the reference;
    returns (x, w, exact) for further checks."""
    w, exact = weights(rng, n, k, fmt)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    library["relaxc.dense_q"](t(x), t(w), fmt, t(bias), t(out))
    assert_close(out, dense_reference(x, exact, fmt, bias), 2e-5)
    return x, w, exact


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 2, 6, 33])
def test_dense_q_against_gguf(library, fmt, m):
    rng = np.random.default_rng(m * 7 + len(fmt))
    k, n = 512 if BLOCK[fmt] > 1 else 200, 37
    x, w, exact = dense_matches_reference(library, rng, fmt, m, n, k)
    # Without the bias, and with batch axes in front (the rows of a prefill, [1, s, k]).
    out3 = np.zeros((1, m, n), np.float32)
    library["relaxc.dense_q"](t(x.reshape(1, m, k)), t(w), fmt, None, t(out3))
    assert_close(out3.reshape(m, n), dense_reference(x, exact, fmt), 2e-5)


@pytest.mark.parametrize("k", [1000, 1028])
@pytest.mark.parametrize("fmt", ["f32", "f16"])
def test_float_weights_at_prefill_rows(library, fmt, k):
    """Many rows of float weights take the GEMM, its panels gathered from the [n, k] rows (whole
    panels of 16 rows and a partial one; reduction blocks of 250 and 257, not multiples of 8)."""
    dense_matches_reference(library, np.random.default_rng(k), fmt, 70, 53, k)


@pytest.mark.parametrize("k", [1024, 1000, 203])
def test_f32_rows_sum_as_llamafile_on_avx2(library, k):
    """On AVX2 (the kernels conftest.py pins), each f32 output below the GEMM's 32 rows is one
    8-lane sum of fused products along k, its lanes added by tinyBLAS's tree, the tail (k not a
    multiple of 8) one fused product at a time: llamafile's f32 tile, which llama.cpp's prefill
    runs. A row alone (decoding, which reads four weight rows side by side) has the bits it has
    among six (a prompt: passes of three rows), whatever the number of weight rows, and whichever
    rows its tiles take together (four far-apart parts of the rows, and a few left over)."""
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= cpu_flags():
        pytest.skip("the AVX2 kernels need an x86-64 CPU with AVX2 and FMA; this one runs the portable code")
    rng = np.random.default_rng(k)
    n = 90  # parts of 22 rows, two left over
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((6, k)).astype(np.float32)
    whole = k - k % 8
    acc = np.zeros((6, n, 8), np.float32)
    for i in range(0, whole, 8):
        acc = fma(x[:, None, i : i + 8], w[None, :, i : i + 8], acc)
    want = tree8(acc)
    for i in range(whole, k):
        want = fma(w[None, :, i], x[:, None, i], want)
    batch = np.zeros((6, n), np.float32)
    library["relaxc.dense_q"](t(x), t(w), "f32", None, t(batch))
    assert np.array_equal(batch.view(np.uint32), want.view(np.uint32)), "a prompt's rows are not summed as llamafile's"
    for r in range(6):
        alone = np.zeros((1, n), np.float32)
        library["relaxc.dense_q"](t(x[r : r + 1]), t(w), "f32", None, t(alone))
        assert np.array_equal(alone[0].view(np.uint32), batch[r].view(np.uint32)), f"row {r} alone"
    bias = rng.standard_normal(n).astype(np.float32)
    library["relaxc.dense_q"](t(x[:1]), t(w), "f32", t(bias), t(alone))
    assert np.array_equal(alone[0].view(np.uint32), (batch[0] + bias).view(np.uint32)), "row 0 alone, with a bias"


@pytest.mark.parametrize("k", [1024, 1000, 203])
def test_f16_decoding_rows_sum_in_four_chains_on_avx2(library, k):
    """On AVX2, each f16 output of a decoding step (one activation row) is four 8-lane chains of
    fused products over runs of 32 values, an 8-value run left over on the first chain, the chains
    added (0 + 1) + (2 + 3), the lanes by tinyBLAS's tree, the tail one fused product at a time,
    then the bias. Decoding reads row c of the first half of the rows beside row c of the second,
    the last of an odd number alone; the one pass and the 4-row tiles it replaced gave these bits
    too."""
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma", "f16c"} <= cpu_flags():
        pytest.skip("the AVX2 kernels need an x86-64 CPU with AVX2, FMA and F16C; this one runs the portable code")
    rng = np.random.default_rng(k)
    n = 91  # more than one unit of rows, a last unit cut short, and one row not in a pair
    w = rng.standard_normal((n, k)).astype(np.float16)
    x = rng.standard_normal((1, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    wf = w.astype(np.float32)
    acc = np.zeros((4, n, 8), np.float32)
    runs = k // 32 * 32
    for i in range(0, runs, 32):
        for c in range(4):
            lo = i + 8 * c
            acc[c] = fma(wf[:, lo : lo + 8], x[:, lo : lo + 8], acc[c])
    i = runs
    while i + 8 <= k:
        acc[0] = fma(wf[:, i : i + 8], x[:, i : i + 8], acc[0])
        i += 8
    want = tree8((acc[0] + acc[1]) + (acc[2] + acc[3]))
    for j in range(i, k):
        want = fma(wf[:, j], x[0, j], want)
    want = want + bias
    out = np.zeros((1, n), np.float32)
    library["relaxc.dense_q"](t(x), t(w), "f16", t(bias), t(out))
    assert np.array_equal(out[0].view(np.uint32), want.view(np.uint32)), "a decoding row's f16 sums moved"


@pytest.mark.parametrize("m", [1, 3, 4, 6, 9])
@pytest.mark.parametrize("fmt", ["q4_0", "q4_K", "q8_0"])
def test_regrouped_rows(library, m, fmt):
    """q4_0, q4_K and q8_0 regrouped eight rows at a time (what weights_open makes for "X#q4_0x8",
    "X#q4_Kx8" and "X#q8_0x8") give the plain format's results: the same integer sums, added in
    order."""
    rng = np.random.default_rng(m)
    k, n = 512, 40
    w, exact = weights(rng, n, k, fmt)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    library["relaxc.dense_q"](t(x), t(REGROUPINGS[f"#{fmt}x8"](w)), fmt + "x8", t(bias), t(out))
    assert_close(out, dense_reference(x, exact, fmt, bias), 2e-5)
    plain = np.zeros((m, n), np.float32)
    library["relaxc.dense_q"](t(x), t(w), fmt, t(bias), t(plain))
    assert_close(out, plain.astype(np.float64), 2e-6)
    # Each row alone (decoding's tiles of 8 rows) gives its bits in the batch (prefill's tiles of
    # 16 rows where AVX-512 VNNI has them). q4_K's rows taken four at a time are summed as
    # llama.cpp sums them (per 64 values, not 256): each four alone give their bits, and the rows
    # left over are summed as rows alone.
    paired = m - m % 4 if fmt == "q4_K" else 0
    for r, rows in [(r, 4) for r in range(0, paired, 4)] + [(r, 1) for r in range(paired, m)]:
        alone = np.zeros((rows, n), np.float32)
        library["relaxc.dense_q"](t(x[r : r + rows]), t(REGROUPINGS[f"#{fmt}x8"](w)), fmt + "x8", t(bias), t(alone))
        assert np.array_equal(alone.view(np.uint32), out[r : r + rows].view(np.uint32)), f"rows {r}..{r + rows}"


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_K", "q6_K"])
def test_quantized_activations_cost_little(library, fmt):
    """Against the exact product of float activations and the dequantized weights: the error the
    activations' int8 adds stays small (what llama.cpp's results also carry)."""
    rng = np.random.default_rng(5)
    k, n = 1024, 64
    w, exact = weights(rng, n, k, fmt)
    x = rng.standard_normal((3, k)).astype(np.float32)
    out = np.zeros((3, n), np.float32)
    library["relaxc.dense_q"](t(x), t(w), fmt, None, t(out))
    assert_close(out, x.astype(np.float64) @ exact.T, 2e-2)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_take_q_rows(library, fmt):
    rng = np.random.default_rng(3)
    k = 512 if BLOCK[fmt] > 1 else 48
    w, exact = weights(rng, 20, k, fmt)
    ids = np.array([[3, 0, 19], [7, 7, 1]], np.int32)
    out = np.zeros((2, 3, k), np.float32)
    library["relaxc.take_q"](t(w), t(ids), fmt, t(out))
    assert_close(out, exact[ids], 1e-6)


def test_errors_name_the_argument(library):
    rng = np.random.default_rng(1)
    w, _ = weights(rng, 8, 64, "q4_0")
    x = np.zeros((2, 64), np.float32)
    out = np.zeros((2, 8), np.float32)
    dense = library["relaxc.dense_q"]
    cases = [
        (
            lambda: dense(t(x), t(w), "q5_9", None, t(out)),
            ValueError,
            'unknown weight format "q5_9"',
        ),
        (
            lambda: dense(t(x), t(w.view(np.int8)), "q4_0", None, t(out)),
            TypeError,
            "must be a CPU tensor of uint8",
        ),
        (
            lambda: dense(t(np.zeros((2, 48), np.float32)), t(w), "q4_0", None, t(out)),
            ValueError,
            "multiple of 32",
        ),
        (
            lambda: dense(t(x), t(w), "q8_0", None, t(out)),
            ValueError,
            "q8_0 weights for rows of 64 values",
        ),
        (
            lambda: dense(t(x), t(w), "q4_0", None, t(np.zeros((2, 9), np.float32))),
            ValueError,
            "out must be x's shape",
        ),
        (
            lambda: dense(t(x), t(w), "q4_0", t(np.zeros(3, np.float32)), t(out)),
            ValueError,
            "bias must have one value",
        ),
        (
            lambda: library["relaxc.take_q"](
                t(w),
                t(np.array([8], np.int32)),
                "q4_0",
                t(np.zeros((1, 64), np.float32)),
            ),
            IndexError,
            "id 8 at position 0",
        ),
    ]
    assert_each_raises(cases)


THREAD_SCRIPT = r"""
import sys, numpy as np, tvm_ffi
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize
sys.path.insert(0, sys.argv[3])
from relaxc.llm.quantize import REGROUPINGS
path, out_path = sys.argv[1], sys.argv[2]
names = dict(l.split("\t") for l in open(path + ".tsv").read().splitlines())
dense = tvm_ffi.load_module(path)[names["relaxc.dense_q"]]
rng = np.random.default_rng(17)
t = lambda a: tvm_ffi.from_dlpack(np.ascontiguousarray(a))
res = {}
for fmt, kind in [("f32", T.F32), ("f16", T.F16), ("q8_0", T.Q8_0), ("q4_0", T.Q4_0), ("q4_K", None), ("q6_K", None), ("q5_1", T.Q5_1)]:
    k, n = 768, 400
    if kind is None:
        w = rng.integers(0, 256, (n, k // 256 * (144 if fmt == "q4_K" else 210)), dtype=np.uint8)
        at = 0 if fmt == "q4_K" else 208
        for b in range(k // 256):
            start = b * (144 if fmt == "q4_K" else 210) + at
            scales = [0.01, 0.002] if fmt == "q4_K" else [0.01]  # q4_K: d and dmin
            w[:, start:start + 2 * len(scales)] = np.array(scales, np.float16).view(np.uint8)
    else:
        w = quantize(rng.standard_normal((n, k)).astype(np.float32), kind)
    for m in [1, 6, 40]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        out = np.zeros((m, n), np.float32)
        dense(t(x), t(w), fmt, None, t(out))
        res[f"{fmt}_{m}"] = out
        if fmt in ("q4_0", "q4_K", "q8_0"):
            out = np.zeros((m, n), np.float32)
            dense(t(x), t(REGROUPINGS[f"#{fmt}x8"](w)), fmt + "x8", None, t(out))
            res[f"{fmt}x8_{m}"] = out
np.savez(out_path, **res)
"""


def run_script(tmp_path, threads, isa=None):
    """THREAD_SCRIPT's results in a process of its own with `threads` threads and the dot products
    of `isa` (RELAXC_QUANT_ISA; None: what the CPU has)."""
    path = str(tmp_path / "lib.so")
    if not os.path.exists(path):
        out = subprocess.run(
            [relaxc_binary(), "kernel-library", "-o", path],
            capture_output=True,
            text=True,
            check=True,
        )
        (tmp_path / "lib.so.tsv").write_text(out.stdout)
        (tmp_path / "run.py").write_text(THREAD_SCRIPT)
    dest = str(tmp_path / f"t{threads}_{isa}.npz")
    env = unpinned_env(TVM_NUM_THREADS=str(threads))
    if isa:
        env["RELAXC_QUANT_ISA"] = isa
    python = os.path.join(_ROOT, "python")
    subprocess.run(
        [sys.executable, str(tmp_path / "run.py"), path, dest, python],
        check=True,
        env=env,
    )
    return np.load(dest)


def test_every_instruction_set_agrees(tmp_path):
    """AVX2 and VNNI give the same bits for the integer formats (the same integer sums, scaled
    alike); for f32 and f16, whose decoding (AVX2 reads f32 rows side by side with one sum each,
    AVX-512 each row alone with four) and GEMM differ, and for the portable code, which sums its
    floats in another order, results are close, not equal. On a CPU without them the sets fall back to what it has, and the comparison holds."""
    best, avx2, portable = (
        run_script(tmp_path, 2),
        run_script(tmp_path, 2, "avx2"),
        run_script(tmp_path, 2, "portable"),
    )
    for name in best.files:
        if name.startswith(("f32", "f16")):
            want = best[name].astype(np.float64)
            assert np.abs(avx2[name] - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), f"{name}: AVX2 disagrees"
            continue
        assert np.array_equal(best[name].view(np.uint32), avx2[name].view(np.uint32)), f"{name}: VNNI and AVX2 differ"
        want = best[name].astype(np.float64)
        assert np.abs(portable[name] - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), (
            f"{name}: portable code disagrees"
        )


def test_same_bits_at_any_thread_count(tmp_path):
    results = {threads: run_script(tmp_path, threads) for threads in [1, 2, 3]}
    for name in results[1].files:
        for threads in [2, 3]:
            assert np.array_equal(results[1][name].view(np.uint32), results[threads][name].view(np.uint32)), (
                f"{name}: {threads} threads give other bits than 1"
            )
