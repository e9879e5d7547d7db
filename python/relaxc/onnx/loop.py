"""ONNX Loop (and Scan, written as a Loop before the import) as Relax control flow: a recursive
function, not the body written out once per iteration.

TVM's ONNX front end has no Loop converter. Here a Loop node becomes two Relax functions beside
`main`:

- `<loop>_body(iteration, condition, carried..., captured...)`: the body graph converted by TVM's
  own converters (the importer's block builder and value table are swapped for the call), its
  carried values typed with a fresh symbolic dimension each, so that a value whose shape changes
  from one iteration to the next is still right;
- `<loop>(i, trip_count, condition, carried..., scans..., captured...)`: if i < trip_count and
  condition, calls the body, appends each scan output to its accumulator (a tensor of the
  iterations so far, concatenated along a new first axis) and calls itself with i + 1; else
  returns the carried values and the accumulators.

`main` calls `<loop>` once. Values of the enclosing graph the body reads (ONNX lets a body see
them) are passed as parameters; constants are used in place. Both execution modes run the
recursion as calls between Relax functions: its depth is the trip count (each level a register
frame, and in compiled mode a native call), so a loop of very many iterations needs the stack
for them.

A carried value whose shape the body keeps is given the initial value's shape after the loop;
scan outputs get a new symbolic first dimension (the iterations run).
"""

import numpy as np
from tvm.ir.expr import Constant

import tvm
from tvm import relax, tirx

__all__ = ["convert_loop"]


class LoopError(ValueError):
    """A Loop this conversion does not take (raised as the node's import error)."""


def _generalized(info):
    """info with every dimension a fresh symbolic variable (a carried value may change shape
    between iterations; a static shape would be checked on every call)."""
    if not isinstance(info, relax.TensorType) or info.ndim < 0:
        raise LoopError(f"a loop value is {info}, not a tensor of known rank")
    dims = [tirx.Var(f"loop_d{i}", "int64") for i in range(info.ndim)]
    return relax.TensorType(dims, info.dtype)


def _declared_rank(value_info):
    """The rank a body input or output is declared with, or None if it is not declared."""
    t = value_info.type.tensor_type
    return len(t.shape.dim) if t.HasField("shape") else None


def _as_tensor(bb, x):
    """x as a tensor: TVM's import keeps shape arithmetic (Shape, then Gather) as shape and scalar
    values, which a loop's trip count or a value its body reads may be."""
    if isinstance(x.ty, relax.TensorType):
        return x
    if isinstance(x.ty, relax.ShapeType):
        return bb.emit(relax.op.shape_to_tensor(x))
    if tvm.ir.is_prim_expr(x) and str(x.ty.dtype) == "int64":  # a dimension (Gather of a Shape)
        return bb.emit(relax.op.reshape(relax.op.shape_to_tensor(relax.ShapeExpr([x])), []))
    raise LoopError(f"a loop value is {x.ty}, not a tensor")


def _scalar(bb, x, dtype):
    """x (a tensor of one element, any rank) as a 0-d tensor of dtype."""
    x = _as_tensor(bb, x)
    info = x.ty
    if info.ndim != 0:
        x = bb.emit(relax.op.reshape(x, []))
    if str(info.dtype) != dtype:
        x = bb.emit(relax.op.astype(x, dtype))
    return x


def _as_rank(bb, x, rank):
    """A 0-d x reshaped to the rank (0 or 1) the body declares for it."""
    return bb.emit(relax.op.reshape(x, [1])) if rank == 1 else x


def _outer_names(graph):
    """Names the graph reads that it does not define (the enclosing graph's values)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    read = []
    for node in graph.node:
        for name in node.input:
            if name and name not in defined and name not in read:
                read.append(name)
        for a in node.attribute:  # a nested subgraph's reads count as the body's
            if a.g is not None and a.g.node:
                read += [n for n in _outer_names(a.g) if n not in defined and n not in read]
        defined.update(node.output)
    return read


def _remapped(func, mapping):
    """func with the global variables in `mapping` (by name) replaced."""
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class Remap(PyExprMutator):
        def visit_global_var_(self, op):
            return mapping.get(op.name_hint, op)

    new_body = Remap().visit_expr(func.body)
    return relax.Function(func.params, new_body, func.ret_ty, func.is_pure, func.attrs)


def convert_loop(importer, inputs, attrs):
    """The Loop node's outputs as Relax expressions in the importer's `main` (a Tuple for several)."""
    body = attrs["body"]
    name = attrs.get("tvm_custom", {}).get("name") or "loop"
    stem = "onnx_loop_" + "".join(c if c.isalnum() else "_" for c in name)
    outer_bb = importer.bb
    trip, cond0, initial = inputs[0], inputs[1], list(inputs[2:])
    num_carried = len(initial)
    num_scans = len(body.output) - 1 - num_carried
    if len(body.input) != 2 + num_carried or num_scans < 0:
        raise LoopError(
            f"the body takes {len(body.input)} inputs and gives {len(body.output)} outputs for {num_carried} "
            "carried values (ONNX: 2 + N inputs, 1 + N + K outputs)"
        )
    if any(v is None for v in initial):
        raise LoopError("a carried value's initial value is missing")

    # The enclosing graph's values the body reads: constants in place, others as parameters.
    outer = importer._nodes
    captured_names, captured_values, constants = [], [], {}
    for n in _outer_names(body):
        if n not in outer:
            raise LoopError(f"the body reads {n!r}, which is defined neither in it nor before the loop")
        value = outer[n]
        if isinstance(value, Constant):
            constants[n] = value
        elif isinstance(value, relax.Expr):
            captured_names.append(n)
            captured_values.append(_as_tensor(outer_bb, value))
        else:
            raise LoopError(f"the body reads {n!r}, which is not a tensor ({type(value).__name__})")

    # The body, converted in a block builder of its own: with the initial values' types when the
    # body keeps them (most loops; the kernels then see fixed shapes), else with symbolic ones.
    iter_rank, cond_rank = _declared_rank(body.input[0]), _declared_rank(body.input[1])
    captured_types = [_renewed(v.ty) for v in captured_values]
    for generalize in (False, True):
        carried_types = [_generalized(v.ty) if generalize else _renewed(v.ty) for v in initial]
        bb, body_gv = _convert_body(
            importer, body, stem, constants, captured_names, carried_types, captured_types, iter_rank, cond_rank
        )
        body_func = bb.get()[body_gv]
        body_ret = body_func.ret_ty.fields
        for k, info in enumerate(body_ret):
            if not isinstance(info, relax.TensorType):
                raise LoopError(f"the body's output {body.output[k].name!r} is {info}, not a tensor")
        carried_params = body_func.params[2 : 2 + num_carried]
        kept = [_same(body_ret[1 + k], p.ty) for k, p in enumerate(carried_params)]
        if all(kept):
            break
    scan_items = body_ret[1 + num_carried :]
    for k, info in enumerate(scan_items):
        if info.shape is None or any(not isinstance(d, tirx.IntImm) for d in info.shape.values):
            raise LoopError(
                f"scan output {body.output[1 + num_carried + k].name!r} has shape {info.shape}: "
                "only scan outputs of a fixed shape are taken"
            )

    # Into the importer's module: the body's kernels under names of their own there, then the body.
    module = bb.get()
    mapping = {}
    for gv in module.functions:
        if gv.name_hint != body_gv.name_hint:
            mapping[gv.name_hint] = outer_bb.add_func(module[gv], gv.name_hint)
    body_final = outer_bb.add_func(_remapped(module[body_gv], mapping), body_gv.name_hint)

    # The loop itself: the runtime's relaxc.onnx_loop calls the body while i < trip count and the
    # condition holds, and stacks the scan outputs.
    trip = relax.const(2**63 - 1, "int64") if trip is None else _scalar(outer_bb, trip, "int64")
    cond0 = relax.const(True, "bool") if cond0 is None else _scalar(outer_bb, cond0, "bool")
    empty_scans = [relax.const(np.zeros([0, *[int(d) for d in t.shape.values]], str(t.dtype))) for t in scan_items]
    reversed_scans = list(attrs.get("relaxc_reversed_scans", []))[:num_scans]
    reversed_scans += [0] * (num_scans - len(reversed_scans))
    layout = relax.ShapeExpr([num_carried, num_scans, iter_rank or 0, cond_rank or 0, *reversed_scans])
    ret = relax.TupleType(
        [p.ty if _fixed(p.ty) else relax.TensorType(ndim=p.ty.ndim, dtype=p.ty.dtype) for p in carried_params]
        + [relax.TensorType(ndim=1 + t.ndim, dtype=t.dtype) for t in scan_items]
    )
    call = outer_bb.emit(
        relax.op.call_builtin_with_ctx(
            "relaxc.onnx_loop",
            [body_final, trip, cond0, layout, *empty_scans, *initial, *captured_values],
            ty_args=[ret],
        )
    )
    outputs, iterations = [], None
    for k in range(num_carried + num_scans):
        value = outer_bb.emit(relax.TupleGetItem(call, k))
        if k < num_carried and kept[k] and not _fixed(value.ty):
            value = outer_bb.match_cast(value, initial[k].ty)  # the body keeps its shape
        elif k >= num_carried:  # [iterations run, the element's shape]
            element = scan_items[k - num_carried]
            if iterations is None:
                iterations = tirx.Var(stem + "_iterations", "int64")
            value = outer_bb.match_cast(value, relax.TensorType([iterations, *element.shape.values], element.dtype))
        outputs.append(value)
    return outputs[0] if len(outputs) == 1 else relax.Tuple(outputs)


def _convert_body(importer, body, stem, constants, captured_names, carried_types, captured_types, iter_rank, cond_rank):
    """The body graph as a private Relax function (iteration, condition, carried..., captured...)
    -> (condition, carried..., scan outputs...), in a block builder of its own, with TVM's
    converters: (the builder, the function's global variable)."""
    bb = relax.BlockBuilder()
    iter_param = relax.Var("iteration", relax.TensorType([1] if iter_rank == 1 else [], "int64"))
    cond_param = relax.Var("condition", relax.TensorType([1] if cond_rank == 1 else [], "bool"))
    carried_params = [relax.Var(f"carried{k}", t) for k, t in enumerate(carried_types)]
    captured_params = [relax.Var(f"captured{k}", _renewed(t)) for k, t in enumerate(captured_types)]
    params = [iter_param, cond_param, *carried_params, *captured_params]
    saved = importer.bb, importer._nodes
    importer.bb = bb
    importer._nodes = dict(constants)
    importer._nodes.update({body.input[0].name: iter_param, body.input[1].name: cond_param})
    importer._nodes.update({v.name: p for v, p in zip(body.input[2:], carried_params)})
    importer._nodes.update(dict(zip(captured_names, captured_params)))
    try:
        with bb.function(stem + "_body", params=params):
            result = importer._convert_subgraph(bb, body)
            fields = list(result.fields) if isinstance(result, relax.Tuple) else [result]
            fields = [f if isinstance(f, relax.Var) else bb.emit(f) for f in fields]
            return bb, bb.emit_func_output(relax.Tuple(fields))
    finally:
        importer.bb, importer._nodes = saved


def _fixed(ty):
    """Whether a tensor type has a shape of integers only."""
    return ty.shape is not None and all(isinstance(d, tirx.IntImm) for d in ty.shape.values)


def _renewed(ty):
    """ty with a fresh symbolic variable for each dimension that is not an integer (a function
    defines its own), the integers kept."""
    if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
        raise LoopError(f"a loop value is {ty}, not a tensor of known rank")
    if ty.shape is None:
        return _generalized(ty)
    dims = [d if isinstance(d, tirx.IntImm) else tirx.Var(f"loop_d{i}", "int64") for i, d in enumerate(ty.shape.values)]
    return relax.TensorType(dims, ty.dtype)


def _same(a, b):
    """Whether two tensor types are the same (dtype and shape, symbolic dimensions by identity)."""
    import tvm_ffi

    return str(a.dtype) == str(b.dtype) and a.shape is not None and tvm_ffi.structural_equal(a.shape, b.shape)


def scan_as_loop(model, log=print):
    """The model with each Scan node (opset 9 and later) written as the Loop that does the same:
    a trip count from the first scan input's length, the body gathering iteration i's slice of
    each scan input (-1 - i for a reversed one), the scan outputs stacked (last iteration first
    for a reversed one) and moved to their axis after the loop. The model itself when it has no Scan."""
    from onnx import TensorProto, helper

    if not any(n.op_type == "Scan" and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 9:
        from . import OnnxError

        raise OnnxError("Scan before opset 9 (with a batch axis and sequence_lens) is not taken")
    nodes, count = [], 0
    for node in model.graph.node:
        if node.op_type != "Scan" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        count += 1
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        body, m = attrs["body"], int(attrs["num_scan_inputs"])
        n_states = len(node.input) - m
        k_scans = len(body.output) - n_states
        in_axes = list(attrs.get("scan_input_axes", [0] * m))
        in_dirs = list(attrs.get("scan_input_directions", [0] * m))
        out_axes = list(attrs.get("scan_output_axes", [0] * k_scans))
        out_dirs = list(attrs.get("scan_output_directions", [0] * k_scans))
        stem = "".join(c if c.isalnum() else "_" for c in (node.name or node.output[0])) + "__relaxc_scan"
        name = lambda hint, stem=stem: f"{stem}_{hint}"
        scans_in = list(node.input[n_states:])

        # The trip count: the first scan input's length along its axis.
        shape0, trip = name("shape"), name("trip")
        nodes.append(helper.make_node("Shape", [scans_in[0]], [shape0], name=name("shape_node")))
        axis0 = helper.make_tensor(name("axis0"), TensorProto.INT64, [], [in_axes[0]])
        nodes.append(helper.make_node("Constant", [], [name("axis0")], value=axis0, name=name("axis0_node")))
        nodes.append(helper.make_node("Gather", [shape0, name("axis0")], [trip], axis=0, name=name("trip_node")))

        # The Loop's body: (i, cond, states...) -> (cond, states..., scan elements...).
        i, cond = name("i"), name("cond")
        body_nodes = []
        # A reversed input's slice is at -1 - i (Gather counts a negative index from the end).
        minus_one = helper.make_tensor(name("minus_one"), TensorProto.INT64, [], [-1])
        body_nodes.append(helper.make_node("Constant", [], [name("minus_one")], value=minus_one, name=name("m1_node")))
        backwards = name("backwards")
        body_nodes.append(helper.make_node("Sub", [name("minus_one"), i], [backwards], name=name("backwards_node")))
        for j, x in enumerate(scans_in):
            index = backwards if in_dirs[j] else i
            element = body.input[n_states + j].name
            body_nodes.append(
                helper.make_node("Gather", [x, index], [element], axis=in_axes[j], name=name(f"slice{j}"))
            )
        body_nodes.extend(body.node)
        cond_out = name("cond_out")
        body_nodes.append(helper.make_node("Identity", [cond], [cond_out], name=name("cond_node")))
        loop_body = helper.make_graph(
            body_nodes,
            body.name + "_as_loop",
            [
                helper.make_tensor_value_info(i, TensorProto.INT64, []),
                helper.make_tensor_value_info(cond, TensorProto.BOOL, []),
                *body.input[:n_states],
            ],
            [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []), *body.output],
            list(body.initializer),
        )
        stacked = [name(f"stacked{k}") for k in range(k_scans)]
        # A reversed scan output is stacked last iteration first by the runtime's loop (an
        # attribute of relaxc's own on the Loop: a Slice with a negative step divided by zero
        # in TVM's kernel on an empty scan).
        nodes.append(
            helper.make_node(
                "Loop",
                [trip, "", *node.input[:n_states]],
                [*node.output[:n_states], *stacked],
                body=loop_body,
                name=name("loop"),
                relaxc_reversed_scans=[int(d) for d in out_dirs] or [0],
            )
        )
        # Each scan output stacked along a new first axis: reversed and moved where Scan puts it.
        for k in range(k_scans):
            value = stacked[k]
            axis = out_axes[k]
            declared = body.output[n_states + k].type.tensor_type
            if axis and not declared.HasField("shape"):
                from . import OnnxError

                raise OnnxError(
                    f"ONNX node {node.name or node.output[0]!r} (Scan): scan output {k} goes to axis {axis}, "
                    "but the body does not declare its rank"
                )
            rank = len(declared.shape.dim) + 1
            if axis < 0:
                axis += rank
            if axis:
                perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank))
                nodes.append(
                    helper.make_node(
                        "Transpose", [value], [node.output[n_states + k]], perm=perm, name=name(f"move{k}")
                    )
                )
            else:
                nodes.append(helper.make_node("Identity", [value], [node.output[n_states + k]], name=name(f"out{k}")))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    log(f"{count} Scan(s) written as Loop(s)")
    return model
