"""relaxc's q4_K and q6_K dense layers and its swiglu against llama.cpp's own x86 kernels, bit for bit.

relaxc sums its q4_Kx8 tiles and q6_K dot products in the order llama.cpp's x86 CPU backend sums
them (the same integer partial sums, converted and multiply-added in the same lanes, added up
in the same tree), so that a quantized model's first logits match llama.cpp's where its other
operations do too. This test calls llama.cpp's kernels from the libggml-cpu that
llama-cpp-python ships: the activations quantized by its quantizer (quantize_row_q8_K for rows
taken one by one, quantize_mat for rows taken four at a time), q6_K by ggml_vec_dot_q6_K_q8_K,
q4_K repacked into llama.cpp's block_q4_Kx8 and multiplied by its gemv (one row) and gemm (four
rows at a time), and compares relaxc.dense_q's outputs bit for bit.

Needs llama-cpp-python on an x86-64 CPU with AVX2 and FMA (the order is that of its x86 code);
skips otherwise, saying why.
"""

import ctypes
import os
import platform
import subprocess
import sys

import numpy as np
import pytest
from conftest import build_kernel_library, unpinned_env
from test_kernels import t
from test_quant import REGROUPINGS, random_k_blocks

if platform.machine() not in ("x86_64", "AMD64"):
    pytest.skip("llama.cpp's x86 kernels are the reference; this is not x86-64", allow_module_level=True)
if "avx2" not in open("/proc/cpuinfo").read() or " fma" not in open("/proc/cpuinfo").read():
    pytest.skip("the CPU has no AVX2 and FMA: relaxc runs its portable code, summed unfused", allow_module_level=True)
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python ships the llama.cpp kernels compared with")

GGML_CPU = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu.so"))
Q8_K_BYTES = 4 + 256 + 2 * 16  # float d, 256 int8 values, 16 int16 sums per super-block
P = ctypes.c_void_p


def symbol(name, *argtypes):
    fn = getattr(GGML_CPU, name)
    fn.argtypes, fn.restype = list(argtypes), None
    return fn


# Fills its tables (half-precision conversion among them) as llama.cpp does before any kernel.
symbol("ggml_cpu_init")()
quantize_row_q8_K = symbol("quantize_row_q8_K", P, P, ctypes.c_int64)
vec_dot_q6_K = symbol(
    "ggml_vec_dot_q6_K_q8_K", ctypes.c_int, P, ctypes.c_size_t, P, ctypes.c_size_t, P, ctypes.c_size_t, ctypes.c_int
)
# ggml::cpu::repack's templates for block_q4_K interleaved 8 rows, 8 bytes at a time, against
# GGML_TYPE_Q8_K (15), and ggml_quantize_mat_t<8, GGML_TYPE_Q8_K> (four rows, interleaved).
quantize_mat_q8_K = symbol("_Z19ggml_quantize_mat_tILl8EL9ggml_type15EEvPKfPvll", P, P, ctypes.c_int64, ctypes.c_int64)
MATMUL_ARGS = (ctypes.c_int, P, ctypes.c_size_t, P, P, ctypes.c_int, ctypes.c_int)
gemv_q4_K = symbol("_ZN4ggml3cpu6repack4gemvI10block_q4_KLl8ELl8EL9ggml_type15EEEviPfmPKvS7_ii", *MATMUL_ARGS)
gemm_q4_K = symbol("_ZN4ggml3cpu6repack4gemmI10block_q4_KLl8ELl8EL9ggml_type15EEEviPfmPKvS7_ii", *MATMUL_ARGS)


def ptr(a):
    return a.ctypes.data_as(P)


def llama_q4_Kx8(w):
    """Plain q4_K rows [n, k / 256 * 144] as llama.cpp's block_q4_Kx8 (its repack.cpp): per group
    of 8 rows and super-block, the 8 d, the 8 dmin, 96 bytes of 6-bit scales and minimums (per
    sub-block, 12 bytes: the high bits of rows 4-7 in rows 0-3's bytes) and 1024 bytes of values interleaved 8 bytes a row."""
    n = w.shape[0]
    blocks = w.reshape(n // 8, 8, -1, 144).transpose(0, 2, 1, 3)  # [group, super-block, row, 144]
    out = np.zeros(blocks.shape[:2] + (1152,), np.uint8)
    out[..., 0:16] = blocks[..., 0:2].reshape(blocks.shape[:2] + (16,))
    out[..., 16:32] = blocks[..., 2:4].reshape(blocks.shape[:2] + (16,))
    sc = blocks[..., 4:16].astype(np.int32)  # [.., row, 12]: q4_K's packed scales
    scale = np.concatenate([sc[..., 0:4] & 63, (sc[..., 8:12] & 15) | ((sc[..., 0:4] >> 6) << 4)], axis=-1)
    minimum = np.concatenate([sc[..., 4:8] & 63, (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)], axis=-1)
    for sub in range(8):
        s, m = scale[..., sub], minimum[..., sub]  # [.., row]
        at = 12 * sub
        packed = np.concatenate(
            [
                (s[..., 0:4] & 63) + ((s[..., 4:8] & 48) << 2),
                (m[..., 0:4] & 63) + ((m[..., 4:8] & 48) << 2),
                (s[..., 4:8] & 15) + ((m[..., 4:8] & 15) << 4),
            ],
            axis=-1,
        )
        out[..., 32 + at : 32 + at + 12] = packed.astype(np.uint8)
    qs = blocks[..., 16:144].reshape(blocks.shape[:3] + (16, 8))  # [.., row, chunk of 8 bytes, 8]
    out[..., 128:] = qs.transpose(0, 1, 3, 2, 4).reshape(blocks.shape[:2] + (1024,))
    return out.reshape(n // 8, -1)


def with_ties(x):
    """x with its first super-block's largest magnitude there twice, negative first: llama.cpp
    quantizes a row it takes alone with the first one's sign (scale negative), and rows it takes
    four at a time with +amax's."""
    x[:, 7], x[:, 200] = -50.0, 50.0
    return x


def relaxc_dense(library, x, w, fmt):
    out = np.zeros((x.shape[0], w.shape[0] if fmt == "q6_K" else w.shape[0] * 8), np.float32)
    library["relaxc.dense_q"](t(x), t(w), fmt, None, t(out))
    return out


def same_bits(got, want, what):
    differ = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert differ.size == 0, (
        f"{what}: {differ.size} of {got.size} outputs differ from llama.cpp's, first at {differ[0]}"
    )


@pytest.mark.parametrize("k", [256, 2816])
@pytest.mark.parametrize("m", [1, 6])
def test_q6_K_is_llama_cpps_vec_dot(library, m, k):
    """llama.cpp multiplies q6_K (never repacked on x86) one row at a time, whatever the rows."""
    rng = np.random.default_rng(k + m)
    n = 24
    w = random_k_blocks(rng, n, k, "q6_K")
    x = with_ties((rng.standard_normal((m, k)) * 3).astype(np.float32))
    want = np.zeros((m, n), np.float32)
    for r in range(m):
        act = np.zeros(k // 256 * Q8_K_BYTES, np.uint8)
        quantize_row_q8_K(ptr(np.ascontiguousarray(x[r])), ptr(act), k)
        for row in range(n):
            one = np.zeros(1, np.float32)
            vec_dot_q6_K(k, ptr(one), 0, ptr(np.ascontiguousarray(w[row])), 0, ptr(act), 0, 1)
            want[r, row] = one[0]
    same_bits(relaxc_dense(library, x, w, "q6_K"), want, f"q6_K, {m} rows")


@pytest.mark.parametrize("k", [512, 2816])
@pytest.mark.parametrize("m", [1, 4, 5, 6, 7, 9, 13])
def test_q4_Kx8_is_llama_cpps_gemm_and_gemv(library, m, k):
    """Rows m - m % 4 go through llama.cpp's gemm (its activations quantized four rows at a time),
    the rest through its gemv, one at a time: relaxc's rows must match whichever llama.cpp takes."""
    rng = np.random.default_rng(m)
    n = 48
    w = random_k_blocks(rng, n, k, "q4_K")
    x = with_ties(rng.standard_normal((m, k)).astype(np.float32))
    theirs = llama_q4_Kx8(w)
    want = np.zeros((m, n), np.float32)
    grouped = m - m % 4
    for r in range(0, grouped, 4):
        act = np.zeros(4 * (k // 256) * Q8_K_BYTES, np.uint8)
        quantize_mat_q8_K(ptr(np.ascontiguousarray(x[r : r + 4])), ptr(act), 4, k)
        out = np.zeros((4, n), np.float32)
        gemm_q4_K(k, ptr(out), n, ptr(theirs), ptr(act), 4, n)
        want[r : r + 4] = out
    for r in range(grouped, m):
        act = np.zeros(k // 256 * Q8_K_BYTES, np.uint8)
        quantize_row_q8_K(ptr(np.ascontiguousarray(x[r])), ptr(act), k)
        out = np.zeros((1, n), np.float32)
        gemv_q4_K(k, ptr(out), n, ptr(theirs), ptr(act), 1, n)
        want[r] = out[0]
    got = relaxc_dense(library, x, REGROUPINGS["#q4_Kx8"](w), "q4_Kx8")
    same_bits(got, want, f"q4_Kx8, {m} rows")


vec_swiglu = symbol("ggml_vec_swiglu_f32", ctypes.c_int, P, P, P)
ggml_cpu_has_avx512 = GGML_CPU.ggml_cpu_has_avx512
ggml_cpu_has_avx512.restype = ctypes.c_int

# relaxc.swiglu in a process of its own, with the instruction set the test asks for (the tests'
# own process has the kernels pinned to AVX2, conftest.py says why).
SWIGLU = r"""
import sys, numpy as np, tvm_ffi
path, data = sys.argv[1], sys.argv[2]
names = dict(line.split("\t") for line in open(path + ".tsv").read().splitlines())
swiglu = tvm_ffi.load_module(path)[names["relaxc.swiglu"]]
t = lambda a: tvm_ffi.from_dlpack(np.ascontiguousarray(a))
arrays = np.load(data)
out = np.zeros_like(arrays["gate"])
swiglu(t(arrays["gate"]), t(arrays["up"]), t(out))
np.save(data + ".out.npy", out)
"""


@pytest.fixture(scope="module")
def swiglu_as_llama_cpp_runs_it(tmp_path_factory):
    """relaxc.swiglu with the exp form this llama.cpp build runs: the 512-bit one when its
    libggml-cpu was built for AVX-512 (a native build on such a CPU), else the 256-bit one."""
    tmp = tmp_path_factory.mktemp("swiglu")
    path = str(tmp / "lib.so")
    build_kernel_library(path)
    (tmp / "run.py").write_text(SWIGLU)
    env = unpinned_env()
    if not ggml_cpu_has_avx512():
        env["RELAXC_QUANT_ISA"] = "avx2"

    def run(gate, up):
        data = str(tmp / f"case{gate.shape[1]}.npz")
        np.savez(data, gate=gate, up=up)
        subprocess.run([sys.executable, str(tmp / "run.py"), path, data], check=True, env=env)
        return np.load(data + ".out.npy")

    return run


@pytest.mark.parametrize("cols", [2816, 1000, 45])
def test_swiglu_is_llama_cpps_vec_swiglu(swiglu_as_llama_cpp_runs_it, cols):
    """relaxc.swiglu against ggml_vec_swiglu_f32 (the form of its exp this llama.cpp build runs,
    and libm's expf on the row's tail), row by row, over magnitudes up to exp's saturation."""
    rng = np.random.default_rng(cols)
    gate = (rng.standard_normal((6, cols)) * rng.choice([1.0, 4.0, 30.0, 120.0], (6, 1))).astype(np.float32)
    up = rng.standard_normal((6, cols)).astype(np.float32)
    got = swiglu_as_llama_cpp_runs_it(gate, up)
    want = np.zeros_like(gate)
    for r in range(gate.shape[0]):
        vec_swiglu(cols, ptr(want[r]), ptr(gate[r]), ptr(up[r]))
    same_bits(got, want, f"swiglu of {cols} values a row")
