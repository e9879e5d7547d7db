"""ONNX Runtime's own com.microsoft operators, as its optimizer and quantizer leave them in the
files they save: each written out by relaxc.onnx as standard operators, built, and compared with
ORT on the same file (which runs its own kernels for them). An operator of that domain relaxc.onnx
does not write out is an error naming it.

Needs TVM 0.27, onnx, onnxsim and onnxruntime (skipped without them, as the summary says)."""

import numpy as np
import pytest
from test_int8 import build_onnx, onnx_tools, run_all

MS = "com.microsoft"


def model_of(nodes, inputs, outputs, inits):
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        "contrib",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def case(name):
    """(model, {input: array}) for one operator family."""
    from onnx import helper

    rng = np.random.default_rng(len(name))
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    node = lambda op, i, o, **a: helper.make_node(op, i, o, name=f"the_{op}_{o[0]}", domain=MS, **a)
    if name == "FusedConv":
        nodes = [
            node("FusedConv", ["x", "w", "b"], ["y"], activation="Relu", pads=[1, 1, 1, 1]),
            node("FusedConv", ["y", "w2", "b2", "x"], ["z"], activation="Clip", activation_params=[-0.5, 0.75]),
        ]
        inits = {"w": r(4, 4, 3, 3) * 0.3, "b": r(4), "w2": r(4, 4, 1, 1) * 0.3, "b2": r(4)}
        return model_of(nodes, [("x", [1, 4, 9, 9])], ["z"], inits), {"x": r(1, 4, 9, 9)}
    if name == "FusedGemm":
        nodes = [node("FusedGemm", ["x", "w", "b"], ["y"], transB=1, activation="LeakyRelu", activation_alpha=0.1)]
        return model_of(nodes, [("x", [3, 8])], ["y"], {"w": r(5, 8), "b": r(5)}), {"x": r(3, 8)}
    if name == "FusedMatMul":
        nodes = [node("FusedMatMul", ["a", "b"], ["y"], transB=1, alpha=0.125)]
        return model_of(nodes, [("a", [2, 6, 8]), ("b", [2, 7, 8])], ["y"], {}), {"a": r(2, 6, 8), "b": r(2, 7, 8)}
    if name == "GELUs":
        # Side by side, as models use them (each after its own matmul), not one of another.
        nodes = [
            node("BiasGelu", ["x", "bias"], ["g1"]),
            node("FastGelu", ["x", "bias"], ["g2"]),
            node("QuickGelu", ["x"], ["g3"], alpha=1.5),
            node("Gelu", ["x"], ["g4"]),
        ]
        return model_of(nodes, [("x", [4, 16])], ["g1", "g2", "g3", "g4"], {"bias": r(16)}), {"x": r(4, 16) * 2}
    if name == "SkipLayerNormalization":
        nodes = [
            node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], ["y", "", "", "sum"], epsilon=1e-5),
            node("SkipSimplifiedLayerNormalization", ["y", "sum", "gamma"], ["z"], epsilon=1e-6),
        ]
        inits = {"gamma": r(32), "beta": r(32), "bias": r(32)}
        return model_of(nodes, [("x", [2, 5, 32]), ("skip", [2, 5, 32])], ["z", "sum"], inits), {
            "x": r(2, 5, 32),
            "skip": r(2, 5, 32),
        }
    if name == "DynamicQuantizeLSTM":
        hidden, features = 6, 4
        q = lambda *s: rng.integers(-127, 128, s).astype(np.int8)
        inits = {
            "W": q(1, features, 4 * hidden),
            "R": q(1, hidden, 4 * hidden),
            "B": r(1, 8 * hidden) * 0.1,
            "W_scale": np.array([0.01], np.float32),
            "W_zp": np.zeros(1, np.int8),
            "R_scale": np.full((1, 4 * hidden), 0.008, np.float32),
            "R_zp": np.zeros((1, 4 * hidden), np.int8),
        }
        inputs = ["x", "W", "R", "B", "", "", "", "", "W_scale", "W_zp", "R_scale", "R_zp"]
        nodes = [node("DynamicQuantizeLSTM", inputs, ["y", "y_h"], hidden_size=hidden)]
        return model_of(nodes, [("x", [7, 1, features])], ["y", "y_h"], inits), {"x": r(7, 1, features)}
    if name == "Attention":
        hidden, heads = 16, 4
        nodes = [node("Attention", ["x", "w", "b", "mask"], ["y"], num_heads=heads)]
        inits = {"w": r(hidden, 3 * hidden) * 0.3, "b": r(3 * hidden) * 0.1}
        model = model_of(nodes, [("x", [2, 5, hidden])], ["y"], inits)
        model.graph.input.append(helper.make_tensor_value_info("mask", 6, [2, 5]))
        mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)
        return model, {"x": r(2, 5, hidden), "mask": mask}
    if name == "MultiHeadAttention":
        hidden, heads = 16, 2
        nodes = [node("MultiHeadAttention", ["q", "k", "v", "bias"], ["y"], num_heads=heads)]
        model = model_of(
            nodes, [("q", [1, 3, hidden]), ("k", [1, 6, hidden]), ("v", [1, 6, hidden])], ["y"], {"bias": r(3 * hidden)}
        )
        return model, {"q": r(1, 3, hidden), "k": r(1, 6, hidden), "v": r(1, 6, hidden)}
    raise AssertionError(name)


# DynamicQuantizeLSTM: ORT quantizes x and h to 8 bits at every step, relaxc runs the step in
# float on the dequantized weights; the outputs differ by about that quantization.
TOLERANCE = {"DynamicQuantizeLSTM": 2e-2}


@pytest.mark.parametrize(
    "name",
    [
        "FusedConv",
        "FusedGemm",
        "FusedMatMul",
        "GELUs",
        "SkipLayerNormalization",
        "Attention",
        "MultiHeadAttention",
        "DynamicQuantizeLSTM",
    ],
)
def test_onnx_runtime_operators_build_and_match_it(tmp_path, name):
    onnx, ort = onnx_tools()
    model, feeds = case(name)
    done, path, so = build_onnx(tmp_path, model)
    assert "ONNX Runtime operators written as standard ones" in done.stdout, done.stdout
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = run_all(so, list(feeds.values()))
    tolerance = TOLERANCE.get(name, 1e-5)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        err = float(np.abs(g - w).max()) / max(1.0, float(np.abs(w).max()))
        assert err <= tolerance, (name, err)


def test_an_onnx_runtime_operator_not_written_out_is_named(tmp_path):
    from onnx import helper

    onnx_tools()
    node = helper.make_node("Rfft", ["x"], ["y"], name="the_rfft", domain=MS)
    from test_onnx_command import build

    done, _, _ = build(tmp_path, model_of([node], [("x", [8])], ["y"], {}))
    assert done.returncode != 0
    assert "ONNX node 'the_rfft' (Rfft)" in done.stderr and "com.microsoft" in done.stderr, done.stderr
