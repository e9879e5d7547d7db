#!/usr/bin/env python3
"""TVM's side of the chain benchmark (benches/chain.rs runs it; it needs TVM 0.27 installed).

Builds chain_N for each N given (fixtures/tvm/generate.py's chain, the same kernel as the
fixtures) with TVM's bytecode VM, and with its compiled mode for N <= --compiled-max, and prints
one JSON line with the build times: relax.build plus export_library to a .so, which is what it
takes TVM to make a library to deploy (as relaxc's compile+link does). Then, for every line read from stdin, it times every model
once (vm.time_evaluator, `--number` calls per repeat, 5 repeats, median) and prints one JSON
line of microseconds per call, so the caller can interleave TVM's rounds with its own.

usage: python3 bench/tvm_chain.py N [N ...] [--compiled-max 1000] [--number 200]
"""

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sizes", type=int, nargs="+")
    ap.add_argument("--compiled-max", type=int, default=1000)
    ap.add_argument("--number", type=int, default=200)
    args = ap.parse_args()

    import numpy as np

    import tvm
    from tvm import relax

    sys.path.insert(0, os.path.join(ROOT, "fixtures", "tvm"))
    import generate

    x = tvm.runtime.tensor(np.array([0.5], dtype="float32"))
    models, builds = {}, {}
    work = tempfile.mkdtemp()
    for n in args.sizes:
        module, _, _ = generate.chain(n)
        modes = ["bytecode"] + (["compiled"] if n <= args.compiled_max else [])
        for mode in modes:
            t = time.perf_counter()
            ex = relax.build(module, target="llvm", exec_mode=mode)
            ex.export_library(os.path.join(work, f"chain_{n}.{mode}.so"))
            builds[f"{mode}/{n}"] = time.perf_counter() - t
            vm = relax.VirtualMachine(ex, tvm.cpu())
            models[f"{mode}/{n}"] = vm.time_evaluator("main", tvm.cpu(), number=args.number, repeat=5)
    print(json.dumps({"build_s": builds}), flush=True)
    for _ in sys.stdin:
        print(json.dumps({"us": {k: te(x).median * 1e6 for k, te in models.items()}}), flush=True)


if __name__ == "__main__":
    main()
