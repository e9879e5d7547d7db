"""ONNX operators relaxc.onnx converts itself, ahead of TVM's ONNX front end: those whose TVM
conversion is a chain of generic operators where the kernel library has one kernel.

Each converter takes what TVM's converters take (the block builder, the inputs as Relax
expressions, the attributes) and returns the Relax expression of the node's outputs (a Tuple for
several), or None to leave the node to TVM's converter (a dtype or rank it does not cover).
"""

import numpy as np

from tvm import relax

__all__ = ["CONVERTERS", "convert"]


def _dynamic_quantize_linear(bb, inputs, attrs):
    """DynamicQuantizeLinear as one relaxc.dynamic_quantize_linear call (TVM's import: two
    reductions and a quantize, three passes on one thread; a third of an int8 MiniLM's time)."""
    x = inputs[0]
    ty = getattr(x, "ty", None)
    if not isinstance(ty, relax.TensorType) or str(ty.dtype) != "float32" or ty.shape is None:
        return None
    outputs = [relax.TensorType(ty.shape, "uint8"), relax.TensorType([], "float32"), relax.TensorType([], "uint8")]
    call = bb.emit(relax.call_dps_packed("relaxc.dynamic_quantize_linear", [x], outputs))
    return relax.Tuple([bb.emit(relax.TupleGetItem(call, i)) for i in range(len(outputs))])


def _optional(value):
    return relax.op.null_value() if value is None else value


def _sequence(kernel, bb, inputs, attrs, extra, finals):
    """relaxc.lstm_sequence / gru_sequence over xw [T, B, gates * H]: y [T, B, H] and `finals`
    last states [B, H], each a tuple item."""
    xw = inputs[0]
    steps, batch, _ = xw.ty.shape.values  # rt is packed (relaxc.tvm.pack.pack_recurrent)
    hidden = int(attrs["hidden"])
    outputs = [relax.TensorType([steps, batch, hidden], "float32")]
    outputs += [relax.TensorType([batch, hidden], "float32")] * finals
    args = [xw, inputs[1]] + [_optional(v) for v in inputs[2:]] + extra
    call = bb.emit(relax.call_dps_packed(kernel, args, outputs))
    return relax.Tuple([bb.emit(relax.TupleGetItem(call, i)) for i in range(len(outputs))])


def _lstm_sequence(bb, inputs, attrs):
    """relaxc.onnx's LSTM direction (expand.py): (xw, rt, peephole, h0, c0) -> (y, h, c)."""
    inputs = list(inputs) + [None] * (5 - len(inputs))
    return _sequence("relaxc.lstm_sequence", bb, inputs, attrs, [relax.prim_value(int(attrs.get("reverse", 0)))], 2)


def _gru_sequence(bb, inputs, attrs):
    """relaxc.onnx's GRU direction (expand.py): (xw, rt, rb_h, h0) -> (y, h)."""
    inputs = list(inputs) + [None] * (4 - len(inputs))
    extra = [relax.prim_value(int(attrs.get("reverse", 0))), relax.prim_value(int(attrs.get("linear_before_reset", 0)))]
    return _sequence("relaxc.gru_sequence", bb, inputs, attrs, extra, 1)


def _quantized_softmax(bb, inputs, attrs):
    """relaxc.onnx's QuantizedSoftmax (quantized.py): (x, params) -> y as relaxc.quantized_softmax."""
    x, params = inputs[0], inputs[1]
    y_type = attrs.get("y_type", "uint8")
    y_type = y_type.decode() if isinstance(y_type, bytes) else y_type
    ty = getattr(x, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return bb.emit(relax.call_dps_packed("relaxc.quantized_softmax", [x, params], relax.TensorType(ty.shape, y_type)))


def _static_shape(x):
    ty = getattr(x, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = [getattr(d, "value", None) for d in ty.shape.values]
    return None if None in dims else dims


def _trails(a, b):
    """Whether b is a's shape, or constant over a's trailing dimensions (ORT's broadcast spans)."""
    if a == b:
        return True
    if len(b) > len(a) or int(np.prod(b)) < 1:
        return False
    offset = len(a) - len(b)
    if int(np.prod(a[:offset])) != 1 and int(np.prod(b)) != 1:
        return False
    k = 0
    while k < len(b) and b[k] == a[offset + k]:
        k += 1
    return all(d == 1 for d in b[k:])


def _quantized_binary(bb, inputs, attrs):
    """relaxc.onnx's QuantizedBinary (quantized.py): (a, b, params) -> c. relaxc.quantized_binary
    (ORT's arithmetic) where b is a's shape or constant over a's trailing dimensions (or the
    other way round: the formulas take the operands either way, so they are swapped); else the
    float form (dequantize, the operation, quantize)."""
    a, b, params = inputs
    c_type = attrs.get("c_type", "uint8")
    c_type = c_type.decode() if isinstance(c_type, bytes) else c_type
    p = [float(v) for v in params.value.numpy()]
    shape_a, shape_b = _static_shape(a), _static_shape(b)
    if shape_a is not None and shape_b is not None:
        if not _trails(shape_a, shape_b) and _trails(shape_b, shape_a):
            a, b, shape_a = b, a, shape_b
            p = [p[0], *p[4:7], *p[1:4], *p[7:]]
        if _trails(shape_a, _static_shape(b)):
            swapped = relax.const(np.array(p, np.float32))
            out = relax.TensorType(shape_a, c_type)
            return bb.emit(relax.call_dps_packed("relaxc.quantized_binary", [a, b, swapped], out))
    op, sa, za, a_in, sb, zb, b_in, sc, zc = p

    def as_float(x, scale, zp, in_scale):
        if str(x.ty.dtype) == "float32":  # the float before its quantization: quantize it first
            x = bb.emit(relax.op.quantize(x, relax.const(in_scale, "float32"), relax.const(zp, c_type), -1, c_type))
        return bb.emit(relax.op.dequantize(x, relax.const(scale, "float32"), relax.const(zp, c_type), -1, "float32"))

    fa, fb = as_float(a, sa, za, a_in), as_float(b, sb, zb, b_in)
    y = bb.emit(relax.op.multiply(fa, fb) if op == 1.0 else relax.op.add(fa, fb))
    return bb.emit(relax.op.quantize(y, relax.const(sc, "float32"), relax.const(zc, c_type), -1, c_type))


CONVERTERS = {
    "DynamicQuantizeLinear": _dynamic_quantize_linear,
    "LSTMSequence": _lstm_sequence,
    "GRUSequence": _gru_sequence,
    "QuantizedSoftmax": _quantized_softmax,
    "QuantizedBinary": _quantized_binary,
}


def convert(bb, op_name, inputs, attrs):
    """The node converted by relaxc's own converter for op_name, or None for TVM to convert."""
    converter = CONVERTERS.get(op_name)
    return None if converter is None else converter(bb, inputs, attrs)
