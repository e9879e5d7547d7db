"""relaxc.onnx: an ONNX file as it ships to a relaxc model, in one step.

    python -m relaxc.onnx MODEL.onnx -o MODEL.so [--shape NAME=1,3,640,640 ...]
                          [--exec-mode compiled] [--target TRIPLE]

``build`` folds the model's shape arithmetic at the given input shapes (onnxsim: exporters
compute Reshape targets from Shape, Gather and Concat, which TVM's importer cannot take),
imports it with TVM's ONNX front end, builds it with relaxc.tvm (the operators the kernel library
covers run on it) and compiles it with relaxc. An input dimension that is symbolic in the file
(a batch) stays symbolic unless --shape fixes it. It reports what runs where: how many operators
run on the kernel library and how many on TVM's kernels, the largest of those named. An operator
TVM cannot import is an error naming the ONNX node and its type. Needs Apache TVM, onnx and
onnxsim.
"""

import os
import subprocess
import tempfile
import time

import numpy as np

from .. import find_relaxc
from .contrib import expand_contrib
from .expand import expand_recurrent
from .quantized import expand_quantized

__all__ = ["OnnxError", "build", "parse_shape", "placement"]


class OnnxError(ValueError):
    """An ONNX file relaxc.onnx cannot build, with what and where (input, node, operator)."""


def parse_shape(text):
    """NAME=1,3,640,640 as (name, [1, 3, 640, 640])."""
    name, sep, dims = text.rpartition("=")
    try:
        values = [int(d) for d in dims.split(",")]
    except ValueError:
        values = None
    if not sep or not name or not values or any(d <= 0 for d in values):
        raise OnnxError(f"--shape {text!r}: write NAME=D0,D1,... with positive sizes (e.g. images=1,3,640,640)")
    return name, values


def _graph_inputs(model):
    """The model's real inputs (not initializers) as {name: [int or str]} (a str: symbolic)."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = []
        for i, d in enumerate(value.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(d.dim_value)
            else:
                dims.append(d.dim_param or f"{value.name}_dim{i}")
        inputs[value.name] = dims
    return inputs


def _redeclare_input(model, name, dims):
    """Declares input `name` with `dims`, and forgets the shapes the file recorded for the values
    computed from it (value_info and the outputs' dimensions), which were for the old shape."""
    value = next(v for v in model.graph.input if v.name == name)
    for d, size in zip(value.type.tensor_type.shape.dim, dims):
        d.Clear()
        d.dim_value = size
    del model.graph.value_info[:]
    for output in model.graph.output:
        for i, d in enumerate(output.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                d.Clear()
                d.dim_param = f"{output.name}_dim{i}"


def _fold(model, shapes, log):
    """The model with its constant and shape arithmetic folded at `shapes` (onnxsim)."""
    import onnxsim

    try:
        folded, ok = onnxsim.simplify(model, overwrite_input_shapes=shapes or None, perform_optimization=True)
    except Exception as e:
        log(
            f"note: onnxsim could not fold this model ({type(e).__name__}: {str(e).splitlines()[0]}); importing it as is"
        )
        return model
    if not ok:
        log("note: onnxsim's folded model did not check out against the original; importing the original")
        return model
    return folded


def _shape_values(model):
    """A function giving the value of a shape-arithmetic tensor (Shape, Gather, Concat,
    Unsqueeze, Squeeze, Cast, Slice over constants) as a list whose items are ints, a symbolic
    dimension's name, or None where unknown; None for a tensor it cannot follow."""
    import onnx
    from onnx import numpy_helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    infos = list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)
    shapes = {}
    for v in infos:
        if v.type.tensor_type.HasField("shape"):
            shapes[v.name] = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in v.type.tensor_type.shape.dim
            ]
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            constants[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    producer = {o: n for n in model.graph.node for o in n.output}
    memo = {}

    def ints(name):
        if name in constants and constants[name].dtype.kind in "iu":
            return [int(v) for v in np.atleast_1d(constants[name])]
        return None

    def value(name, depth=0):
        if name in memo:
            return memo[name]
        result = ints(name)
        node = producer.get(name)
        if result is None and node is not None and depth < 64:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            op = node.op_type
            if op == "Shape" and node.input[0] in shapes:
                dims = shapes[node.input[0]]
                result = dims[attrs.get("start", 0) : attrs.get("end", len(dims))]
            elif op in ("Cast", "Identity", "Unsqueeze", "Squeeze"):
                result = value(node.input[0], depth + 1)
            elif op == "Gather" and attrs.get("axis", 0) == 0:
                data, index = value(node.input[0], depth + 1), ints(node.input[1])
                if data is not None and index is not None and all(-len(data) <= i < len(data) for i in index):
                    result = [data[i] for i in index]
            elif op == "Concat":
                parts = [value(i, depth + 1) for i in node.input]
                if all(p is not None for p in parts):
                    result = [d for p in parts for d in p]
            elif op == "Slice":
                data = value(node.input[0], depth + 1)
                starts, ends = ints(node.input[1]), ints(node.input[2])
                steps = ints(node.input[4]) if len(node.input) > 4 and node.input[4] else [1]
                if data is not None and starts and ends and len(starts) == 1:
                    result = data[starts[0] : ends[0] : steps[0]]
        memo[name] = result
        return result

    return value, shapes


def _pin_reshapes(model):
    """Reshape targets computed from a symbolic shape (x.view(x.size(0), -1) exports as Shape,
    Gather, Concat), written as constants where they can be followed: a dimension that is the
    input's own at the same place becomes 0 (ONNX's "copy it"), a number stays, and at most one
    other becomes -1. TVM's importer takes a constant target whatever the batch."""
    from onnx import numpy_helper

    value, shapes = _shape_values(model)
    constants = {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2 or node.input[1] in constants:
            continue
        if any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        target, source = value(node.input[1]), shapes.get(node.input[0])
        if not target:
            continue
        pinned, unknown = [], 0
        for i, d in enumerate(target):
            if isinstance(d, int):
                pinned.append(d)
                unknown += d == -1
            elif isinstance(d, str) and source and i < len(source) and source[i] == d:
                pinned.append(0)
            else:
                pinned.append(-1)
                unknown += 1
        if unknown > 1:
            continue
        name = f"{node.output[0]}__relaxc_target"
        model.graph.initializer.append(numpy_helper.from_array(np.array(pinned, np.int64), name))
        node.input[1] = name
    return model


def _check_operators(model):
    """An error naming the first node TVM's ONNX front end has no converter for."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    known = _get_convert_map()
    for i, node in enumerate(model.graph.node):
        if node.domain == "relaxc":  # relaxc.onnx's own nodes (converters.py)
            continue
        if node.op_type not in known and node.op_type not in ("If", "Loop"):
            raise OnnxError(
                f"ONNX node {node.name or f'#{i}'!r} ({node.op_type}): TVM's ONNX front end has no converter for "
                f"{node.op_type} (domain {node.domain or 'ai.onnx'})"
            )


def _import(model, shape_dict):
    """TVM's import, an error in a node's conversion naming that node and its type."""
    from tvm.relax.frontend.onnx import from_onnx, onnx_frontend

    from tvm import relax

    from .converters import convert as relaxc_convert
    from .loop import LoopError, convert_loop

    importer = onnx_frontend.ONNXGraphImporter
    original = importer._convert_operator

    def convert(self, op_name, inputs, attrs, opset):
        try:
            if op_name == "Loop":
                try:
                    return convert_loop(self, inputs, attrs)
                except LoopError as e:
                    name = attrs.get("tvm_custom", {}).get("name", "?")
                    raise OnnxError(f"ONNX node {name!r} (Loop): {e}") from e
            ours = relaxc_convert(self.bb, op_name, inputs, attrs)
            if ours is not None:
                return ours
            converted = original(self, op_name, inputs, attrs, opset)
            # Some converters (DequantizeLinear's, Add's of a constant) return calls whose type
            # is not inferred yet, which the next node's converter may read (Softmax's does).
            if isinstance(converted, relax.Call):
                converted = self.bb.normalize(converted)
            return converted
        except OnnxError:
            raise
        except Exception as e:
            name = attrs.get("tvm_custom", {}).get("name", "?")
            message = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise OnnxError(f"ONNX node {name!r} ({op_name}): TVM cannot import it: {message}") from e

    def check(self, graph):
        # relaxc's own nodes are converted by convert() above; TVM checks the rest.
        others = type(graph)()
        others.CopyFrom(graph)
        del others.node[:]
        others.node.extend(n for n in graph.node if n.domain != "relaxc" and n.op_type != "Loop")
        return original_check(self, others)

    original_check = importer._check_for_unsupported_ops
    importer._convert_operator = convert
    importer._check_for_unsupported_ops = check
    try:
        return from_onnx(model, shape_dict=shape_dict, keep_params_in_input=False)
    finally:
        importer._convert_operator = original
        importer._check_for_unsupported_ops = original_check


def placement(mod):
    """What runs where in a module rewritten by relaxc.tvm: (library calls, TVM operators,
    [(operator, output shape, count)] of the TVM operators, largest output first)."""
    import tvm
    from relaxc.tvm.patterns import _dims
    from tvm import relax

    library, other = 0, {}
    # Operators that compute nothing (views, shapes, bookkeeping).
    free = {"relax.reshape", "relax.null_value", "relax.shape_of", "relax.call_pure_packed", "relax.match_cast"}
    free.add("relax.call_builtin_with_ctx")  # the runtime's own (an ONNX Loop's relaxc.onnx_loop)

    def visit(var, expr):
        nonlocal library
        if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)):
            return
        name = expr.op.name
        if name == "relax.call_dps_packed":
            if getattr(expr.args[0], "global_symbol", "").startswith("relaxc."):
                library += 1
                return
        if name in free:
            return
        dims = tuple(d if isinstance(d, int) else str(d) for d in _dims(var) or [])
        op = name[len("relax.") :] if name.startswith("relax.") else name
        if op == "call_tir" and hasattr(expr.args[0], "name_hint"):
            op = expr.args[0].name_hint  # the TIR function TVM's importer made (hard_sigmoid, ...)
        key = (op, dims)
        other[key] = other.get(key, 0) + 1

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            for block in func.body.blocks:
                for binding in block.bindings:
                    if isinstance(binding, relax.VarBinding):
                        visit(binding.var, binding.value)

    def size(shape):
        n = 1
        for d in shape:
            n *= d if isinstance(d, int) else 1
        return n

    ranked = sorted(((op, shape, n) for (op, shape), n in other.items()), key=lambda t: -size(t[1]) * t[2])
    return library, sum(other.values()), ranked


def _fast_math(mod):
    """What stays on TVM's kernels computes exp, erf, tanh and sigmoid with TVM's polynomial forms
    (topi.fast_exp and friends; within 1e-6 of onnx's reference in the tests), which vectorize,
    instead of calling libm once a value: an LSTM's gates (CRNN: 2-3% of its time at 1 and 2 threads), a softmax along
    another axis than the last. The kernel library's own activations are not touched."""
    from tvm.relax.expr_functor import PyExprMutator, mutator

    import tvm
    from tvm import relax, topi

    fast_forms = {
        "relax.exp": topi.fast_exp,
        "relax.erf": topi.fast_erf,
        "relax.tanh": topi.fast_tanh,
        "relax.sigmoid": lambda x: 1.0 / (1.0 + topi.fast_exp(-x)),
    }

    @mutator
    class FastMath(PyExprMutator):
        # TVM's FastMathTransform does the same but takes every call's callee for an operator: a
        # call of another Relax function (an ONNX Loop's) stopped it.
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op):
                return call
            if call.op.name == "relax.nn.softmax":
                return self.builder_.call_te(topi.nn.fast_softmax, call.args[0], call.attrs.axis)
            if call.op.name in fast_forms:
                return self.builder_.call_te(fast_forms[call.op.name], call.args[0])
            return call

    fast = FastMath(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            fast.builder_.update_func(gv, fast.visit_expr(func))
    return fast.builder_.get()


def _stopwatch(log):
    """step(what) logs what was just done and the seconds it took since the previous step."""
    last = [time.time()]

    def step(what):
        now = time.time()
        log(f"  {what}: {now - last[0]:.1f} s")
        last[0] = now

    return step


def build(model_path, output, shapes=None, exec_mode="bytecode", target=None, log=print, instrument=False):
    """Builds the ONNX file at model_path into the shared object `output`. `shapes` fixes input
    shapes ({name: [dims]}); a dimension the file leaves symbolic and `shapes` does not fix stays
    symbolic. `instrument` builds for `relaxc run --profile`. Returns the placement (see
    `placement`)."""
    import onnx

    import relaxc.tvm

    started = time.time()
    step = _stopwatch(log)
    try:
        model = onnx.load(model_path)
    except Exception as e:
        raise OnnxError(f"{model_path}: not an ONNX model that can be read: {e}") from None
    step(f"read {model_path}")
    inputs = _graph_inputs(model)
    shapes = dict(shapes or {})
    for name, dims in shapes.items():
        if name not in inputs:
            raise OnnxError(f"--shape {name}: the model has no input {name!r} (its inputs: {', '.join(inputs)})")
        if len(dims) != len(inputs[name]):
            raise OnnxError(f"--shape {name}: {len(dims)} dimensions given, the input has {len(inputs[name])}")
        if any(isinstance(want, int) and d != want for d, want in zip(dims, inputs[name])):
            # Exporters leave placeholders in fixed dimensions (a fully convolutional model
            # declared at 10x3x32x32); the user's shape wins, and the graph must take it.
            log(f"warning: --shape {name}={','.join(map(str, dims))} replaces the file's fixed {inputs[name]}")
            _redeclare_input(model, name, dims)
    symbolic = {n: d for n, d in inputs.items() if n not in shapes and any(isinstance(x, str) for x in d)}
    if symbolic:
        log("symbolic dimensions kept: " + "; ".join(f"{n} {d}" for n, d in symbolic.items()))
    folded = _fold(model, shapes, log)
    step("folded the shape arithmetic (onnxsim)")
    if symbolic:
        folded = _pin_reshapes(folded)
    folded = expand_contrib(folded, log)
    folded = expand_recurrent(folded, log)
    folded = expand_quantized(folded, log)
    from .loop import scan_as_loop  # here: loop.py needs TVM, which the package may lack

    folded = scan_as_loop(folded, log)
    _check_operators(folded)
    # TVM reads the others from the file, a symbolic dimension as a variable of its name.
    shape_dict = {n: shapes[n] for n in _graph_inputs(folded) if n in shapes}
    mod = _import(folded, shape_dict)
    step("imported with TVM's ONNX front end")
    from relaxc.tvm.rewrite import rewrite_module

    mod = rewrite_module(mod)
    mod = _fast_math(mod)
    step("rewrote the operators to relaxc's kernel library")
    on_library, on_tvm, ranked = placement(mod)
    log(f"{on_library} operators on relaxc's kernel library, {on_tvm} on TVM's kernels")
    for op, shape, n in ranked[:5]:
        log(f"  TVM: {op} -> {list(shape)}" + (f" x{n}" if n > 1 else ""))
    relaxc_bin = find_relaxc()
    with tempfile.TemporaryDirectory() as work:
        tar = os.path.join(work, "model.tar")
        relaxc.tvm.build(mod, target=relaxc.tvm.target_for(target)).export_library(tar)
        step("built the remaining kernels with TVM (LLVM)")
        command = [relaxc_bin, "compile", tar, "--exec-mode", exec_mode, "-o", output]
        if target:
            command += ["--target", target]
        if instrument:
            command.append("--instrument")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"relaxc compile failed:\n{done.stderr}")
        step(f"compiled with relaxc ({exec_mode})")
    log(f"wrote {output} in {time.time() - started:.1f} s")
    return on_library, on_tvm, ranked
