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
        self.producer = {o: n for n in model.graph.node for o in n.output}
        # A folded DequantizeLinear's output -> (its integers, scale, zero point, axis)
        self.integers = {}
        self.exact_qlinear = 0  # QLinearConvs written in the exact form
        self.gone = set()  # outputs of nodes an exact form replaced (no node gives them any more)

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


# Exact int8 convolutions. ONNX Runtime runs an int8 convolution (QLinearConv, or the QDQ form's
# DequantizeLinear -> Conv -> QuantizeLinear, which it fuses into one) in integers: int32 sums of
# (x - x_zero_point) * (w - w_zero_point) plus the int32 bias, then float(sum) * (x_scale *
# w_scale / y_scale), rounded half to even, plus y's zero point (MLAS's requantization). A float
# convolution of the dequantized values rounds differently, and a value near a rounding boundary
# lands a step away; over a deep network such steps add up. So the same integers are computed
# here with the float convolution kernels, on the integers themselves: float32 holds every sum
# exactly while it stays below 2^24, which is checked per convolution from its weights and the
# input's range (a MobileNetV3's worst is 2.1 million), and the requantization is ORT's, as a
# multiply by the same float32 scale and a QuantizeLinear of scale 1.

_EXACT_LIMIT = 1 << 24


def _requantize_scale(x_scale, w_scale, y_scale):
    """ORT's requantization scale, per output channel: (x_scale * w_scale) / y_scale in float32."""
    xs, ys = np.float32(np.asarray(x_scale).reshape(())), np.float32(np.asarray(y_scale).reshape(()))
    return ((xs * np.asarray(w_scale, np.float32)).astype(np.float32) / ys).astype(np.float32)


def _emit_exact(r, op, hint, x, x_zp, w_int, w_zp, w_scale, x_scale, bias_int, y_scale, y_zp, attrs, output):
    """x (8-bit, not constant) `op` w (8-bit constant; Conv: [out, in, k...] scaled per output
    channel, MatMul: [k, out] scaled per column) + bias (int32 constant or None), requantized to
    `output` (8-bit, y_zp's type) as ORT does; False (nothing emitted) when the sums could leave
    float32's exact integers or a parameter is not what ORT's kernels take."""
    x_zp_value = np.asarray(r.values[x_zp]) if x_zp else np.zeros((), np.uint8)
    if x_zp_value.size != 1 or np.asarray(x_scale).size != 1 or np.asarray(y_scale).size != 1:
        return False
    if (op == "Conv" and w_int.ndim < 3) or (op == "MatMul" and w_int.ndim != 2):
        return False
    axis = 0 if op == "Conv" else 1  # the output channels' axis of the weights
    outs = w_int.shape[axis]
    w_scale = np.asarray(w_scale, np.float32).reshape(-1)
    w_zp = np.zeros((), np.int64) if w_zp is None else np.asarray(w_zp).astype(np.int64).reshape(-1)
    if w_scale.size not in (1, outs) or w_zp.size not in (1, outs):
        return False
    per_channel = [1] * w_int.ndim
    per_channel[axis] = -1
    w = w_int.astype(np.int64) - (w_zp.reshape(per_channel) if w_zp.size > 1 else w_zp.reshape(()))
    info = np.iinfo(x_zp_value.dtype)
    x_reach = max(int(x_zp_value) - info.min, info.max - int(x_zp_value))
    bias = np.zeros(outs, np.int64) if bias_int is None else np.asarray(bias_int).astype(np.int64).reshape(-1)
    if bias.size != outs:
        return False
    worst = np.abs(np.moveaxis(w, axis, 0)).reshape(outs, -1).sum(axis=1) * x_reach + np.abs(bias)
    if int(worst.max()) >= _EXACT_LIMIT:
        return False
    one = r.constant(np.array(1.0, np.float32), hint + "_unit_scale")
    xi = r.op("DequantizeLinear", [x, one] + ([x_zp] if x_zp else []), hint + "_xint")
    inputs = [xi, r.constant(w.astype(np.float32), hint + "_wint")]
    if bias_int is not None:
        inputs.append(r.constant(bias.astype(np.float32), hint + "_bint"))
    acc = r.op(op, inputs, hint + "_sums", **attrs)
    scale = _requantize_scale(x_scale, w_scale, y_scale)
    if scale.size > 1 and op == "Conv":
        scale = scale.reshape((1, -1) + (1,) * (w_int.ndim - 2))
    elif scale.size == 1:
        scale = scale.reshape(())
    scaled = r.op("Mul", [acc, r.constant(scale, hint + "_requant")], hint + "_scaled")
    r.op("QuantizeLinear", [scaled, one, y_zp], hint + "_q", output=output)
    return True


def _exact_qdq_conv(r, node):
    """A QDQ convolution or matmul (its input from a DequantizeLinear, its weights (and a
    convolution's int32 bias) folded DequantizeLinears of constants, its only user a
    QuantizeLinear of constant scale and zero point) written exactly (above); False if it is not
    one."""
    get = lambda n, i: r.input(n, i)
    x_dq = r.producer.get(get(node, 0))
    users = r.consumers.get(node.output[0], [])
    if x_dq is None or x_dq.op_type != "DequantizeLinear" or get(x_dq, 0) in r.values:
        return False
    if len(users) != 1 or users[0].op_type != "QuantizeLinear" or node.output[0] in r.graph_outputs:
        return False
    q = users[0]
    if not all(get(q, i) in r.values for i in (1, 2)) or not get(q, 2) or np.asarray(r.values[get(q, 1)]).size != 1:
        return False
    if not (get(x_dq, 1) in r.values and (not get(x_dq, 2) or get(x_dq, 2) in r.values)):
        return False
    weight = r.integers.get(get(node, 1))
    if weight is None:
        return False
    w_int, w_scale, w_zp, axis = np.asarray(weight[0]), weight[1], weight[2], weight[3]
    out_axis = 0 if node.op_type == "Conv" else w_int.ndim - 1
    if not np.issubdtype(w_int.dtype, np.integer) or (np.asarray(w_scale).size > 1 and axis % w_int.ndim != out_axis):
        return False
    bias_int = None
    if node.op_type == "Conv" and get(node, 2):
        # ORT takes the int32 bias as it is (its scale is x_scale * w_scale by construction).
        bias = r.integers.get(get(node, 2))
        if bias is None or np.asarray(bias[0]).dtype != np.int32 or bias[2] is not None and np.any(bias[2]):
            return False
        bias_int = bias[0]
    hint = node.name or node.output[0]
    done = _emit_exact(
        r,
        node.op_type,
        hint,
        get(x_dq, 0),
        get(x_dq, 2),
        w_int,
        w_zp,
        w_scale,
        r.values[get(x_dq, 1)],
        bias_int,
        r.values[get(q, 1)],
        get(q, 2),
        _attrs(node),
        q.output[0],
    )
    if done:
        r.skip.add(id(q))
        r.gone.add(node.output[0])  # the float sums are no longer a value of the graph
    return done


def _rank(r, name):
    """The rank the model records for a value (onnxsim writes them), or None."""
    for v in list(r.model.graph.value_info) + list(r.model.graph.input) + list(r.model.graph.output):
        if v.name == name and v.type.tensor_type.HasField("shape"):
            return len(v.type.tensor_type.shape.dim)
    return None


def _quantized_softmax(r, node, x, x_scale, x_zp, y_scale, y_zp, output):
    """An 8-bit softmax over the last axis as relaxc.quantized_softmax (ORT's QLinearSoftmax
    arithmetic), reading the float before x's QuantizeLinear when there is one; False when the
    axis is not the last or a parameter is not a constant scalar."""
    names = (x_scale, x_zp, y_scale, y_zp)
    if not all(n and n in r.values and np.asarray(r.values[n]).size == 1 for n in names):
        return False
    rank = _rank(r, x)
    opset = next((o.version for o in r.model.opset_import if o.domain in ("", "ai.onnx")), 13)
    attrs = _attrs(node)
    axis = attrs.get("axis", -1 if opset >= 13 and node.op_type == "Softmax" else 1)
    if rank is None or axis % rank != rank - 1:
        return False
    x_zp_value, y_zp_value = np.asarray(r.values[x_zp]), np.asarray(r.values[y_zp])
    params = [float(np.asarray(r.values[x_scale]).reshape(())), float(x_zp_value.reshape(()))]
    params += [float(x_zp_value.dtype == np.int8), float(np.asarray(r.values[y_scale]).reshape(()))]
    params += [float(y_zp_value.reshape(()))]
    source = r.producer.get(x)
    if (
        source is not None
        and source.op_type == "QuantizeLinear"
        and r.input(source, 1) == x_scale
        and r.input(source, 2) == x_zp
        and r.input(source, 0) not in r.gone
    ):
        x = r.input(source, 0)  # quantized in the kernel, in the same arithmetic
    signed = "int8" if y_zp_value.dtype == np.int8 else "uint8"
    r.nodes.append(
        r.helper.make_node(
            "QuantizedSoftmax",
            [x, r.constant(np.array(params, np.float32), (node.name or node.output[0]) + "_params")],
            [output],
            name=r.fresh((node.name or node.output[0]) + "_softmax"),
            domain="relaxc",
            y_type=signed,
        )
    )
    return True


def _quantized_binary(r, op, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp, output, hint):
    """A QLinearAdd or QLinearMul as relaxc.onnx's QuantizedBinary node (converters.py: ORT's QLinearAdd /
    QLinearMul arithmetic where the shapes are ones ORT's kernels take whole), each operand read
    as the float before its QuantizeLinear when it has one; False when a parameter is not a
    constant scalar."""
    names = (a_scale, a_zp, b_scale, b_zp, c_scale, c_zp)
    if not all(n and n in r.values and np.asarray(r.values[n]).size == 1 for n in names):
        return False
    types = {np.asarray(r.values[n]).dtype for n in (a_zp, b_zp, c_zp)}
    if len(types) != 1 or types.pop() not in (np.uint8, np.int8):
        return False

    def source(x, scale, zp):
        q = r.producer.get(x)
        if (
            q is not None
            and q.op_type == "QuantizeLinear"
            and r.input(q, 1) in r.values
            and r.input(q, 2) == zp
            and np.asarray(r.values[r.input(q, 1)]).size == 1
            and r.input(q, 0) not in r.gone
            and r.input(q, 0) not in r.values
        ):
            return r.input(q, 0), float(np.asarray(r.values[r.input(q, 1)]).reshape(()))
        return x, 1.0

    value = lambda n: float(np.asarray(r.values[n]).reshape(()))
    a, a_in = source(a, a_scale, a_zp)
    b, b_in = source(b, b_scale, b_zp)
    params = [float(op == "Mul"), value(a_scale), value(a_zp), a_in, value(b_scale), value(b_zp), b_in]
    params += [value(c_scale), value(c_zp)]
    r.nodes.append(
        r.helper.make_node(
            "QuantizedBinary",
            [a, b, r.constant(np.array(params, np.float32), hint + "_params")],
            [output],
            name=r.fresh(hint + "_binary"),
            domain="relaxc",
            c_type="int8" if np.asarray(r.values[c_zp]).dtype == np.int8 else "uint8",
        )
    )
    return True


def _qlinear_binary(op):
    def expand(r, node):
        get = lambda i: r.input(node, i)
        hint = node.name or node.output[0]
        if _quantized_binary(
            r, op, get(0), get(1), get(2), get(3), get(4), get(5), get(6), get(7), node.output[0], hint
        ):
            r.exact_qlinear += 1
            return
        _elementwise(op)(r, node)

    return expand


def _exact_qdq_softmax(r, node):
    """DequantizeLinear -> Softmax -> QuantizeLinear (ORT's QLinearSoftmax after its QDQ fusion) as
    relaxc.quantized_softmax; False if the node is not in such a group."""
    x_dq = r.producer.get(r.input(node, 0))
    users = r.consumers.get(node.output[0], [])
    if x_dq is None or x_dq.op_type != "DequantizeLinear" or len(users) != 1 or users[0].op_type != "QuantizeLinear":
        return False
    if node.output[0] in r.graph_outputs:
        return False
    q = users[0]
    get = r.input
    done = _quantized_softmax(r, node, get(x_dq, 0), get(x_dq, 1), get(x_dq, 2), get(q, 1), get(q, 2), q.output[0])
    if done:
        r.skip.add(id(q))
        r.gone.add(node.output[0])
    return done


def _qlinear_softmax(r, node):
    get = lambda i: r.input(node, i)
    if _quantized_softmax(r, node, get(0), get(1), get(2), get(3), get(4), node.output[0]):
        r.exact_qlinear += 1
        return
    _unary("Softmax", keep=("axis",))(r, node)


def _qlinear_exact(r, node, op, w_index, bias_index):
    """A QLinearConv / QLinearMatMul with constant weights (and bias) in the exact form; False if
    its parameters do not allow it."""
    get = lambda i: r.input(node, i)
    names = [get(i) for i in (1, 2, w_index, w_index + 1, w_index + 2, w_index + 3, w_index + 4) if get(i)]
    if get(0) in r.values or not all(n in r.values for n in names) or not get(w_index + 4):
        return False
    bias = None
    if bias_index is not None and get(bias_index):
        if get(bias_index) not in r.values or r.values[get(bias_index)].dtype != np.int32:
            return False
        bias = r.values[get(bias_index)]
    w_int = np.asarray(r.values[get(w_index)])
    w_zp = r.values[get(w_index + 2)] if get(w_index + 2) else None
    attrs = _attrs(node) if op == "Conv" else {}
    done = _emit_exact(
        r,
        op,
        node.name or node.output[0],
        get(0),
        get(2),
        w_int,
        w_zp,
        r.values[get(w_index + 1)],
        r.values[get(1)],
        bias,
        r.values[get(w_index + 3)],
        get(w_index + 4),
        attrs,
        node.output[0],
    )
    if done:
        r.exact_qlinear += 1
    return done


def _qlinear_conv(r, node):
    if _qlinear_exact(r, node, "Conv", 3, 8):
        return
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
    if _qlinear_exact(r, node, "MatMul", 3, None):
        return
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


def _batch_norm_after_integers(r, node):
    """A BatchNormalization of a ConvInteger's scaled result (ConvInteger -> Cast -> Mul, as ONNX
    Runtime's dynamic quantizer writes a convolution) in ORT's arithmetic: y = x * s + b per
    channel, s = scale / sqrt(var + epsilon) and b = bias - mean * s in float32. Folded into the
    convolution's weights instead (as float models are), the weights stop being integers: one
    ulp off there moved the next DynamicQuantizeLinear's range, and with it every value. True
    when it matched."""
    attrs = _attrs(node)
    if attrs.get("training_mode", 0) or not attrs.get("spatial", 1) or len(node.input) < 5:
        return False
    params = [r.values.get(r.input(node, i)) for i in range(1, 5)]
    if any(p is None or np.ndim(p) != 1 for p in params):
        return False
    mul = r.producer.get(node.input[0])
    if mul is None or mul.op_type != "Mul":
        return False
    sources = [r.producer.get(i) for i in mul.input]
    casts = [c for c in sources if c is not None and c.op_type == "Cast" and _attrs(c).get("to") == 1]
    convs = [r.producer.get(c.input[0]) for c in casts]
    conv = next((c for c in convs if c is not None and c.op_type == "ConvInteger"), None)
    if conv is None or r.input(conv, 1) not in r.values:
        return False
    scale, bias, mean, var = (np.asarray(p, np.float32) for p in params)
    eps = np.float32(attrs.get("epsilon", 1e-5))
    inv_std = np.float32(1.0) / np.sqrt(var + eps)
    new_scale = inv_std * scale
    new_bias = bias - mean * new_scale
    shape = (-1,) + (1,) * (np.ndim(r.values[r.input(conv, 1)]) - 2)  # [C, 1, 1] for NCHW
    hint = node.name or node.output[0]
    y = r.op("Mul", [node.input[0], r.constant(new_scale.reshape(shape), hint + "_scale")], hint + "_scaled")
    r.op("Add", [y, r.constant(new_bias.reshape(shape), hint + "_bias")], hint + "_bn", output=node.output[0])
    return True


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
    (_MS, "QLinearAdd"): _qlinear_binary("Add"),
    (_MS, "QLinearMul"): _qlinear_binary("Mul"),
    (_MS, "QLinearSigmoid"): _unary("Sigmoid"),
    (_MS, "QLinearLeakyRelu"): _unary("LeakyRelu", keep=("alpha",)),
    (_MS, "QLinearGlobalAveragePool"): _global_average_pool,
    (_MS, "QLinearAveragePool"): _unary(
        "AveragePool", keep=("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
    ),
    (_MS, "QLinearConcat"): _concat,
    (_MS, "QLinearSoftmax"): _qlinear_softmax,
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
    expanded = folded = exact = 0
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
            if node.op_type == "DequantizeLinear":  # the integers too, for an exact convolution
                r.integers[node.output[0]] = (r.values[get(0)], r.values[get(1)], zp, axis)
            folded += 1
        elif node.op_type in ("Conv", "MatMul") and domain(node) == "" and _exact_qdq_conv(r, node):
            exact += 1
        elif node.op_type == "Softmax" and domain(node) == "" and _exact_qdq_softmax(r, node):
            exact += 1
        elif node.op_type == "BatchNormalization" and domain(node) == "" and _batch_norm_after_integers(r, node):
            exact += 1
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
    if exact or r.exact_qlinear:
        log(
            f"{exact + r.exact_qlinear} int8 convolution(s), matmul(s), softmax(es), adds and multiplies computed "
            "in ONNX Runtime's integer arithmetic"
        )
    return model
