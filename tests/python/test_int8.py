"""int8 models as ONNX Runtime's quantizer writes them: relaxc.matmul_int8 (MatMulInteger against
constant weights) gives numpy's exact integers on every instruction set the CPU has, at 1 and 2
threads; relaxc.dynamic_quantize_linear gives the bytes, scale and zero point of ONNX's definition
(ties rounded to even) and of ONNX Runtime; bad arguments are clear errors. Through
`python -m relaxc.onnx`: a DynamicQuantizeLinear -> MatMulInteger graph gives ONNX Runtime's
integers exactly, and a model quantized by ORT's own quantize_dynamic runs on the library's int8
kernels with its outputs within 1e-4 of ORT's.

The kernel tests need numpy and apache-tvm-ffi; the ONNX ones also TVM, onnx, onnxsim and
onnxruntime (skipped without them, as the summary says)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tvm_ffi
from conftest import assert_each_raises, build_kernel_library, unpinned_env
from test_kernel_bits import cpu_has_avx512
from test_kernels import ROOT, t
from test_tvm_ffi import relaxc_binary

sys.path.insert(0, os.path.join(ROOT, "python"))
from relaxc.tvm.pack import pack_int8_columns

# (rows, k, n, activation dtype, weight dtype): tails of every tile (k % 4, n % 16, rows % 4),
# both signs of both sides, a single value, a batch of rows, and sizes the pool splits.
CASES = [
    (1, 1, 1, "uint8", "int8"),
    (7, 13, 37, "uint8", "int8"),
    (5, 9, 70, "int8", "uint8"),
    (33, 100, 17, "int8", "int8"),
    (64, 515, 130, "uint8", "uint8"),
    (130, 384, 96, "uint8", "int8"),
]


def int8_case(i, rows, k, n, adt, bdt):
    """Seeded operands of one case: a, weights, a's zero point, the weights' per-column zero points."""
    rng = np.random.default_rng(100 + i)
    ai, bi = np.iinfo(adt), np.iinfo(bdt)
    a = rng.integers(ai.min, ai.max + 1, (rows, k)).astype(adt)
    w = rng.integers(bi.min, bi.max + 1, (k, n)).astype(bdt)
    a_zp = np.array(rng.integers(ai.min, ai.max + 1), adt)
    w_zp = rng.integers(bi.min, bi.max + 1, n).astype(bdt)
    return a, w, a_zp, w_zp


ISA_SCRIPT = r"""
import json, sys, numpy as np, tvm_ffi
sys.path.insert(0, sys.argv[3]); sys.path.insert(0, sys.argv[4])
from relaxc.tvm.pack import pack_int8_columns
from test_int8 import CASES, int8_case
path, out = sys.argv[1], sys.argv[2]
names = dict(l.split("\t") for l in open(path + ".tsv").read().splitlines())
f = tvm_ffi.load_module(path)[names["relaxc.matmul_int8"]]
t = lambda a: tvm_ffi.from_dlpack(np.ascontiguousarray(a))
results = {}
for i, case in enumerate(CASES):
    a, w, a_zp, w_zp = int8_case(i, *case)
    packed, comp = pack_int8_columns(w.astype(np.int64) - w_zp)
    got = np.zeros((a.shape[0], w.shape[1]), np.int32)
    f(t(a), t(packed), t(comp), t(a_zp), None, None, t(got))
    results[f"case{i}"] = got
    # the float epilogue: per-column scales and a bias, as ORT's quantizer follows MatMulInteger
    scale, bias = np.linspace(0.01, 0.02, w.shape[1], dtype=np.float32), np.linspace(-1, 1, w.shape[1], dtype=np.float32)
    fgot = np.zeros((a.shape[0], w.shape[1]), np.float32)
    f(t(a), t(packed), t(comp), t(a_zp), t(scale), t(bias), t(fgot))
    results[f"float{i}"] = fgot
np.savez(out, **results)
"""


def isa_paths():
    """The instruction-set paths this CPU can take, as (name, RELAXC_QUANT_ISA or None)."""
    paths = [("portable", "portable")]
    if os.uname().machine == "x86_64":
        flags = open("/proc/cpuinfo").read()
        # AMX's blocking on tiles emulated in C: its layout checked on any CPU.
        paths += [("AVX2", "avx2"), ("AMX-INT8 emulated", "amx-emulated")]
        if cpu_has_avx512() and "avx512_vnni" in flags:
            paths.append(("AVX-512 VNNI", "vnni" if "amx_int8" in flags else None))
        if "amx_int8" in flags:
            paths.append(("AMX-INT8", None))
    return paths


@pytest.fixture(scope="module")
def int8_results(tmp_path_factory):
    """Each path's results of CASES at 1 and 2 threads, each in a process of its own."""
    tmp = tmp_path_factory.mktemp("int8")
    path = str(tmp / "lib.so")
    build_kernel_library(path)
    script = tmp / "isa.py"
    script.write_text(ISA_SCRIPT)
    results = {}
    for name, isa in isa_paths():
        for threads in (1, 2):
            env = unpinned_env(TVM_NUM_THREADS=str(threads))
            if isa:
                env["RELAXC_QUANT_ISA"] = isa
            out = str(tmp / f"{name}-{threads}.npz")
            here = os.path.dirname(os.path.abspath(__file__))
            done = subprocess.run(
                [sys.executable, str(script), path, out, os.path.join(ROOT, "python"), here],
                capture_output=True,
                text=True,
                env=env,
            )
            assert done.returncode == 0, done.stderr[-2000:]
            # A path that fails its check product at load is not taken, and says so.
            assert "gave other integers" not in done.stderr, done.stderr[-2000:]
            results[f"{name}, {threads} thread(s)"] = dict(np.load(out))
    return results


def test_every_instruction_set_gives_the_exact_integers(int8_results):
    """sum over k of (a - a_zp) (w - w_zp) in int64 by numpy, against each path at 1 and 2 threads."""
    print("paths:", ", ".join(int8_results))
    if not any("VNNI" in p for p in int8_results):
        print("skipped path: AVX-512 VNNI (this CPU has no AVX512_VNNI)")
    if not any(p.startswith("AMX-INT8,") for p in int8_results):
        print("skipped path: AMX-INT8 on the tiles themselves (this CPU has no AMX-INT8; its emulation ran)")
    for i, case in enumerate(CASES):
        a, w, a_zp, w_zp = int8_case(i, *case)
        want = (a.astype(np.int64) - a_zp) @ (w.astype(np.int64) - w_zp)
        n = w.shape[1]
        scale, bias = np.linspace(0.01, 0.02, n, dtype=np.float32), np.linspace(-1, 1, n, dtype=np.float32)
        want_float = want.astype(np.float32) * scale + bias  # float32 steps, as ORT's Cast, Mul, Add
        for path, got in int8_results.items():
            assert np.array_equal(got[f"case{i}"], want), f"{case} on {path}"
            assert np.array_equal(got[f"float{i}"], want_float), f"{case}, float epilogue, on {path}"


def test_weights_a_byte_cannot_hold_are_not_packed():
    """A column spanning more than 255 (not a weight less its zero point) is refused, so relaxc.tvm
    leaves such a matmul to TVM's kernels rather than computing it wrong."""
    assert pack_int8_columns(np.array([[-200], [100]])) is None
    packed, comp = pack_int8_columns(np.array([[-200], [55]]))
    assert comp[0, 0] == -200 + 128 and packed.shape == (1, 1, 16, 4)


def onnx_dynamic_quantize(x):
    """ONNX's DynamicQuantizeLinear, as its reference defines it, in float32 numpy."""
    lo, hi = np.float32(min(0.0, x.min())), np.float32(max(0.0, x.max()))
    scale = np.float32(1.0) if hi == lo else np.float32(hi - lo) / np.float32(255)
    zp = np.float32(np.rint(np.clip(np.float32(0) - lo / scale, 0, 255)))
    y = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.uint8)
    return y, scale, np.uint8(zp)


def dynamic_quantize(library, x):
    y, scale, zp = np.zeros(x.shape, np.uint8), np.zeros((), np.float32), np.zeros((), np.uint8)
    library["relaxc.dynamic_quantize_linear"](t(x), t(y), t(scale), t(zp))
    return y, scale, zp


DQL_INPUTS = {
    # scale 1, zero point 0: halves are ties, rounded to the even neighbour
    "ties": np.array([0.5, 1.5, 2.5, 3.5, 254.5, 255.0, 0.0, 100.5], np.float32),
    # scale 1, zero point 1: -0.5 rounds to -0 then + 1
    "negative ties": np.array([-1.0, -0.5, 0.5, 254.0, 1.5], np.float32),
    "all zero": np.zeros(37, np.float32),
    "all positive": np.linspace(0.25, 3.0, 50, dtype=np.float32),
    "all negative": -np.linspace(0.25, 3.0, 50, dtype=np.float32),
    "random, many rows": np.random.default_rng(5).standard_normal((300, 517)).astype(np.float32),
    "one value": np.array([[-3.0]], np.float32),
}


@pytest.mark.parametrize("name", list(DQL_INPUTS))
def test_dynamic_quantize_linear_is_onnxs(library, name):
    x = DQL_INPUTS[name]
    y, scale, zp = dynamic_quantize(library, x)
    want_y, want_scale, want_zp = onnx_dynamic_quantize(x)
    assert scale == want_scale and zp == want_zp, (scale, want_scale, zp, want_zp)
    assert np.array_equal(y, want_y), np.argwhere(y != want_y)[:5]


def test_dynamic_quantize_linear_is_onnx_runtimes(library):
    """The same inputs through ORT's own DynamicQuantizeLinear."""
    ort = pytest.importorskip("onnxruntime", reason="pip install onnxruntime (the peer compared with)")
    pytest.importorskip("onnx", reason="pip install onnx")
    from onnx import TensorProto, helper

    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    graph = helper.make_graph(
        [node],
        "dql",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [
            helper.make_tensor_value_info("y", TensorProto.UINT8, None),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("z", TensorProto.UINT8, None),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, x in DQL_INPUTS.items():
        want_y, want_s, want_z = session.run(None, {"x": x})
        y, s, z = dynamic_quantize(library, x)
        assert s == want_s and z == want_z and np.array_equal(y, want_y), name


def test_bad_arguments_are_clear_errors(library):
    mm, dql = library["relaxc.matmul_int8"], library["relaxc.dynamic_quantize_linear"]
    a = np.zeros((4, 8), np.uint8)
    packed, comp = pack_int8_columns(np.ones((8, 5), np.int64))
    out, fout = np.zeros((4, 5), np.int32), np.zeros((4, 5), np.float32)
    assert_each_raises(
        [
            (lambda: mm(t(a.astype(np.float32)), t(packed), t(comp), None, None, None, t(out)), TypeError, "(a)"),
            (lambda: mm(t(a), t(packed.astype(np.uint8)), t(comp), None, None, None, t(out)), TypeError, "(b_packed)"),
            (lambda: mm(t(a[:, :4]), t(packed), t(comp), None, None, None, t(out)), ValueError, "b_packed must be"),
            (lambda: mm(t(a), t(packed), t(comp[:, :3]), None, None, None, t(out)), ValueError, "b_comp must be"),
            (
                lambda: mm(t(a), t(packed), t(comp), t(np.zeros(2, np.uint8)), None, None, t(out)),
                TypeError,
                "zero_point",
            ),
            (lambda: mm(t(a), t(packed), t(comp), None, None, None, t(out[:3])), ValueError, "out's leading dims"),
            (lambda: mm(t(a), t(packed), t(comp), None, None, None), TypeError, "expects 7 arguments"),
            (lambda: mm(t(a), t(packed), t(comp), None, t(np.ones(3, np.float32)), None, t(fout)), ValueError, "scale"),
            (lambda: mm(t(a), t(packed), t(comp), None, None, t(np.ones(5, np.float32)), t(out)), ValueError, "bias"),
            (lambda: mm(t(a), t(packed), t(comp), None, t(np.ones(1, np.float32)), None, t(out)), TypeError, "(out)"),
            (
                lambda: dql(
                    t(np.zeros(3, np.float32)),
                    t(np.zeros(4, np.uint8)),
                    t(np.zeros((), np.float32)),
                    t(np.zeros((), np.uint8)),
                ),
                ValueError,
                "y must have x's shape",
            ),
            (
                lambda: dql(
                    t(np.zeros(3, np.float32)),
                    t(np.zeros(3, np.int8)),
                    t(np.zeros((), np.float32)),
                    t(np.zeros((), np.uint8)),
                ),
                TypeError,
                "argument 1 (y)",
            ),
        ]
    )


# ---- through python -m relaxc.onnx ---------------------------------------------------------------


def onnx_tools():
    pytest.importorskip("tvm", reason="TVM 0.27 imports ONNX models (pip install apache-tvm==0.27.0.post1)")
    pytest.importorskip("onnxsim", reason="pip install onnxsim (folds the shape arithmetic)")
    ort = pytest.importorskip("onnxruntime", reason="pip install onnxruntime (the peer compared with)")
    onnx = pytest.importorskip("onnx", reason="pip install onnx")
    return onnx, ort


def build_onnx(tmp_path, model, *args):
    from test_onnx_command import build

    done, path, so = build(tmp_path, model, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, path, so


def run_all(so, inputs):
    lib = tvm_ffi.load_module(so)
    outs = lib["main"](*[tvm_ffi.from_dlpack(np.ascontiguousarray(x)) for x in inputs])
    outs = outs if isinstance(outs, (list, tuple)) or hasattr(outs, "__len__") else [outs]
    return [np.from_dlpack(o).copy() for o in outs]


def test_matmul_integer_gives_onnx_runtimes_integers(tmp_path):
    """x -> DynamicQuantizeLinear -> MatMulInteger (int8 weights with a per-column zero point):
    the int32 products, the bytes, the scale and the zero point all equal ORT's, and the build
    puts both on the kernel library."""
    onnx, ort = onnx_tools()
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    k, n = 70, 33
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    w_zp = rng.integers(-5, 6, n).astype(np.int8)
    graph = helper.make_graph(
        [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="quantize_x"),
            helper.make_node("MatMulInteger", ["xq", "w", "xz", "w_zp"], ["y"], name="matmul_integer"),
        ],
        "int8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 9, k])],
        [
            helper.make_tensor_value_info("y", TensorProto.INT32, [2, 9, n]),
            helper.make_tensor_value_info("xq", TensorProto.UINT8, [2, 9, k]),
            helper.make_tensor_value_info("xs", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("xz", TensorProto.UINT8, []),
        ],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w_zp, "w_zp")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    done, path, so = build_onnx(tmp_path, model)
    assert "matmul_integer" not in done.stderr
    x = rng.standard_normal((2, 9, k)).astype(np.float32) * 3
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = run_all(so, [x])
    for g, w_, name in zip(got, want, ["y", "xq", "xs", "xz"]):
        assert g.dtype == w_.dtype and np.array_equal(g, w_), name
    report = done.stdout + done.stderr
    assert "2 operators on relaxc's kernel library" in report, report


def test_a_model_quantized_by_onnx_runtime_runs_on_int8_kernels(tmp_path):
    """An MLP (MatMul + Add + Relu, twice) through ORT's quantize_dynamic (int8 weights, the
    files Hugging Face Optimum ships): its MatMulIntegers and DynamicQuantizeLinears run on the
    kernel library, and its outputs are within 1e-4 of ORT's on the same file."""
    onnx, ort = onnx_tools()
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(4)
    dims = [48, 96, 40]
    inits, nodes, x = [], [], "x"
    for i in range(2):
        inits += [
            numpy_helper.from_array(rng.standard_normal((dims[i], dims[i + 1])).astype(np.float32) * 0.2, f"w{i}"),
            numpy_helper.from_array(rng.standard_normal(dims[i + 1]).astype(np.float32) * 0.1, f"b{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"fc{i}"),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"bias{i}"),
            helper.make_node("Relu", [f"a{i}"], [f"h{i}"], name=f"relu{i}"),
        ]
        x = f"h{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dims[0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", dims[-1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    f32, q8 = str(tmp_path / "f32.onnx"), str(tmp_path / "q8.onnx")
    onnx.save(model, f32)
    quantize_dynamic(f32, q8, weight_type=QuantType.QInt8)
    ops = {n.op_type for n in onnx.load(q8).graph.node}
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops, ops
    done, path, so = build_onnx(tmp_path, onnx.load(q8), "--shape", "x=5,48")
    report = done.stdout + done.stderr
    assert "4 operators on relaxc's kernel library" in report, report
    inp = rng.standard_normal((5, dims[0])).astype(np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": inp})[0]
    got = run_all(so, [inp])[0]
    err = float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))
    print(json.dumps({"max difference relative to max(1, |ORT|)": err}))
    assert err <= 1e-4, err


def test_fake_quantize_is_quantize_then_dequantize(library):
    """relaxc.fake_quantize against QuantizeLinear then DequantizeLinear in numpy: ties to even,
    both saturations, int8 and uint8 ranges, a dequantize scale other than the quantize's."""
    x = np.concatenate(
        [
            np.array([0.25, 0.75, -0.25, -0.75, 1.25, 100.0, -100.0, 0.0], np.float32),
            np.linspace(-40, 40, 999, dtype=np.float32),
        ]
    )
    cases = [(0.5, 3.0, 0.0, 255.0, 0.5), (0.5, -6.0, -128.0, 127.0, 0.5), (0.1, 0.0, -128.0, 127.0, 0.1)]
    cases += [(0.1, 3.0, 0.0, 255.0, 1.0), (1.0, -2.0, -128.0, 127.0, 0.037)]  # another dequantize scale
    for scale, zp, lo, hi, out_scale in cases:
        got = np.zeros_like(x)
        library["relaxc.fake_quantize"](t(x), t(np.array([scale, zp, lo, hi, out_scale], np.float32)), t(got))
        q = np.clip(np.rint(x / np.float32(scale)) + zp, lo, hi)
        want = ((q - zp) * np.float32(out_scale)).astype(np.float32)
        assert np.array_equal(got, want), (scale, zp, np.argwhere(got != want)[:5])


def small_cnn():
    """Conv, Relu, a strided Conv, Relu, GlobalAveragePool, Flatten, Gemm: float32, batch 1."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(6)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w0"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b0"),
        numpy_helper.from_array(rng.standard_normal((12, 8, 3, 3)).astype(np.float32) * 0.2, "w1"),
        numpy_helper.from_array(rng.standard_normal(12).astype(np.float32) * 0.1, "b1"),
        numpy_helper.from_array(rng.standard_normal((5, 12)).astype(np.float32) * 0.3, "fc"),
        numpy_helper.from_array(rng.standard_normal(5).astype(np.float32) * 0.1, "fcb"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("GlobalAveragePool", ["r1"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 20, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def bn_cnn():
    """Conv, BatchNormalization, HardSwish (HardSigmoid times x), a strided Conv,
    BatchNormalization, Relu, GlobalAveragePool, Flatten, Gemm: the layers of a MobileNetV3."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(8)
    arr = lambda *shape, s=1.0: (rng.standard_normal(shape) * s).astype(np.float32)
    bn = lambda name, c: [
        numpy_helper.from_array((1 + 0.2 * rng.standard_normal(c)).astype(np.float32), name + "_g"),
        numpy_helper.from_array(arr(c, s=0.1), name + "_b"),
        numpy_helper.from_array(arr(c, s=0.1), name + "_m"),
        numpy_helper.from_array((0.5 + rng.random(c)).astype(np.float32), name + "_v"),
    ]
    inits = [
        numpy_helper.from_array(arr(8, 3, 3, 3, s=0.3), "w0"),
        *bn("bn0", 8),
        numpy_helper.from_array(arr(12, 8, 3, 3, s=0.2), "w1"),
        *bn("bn1", 12),
        numpy_helper.from_array(arr(5, 12, s=0.3), "fc"),
        numpy_helper.from_array(arr(5, s=0.1), "fcb"),
    ]
    norm = lambda name, x, y: helper.make_node(
        "BatchNormalization", [x, name + "_g", name + "_b", name + "_m", name + "_v"], [y], name=name
    )
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        norm("bn0", "c0", "n0"),
        helper.make_node("HardSigmoid", ["n0"], ["s0"], name="hs0", alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["n0", "s0"], ["h0"], name="swish0"),
        helper.make_node("Conv", ["h0", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1], strides=[2, 2]),
        norm("bn1", "c1", "n1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("GlobalAveragePool", ["r1"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "bn_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 21, 19])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_a_dynamically_quantized_cnn_gives_onnx_runtimes_bytes(tmp_path):
    """quantize_dynamic on convolutions with BatchNormalization, HardSwish and global average
    pooling between them: every DynamicQuantizeLinear sees ORT's floats, so the output is ORT's
    bit for bit (BatchNormalization in ORT's arithmetic after the exact integer convolution, not
    folded into its weights; the pooling's sums in ORT's order)."""
    onnx, ort = onnx_tools()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    f32, q8 = str(tmp_path / "f32.onnx"), str(tmp_path / "q8.onnx")
    onnx.save(bn_cnn(), f32)
    quantize_dynamic(f32, q8, weight_type=QuantType.QInt8, op_types_to_quantize=["Conv"])
    model = onnx.load(q8)
    assert {"ConvInteger", "BatchNormalization", "GlobalAveragePool"} <= {n.op_type for n in model.graph.node}
    done, path, so = build_onnx(tmp_path, model)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(9)
    for _ in range(3):
        inp = rng.uniform(-1, 1, (1, 3, 21, 19)).astype(np.float32)
        want = session.run(None, {"x": inp})[0]
        got = run_all(so, [inp])[0]
        assert np.array_equal(got, want), float(np.abs(got - want).max())


@pytest.mark.parametrize("form", ["QDQ", "QOperator", "dynamic"])
def test_onnx_runtimes_int8_forms_of_a_cnn_build_and_match_it(tmp_path, form):
    """A CNN through ORT's quantize_static (QDQ and QOperator forms) and quantize_dynamic
    (ConvInteger): each builds; the static forms' outputs are ORT's exactly (their convolutions
    and the Gemm's matmul in ORT's integer arithmetic and requantization), the dynamic form's
    within 1e-4 (its convolution sums are exact in float at these sizes)."""
    onnx, ort = onnx_tools()
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    rng = np.random.default_rng(7)
    samples = [rng.uniform(-1, 1, (1, 3, 20, 20)).astype(np.float32) for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter({"x": s} for s in samples)

        def get_next(self):
            return next(self.items, None)

    f32, q8 = str(tmp_path / "f32.onnx"), str(tmp_path / "q8.onnx")
    onnx.save(small_cnn(), f32)
    if form == "dynamic":
        quantize_dynamic(f32, q8, weight_type=QuantType.QInt8, op_types_to_quantize=["Conv"])
    else:
        quantize_static(f32, q8, Reader(), quant_format=getattr(QuantFormat, form))
    model = onnx.load(q8)
    ops = {n.op_type for n in model.graph.node}
    expected = {"QDQ": "QuantizeLinear", "QOperator": "QLinearConv", "dynamic": "ConvInteger"}[form]
    assert expected in ops, ops
    done, path, so = build_onnx(tmp_path, model)
    inp = samples[0]
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": inp})[0]
    got = run_all(so, [inp])[0]
    err = float(np.abs(got - want).max())
    scale = max(1.0, float(np.abs(want).max()))
    out = model.graph.output[0].name
    producer = next(n for n in model.graph.node if out in n.output)
    step = 0.0
    if producer.op_type == "DequantizeLinear" and form != "dynamic":
        from onnx import numpy_helper

        scales = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        step = float(np.max(scales[producer.input[1]]))
    print(json.dumps({"form": form, "max difference": err, "output step": step}))
    if form == "dynamic":
        assert err <= 1e-4 * scale, err
    else:
        assert err == 0.0, (err, step)
        assert "computed in ONNX Runtime's integer arithmetic" in done.stdout, done.stdout
    # Both convolutions, the Gemm and (static forms) each activation's quantize-dequantize pair
    # run on the kernel library.
    report = done.stdout + done.stderr
    on_library = int(re.search(r"(\d+) operators on relaxc's kernel library", report).group(1))
    assert on_library >= (3 if form == "dynamic" else 6), report


@pytest.mark.parametrize("form", ["QDQ", "QOperator"])
@pytest.mark.parametrize("activations", ["QUInt8", "QInt8"])
def test_an_int8_softmax_gives_onnx_runtimes_bytes(tmp_path, form, activations):
    """MatMul -> Softmax quantized by ORT (a classifier's head): ORT runs the softmax as its
    QLinearSoftmax (an exp table, float sums, its own rounding), relaxc as
    relaxc.quantized_softmax in the same arithmetic, and the matmul in integers: the outputs are
    ORT's, every byte, for unsigned and signed activations."""
    onnx, ort = onnx_tools()
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(11)
    w = numpy_helper.from_array(rng.standard_normal((16, 10)).astype(np.float32) * 0.7, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"], axis=-1)],
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 16])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [6, 10])],
        [w],
    )
    f32, q8 = str(tmp_path / "f32.onnx"), str(tmp_path / "q8.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), f32)
    samples = [rng.uniform(-2, 2, (6, 16)).astype(np.float32) for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter({"x": s} for s in samples)

        def get_next(self):
            return next(self.items, None)

    quantize_static(
        f32, q8, Reader(), quant_format=getattr(QuantFormat, form), activation_type=getattr(QuantType, activations)
    )
    done, path, so = build_onnx(tmp_path, onnx.load(q8))
    assert "softmax(es), adds and multiplies computed in ONNX Runtime's integer arithmetic" in done.stdout, done.stdout
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for inp in samples + [rng.uniform(-4, 4, (6, 16)).astype(np.float32)]:
        want = session.run(None, {"x": inp})[0]
        got = run_all(so, [inp])[0]
        assert np.array_equal(got, want), (np.abs(got - want).max(), got[:1], want[:1])


def qlinear_binary_model(op, shape_a, shape_b, elem):
    """QuantizeLinear(x), QuantizeLinear(y) -> com.microsoft QLinearAdd / QLinearMul -> its
    bytes (as ORT's quantizer writes QOperator files: each operand quantized just before)."""
    from onnx import TensorProto, helper, numpy_helper

    dtype = np.int8 if elem == TensorProto.INT8 else np.uint8
    zps = {"a": 3, "b": -5 if dtype == np.int8 else 120, "c": 7}
    inits = [
        numpy_helper.from_array(np.array(0.037, np.float32), "sa"),
        numpy_helper.from_array(np.array(zps["a"], dtype), "za"),
        numpy_helper.from_array(np.array(0.051, np.float32), "sb"),
        numpy_helper.from_array(np.array(zps["b"], dtype), "zb"),
        numpy_helper.from_array(np.array(0.043 if op == "QLinearAdd" else 0.09, np.float32), "sc"),
        numpy_helper.from_array(np.array(zps["c"], dtype), "zc"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sa", "za"], ["qa"]),
        helper.make_node("QuantizeLinear", ["y", "sb", "zb"], ["qb"]),
        helper.make_node(op, ["qa", "sa", "za", "qb", "sb", "zb", "sc", "zc"], ["c"], domain="com.microsoft"),
    ]
    out_shape = list(np.broadcast_shapes(tuple(shape_a), tuple(shape_b)))
    graph = helper.make_graph(
        nodes,
        "qlinear_binary",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, shape_a),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, shape_b),
        ],
        [helper.make_tensor_value_info("c", elem, out_shape)],
        inits,
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize(
    "shapes",
    [([1, 6, 5, 7], [1, 6, 5, 7]), ([1, 6, 5, 7], [1, 6, 1, 1]), ([1, 6, 1, 1], [1, 6, 5, 7]), ([2, 37], [1])],
    ids=["same", "per-channel", "per-channel-first", "scalar"],
)
@pytest.mark.parametrize("signed", [False, True])
def test_qlinear_add_and_mul_give_onnx_runtimes_bytes(tmp_path, op, shapes, signed):
    """ORT's QLinearAdd / QLinearMul (MLAS's AVX2 add: two fused multiply-adds, a span's broadcast
    value folded in first; its multiply: an int32 product scaled, then the zero point added) as
    relaxc.quantized_binary: every byte ORT's, on the AVX2 and portable paths, for one shape,
    per-channel broadcasting either way round and a scalar."""
    onnx, ort = onnx_tools()
    from onnx import TensorProto

    elem = TensorProto.INT8 if signed else TensorProto.UINT8
    done, path, so = build_onnx(tmp_path, qlinear_binary_model(op, *shapes, elem))
    assert "adds and multiplies computed in ONNX Runtime's integer arithmetic" in done.stdout, done.stdout
    rng = np.random.default_rng(5)
    x = rng.uniform(-6, 6, shapes[0]).astype(np.float32)
    y = rng.uniform(-6, 6, shapes[1]).astype(np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x, "y": y})[0]
    np.savez(tmp_path / "in.npz", arg0=x, arg1=y)
    for isa in ("avx2", "portable"):
        out = tmp_path / f"out_{isa}.npz"
        env = dict(os.environ, RELAXC_QUANT_ISA=isa)
        subprocess.run(
            [relaxc_binary(), "run", so, "--inputs", str(tmp_path / "in.npz"), "--outputs", str(out)],
            check=True,
            env=env,
        )
        got = np.load(out)["out0"]
        assert got.dtype == want.dtype and np.array_equal(got, want), (isa, np.argwhere(got != want)[:5])
