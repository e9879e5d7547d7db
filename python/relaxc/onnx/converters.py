"""ONNX operators relaxc.onnx converts itself, ahead of TVM's ONNX front end: those whose TVM
conversion is a chain of generic operators where the kernel library has one kernel.

Each converter takes what TVM's converters take (the block builder, the inputs as Relax
expressions, the attributes) and returns the Relax expression of the node's outputs (a Tuple for
several), or None to leave the node to TVM's converter (a dtype or rank it does not cover).
"""

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


CONVERTERS = {"DynamicQuantizeLinear": _dynamic_quantize_linear}


def convert(bb, op_name, inputs, attrs):
    """The node converted by relaxc's own converter for op_name, or None for TVM to convert."""
    converter = CONVERTERS.get(op_name)
    return None if converter is None else converter(bb, inputs, attrs)
