"""relaxc's image kernels against numpy references, through tvm_ffi as test_kernels.py calls
the others: convolution (2-d, and 1-d on NCW tensors) over strides, paddings, dilations and
groups, depthwise convolution, max and average pooling, global average pooling, and 2-d resize
in each method, coordinate mode and rounding ONNX defines.

Needs numpy, pytest and apache-tvm-ffi (no TVM).
"""

import numpy as np
import pytest
import tvm_ffi
from relaxc.tvm.pack import pack_conv, pack_conv_columns
from test_kernels import ACTS, close, rand, scalars, t

# ---- convolution -----------------------------------------------------------------------------------


def conv_reference(x, w, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    oh = (h + pad[0] + pad[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pad[1] + pad[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, oc, oh, ow))
    per = oc // groups
    for g in range(groups):
        for r in range(kh):
            for s in range(kw):
                patch = xp[
                    :,
                    g * cg : (g + 1) * cg,
                    r * dil[0] : r * dil[0] + stride[0] * (oh - 1) + 1 : stride[0],
                    s * dil[1] : s * dil[1] + stride[1] * (ow - 1) + 1 : stride[1],
                ]
                out[:, g * per : (g + 1) * per] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * per : (g + 1) * per, :, r, s]
                )
    return out


CONVS = [  # n, c, h, w, oc, kh, kw, stride, pad (t, l, b, r), dilation, groups
    (1, 3, 9, 11, 5, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (2, 8, 10, 10, 16, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),
    (1, 6, 7, 9, 9, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 3),
    (1, 4, 12, 12, 7, 3, 2, (1, 2), (2, 0, 1, 1), (2, 1), 1),
    (3, 16, 6, 6, 40, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 2),
    (1, 32, 17, 13, 33, 1, 1, (2, 1), (0, 0, 0, 0), (1, 1), 1),
    (1, 3, 36, 37, 8, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),  # panels of every other input pixel
    # Stride 1 over wide rows: B read in place from the padded image (AVX2, AVX-512 with 12-row strips)
    (2, 5, 20, 30, 13, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (1, 8, 24, 46, 12, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 2),
    (1, 5, 20, 40, 8, 3, 3, (1, 1), (1, 2, 1, 0), (1, 1), 1),  # one run of zeros pads both sides
    # Stride 2 in place: the image split into its four phases (odd padding, groups, a 5x5 kernel)
    (2, 6, 21, 34, 9, 3, 3, (2, 2), (0, 1, 1, 0), (1, 1), 3),
    (1, 4, 30, 48, 7, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1), 1),
    # 1x1 in place: the input read and the output written as they are, in whole panels and with
    # a short last panel (masked loads and stores)
    (2, 20, 8, 12, 14, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (2, 20, 7, 9, 14, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
]


@pytest.mark.parametrize("case", CONVS)
def test_conv2d(library, case):
    n, c, h, wd, oc, kh, kw, stride, pad, dil, groups = case
    rng = np.random.default_rng(sum(case[:7]))
    x, w, b = rand(rng, n, c, h, wd), rand(rng, oc, c // groups, kh, kw), rand(rng, oc)
    want = conv_reference(x, w, stride, pad, dil, groups)
    r = rand(rng, *want.shape)
    out = np.zeros(want.shape, np.float32)
    params = tvm_ffi.Shape([kh, kw, *stride, *pad, *dil, groups])
    library["relaxc.conv2d"](t(x), t(pack_conv(w, groups)), t(b), t(r), params, "clip", scalars(), t(out))
    close(out, np.clip(want + b.reshape(1, -1, 1, 1) + r, -0.5, 0.75))
    # Channels as the GEMM's columns (what relaxc.tvm packs for layers with few pixels): the same
    # products summed in the same order, so the same bits.
    columns = np.zeros(want.shape, np.float32)
    library["relaxc.conv2d"](t(x), t(pack_conv_columns(w, groups)), t(b), t(r), params, "clip", scalars(), t(columns))
    np.testing.assert_array_equal(columns, out)


def test_conv1d_on_ncw_tensors(library):
    """A 1-D convolution: NCW x, out and residual, seen as NCHW with H = 1 (a 1 x k kernel), on
    both convolution kernels; the same bits as the NCHW call with H = 1."""
    rng = np.random.default_rng(21)
    x, w, b = rand(rng, 2, 4, 33), rand(rng, 6, 4, 1, 5), rand(rng, 6)
    params = tvm_ffi.Shape([1, 5, 1, 2, 0, 2, 0, 1, 1, 1, 1])
    want = conv_reference(x[:, :, None, :], w, (1, 2), (0, 2, 0, 1), (1, 1), 1)[:, :, 0, :]
    r = rand(rng, *want.shape)
    out = np.zeros(want.shape, np.float32)
    library["relaxc.conv2d"](t(x), t(pack_conv(w, 1)), t(b), t(r), params, "relu", scalars(), t(out))
    close(out, np.maximum(want + b.reshape(1, -1, 1) + r, 0))
    as_nchw = np.zeros((2, 6, 1, want.shape[2]), np.float32)
    library["relaxc.conv2d"](
        t(x[:, :, None, :]), t(pack_conv(w, 1)), t(b), t(r[:, :, None, :]), params, "relu", scalars(), t(as_nchw)
    )
    np.testing.assert_array_equal(out, as_nchw[:, :, 0, :])
    dw = rand(rng, 6, 1, 1, 3)
    depthwise = np.zeros((2, 6, want.shape[2]), np.float32)
    library["relaxc.conv2d_depthwise"](
        t(out), t(dw), None, None, tvm_ffi.Shape([1, 3, 1, 1, 0, 1, 0, 1, 1, 1, 6]), "none", scalars(), t(depthwise)
    )
    close(depthwise, conv_reference(out[:, :, None, :], dw, (1, 1), (0, 1, 0, 1), (1, 1), 6)[:, :, 0, :])
    with pytest.raises(ValueError, match="an NCW .1-D. convolution takes kh = 1"):
        library["relaxc.conv2d"](
            t(x),
            t(pack_conv(rand(rng, 6, 4, 3, 5), 1)),
            None,
            None,
            tvm_ffi.Shape([3, 5, 1, 2, 0, 2, 0, 1, 1, 1, 1]),
            "none",
            scalars(),
            t(out),
        )


@pytest.mark.parametrize(
    "stride,pad,k,dil",
    [
        ((1, 1), (1, 1, 1, 1), 3, 1),
        ((2, 2), (1, 1, 1, 1), 3, 1),
        ((2, 1), (0, 2, 1, 0), 5, 1),
        ((1, 1), (2, 2, 2, 2), 3, 2),
        ((3, 3), (0, 0, 0, 0), 3, 1),
    ],
)
def test_depthwise(library, stride, pad, k, dil):
    rng = np.random.default_rng(k * 10 + stride[0])
    x, w, b = rand(rng, 2, 6, 19, 23), rand(rng, 6, 1, k, k), rand(rng, 6)
    want = conv_reference(x, w, stride, pad, (dil, dil), 6)
    out = np.zeros(want.shape, np.float32)
    params = tvm_ffi.Shape([k, k, *stride, *pad, dil, dil, 6])
    library["relaxc.conv2d_depthwise"](t(x), t(w), t(b), None, params, "relu", scalars(), t(out))
    close(out, np.maximum(want + b.reshape(1, -1, 1, 1), 0))


@pytest.mark.parametrize("k,pad,dil,sh", [(3, 1, 1, 1), (5, 2, 1, 1), (3, 2, 2, 1), (3, 1, 1, 2)])
def test_depthwise_wide_planes_give_the_narrow_paths_bits(library, k, pad, dil, sh):
    """Planes 32 or more outputs wide go along rows, narrower ones channel-interleaved: where an
    output's window sees the same inputs the two give the same bits (the left columns of a wide
    plane against the same columns of a narrow crop), and both are within rounding of numpy;
    stride (2, 1) too, as PaddleOCR's text models have it."""
    rng = np.random.default_rng(k * 7 + dil + sh)
    x, w, b = rand(rng, 2, 20, 21, 48), rand(rng, 20, 1, k, k), rand(rng, 20)
    params = tvm_ffi.Shape([k, k, sh, 1, pad, pad, pad, pad, dil, dil, 20])
    want = conv_reference(x, w, (sh, 1), (pad,) * 4, (dil, dil), 20)
    wide = np.zeros(want.shape, np.float32)
    library["relaxc.conv2d_depthwise"](t(x), t(w), t(b), None, params, "silu", scalars(), t(wide))
    narrow = np.zeros((*want.shape[:3], 24 + 2 * pad - dil * (k - 1)), np.float32)
    library["relaxc.conv2d_depthwise"](t(x[..., :24]), t(w), t(b), None, params, "silu", scalars(), t(narrow))
    same = 24 - pad  # columns whose windows end inside the crop
    np.testing.assert_array_equal(wide[..., :same], narrow[..., :same])
    close(wide, ACTS["silu"](want + b.reshape(1, -1, 1, 1)))


def test_depthwise_with_no_output_rows_does_nothing(library):
    """A plane wide enough for the row path but shorter than the kernel: no output, no work (this
    divided by zero bands once)."""
    out = np.zeros((1, 2, 0, 38), np.float32)
    params = tvm_ffi.Shape([3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 2])
    x, w = np.ones((1, 2, 1, 40), np.float32), np.ones((2, 1, 3, 3), np.float32)
    library["relaxc.conv2d_depthwise"](t(x), t(w), None, None, params, "none", scalars(), t(out))
    assert out.shape == (1, 2, 0, 38)


# ---- pooling, softmax, norms -------------------------------------------------------------------------


def pool_reference(x, k, stride, pad, kind, include_pad):
    n, c, h, w = x.shape
    oh = (h + pad[0] + pad[2] - k[0]) // stride[0] + 1
    ow = (w + pad[1] + pad[3] - k[1]) // stride[1] + 1
    out = np.zeros((n, c, oh, ow))
    for y in range(oh):
        for z in range(ow):
            y0, z0 = y * stride[0] - pad[0], z * stride[1] - pad[1]
            ys, zs = slice(max(y0, 0), min(y0 + k[0], h)), slice(max(z0, 0), min(z0 + k[1], w))
            window = x[:, :, ys, zs].astype(np.float64)
            if kind == "max":
                out[:, :, y, z] = window.max(axis=(2, 3))
            else:
                count = (min(y0 + k[0], h + pad[2]) - max(y0, -pad[0])) * (
                    min(z0 + k[1], w + pad[3]) - max(z0, -pad[1])
                )
                out[:, :, y, z] = window.sum(axis=(2, 3)) / (
                    count if include_pad else window.shape[2] * window.shape[3]
                )
    return out


@pytest.mark.parametrize("kind,include_pad", [("max", 0), ("avg", 0), ("avg", 1)])
@pytest.mark.parametrize(
    "k,stride,pad",
    [
        ((3, 3), (2, 2), (1, 1, 1, 1)),
        ((2, 2), (2, 2), (0, 0, 0, 0)),
        ((3, 2), (1, 2), (1, 0, 1, 1)),
        ((2, 3), (1, 1), (0, 0, 0, 0)),
    ],
)
def test_pooling(library, kind, include_pad, k, stride, pad):
    rng = np.random.default_rng(k[0] + stride[1])
    x = rand(rng, 2, 3, 11, 10)
    want = pool_reference(x, k, stride, pad, kind, include_pad)
    out = np.zeros(want.shape, np.float32)
    params = tvm_ffi.Shape([*k, *stride, *pad, 1, 1])
    if kind == "max":
        library["relaxc.max_pool2d"](t(x), params, t(out))
    else:
        library["relaxc.avg_pool2d"](t(x), params, include_pad, t(out))
    close(out, want, 1e-6)


@pytest.mark.parametrize(
    "k,stride,pad,dil,extra",
    [
        ((13, 13), (1, 1), (6, 6, 6, 6), (1, 1), 0),  # YOLO's spatial pyramid pooling
        ((5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 0),
        ((3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1),  # ceil mode: one more output past the edge
        ((3, 2), (2, 3), (1, 0, 2, 1), (2, 2), 1),
        ((4, 4), (1, 1), (0, 0, 0, 0), (1, 1), 0),
    ],
)
def test_max_pooling_any_window(library, k, stride, pad, dil, extra):
    """Every window against a direct search, exactly (a maximum has one right answer): padding
    and windows past the edge count as the lowest float, as TVM's pooling has it."""
    rng = np.random.default_rng(k[0] * 7 + stride[1])
    x = rand(rng, 2, 5, 13, 12)
    h, w = x.shape[2:]
    oh = (h + pad[0] + pad[2] - dil[0] * (k[0] - 1) - 1) // stride[0] + 1 + extra
    ow = (w + pad[1] + pad[3] - dil[1] * (k[1] - 1) - 1) // stride[1] + 1 + extra
    lowest = np.finfo(np.float32).min
    want = np.full((2, 5, oh, ow), lowest, np.float32)
    for y in range(oh):
        for z in range(ow):
            for r in range(k[0]):
                for s_ in range(k[1]):
                    iy, iz = y * stride[0] + r * dil[0] - pad[0], z * stride[1] + s_ * dil[1] - pad[1]
                    if 0 <= iy < h and 0 <= iz < w:
                        want[:, :, y, z] = np.maximum(want[:, :, y, z], x[:, :, iy, iz])
    out = np.zeros(want.shape, np.float32)
    library["relaxc.max_pool2d"](t(x), tvm_ffi.Shape([*k, *stride, *pad, *dil]), t(out))
    assert np.array_equal(out, want)


def resize_reference(x, oh, ow, method, mode, rounding):
    """ONNX's Resize in float32 (TVM's resize2d computes the same coordinates)."""
    f = np.float32

    def coords(out, size):
        i, scale = np.arange(out, dtype=f), f(size) / f(out)
        if mode == "half_pixel" or (mode == "pytorch_half_pixel" and out > 1):
            return (i + f(0.5)) * scale - f(0.5)
        if mode == "align_corners":
            return f(size - 1) / f(out - 1) * i if out > 1 else np.zeros(out, f)
        if mode == "asymmetric":
            return scale * i
        if mode == "tf_half_pixel_for_nn":
            return (i + f(0.5)) * scale
        return np.zeros(out, f)

    def nearest(out, size):
        c = coords(out, size)
        if mode == "asymmetric" and rounding in ("", "floor") and out % size == 0:
            picked = np.arange(out) // (out // size)
        else:
            r = rounding or ("round" if mode == "align_corners" else "floor")
            picked = {
                "round": lambda: np.rint(c),
                "round_prefer_floor": lambda: np.ceil(c - f(0.5)),
                "round_prefer_ceil": lambda: np.floor(c + f(0.5)),
                "floor": lambda: np.floor(c + f(1e-5)),
                "ceil": lambda: np.ceil(c - f(1e-5)),
            }[r]()
        return np.clip(picked.astype(np.int64), 0, size - 1)

    h, w = x.shape[2:]
    if method == "nearest_neighbor":
        return x[:, :, nearest(oh, h)][:, :, :, nearest(ow, w)]
    cy, cx = coords(oh, h), coords(ow, w)
    y0, x0 = np.floor(cy), np.floor(cx)
    ty, tx = (cy - y0).astype(f), (cx - x0).astype(f)
    y0, x0 = y0.astype(np.int64), x0.astype(np.int64)
    y1, x1 = np.clip(y0 + 1, 0, h - 1), np.clip(x0 + 1, 0, w - 1)
    y0, x0 = np.clip(y0, 0, h - 1), np.clip(x0, 0, w - 1)
    top = x[:, :, y0][:, :, :, x0] * (1 - tx) + x[:, :, y0][:, :, :, x1] * tx
    bottom = x[:, :, y1][:, :, :, x0] * (1 - tx) + x[:, :, y1][:, :, :, x1] * tx
    return top * (1 - ty)[:, None] + bottom * ty[:, None]


@pytest.mark.parametrize(
    "method, mode, rounding, oh, ow",
    [
        ("nearest_neighbor", "asymmetric", "floor", 14, 18),  # a whole factor: integer division
        ("nearest_neighbor", "asymmetric", "", 21, 27),
        ("nearest_neighbor", "half_pixel", "round_prefer_floor", 11, 13),
        ("nearest_neighbor", "align_corners", "round_prefer_ceil", 13, 5),
        ("nearest_neighbor", "tf_half_pixel_for_nn", "ceil", 9, 10),
        ("nearest_neighbor", "pytorch_half_pixel", "round", 4, 17),
        ("linear", "half_pixel", "", 14, 18),
        ("linear", "align_corners", "", 5, 6),
        ("linear", "pytorch_half_pixel", "", 10, 1),
        ("linear", "asymmetric", "", 3, 20),
    ],
)
def test_resize2d(library, method, mode, rounding, oh, ow):
    x = rand(np.random.default_rng(oh * 31 + ow), 2, 3, 7, 9)
    out = np.zeros((2, 3, oh, ow), np.float32)
    library["relaxc.resize2d"](t(x), method, mode, rounding, t(out))
    want = resize_reference(x, oh, ow, method, mode, rounding)
    if method == "nearest_neighbor":
        np.testing.assert_array_equal(out, want)
    else:
        close(out, want, 1e-6)


def test_resize2d_names_what_it_does_not_know(library):
    x, out = np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match='unknown method "cubic"'):
        library["relaxc.resize2d"](t(x), "cubic", "half_pixel", "", t(out))
    with pytest.raises(ValueError, match='unknown coordinate mode "tf_crop_and_resize"'):
        library["relaxc.resize2d"](t(x), "linear", "tf_crop_and_resize", "", t(out))
    with pytest.raises(ValueError, match="out must be NCHW with x's batch and channels"):
        library["relaxc.resize2d"](t(x), "linear", "half_pixel", "", t(np.zeros((1, 2, 4, 4), np.float32)))


def test_global_average(library):
    x = rand(np.random.default_rng(1), 3, 5, 7, 9)
    out = np.zeros((3, 5, 1, 1), np.float32)
    library["relaxc.global_avg_pool2d"](t(x), t(out))
    close(out, x.astype(np.float64).mean(axis=(2, 3), keepdims=True), 1e-6)
