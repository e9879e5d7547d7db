"""TVM 0.27's own RPC client, unchanged, against `relaxc rpc-server` (run by tests/rpc.rs).

usage: tvm_client.py PORT|tracker:PORT FIXTURES_DIR [--exact-tvm] NAME=MODEL.so=EXPECTED.npz ...

With tracker:PORT the session comes from TVM's tracker at that port (key "board"), as
`rpc.connect_tracker(...).request("board")` gives it.

For each model: upload, load_module, tensors on remote.cpu(), main on the fixture's ok_basic
inputs with the results read back (tuples through the remote ffi.ArraySize/ffi.ArrayGetItem),
time_evaluator, a call with a wrong shape (RPCError carrying relaxc's message), and a call after
it. Results must equal EXPECTED.npz (the same .so run locally) bit for bit, and with --exact-tvm
also TVM's recorded outputs. Exits non-zero with the reason on any difference.
"""

import os
import sys

import numpy as np

import tvm
from tvm import rpc


def flatten(remote, value):
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    size = remote.get_function("ffi.ArraySize")(value)
    get_item = remote.get_function("ffi.ArrayGetItem")
    out = []
    for i in range(size):
        out += flatten(remote, get_item(value, i))
    return out


def same(got, want_file, what):
    want = np.load(want_file)
    if len(got) != len(want.files):
        sys.exit(f"{what}: {len(got)} results, expected {len(want.files)}")
    for i, array in enumerate(got):
        expected = want[f"out{i}"]
        if array.dtype != expected.dtype or array.shape != expected.shape or not np.array_equal(array, expected):
            sys.exit(f"{what}: out{i} differs ({array.dtype}{array.shape} vs {expected.dtype}{expected.shape})")


def main():
    where, fixtures = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    exact_tvm = "--exact-tvm" in rest
    models = [a.split("=") for a in rest if a != "--exact-tvm"]
    if where.startswith("tracker:"):
        tracker = rpc.connect_tracker("127.0.0.1", int(where.split(":")[1]))
        remote = tracker.request("board", priority=1, session_timeout=300)
    else:
        remote = rpc.connect("127.0.0.1", int(where), key="", session_timeout=300)
    dev = remote.cpu()
    for name, so, expected in models:
        label = f"{name} ({os.path.basename(so)})"
        remote.upload(so)
        module = remote.load_module(os.path.basename(so))
        inputs = np.load(os.path.join(fixtures, name, "ok_basic.in.npz"))
        args = [tvm.runtime.tensor(inputs[f"arg{i}"], dev) for i in range(len(inputs.files))]
        main_fn = module["main"]
        got = flatten(remote, main_fn(*args))
        same(got, expected, f"{label} against the local run")
        if exact_tvm:
            same(got, os.path.join(fixtures, name, "ok_basic.out.npz"), f"{label} against TVM")
        timing = module.time_evaluator("main", dev, number=3, repeat=2)(*args)
        if not (timing.mean > 0 and all(t > 0 for t in timing.results)):
            sys.exit(f"{label}: time_evaluator gave {timing}")
        first = inputs["arg0"]
        wrong = tvm.runtime.tensor(np.zeros((first.shape[0] + 1,) + first.shape[1:], first.dtype), dev)
        try:
            main_fn(wrong, *args[1:])
            sys.exit(f"{label}: a wrong shape was accepted")
        except tvm.error.RPCError as e:
            text = str(e)
            if "in main at pc" not in text or "match_cast" not in text:
                sys.exit(f"{label}: the RPCError does not carry relaxc's message: {text}")
        same(flatten(remote, main_fn(*args)), expected, f"{label} after an error")
        try:
            module["no_such_function"]
            sys.exit(f"{label}: a missing function was found")
        except AttributeError:
            pass
        print(
            f"{label}: results bit-identical, time_evaluator mean {timing.mean * 1e6:.1f} us, "
            f"wrong shape -> RPCError with relaxc's message, session usable after it"
        )


main()
