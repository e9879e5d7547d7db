#!/usr/bin/env python3
"""Parallel kernel benchmark: the parallel_matmul fixture (a 128x128 matmul whose outer loop is
T.parallel, so the kernel calls TVMBackendParallelLaunch), relaxc at 1 and 2 threads against
TVM 0.27 at 2 threads, on the very same .tar, in one run.

Each configuration runs in its own process, because both runtimes size their pool once from
TVM_NUM_THREADS. Rounds are interleaved (relaxc 1 thread, relaxc 2 threads, TVM 2 threads, then
again) and each reports the median of its calls; the table gives the median over rounds.

relaxc: `relaxc run --bench CALLS` (median per call, timed in-process around the call).
TVM:    vm.time_evaluator("main", number=20, repeat=CALLS/20), median of the repeats.

usage: python3 bench/parallel.py [--relaxc target/release/relaxc] [--rounds 5] [--calls 400]
TVM's column appears when `import tvm` works (pip install apache-tvm==0.27.0.post1).
"""

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "fixtures/tvm/parallel_matmul")

TVM_SCRIPT = """
import sys, numpy as np, tvm
from tvm import relax
mod = tvm.runtime.load_module(sys.argv[1])
vm = relax.VirtualMachine(mod, tvm.cpu())
args = [tvm.runtime.tensor(v) for _, v in sorted(np.load(sys.argv[2]).items())]
calls = int(sys.argv[3])
te = vm.time_evaluator("main", tvm.cpu(), number=20, repeat=max(1, calls // 20))
print(te(*args).median * 1e6)
"""


def env_with_threads(n):
    env = dict(os.environ)
    env["TVM_NUM_THREADS"] = str(n)
    env.pop("OMP_NUM_THREADS", None)
    return env


def relaxc_us(relaxc, so, inputs, threads, calls):
    out = subprocess.run(
        [relaxc, "run", so, "--inputs", inputs, "--bench", str(calls)],
        check=True,
        capture_output=True,
        text=True,
        env=env_with_threads(threads),
    ).stdout
    return float(re.search(r"median ([0-9.]+) us", out).group(1))


def tvm_us(tar, inputs, threads, calls):
    out = subprocess.run(
        [sys.executable, "-c", TVM_SCRIPT, tar, inputs, str(calls)],
        check=True,
        capture_output=True,
        text=True,
        env=env_with_threads(threads),
    ).stdout
    return float(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relaxc", default=os.path.join(ROOT, "target/release/relaxc"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--mode", default="compiled", choices=["bytecode", "compiled"])
    args = ap.parse_args()
    try:
        import tvm  # noqa: F401

        have_tvm = True
    except ImportError:
        have_tvm = False
        print("TVM not installed: the TVM column is skipped", file=sys.stderr)
    tar, inputs = os.path.join(FIXTURE, "m.tar"), os.path.join(FIXTURE, "ok_basic.in.npz")
    results = {"relaxc1": [], "relaxc2": [], "tvm2": []}
    with tempfile.TemporaryDirectory() as work:
        so = os.path.join(work, "parallel_matmul.so")
        subprocess.run([args.relaxc, "compile", tar, "--exec-mode", args.mode, "-o", so], check=True)
        for r in range(args.rounds):
            results["relaxc1"].append(relaxc_us(args.relaxc, so, inputs, 1, args.calls))
            results["relaxc2"].append(relaxc_us(args.relaxc, so, inputs, 2, args.calls))
            if have_tvm:
                results["tvm2"].append(tvm_us(tar, inputs, 2, args.calls))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in results.items() if v}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(
        f"parallel_matmul (128x128, T.parallel), relaxc {args.mode} mode, medians of {args.rounds} interleaved rounds"
    )
    header = ["relaxc 1 thread (us)", "relaxc 2 threads (us)", "relaxc 2 / relaxc 1"]
    row = [f"{med['relaxc1']:.1f}", f"{med['relaxc2']:.1f}", f"{med['relaxc2'] / med['relaxc1']:.2f}x"]
    if have_tvm:
        header += ["TVM 2 threads (us)", "relaxc 2 / TVM 2"]
        row += [f"{med['tvm2']:.1f}", f"{med['relaxc2'] / med['tvm2']:.2f}x"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
