#!/usr/bin/env python3
"""relaxc.matmul_int8 alone: billions of multiply-adds a second (GMAC/s) at 1 thread on the shapes
of a MiniLM layer at 128 tokens, on each instruction-set path this CPU has (RELAXC_QUANT_ISA picks
a lesser one), each path in a process of its own (the path is chosen once per process).

usage: python3 bench/matmul_int8.py [--calls 200]
"""

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = [(128, 384, 384), (128, 384, 1536), (128, 1536, 384), (1, 384, 1536)]

TIMER = r"""
import sys, time, numpy as np, tvm_ffi
sys.path.insert(0, sys.argv[2])
from relaxc.tvm.pack import pack_int8_columns
path, calls = sys.argv[1], int(sys.argv[3])
names = dict(l.split("\t") for l in open(path + ".tsv").read().splitlines())
f = tvm_ffi.load_module(path)[names["relaxc.matmul_int8"]]
t = lambda a: tvm_ffi.from_dlpack(np.ascontiguousarray(a))
rng = np.random.default_rng(0)
for m, k, n in eval(sys.argv[4]):
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    packed, comp = pack_int8_columns(w.astype(np.int64))
    out = np.zeros((m, n), np.int32)
    args = [t(a), t(packed), t(comp), t(np.array(3, np.uint8)), None, None, t(out)]
    f(*args)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        f(*args)
        times.append(time.perf_counter() - start)
    median = float(np.median(times))
    print(f"  {m}x{k}x{n}: {median * 1e6:.1f} us, {m * k * n / median / 1e9:.1f} GMAC/s")
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--relaxc", default=os.path.join(ROOT, "target", "release", "relaxc"))
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import report

    print(report.machine())
    with tempfile.TemporaryDirectory() as tmp:
        lib = os.path.join(tmp, "lib.so")
        names = subprocess.run([args.relaxc, "kernel-library", "-o", lib], check=True, capture_output=True, text=True)
        with open(lib + ".tsv", "w") as table:
            table.write(names.stdout)
        flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
        paths = [("portable", "portable")]
        if os.uname().machine == "x86_64":
            paths.append(("AVX2", "avx2"))
            if "avx512_vnni" in flags:
                paths.append(("AVX-512 VNNI", None))
        for name, isa in paths:
            env = {k: v for k, v in os.environ.items() if k not in ("RELAXC_QUANT_ISA", "RELAXC_GEMM_AVX512")}
            env["TVM_NUM_THREADS"] = "1"
            if isa:
                env["RELAXC_QUANT_ISA"] = isa
            print(f"{name}, 1 thread:", flush=True)
            command = [sys.executable, "-c", TIMER, lib, os.path.join(ROOT, "python"), str(args.calls), repr(SHAPES)]
            subprocess.run(command, check=True, env=env)


if __name__ == "__main__":
    main()
