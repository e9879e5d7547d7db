#!/usr/bin/env python3
"""Weight-heavy models: the size of relaxc's .so against TVM's .so of the same export, and what
`relaxc compile` takes in time and peak memory, as the weights grow.

For each size it builds an MLP whose weights are bound as constants (layers of D x D float32
matrices; the weights' bytes are the model's size), exports it with TVM 0.27 as m.tar (what
relaxc compiles) and as m.so (TVM's own library), compiles m.tar with relaxc, checks that relaxc
runs it to TVM's result, and reports the sizes and relaxc's compile time and peak RSS (the most
resident memory of the relaxc process, from GNU time).

usage: python3 bench/big_weights.py [MB ...]   (default: 64 256 1024; cargo build --release first)
needs: pip install apache-tvm==0.27.0.post1 numpy
"""

import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELAXC = os.path.join(ROOT, "target/release/relaxc")
D = 2048  # one layer: D*D*4 bytes = 16 MiB


def build(folder, megabytes):
    import tvm
    from tvm import relax

    layers = max(1, megabytes * (1 << 20) // (D * D * 4))
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, D), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(layers):
                w = relax.const((rng.standard_normal((D, D), dtype=np.float32) * (1.0 / D**0.5)).astype("float32"))
                h = bb.emit(relax.op.nn.relu(relax.op.matmul(h, w)))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    ex = relax.build(bb.get(), target="llvm", exec_mode="bytecode")
    ex.export_library(os.path.join(folder, "m.tar"))
    ex.export_library(os.path.join(folder, "m.so"))
    inputs = rng.standard_normal((1, D), dtype=np.float32)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    expected = vm["main"](tvm.runtime.tensor(inputs)).numpy()
    np.savez(os.path.join(folder, "in.npz"), arg0=inputs)
    np.savez(os.path.join(folder, "out.npz"), out0=expected)
    return layers * D * D * 4


def timed_child(args):
    """Runs args under GNU time; (seconds, peak RSS in bytes of that process). Not wait4 from
    here: a child spawned from this (large) Python process inherits its high-water mark."""
    if not os.path.exists("/usr/bin/time"):
        sys.exit("needs GNU time (/usr/bin/time; apt-get install time)")
    start = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "maxrss=%M", *args], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)} failed: {out.stderr}")
    kib = int(out.stderr.strip().splitlines()[-1].split("=")[1])
    return elapsed, kib * 1024


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [64, 256, 1024]
    print("| weights | TVM .so | relaxc .so | ratio | relaxc compile | peak RSS | RSS / weights |")
    print("|---|---|---|---|---|---|---|")
    for mb in sizes:
        with tempfile.TemporaryDirectory() as folder:
            weights = build(folder, mb)
            so = os.path.join(folder, "relaxc.so")
            seconds, peak = timed_child([RELAXC, "compile", os.path.join(folder, "m.tar"), "-o", so])
            subprocess.run(
                [
                    RELAXC,
                    "run",
                    so,
                    "--inputs",
                    os.path.join(folder, "in.npz"),
                    "--expect",
                    os.path.join(folder, "out.npz"),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            tvm_size, ours = os.path.getsize(os.path.join(folder, "m.so")), os.path.getsize(so)
            print(
                f"| {weights / (1 << 20):.0f} MiB | {tvm_size / (1 << 20):.1f} MiB | {ours / (1 << 20):.1f} MiB | "
                f"{ours / tvm_size:.3f}x | {seconds:.2f} s | {peak / (1 << 20):.0f} MiB | {peak / weights:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
