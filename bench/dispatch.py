#!/usr/bin/env python3
"""Dispatch benchmark: per-call latency of the chain_N fixtures (N tiny adds on 1-element
tensors, one shared kernel), relaxc against TVM 0.27's VM on the very same .tar, in one run.

relaxc: `relaxc run --bench CALLS` times each call in-process and reports the median.
TVM:    vm.time_evaluator("main", number=200, repeat=25), median of the repeats. TVM bytecode
        runs the fixture's .tar; TVM compiled rebuilds the same module with exec_mode="compiled"
        (the fixture generator's chain(N), same kernel), timing the LLVM build too.
Also reports relaxc's compile+link time per model (median of 5 runs).

usage: python3 bench/dispatch.py [--relaxc target/release/relaxc] [--modes bytecode,compiled]
TVM columns appear when `import tvm` works (pip install apache-tvm==0.27.0.post1).
"""
import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAINS = [1, 10, 100, 1000]


def relaxc_bench(relaxc, tar, inputs, mode, calls, workdir):
    so = os.path.join(workdir, f"{os.path.basename(os.path.dirname(tar))}.{mode}.so")
    times = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([relaxc, "compile", tar, "--exec-mode", mode, "-o", so], check=True)
        times.append(time.perf_counter() - t)
    out = subprocess.run(
        [relaxc, "run", so, "--inputs", inputs, "--bench", str(calls)], check=True, capture_output=True, text=True
    ).stdout
    us = float(re.search(r"median ([0-9.]+) us", out).group(1))
    return us, statistics.median(times) * 1e3


def tvm_bench(tar, inputs, exec_mode, n):
    """Median per-call microseconds, and the build time in seconds (compiled mode only)."""
    import numpy as np
    import tvm
    from tvm import relax

    build_s = None
    if exec_mode == "bytecode":
        mod = tvm.runtime.load_module(tar)
    else:
        sys.path.insert(0, os.path.join(ROOT, "fixtures/tvm"))
        import generate

        module, _, _ = generate.chain(n)
        t = time.perf_counter()
        mod = relax.build(module, target="llvm", exec_mode="compiled")
        build_s = time.perf_counter() - t
    vm = relax.VirtualMachine(mod, tvm.cpu())
    args = [tvm.runtime.tensor(v) for _, v in sorted(np.load(inputs).items())]
    te = vm.time_evaluator("main", tvm.cpu(), number=200, repeat=25)
    return te(*args).median * 1e6, build_s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relaxc", default=os.path.join(ROOT, "target/release/relaxc"))
    ap.add_argument("--modes", default="bytecode,compiled")
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    modes = args.modes.split(",")
    try:
        import tvm  # noqa: F401

        have_tvm = True
    except ImportError:
        have_tvm = False
        print("TVM not installed: TVM columns skipped", file=sys.stderr)

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    header = ["model"]
    if have_tvm:
        header += ["TVM bytecode (us)", "TVM compiled (us)"]
    for m in modes:
        header += [f"relaxc {m} (us)", f"relaxc {m} ns/op"]
        if have_tvm:
            header.append(f"relaxc {m} / TVM {m}")
    if "bytecode" in modes and "compiled" in modes:
        header.append("relaxc compiled / relaxc bytecode")
    header += [f"relaxc compile+link {m} (ms)" for m in modes]
    if have_tvm:
        header.append("TVM compiled build (s)")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    with tempfile.TemporaryDirectory() as work:
        for n in CHAINS:
            folder = os.path.join(ROOT, "fixtures/tvm", f"chain_{n}")
            tar, inputs = os.path.join(folder, "m.tar"), os.path.join(folder, "ok_basic.in.npz")
            row = [f"chain_{n}"]
            tvm_us, tvm_build = {}, None
            if have_tvm:
                tvm_us["bytecode"], _ = tvm_bench(tar, inputs, "bytecode", n)
                tvm_us["compiled"], tvm_build = tvm_bench(tar, inputs, "compiled", n)
                row += [f"{tvm_us['bytecode']:.2f}", f"{tvm_us['compiled']:.2f}"]
            builds, ours = [], {}
            for m in modes:
                us, ms = relaxc_bench(args.relaxc, tar, inputs, m, args.calls, work)
                ours[m] = us
                row += [f"{us:.2f}", f"{us * 1e3 / n:.0f}"]
                if have_tvm:
                    row.append(f"{us / tvm_us[m]:.2f}x")
                builds.append(f"{ms:.1f}")
            if "bytecode" in ours and "compiled" in ours:
                row.append(f"{ours['compiled'] / ours['bytecode']:.2f}x")
            row += builds
            if have_tvm:
                row.append(f"{tvm_build:.1f}")
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
