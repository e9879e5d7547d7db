"""relaxc's kernel library keeps its bits whatever runs it: the same results at 1, 2 and 3
threads at sizes the pool splits, with AVX-512 and with AVX2 (where the CPU has AVX-512), and
vector activations equal to the same functions taken one value at a time. Each configuration
runs in a process of its own (the pool and the instruction set are chosen once per process).

Needs numpy, pytest and apache-tvm-ffi (no TVM); test_kernels.py checks the values themselves.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import unpinned_env
from test_kernels import ROOT
from test_tvm_ffi import relaxc_binary

THREAD_SCRIPT = r"""
import sys, numpy as np, tvm_ffi
sys.path.insert(0, sys.argv[3])
from relaxc.tvm.pack import pack_columns, pack_conv, pack_conv_columns
path, out_path = sys.argv[1], sys.argv[2]
names = dict(l.split("\t") for l in open(path + ".tsv").read().splitlines())
m = tvm_ffi.load_module(path)
k = {n: m[e] for n, e in names.items()}
rng = np.random.default_rng(11)
r = lambda *s: rng.standard_normal(s).astype(np.float32)
t = lambda a: tvm_ffi.from_dlpack(np.ascontiguousarray(a))
sc = t(np.array([1.0, 0.0, 6.0], np.float32))
res = {}
x, w = r(64, 300), r(300, 200)
res["dense"] = np.zeros((64, 200), np.float32); k["relaxc.dense"](t(x), t(pack_columns(w)), None, None, "gelu", sc, t(res["dense"]))
for act in ["gelu_tanh", "silu", "sigmoid", "hard_swish", "hard_sigmoid"]:
    res["dense_" + act] = np.zeros((64, 200), np.float32)
    k["relaxc.dense"](t(x), t(pack_columns(w)), t(r(200)), None, act, t(np.array([1.0, 1 / 6, 0.5], np.float32)), t(res["dense_" + act]))
res["dense_res"] = np.zeros((64, 200), np.float32)
k["relaxc.dense"](t(x), t(pack_columns(w)), t(r(200)), t(r(64, 200)), "clip", t(np.array([0.5, -1.0, 2.0], np.float32)), t(res["dense_res"]))
xr, wr = r(2, 100, 300), pack_columns(r(300, 200))
res["dense_rows"] = np.zeros((2, 100, 200), np.float32)
k["relaxc.dense"](t(xr), t(wr), t(r(200)), t(r(2, 100, 200)), "gelu", sc, t(res["dense_rows"]))
res["dense_many_rows"] = np.zeros((450, 200), np.float32)
k["relaxc.dense"](t(r(450, 300)), t(wr), t(r(200)), None, "relu", sc, t(res["dense_many_rows"]))
x1 = r(1, 700)
res["gemv"] = np.zeros((1, 900), np.float32); k["relaxc.dense"](t(x1), t(pack_columns(r(700, 900))), None, None, "none", sc, t(res["gemv"]))
a, b = r(4, 8, 33, 40), r(4, 8, 40, 29)
res["matmul"] = np.zeros((4, 8, 33, 29), np.float32); k["relaxc.matmul"](t(a), t(b), None, None, None, None, None, "none", sc, t(res["matmul"]))
x = r(2, 16, 30, 30); cw = r(24, 16, 3, 3)
res["conv"] = np.zeros((2, 24, 30, 30), np.float32)
k["relaxc.conv2d"](t(x), t(pack_conv(cw, 1)), None, None, tvm_ffi.Shape([3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1]), "clip", sc, t(res["conv"]))
x7 = r(1, 64, 7, 7); cw7 = r(96, 64, 3, 3)
res["conv_columns"] = np.zeros((1, 96, 7, 7), np.float32)
k["relaxc.conv2d"](t(x7), t(pack_conv_columns(cw7, 1)), t(r(96)), None, tvm_ffi.Shape([3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1]), "relu", sc, t(res["conv_columns"]))
res["conv_silu"] = np.zeros((2, 24, 30, 30), np.float32)
k["relaxc.conv2d"](t(x), t(pack_conv(cw, 1)), t(r(24)), t(r(2, 24, 30, 30)), tvm_ffi.Shape([3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1]), "silu", sc, t(res["conv_silu"]))
x24 = r(2, 27, 17, 19)
res["dw_27"] = np.zeros((2, 27, 17, 19), np.float32)
k["relaxc.conv2d_depthwise"](t(x24), t(r(27, 1, 5, 5)), t(r(27)), t(r(2, 27, 17, 19)), tvm_ffi.Shape([5, 5, 1, 1, 2, 2, 2, 2, 1, 1, 27]), "hard_swish", t(np.array([1.0, 1 / 6, 0.5], np.float32)), t(res["dw_27"]))
xw = r(2, 12, 40, 45)
res["dw_wide"] = np.zeros((2, 12, 40, 45), np.float32)
k["relaxc.conv2d_depthwise"](t(xw), t(r(12, 1, 5, 5)), t(r(12)), t(r(2, 12, 40, 45)), tvm_ffi.Shape([5, 5, 1, 1, 2, 2, 2, 2, 1, 1, 12]), "hard_swish", t(np.array([1.0, 1 / 6, 0.5], np.float32)), t(res["dw_wide"]))
res["dw"] = np.zeros((2, 16, 15, 15), np.float32)
k["relaxc.conv2d_depthwise"](t(x), t(r(16, 1, 3, 3)), None, None, tvm_ffi.Shape([3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 16]), "relu", sc, t(res["dw"]))
qa, ka, va = r(2, 50, 3, 24), r(2, 300, 3, 24), r(2, 300, 3, 40)
p4, kp = tvm_ffi.Shape([0, 2, 1, 3]), tvm_ffi.Shape([0, 2, 3, 1])
res["attention"] = np.zeros((2, 50, 3, 40), np.float32)
k["relaxc.attention"](t(qa), t(ka), t(va), t(r(2, 1, 1, 300)), p4, kp, p4, p4, t(np.array([0.2], np.float32)), t(res["attention"]))
big = r(300, 500)
res["softmax"] = np.zeros_like(big); k["relaxc.softmax"](t(big), t(res["softmax"]))
res["ln"] = np.zeros_like(big); k["relaxc.layer_norm"](t(big), t(r(500)), t(r(500)), t(np.array([1e-5], np.float32)), t(res["ln"]))
res["pool"] = np.zeros((2, 16, 15, 15), np.float32); k["relaxc.max_pool2d"](t(x), tvm_ffi.Shape([3, 3, 2, 2, 1, 1, 1, 1, 1, 1]), t(res["pool"]))
np.savez(out_path, **res)
"""


def run_thread_script(tmp_path, configurations):
    """THREAD_SCRIPT's results in a process of their own per {label: environment changes}."""
    path = str(tmp_path / "lib.so")
    out = subprocess.run([relaxc_binary(), "kernel-library", "-o", path], capture_output=True, text=True, check=True)
    (tmp_path / "lib.so.tsv").write_text(out.stdout)
    script = tmp_path / "run.py"
    script.write_text(THREAD_SCRIPT)
    results = {}
    for label, changes in configurations.items():
        dest = str(tmp_path / f"{label}.npz")
        env = unpinned_env(**changes)
        env.pop("OMP_NUM_THREADS", None)
        subprocess.run([sys.executable, str(script), path, dest, os.path.join(ROOT, "python")], check=True, env=env)
        results[label] = np.load(dest)
    return results


def assert_same_bits(results, reference):
    for name in results[reference].files:
        for label, got in results.items():
            assert np.array_equal(results[reference][name].view(np.uint32), got[name].view(np.uint32)), (
                f"{name}: {label} gives other bits than {reference}"
            )


def test_same_bits_at_any_thread_count(library, tmp_path):
    results = run_thread_script(tmp_path, {f"{n} threads": {"TVM_NUM_THREADS": str(n)} for n in [1, 2, 3]})
    assert_same_bits(results, "1 threads")


ONE_AT_A_TIME_SCRIPT = r"""
import sys, numpy as np, tvm_ffi
path = sys.argv[1]
names = dict(l.split("\t") for l in open(path + ".tsv").read().splitlines())
activation = tvm_ffi.load_module(path)[names["relaxc.activation"]]
t = lambda a: tvm_ffi.from_dlpack(np.ascontiguousarray(a))
rng = np.random.default_rng(3)
special = [0.0, -0.0, np.inf, -np.inf, np.nan, 87.3, -87.3, 88.3, -88.3, 87.29, -87.29, 88.31, -88.31, 1e-30,
           -1e-30, 1e-45, -1e-45, 1e30, -1e30, 0.5, -0.5, 9.0, -9.0, 44.0, -44.0]
x = np.concatenate([special, *(rng.standard_normal(200) * s for s in (1, 4, 20, 100))]).astype(np.float32)
x = np.concatenate([x, np.zeros(-len(x) % 16, np.float32)])
for act in ["silu", "sigmoid", "gelu", "gelu_tanh"]:
    whole = np.zeros_like(x)
    activation(t(x), act, t(np.array([1.0, 0.0, 0.0], np.float32)), t(whole))
    for i, v in enumerate(x):
        one = np.zeros(1, np.float32)
        activation(t(x[i : i + 1]), act, t(np.array([1.0, 0.0, 0.0], np.float32)), t(one))
        same = one.view(np.uint32)[0] == whole.view(np.uint32)[i] or (np.isnan(one[0]) and np.isnan(whole[i]))
        assert same, (act, float(v), one[0], whole[i])
print("ok", len(x))
"""


@pytest.mark.parametrize("avx512", ["1", "0"])
def test_vector_activations_give_the_scalar_bits(library, tmp_path, avx512):
    """SiLU, sigmoid, GELU and its tanh form a register at a time (AVX-512 or AVX2) against the
    same functions one value at a time (rk_math.h, the loop's scalar tail), bit for bit:
    infinities, signed zeros, exp's clamps and either side of them included (a NaN stays a NaN,
    whatever its sign)."""
    path = str(tmp_path / "lib.so")
    out = subprocess.run([relaxc_binary(), "kernel-library", "-o", path], capture_output=True, text=True, check=True)
    (tmp_path / "lib.so.tsv").write_text(out.stdout)
    script = tmp_path / "one_at_a_time.py"
    script.write_text(ONE_AT_A_TIME_SCRIPT)
    env = unpinned_env(RELAXC_GEMM_AVX512=avx512)
    done = subprocess.run([sys.executable, str(script), path], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok"), done.stdout


def cpu_has_avx512():
    try:
        with open("/proc/cpuinfo") as info:
            return any(line.startswith("flags") and " avx512f" in line for line in info)
    except OSError:
        return False


@pytest.mark.skipif(not cpu_has_avx512(), reason="the CPU has no AVX-512: only the AVX2 micro-kernels run here")
def test_avx512_micro_kernels_give_the_avx2_bits(library, tmp_path):
    """The AVX-512 kernels (one panel, and two panels at once) against RELAXC_GEMM_AVX512=0's
    AVX2 kernels, at 1 and 2 threads: every epilogue path, odd panels and short strips."""
    results = run_thread_script(
        tmp_path,
        {
            f"{isa}, {n} threads": {"TVM_NUM_THREADS": str(n), "RELAXC_GEMM_AVX512": flag}
            for isa, flag in [("AVX-512", "1"), ("AVX2", "0")]
            for n in [1, 2]
        },
    )
    assert_same_bits(results, "AVX2, 1 threads")
