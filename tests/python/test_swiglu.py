"""relaxc.swiglu (silu(gate) * up in llama.cpp's arithmetic) against a numpy model of ggml's
vector exp, bit for bit, in each of its forms: the 16-lane AVX-512 one and the 8-lane AVX2 one
(whose bits the 4-lane NEON and portable forms share), with libm's expf on each row's tail, as
ggml's loop runs it. Each form runs in a process of its own (RELAXC_QUANT_ISA picks a lesser
one than the CPU's), at 1, 2 and 3 threads. tests/python/test_llama_cpp_kernels.py compares the
kernel with llama.cpp's own where llama-cpp-python is installed.

The model's fused multiply-adds are computed in float64 and rounded once to float32: the product
of two floats is exact there, so only a sum landing on a float32 tie could round twice, which
these fixed inputs do not do (the reference would then disagree on that one value, and say so).
Needs numpy, pytest and apache-tvm-ffi (no TVM).
"""

import ctypes
import ctypes.util
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_each_raises
from test_kernels import t
from test_tvm_ffi import relaxc_binary

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
swiglu = tvm_ffi.load_module(path)[names["relaxc.swiglu"]]
t = lambda a: tvm_ffi.from_dlpack(np.ascontiguousarray(a))
cases = np.load(dest + ".in.npz")
res = {}
for name in cases.files:
    if name.endswith("_up"):
        continue
    gate, up = cases[name], cases[name + "_up"]
    out = np.zeros_like(gate)
    swiglu(t(gate), t(up), t(out))
    res[name] = out
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
        "decode": rng.standard_normal((1, 2816)).astype(F32) * 3,  # whole registers only
        "tails": rng.standard_normal((7, 45)).astype(F32) * 4,  # 45 = 2*16 + 13 = 5*8 + 5 = 11*4 + 1
        "wide": wide.reshape(1, -1),
        "batch": rng.standard_normal((3, 5, 301)).astype(F32),
        "prefill": rng.standard_normal((40, 1000)).astype(F32),  # several units of work per thread
    }
    for name in list(out):
        out[name + "_up"] = rng.standard_normal(out[name].shape).astype(F32)
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
    out = subprocess.run([relaxc_binary(), "kernel-library", "-o", path], capture_output=True, text=True, check=True)
    (tmp / "lib.so.tsv").write_text(out.stdout)
    (tmp / "run.py").write_text(SCRIPT)
    inputs = cases()

    def run(isa, threads):
        dest = str(tmp / f"{isa}_{threads}.npz")
        np.savez(dest + ".in.npz", **inputs)
        env = dict(os.environ, TVM_NUM_THREADS=str(threads))
        env.pop("RELAXC_QUANT_ISA", None)
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
        want = reference(inputs[name], inputs[name + "_up"], form, lanes)
        differ = np.flatnonzero(got.view(U32) != want.view(U32))
        assert differ.size == 0, (
            f"{name} ({form}, {lanes} lanes): {differ.size} values differ from ggml's, first at flat index "
            f"{differ[0]}: gate {inputs[name].flat[differ[0]]!r} gives {got.flat[differ[0]]!r}, "
            f"ggml {want.flat[differ[0]]!r}"
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
