"""The rewrite behind relaxc.tvm: Relax operators the kernel library covers become
``R.call_dps_packed("relaxc.<kernel>", ...)`` calls; everything else stays for TVM's kernels.

Per function, bindings are read first (what each variable is bound to, and how often each is
used), then each anchor operator (matmul, conv2d) takes in the operators after it that only it
feeds (a scale, a bias, batch norm, a residual add, an activation), and the last of them is
replaced by one library call. Bindings left unused are removed by dead-code elimination.

Only float32 operators are rewritten, and only in forms the kernels take as they are: what does
not match (other dtypes or layouts, ceil-mode pooling, a softmax along another axis) is left
alone, never approximated.
"""

import numpy as np
from tvm.relax.expr_functor import PyExprMutator, mutator

from tvm import relax

from .attention import use_library_attention
from .conv import ConvolutionAnchors
from .pack import pack_columns, pack_int8_columns
from .patterns import (
    _ACTIVATIONS,
    _ELEMENTWISE,
    F32,
    _attr,
    _Bindings,
    _dims,
    _dtype,
    _Epilogue,
    _identify,
    _ints,
    _is_f32_tensor,
    _is_tensor,
    _op_name,
    _same_dims,
    _scalar,
    _tir_elementwise,
    _type,
)
from .rope import use_rope_once_per_position

# Activations worth a library call on their own: TVM's kernels compute their exp, erf or tanh one
# value at a time. Not the piecewise-linear ones: TVM fuses those into the kernel before them for
# free, where a call of their own costs a pass over memory (PP-OCR's detector: 4% slower). On
# tensors of at least _STANDALONE_MIN values (smaller ones cost more to call).
_STANDALONE = {"gelu", "gelu_tanh", "silu", "sigmoid"}
_STANDALONE_MIN = 4096


class _Planner(ConvolutionAnchors):
    """Finds what each anchor absorbs and what replaces the last binding it absorbs."""

    def __init__(self, func, quantize=None):
        self.quantize = quantize
        self.b = _Bindings(func)
        self.replace = {}  # Call (the value of the binding replaced) -> its replacement
        self.taken = set()  # variables an anchor absorbed: no other anchor may take them too
        self.order = [b.var for block in func.body.blocks for b in block.bindings]
        self.position = {v: i for i, v in enumerate(self.order)}

    # -- small matchers --

    def _scalar_const(self, expr):
        c = self.b.const(expr)
        if c is None or c.size != 1 or c.dtype != np.float32:
            return None
        return float(c.reshape(()))

    def _other(self, call, var):
        """The operand of a binary call that is not var (None if var is not exactly one of them)."""
        a, b = call.args[0], call.args[1]
        if a.same_as(var) and not b.same_as(var):
            return b
        if b.same_as(var) and not a.same_as(var):
            return a
        return None

    def _elementwise(self, call):
        """(numpy function, operands) of an elementwise call; None for anything else."""
        name = _op_name(call)
        if name in _ELEMENTWISE:
            return _ELEMENTWISE[name], list(call.args)
        if name == "relax.clip":  # bounds as PrimValues (HardSwish's clip(x + 3, 0, 6) imports so)
            lo, hi = _scalar(call.args[1]), _scalar(call.args[2])
            if lo is not None and hi is not None:
                return (lambda v, lo=lo, hi=hi: np.clip(v, lo, hi)), [call.args[0]]
            return None
        return _tir_elementwise(call)

    def _activation_region(self, x, order):
        """If the bindings after x that only x (and constants) feed compute an activation of x and
        leave through one variable, (that variable, (act, lo, hi), the bindings); else None."""
        region, members = [], {x}
        start = self.position.get(x)
        if start is None:
            return None
        idle = 0
        for var in order[start + 1 :]:
            # Activations follow their input closely; do not scan the rest of a long function.
            idle += 1
            if idle > 64:
                break
            call = self.b.value.get(var)
            found = self._elementwise(call) if call is not None else None
            if found is None or var in self.taken:
                continue
            _, operands = found
            inputs = [o for o in operands if isinstance(o, relax.Var) and o in members]
            if not inputs or not all(o in members or self._scalar_const_any(o) for o in operands):
                continue
            region.append(var)
            members.add(var)
            idle = 0
        # The largest closed sub-region computing a known activation (x and every binding but the
        # exit used only inside it): max(x, 0) then min(., 6) is one clip, not a relu and a min.
        for tail in reversed(region):
            inside = [v for v in region if self._reaches(v, tail, region)]
            closed = set(inside) | {x}
            if any(self._used_outside(v, closed) for v in [x] + inside if not v.same_as(tail)):
                continue

            def evaluate(samples, inside=inside, tail=tail):
                values = {x: samples}
                for var in inside:
                    fn, operands = self._elementwise(self.b.value[var])
                    args = [
                        values[o] if isinstance(o, relax.Var) and o in values else self.b.const(o) for o in operands
                    ]
                    values[var] = fn(*args)
                return values[tail]

            act = _identify(evaluate)
            if act is not None:
                return tail, act, inside
        return None

    def _scalar_const_any(self, expr):
        """expr is a constant of one element (of any dtype: a bool from isnan, a float)."""
        if isinstance(expr, relax.Var) and self.b.value.get(expr) is None:
            return False
        c = self.b.const(expr)
        return c is not None and c.size == 1

    def _used_outside(self, var, members):
        if not isinstance(var, relax.DataflowVar):
            return True
        return any(u not in members for u in self.b.users.get(var, []))

    def _reaches(self, var, tail, region):
        """var feeds tail within the region (or is tail)."""
        if var.same_as(tail):
            return True
        return any(u in region and self._reaches(u, tail, region) for u in self.b.users.get(var, []))

    def _epilogue_step(self, kind, tail, ep, out_dims):
        """Absorbs the operator after tail into ep, returning the new tail, or None."""
        region = self._activation_region(tail, self.order) if ep.act == "none" else None
        if region is not None:
            last, (ep.act, ep.lo, ep.hi), inside = region
            ep.absorbed.extend(v for v in inside if not v.same_as(last))
            return last
        user = self.b.only_user(tail)
        if user is None or user in self.taken:
            return None
        call = self.b.value.get(user)
        name = _op_name(call)
        fresh = ep.act == "none" and ep.residual is None and ep.out_perm is None
        if name == "relax.nn.batch_norm" and kind == "conv" and fresh and ep.bn is None:
            return self._batch_norm(call, user, ep)
        if call is None or not _is_f32_tensor(user):
            return None
        if name in ("relax.multiply", "relax.divide") and fresh and ep.bias is None and ep.bn is None:
            c = self._scalar_const(self._other(call, tail)) if self._other(call, tail) is not None else None
            if c is None or (name == "relax.divide" and call.args[0].same_as(tail) is False) or c == 0.0:
                return None
            ep.alpha = ep.alpha * c if name == "relax.multiply" else ep.alpha / c
            return user
        if name == "relax.add" and fresh:
            other = self._other(call, tail)
            if other is None:
                return None
            value = self.b.const(other)
            if value is not None and ep.bias is None and ep.bn is None:
                bias = self._bias(kind, value, out_dims)
                if bias is not None:
                    ep.bias = bias
                    return user
                return None
            if value is None and _same_dims(_dims(other), out_dims) and _is_f32_tensor(other):
                ep.residual = other
                return user
            return None
        if name in _ACTIVATIONS and ep.act == "none":
            ep.act = _ACTIVATIONS[name]
            return user
        if name == "relax.clip" and ep.act == "none":
            lo, hi = _scalar(call.args[1]), _scalar(call.args[2])
            if lo is None or hi is None:
                return None
            ep.act, ep.lo, ep.hi = "clip", lo, hi
            return user
        if name == "relax.permute_dims" and kind == "matmul" and ep.out_perm is None and ep.residual is None:
            axes = _attr(call, "axes")
            rank = len(out_dims)
            ep.out_perm = list(range(rank))[::-1] if axes is None else [a % rank for a in _ints(axes)]
            return user
        return None

    def _bias(self, kind, value, out_dims):
        """A bias that broadcasts along the output's channels only, as a 1-D array; else None."""
        channels = out_dims[1] if kind == "conv" else out_dims[-1]
        if not isinstance(channels, int):
            return None
        shape = list(value.shape)
        if kind == "conv":
            spatial = [1] * (len(out_dims) - 2)  # NCHW, or NCW (conv1d)
            wanted = [[channels], [channels, *spatial], [1, channels, *spatial]]
        else:
            wanted = [[1] * i + [channels] for i in range(len(out_dims))]
        if shape not in wanted or value.dtype != np.float32:
            return None
        return value.reshape(channels)

    def _batch_norm(self, call, user, ep):
        """Inference batch norm over the channels, every parameter constant, only its first output
        used: folded into the convolution's weights and bias."""
        if _attr(call, "training", False) or int(_attr(call, "axis", 1)) != 1:
            return None
        params = [self.b.const(a) for a in call.args[1:5]]
        if any(p is None for p in params):
            return None
        getters = self.b.users.get(user, [])
        first = None
        for g in getters:
            value = self.b.value.get(g)
            if not isinstance(value, relax.TupleGetItem):
                return None
            if value.index == 0:
                first = g
            elif self.b.uses.get(g, 0) != 0:
                return None
        if first is None or not isinstance(first, relax.DataflowVar):
            return None
        gamma, beta, mean, var = params
        if not _attr(call, "scale", True):
            gamma = np.ones_like(gamma)
        if not _attr(call, "center", True):
            beta = np.zeros_like(beta)
        ep.bn = (gamma, beta, mean, var, float(_attr(call, "epsilon", 1e-5)))
        ep.absorbed.append(user)
        return first

    def _absorb(self, kind, anchor, out_dims):
        ep = _Epilogue()
        tail = anchor
        while True:
            nxt = self._epilogue_step(kind, tail, ep, _dims(tail) if kind == "matmul" else out_dims)
            if nxt is None:
                break
            ep.absorbed.append(tail)
            tail = nxt
        self.taken.update(ep.absorbed)
        self.taken.add(tail)
        return tail, ep

    # -- anchors --

    def _finish(self, tail, kernel, args):
        """Replaces the binding of tail with a call of kernel."""
        value = self.b.value[tail]
        self.replace[value] = relax.call_dps_packed(kernel, args, out_ty=_type(tail))

    def _perm_operand(self, expr):
        """An operand with a permute_dims in front of it read through the permutation instead:
        (tensor, axes or None)."""
        bound = self.b.bound(expr)
        if _op_name(bound) == "relax.permute_dims" and _is_f32_tensor(bound.args[0]):
            inner = bound.args[0]
            rank = len(_dims(inner) or [])
            axes = _attr(bound, "axes")
            return inner, (list(range(rank))[::-1] if axes is None else [a % rank for a in _ints(axes)])
        return expr, None

    def matmul(self, var, call):
        a, b = call.args[0], call.args[1]
        out_dtype = _attr(call, "out_dtype")
        if str(out_dtype) == "int32":
            self.matmul_integer(var, call)
            return
        if not (_is_f32_tensor(a) and _is_f32_tensor(b) and _is_f32_tensor(var)):
            return
        if out_dtype not in (None, "", F32) and str(out_dtype) not in ("", F32, "void"):
            return
        da, db = _dims(a), _dims(b)
        if da is None or db is None or len(da) < 1:
            return
        weight = self.b.const(b)
        if weight is not None and weight.ndim == 2 and self._quantized(var, a, weight):
            return
        if weight is not None and weight.ndim == 2:
            tail, ep = self._absorb("dense", var, _dims(var))
            ep.out_perm = None
            args = [a, relax.const(pack_columns(weight)), self._bias_arg(ep), self._residual_arg(ep)]
            self._finish(tail, "relaxc.dense", args + [relax.expr.String(ep.act), ep.scalars()])
            return
        pa, a_perm = self._perm_operand(a)
        pb, b_perm = self._perm_operand(b)
        if len(_dims(pa) or []) < 2 or len(_dims(pb) or []) < 2:
            return
        if weight is None and self.attention(var, (pa, a_perm), (pb, b_perm)):
            return
        tail, ep = self._absorb("matmul", var, _dims(var))
        args = [
            pa,
            pb,
            self._bias_arg(ep),
            self._residual_arg(ep),
            self._shape(a_perm),
            self._shape(b_perm),
            self._shape(ep.out_perm),
            relax.expr.String(ep.act),
            ep.scalars(),
        ]
        self._finish(tail, "relaxc.matmul", args)

    def _softmax_chain(self, scores):
        """The bindings after scores = q @ k that attention's softmax makes of it: an optional
        multiply or divide by a constant, an optional add of a mask (a float32 tensor that
        broadcasts to the scores), softmax over the last axis, each used only by the next.
        (softmax binding, alpha, mask or None, bindings taken), or None."""
        dims = _dims(scores)
        tail, alpha, mask, taken = scores, 1.0, None, []
        for step in ("scale", "mask", "softmax"):
            user = self.b.only_user(tail)
            call = self.b.value.get(user) if user is not None else None
            if call is None or user in self.taken or not _is_f32_tensor(user):
                return None
            name = _op_name(call)
            if step == "scale" and name in ("relax.multiply", "relax.divide"):
                other = self._other(call, tail)
                c = self._scalar_const(other) if other is not None else None
                if c is None or c == 0.0 or (name == "relax.divide" and not call.args[0].same_as(tail)):
                    return None
                alpha = alpha * c if name == "relax.multiply" else alpha / c
            elif step == "mask" and name == "relax.add":
                mask = self._other(call, tail)
                mask_dims = _dims(mask) if mask is not None else None
                if not _is_f32_tensor(mask) or mask_dims is None or len(mask_dims) > len(dims):
                    return None
                for m, s in zip(reversed(mask_dims), reversed(dims)):
                    if not ((isinstance(m, int) and m == 1) or _same_dims([m], [s])):
                        return None
            elif step == "softmax" and name == "relax.nn.softmax":
                if int(_attr(call, "axis", -1)) % len(dims) != len(dims) - 1:
                    return None
            elif step == "softmax":
                return None
            else:
                continue
            taken.append(tail)
            tail = user
        return tail, alpha, mask, taken

    def attention(self, scores, q, k):
        """softmax(alpha * q @ k + mask) @ v (an encoder's attention as exported: MatMul, Div, Add,
        Softmax, MatMul; q, k and v behind the permute_dims that split the heads) as one
        relaxc.attention call, the score matrix never written out; a permute_dims after it (the
        heads merged) is read through as the result's permutation. True when it matched."""
        dims = _dims(scores)
        if dims is None or len(dims) < 2:
            return False
        chain = self._softmax_chain(scores)
        if chain is None:
            return False
        probs, alpha, mask, taken = chain
        final = self.b.only_user(probs)
        call = self.b.value.get(final) if final is not None else None
        if _op_name(call) != "relax.matmul" or not call.args[0].same_as(probs) or final in self.taken:
            return False
        v = call.args[1]
        if not (_is_f32_tensor(v) and _is_f32_tensor(final)) or self.b.const(v) is not None:
            return False
        pv, v_perm = self._perm_operand(v)
        if len(_dims(pv) or []) < 2:
            return False
        tail, out_perm = final, None
        user = self.b.only_user(final)
        after = self.b.value.get(user) if user is not None else None
        if _op_name(after) == "relax.permute_dims" and user not in self.taken and _is_f32_tensor(user):
            axes = _attr(after, "axes")
            rank = len(_dims(final))
            out_perm = list(range(rank))[::-1] if axes is None else [a % rank for a in _ints(axes)]
            self.taken.add(final)
            tail = user
        self.taken.update(taken + [probs, tail])
        args = [
            q[0],
            k[0],
            pv,
            relax.op.null_value() if mask is None else mask,
            self._shape(q[1]),
            self._shape(k[1]),
            self._shape(v_perm),
            self._shape(out_perm),
            relax.const(np.array([alpha], np.float32)),
        ]
        self._finish(tail, "relaxc.attention", args)
        return True

    def _integer_operand(self, expr):
        """(x, zero point or None) when expr is astype(x, int32) less a zero point, or without
        one, with x of 8 bits (how TVM imports MatMulInteger's operands); else None."""
        bound = self.b.bound(expr)
        zero_point = None
        if _op_name(bound) == "relax.subtract":
            expr, zero_point = bound.args[0], bound.args[1]
            bound = self.b.bound(expr)
        if _op_name(bound) != "relax.astype" or _dtype(bound.args[0]) not in ("uint8", "int8"):
            return None
        return bound.args[0], zero_point

    def _zero_point_arg(self, zero_point):
        """relaxc.matmul_int8's a_zero_point for one integer (None: null), the 8-bit value before
        TVM's cast to int32 where there is one; None when it is not one integer (per-row zero
        points stay on TVM's kernels)."""
        if zero_point is None:
            return relax.op.null_value()
        dims = _dims(zero_point)
        if dims is None or not all(isinstance(d, int) for d in dims) or int(np.prod(dims)) != 1:
            return None
        value = self.b.const(zero_point)
        if value is not None:
            return relax.const(np.asarray(value, np.int32).reshape(()))
        bound = self.b.bound(zero_point)
        if _op_name(bound) == "relax.astype" and _dtype(bound.args[0]) in ("uint8", "int8", "int32"):
            return bound.args[0]
        return zero_point if _dtype(zero_point) == "int32" else None

    def matmul_integer(self, var, call):
        """ONNX's MatMulInteger as TVM imports it (int32 casts of 8-bit operands less their zero
        points, an int32 matmul) against constant weights: relaxc.matmul_int8 on the 8-bit
        activations, the weights less their zero points packed once here. Exact, so the
        integers are ONNX Runtime's; the scaling after it stays with TVM (an element-wise kernel)."""
        operand = self._integer_operand(call.args[0])
        c = self.b.const(call.args[1])
        if operand is None or c is None or c.ndim != 2 or c.dtype.kind not in "iu":
            return
        x, zero_point = operand
        dims = _dims(x)
        zp_arg = self._zero_point_arg(zero_point)
        packed = pack_int8_columns(c)
        if zp_arg is None or packed is None or not dims or dims[-1] != c.shape[0] or not _is_tensor(var, "int32"):
            return
        self.taken.add(var)
        tail, scale, bias = self._int8_epilogue(var, c.shape[1])
        args = [x, relax.const(packed[0]), relax.const(packed[1]), zp_arg, scale, bias]
        self._finish(tail, "relaxc.matmul_int8", args)

    def _int8_epilogue(self, var, n):
        """What ORT's quantizer writes after a MatMulInteger, taken into the call: a cast to
        float32, a multiply by the scales (one value or one per column; computed in the graph
        from the activations' scale), and a constant bias. (the last binding taken, scale, bias),
        null for what is not there."""
        none = relax.op.null_value()
        cast = self.b.only_user(var)
        if cast is None or _op_name(self.b.value.get(cast)) != "relax.astype" or not _is_f32_tensor(cast):
            return var, none, none
        mul = self.b.only_user(cast)
        call = self.b.value.get(mul) if mul is not None else None
        scale = self._other(call, cast) if _op_name(call) == "relax.multiply" and _is_f32_tensor(mul) else None
        dims = _dims(scale) if scale is not None else None
        if not (_is_f32_tensor(scale) and dims is not None and all(isinstance(d, int) for d in dims)):
            return var, none, none
        count = int(np.prod(dims)) if dims else 1
        if not (count == 1 or (count == n and dims[-1] == n)) or not _same_dims(_dims(mul), _dims(var)):
            return var, none, none
        # The last binding taken is left out of `taken`: an activation after it (a GELU) can
        # still become a library call of its own.
        self.taken.add(cast)
        add = self.b.only_user(mul)
        call = self.b.value.get(add) if add is not None else None
        other = self._other(call, mul) if _op_name(call) == "relax.add" else None
        value = self.b.const(other) if other is not None else None
        bias = self._bias("dense", value, _dims(mul)) if value is not None else None
        if bias is None or add in self.taken:
            return mul, scale, none
        self.taken.add(mul)
        return add, scale, relax.const(np.ascontiguousarray(bias, np.float32))

    def fake_quantize(self, var, call):
        """dequantize(quantize(x)) with constant scales and one zero point (the QDQ form's
        activations between layers; a dequantize of scale 1 gives relaxc.onnx's exact int8
        convolutions their integers) as one relaxc.fake_quantize pass: TVM's kernels round
        each value with a libm call (an int8 classifier spent two thirds of its time there)."""
        q = self.b.bound(call.args[0])
        if _op_name(q) != "relax.quantize" or not (_is_f32_tensor(q.args[0]) and _is_f32_tensor(var)):
            return
        dtype = _dtype(call.args[0])
        params = [self.b.const(a) for a in (q.args[1], q.args[2], call.args[1], call.args[2])]
        if dtype not in ("uint8", "int8") or any(p is None or p.size != 1 for p in params):
            return
        scale, zp, scale2, zp2 = (float(np.asarray(p).reshape(())) for p in params)
        if zp != zp2 or not scale > 0:
            return
        info = np.iinfo(dtype)
        self.taken.add(var)
        scalars = relax.const(np.array([scale, zp, info.min, info.max, scale2], np.float32))
        self._finish(var, "relaxc.fake_quantize", [q.args[0], scalars])

    def _quantized(self, var, x, weight):
        """With build(quantize=FMT): a dense layer whose weight [k, n] has rows of whole blocks
        becomes relaxc.dense_q over the weight quantized to FMT (q4_0 and q4_K regrouped eight
        rows at a time when n allows), absorbing nothing after it (dense_q has no epilogue)."""
        from ..llm.quantize import BLOCKS, REGROUPINGS, quantize

        fmt = self.quantize
        k, n = weight.shape
        if fmt is None or (fmt in BLOCKS and k % BLOCKS[fmt][0] != 0):
            return False
        rows = quantize(np.ascontiguousarray(weight.T), fmt)
        regrouped = {"q4_0": "q4_0x8", "q4_K": "q4_Kx8", "q8_0": "q8_0x8"}.get(fmt) if n % 8 == 0 else None
        if regrouped:
            rows, fmt = REGROUPINGS["#" + regrouped](rows), regrouped
        self.taken.add(var)
        self._finish(var, "relaxc.dense_q", [x, relax.const(rows), relax.expr.String(fmt), relax.op.null_value()])
        return True

    def mean(self, var, call):
        x = call.args[0]
        dims = _dims(x)
        if not (_is_f32_tensor(x) and _is_f32_tensor(var)) or dims is None or len(dims) != 4:
            return
        axes = _attr(call, "axis")
        if axes is None or sorted(a % 4 for a in _ints(axes)) != [2, 3] or not _attr(call, "keepdims", False):
            return
        self._finish(var, "relaxc.global_avg_pool2d", [x])

    def softmax(self, var, call):
        x = call.args[0]
        dims = _dims(x)
        if not (_is_f32_tensor(x) and _is_f32_tensor(var)) or dims is None:
            return
        if int(_attr(call, "axis", -1)) % len(dims) != len(dims) - 1:
            return
        self._finish(var, "relaxc.softmax", [x])

    def norm(self, var, call, name):
        x = call.args[0]
        dims = _dims(x)
        if not (_is_f32_tensor(x) and _is_f32_tensor(var)) or dims is None or not dims:
            return
        axes = _ints(_attr(call, "axes", []))
        if [a % len(dims) for a in axes] != [len(dims) - 1]:
            return
        eps = relax.const(np.array([float(_attr(call, "epsilon", 1e-5))], np.float32))
        if name == "relax.nn.rms_norm":
            self._finish(var, "relaxc.rms_norm", [x, call.args[1], eps])
            return
        if not _attr(call, "scale", True):
            return
        beta = call.args[2] if _attr(call, "center", True) else relax.op.null_value()
        self._finish(var, "relaxc.layer_norm", [x, call.args[1], beta, eps])

    def activation(self, var):
        """An activation written out as element-wise operators on var that no anchor took in (a
        convolution's GELU behind a slice and a squeeze, in magika's model) becomes one
        relaxc.activation call: vectorized and on the pool, where TVM's kernels computed each tanh,
        erf or exp one value at a time on one thread (38% of that model's time)."""
        if var in self.taken or not _is_f32_tensor(var):
            return
        dims = _dims(var)
        if dims is None or (all(isinstance(d, int) for d in dims) and int(np.prod(dims)) < _STANDALONE_MIN):
            return
        if not any(self._elementwise(self.b.value.get(u)) is not None for u in self.b.users.get(var, [])):
            return
        region = self._activation_region(var, self.order)
        if region is None:
            return
        tail, (act, lo, hi), inside = region
        if act not in _STANDALONE or not _is_f32_tensor(tail) or not _same_dims(_dims(tail), dims):
            return
        self.taken.update(inside)
        scalars = _Epilogue(act=act, lo=lo, hi=hi).scalars()
        self._finish(tail, "relaxc.activation", [var, relax.expr.String(act), scalars])

    # -- arguments --

    @staticmethod
    def _bias_arg(ep):
        return relax.op.null_value() if ep.bias is None else relax.const(np.ascontiguousarray(ep.bias, np.float32))

    @staticmethod
    def _residual_arg(ep):
        return relax.op.null_value() if ep.residual is None else ep.residual

    @staticmethod
    def _shape(perm):
        return relax.op.null_value() if perm is None else relax.ShapeExpr(perm)

    def plan(self, func):
        """Every replacement in func: {the call a binding held: the library call replacing it}.
        Anchors never absorb one another (what they absorb are epilogue operators), so one pass in
        binding order finds them all."""
        for block in func.body.blocks:
            for binding in block.bindings:
                if not isinstance(binding, relax.VarBinding):
                    continue
                var, value = binding.var, binding.value
                name = _op_name(value)
                if name == "relax.matmul":
                    self.matmul(var, value)
                elif name == "relax.nn.conv2d":
                    self.conv2d(var, value)
                elif name == "relax.image.resize2d":
                    self.resize2d(var, value)
                elif name == "relax.nn.conv1d":
                    self.conv1d(var, value)
                elif name == "relax.nn.conv2d_transpose":
                    self.conv2d_transpose(var, value)
                elif name in ("relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d"):
                    self.pool(var, value, name)
                elif name == "relax.mean":
                    self.mean(var, value)
                elif name == "relax.nn.softmax":
                    self.softmax(var, value)
                elif name in ("relax.nn.layer_norm", "relax.nn.rms_norm"):
                    self.norm(var, value, name)
                elif name == "relax.dequantize":
                    self.fake_quantize(var, value)
        # Then what no anchor took: activations on their own.
        for block in func.body.blocks:
            for binding in block.bindings:
                if isinstance(binding, relax.VarBinding):
                    self.activation(binding.var)
        return self.replace


@mutator
class _Apply(PyExprMutator):
    """Replaces the value of each binding the planner chose (a call, or the tuple item batch norm
    leaves behind) with its library call."""

    def __init__(self, mod, replace):
        super().__init__(mod)
        self.replacements = replace

    def visit_call_(self, call):
        new = self.replacements.get(call)
        return super().visit_call_(new if new is not None else call)

    def visit_tuple_getitem_(self, item):
        new = self.replacements.get(item)
        return self.visit_expr(new) if new is not None else super().visit_tuple_getitem_(item)


def rewrite_module(mod, quantize=None):
    """A copy of the module with every covered operator calling relaxc's kernel library (dense
    layers over weights quantized to `quantize` when it names a format: f16, q8_0, q4_0, q4_K,
    q6_K), float32 KV caches' attention included, and their RoPE computed once per angle."""
    mod = use_rope_once_per_position(use_library_attention(mod.clone()))
    for gvar, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        replace = _Planner(func, quantize).plan(func)
        if not replace:
            continue
        rewritten = _Apply(mod, replace).visit_expr(func)
        mod[gvar] = rewritten
    return relax.transform.DeadCodeElimination()(mod)
