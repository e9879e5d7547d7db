#!/usr/bin/env python3
"""The mid-size Llama (fixtures/tvm/llm.py at vocab 32000, hidden 1024, 8 layers: 156 M float32
parameters, seeded random weights, nothing committed) with its weights bound into the library and
with its weights outside it (TVM's tensor cache), relaxc against TVM 0.27's default build, side
by side:

  compile     relaxc compile of TVM's export: seconds and peak RSS (GNU time), .so size
              beside TVM's own .so of the same export
  load        loading the library in this process and making it ready to run (tvm_ffi for
              relaxc, its module opened by a first call, with relaxc_weights for external
              weights; tvm.runtime.load_module and a VirtualMachine for TVM, with the weights
              loaded from the same tensor cache)

Both run TVM's default CPU kernels (the export is TVM's relax.build): the speed columns compare
runtimes on the same untuned kernels, which are slow at this size; bench/llm_midsize.py measures
relaxc with its kernel library.
  first token prefill of a 6-token prompt (median of --runs)
  decode      tokens/s over --tokens greedy steps (median of --runs)

relaxc's timings come from `relaxc generate --bench` (in-process, around the calls); TVM's from
its VirtualMachine driven the way fixtures/tvm/llm.py drives it. Both produce the same tokens
(checked). One thread each (TVM_NUM_THREADS=1).

usage: python3 bench/big_llm.py [--work /tmp/relaxc-big-llm] [--tokens 32] [--runs 5]
needs: pip install apache-tvm==0.27.0.post1 numpy; GNU time; cargo build --release
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_midsize import llm_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELAXC = os.path.join(ROOT, "target/release/relaxc")
PROMPT = [1, 17, 42, 5, 9, 33]
MID = dict(vocab=32000, hidden=1024, layers=8, heads=16, kv_heads=4, head_dim=64, ffn=2816)
SEED = 20261124


def mib(n):
    return n / (1 << 20)


def timed(args):
    """(seconds, peak RSS bytes) of a command, under GNU time (see bench/big_weights.py)."""
    start = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "maxrss=%M", *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)} failed: {out.stderr}")
    return time.perf_counter() - start, int(out.stderr.strip().splitlines()[-1].split("=")[1]) * 1024


def build(work):
    """Exports (bound and external), TVM's .so of each, the tensor cache; cached in work."""
    from tvm.contrib import tvmjs

    from tvm import relax

    llm = llm_module()
    shape = llm.Shape(**MID)
    mod, values = llm.export_with_weights(shape, SEED)
    names = list(values)
    if not os.path.exists(os.path.join(work, "external.tar")):
        ex = relax.build(mod, target="llvm", exec_mode="bytecode")
        ex.export_library(os.path.join(work, "external.tar"))
        ex.export_library(os.path.join(work, "external_tvm.so"))
        tvmjs.dump_tensor_cache(values, os.path.join(work, "tensor-cache"), encode_format="raw")
    if not os.path.exists(os.path.join(work, "bound.tar")):
        bound = mod
        for fn in ["embed", "prefill", "decode"]:
            bound = relax.transform.BindParams(fn, values)(bound)
        ex = relax.build(bound, target="llvm", exec_mode="bytecode")
        ex.export_library(os.path.join(work, "bound.tar"))
        ex.export_library(os.path.join(work, "bound_tvm.so"))
    return llm, shape, names


def relaxc_generate(so, tokens, runs, weights):
    cmd = [
        RELAXC,
        "generate",
        so,
        "--prompt",
        ",".join(map(str, PROMPT)),
        "--max-new-tokens",
        str(tokens),
        "--bench",
        str(runs),
    ]
    if weights:
        cmd += ["--weights", weights]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    toks = [int(t) for t in re.search(r"tokens: ([\d ]+)", out).group(1).split()]
    prefill = float(re.search(r"prefill: median ([\d.]+) ms", out).group(1))
    decode = float(re.search(r"decode: median ([\d.]+) tokens/s", out).group(1))
    return toks, prefill, decode


def relaxc_load(so, weights):
    import tvm_ffi

    start = time.perf_counter()
    m = tvm_ffi.load_module(so)
    if weights:
        for fn, n in [("embed", 1), ("prefill", 2), ("decode", 2)]:
            m["relaxc_weights"](weights, fn, n)
    # The module opens at the first call (tvm-ffi loads lazily): make one, as TVM's VM is made.
    m["create_paged_kv_cache"](*[tvm_ffi.Shape([v]) for v in [4, 2048, 256, 16, 0]])
    return time.perf_counter() - start


def tvm_run(llm, path, weights, tokens, runs, shape):
    """TVM: load time, then greedy generation timed: (load s, tokens, prefill ms, decode tok/s)."""
    import tvm_ffi
    from tvm.contrib import tvmjs

    import tvm
    from tvm import relax

    start = time.perf_counter()
    ex = tvm.runtime.load_module(path)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    extra = []
    if weights:
        params, _ = tvmjs.load_tensor_cache(weights, tvm.cpu())
        extra = [params[n] for n in weights_names]
    load = time.perf_counter() - start
    g = tvm.get_global_func
    begin, end, add, remove = (
        g("vm.builtin." + f)
        for f in ["kv_state_begin_forward", "kv_state_end_forward", "kv_state_add_sequence", "kv_state_remove_sequence"]
    )
    sizes = [4, 2048, 256, 16]
    kv = vm["create_paged_kv_cache"](*[tvm_ffi.Shape([v]) for v in sizes], tvm_ffi.Shape([0]))

    def forward(fn, ids, rows, cols):
        embeds = (
            vm["embed"](tvm.runtime.tensor(np.array(ids, "int32")), *extra).numpy().reshape(rows, cols, shape.hidden)
        )
        begin(kv, tvm_ffi.Shape([0]), tvm_ffi.Shape([len(ids)]))
        out, _ = vm[fn](tvm.runtime.tensor(embeds), kv, *extra)
        end(kv)
        return out.numpy()[0, 0]

    prefills, decodes, toks = [], [], []
    for _ in range(runs + 1):
        add(kv, 0)
        t = time.perf_counter()
        toks = [int(forward("prefill", PROMPT, 1, len(PROMPT)).argmax())]
        prefills.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        while len(toks) < tokens:
            toks.append(int(forward("decode", [toks[-1]], 1, 1).argmax()))
        decodes.append((tokens - 1) / (time.perf_counter() - t))
        remove(kv, 0)
    return load, toks, statistics.median(prefills[1:]), statistics.median(decodes[1:])


weights_names = []


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/relaxc-big-llm")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    llm, shape, names = build(a.work)
    weights_names.extend(names)
    cache = os.path.join(a.work, "tensor-cache")
    weight_bytes = sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache) if f.endswith(".bin"))
    print(f"mid-size Llama: {weight_bytes / 1e6:.0f} MB of float32 weights; 1 thread; medians of {a.runs}")
    print("| weights | who | compile | peak RSS | .so | load | first token | decode |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in ["bound", "external"]:
        tar, tvm_so = os.path.join(a.work, f"{kind}.tar"), os.path.join(a.work, f"{kind}_tvm.so")
        so = os.path.join(a.work, f"{kind}_relaxc.so")
        seconds, peak = timed([RELAXC, "compile", tar, "--exec-mode", "compiled", "-o", so])
        weights = cache if kind == "external" else None
        load = relaxc_load(so, weights)
        toks, prefill, decode = relaxc_generate(so, a.tokens, a.runs, weights)
        tload, ttoks, tprefill, tdecode = tvm_run(llm, tvm_so, weights, a.tokens, a.runs, shape)
        if toks != ttoks:
            sys.exit(f"{kind}: relaxc's tokens {toks} differ from TVM's {ttoks}")
        where = "in the .so" if kind == "bound" else "tensor cache"
        print(
            f"| {where} | relaxc | {seconds:.1f} s | {mib(peak):.0f} MiB | {mib(os.path.getsize(so)):.0f} MiB | "
            f"{load * 1e3:.0f} ms | {prefill:.1f} ms | {decode:.1f} tok/s |"
        )
        print(
            f"| {where} | TVM | (TVM's build) | | {mib(os.path.getsize(tvm_so)):.0f} MiB | {tload * 1e3:.0f} ms | "
            f"{tprefill:.1f} ms | {tdecode:.1f} tok/s |",
            flush=True,
        )


if __name__ == "__main__":
    main()
