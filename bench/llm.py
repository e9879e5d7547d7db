#!/usr/bin/env python3
"""LLM benchmark: the tiny Llama fixture (fixtures/tvm/tiny_llama: 2 layers, hidden 32, vocab 64,
paged KV cache) generating 64 tokens greedily from a 6-token prompt, relaxc against TVM 0.27 on
the very same export, in one run.

relaxc: `relaxc generate --bench RUNS` (bytecode and compiled builds): median over runs of the
        prefill time (embed, begin_forward, prefill, end_forward, logits read back) and of the
        decode loop, timed in-process.
TVM:    the same steps through TVM's VM and its KV cache functions from Python, as a Python
        host drives TVM: median over runs, timed with time.perf_counter around the same spans.
        Python adds its own call overhead to each step; that is TVM's cost as deployed from
        Python (MLC's C++ engine is not part of TVM).

The three are measured in interleaved rounds (relaxc bytecode, relaxc compiled, TVM, again), and
the table gives the median over rounds of each round's medians: these VMs are noisy.

usage: python3 bench/llm.py [--relaxc target/release/relaxc] [--runs 20] [--rounds 5] [--tokens 64]
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
FIXTURE = os.path.join(ROOT, "fixtures/tvm/tiny_llama")
PROMPT = [1, 17, 42, 5, 9, 33]
CACHE = [1, 2048, 256, 16, 0]


def relaxc_run(relaxc, so, runs, tokens):
    out = subprocess.run(
        [
            relaxc,
            "generate",
            so,
            "--prompt",
            ",".join(map(str, PROMPT)),
            "--max-new-tokens",
            str(tokens),
            "--bench",
            str(runs),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    toks = out.splitlines()[0]
    prefill_ms = float(re.search(r"prefill: median ([0-9.]+) ms", out).group(1))
    tps = float(re.search(r"decode: median ([0-9.]+) tokens/s", out).group(1))
    return toks, prefill_ms, tps


def tvm_run(runs, tokens):
    import numpy as np
    import tvm_ffi

    import tvm
    from tvm import relax

    with tempfile.TemporaryDirectory() as work:
        # load_module unpacks the archive next to it: work on a copy.
        tar = os.path.join(work, "m.tar")
        with open(os.path.join(FIXTURE, "m.tar"), "rb") as src, open(tar, "wb") as dst:
            dst.write(src.read())
        vm = relax.VirtualMachine(tvm.runtime.load_module(tar), tvm.cpu())
    g = tvm.get_global_func
    add, begin, end = (
        g("vm.builtin.kv_state_add_sequence"),
        g("vm.builtin.kv_state_begin_forward"),
        g("vm.builtin.kv_state_end_forward"),
    )
    embed, prefill, decode = vm["embed"], vm["prefill"], vm["decode"]
    seq0, one = tvm_ffi.Shape([0]), tvm_ffi.Shape([1])
    prompt_len = tvm_ffi.Shape([len(PROMPT)])
    prompt = tvm.runtime.tensor(np.array(PROMPT, "int32"))

    def once():
        kv = vm["create_paged_kv_cache"](*[tvm_ffi.Shape([v]) for v in CACHE])
        add(kv, 0)
        t = time.perf_counter()
        e = embed(prompt)
        begin(kv, seq0, prompt_len)
        logits, _ = prefill(e._create_view((1, len(PROMPT), e.shape[1])), kv)
        end(kv)
        toks = [int(logits.numpy()[0, 0].argmax())]
        t_prefill = time.perf_counter() - t
        t = time.perf_counter()
        while len(toks) < tokens:
            e = embed(tvm.runtime.tensor(np.array([toks[-1]], "int32")))
            begin(kv, seq0, one)
            logits, _ = decode(e._create_view((1, 1, e.shape[1])), kv)
            end(kv)
            toks.append(int(logits.numpy()[0, 0].argmax()))
        return toks, t_prefill, time.perf_counter() - t

    once()  # warm-up
    results = [once() for _ in range(runs)]
    toks = results[0][0]
    prefill_ms = statistics.median(r[1] for r in results) * 1e3
    tps = (tokens - 1) / statistics.median(r[2] for r in results)
    return "tokens: " + " ".join(map(str, toks)), prefill_ms, tps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relaxc", default=os.path.join(ROOT, "target/release/relaxc"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    try:
        import tvm  # noqa: F401

        have_tvm = True
    except ImportError:
        have_tvm = False
        print("TVM not installed: the TVM row is skipped", file=sys.stderr)
    names = ["relaxc bytecode", "relaxc compiled"] + (["TVM 0.27 (bytecode VM, Python host)"] if have_tvm else [])
    samples = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as work:
        sos = {}
        for mode in ["bytecode", "compiled"]:
            sos[mode] = os.path.join(work, f"tiny_llama.{mode}.so")
            subprocess.run(
                [args.relaxc, "compile", os.path.join(FIXTURE, "m.tar"), "--exec-mode", mode, "-o", sos[mode]],
                check=True,
            )
        for r in range(args.rounds):
            for mode in ["bytecode", "compiled"]:
                samples[f"relaxc {mode}"].append(relaxc_run(args.relaxc, sos[mode], args.runs, args.tokens))
            if have_tvm:
                samples[names[-1]].append(tvm_run(args.runs, args.tokens))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    rows = []
    for n in names:
        s = samples[n]
        rows.append((n, s[0][0], statistics.median(x[1] for x in s), statistics.median(x[2] for x in s)))
    if len({r[1] for r in rows}) != 1:
        print("WARNING: the runtimes generated different tokens", file=sys.stderr)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(
        f"tiny_llama, {len(PROMPT)}-token prompt, {args.tokens} new tokens, medians of {args.rounds} rounds of {args.runs} runs"
    )
    print("| runtime | prefill (ms) | decode (tokens/s) | decode vs TVM |")
    print("|---|---|---|---|")
    tvm_tps = rows[-1][3] if have_tvm else None
    for name, _, prefill_ms, tps in rows:
        ratio = f"{tps / tvm_tps:.2f}x" if tvm_tps else "-"
        print(f"| {name} | {prefill_ms:.3f} | {tps:.0f} | {ratio} |")


if __name__ == "__main__":
    main()
