#!/usr/bin/env python3
"""Instrumentation cost: chain_1000 (1000 tiny kernel calls) per-call time built without and with
`--instrument` (the hook left unset), in both modes, in one run.

Each configuration is compiled once; rounds are interleaved (plain, instrumented, again) and
each reports `relaxc run --bench CALLS` (the median of in-process timed calls); the table gives
the median over rounds. An instrumented model sends every Call through the shim's
rvm_instrumented_call, which checks for a hook; a plain model's compiled code has no trace of
instrumentation (and its interpreter loop is a separate copy without the check).

usage: python3 bench/instrument.py [--relaxc target/release/relaxc] [--rounds 7] [--calls 3000]
"""

import argparse
import os
import platform
import re
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relaxc", default=os.path.join(ROOT, "target/release/relaxc"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args()
    folder = os.path.join(ROOT, "fixtures/tvm/chain_1000")
    tar, inputs = os.path.join(folder, "m.tar"), os.path.join(folder, "ok_basic.in.npz")
    configs = [(mode, inst) for mode in ["bytecode", "compiled"] for inst in [False, True]]
    times = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as work:
        sos = {}
        for mode, inst in configs:
            so = os.path.join(work, f"chain_1000.{mode}.{int(inst)}.so")
            cmd = [args.relaxc, "compile", tar, "--exec-mode", mode, "-o", so] + (["--instrument"] if inst else [])
            subprocess.run(cmd, check=True)
            sos[(mode, inst)] = so
        for _ in range(args.rounds):
            for c in configs:
                out = subprocess.run(
                    [args.relaxc, "run", sos[c], "--inputs", inputs, "--bench", str(args.calls)],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                times[c].append(float(re.search(r"median ([0-9.]+) us", out).group(1)))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"chain_1000, medians of {args.rounds} interleaved rounds of {args.calls} calls")
    print("| mode | plain (us) | --instrument, no hook (us) | instrumented / plain |")
    print("|---|---|---|---|")
    for mode in ["bytecode", "compiled"]:
        plain, inst = statistics.median(times[(mode, False)]), statistics.median(times[(mode, True)])
        print(f"| {mode} | {plain:.2f} | {inst:.2f} | {inst / plain:.2f}x |")


if __name__ == "__main__":
    main()
