"""ONNX control flow through python -m relaxc.onnx: If, Loop and Scan run as Relax control flow in
both execution modes, every output equal to onnx's reference evaluator's.

A Loop is a Relax function for its body that the runtime's relaxc.onnx_loop calls once per
iteration (no nesting: tens of thousands of iterations run); its scan outputs are stacked by the
runtime; a value of the enclosing graph the body reads is passed in; a carried value may change
shape between iterations. A Scan is written as the Loop that does the same. Cases: stopping on
the trip count, on the body's condition, before the first iteration; reversed scan inputs and
outputs and scan outputs on another axis; an If's both branches.

Needs TVM 0.27, onnx and onnxsim (skipped without them, as the summary says)."""

import numpy as np
import pytest
from test_onnx_command import build

onnx = pytest.importorskip("onnx", reason="pip install onnx")
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

MODES = ["bytecode", "compiled"]


def model(nodes, inputs, outputs, opset=17):
    graph = h.make_graph(nodes, "control_flow", inputs, outputs)
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def built(tmp_path, m, mode):
    done, path, so = build(tmp_path, m, "--exec-mode", mode)
    assert done.returncode == 0, done.stdout + done.stderr
    return path, so


def check(path, so, feeds, want=None):
    """so's outputs on feeds (in the graph's input order) equal `want`, else the reference
    evaluator's."""
    import tvm_ffi
    from onnx.reference import ReferenceEvaluator

    want = want if want is not None else ReferenceEvaluator(path).run(None, feeds)
    got = tvm_ffi.load_module(so)["main"](
        *[tvm_ffi.from_dlpack(np.require(v, requirements="C")) for v in feeds.values()]
    )
    got = list(got) if len(want) > 1 else [got]
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.from_dlpack(g)
        assert g.shape == w.shape, (i, g.shape, w.shape)
        assert np.array_equal(g, w), (i, g, w)


def counter_loop():
    """(M, c0, x0, w) -> (x after the loop, each iteration's x * w stacked): x <- 2x + i, going on
    while sum(x) < 1000; w is read by the body from the enclosing graph (after a Relu there)."""
    body = h.make_graph(
        [
            h.make_node("Cast", ["i"], ["i_f"], to=TP.FLOAT),
            h.make_node("Mul", ["x", "two"], ["x2"]),
            h.make_node("Add", ["x2", "i_f"], ["x_next"]),
            h.make_node("Mul", ["x_next", "w"], ["scan"]),
            h.make_node("ReduceSum", ["x_next"], ["total"], keepdims=0),
            h.make_node("Less", ["total", "limit"], ["cond_next"]),
        ],
        "body",
        [
            h.make_tensor_value_info("i", TP.INT64, []),
            h.make_tensor_value_info("cond", TP.BOOL, []),
            h.make_tensor_value_info("x", TP.FLOAT, [4]),
        ],
        [
            h.make_tensor_value_info("cond_next", TP.BOOL, []),
            h.make_tensor_value_info("x_next", TP.FLOAT, [4]),
            h.make_tensor_value_info("scan", TP.FLOAT, [4]),
        ],
        [nh.from_array(np.array(2.0, np.float32), "two"), nh.from_array(np.array(1000.0, np.float32), "limit")],
    )
    return model(
        [h.make_node("Relu", ["w_in"], ["w"]), h.make_node("Loop", ["M", "c0", "x0"], ["x_final", "scans"], body=body)],
        [
            h.make_tensor_value_info("M", TP.INT64, []),
            h.make_tensor_value_info("c0", TP.BOOL, []),
            h.make_tensor_value_info("x0", TP.FLOAT, [4]),
            h.make_tensor_value_info("w_in", TP.FLOAT, [4]),
        ],
        [h.make_tensor_value_info("x_final", TP.FLOAT, [4]), h.make_tensor_value_info("scans", TP.FLOAT, ["T", 4])],
    )


@pytest.mark.parametrize("mode", MODES)
def test_a_loop_stops_on_its_trip_count_or_its_condition_and_stacks_its_scan_outputs(tmp_path, mode):
    path, so = built(tmp_path, counter_loop(), mode)
    rng = np.random.default_rng(0)
    # Trip counts that end the loop, a condition that ends it first (100), none at all (0, and
    # a false condition on entry).
    for trip, go in [(5, True), (100, True), (0, True), (3, False), (1, True)]:
        feeds = {
            "M": np.array(trip, np.int64),
            "c0": np.array(go),
            "x0": rng.uniform(-1, 1, 4).astype(np.float32),
            "w_in": rng.uniform(-1, 1, 4).astype(np.float32),
        }
        # The reference evaluator cannot stack zero scan outputs: no iteration leaves x0 and [0, 4].
        none = [feeds["x0"], np.zeros((0, 4), np.float32)] if trip == 0 or not go else None
        check(path, so, feeds, none)


@pytest.mark.parametrize("mode", MODES)
def test_a_carried_value_may_change_shape_and_the_body_may_branch(tmp_path, mode):
    """x <- concat(x, [i < 3 ? i * scale : -i]): x grows by one each iteration, through an If
    nested in the body that reads the graph input `scale`."""
    then_g = h.make_graph(
        [h.make_node("Mul", ["i_f", "scale"], ["v"])], "then", [], [h.make_tensor_value_info("v", TP.FLOAT, [1])]
    )
    else_g = h.make_graph(
        [h.make_node("Neg", ["i_f"], ["v2"])], "else", [], [h.make_tensor_value_info("v2", TP.FLOAT, [1])]
    )
    body = h.make_graph(
        [
            h.make_node("Cast", ["i"], ["i_f0"], to=TP.FLOAT),
            h.make_node("Reshape", ["i_f0", "one_shape"], ["i_f"]),
            h.make_node("Less", ["i", "three"], ["small"]),
            h.make_node("If", ["small"], ["val"], then_branch=then_g, else_branch=else_g),
            h.make_node("Concat", ["x", "val"], ["x_next"], axis=0),
            h.make_node("Identity", ["cond"], ["cond_next"]),
        ],
        "body",
        [
            h.make_tensor_value_info("i", TP.INT64, []),
            h.make_tensor_value_info("cond", TP.BOOL, []),
            h.make_tensor_value_info("x", TP.FLOAT, None),
        ],
        [h.make_tensor_value_info("cond_next", TP.BOOL, []), h.make_tensor_value_info("x_next", TP.FLOAT, None)],
        [nh.from_array(np.array([1], np.int64), "one_shape"), nh.from_array(np.array(3, np.int64), "three")],
    )
    m = model(
        [h.make_node("Loop", ["M", "", "x0"], ["x_final"], body=body)],
        [
            h.make_tensor_value_info("M", TP.INT64, []),
            h.make_tensor_value_info("x0", TP.FLOAT, [2]),
            h.make_tensor_value_info("scale", TP.FLOAT, [1]),
        ],
        [h.make_tensor_value_info("x_final", TP.FLOAT, ["n"])],
    )
    path, so = built(tmp_path, m, mode)
    x0, scale = np.array([5, 6], np.float32), np.array([2.5], np.float32)
    for trip in (0, 2, 6):
        # onnx 1.23's reference evaluator returns x0 here: the expected values are written out.
        want = x0
        for i in range(trip):
            want = np.concatenate([want, i * scale if i < 3 else np.array([-i], np.float32)])
        check(path, so, {"M": np.array(trip, np.int64), "x0": x0, "scale": scale}, [want])


def test_a_long_loop_runs_without_nesting_calls(tmp_path):
    """50,000 iterations: the runtime iterates (a Relax function calling itself would nest one
    call per iteration, beyond the VM's limit of 4,096)."""
    body = h.make_graph(
        [h.make_node("Add", ["x", "one"], ["x_next"]), h.make_node("Identity", ["cond"], ["cond_next"])],
        "body",
        [
            h.make_tensor_value_info("i", TP.INT64, []),
            h.make_tensor_value_info("cond", TP.BOOL, []),
            h.make_tensor_value_info("x", TP.FLOAT, [4]),
        ],
        [h.make_tensor_value_info("cond_next", TP.BOOL, []), h.make_tensor_value_info("x_next", TP.FLOAT, [4])],
        [nh.from_array(np.array(1.0, np.float32), "one")],
    )
    m = model(
        [h.make_node("Loop", ["M", "", "x0"], ["x_final"], body=body)],
        [h.make_tensor_value_info("M", TP.INT64, []), h.make_tensor_value_info("x0", TP.FLOAT, [4])],
        [h.make_tensor_value_info("x_final", TP.FLOAT, [4])],
    )
    import tvm_ffi

    for mode in MODES:
        (tmp_path / mode).mkdir()
        _, so = built(tmp_path / mode, m, mode)
        got = tvm_ffi.load_module(so)["main"](
            tvm_ffi.from_dlpack(np.array(50000, np.int64)), tvm_ffi.from_dlpack(np.zeros(4, np.float32))
        )
        assert np.array_equal(np.from_dlpack(got), np.full(4, 50000, np.float32)), mode


def scan_model():
    """Scan over x [T, 3] (forward, axis 0) and y [3, T] (reversed, axis 1) with a state s [3]:
    s <- s + x_t; outputs s * y_t stacked reversed, and s stacked along axis 1."""
    body = h.make_graph(
        [
            h.make_node("Add", ["s", "xe"], ["s_next"]),
            h.make_node("Mul", ["s_next", "ye"], ["out_e"]),
            h.make_node("Identity", ["s_next"], ["cum_e"]),
        ],
        "scan_body",
        [
            h.make_tensor_value_info("s", TP.FLOAT, [3]),
            h.make_tensor_value_info("xe", TP.FLOAT, [3]),
            h.make_tensor_value_info("ye", TP.FLOAT, [3]),
        ],
        [
            h.make_tensor_value_info("s_next", TP.FLOAT, [3]),
            h.make_tensor_value_info("out_e", TP.FLOAT, [3]),
            h.make_tensor_value_info("cum_e", TP.FLOAT, [3]),
        ],
    )
    scan = h.make_node(
        "Scan",
        ["s0", "x", "y"],
        ["s_final", "outs", "cums"],
        body=body,
        num_scan_inputs=2,
        scan_input_axes=[0, 1],
        scan_input_directions=[0, 1],
        scan_output_axes=[0, 1],
        scan_output_directions=[1, 0],
    )
    return model(
        [scan],
        [
            h.make_tensor_value_info("s0", TP.FLOAT, [3]),
            h.make_tensor_value_info("x", TP.FLOAT, ["T", 3]),
            h.make_tensor_value_info("y", TP.FLOAT, [3, "T"]),
        ],
        [
            h.make_tensor_value_info("s_final", TP.FLOAT, [3]),
            h.make_tensor_value_info("outs", TP.FLOAT, ["T", 3]),
            h.make_tensor_value_info("cums", TP.FLOAT, [3, "T"]),
        ],
        opset=16,
    )


@pytest.mark.parametrize("mode", MODES)
def test_a_scan_runs_as_a_loop_in_every_direction_and_axis(tmp_path, mode):
    done, path, so = build(tmp_path, scan_model(), "--exec-mode", mode)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 Scan(s) written as Loop(s)" in done.stdout, done.stdout
    rng = np.random.default_rng(1)
    for steps in (1, 5, 9):
        feeds = {
            "s0": rng.standard_normal(3).astype(np.float32),
            "x": rng.standard_normal((steps, 3)).astype(np.float32),
            "y": rng.standard_normal((3, steps)).astype(np.float32),
        }
        # Scan's definition, written out (onnx's reference evaluator takes no reversed scan).
        state, outs, cums = feeds["s0"], [], []
        for t in range(steps):
            state = state + feeds["x"][t]
            outs.append(state * feeds["y"][:, steps - 1 - t])
            cums.append(state)
        check(path, so, feeds, [state, np.stack(outs[::-1]), np.stack(cums, axis=1)])


def test_an_empty_scan_gives_empty_outputs(tmp_path):
    """T = 0: no iteration; the states pass through and the scan outputs are empty (ONNX Runtime
    1.32 stops on a division by zero here)."""
    import tvm_ffi

    _, so = built(tmp_path, scan_model(), "compiled")
    s0 = np.array([1, 2, 3], np.float32)
    got = tvm_ffi.load_module(so)["main"](
        *[tvm_ffi.from_dlpack(v) for v in (s0, np.zeros((0, 3), np.float32), np.zeros((3, 0), np.float32))]
    )
    shapes = [np.from_dlpack(g).shape for g in got]
    assert shapes == [(3,), (0, 3), (3, 0)], shapes
    assert np.array_equal(np.from_dlpack(got[0]), s0)


@pytest.mark.parametrize("mode", MODES)
def test_both_branches_of_an_if_run(tmp_path, mode):
    """y = sum(x) > 0 ? x * 2 : x - 1, on inputs that take each branch."""
    then_g = h.make_graph(
        [h.make_node("Mul", ["x", "two"], ["a"])], "then", [], [h.make_tensor_value_info("a", TP.FLOAT, [3])]
    )
    else_g = h.make_graph(
        [h.make_node("Sub", ["x", "one"], ["b"])], "else", [], [h.make_tensor_value_info("b", TP.FLOAT, [3])]
    )
    m = model(
        [
            h.make_node("Constant", [], ["two"], value=nh.from_array(np.array(2.0, np.float32))),
            h.make_node("Constant", [], ["one"], value=nh.from_array(np.array(1.0, np.float32))),
            h.make_node("Constant", [], ["zero"], value=nh.from_array(np.array(0.0, np.float32))),
            h.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
            h.make_node("Greater", ["total", "zero"], ["positive"]),
            h.make_node("If", ["positive"], ["y"], then_branch=then_g, else_branch=else_g),
        ],
        [h.make_tensor_value_info("x", TP.FLOAT, [3])],
        [h.make_tensor_value_info("y", TP.FLOAT, [3])],
    )
    path, so = built(tmp_path, m, mode)
    for x in ([1, 2, 3], [-1, -2, 0.5]):
        check(path, so, {"x": np.array(x, np.float32)})


def test_a_scan_output_of_changing_shape_is_named(tmp_path):
    """A scan output whose shape changes between iterations cannot be stacked: the error names
    the Loop and the output."""
    body = h.make_graph(
        [
            h.make_node("Concat", ["x", "x"], ["x_next"], axis=0),
            h.make_node("Identity", ["cond"], ["cond_next"]),
            h.make_node("Identity", ["x_next"], ["grown"]),
        ],
        "body",
        [
            h.make_tensor_value_info("i", TP.INT64, []),
            h.make_tensor_value_info("cond", TP.BOOL, []),
            h.make_tensor_value_info("x", TP.FLOAT, None),
        ],
        [
            h.make_tensor_value_info("cond_next", TP.BOOL, []),
            h.make_tensor_value_info("x_next", TP.FLOAT, None),
            h.make_tensor_value_info("grown", TP.FLOAT, None),
        ],
    )
    m = model(
        [h.make_node("Loop", ["M", "", "x0"], ["x_final", "all"], body=body, name="doubling")],
        [h.make_tensor_value_info("M", TP.INT64, []), h.make_tensor_value_info("x0", TP.FLOAT, [2])],
        [h.make_tensor_value_info("x_final", TP.FLOAT, ["n"]), h.make_tensor_value_info("all", TP.FLOAT, ["t", "m"])],
    )
    done, _, _ = build(tmp_path, m)
    assert done.returncode != 0
    assert "ONNX node 'doubling' (Loop): scan output 'grown' has shape" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_loop_in_a_loop_body_runs(tmp_path):
    """x <- x * 2^3 per outer iteration, by an inner loop adding x to itself three times."""
    import tvm_ffi

    inner = h.make_graph(
        [h.make_node("Add", ["y", "y"], ["y_next"]), h.make_node("Identity", ["c"], ["c_next"])],
        "inner",
        [
            h.make_tensor_value_info("j", TP.INT64, []),
            h.make_tensor_value_info("c", TP.BOOL, []),
            h.make_tensor_value_info("y", TP.FLOAT, [2]),
        ],
        [h.make_tensor_value_info("c_next", TP.BOOL, []), h.make_tensor_value_info("y_next", TP.FLOAT, [2])],
    )
    outer = h.make_graph(
        [
            h.make_node("Loop", ["three", "", "x"], ["x_inner"], body=inner),
            h.make_node("Identity", ["cond"], ["cond_next"]),
        ],
        "outer",
        [
            h.make_tensor_value_info("i", TP.INT64, []),
            h.make_tensor_value_info("cond", TP.BOOL, []),
            h.make_tensor_value_info("x", TP.FLOAT, [2]),
        ],
        [h.make_tensor_value_info("cond_next", TP.BOOL, []), h.make_tensor_value_info("x_inner", TP.FLOAT, [2])],
        [nh.from_array(np.array(3, np.int64), "three")],
    )
    m = model(
        [h.make_node("Loop", ["M", "", "x0"], ["x_final"], body=outer)],
        [h.make_tensor_value_info("M", TP.INT64, []), h.make_tensor_value_info("x0", TP.FLOAT, [2])],
        [h.make_tensor_value_info("x_final", TP.FLOAT, [2])],
    )
    _, so = built(tmp_path, m, "compiled")
    got = tvm_ffi.load_module(so)["main"](
        tvm_ffi.from_dlpack(np.array(2, np.int64)), tvm_ffi.from_dlpack(np.array([1, 2], np.float32))
    )
    assert np.array_equal(np.from_dlpack(got), np.array([64, 128], np.float32))
