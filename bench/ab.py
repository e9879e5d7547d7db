#!/usr/bin/env python3
"""A/B benchmark of two relaxc builds: each compiles chain_1000 in both modes (the model carries
its relaxc's runtime), and B's `relaxc run --bench CALLS` times both (median per call; short calls
are timed in groups, so nanoseconds show), so the host and the clock are the same for A and B;
rounds interleave A and B, and the table gives the median over rounds and B / A. Used to measure
what a runtime change costs (e.g. host allocators against the commit before them).

usage: python3 bench/ab.py A_RELAXC B_RELAXC [--model chain_1000] [--rounds 7] [--calls 20000]
"""

import argparse
import os
import platform
import re
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def per_call_us(relaxc, so, inputs, calls):
    out = subprocess.run(
        [relaxc, "run", so, "--inputs", inputs, "--bench", str(calls)], capture_output=True, text=True, check=True
    )
    m = re.search(r"median ([0-9.]+) (us|µs)", out.stdout + out.stderr)
    if not m:
        raise SystemExit(f"no timing in: {out.stdout}{out.stderr}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--model", default="chain_1000")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    fixture = os.path.join(ROOT, "fixtures/tvm", args.model)
    inputs = os.path.join(fixture, "ok_basic.in.npz")
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        builds = {}
        for name, relaxc in (("A", args.a), ("B", args.b)):
            for mode in ("bytecode", "compiled"):
                so = os.path.join(tmp, f"{name}.{mode}.so")
                subprocess.run(
                    [relaxc, "compile", os.path.join(fixture, "m.tar"), "--exec-mode", mode, "-o", so], check=True
                )
                builds[(name, mode)] = (args.b, so)
        times = {k: [] for k in builds}
        for i in range(args.rounds):
            # Every other round runs B first, so a drift of the host's speed does not favour one side.
            order = list(builds.items())
            for key, (relaxc, so) in order if i % 2 == 0 else order[::-1]:
                times[key].append(per_call_us(relaxc, so, inputs, args.calls))
    print(f"\n{args.model}, per call (us), over {args.rounds} interleaved rounds of {args.calls} calls:\n")
    # A shared VM's runs can be bimodal (the same build at 55 or 100 us per call, by the host's
    # state, not by the build): the fastest round is the steadier estimate of what the code costs.
    print("| mode | A median | B median | B / A | A fastest | B fastest | B / A |")
    print("|---|---|---|---|---|---|---|")
    for mode in ("bytecode", "compiled"):
        a, b = times[("A", mode)], times[("B", mode)]
        am, bm, af, bf = statistics.median(a), statistics.median(b), min(a), min(b)
        print(f"| {mode} | {am:.4f} | {bm:.4f} | {bm / am:.3f}x | {af:.4f} | {bf:.4f} | {bf / af:.3f}x |")


if __name__ == "__main__":
    main()
