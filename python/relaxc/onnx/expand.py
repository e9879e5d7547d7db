"""Recurrent ONNX operators TVM's front end has no converter for (LSTM, GRU), as the input
projection TVM imports and one library call per direction for the recurrence.

Each direction of a layer becomes a MatMul of the whole sequence by W^T plus the biases that can
go with it (one GEMM on the kernel library), then one relaxc.lstm_sequence or relaxc.gru_sequence
call (a node of relaxc's own domain, converted in converters.py) that runs the steps in order, and
the outputs reshaped and concatenated into ONNX's layout. The build and the model are the same
size whatever the sequence's length, which may stay symbolic. The weights must be constants (as
exporters write them); anything else the kernels do not cover (other activations, clip, layout=1,
input_forget, sequence_lens that differ from the sequence length) is an error naming the node.
"""

import numpy as np

from ..tvm.pack import pack_recurrent

__all__ = ["expand_recurrent"]


class _Builder:
    """New nodes and constants for one expanded node, named after it so names stay unique."""

    def __init__(self, prefix):
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.prefix = prefix
        self.nodes, self.constants = [], []
        self.count = 0

    def name(self, hint):
        self.count += 1
        return f"{self.prefix}__{hint}{self.count}"

    def constant(self, value, hint="c"):
        name = self.name(hint)
        self.constants.append(self.numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type, inputs, hint=None, output=None, **attrs):
        output = output or self.name(hint or op_type.lower())
        self.nodes.append(self.helper.make_node(op_type, inputs, [output], name=self.name(op_type), **attrs))
        return output

    def reshape(self, x, shape):
        return self.op("Reshape", [x, self.constant(np.array(shape, np.int64), "shape")])


def _attrs(node):
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _refuse(node, why):
    from . import OnnxError

    return OnnxError(f"ONNX node {node.name or node.output[0]!r} ({node.op_type}): {why}")


def _constant_inputs(node, values, count, states=()):
    """The node's inputs [1, count) as numpy arrays (None where absent); the inputs at the
    indices in `states` (initial states) may be computed in the graph, and are their names then."""
    out = []
    for i in range(1, count):
        name = node.input[i] if i < len(node.input) else ""
        if not name:
            out.append(None)
        elif name in values:
            out.append(values[name])
        elif i in states:
            out.append(name)
        else:
            raise _refuse(node, f"input {i} ({name!r}) is computed in the graph; only constant weights are expanded")
    return out


def _initial_state(b, given, d, hint):
    """Direction d's initial state [B, H]: "" (zeros, the kernel's default), the constant given,
    or its slice of a graph value."""
    if given is None:
        return ""
    if isinstance(given, str):
        return b.op("Gather", [given, b.constant(np.array(d, np.int64), "d")], axis=0)
    return b.constant(given[d].astype(np.float32), hint)


def _directions(node, attrs):
    """Whether each direction runs in reverse: [False], [True] or [False, True]."""
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    known = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}
    if direction not in known:
        raise _refuse(node, f"direction {direction!r} is not one of forward, reverse, bidirectional")
    return known[direction]


def _prepare(node, values, shapes, activations, count, states):
    """What both expansions start from, checked: (attributes, the inputs after X as
    _constant_inputs gives them, hidden size, each direction's reverse flag, a builder); anything
    the kernels do not cover is an error naming the node."""
    attrs = _attrs(node)
    dims = shapes.get(node.input[0]) or []
    steps = dims[0] if len(dims) == 3 else None
    directions = _directions(node, attrs)
    acts = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", [])]
    if acts and [a.lower() for a in acts] != [a.lower() for a in activations * len(directions)]:
        raise _refuse(node, f"activations {acts} are not expanded (only the default {activations})")
    if "clip" in attrs:
        raise _refuse(node, "the clip attribute is not covered")
    if attrs.get("layout", 0) != 0:
        raise _refuse(node, "layout=1 (batch first) is not covered")
    inputs = _constant_inputs(node, values, count, states)
    w, r, lens = inputs[0], inputs[1], inputs[3]
    if w is None or r is None:
        raise _refuse(node, "W and R must be given")
    if lens is not None and not (isinstance(steps, int) and np.all(lens == steps)):
        known = steps if isinstance(steps, int) else "not known here (fix it with --shape)"
        raise _refuse(node, f"sequence_lens {lens.tolist()} must all be the sequence length, which is {known}")
    hidden = int(attrs.get("hidden_size", r.shape[-1]))  # optional in the spec: R is [D, gates * H, H]
    return attrs, inputs, hidden, directions, _Builder(node.name or node.output[0])


DOMAIN = "relaxc"  # the domain of the sequence nodes converters.py converts


def _sequence(b, op, inputs, hidden, outputs, **attrs):
    """A relaxc-domain node with `outputs` outputs: y [T, B, H], then the last states [B, H]."""
    names = [b.name(f"{op.lower()}_out") for _ in range(outputs)]
    b.nodes.append(b.helper.make_node(op, inputs, names, name=b.name(op), domain=DOMAIN, hidden=hidden, **attrs))
    return names


def _finish(b, node, ys, finals, hidden):
    """The node's outputs from each direction's y [T, B, H] and last states (a list per output
    after Y, a value [B, H] per direction): Y [T, D, B, H], then each [D, B, H]."""

    def directions(values, axis):
        return values[0] if len(values) == 1 else b.op("Concat", values, axis=axis)

    y = directions([b.reshape(v, [0, 1, -1, hidden]) for v in ys], 1)
    outputs = [y] + [directions([b.reshape(v, [1, -1, hidden]) for v in last], 0) for last in finals]
    for i, value in enumerate(outputs):
        if i < len(node.output) and node.output[i]:
            b.op("Identity", [value], output=node.output[i])
    return b


def _projection(b, x, w, bias):
    """x [T, B, I] times w^T plus bias, every step at once."""
    return b.op("Add", [b.op("MatMul", [x, b.constant(w.T.astype(np.float32), "w")]), b.constant(bias)])


def _lstm(node, values, shapes):
    attrs, inputs, hidden, directions, b = _prepare(node, values, shapes, ["Sigmoid", "Tanh", "Tanh"], 8, states=(5, 6))
    if attrs.get("input_forget", 0):
        raise _refuse(node, "input_forget=1 is not covered")
    w, r, bias, _, h0, c0, peep = inputs
    ys, finals_h, finals_c = [], [], []
    for d, reverse in enumerate(directions):
        gates_bias = np.zeros(4 * hidden, np.float32) if bias is None else bias[d, : 4 * hidden] + bias[d, 4 * hidden :]
        xw = _projection(b, node.input[0], w[d], gates_bias.astype(np.float32))
        rt = b.constant(pack_recurrent(r[d], 4), "rt")
        p = "" if peep is None else b.constant(peep[d].astype(np.float32), "p")
        h, c = _initial_state(b, h0, d, "h"), _initial_state(b, c0, d, "c")
        y, h_last, c_last = _sequence(b, "LSTMSequence", [xw, rt, p, h, c], hidden, 3, reverse=int(reverse))
        ys.append(y)
        finals_h.append(h_last)
        finals_c.append(c_last)
    return _finish(b, node, ys, [finals_h, finals_c], hidden)


def _gru(node, values, shapes):
    attrs, inputs, hidden, directions, b = _prepare(node, values, shapes, ["Sigmoid", "Tanh"], 6, states=(5,))
    w, r, bias, _, h0 = inputs
    linear_before_reset = int(attrs.get("linear_before_reset", 0))
    ys, finals = [], []
    for d, reverse in enumerate(directions):
        wb = np.zeros(3 * hidden, np.float32) if bias is None else bias[d, : 3 * hidden]
        rb = np.zeros(3 * hidden, np.float32) if bias is None else bias[d, 3 * hidden :]
        # Gates z, r, h: the input's bias and, for z and r, the recurrence's go in with the input
        # projection; h's recurrent bias stays with its recurrent product (the kernel's rb_h).
        in_bias = np.concatenate([wb[: 2 * hidden] + rb[: 2 * hidden], wb[2 * hidden :]]).astype(np.float32)
        xw = _projection(b, node.input[0], w[d], in_bias)
        rt = b.constant(pack_recurrent(r[d], 3), "rt")
        rb_h = b.constant(rb[2 * hidden :].astype(np.float32), "rbh")
        h = _initial_state(b, h0, d, "h")
        y, h_last = _sequence(
            b,
            "GRUSequence",
            [xw, rt, rb_h, h],
            hidden,
            2,
            reverse=int(reverse),
            linear_before_reset=linear_before_reset,
        )
        ys.append(y)
        finals.append(h_last)
    return _finish(b, node, ys, [finals], hidden)


EXPANSIONS = {"LSTM": _lstm, "GRU": _gru}


def expand_recurrent(model, log=print):
    """The model with every LSTM and GRU node as its input projection and relaxc-domain sequence
    nodes (the model itself when it has none)."""
    import onnx
    from onnx import numpy_helper

    if not any(n.op_type in EXPANSIONS for n in model.graph.node):
        return model
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        dims = v.type.tensor_type.shape.dim
        shapes[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            values[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    nodes = []
    expanded = 0
    for node in model.graph.node:
        expand = EXPANSIONS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if expand is None:
            nodes.append(node)
            continue
        built = expand(node, values, shapes)
        nodes.extend(built.nodes)
        model.graph.initializer.extend(built.constants)
        expanded += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    log(f"{expanded} recurrent layer(s) (LSTM, GRU): one relaxc.lstm_sequence / gru_sequence call per direction")
    return model
