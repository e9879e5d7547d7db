#!/usr/bin/env python3
"""The thread pool on TVM's own kernels, relaxc against TVM at 2 threads: a chain of 16 blocks,
each a parallel GEMV (a TIR kernel whose rows are a T.parallel loop: TVMBackendParallelLaunch)
followed by serial work of tens of microseconds (a TIR loop with no parallelism), as in an LLM's
decode step, where parallel projections alternate with small serial kernels. The gaps are where
a pool's workers either keep spinning or go to sleep and must be woken for the next launch.

Each runtime in its own process, interleaved rounds, medians of per-call latency: relaxc
(compiled mode, `relaxc run --bench`) and TVM's VM (from Python, timed around the call).

With --busy, another process keeps one core busy throughout (a shared machine).

usage: python3 bench/pool.py [--relaxc target/release/relaxc] [--rounds 5] [--calls 300] [--threads 2] [--busy]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, BLOCKS, SERIAL = 512, 16, 48


def module():
    from tvm.script import ir as I
    from tvm.script import relax as R
    from tvm.script import tirx as T

    @I.ir_module
    class Chain:
        @T.prim_func
        def gemv(w: T.Buffer((N, N), "float32"), x: T.Buffer((N,), "float32"), y: T.Buffer((N,), "float32")):
            T.func_attr({"tir.noalias": True})
            for i in T.parallel(N):
                y[i] = T.float32(0)
                for k in range(N):
                    y[i] = y[i] + w[i, k] * x[k]

        @T.prim_func
        def serial(x: T.Buffer((N,), "float32"), y: T.Buffer((N,), "float32")):
            T.func_attr({"tir.noalias": True})
            for i in range(N):
                y[i] = x[i] * T.float32(0.5)
                for _r in range(SERIAL):
                    y[i] = y[i] * T.float32(0.999) + T.float32(0.001) * x[i]

    from tvm import relax

    bb = relax.BlockBuilder(Chain)
    x, w = relax.Var("x", R.Tensor((N,), "float32")), relax.Var("w", R.Tensor((N, N), "float32"))
    with bb.function("main", [x, w]):
        y = x
        for _ in range(BLOCKS):
            y = bb.emit(relax.call_tir(Chain.get_global_var("gemv"), (w, y), R.Tensor((N,), "float32")))
            y = bb.emit(relax.call_tir(Chain.get_global_var("serial"), (y,), R.Tensor((N,), "float32")))
        bb.emit_func_output(y)
    return bb.get()


TVM_TIMER = r"""
import sys, time, statistics, numpy as np, tvm
from tvm import relax
ex = tvm.runtime.load_module(sys.argv[1])
vm = relax.VirtualMachine(ex, tvm.cpu())
d = np.load(sys.argv[2])
x, w = tvm.runtime.tensor(d["arg0"]), tvm.runtime.tensor(d["arg1"])
f = vm["main"]
for _ in range(20):
    f(x, w)
times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); f(x, w); times.append(time.perf_counter() - t)
print(statistics.median(times) * 1e6)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relaxc", default=os.path.join(ROOT, "target/release/relaxc"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--busy",
        action="store_true",
        help="time it all while another process keeps one core busy (a loop in a Python process), as on a "
        "shared machine: a pool that waits for a worker whose core is taken waits for the scheduler",
    )
    args = ap.parse_args()
    import numpy as np

    from tvm import relax

    work = tempfile.mkdtemp()
    tar = os.path.join(work, "chain.tar")
    relax.build(module(), target="llvm").export_library(tar)
    so = os.path.join(work, "chain.so")
    subprocess.run([args.relaxc, "compile", tar, "--exec-mode", "compiled", "-o", so], check=True)
    rng = np.random.default_rng(0)
    inputs = os.path.join(work, "in.npz")
    np.savez(
        inputs, arg0=rng.standard_normal(N).astype("float32"), arg1=(rng.standard_normal((N, N)) / N).astype("float32")
    )
    env = dict(os.environ, TVM_NUM_THREADS=str(args.threads))
    times = {"relaxc": [], "TVM": []}
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        measure(args, so, tar, inputs, env, times)
    finally:
        if busy:
            busy.kill()
    r, t = statistics.median(times["relaxc"]), statistics.median(times["TVM"])
    print(
        f"{BLOCKS} x (parallel GEMV {N}x{N} + serial kernel), {args.threads} threads, medians of {args.rounds} rounds of "
        f"{args.calls} calls{', one core kept busy by another process' if args.busy else ''}"
    )
    print("| relaxc (µs) | TVM (µs) | relaxc / TVM |")
    print("|---|---|---|")
    print(f"| {r:.1f} | {t:.1f} | {r / t:.2f}x |")


def measure(args, so, tar, inputs, env, times):
    """Interleaved rounds of both runtimes, each in its own process; medians per call into times."""
    for _ in range(args.rounds):
        out = subprocess.run(
            [args.relaxc, "run", so, "--inputs", inputs, "--bench", str(args.calls)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        value, unit = re.search(r"median ([0-9.]+) (µs|us|ms)", out).groups()
        times["relaxc"].append(float(value) * (1000 if unit == "ms" else 1))
        out = subprocess.run(
            [sys.executable, "-c", TVM_TIMER, tar, inputs, str(args.calls)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        times["TVM"].append(float(out.split()[-1]))


if __name__ == "__main__":
    main()
