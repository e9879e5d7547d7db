"""Recurrent ONNX operators TVM's front end has no converter for (LSTM, GRU), written out as the
operators it has, once the input shapes are fixed.

A recurrent layer over a sequence of known length T becomes T steps of plain operators: the input
projection for every step at once (one MatMul), then per step the recurrent MatMul, the gates and
the state update, and the outputs concatenated in time order. The weights must be constants (as
exporters write them); the sequence length must be known (fix it with --shape). Anything the
expansion does not cover (other activations, clip, sequence_lens that differ from T) is an error
naming the node.
"""

import numpy as np

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

    def columns(self, x, begin, end):
        """x[..., begin:end]."""
        starts, ends, axes = (self.constant(np.array([v], np.int64)) for v in (begin, end, -1))
        return self.op("Slice", [x, starts, ends, axes])

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


def _initial_state(b, given, d, batch, hidden, hint):
    """Direction d's initial state [B, H]: zeros, the constant given, or its slice of a graph value."""
    if given is None:
        return b.constant(np.zeros((batch, hidden), np.float32), hint)
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
    """What both expansions start from, checked: (attributes, sequence length, batch, the inputs
    after X as _constant_inputs gives them, hidden size, each direction's reverse flag, a builder);
    anything the expansion does not cover is an error naming the node."""
    attrs = _attrs(node)
    dims = shapes.get(node.input[0]) or []
    steps, batch = (dims[0], dims[1]) if len(dims) == 3 else (None, None)
    directions = _directions(node, attrs)
    acts = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", [])]
    if acts and [a.lower() for a in acts] != [a.lower() for a in activations * len(directions)]:
        raise _refuse(node, f"activations {acts} are not expanded (only the default {activations})")
    if "clip" in attrs:
        raise _refuse(node, "the clip attribute is not expanded")
    if attrs.get("layout", 0) != 0:
        raise _refuse(node, "layout=1 (batch first) is not expanded")
    if not isinstance(steps, int) or not isinstance(batch, int):
        raise _refuse(node, "its sequence length and batch must be known: fix the input shapes with --shape")
    inputs = _constant_inputs(node, values, count, states)
    w, r, lens = inputs[0], inputs[1], inputs[3]
    if w is None or r is None:
        raise _refuse(node, "W and R must be given")
    if lens is not None and not np.all(lens == steps):
        raise _refuse(node, f"sequence_lens {lens.tolist()} differ from the sequence length {steps}")
    hidden = int(attrs.get("hidden_size", r.shape[-1]))  # optional in the spec: R is [D, gates * H, H]
    return attrs, steps, batch, inputs, hidden, directions, _Builder(node.name or node.output[0])


def _finish(b, node, per_direction, finals, batch, hidden):
    """The node's outputs from each direction's states in time order and its final states (one
    list per output after Y, a value per direction): Y [T, D, B, H], then each [D, B, H]."""

    def directions(values, axis):
        return values[0] if len(values) == 1 else b.op("Concat", values, axis=axis)

    y = directions(
        [b.op("Concat", [b.reshape(s, [1, 1, batch, hidden]) for s in states], axis=0) for states in per_direction],
        1,
    )
    outputs = [y] + [directions([b.reshape(v, [1, batch, hidden]) for v in last], 0) for last in finals]
    for i, value in enumerate(outputs):
        if i < len(node.output) and node.output[i]:
            b.op("Identity", [value], output=node.output[i])
    return b


def _lstm(node, values, shapes):
    attrs, steps, batch, inputs, hidden, directions, b = _prepare(
        node, values, shapes, ["Sigmoid", "Tanh", "Tanh"], 8, states=(5, 6)
    )
    if attrs.get("input_forget", 0):
        raise _refuse(node, "input_forget=1 is not expanded")
    w, r, bias, _, h0, c0, peep = inputs
    x = node.input[0]
    per_h, finals_h, finals_c = [], [], []
    for d, reverse in enumerate(directions):
        gates_bias = np.zeros(4 * hidden, np.float32) if bias is None else bias[d, : 4 * hidden] + bias[d, 4 * hidden :]
        xw = b.op("Add", [b.op("MatMul", [x, b.constant(w[d].T.astype(np.float32), "w")]), b.constant(gates_bias)])
        r_t = b.constant(r[d].T.astype(np.float32), "r")
        h = _initial_state(b, h0, d, batch, hidden, "h")
        c = _initial_state(b, c0, d, batch, hidden, "c")
        p = None if peep is None else [b.constant(peep[d, k * hidden : (k + 1) * hidden]) for k in range(3)]
        hs = []
        for t in reversed(range(steps)) if reverse else range(steps):
            step = b.op("Gather", [xw, b.constant(np.array(t, np.int64), "t")], axis=0)
            gates = b.op("Add", [step, b.op("MatMul", [h, r_t])])
            i, o, f, g = (b.columns(gates, k * hidden, (k + 1) * hidden) for k in range(4))
            if p is not None:
                i = b.op("Add", [i, b.op("Mul", [p[0], c])])
                f = b.op("Add", [f, b.op("Mul", [p[2], c])])
            i, f, g = b.op("Sigmoid", [i]), b.op("Sigmoid", [f]), b.op("Tanh", [g])
            c = b.op("Add", [b.op("Mul", [f, c]), b.op("Mul", [i, g])])
            if p is not None:
                o = b.op("Add", [o, b.op("Mul", [p[1], c])])
            h = b.op("Mul", [b.op("Sigmoid", [o]), b.op("Tanh", [c])])
            hs.append(h)
        per_h.append(hs[::-1] if reverse else hs)
        finals_h.append(h)
        finals_c.append(c)
    return _finish(b, node, per_h, [finals_h, finals_c], batch, hidden)


def _gru(node, values, shapes):
    attrs, steps, batch, inputs, hidden, directions, b = _prepare(
        node, values, shapes, ["Sigmoid", "Tanh"], 6, states=(5,)
    )
    w, r, bias, _, h0 = inputs
    x = node.input[0]
    linear_before_reset = attrs.get("linear_before_reset", 0)
    per_h, finals = [], []
    for d, reverse in enumerate(directions):
        wb = np.zeros(3 * hidden, np.float32) if bias is None else bias[d, : 3 * hidden]
        rb = np.zeros(3 * hidden, np.float32) if bias is None else bias[d, 3 * hidden :]
        # Gates z, r, h: the input's bias and, for z and r, the recurrence's go in with the input
        # projection; h's recurrent bias stays with its recurrent product (inside r * (...) when
        # linear_before_reset).
        in_bias = np.concatenate([wb[: 2 * hidden] + rb[: 2 * hidden], wb[2 * hidden :]]).astype(np.float32)
        xw = b.op("Add", [b.op("MatMul", [x, b.constant(w[d].T.astype(np.float32), "w")]), b.constant(in_bias)])
        r_zr = b.constant(r[d, : 2 * hidden].T.astype(np.float32), "rzr")
        r_h = b.constant(r[d, 2 * hidden :].T.astype(np.float32), "rh")
        rb_h = b.constant(rb[2 * hidden :].astype(np.float32), "rbh")
        h = _initial_state(b, h0, d, batch, hidden, "h")
        one = b.constant(np.array(1.0, np.float32), "one")
        hs = []
        for t in reversed(range(steps)) if reverse else range(steps):
            step = b.op("Gather", [xw, b.constant(np.array(t, np.int64), "t")], axis=0)
            zr = b.op("Add", [b.columns(step, 0, 2 * hidden), b.op("MatMul", [h, r_zr])])
            z = b.op("Sigmoid", [b.columns(zr, 0, hidden)])
            reset = b.op("Sigmoid", [b.columns(zr, hidden, 2 * hidden)])
            if linear_before_reset:
                recur = b.op("Mul", [reset, b.op("Add", [b.op("MatMul", [h, r_h]), rb_h])])
            else:
                recur = b.op("Add", [b.op("MatMul", [b.op("Mul", [reset, h]), r_h]), rb_h])
            cand = b.op("Tanh", [b.op("Add", [b.columns(step, 2 * hidden, 3 * hidden), recur])])
            h = b.op("Add", [b.op("Mul", [b.op("Sub", [one, z]), cand]), b.op("Mul", [z, h])])
            hs.append(h)
        per_h.append(hs[::-1] if reverse else hs)
        finals.append(h)
    return _finish(b, node, per_h, [finals], batch, hidden)


EXPANSIONS = {"LSTM": _lstm, "GRU": _gru}


def expand_recurrent(model, log=print):
    """The model with every LSTM and GRU node written out (the model itself when it has none)."""
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
    log(f"{expanded} recurrent layer(s) (LSTM, GRU) written out step by step")
    return model
