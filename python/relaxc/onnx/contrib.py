"""ONNX Runtime's own (com.microsoft) operators that shipped files carry, written as standard
ONNX operators before the import, as ORT's contrib-operator documentation defines them.

ORT's graph optimizer and quantizer leave these in the files they save: fused convolutions and
GEMMs with their activation, FusedMatMul's transposes and scale, the GELU family, the residual
layer norm of transformer encoders, and the dynamically quantized LSTM. Written out, they import
as the operators TVM has, and relaxc.tvm's rewrite fuses them back onto the kernel library (an
activation into its convolution's epilogue, a written-out GELU into one activation call). An
operator of that domain not listed here is left to the import, which names it.
"""

import math

import numpy as np

__all__ = ["expand_contrib"]

_MS = "com.microsoft"


class _Writer:
    """New nodes and constants named after the node they replace."""

    def __init__(self, model, node):
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.model, self.prefix = model, node.name or node.output[0]
        self.nodes, self.count = [], 0

    def name(self, hint):
        self.count += 1
        return f"{self.prefix}__{hint}{self.count}"

    def constant(self, value, hint="c"):
        name = self.name(hint)
        self.model.graph.initializer.append(self.numpy_helper.from_array(np.asarray(value), name))
        return name

    def scalar(self, value):
        return self.constant(np.array(value, np.float32), "k")

    def op(self, op_type, inputs, output=None, **attrs):
        output = output or self.name(op_type.lower())
        self.nodes.append(self.helper.make_node(op_type, inputs, [output], name=self.name(op_type), **attrs))
        return output


def _attrs(node):
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _refuse(node, why):
    from . import OnnxError

    return OnnxError(f"ONNX node {node.name or node.output[0]!r} ({node.op_type}, domain {_MS}): {why}")


def _get(node, i):
    return node.input[i] if i < len(node.input) else ""


def _activation(w, node, x, name, params, output):
    """FusedConv's and FusedGemm's activation of x, by its ONNX name and parameters."""
    name = _text(name or "")
    if name in ("", "Identity"):
        return w.op("Identity", [x], output=output)
    if name in ("Relu", "Tanh", "Sigmoid"):
        return w.op(name, [x], output=output)
    if name == "LeakyRelu":
        return w.op("LeakyRelu", [x], output=output, alpha=float(params[0]) if params else 0.01)
    if name == "HardSigmoid":
        alpha, beta = (list(params) + [0.2, 0.5][len(params) :])[:2]
        return w.op("HardSigmoid", [x], output=output, alpha=float(alpha), beta=float(beta))
    if name == "Clip":
        lo, hi = (list(params) + [-math.inf, math.inf][len(params) :])[:2]
        return w.op("Min", [w.op("Max", [x, w.scalar(lo)]), w.scalar(hi)], output=output)
    raise _refuse(node, f"activation {name!r} is not one relaxc.onnx writes out")


def _fused_conv(w, node, attrs):
    conv_attrs = {k: v for k, v in attrs.items() if k not in ("activation", "activation_params")}
    inputs = [i for i in node.input[:3]]
    y = w.op("Conv", inputs, **conv_attrs)
    if _get(node, 3):
        y = w.op("Add", [y, _get(node, 3)])
    _activation(w, node, y, attrs.get("activation"), attrs.get("activation_params", []), node.output[0])


def _fused_gemm(w, node, attrs):
    gemm_attrs = {k: v for k, v in attrs.items() if k in ("alpha", "beta", "transA", "transB")}
    y = w.op("Gemm", list(node.input), **gemm_attrs)
    params = [attrs[k] for k in ("activation_alpha", "activation_beta", "activation_gamma") if k in attrs]
    _activation(w, node, y, attrs.get("activation"), params, node.output[0])


def _fused_matmul(w, node, attrs):
    if attrs.get("transBatchA", 0) or attrs.get("transBatchB", 0):
        raise _refuse(node, "transBatchA/transBatchB are not written out")

    def last_two_swapped(x, rank_hint):
        return w.op("Transpose", [x], perm=list(range(rank_hint - 2)) + [rank_hint - 1, rank_hint - 2])

    a, b = node.input[0], node.input[1]
    ranks = w.ranks
    if attrs.get("transA", 0):
        a = last_two_swapped(a, ranks.get(a) or 2)
    if attrs.get("transB", 0):
        b = last_two_swapped(b, ranks.get(b) or 2)
    alpha = float(attrs.get("alpha", 1.0))
    if alpha == 1.0:
        w.op("MatMul", [a, b], output=node.output[0])
    else:
        w.op("Mul", [w.op("MatMul", [a, b]), w.scalar(alpha)], output=node.output[0])


def _gelu(w, x, output):
    """0.5 x (1 + erf(x / sqrt 2))."""
    erf = w.op("Erf", [w.op("Mul", [x, w.scalar(1 / math.sqrt(2))])])
    w.op("Mul", [w.op("Mul", [x, w.scalar(0.5)]), w.op("Add", [erf, w.scalar(1.0)])], output=output)


def _gelu_node(w, node, attrs):
    _gelu(w, node.input[0], node.output[0])


def _bias_gelu(w, node, attrs):
    _gelu(w, w.op("Add", [node.input[0], node.input[1]]), node.output[0])


def _fast_gelu(w, node, attrs):
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), x with its bias."""
    x = node.input[0] if not _get(node, 1) else w.op("Add", [node.input[0], node.input[1]])
    cube = w.op("Mul", [w.op("Mul", [x, x]), x])
    inner = w.op("Mul", [w.op("Add", [x, w.op("Mul", [cube, w.scalar(0.044715)])]), w.scalar(math.sqrt(2 / math.pi))])
    half = w.op("Mul", [x, w.scalar(0.5)])
    w.op("Mul", [half, w.op("Add", [w.op("Tanh", [inner]), w.scalar(1.0)])], output=node.output[0])


def _quick_gelu(w, node, attrs):
    """x sigmoid(alpha x)."""
    alpha = float(attrs.get("alpha", 1.702))
    w.op(
        "Mul", [node.input[0], w.op("Sigmoid", [w.op("Mul", [node.input[0], w.scalar(alpha)])])], output=node.output[0]
    )


def _bias_add(w, node, attrs):
    w.op("Add", [w.op("Add", [node.input[0], node.input[1]]), node.input[2]], output=node.output[0])


def _skip_layer_norm(w, node, attrs, simplified=False):
    """input + skip (+ bias), then layer norm (or RMS norm) over the last axis; the optional
    fourth output is that sum. Mean and inverse deviation outputs are not written."""
    if any(_get_out(node, i) for i in (1, 2)):
        raise _refuse(node, "its mean and inverse-deviation outputs are not written out")
    total = w.op("Add", [node.input[0], node.input[1]])
    bias = _get(node, 3 if simplified else 4)
    if bias:
        total = w.op("Add", [total, bias])
    if _get_out(node, 3):
        w.op("Identity", [total], output=node.output[3])
    eps = float(attrs.get("epsilon", 1e-12))
    if simplified:
        mean_square = w.op("ReduceMean", [w.op("Mul", [total, total])], axes=[-1], keepdims=1)
        scale = w.op("Sqrt", [w.op("Add", [mean_square, w.scalar(eps)])])
        w.op("Mul", [w.op("Div", [total, scale]), node.input[2]], output=node.output[0])
        return
    inputs = [total, node.input[2]] + ([_get(node, 3)] if _get(node, 3) else [])
    w.nodes.append(
        w.helper.make_node(
            "LayerNormalization", inputs, [node.output[0]], name=w.name("LayerNormalization"), axis=-1, epsilon=eps
        )
    )


def _get_out(node, i):
    return node.output[i] if i < len(node.output) else ""


def _layer_norm(w, node, attrs):
    """The com.microsoft LayerNormalization of older exports: the standard one (its first output)."""
    if any(_get_out(node, i) for i in (1, 2)):
        raise _refuse(node, "its mean and inverse-deviation outputs are not written out")
    keep = {k: v for k, v in attrs.items() if k in ("axis", "epsilon")}
    w.nodes.append(
        w.helper.make_node(
            "LayerNormalization", list(node.input), [node.output[0]], name=w.name("LayerNormalization"), **keep
        )
    )


def _dynamic_quantize_lstm(w, node, attrs):
    """An LSTM whose W and R are int8 with scales and zero points: dequantized once here into
    the standard LSTM's layout ([D, 4H, input], [D, 4H, H]; ORT's are transposed), which
    relaxc.onnx then runs on its sequence kernel. ORT quantizes X and h at every step, relaxc
    runs the step in float: the outputs differ by about the activations' quantization."""
    values = w.values
    names = {"W": 1, "R": 2, "W_scale": 8, "W_zp": 9, "R_scale": 10, "R_zp": 11}
    got = {k: values.get(_get(node, i)) for k, i in names.items()}
    if any(v is None for v in got.values()):
        missing = [k for k, v in got.items() if v is None]
        raise _refuse(node, f"{', '.join(missing)} must be constants")

    def dequantize(q, scale, zp):
        # q [D, rows, 4H], scale and zp per direction [D] or per column [D, 4H]
        scale, zp = np.asarray(scale, np.float32), np.asarray(zp)
        if scale.ndim == 1:
            scale, zp = scale[:, None, None], zp.reshape(-1)[:, None, None]
        else:
            scale, zp = scale[:, None, :], zp[:, None, :]
        f = (q.astype(np.int32) - zp.astype(np.int32)).astype(np.float32) * scale
        return np.ascontiguousarray(np.transpose(f, (0, 2, 1)))

    weights = dequantize(got["W"], got["W_scale"], got["W_zp"])
    recurrent = dequantize(got["R"], got["R_scale"], got["R_zp"])
    inputs = [node.input[0], w.constant(weights, "W"), w.constant(recurrent, "R")] + [
        _get(node, i) for i in range(3, 8)
    ]
    while inputs and not inputs[-1]:
        inputs.pop()
    keep = {k: v for k, v in attrs.items() if k != "domain"}
    w.nodes.append(w.helper.make_node("LSTM", inputs, list(node.output), name=w.name("LSTM"), **keep))


def _slice_last(w, x, begin, end):
    """x[..., begin:end]."""
    starts, ends, axes = (w.constant(np.array([v], np.int64), "i") for v in (begin, end, -1))
    return w.op("Slice", [x, starts, ends, axes])


def _attend(w, node, q, k, v, heads, scale, mask, mask_filter, output):
    """Multi-head attention of q [B, S, heads * d], k [B, L, heads * d], v [B, L, heads * dv]
    into output [B, S, heads * dv]: softmax(q k^T * scale + mask) v per head, mask from a
    [B, L] tensor of ones (attend) and zeros (do not)."""

    def heads_first(x, perm):
        split = w.op("Reshape", [x, w.constant(np.array([0, 0, heads, -1], np.int64), "shape")])
        return w.op("Transpose", [split], perm=perm)

    qh, kt, vh = heads_first(q, [0, 2, 1, 3]), heads_first(k, [0, 2, 3, 1]), heads_first(v, [0, 2, 1, 3])
    scores = w.op("Mul", [w.op("MatMul", [qh, kt]), w.scalar(scale)])
    if mask:
        keep = w.op("Cast", [mask], to=1)
        penalty = w.op("Mul", [w.op("Sub", [w.scalar(1.0), keep]), w.scalar(mask_filter)])
        scores = w.op("Add", [scores, w.op("Reshape", [penalty, w.constant(np.array([0, 1, 1, -1], np.int64), "m")])])
    context = w.op("Transpose", [w.op("MatMul", [w.op("Softmax", [scores], axis=-1), vh])], perm=[0, 2, 1, 3])
    w.op("Reshape", [context, w.constant(np.array([0, 0, -1], np.int64), "shape")], output=output)


def _mask_2d(w, node, name):
    """A key padding mask [B, L] (ones and zeros), the only form written out; "" for none."""
    if not name:
        return ""
    rank = w.ranks.get(name)
    if rank != 2:
        raise _refuse(
            node, f"its mask {name!r} has rank {rank}: only a [batch, keys] mask of ones and zeros is written out"
        )
    return name


def _only_the_common_form(node, attrs, inputs):
    """An error naming what the attention node uses beyond the form written out: one of
    `inputs` ((index, what)), causal masking, or the present (cache) outputs."""
    for i, what in inputs:
        if _get(node, i):
            raise _refuse(node, f"its {what} input is not written out")
    if attrs.get("unidirectional", 0):
        raise _refuse(node, "unidirectional=1 is not written out")
    if len(node.output) > 1 and any(node.output[1:]):
        raise _refuse(node, "its present outputs are not written out")


def _attention(w, node, attrs):
    """ORT's Attention: one packed projection to q, k and v, then multi-head attention."""
    _only_the_common_form(node, attrs, [(4, "past"), (5, "attention bias"), (6, "past_sequence_length")])
    heads = int(attrs["num_heads"])
    weights = w.values.get(node.input[1])
    if weights is None:
        raise _refuse(node, "its weights must be constants")
    sizes = list(attrs.get("qkv_hidden_sizes", [])) or [weights.shape[1] // 3] * 3
    projected = w.op("MatMul", [node.input[0], node.input[1]])
    if _get(node, 2):
        projected = w.op("Add", [projected, node.input[2]])
    bounds = np.cumsum([0] + sizes)
    q, k, v = (_slice_last(w, projected, int(bounds[i]), int(bounds[i + 1])) for i in range(3))
    scale = float(attrs.get("scale", 0.0)) or 1.0 / math.sqrt(sizes[0] // heads)
    mask = _mask_2d(w, node, _get(node, 3))
    _attend(w, node, q, k, v, heads, scale, mask, float(attrs.get("mask_filter_value", -10000.0)), node.output[0])


def _multi_head_attention(w, node, attrs):
    """ORT's MultiHeadAttention with separate query, key and value [B, S, D] (and an optional
    bias for the three), the common form."""
    _only_the_common_form(node, attrs, [(5, "attention bias"), (6, "past key"), (7, "past value")])
    q, k, v = (_get(node, i) for i in range(3))
    if not (k and v) or any(w.ranks.get(x) not in (None, 3) for x in (q, k, v)):
        raise _refuse(node, "only separate query, key and value of rank 3 are written out (not packed ones)")
    heads = int(attrs["num_heads"])
    if _get(node, 3):
        bias = w.values.get(node.input[3])
        if bias is None:
            raise _refuse(node, "its bias must be a constant")
        d = bias.shape[0] // 3
        q, k, v = (w.op("Add", [x, w.constant(bias[i * d : (i + 1) * d], "bias")]) for i, x in enumerate((q, k, v)))
        head_size = d // heads
    else:
        dims = w.dims.get(_get(node, 0)) or []
        if not dims or not isinstance(dims[-1], int):
            raise _refuse(node, "its query's last dimension must be known")
        head_size = dims[-1] // heads
    scale = float(attrs.get("scale", 0.0)) or 1.0 / math.sqrt(head_size)
    mask = _mask_2d(w, node, _get(node, 4))
    _attend(w, node, q, k, v, heads, scale, mask, float(attrs.get("mask_filter_value", -10000.0)), node.output[0])


EXPANSIONS = {
    "Attention": _attention,
    "MultiHeadAttention": _multi_head_attention,
    "FusedConv": _fused_conv,
    "FusedGemm": _fused_gemm,
    "FusedMatMul": _fused_matmul,
    "Gelu": _gelu_node,
    "BiasGelu": _bias_gelu,
    "FastGelu": _fast_gelu,
    "QuickGelu": _quick_gelu,
    "BiasAdd": _bias_add,
    "SkipLayerNormalization": _skip_layer_norm,
    "SkipSimplifiedLayerNormalization": lambda w, n, a: _skip_layer_norm(w, n, a, simplified=True),
    "LayerNormalization": _layer_norm,
    "DynamicQuantizeLSTM": _dynamic_quantize_lstm,
}


def expand_contrib(model, log=print):
    """The model with the com.microsoft operators of EXPANSIONS written as standard ones (the
    model itself when it has none)."""
    import onnx
    from onnx import numpy_helper

    if not any(n.domain == _MS and n.op_type in EXPANSIONS for n in model.graph.node):
        return model
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ranks, dims = {}, {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
            if v.type.tensor_type.HasField("shape"):
                shape = v.type.tensor_type.shape.dim
                ranks[v.name] = len(shape)
                dims[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in shape]
    except Exception:
        pass
    for t in model.graph.initializer:
        ranks[t.name] = len(t.dims)
        dims[t.name] = list(t.dims)
    nodes, written = [], {}
    for node in model.graph.node:
        expand = EXPANSIONS.get(node.op_type) if node.domain == _MS else None
        if expand is None:
            nodes.append(node)
            continue
        w = _Writer(model, node)
        w.values, w.ranks, w.dims = values, ranks, dims
        expand(w, node, _attrs(node))
        nodes.extend(w.nodes)
        written[node.op_type] = written.get(node.op_type, 0) + 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    log("ONNX Runtime operators written as standard ones: " + ", ".join(f"{k} x{n}" for k, n in written.items()))
    return model
