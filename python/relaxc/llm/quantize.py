"""Float32 matrices into GGUF's block formats, in numpy: what relaxc's quantized kernels read.

Round-to-nearest within each block (llama.cpp's reference quantizers search the scales more
carefully for the K formats; these are simpler and a little less accurate). Each function takes
a [rows, k] float array and returns uint8 [rows, k / block * block bytes] (f16: float16 [rows, k]).
"""

import numpy as np

BLOCKS = {"q8_0": (32, 34), "q4_0": (32, 18), "q4_K": (256, 144), "q6_K": (256, 210)}


def _f16_bytes(values):
    return np.ascontiguousarray(values.astype(np.float16)).view(np.uint8).reshape(*values.shape, 2)


def _safe_inverse(d):
    return np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)


def q8_0(w):
    rows, k = w.shape
    x = w.reshape(rows, k // 32, 32).astype(np.float32)
    d = (np.abs(x).max(axis=-1) / 127.0).astype(np.float16).astype(np.float32)
    q = np.clip(np.rint(x * _safe_inverse(d)[..., None]), -127, 127).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=-1).reshape(rows, -1)


def q4_0(w):
    rows, k = w.shape
    x = w.reshape(rows, k // 32, 32).astype(np.float32)
    # As llama.cpp: the value of largest magnitude maps to -8, so the scale carries its sign.
    at = np.abs(x).argmax(axis=-1)
    extreme = np.take_along_axis(x, at[..., None], axis=-1)[..., 0]
    d = (extreme / -8.0).astype(np.float16).astype(np.float32)
    q = np.clip(
        np.rint(x * _safe_inverse(np.abs(d))[..., None] * np.sign(np.where(d == 0, 1, d))[..., None]) + 8,
        0,
        15,
    )
    q = q.astype(np.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)
    return np.concatenate([_f16_bytes(d), packed], axis=-1).reshape(rows, -1)


def q4_K(w):
    rows, k = w.shape
    x = w.reshape(rows, k // 256, 8, 32).astype(np.float32)
    lo = np.minimum(x.min(axis=-1), 0.0)
    scale = (x.max(axis=-1) - lo) / 15.0
    d = (scale.max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)
    dmin = ((-lo).max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale * _safe_inverse(d)[..., None]), 0, 63).astype(np.int32)
    mn = np.clip(np.rint(-lo * _safe_inverse(dmin)[..., None]), 0, 63).astype(np.int32)
    step = d[..., None] * sc
    q = np.clip(
        np.rint((x + (dmin[..., None] * mn)[..., None]) * _safe_inverse(step)[..., None]),
        0,
        15,
    ).astype(np.uint8)
    s = np.zeros((rows, k // 256, 12), np.uint8)
    for j in range(4):
        s[..., j] = (sc[..., j] | ((sc[..., j + 4] >> 4) << 6)).astype(np.uint8)
        s[..., j + 4] = (mn[..., j] | ((mn[..., j + 4] >> 4) << 6)).astype(np.uint8)
        s[..., j + 8] = ((sc[..., j + 4] & 0xF) | ((mn[..., j + 4] & 0xF) << 4)).astype(np.uint8)
    q = q.reshape(rows, k // 256, 4, 2, 32)
    qs = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(rows, k // 256, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), s, qs], axis=-1).reshape(rows, -1)


def q6_K(w):
    rows, k = w.shape
    x = w.reshape(rows, k // 256, 16, 16).astype(np.float32)
    scale = np.abs(x).max(axis=-1) / 31.0
    d = (scale.max(axis=-1) / 127.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale * _safe_inverse(d)[..., None]), -128, 127).astype(np.int8)
    step = d[..., None] * sc.astype(np.float32)
    q = (
        (np.clip(np.rint(x * _safe_inverse(step)[..., None]), -32, 31) + 32)
        .astype(np.uint8)
        .reshape(rows, k // 256, 2, 4, 32)
    )
    ql = np.concatenate(
        [
            q[..., 0, :] & 0xF | ((q[..., 2, :] & 0xF) << 4),
            q[..., 1, :] & 0xF | ((q[..., 3, :] & 0xF) << 4),
        ],
        axis=-1,
    )
    qh = (q[..., 0, :] >> 4) | ((q[..., 1, :] >> 4) << 2) | ((q[..., 2, :] >> 4) << 4) | ((q[..., 3, :] >> 4) << 6)
    ql = ql.reshape(rows, k // 256, 128)
    qh = qh.reshape(rows, k // 256, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d)], axis=-1).reshape(rows, -1)


def quantize(w, fmt):
    """w [rows, k] in format fmt (f32, f16, q8_0, q4_0, q4_K, q6_K), as the kernels take it."""
    w = np.asarray(w, np.float32)
    if fmt == "f32":
        return np.ascontiguousarray(w)
    if fmt == "f16":
        return w.astype(np.float16)
    if fmt not in BLOCKS:
        raise ValueError(f"unknown format {fmt!r} (f32, f16, q8_0, q4_0, q4_K, q6_K)")
    block = BLOCKS[fmt][0]
    if w.ndim != 2 or w.shape[1] % block:
        raise ValueError(f"{fmt} needs a matrix whose rows are multiples of {block} values, got {w.shape}")
    return {"q8_0": q8_0, "q4_0": q4_0, "q4_K": q4_K, "q6_K": q6_K}[fmt](w)


def _regroup_scaled_blocks(w, block_bytes, name):
    """Blocks of a 2-byte scale and values, eight rows at a time: per block the 8 rows' scales,
    then for each 4 bytes of values the 8 rows' 4 bytes (runtime-shim/src/gguf.c does the same)."""
    w = np.asarray(w, np.uint8)
    rows, row_bytes = w.shape
    if rows % 8:
        raise ValueError(f"{name} needs a multiple of 8 rows, got {rows}")
    g, nb, groups = rows // 8, row_bytes // block_bytes, (block_bytes - 2) // 4
    blocks = w.reshape(g, 8, nb, block_bytes).transpose(0, 2, 1, 3)  # [g, b, r, bytes]
    scales = blocks[..., :2].reshape(g, nb, 16)
    values = blocks[..., 2:].reshape(g, nb, 8, groups, 4).transpose(0, 1, 3, 2, 4)  # [g, b, j, r, 4]
    out = np.concatenate([scales, values.reshape(g, nb, 32 * groups)], axis=-1)
    return np.ascontiguousarray(out.reshape(g, -1))


def repack_q4_0x8(w):
    """q4_0 rows [n, k / 32 * 18] regrouped eight at a time, as rvm.h's weights_open makes them for
    a parameter named "X#q4_0x8" (runtime-shim/src/gguf.h): [n / 8, k / 32 * 144]."""
    return _regroup_scaled_blocks(w, 18, "q4_0x8")


def _q4k_scales_mins(packed):
    """q4_K's 12 bytes of scales [..., 12] as (scales [..., 8], minimums [..., 8])."""
    s = packed.astype(np.uint16)
    scales, mins = (
        np.empty(s.shape[:-1] + (8,), np.uint8),
        np.empty(s.shape[:-1] + (8,), np.uint8),
    )
    for j in range(4):
        scales[..., j] = s[..., j] & 63
        mins[..., j] = s[..., j + 4] & 63
        scales[..., j + 4] = (s[..., j + 8] & 0xF) | ((s[..., j] >> 6) << 4)
        mins[..., j + 4] = (s[..., j + 8] >> 4) | ((s[..., j + 4] >> 6) << 4)
    return scales, mins


def repack_q4_Kx8(w):
    """q4_K rows [n, k / 256 * 144] regrouped eight at a time, as weights_open makes them for a
    parameter named "X#q4_Kx8" (runtime-shim/src/gguf.h): [n / 8, k / 256 * 1184]."""
    w = np.asarray(w, np.uint8)
    rows, row_bytes = w.shape
    if rows % 8:
        raise ValueError(f"q4_Kx8 needs a multiple of 8 rows, got {rows}")
    g, sb = rows // 8, row_bytes // 144
    blocks = w.reshape(g, 8, sb, 144).transpose(0, 2, 1, 3)  # [g, b, r, 144]
    d = blocks[..., 0:2].reshape(g, sb, 16)
    dmin = blocks[..., 2:4].reshape(g, sb, 16)
    scales, mins = _q4k_scales_mins(blocks[..., 4:16])  # [g, b, r, 8]
    scales = scales.transpose(0, 1, 3, 2).reshape(g, sb, 64)
    mins = mins.transpose(0, 1, 3, 2).reshape(g, sb, 64)
    values = blocks[..., 16:].reshape(g, sb, 8, 4, 8, 4).transpose(0, 1, 3, 4, 2, 5)  # [g, b, c, j, r, 4]
    out = np.concatenate([d, dmin, scales, mins, values.reshape(g, sb, 1024)], axis=-1)
    return np.ascontiguousarray(out.reshape(g, -1))


def repack_q8_0x8(w):
    """q8_0 rows [n, k / 32 * 34] regrouped eight at a time, as weights_open makes them for a
    parameter named "X#q8_0x8" (runtime-shim/src/gguf.h): [n / 8, k / 32 * 272]."""
    return _regroup_scaled_blocks(w, 34, "q8_0x8")


REGROUPINGS = {
    "#q4_0x8": repack_q4_0x8,
    "#q4_Kx8": repack_q4_Kx8,
    "#q8_0x8": repack_q8_0x8,
}
