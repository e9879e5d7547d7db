"""What relaxc.tvm's rewrite reads in a Relax function: operators, types and dims, attributes,
the constants behind variables (through reshapes, transposes and elementwise arithmetic), which
bindings use which, the activations that arrive written out as several operators (identified on
sample points), and the epilogue a matmul or convolution absorbs.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import tvm_ffi

import tvm
from tvm import relax

F32 = "float32"

# ---- reading the IR ------------------------------------------------------------------------------


def _op_name(expr):
    """The operator's name ("relax.matmul") if expr is a call to an operator, else None."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def _type(expr):
    return getattr(expr, "ty", None)


def _is_f32_tensor(expr):
    return _is_tensor(expr, F32)


def _is_tensor(expr, dtype):
    """expr is a tensor of the dtype named (a string: "int32")."""
    t = _type(expr)
    return isinstance(t, relax.TensorType) and str(t.dtype) == str(dtype)


def _dtype(expr):
    """The dtype of a tensor as a string ("uint8"); None for anything else."""
    t = _type(expr)
    return str(t.dtype) if isinstance(t, relax.TensorType) else None


def _dims(expr):
    """The dims of a tensor's shape as Python ints where static, else TIR expressions; None when
    the rank or shape is unknown."""
    t = _type(expr)
    if not isinstance(t, relax.TensorType) or not isinstance(t.shape, relax.ShapeExpr):
        return None
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in t.shape.values]


def _same_dims(a, b):
    if a is None or b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, int) or isinstance(y, int):
            if not (isinstance(x, int) and isinstance(y, int) and x == y):
                return False
        elif not tvm_ffi.structural_equal(x, y):
            return False
    return True


def _attr(call, name, default=None):
    attrs = call.attrs
    if attrs is None:
        return default
    try:
        value = attrs[name] if hasattr(attrs, "__getitem__") else getattr(attrs, name)
    except (AttributeError, KeyError, IndexError):
        return default
    return default if value is None else value


def _ints(values):
    return [int(v) for v in values]


def _scalar(expr):
    """A PrimValue argument's number (clip's bounds), or None."""
    value = getattr(expr, "value", None)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _walk_vars(expr, found):
    """Appends every Var expr mentions (with repeats)."""
    if isinstance(expr, relax.Var):
        found.append(expr)
    elif isinstance(expr, relax.Call):
        for a in expr.args:
            _walk_vars(a, found)
    elif isinstance(expr, relax.Tuple):
        for a in expr.fields:
            _walk_vars(a, found)
    elif isinstance(expr, relax.TupleGetItem):
        _walk_vars(expr.tuple_value, found)
    elif isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            for b in block.bindings:
                _walk_vars(b.value, found)
        _walk_vars(expr.body, found)
    elif isinstance(expr, relax.If):
        _walk_vars(expr.cond, found)
        _walk_vars(expr.true_branch, found)
        _walk_vars(expr.false_branch, found)


class _Bindings:
    """What one function's variables are bound to, who uses them and how often."""

    def __init__(self, func):
        self.value = {}
        self.users = {}
        self.uses = {}
        body = func.body
        for block in body.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(binding, relax.VarBinding):
                    self.value[binding.var] = value
                mentioned = []
                _walk_vars(value, mentioned)
                for v in mentioned:
                    self.uses[v] = self.uses.get(v, 0) + 1
                    self.users.setdefault(v, [])
                    if binding.var not in self.users[v]:
                        self.users[v].append(binding.var)
        mentioned = []
        _walk_vars(body.body, mentioned)
        for v in mentioned:
            self.uses[v] = self.uses.get(v, 0) + 1

    def bound(self, expr):
        """What a variable is bound to (None for parameters and non-variables)."""
        return self.value.get(expr) if isinstance(expr, relax.Var) else None

    def only_user(self, var):
        """The one binding that uses var, if var is a dataflow variable used exactly once (so that
        folding it away changes nothing else)."""
        if not isinstance(var, relax.DataflowVar) or self.uses.get(var, 0) != 1:
            return None
        users = self.users.get(var, [])
        return users[0] if len(users) == 1 else None

    def const(self, expr):
        """expr's value as a numpy array when it is a constant, or a reshape, transpose, cast or
        element-wise function of constants."""
        if isinstance(expr, tvm.ir.expr.GenericConst):
            return expr.value.numpy()
        bound = self.bound(expr)
        if bound is None or not isinstance(bound, relax.Call):
            return None
        name = _op_name(bound)
        if name == "relax.reshape":
            inner, dims = self.const(bound.args[0]), _dims(expr)
            if inner is None or dims is None or not all(isinstance(d, int) for d in dims):
                return None
            return inner.reshape(dims)
        if name == "relax.permute_dims":
            inner = self.const(bound.args[0])
            if inner is None:
                return None
            axes = _attr(bound, "axes")
            return np.transpose(inner, None if axes is None else _ints(axes))
        if name == "relax.astype":
            inner = self.const(bound.args[0])
            return None if inner is None else inner.astype(str(_attr(bound, "dtype")))
        if name == "relax.expand_dims":
            inner = self.const(bound.args[0])
            if inner is None:
                return None
            dims = _dims(expr)
            return None if dims is None or not all(isinstance(d, int) for d in dims) else inner.reshape(dims)
        if name in _ELEMENTWISE:
            operands = [self.const(a) for a in bound.args]
            if any(o is None for o in operands):
                return None
            with np.errstate(all="ignore"):
                return np.asarray(_ELEMENTWISE[name](*operands))
        return None


# ---- activations written out as several operators -----------------------------------------------

_ELEMENTWISE = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.power": np.power,
    "relax.negative": np.negative,
    "relax.erf": lambda x: np.vectorize(math.erf, otypes=[np.float64])(x),
    "relax.tanh": np.tanh,
    "relax.exp": np.exp,
    "relax.sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relax.sqrt": np.sqrt,
    "relax.maximum": np.maximum,
    "relax.minimum": np.minimum,
    "relax.isnan": np.isnan,
    "relax.where": np.where,
}

# TVM's ONNX importer lowers some operators (Clip with tensor bounds) straight to TIR kernels
# named after the topi function: these are recognised by that name.
_TIR_ELEMENTWISE = {"maximum": np.maximum, "minimum": np.minimum}


def _tir_elementwise(call):
    """For a call_tir of one of _TIR_ELEMENTWISE: (function, operands); else None."""
    if _op_name(call) != "relax.call_tir" or not isinstance(call.args[0], relax.GlobalVar):
        return None
    base = call.args[0].name_hint.rstrip("0123456789")
    operands = call.args[1]
    if base not in _TIR_ELEMENTWISE or not isinstance(operands, relax.Tuple) or len(operands.fields) != 2:
        return None
    return _TIR_ELEMENTWISE[base], list(operands.fields)


_SAMPLES = np.concatenate([np.linspace(-8.0, 8.0, 161), [-50.0, -20.0, -3.3, -0.1, 0.1, 0.77, 3.3, 20.0, 50.0]])


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


# Activations a region may compute, by the name the kernels know them by.
_KNOWN = {
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0.0),
}


def _identify(f):
    """The activation f computes ("clip", lo, hi for a clip), judged on sample points; else None."""
    x = _SAMPLES
    with np.errstate(all="ignore"):
        y = np.asarray(f(x), np.float64)
        # A one-element constant of rank 3 ([[[1.0]]], as jax2tf writes them) makes the samples [1, 1, n].
        if y.size == x.size:
            y = y.reshape(x.shape)
        if y.shape != x.shape or not np.all(np.isfinite(y)):
            return None
        for name, g in _KNOWN.items():
            if np.allclose(y, g(x), rtol=1e-5, atol=1e-6):
                return name, 0.0, 0.0
        lo, hi = float(y[0]), float(y[-1])
        if lo < hi and np.allclose(y, np.clip(x, lo, hi), rtol=1e-6, atol=1e-7):
            return "clip", lo, hi
        return _hard(x, y)
    return None


def _hard(x, y):
    """("hard_sigmoid" or "hard_swish", slope, offset) where y is clip(slope * x + offset, 0, 1),
    or x times that (HardSwish, written out as x * clip(x + 3, 0, 6) / 6); else None."""
    for name, gate in (("hard_sigmoid", y), ("hard_swish", np.divide(y, x, out=np.full_like(y, np.nan), where=x != 0))):
        inner = (gate > 1e-4) & (gate < 1 - 1e-4) & np.isfinite(gate)
        # Both ends clipped somewhere: a plain scale (0.8 * x) is not hard_swish with slope 0.
        if inner.sum() < 4 or not (np.any(gate <= 1e-4) and np.any(gate >= 1 - 1e-4)):
            continue
        slope, offset = np.polyfit(x[inner], gate[inner], 1)
        if slope <= 0:
            continue
        want = np.clip(slope * x + offset, 0.0, 1.0)
        if name == "hard_swish":
            want = x * want
        if np.allclose(y, want, rtol=1e-5, atol=1e-6):
            return name, float(slope), float(offset)
    return None


# ---- the epilogue ---------------------------------------------------------------------------------


@dataclass
class _Epilogue:
    alpha: float = 1.0
    bias: object = None  # numpy array
    residual: object = None  # a Relax expression laid out as the output
    act: str = "none"
    lo: float = 0.0
    hi: float = 0.0
    out_perm: object = None  # matmul only: permutation of the result
    bn: object = None  # conv only: (gamma, beta, mean, var, eps) arrays to fold into the weights
    absorbed: list = field(default_factory=list)

    def scalars(self):
        return relax.const(np.array([self.alpha, self.lo, self.hi], np.float32))


_ACTIVATIONS = {
    "relax.nn.relu": "relu",
    "relax.nn.gelu": "gelu",
    "relax.nn.gelu_tanh": "gelu_tanh",
    "relax.nn.silu": "silu",
    "relax.sigmoid": "sigmoid",
}


def _close(x, y):
    return x is not None and abs(x - y) <= 1e-6 * max(1.0, abs(y))
