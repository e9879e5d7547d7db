"""Quantized ONNX operators as the standard ones TVM imports, and constant dequantizations folded.

ONNX Runtime's quantizer writes three forms. Its dynamic form (DynamicQuantizeLinear, then
MatMulInteger) imports as it is and runs on the kernel library's int8 kernels (relaxc.tvm's
rewrite). Its static forms are rewritten here, before the import:

- QOperator nodes (QLinearConv, QLinearMatMul, and ORT's com.microsoft QLinearAdd, QLinearMul,
  QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat,
  QLinearSoftmax, QGemm) become DequantizeLinear -> the float operator -> QuantizeLinear, the QDQ
  form ONNX defines them by;
- ConvInteger (dynamic quantization of a convolution) becomes a float convolution of the
  operands less their zero points, cast to int32: the same integers while the sums stay below
  2^24, within one part in 2^24 beyond;
- QuantizeLinear and DequantizeLinear of constants (the weights of the QDQ form) are folded
  into constants (float in the end),
  so that each convolution and matmul meets float weights and runs on the library's float
  kernels, between its activations' QuantizeLinear and DequantizeLinear.

The float results equal the integer evaluation's up to float rounding (a value on a rounding
boundary of the next QuantizeLinear may land one step over). Any other com.microsoft operator is
left for the import, which names it if TVM has no converter.
"""

import numpy as np

__all__ = ["expand_quantized"]

_MS = "com.microsoft"


def _along_axis(x, scale, zero_point, axis):
    """scale (float32) and zero point shaped to broadcast against x: one value, or one per index
    of x's `axis` (ONNX's per-axis quantization)."""
    scale = np.asarray(scale, np.float32)
    if scale.ndim == 1 and x.ndim > 0:
        shape = [1] * x.ndim
        shape[axis % x.ndim] = scale.size
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape) if zero_point.ndim == 1 else zero_point
    return scale, zero_point


def _dequantize(x, scale, zero_point, axis):
    """ONNX DequantizeLinear in numpy (float32), per tensor or along `axis`."""
    x = np.asarray(x)
    zero_point = np.zeros((), x.dtype) if zero_point is None else np.asarray(zero_point)
    scale, zero_point = _along_axis(x, scale, zero_point, axis)
    return ((x.astype(np.int64) - zero_point.astype(np.int64)).astype(np.float32) * scale).astype(np.float32)


def _quantize(x, scale, zero_point, axis):
    """ONNX QuantizeLinear in numpy: x / scale rounded half to even, plus the zero point,
    saturated to its 8-bit type (uint8 without one)."""
    x = np.asarray(x, np.float32)
    zero_point = np.zeros((), np.uint8) if zero_point is None else np.asarray(zero_point)
    scale, zero_point = _along_axis(x, scale, zero_point, axis)
    info = np.iinfo(zero_point.dtype)
    q = np.rint(x / scale).astype(np.float64) + zero_point.astype(np.float64)
    return np.clip(q, info.min, info.max).astype(zero_point.dtype)


class _Rewriter:
    """The model's nodes rebuilt one by one, with new constants named after the node."""

    def __init__(self, model):
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.model = model
        self.values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        for n in model.graph.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.values[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.nodes, self.count = [], 0
        self.consumers = {}  # value name -> the nodes that read it
        for n in model.graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.graph_outputs = {o.name for o in model.graph.output}
        self.skip = set()  # ids of nodes an expansion has made redundant

    def fresh(self, hint):
        self.count += 1
        return f"{hint}__relaxc{self.count}"

    def constant(self, value, hint):
        name = self.fresh(hint)
        self.model.graph.initializer.append(self.numpy_helper.from_array(np.asarray(value), name))
        self.values[name] = np.asarray(value)
        return name

    def op(self, op_type, inputs, hint, output=None, **attrs):
        output = output or self.fresh(hint)
        self.nodes.append(self.helper.make_node(op_type, inputs, [output], name=self.fresh(hint), **attrs))
        return output

    def input(self, node, i):
        return node.input[i] if i < len(node.input) else ""

    def dequantize(self, x, scale, zero_point, hint, axis=1):
        """x as float: a new constant where x, its scale and zero point are constants, else a
        DequantizeLinear node."""
        if x in self.values and scale in self.values and (not zero_point or zero_point in self.values):
            zp = self.values[zero_point] if zero_point else None
            return self.constant(_dequantize(self.values[x], self.values[scale], zp, axis), hint + "_f32")
        inputs = [x, scale] + ([zero_point] if zero_point else [])
        return self.op("DequantizeLinear", inputs, hint + "_dq", axis=axis)

    def quantize(self, x, scale, zero_point, hint, output):
        inputs = [x, scale] + ([zero_point] if zero_point else [])
        return self.op("QuantizeLinear", inputs, hint + "_q", output=output)


def _attrs(node):
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _qlinear_conv(r, node):
    get = lambda i: r.input(node, i)
    hint = node.name or node.output[0]
    x = r.dequantize(get(0), get(1), get(2), hint + "_x")
    w = r.dequantize(get(3), get(4), get(5), hint + "_w", axis=0)
    inputs = [x, w]
    if get(8):
        bias = get(8)
        if bias in r.values and get(1) in r.values and get(4) in r.values:
            scale = np.asarray(r.values[get(1)], np.float32) * np.asarray(r.values[get(4)], np.float32)
            inputs.append(r.constant((r.values[bias].astype(np.float32) * scale).astype(np.float32), hint + "_b"))
        else:
            scale = r.op("Mul", [get(1), get(4)], hint + "_bscale")
            inputs.append(r.op("Mul", [r.op("Cast", [bias], hint + "_bf", to=1), scale], hint + "_b"))
    y = r.op("Conv", inputs, hint + "_conv", **_attrs(node))
    r.quantize(y, get(6), get(7), hint, node.output[0])


def _qlinear_matmul(r, node):
    get = lambda i: r.input(node, i)
    hint = node.name or node.output[0]
    a = r.dequantize(get(0), get(1), get(2), hint + "_a")
    b_rank = np.ndim(r.values[get(3)]) if get(3) in r.values else 2
    b = r.dequantize(get(3), get(4), get(5), hint + "_b", axis=max(1, b_rank - 1))  # per column
    r.quantize(r.op("MatMul", [a, b], hint + "_matmul"), get(6), get(7), hint, node.output[0])


def _conv_integer(r, node):
    get = lambda i: r.input(node, i)
    hint = node.name or node.output[0]
    one = r.constant(np.array(1.0, np.float32), hint + "_one")
    x = r.dequantize(get(0), one, get(2), hint + "_x")
    w_name = get(1)
    if w_name not in r.values or (get(3) and get(3) not in r.values):
        raise _refuse(node, "its weights (and their zero point) must be constants")
    zp = r.values[get(3)] if get(3) else None
    ones = np.ones(np.shape(zp) if zp is not None and np.ndim(zp) == 1 else (), np.float32)
    w = r.constant(_dequantize(r.values[w_name], ones, zp, 0), hint + "_w")
    # ONNX Runtime's quantizer casts the int32 result straight back to float: then the float
    # convolution's result is that value (the same integers), and the two casts are left out
    # (TVM's float-to-int32 cast checks every value for infinities and wraps it: most of a
    # dynamically quantized classifier's time).
    users = r.consumers.get(node.output[0], [])
    to_float = [u for u in users if u.op_type == "Cast" and _attrs(u).get("to") == 1]
    if users and len(to_float) == len(users) and node.output[0] not in r.graph_outputs:
        y = r.op("Conv", [x, w], hint + "_conv", output=to_float[0].output[0], **_attrs(node))
        for cast in to_float:
            r.skip.add(id(cast))
            if cast is not to_float[0]:
                r.op("Identity", [y], hint + "_same", output=cast.output[0])
        return
    y = r.op("Conv", [x, w], hint + "_conv", **_attrs(node))
    r.op("Cast", [y], hint + "_int", output=node.output[0], to=6)


def _elementwise(op_type):
    def expand(r, node):
        get = lambda i: r.input(node, i)
        hint = node.name or node.output[0]
        a = r.dequantize(get(0), get(1), get(2), hint + "_a")
        b = r.dequantize(get(3), get(4), get(5), hint + "_b")
        r.quantize(r.op(op_type, [a, b], hint + "_op"), get(6), get(7), hint, node.output[0])

    return expand


def _unary(op_type, keep=()):
    """X, X_scale, X_zp, Y_scale, Y_zp -> op (attributes in `keep` passed on)."""

    def expand(r, node):
        get = lambda i: r.input(node, i)
        hint = node.name or node.output[0]
        attrs = {k: v for k, v in _attrs(node).items() if k in keep}
        x = r.dequantize(get(0), get(1), get(2), hint + "_x")
        r.quantize(r.op(op_type, [x], hint + "_op", **attrs), get(3), get(4), hint, node.output[0])

    return expand


def _global_average_pool(r, node):
    if _attrs(node).get("channels_last", 0):
        raise _refuse(node, "channels_last=1 is not expanded")
    _unary("GlobalAveragePool")(r, node)


def _concat(r, node):
    get = lambda i: r.input(node, i)
    hint = node.name or node.output[0]
    parts = [r.dequantize(get(i), get(i + 1), get(i + 2), f"{hint}_{i}") for i in range(2, len(node.input) - 2, 3)]
    y = r.op("Concat", parts, hint + "_concat", axis=_attrs(node).get("axis", 0))
    r.quantize(y, get(0), get(1), hint, node.output[0])


def _qgemm(r, node):
    get = lambda i: r.input(node, i)
    hint = node.name or node.output[0]
    attrs = {k: v for k, v in _attrs(node).items() if k in ("alpha", "transA", "transB")}
    a = r.dequantize(get(0), get(1), get(2), hint + "_a")
    b = r.dequantize(get(3), get(4), get(5), hint + "_b", axis=0 if attrs.get("transB", 0) else 1)
    inputs = [a, b]
    if get(6):
        c = get(6)
        if c in r.values and r.values[c].dtype.kind in "iu":
            scale = np.asarray(r.values[get(1)], np.float32) * np.asarray(r.values[get(4)], np.float32)
            c = r.constant((r.values[c].astype(np.float32) * scale).astype(np.float32), hint + "_c")
        inputs.append(c)
    y = r.op("Gemm", inputs, hint + "_gemm", **attrs)
    if get(7):
        r.quantize(y, get(7), get(8), hint, node.output[0])
    else:
        r.op("Identity", [y], hint + "_out", output=node.output[0])


def _refuse(node, why):
    from . import OnnxError

    return OnnxError(f"ONNX node {node.name or node.output[0]!r} ({node.op_type}): {why}")


# (domain, operator) -> expansion
EXPANSIONS = {
    ("", "QLinearConv"): _qlinear_conv,
    ("", "QLinearMatMul"): _qlinear_matmul,
    ("", "ConvInteger"): _conv_integer,
    (_MS, "QLinearAdd"): _elementwise("Add"),
    (_MS, "QLinearMul"): _elementwise("Mul"),
    (_MS, "QLinearSigmoid"): _unary("Sigmoid"),
    (_MS, "QLinearLeakyRelu"): _unary("LeakyRelu", keep=("alpha",)),
    (_MS, "QLinearGlobalAveragePool"): _global_average_pool,
    (_MS, "QLinearAveragePool"): _unary(
        "AveragePool", keep=("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
    ),
    (_MS, "QLinearConcat"): _concat,
    (_MS, "QLinearSoftmax"): _unary("Softmax", keep=("axis",)),
    (_MS, "QGemm"): _qgemm,
}


def _foldable(r, node):
    """A DequantizeLinear of constants, per tensor or per axis (not blocked)."""
    inputs = [i for i in node.input if i]
    return all(i in r.values for i in inputs) and not _attrs(node).get("block_size", 0)


def expand_quantized(model, log=print):
    """The model with its QOperator and ConvInteger nodes in QDQ form and its constant
    DequantizeLinears folded (the model itself when it has none)."""
    domain = lambda n: "" if n.domain in ("", "ai.onnx") else n.domain
    if not any(
        (domain(n), n.op_type) in EXPANSIONS or n.op_type in ("DequantizeLinear", "QuantizeLinear")
        for n in model.graph.node
    ):
        return model
    r = _Rewriter(model)
    expanded = folded = 0
    for node in model.graph.node:
        if id(node) in r.skip:
            continue
        expand = EXPANSIONS.get((domain(node), node.op_type))
        if expand is not None:
            expand(r, node)
            expanded += 1
        elif node.op_type in ("DequantizeLinear", "QuantizeLinear") and domain(node) == "" and _foldable(r, node):
            # Weights quantized or dequantized in the graph: computed here, once.
            get = lambda i, node=node: r.input(node, i)
            zp = r.values[get(2)] if get(2) else None
            axis = _attrs(node).get("axis", 1)
            fold = _dequantize if node.op_type == "DequantizeLinear" else _quantize
            value = fold(r.values[get(0)], r.values[get(1)], zp, axis)
            r.op("Identity", [r.constant(value, node.name or node.output[0])], "fold", output=node.output[0])
            r.values[node.output[0]] = value
            folded += 1
        else:
            r.nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(r.nodes)
    if expanded:
        log(
            f"{expanded} quantized operator(s) (QOperator form, ConvInteger) written as DequantizeLinear, the float operator, QuantizeLinear"
        )
    if folded:
        log(f"{folded} QuantizeLinear/DequantizeLinear(s) of constants folded (weights)")
    return model
