"""Weights in the layouts relaxc's kernels read (runtime-kernels/src/rk.h).

The GEMM's micro-kernel reads B in panels of 16 columns: ``[ceil(n / 16), k, 16]``, zero past n,
and A in strips of 6 rows: ``[ceil(m / 6), k, 6]``, zero past m.
Weights are constants, so they are packed here once, at build time, and stored packed in the
model: no call pays for packing, and no second copy exists.
"""

import numpy as np

PANEL = 16  # RK_NR in runtime-kernels/src/rk.h
STRIP = 6  # RK_MR


def pack_columns(b: np.ndarray) -> np.ndarray:
    """B [k, n] as [ceil(n / 16), k, 16] float32."""
    k, n = b.shape
    panels = -(-n // PANEL)
    padded = np.zeros((k, panels * PANEL), np.float32)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, PANEL).transpose(1, 0, 2))


def pack_rows(a: np.ndarray) -> np.ndarray:
    """A [m, k] as [ceil(m / 6), k, 6] float32: strips of 6 rows, zero past m."""
    m, k = a.shape
    strips = -(-m // STRIP)
    padded = np.zeros((strips * STRIP, k), np.float32)
    padded[:m] = a
    return np.ascontiguousarray(padded.reshape(strips, STRIP, k).transpose(0, 2, 1))


def pack_conv(w: np.ndarray, groups: int) -> np.ndarray:
    """Convolution weights [oc, c / groups, kh, kw] as the GEMM's A per group:
    [groups, ceil(oc / groups / 6), k, 6], the reduction k = (c / groups) * kh * kw ordered
    (channel, row, column)."""
    rows = _conv_rows(w, groups)
    return np.stack([pack_rows(rows[g]) for g in range(groups)])


def pack_conv_columns(w: np.ndarray, groups: int) -> np.ndarray:
    """Convolution weights [oc, c / groups, kh, kw] as the GEMM's B per group, output channels as
    columns: [groups, ceil(oc / groups / 16), k, 16], for layers with fewer output pixels than
    channels (the kernel then gathers the pixels as rows)."""
    rows = _conv_rows(w, groups)
    return np.stack([pack_columns(np.ascontiguousarray(rows[g].T)) for g in range(groups)])


def _conv_rows(w: np.ndarray, groups: int) -> np.ndarray:
    """Weights [oc, c / groups, kh, kw] as [groups, oc / groups, k], k ordered (channel, row, column)."""
    return w.reshape(groups, w.shape[0] // groups, int(np.prod(w.shape[1:])))


GROUP = 4  # reduction steps per packed group of relaxc.matmul_int8 (runtime-kernels/src/matmul_int8.c)


def pack_int8_columns(c: np.ndarray) -> tuple:
    """An integer matrix c [k, n] (weights less their zero point, each column spanning at most
    255) as relaxc.matmul_int8 reads it: signed bytes b = c - d, d per column, packed
    [ceil(n / 16), ceil(k / 4), 16, 4] (zero past k and n), and [d, column sums of c] as int32
    [2, n]. None when a column spans more than a byte can hold."""
    c = np.asarray(c, np.int64)
    k, n = c.shape
    lo, hi = c.min(axis=0, initial=0), c.max(axis=0, initial=0)
    if np.any(hi - lo > 255):
        return None
    # A column inside [-128, 127] keeps d = 0 (symmetric int8 weights, the usual case).
    d = np.where((lo >= -128) & (hi <= 127), 0, lo + 128)
    b = c - d
    panels, groups = -(-n // PANEL), -(-k // GROUP)
    padded = np.zeros((groups * GROUP, panels * PANEL), np.int8)
    padded[:k, :n] = b
    packed = padded.reshape(groups, GROUP, panels, PANEL).transpose(2, 0, 3, 1)
    comp = np.stack([d, c.sum(axis=0)]).astype(np.int32)
    return np.ascontiguousarray(packed), comp


def pack_recurrent(r: np.ndarray, gates: int) -> np.ndarray:
    """An LSTM's or GRU's recurrent weights R [gates * hidden, hidden] (ONNX's layout, one
    direction) as relaxc.lstm_sequence / gru_sequence read them: per gate, panels of 16 hidden
    units, [gates, ceil(hidden / 16), hidden (k), 16], element [q][p][k][j] = R[q * hidden + 16p + j][k],
    zero past hidden."""
    hidden = r.shape[1]
    panels = -(-hidden // PANEL)
    padded = np.zeros((gates, panels * PANEL, hidden), np.float32)
    padded[:, :hidden] = r.reshape(gates, hidden, hidden)
    return np.ascontiguousarray(padded.reshape(gates, panels, PANEL, hidden).transpose(0, 1, 3, 2))
