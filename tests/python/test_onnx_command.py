"""python -m relaxc.onnx: an ONNX file as exporters write it to a relaxc model in one command.
A Reshape whose target is computed from Shape, Gather and Concat (which TVM's importer refuses
as is) builds once the shapes are folded; the outputs equal onnx's reference evaluator's; a
symbolic batch stays symbolic; the report says what runs where; an operator TVM cannot import
is an error naming its node; bad --shape arguments are clear errors.

Needs TVM 0.27, onnx and onnxsim (skipped without them, as the summary says)."""

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from test_tvm_ffi import ROOT, relaxc_binary

sys.path.insert(0, os.path.join(ROOT, "python"))
pytest.importorskip("tvm", reason="TVM 0.27 imports ONNX models (pip install apache-tvm==0.27.0.post1)")
onnx = pytest.importorskip("onnx", reason="pip install onnx")
pytest.importorskip("onnxsim", reason="pip install onnxsim (folds the shape arithmetic)")
from onnx import TensorProto, helper, numpy_helper


def exported_cnn(batch="n"):
    """Conv, HardSwish written out (Add, Clip, Mul, Div) and a flatten whose target shape is
    computed from the input's Shape (Gather the batch, Concat with -1), then Gemm: as PyTorch's
    exporter writes x.view(x.size(0), -1)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b"),
        numpy_helper.from_array(rng.standard_normal((10, 8 * 8 * 8)).astype(np.float32) * 0.05, "fc"),
        numpy_helper.from_array(np.array(3.0, np.float32), "three"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(6.0, np.float32), "six"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv0", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Add", ["c", "three"], ["c3"], name="hs_add"),
        helper.make_node("Clip", ["c3", "zero", "six"], ["clip"], name="hs_clip"),
        helper.make_node("Mul", ["c", "clip"], ["m"], name="hs_mul"),
        helper.make_node("Div", ["m", "six"], ["h"], name="hs_div"),
        helper.make_node("Shape", ["h"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "axis0"], ["n"], name="batch_size", axis=0),
        helper.make_node("Concat", ["n", "minus1"], ["target"], name="flat_shape", axis=0),
        helper.make_node("Reshape", ["h", "target"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def build(tmp_path, model, *args):
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    so = str(tmp_path / "m.so")
    env = dict(os.environ, RELAXC=relaxc_binary(), PYTHONPATH=os.path.join(ROOT, "python"))
    done = subprocess.run(
        [sys.executable, "-m", "relaxc.onnx", path, "-o", so, *args], capture_output=True, text=True, env=env
    )
    return done, path, so


def run(so, x):
    import tvm_ffi

    return np.from_dlpack(tvm_ffi.load_module(so)["main"](tvm_ffi.from_dlpack(x))).copy()


def reference(path, x):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(path).run(None, {"x": x})[0]


def test_a_computed_reshape_builds_at_a_given_shape_and_matches_the_reference(tmp_path):
    done, path, so = build(tmp_path, exported_cnn(), "--shape", "x=2,3,16,16", "--exec-mode", "compiled")
    assert done.returncode == 0, done.stderr
    assert "operators on relaxc's kernel library" in done.stdout, done.stdout
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    want = reference(path, x)
    assert np.abs(run(so, x) - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_a_symbolic_batch_stays_symbolic(tmp_path):
    done, path, so = build(tmp_path, exported_cnn())
    assert done.returncode == 0, done.stderr
    assert "symbolic dimensions kept: x ['n', 3, 16, 16]" in done.stdout, done.stdout
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        want = reference(path, x)
        assert np.abs(run(so, x) - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_an_operator_tvm_cannot_import_is_named_with_its_node(tmp_path):
    model = exported_cnn(batch=1)
    model.graph.node.insert(
        1, helper.make_node("MyCustomOp", ["c"], ["c_custom"], name="the_custom_node", domain="com.example")
    )
    model.graph.node[2].input[0] = "c_custom"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    done, _, _ = build(tmp_path, model)
    assert done.returncode == 1
    assert "ONNX node 'the_custom_node' (MyCustomOp)" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "shape, words",
    [
        ("x=2,3", "2 dimensions given, the input has 4"),
        ("y=1,3,16,16", "the model has no input 'y' (its inputs: x)"),
        ("x=1,a,16,16", "write NAME=D0,D1,..."),
    ],
)
def test_bad_shapes_are_clear_errors(tmp_path, shape, words):
    done, _, _ = build(tmp_path, exported_cnn(), "--shape", shape)
    assert done.returncode != 0 and words in done.stderr, done.stderr


def fully_convolutional(size, weights_as_inputs=False):
    """A convolution and a ReLU declared at a fixed 1x3xSIZExSIZE, as older exporters leave a
    placeholder input size that the model's own package rewrites before use; with
    weights_as_inputs, the weight is also listed as a graph input (the habit of IR versions
    before 4), and is a constant all the same."""
    w = np.random.default_rng(2).standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"], name="relu"),
        ],
        "fcn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, size, size])],
        [numpy_helper.from_array(w, "w")],
    )
    graph.value_info.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 4, size, size]))
    if weights_as_inputs:
        graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 3, 3]))
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=3)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("weights_as_inputs", [False, True])
def test_shape_replaces_a_fixed_placeholder_with_a_warning(tmp_path, weights_as_inputs):
    done, path, so = build(tmp_path, fully_convolutional(8, weights_as_inputs), "--shape", "x=1,3,20,24")
    assert done.returncode == 0, done.stderr
    assert "warning: --shape x=1,3,20,24 replaces the file's fixed [1, 3, 8, 8]" in done.stdout, done.stdout
    # Each step is reported with its time.
    for step in ("folded the shape arithmetic", "imported with TVM's ONNX front end", "compiled with relaxc"):
        assert re.search(rf"{step}.*: \d+\.\d s", done.stdout), done.stdout
    x = np.random.default_rng(3).standard_normal((1, 3, 20, 24)).astype(np.float32)
    want = reference(path, x)
    got = run(so, x)
    assert got.shape == (1, 4, 20, 24)
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_a_fixed_shape_the_graph_cannot_take_names_the_node(tmp_path):
    # The Gemm's weight has 8*8*8 inputs: a 32x32 image flattens to 8*16*16.
    done, _, _ = build(tmp_path, exported_cnn(batch=1), "--shape", "x=1,3,32,32")
    assert done.returncode != 0
    assert "replaces the file's fixed [1, 3, 16, 16]" in done.stdout, done.stdout
    assert "ONNX node 'fc' (Gemm)" in done.stderr, done.stderr


def test_a_file_that_is_not_onnx_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00not a model at all")
    env = dict(os.environ, RELAXC=relaxc_binary(), PYTHONPATH=os.path.join(ROOT, "python"))
    done = subprocess.run(
        [sys.executable, "-m", "relaxc.onnx", str(bad), "-o", str(tmp_path / "m.so")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 1 and "not an ONNX model that can be read" in done.stderr, done.stderr


def recurrent_model(op, direction, hidden=5, steps=4, features=3, batch=2, **attrs):  # steps may be a name
    """One LSTM or GRU layer with biases and an initial state that is a graph input, as
    exporters write them; outputs Y and Y_h."""
    rng = np.random.default_rng(len(op) * 100 + len(direction))
    dirs = 2 if direction == "bidirectional" else 1
    gates = {"LSTM": 4, "GRU": 3}[op]
    inits = [
        numpy_helper.from_array(rng.standard_normal((dirs, gates * hidden, features)).astype(np.float32) * 0.5, "W"),
        numpy_helper.from_array(rng.standard_normal((dirs, gates * hidden, hidden)).astype(np.float32) * 0.5, "R"),
        numpy_helper.from_array(rng.standard_normal((dirs, 2 * gates * hidden)).astype(np.float32) * 0.3, "B"),
    ]
    inputs = ["x", "W", "R", "B", "", "h0"]
    if op == "LSTM":
        inits.append(numpy_helper.from_array(rng.standard_normal((dirs, 3 * hidden)).astype(np.float32) * 0.3, "P"))
        inputs += ["", "P"]
    node = helper.make_node(
        op, inputs, ["y", "y_h"], name=f"the_{op.lower()}", hidden_size=hidden, direction=direction, **attrs
    )
    graph = helper.make_graph(
        [node],
        "recurrent",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, batch, features]),
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, [dirs, batch, hidden]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, dirs, batch, hidden]),
            helper.make_tensor_value_info("y_h", TensorProto.FLOAT, [dirs, batch, hidden]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize(
    "op, direction, attrs",
    [
        ("LSTM", "forward", {}),
        ("LSTM", "bidirectional", {}),
        ("GRU", "reverse", {}),
        ("GRU", "bidirectional", {"linear_before_reset": 1}),
    ],
)
@pytest.mark.parametrize("mode", ["compiled", "bytecode"])
def test_recurrent_layers_run_as_one_library_call_per_direction(tmp_path, op, direction, attrs, mode):
    """TVM has no LSTM or GRU converter: relaxc.onnx runs each direction's recurrence as one
    relaxc.lstm_sequence / gru_sequence call, the sequence length kept symbolic where the file
    leaves it so, and every output equals onnx's reference evaluator's at several lengths."""
    import tvm_ffi
    from onnx.reference import ReferenceEvaluator

    done, path, so = build(tmp_path, recurrent_model(op, direction, steps="T", **attrs), "--exec-mode", mode)
    assert done.returncode == 0, done.stderr
    assert "1 recurrent layer(s) (LSTM, GRU): one relaxc.lstm_sequence / gru_sequence call" in done.stdout
    assert "symbolic dimensions kept: x ['T', 2, 3]" in done.stdout, done.stdout
    rng = np.random.default_rng(3)
    dirs = 2 if direction == "bidirectional" else 1
    main = tvm_ffi.load_module(so)["main"]
    for steps in (1, 4, 9):
        x = rng.standard_normal((steps, 2, 3)).astype(np.float32)
        h0 = rng.standard_normal((dirs, 2, 5)).astype(np.float32)
        want = ReferenceEvaluator(path).run(None, {"x": x, "h0": h0})
        got = main(tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(h0))
        for g, w in zip(got, want):
            g = np.from_dlpack(g)
            assert g.shape == w.shape and np.abs(g - w).max() <= 1e-5 * max(1.0, np.abs(w).max()), steps


def test_a_long_sequence_builds_as_fast_and_as_small_as_a_short_one(tmp_path):
    """The build's time and the model's size do not grow with the sequence: an LSTM over 2,000
    steps against the same over 200 (each step was once operators of its own)."""
    sizes, times = {}, {}
    for steps in (200, 2000):
        (tmp_path / str(steps)).mkdir()
        started = time.perf_counter()
        done, _, so = build(tmp_path / str(steps), recurrent_model("LSTM", "bidirectional", hidden=32, steps=steps))
        times[steps] = time.perf_counter() - started
        assert done.returncode == 0, done.stderr
        sizes[steps] = os.path.getsize(so)
    print({"seconds": times, "bytes": sizes})
    assert sizes[2000] <= 1.2 * sizes[200], sizes
    assert times[2000] <= 1.2 * times[200] + 1.0, times


def test_a_recurrent_layer_beyond_the_kernels_is_named(tmp_path):
    done, _, _ = build(tmp_path, recurrent_model("LSTM", "forward", clip=3.0))
    assert done.returncode != 0
    assert "ONNX node 'the_lstm' (LSTM): the clip attribute is not covered" in done.stderr, done.stderr


def test_a_1d_convolution_runs_on_the_kernel_library(tmp_path):
    """Conv over one spatial axis (TVM's conv1d), its bias and ReLU in the library's epilogue."""
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.standard_normal((6, 4, 5)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((6, 1, 3)).astype(np.float32), "dw"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[2, 1], strides=[2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Conv", ["r", "dw"], ["y"], pads=[1, 1], group=6),
    ]
    graph = helper.make_graph(
        nodes,
        "conv1d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 33])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    done, path, so = build(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert done.returncode == 0, done.stderr
    assert "2 operators on relaxc's kernel library, 0 on TVM's kernels" in done.stdout, done.stdout
    x = rng.standard_normal((2, 4, 33)).astype(np.float32)
    want = reference(path, x)
    assert np.abs(run(so, x) - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_an_activation_no_anchor_takes_in_runs_on_the_kernel_library(tmp_path):
    """A convolution, a slice and a squeeze, a bias, then GELU (tanh form) written out with a
    one-element constant of rank 3, as jax2tf exports it (magika's model): the slice keeps the
    GELU out of the convolution's epilogue, so it becomes a relaxc.activation of its own."""
    rng = np.random.default_rng(9)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 4, 3, 1)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(rng.standard_normal((1, 16, 1)).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([3], np.int64), "three"),
        numpy_helper.from_array(np.array(0.044715, np.float32), "cubic"),
        numpy_helper.from_array(np.array(0.7978846, np.float32), "root"),
        numpy_helper.from_array(np.array([[[1.0]]], np.float32), "unit"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Slice", ["c", "zero", "one", "three"], ["s"]),
        helper.make_node("Squeeze", ["s", "three"], ["q"]),
        helper.make_node("Add", ["q", "b"], ["z"]),
        helper.make_node("Mul", ["cubic", "z"], ["z1"]),
        helper.make_node("Mul", ["z", "z1"], ["z2"]),
        helper.make_node("Mul", ["z", "z2"], ["z3"]),
        helper.make_node("Add", ["z", "z3"], ["inner"]),
        helper.make_node("Mul", ["root", "inner"], ["scaled"]),
        helper.make_node("Tanh", ["scaled"], ["t"]),
        helper.make_node("Add", ["unit", "t"], ["t1"]),
        helper.make_node("Mul", ["half", "t1"], ["g"]),
        helper.make_node("Mul", ["z", "g"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "gelu_after_slice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 302, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    done, path, so = build(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert done.returncode == 0, done.stderr
    assert "2 operators on relaxc's kernel library" in done.stdout, done.stdout
    assert "TVM: tanh" not in done.stdout and "TVM: multiply" not in done.stdout, done.stdout
    x = rng.standard_normal((1, 4, 302, 1)).astype(np.float32)
    want = reference(path, x)
    assert np.abs(run(so, x) - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_activations_are_identified_by_what_they_compute():
    """A one-element constant of any rank is a scalar; a plain scale is no hard_swish (its gate
    never clips), where HardSwish written out is."""
    from relaxc.tvm.patterns import _identify

    unit = np.array([[[1.0]]])
    assert _identify(lambda x: 0.5 * x * (unit + np.tanh(0.7978846 * (x + 0.044715 * x**3))))[0] == "gelu_tanh"
    assert _identify(lambda x: 0.7978846 * x) is None
    name, slope, offset = _identify(lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0)
    assert name == "hard_swish" and abs(slope - 1 / 6) < 1e-6 and abs(offset - 0.5) < 1e-6


def test_transcendentals_left_to_tvm_use_its_fast_forms(tmp_path):
    """sigmoid(x) * tanh(x) + exp(-x) is no activation the library knows, so it stays on TVM's
    kernels: in their polynomial forms (no relax.sigmoid, tanh or exp left to call libm), within
    1e-6 of onnx's reference."""
    from relaxc.onnx import _fast_math

    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 300), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.multiply(relax.op.sigmoid(x), relax.op.tanh(x)))
            out = bb.emit_output(relax.op.add(y, relax.op.exp(relax.op.negative(x))))
        bb.emit_func_output(out)
    text = _fast_math(bb.get()).script()
    for op in ("R.sigmoid(", "R.tanh(", "R.exp("):
        assert op not in text, text

    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Tanh", ["x"], ["t"]),
        helper.make_node("Mul", ["s", "t"], ["st"]),
        helper.make_node("Neg", ["x"], ["n"]),
        helper.make_node("Exp", ["n"], ["e"]),
        helper.make_node("Add", ["st", "e"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "transcendentals",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 300])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    done, path, so = build(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert done.returncode == 0, done.stderr
    x = (np.random.default_rng(4).standard_normal((4, 300)) * 4).astype(np.float32)
    want = reference(path, x)
    assert np.abs(run(so, x) - want).max() <= 1e-6 * max(1.0, np.abs(want).max())


def test_reductions_left_to_tvm_split_their_outputs_between_threads():
    """A sum over rows and a max over columns stay TVM's kernels (the library has neither along
    these axes); relaxc.tvm.schedule gives each a parallel loop over its outputs, each output
    still reduced in TVM's order (exact for max, as TVM's for sum)."""
    from relaxc.tvm.schedule import FuseAndParallelize

    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 512), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            total = bb.emit(relax.op.sum(relax.op.multiply(x, x), axis=[0]))
            peak = bb.emit(relax.op.max(x, axis=[1]))
            out = bb.emit_output(relax.Tuple([total, peak]))
        bb.emit_func_output(out)
    mod = FuseAndParallelize()(bb.get())
    kernels = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(kernels) == 2, mod.script()
    for kernel in kernels:
        assert "T.parallel" in kernel.script(), kernel.script()
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    data = np.random.default_rng(2).standard_normal((64, 512)).astype(np.float32)
    total, peak = vm["main"](tvm.runtime.tensor(data))
    np.testing.assert_array_equal(peak.numpy(), data.max(axis=1))
    np.testing.assert_allclose(total.numpy(), (data.astype(np.float64) ** 2).sum(axis=0), rtol=1e-5)


def test_broadcast_rows_left_to_tvm_are_vectorized_along_their_last_axis():
    """x + bias[row] over rows 100 wide: parallel over rows, the last axis vectorized as it is, so
    no lane divides its index by the row length to find its bias; the sums are exact."""
    from relaxc.tvm.schedule import FuseAndParallelize

    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((300, 100), "float32"))
    bias = relax.const(np.arange(100, dtype=np.float32).reshape(1, 100))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.multiply(x, x), bias))
        bb.emit_func_output(out)
    mod = FuseAndParallelize()(bb.get())
    (kernel,) = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    text = kernel.script()
    assert "T.parallel" in text and "T.vectorized" in text, text
    assert not re.search(r"(//|%) T\.int64\(100\)", text), text
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    data = np.random.default_rng(6).standard_normal((300, 100)).astype(np.float32)
    np.testing.assert_array_equal(
        vm["main"](tvm.runtime.tensor(data)).numpy(), data * data + np.arange(100, dtype=np.float32)
    )
