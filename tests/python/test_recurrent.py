"""relaxc.lstm_sequence and relaxc.gru_sequence, the recurrence of ONNX's LSTM and GRU over a whole
sequence: against numpy written from ONNX's definition (peepholes, initial states given or not,
reverse, GRU's linear_before_reset, no step at all), the same bits at 1, 2 and 3 threads with
hidden sizes the pool splits (each configuration in a process of its own), and clear errors.

Needs numpy, pytest and apache-tvm-ffi (no TVM); tests/python/test_onnx_command.py builds ONNX
LSTM and GRU layers onto them and compares with onnx's reference evaluator."""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_each_raises, build_kernel_library, unpinned_env
from test_kernels import ROOT, t

sys.path.insert(0, os.path.join(ROOT, "python"))
from relaxc.tvm.pack import pack_recurrent


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def lstm_reference(xw, rt, peep, h0, c0, reverse):
    steps, batch, gates = xw.shape
    hidden = gates // 4
    h = np.zeros((batch, hidden)) if h0 is None else h0.astype(np.float64)
    c = np.zeros((batch, hidden)) if c0 is None else c0.astype(np.float64)
    p = np.zeros((3, hidden)) if peep is None else peep.reshape(3, hidden)
    y = np.zeros((steps, batch, hidden))
    for step in reversed(range(steps)) if reverse else range(steps):
        g = xw[step] + h @ rt
        i, o, f, cand = (g[:, k * hidden : (k + 1) * hidden] for k in range(4))
        i, f = sigmoid(i + p[0] * c), sigmoid(f + p[2] * c)
        c = f * c + i * np.tanh(cand)
        h = sigmoid(o + p[1] * c) * np.tanh(c)
        y[step] = h
    return y, h, c


def gru_reference(xw, rt, rb_h, h0, reverse, linear_before_reset):
    steps, batch, gates = xw.shape
    hidden = gates // 3
    h = np.zeros((batch, hidden)) if h0 is None else h0.astype(np.float64)
    y = np.zeros((steps, batch, hidden))
    for step in reversed(range(steps)) if reverse else range(steps):
        zr = sigmoid(xw[step][:, : 2 * hidden] + h @ rt[:, : 2 * hidden])
        z, r = zr[:, :hidden], zr[:, hidden:]
        if linear_before_reset:
            cand = np.tanh(xw[step][:, 2 * hidden :] + r * (h @ rt[:, 2 * hidden :] + rb_h))
        else:
            cand = np.tanh(xw[step][:, 2 * hidden :] + (r * h) @ rt[:, 2 * hidden :] + rb_h)
        h = (1 - z) * cand + z * h
        y[step] = h
    return y, h


def operands(kind, steps, batch, hidden, seed, states=True, peephole=True):
    rng = np.random.default_rng(seed)
    gates = 4 if kind == "lstm" else 3
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    xw, rt = r(steps, batch, gates * hidden), r(hidden, gates * hidden) * 0.3
    h0 = r(batch, hidden) if states else None
    c0 = r(batch, hidden) if states else None
    return xw, rt, (r(3 * hidden) if peephole else None), h0, c0, r(hidden)


def call_lstm(library, xw, rt, peep, h0, c0, reverse):
    steps, batch, gates = xw.shape
    hidden = gates // 4
    y, h, c = (np.zeros(s, np.float32) for s in [(steps, batch, hidden), (batch, hidden), (batch, hidden)])
    packed = pack_recurrent(np.ascontiguousarray(rt.T), 4)
    library["relaxc.lstm_sequence"](t(xw), t(packed), t(peep), t(h0), t(c0), int(reverse), t(y), t(h), t(c))
    return y, h, c


def call_gru(library, xw, rt, rb_h, h0, reverse, lbr):
    steps, batch, gates = xw.shape
    hidden = gates // 3
    y, h = np.zeros((steps, batch, hidden), np.float32), np.zeros((batch, hidden), np.float32)
    packed = pack_recurrent(np.ascontiguousarray(rt.T), 3)
    library["relaxc.gru_sequence"](t(xw), t(packed), t(rb_h), t(h0), int(reverse), int(lbr), t(y), t(h))
    return y, h


def close(got, want):
    for g, w in zip(got, want):
        assert g.shape == w.shape
        if w.size:
            assert np.abs(g - w).max() <= 2e-5 * max(1.0, np.abs(w).max()), np.abs(g - w).max()


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("states, peephole", [(True, True), (False, False)])
@pytest.mark.parametrize("steps, batch, hidden", [(7, 2, 5), (3, 1, 40), (0, 2, 4)])
def test_lstm_sequence_is_onnxs_lstm(library, reverse, states, peephole, steps, batch, hidden):
    xw, rt, peep, h0, c0, _ = operands("lstm", steps, batch, hidden, 1, states, peephole)
    close(call_lstm(library, xw, rt, peep, h0, c0, reverse), lstm_reference(xw, rt, peep, h0, c0, reverse))


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("states", [True, False])
@pytest.mark.parametrize("steps, batch, hidden", [(6, 3, 5), (4, 1, 33)])
def test_gru_sequence_is_onnxs_gru(library, reverse, lbr, states, steps, batch, hidden):
    xw, rt, _, h0, _, rb_h = operands("gru", steps, batch, hidden, 2, states)
    close(call_gru(library, xw, rt, rb_h, h0, reverse, lbr), gru_reference(xw, rt, rb_h, h0, reverse, lbr))


THREAD_SCRIPT = r"""
import sys, numpy as np, tvm_ffi
sys.path.insert(0, sys.argv[3]); sys.path.insert(0, sys.argv[4])
from test_recurrent import operands, call_lstm, call_gru
path, out = sys.argv[1], sys.argv[2]
names = dict(l.split("\t") for l in open(path + ".tsv").read().splitlines())
m = tvm_ffi.load_module(path)
library = {n: m[e] for n, e in names.items()}
res = {}
xw, rt, peep, h0, c0, _ = operands("lstm", 9, 2, 256, 3)
res["lstm"] = np.concatenate([a.ravel() for a in call_lstm(library, xw, rt, peep, h0, c0, False)])
xw, rt, _, h0, _, rb_h = operands("gru", 9, 2, 300, 4)
for lbr in (0, 1):
    res[f"gru{lbr}"] = np.concatenate([a.ravel() for a in call_gru(library, xw, rt, rb_h, h0, True, lbr)])
np.savez(out, **res)
"""


def test_the_same_bits_at_any_thread_count(tmp_path):
    """Hidden sizes whose steps are split between threads (a barrier between steps)."""
    path = str(tmp_path / "lib.so")
    build_kernel_library(path)
    script = tmp_path / "threads.py"
    script.write_text(THREAD_SCRIPT)
    results = {}
    for threads in (1, 2, 3):
        out = str(tmp_path / f"{threads}.npz")
        env = unpinned_env(TVM_NUM_THREADS=str(threads))
        done = subprocess.run(
            [
                sys.executable,
                str(script),
                path,
                out,
                os.path.dirname(os.path.abspath(__file__)),
                os.path.join(ROOT, "python"),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        results[threads] = dict(np.load(out))
    for threads in (2, 3):
        for name, value in results[1].items():
            assert np.array_equal(results[threads][name], value), f"{name} at {threads} threads"


def test_bad_arguments_are_clear_errors(library):
    xw, rt, peep, h0, c0, rb_h = operands("lstm", 3, 2, 4, 5)
    rt = pack_recurrent(np.ascontiguousarray(rt.T), 4)
    y, h, c = np.zeros((3, 2, 4), np.float32), np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32)
    lstm, gru = library["relaxc.lstm_sequence"], library["relaxc.gru_sequence"]
    gru_xw, gru_rt = xw[:, :, :12], pack_recurrent(np.zeros((12, 4), np.float32), 3)
    assert_each_raises(
        [
            (lambda: lstm(t(xw), t(rt[:3]), None, None, None, 0, t(y), t(h), t(c)), ValueError, "rt must be"),
            (lambda: lstm(t(xw[:, :, :7]), t(rt), None, None, None, 0, t(y), t(h), t(c)), ValueError, "xw must be"),
            (lambda: lstm(t(xw), t(rt), t(peep[:5]), None, None, 0, t(y), t(h), t(c)), ValueError, "peephole"),
            (lambda: lstm(t(xw), t(rt), None, t(h0[:1]), None, 0, t(y), t(h), t(c)), ValueError, "h0 must be"),
            (lambda: lstm(t(xw), t(rt), None, None, None, 0, t(y[:2]), t(h), t(c)), ValueError, "y must be"),
            (lambda: lstm(t(xw), t(rt), None, None, None, "no", t(y), t(h), t(c)), TypeError, "reverse"),
            (lambda: lstm(t(xw), t(rt), None, None, None, 0, t(y), t(h)), TypeError, "expects 9 arguments"),
            (lambda: gru(t(gru_xw), t(gru_rt), t(rb_h[:3]), None, 0, 0, t(y), t(h)), ValueError, "rb_h"),
        ]
    )
