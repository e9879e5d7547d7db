"""relaxc's kernel library, kernel by kernel, against numpy: the library that `relaxc
kernel-library` builds (the kernels a model links, exported as tvm-ffi functions), called on
numpy arrays through tvm_ffi. Shapes that end off the micro-kernel's tile (n not a multiple of
16, m not of 6, k not of the block), every epilogue, permutations and broadcasting, softmax and
norms, errors. test_image_kernels.py checks convolution, pooling and resize. test_kernel_bits.py checks their bits across thread counts and instruction
sets.

Needs numpy, pytest and apache-tvm-ffi (no TVM). Weights are packed by relaxc's Python package
(python/relaxc/tvm/pack.py), as relaxc.tvm packs them.
"""

import os
import sys

import numpy as np
import pytest
import tvm_ffi
from conftest import assert_each_raises

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
from relaxc.tvm.pack import pack_columns, pack_conv

ACTS = {
    "none": lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
    "clip": lambda x: np.clip(x, -0.5, 0.75),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


def t(a):
    return None if a is None else tvm_ffi.from_dlpack(np.ascontiguousarray(a))


def scalars(alpha=1.0, lo=-0.5, hi=0.75):
    return t(np.array([alpha, lo, hi], np.float32))


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def close(got, want, tol=2e-5):
    want = np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    err = float(np.abs(got.astype(np.float64) - want).max()) if want.size else 0.0
    assert err <= tol * scale, f"{err:.3e} from numpy (scale {scale:.3g})"


def epilogue(x, act, alpha=1.0, bias=None, residual=None):
    y = alpha * x
    if bias is not None:
        y = y + bias
    if residual is not None:
        y = y + residual
    return ACTS[act](y)


# ---- dense and matmul ------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 2, 5, 7, 13, 19, 64, 101, 437])
@pytest.mark.parametrize("n,k", [(1, 1), (15, 7), (16, 256), (17, 300), (33, 513), (100, 40)])
def test_dense_shapes(library, m, n, k):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    x, w = rand(rng, m, k), rand(rng, k, n)
    out = np.zeros((m, n), np.float32)
    library["relaxc.dense"](t(x), t(pack_columns(w)), None, None, "none", scalars(), t(out))
    close(out, x.astype(np.float64) @ w)


@pytest.mark.parametrize("rows", [9, 65])
@pytest.mark.parametrize("act", sorted(ACTS))
def test_dense_epilogues(library, act, rows):
    """18 rows (A packed whole, one block) and 130 (two strips a call, 12 rows by 2 panels)."""
    rng = np.random.default_rng(7)
    x, w, b, r = rand(rng, 2, rows, 40), rand(rng, 40, 37), rand(rng, 37), rand(rng, 2, rows, 37)
    out = np.zeros((2, rows, 37), np.float32)
    library["relaxc.dense"](t(x), t(pack_columns(w)), t(b), t(r), act, scalars(0.5), t(out))
    close(out, epilogue(x.astype(np.float64) @ w, act, 0.5, b, r))


@pytest.mark.parametrize("act", ["hard_sigmoid", "hard_swish"])
def test_hard_activations_give_their_float32_formula_bit_for_bit(library, act):
    """Applied in the micro-kernel's registers (the two full panels) or after it (the 5 columns
    past them): either way y = slope * x + offset clamped to [0, 1] (times x for hard_swish), one
    float32 operation at a time, as numpy computes it."""
    rng = np.random.default_rng(11)
    x, w, b = rand(rng, 30, 64), rand(rng, 64, 37), rand(rng, 37)
    slope_offset = t(np.array([1.0, 1 / 6, 0.5], np.float32))
    plain, out = np.zeros((30, 37), np.float32), np.zeros((30, 37), np.float32)
    library["relaxc.dense"](t(x), t(pack_columns(w)), t(b), None, "none", slope_offset, t(plain))
    library["relaxc.dense"](t(x), t(pack_columns(w)), t(b), None, act, slope_offset, t(out))
    y = np.clip(np.float32(1 / 6) * plain + np.float32(0.5), np.float32(0), np.float32(1))
    np.testing.assert_array_equal(out, plain * y if act == "hard_swish" else y)


def test_dense_empty_reduction_is_the_epilogue_of_zero(library):
    b = np.arange(5, dtype=np.float32)
    out = np.full((3, 5), 9.0, np.float32)
    library["relaxc.dense"](
        t(np.zeros((3, 0), np.float32)), t(np.zeros((1, 0, 16), np.float32)), t(b), None, "relu", scalars(), t(out)
    )
    close(out, np.tile(b, (3, 1)))


def matmul(library, a, b, a_perm=None, b_perm=None, out_perm=None, bias=None, residual=None, act="none", alpha=1.0):
    la = a if a_perm is None else np.transpose(a, a_perm)
    lb = b if b_perm is None else np.transpose(b, b_perm)
    want = np.matmul(la.astype(np.float64), lb)
    want = epilogue(want, act, alpha, bias)
    if out_perm is not None:
        want = np.transpose(want, out_perm)
    if residual is not None:
        want = ACTS[act](
            np.transpose(
                epilogue(np.matmul(la.astype(np.float64), lb), "none", alpha, bias), out_perm or range(want.ndim)
            )
            + residual
        )
    out = np.zeros(want.shape, np.float32)
    shape = lambda p: None if p is None else tvm_ffi.Shape(list(p))
    library["relaxc.matmul"](
        t(a), t(b), t(bias), t(residual), shape(a_perm), shape(b_perm), shape(out_perm), act, scalars(alpha), t(out)
    )
    return out, want


def test_matmul_attention_patterns(library):
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, 2, 7, 4, 16), rand(rng, 2, 7, 4, 16), rand(rng, 2, 7, 4, 16)
    # scores = q' k'^T with q' = q.permute(0, 2, 1, 3), k read as (0, 2, 3, 1); scaled.
    got, want = matmul(library, q, k, a_perm=(0, 2, 1, 3), b_perm=(0, 2, 3, 1), alpha=0.25)
    close(got, want)
    # context = p v', written straight into [b, s, h, d].
    p = rand(rng, 2, 4, 7, 7)
    got, want = matmul(library, p, v, b_perm=(0, 2, 1, 3), out_perm=(0, 2, 1, 3))
    close(got, want)


@pytest.mark.parametrize(
    "sa,sb",
    [((5, 3, 8), (8, 11)), ((3, 1, 6, 5), (2, 5, 17)), ((1, 9, 33), (4, 33, 2)), ((2, 3, 7, 20), (2, 3, 20, 31))],
)
def test_matmul_broadcast_batches(library, sa, sb):
    rng = np.random.default_rng(len(sa) * 7 + sb[-1])
    a, b = rand(rng, *sa), rand(rng, *sb)
    got, want = matmul(library, a, b, bias=rand(rng, sb[-1]), act="gelu")
    close(got, want)


def test_matmul_residual_in_the_output_layout(library):
    rng = np.random.default_rng(5)
    a, b = rand(rng, 2, 3, 5, 8), rand(rng, 8, 6)
    r = rand(rng, 2, 5, 3, 6)
    got, want = matmul(library, a, b, out_perm=(0, 2, 1, 3), residual=r, act="relu")
    close(got, want)


# ---- attention -----------------------------------------------------------------------------------------


def attention_reference(q, k, v, mask, alpha):
    """softmax(alpha * q @ k + mask) @ v in float64 (k: the keys transposed)."""
    s = alpha * (q.astype(np.float64) @ k.astype(np.float64))
    if mask is not None:
        s = s + mask
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


def attention(library, q, k, v, mask=None, alpha=0.125, perms=(None, None, None, None)):
    """relaxc.attention on operands stored in the permuted layouts (the permutations name how the
    kernel reads them), with numpy's result."""
    shape = lambda p: None if p is None else tvm_ffi.Shape(list(p))
    stored = [x if p is None else np.ascontiguousarray(x.transpose(np.argsort(p))) for x, p in zip((q, k, v), perms)]
    want = attention_reference(q, k, v, mask, alpha)
    out_perm = perms[3]
    out = np.zeros(want.shape if out_perm is None else want.transpose(np.argsort(out_perm)).shape, np.float32)
    library["relaxc.attention"](
        *(t(x) for x in stored), t(mask), *(shape(p) for p in perms), t(np.array([alpha], np.float32)), t(out)
    )
    got = out if out_perm is None else out.transpose(out_perm)
    return got, want


@pytest.mark.parametrize(
    "b,h,sq,sk,d,dv",
    [
        (1, 12, 128, 128, 32, 32),
        (2, 3, 7, 5, 3, 5),
        (1, 1, 1, 1, 1, 1),
        (1, 2, 61, 600, 64, 64),
        (2, 4, 50, 257, 17, 40),
    ],
)
def test_attention_against_numpy(library, b, h, sq, sk, d, dv):
    """Heads split and merged by permutations (as exported encoders do), a key padding mask, key
    counts off the vector width and across the online softmax's chunks (256 keys)."""
    rng = np.random.default_rng(sq * 31 + sk)
    q, k, v = rand(rng, b, h, sq, d), rand(rng, b, h, d, sk), rand(rng, b, h, sk, dv)
    mask = np.where(rng.random((b, 1, 1, sk)) < 0.25, -10000.0, 0.0).astype(np.float32)
    got, want = attention(
        library, q, k, v, mask, 1 / np.sqrt(d), ((0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3), (0, 2, 1, 3))
    )
    close(got, want, 1e-5)
    got, want = attention(library, q * 4, k, v)
    close(got, want, 1e-5)


@pytest.mark.parametrize("mask_shape", [(9,), (6, 9), (3, 1, 9), (2, 3, 6, 9), (2, 1, 6, 1)])
def test_attention_broadcasts_masks_and_batches(library, mask_shape):
    """Masks of every broadcasting shape, and keys and values shared by the heads (one head of
    keys for three of queries, as multi-query attention has)."""
    rng = np.random.default_rng(len(mask_shape))
    q, k, v = rand(rng, 2, 3, 6, 8), rand(rng, 2, 1, 8, 9), rand(rng, 1, 9, 5)
    mask = rand(rng, *mask_shape) * 3
    got, want = attention(library, q, k, v, mask, 0.5)
    close(got, want, 1e-5)


def test_attention_of_masked_keys_and_no_keys(library):
    """Keys masked with -inf or -1e30 take no weight; a row with every key masked by -inf is NaN,
    as softmax's 0 / 0 is (what the operators it replaces give); no keys at all gives NaN too."""
    rng = np.random.default_rng(4)
    q, k, v = rand(rng, 1, 2, 4), rand(rng, 1, 4, 300), rand(rng, 1, 300, 3)
    mask = np.zeros((2, 300), np.float32)
    mask[0, ::2] = -np.inf
    mask[1, 1:] = -1e30
    got, want = attention(library, q, k, v, mask)
    close(got, want, 1e-5)
    mask[0, :] = -np.inf
    with np.errstate(invalid="ignore"):
        got, _ = attention(library, q, k, v, mask)
    assert np.isnan(got[0, 0]).all() and not np.isnan(got[0, 1]).any()
    out = np.zeros((1, 2, 3), np.float32)
    no_keys = [t(np.zeros(s, np.float32)) for s in ((1, 4, 0), (1, 0, 3))]
    library["relaxc.attention"](t(q), *no_keys, None, None, None, None, None, t(np.array([1.0], np.float32)), t(out))
    assert np.isnan(out).all()


def test_attention_errors_name_what_is_wrong(library):
    q, k, v = np.zeros((2, 4, 8), np.float32), np.zeros((2, 8, 5), np.float32), np.zeros((2, 5, 3), np.float32)
    out, alpha = np.zeros((2, 4, 3), np.float32), t(np.array([1.0], np.float32))
    f = library["relaxc.attention"]
    cases = [
        (lambda: f(t(q), t(q), t(v), None, None, None, None, None, alpha, t(out)), ValueError, "give no result"),
        (
            lambda: f(t(q), t(k), t(v), t(np.zeros((3, 5), np.float32)), None, None, None, None, alpha, t(out)),
            ValueError,
            "the mask [3, 5] does not broadcast to the scores [..., 4, 5]",
        ),
        (
            lambda: f(t(q), t(k), t(np.zeros((3, 5, 3), np.float32)), None, None, None, None, None, alpha, t(out)),
            ValueError,
            "do not broadcast to out",
        ),
        (
            lambda: f(t(q), t(k), t(v), None, tvm_ffi.Shape([0, 0, 1]), None, None, None, alpha, t(out)),
            ValueError,
            "q_perm is not a permutation",
        ),
        (lambda: f(t(q), t(k), t(v), None, None, None, None, None, alpha), TypeError, "expects 10 arguments, got 9"),
        (
            lambda: f(t(q), t(k), t(v.astype(np.float64)), None, None, None, None, None, alpha, t(out)),
            TypeError,
            "argument 2 (v) must be float32",
        ),
    ]
    assert_each_raises(cases)


# ---- softmax, norms ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 5, 8, 13, 64, 1000])
def test_softmax_and_norms(library, n):
    rng = np.random.default_rng(n)
    x, g, b = rand(rng, 3, 4, n) * 3, rand(rng, n), rand(rng, n)
    out = np.zeros_like(x)
    library["relaxc.softmax"](t(x), t(out))
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    close(out, e / e.sum(axis=-1, keepdims=True), 1e-6)
    eps = t(np.array([1e-5], np.float32))
    library["relaxc.layer_norm"](t(x), t(g), t(b), eps, t(out))
    xd = x.astype(np.float64)
    mean, var = xd.mean(axis=-1, keepdims=True), xd.var(axis=-1, keepdims=True)
    close(out, (xd - mean) / np.sqrt(var + 1e-5) * g + b, 1e-5)
    library["relaxc.rms_norm"](t(x), t(g), eps, t(out))
    close(out, xd / np.sqrt((xd * xd).mean(axis=-1, keepdims=True) + 1e-5) * g, 1e-5)


def test_softmax_of_masked_rows(library):
    x = np.array([[0.0, -np.inf, 1.0, -1e30]], np.float32)
    out = np.zeros_like(x)
    library["relaxc.softmax"](t(x), t(out))
    close(out, [[1 / (1 + np.e), 0, np.e / (1 + np.e), 0]], 1e-6)


# ---- errors --------------------------------------------------------------------------------------------


def test_errors_name_the_kernel_and_the_argument(library):
    x = np.zeros((2, 4), np.float32)
    w = pack_columns(np.zeros((4, 3), np.float32))
    out = np.zeros((2, 3), np.float32)
    dense = library["relaxc.dense"]
    cases = [
        (
            lambda: dense(t(x.astype(np.float64)), t(w), None, None, "none", scalars(), t(out)),
            TypeError,
            "relaxc.dense: argument 0 (x) must be float32, got float64",
        ),
        (
            lambda: dense(t(x), t(w), None, None, "none", scalars(), t(np.zeros((2, 40), np.float32))),
            ValueError,
            "w_packed has the wrong number of panels",
        ),
        (lambda: dense(t(x), t(w), None, None, "swish", scalars(), t(out)), ValueError, 'unknown activation "swish"'),
        (
            lambda: dense(t(x), t(w), t(np.zeros(4, np.float32)), None, "none", scalars(), t(out)),
            ValueError,
            "bias must have shape [3]",
        ),
        (lambda: dense(t(x), t(w), None, None, "none", t(out)), TypeError, "relaxc.dense expects 7 arguments, got 6"),
        (
            lambda: dense(t(x), 3, None, None, "none", scalars(), t(out)),
            TypeError,
            "argument 1 (w_packed) must be a tensor",
        ),
        (
            lambda: library["relaxc.conv2d"](
                t(np.zeros((1, 2, 4, 4), np.float32)),
                t(pack_conv(np.zeros((2, 2, 3, 3), np.float32), 1)),
                None,
                None,
                tvm_ffi.Shape([3, 3, 0, 1, 1, 1, 1, 1, 1, 1, 1]),
                "none",
                scalars(),
                t(np.zeros((1, 2, 4, 4), np.float32)),
            ),
            ValueError,
            "relaxc.conv2d: invalid params",
        ),
        (
            lambda: library["relaxc.matmul"](t(x), t(x), None, None, None, None, None, "none", scalars(), t(out)),
            ValueError,
            "the reduction lengths differ: [2, 4] times [2, 4]",
        ),
        (
            lambda: library["relaxc.matmul"](
                t(x),
                t(x),
                None,
                None,
                None,
                tvm_ffi.Shape([0, 0]),
                None,
                "none",
                scalars(),
                t(np.zeros((2, 2), np.float32)),
            ),
            ValueError,
            "b_perm is not a permutation",
        ),
    ]
    assert_each_raises(cases)


# ---- threads -------------------------------------------------------------------------------------------
