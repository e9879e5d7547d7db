#!/usr/bin/env python3
"""Quantized LLMs from GGUF: relaxc against llama.cpp on the very same files.

The mid-size Llama of bench/llm_midsize.py (vocab 32000, hidden 1024, 8 layers, GQA 16/4, FFN 2816;
156 M parameters, seeded random weights) is written as an f32 GGUF file and quantized with
llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize) into f16, q8_0, q4_0 and
Q4_K_M (q4_K with q6_K). Each file is built by `python -m relaxc.llm build` (compiled mode) and run
by `relaxc generate --weights FILE.gguf`; llama.cpp runs the same file. `--size 1b` takes
TinyLlama 1.1B's shape instead (hidden 2048, 22 layers, GQA 32/4, FFN 5632; a 4.4 GB f32 file,
some minutes to write and quantize, cached in --work).

Before timing, per file: the first prefill's logits must have llama.cpp's argmax and agree with
llama.cpp's, its KV cache kept in f32 as relaxc keeps it (llama.cpp's default f16 cache alone
moves f32 logits by 6e-4): within 1e-3 of the largest logit for f32 and f16, and 2e-2 for the
quantized formats, or within how far llama.cpp moves its own logits when only the order of its
arithmetic changes (flash attention on, weights not repacked), and what float32 rounding noise
does to an int8-activation reference (see check_logits: on this random-weight model one activation
rounded the other way moves the logits by about 2e-2, so two correct runtimes can be that far
apart; llama.cpp's flash attention alone moves its q8_0 logits by 2.9e-2 and changes its argmax). Then,
interleaved, at 1 and 2 threads: prefill of a 6-token prompt and decode tokens/s, then the same
after a 500-token prompt (--long-prompt; attention's share grows with the context); medians.
Also: file sizes, relaxc's load time and its resident set after loading the weights.

Needs TVM 0.27, llama-cpp-python, gguf and numpy. Builds are cached in --work.

usage: python3 bench/llm_gguf.py [--size mid|1b] [--formats f32,f16,q8_0,q4_0,q4_k_m] [--tokens 32]
                                 [--rounds 3] [--long-prompt 500] [--publish]

--publish writes the run into the book (docs/src/benchmarks/llm-gguf.md, or llm-gguf-1b.md for
--size 1b: the tables, a plot of decode speed against llama.cpp's, the JSON; bench/report.py).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "python"))

import llm_midsize

sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

FTYPES = {
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
}
TOLERANCE = {"f32": 1e-3, "f16": 1e-3}


def f32_file(work, size):
    path = os.path.join(work, "llama-f32.gguf")
    if not os.path.exists(path):
        print(f"writing the {size} Llama's seeded weights as {path}...", flush=True)
        llm = llm_midsize.llm_module()
        shape = llm.Shape(**llm_midsize.SIZES[size])
        _, values = llm.export_with_weights(shape, llm_midsize.SEED)
        llm_midsize.write_gguf(path, {k: v.numpy() for k, v in values.items()}, shape)
    return path


def quantized_file(work, size, fmt):
    if fmt == "f32":
        return f32_file(work, size)
    path = os.path.join(work, f"llama-{fmt}.gguf")
    if not os.path.exists(path):
        print(f"quantizing to {fmt} with llama.cpp's quantizer...", flush=True)
        llm_midsize.quantize_gguf(f32_file(work, size), path, FTYPES[fmt])
    return path


def build(work, relaxc, gguf_path):
    so = gguf_path[: -len(".gguf")] + ".so"
    # A model carries its relaxc's runtime and kernels: one built by an older relaxc is rebuilt.
    if not os.path.exists(so) or os.path.getmtime(so) < os.path.getmtime(relaxc):
        t = time.time()
        env = dict(os.environ, RELAXC=relaxc, PYTHONPATH=os.path.join(ROOT, "python"))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "relaxc.llm",
                "build",
                gguf_path,
                "-o",
                so,
                "--exec-mode",
                "compiled",
            ],
            check=True,
            env=env,
        )
        print(f"built {os.path.basename(so)} in {time.time() - t:.0f} s", flush=True)
    return so


def relaxc_run(relaxc, so, gguf_path, threads, tokens, runs, logits=None, prompt=None, context=512):
    """relaxc's greedy tokens, prefill ms and decode tokens/s on the file (prompt: PROMPT unless
    given; prefill in chunks of up to 512 tokens, as llama.cpp's micro-batches)."""
    prompt = llm_midsize.PROMPT if prompt is None else prompt
    cmd = [
        relaxc,
        "generate",
        so,
        "--weights",
        gguf_path,
        "--prompt",
        ",".join(map(str, prompt)),
        "--max-new-tokens",
        str(tokens),
        "--max-total-seq-len",
        str(context),
        "--prefill-chunk-size",
        str(min(512, context)),
    ]
    if runs:
        cmd += ["--bench", str(runs)]
    if logits:
        cmd += ["--logits", logits]
    env = dict(os.environ, TVM_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    new = [int(t) for t in out.splitlines()[0].split(":")[1].split()]
    import re

    prefill = float(re.search(r"prefill: (?:median )?([0-9.]+) ms", out).group(1))
    tps = float(re.search(r"decode: (?:median )?([0-9.]+) tokens/s", out).group(1))
    return new, prefill, tps


LOAD = r"""
import sys, time, tvm_ffi
so, weights = sys.argv[1], sys.argv[2]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
t = time.perf_counter()
m = tvm_ffi.load_module(so)
before = rss()
w = m["relaxc_weights"](weights, "decode", 2)
print(time.perf_counter() - t, rss() - before)
"""


def load_cost(so, gguf_path):
    out = subprocess.run(
        [sys.executable, "-c", LOAD, so, gguf_path],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    seconds, grown = out.split()
    return float(seconds), int(grown)


def check_logits(fmt, gguf_path, ours, theirs, work, seeds=6):
    """Whether relaxc's first logits (ours) are llama.cpp's (theirs, its KV cache in f32 as
    relaxc's): within the format's tolerance of the largest logit, with the same argmax.

    Where a format rounds activations to int8 that may not be reachable: a float32 rounding's
    worth of difference before the rounding moves a value across a rounding boundary, and one such
    value moves these logits by up to about 2e-2. So, for the quantized formats, two floors are
    measured beside the check:
    - llama.cpp against itself: its logits with flash attention on, and with its weights not
      repacked, two switches that change only the order of its float arithmetic;
    - the numpy reference with int8 activations, perturbed by 1e-7 relative at several seeds.
    relaxc is accepted within the larger floor, and with a different argmax only where llama.cpp's
    own switches change its argmax or the two largest logits are closer than the floor."""
    from test_gguf import reference_first_logits

    scale = np.abs(theirs).max()
    diff = float(np.abs(ours - theirs).max() / scale)
    top = np.sort(theirs)[::-1]
    margin = float((top[0] - top[1]) / scale)
    same = int(ours.argmax()) == int(theirs.argmax())
    result = {"relaxc_vs_llama_cpp": diff, "argmax": [int(ours.argmax()), int(theirs.argmax())], "top2_margin": margin}
    line = f"{fmt}: first prefill logits within {diff:.2e} of llama.cpp's largest; argmax {ours.argmax()} / {theirs.argmax()}"
    if fmt in TOLERANCE:
        result["ok"] = same and diff <= TOLERANCE[fmt]
    else:
        itself, argmaxes = {}, set()
        for variant in ("flash", "plain"):
            path = os.path.join(work, f"llama_cpp_logits_{variant}.npy")
            llm_midsize.llama_cpp(gguf_path, 2, 2, 0, path, kv_cache="f32", variant=variant)
            other = np.load(path)
            itself[variant] = float(np.abs(other - theirs).max() / scale)
            argmaxes.add(int(other.argmax()))
        reference = reference_first_logits(gguf_path, llm_midsize.PROMPT, quantize_activations=True)
        moved = [
            np.abs(reference_first_logits(gguf_path, llm_midsize.PROMPT, True, 1e-7, seed) - reference).max()
            / np.abs(reference).max()
            for seed in range(seeds)
        ]
        floor = float(max(moved + list(itself.values())))
        result.update(floor=floor, floor_runs=[float(m) for m in moved], llama_cpp_vs_itself=itself)
        result["llama_cpp_argmaxes"] = sorted(argmaxes)
        flips = int(ours.argmax()) in argmaxes or margin < floor
        result["ok"] = diff <= max(2e-2, floor) and (same or flips)
        line += (
            f"; llama.cpp against itself: {itself['flash']:.2e} with flash attention, {itself['plain']:.2e} not "
            f"repacked (argmax {'/'.join(map(str, sorted(argmaxes)))}); float32 noise before int8 rounding "
            f"moves the reference up to {max(moved):.2e}; top-2 margin {margin:.2e}"
        )
    print(line + ("" if result["ok"] else ": DISAGREES"), flush=True)
    return result


def medians(results, fmt, threads):
    """The median prefill ms and decode tokens/s of each runtime's rounds, in the summary's order."""
    relaxc, theirs = results[(fmt, "relaxc", threads)], results[(fmt, "llama.cpp", threads)]
    return {
        "relaxc_prefill_ms": statistics.median(x[0] for x in relaxc),
        "llama_prefill_ms": statistics.median(x[0] for x in theirs),
        "relaxc_tps": statistics.median(x[1] for x in relaxc),
        "llama_tps": statistics.median(x[1] for x in theirs),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relaxc", default=os.path.join(ROOT, "target/release/relaxc"))
    ap.add_argument(
        "--size",
        choices=["mid", "1b"],
        default="mid",
        help="the model: mid (156 M parameters) or 1b (TinyLlama 1.1B's shape; f32 file 4.4 GB)",
    )
    ap.add_argument("--work", help="where files and builds are cached (default /tmp/relaxc-llm-gguf[-1b])")
    ap.add_argument("--formats", default="f32,f16,q8_0,q4_0,q4_k_m")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (0: check the logits only)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--long-prompt",
        type=int,
        default=500,
        help="also time a prompt of this many tokens (0: only the 6-token one)",
    )
    ap.add_argument("--publish", action="store_true", help="write this run into the book's page for it")
    ap.add_argument(
        "--time-anyway",
        action="store_true",
        help="time the formats whose logits disagree with llama.cpp's too",
    )
    args = ap.parse_args()
    relaxc = os.path.abspath(args.relaxc)
    args.work = args.work or "/tmp/relaxc-llm-gguf" + ("" if args.size == "mid" else f"-{args.size}")
    os.makedirs(args.work, exist_ok=True)
    formats = args.formats.split(",")
    files = {f: quantized_file(args.work, args.size, f) for f in formats}
    models = {f: build(args.work, relaxc, files[f]) for f in formats}

    theirs = os.path.join(args.work, "llama_cpp_logits.npy")
    ours = os.path.join(args.work, "relaxc_logits.npz")
    checks = {}
    for f in formats:
        relaxc_run(relaxc, models[f], files[f], 2, 2, 0, logits=ours)
        llm_midsize.llama_cpp(files[f], 2, 2, 0, theirs, kv_cache="f32")
        a, b = np.load(ours)["logits"][0], np.load(theirs)
        checks[f] = check_logits(f, files[f], a, b, args.work)
        if not checks[f]["ok"] and not args.time_anyway:
            sys.exit(f"{f}: relaxc disagrees with llama.cpp: not timing (--time-anyway times it all the same)")

    if args.rounds == 0:
        return
    # The long prompt: token ids spread over the vocabulary, the same every run.
    long_prompt = [(i * 7919) % 31000 + 100 for i in range(args.long_prompt)]
    long_context = 1 << (args.long_prompt + args.tokens).bit_length()
    results, long = {}, {}
    for r in range(args.rounds):
        for f in formats:
            for threads in [1, 2]:
                _, p, t = relaxc_run(relaxc, models[f], files[f], threads, args.tokens, args.runs)
                results.setdefault((f, "relaxc", threads), []).append((p, t))
                _, p, t = llm_midsize.llama_cpp(files[f], threads, args.tokens, args.runs, theirs)
                results.setdefault((f, "llama.cpp", threads), []).append((p, t))
                if not args.long_prompt:
                    continue
                _, p, t = relaxc_run(
                    relaxc,
                    models[f],
                    files[f],
                    threads,
                    args.tokens,
                    args.runs,
                    prompt=long_prompt,
                    context=long_context,
                )
                long.setdefault((f, "relaxc", threads), []).append((p, t))
                _, p, t = llm_midsize.llama_cpp(
                    files[f], threads, args.tokens, args.runs, theirs, prompt=long_prompt, context=long_context
                )
                long.setdefault((f, "llama.cpp", threads), []).append((p, t))
        print(f"round {r + 1} of {args.rounds} done", flush=True)

    import report

    caption = (
        f"{len(llm_midsize.PROMPT)}-token prompt, {args.tokens} new tokens; medians of {args.rounds} interleaved rounds "
        f"of {args.runs} runs. Decode relaxc / llama.cpp is a ratio of speeds (above 1: relaxc is faster)."
    )
    short = [
        caption,
        "",
        "| format | file (MiB) | relaxc load (ms) | RSS after load / file | threads | relaxc prefill (ms) "
        "| llama.cpp prefill (ms) | relaxc decode (tok/s) | llama.cpp decode (tok/s) | decode relaxc / llama.cpp |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    bars = {}
    summary = {}
    for f in formats:
        size = os.path.getsize(files[f])
        seconds, grown = load_cost(models[f], files[f])
        for threads in [1, 2]:
            summary[f"{f}/{threads}"] = medians(results, f, threads)
            rp, lp, rt, lt = summary[f"{f}/{threads}"].values()
            short.append(
                f"| {f} | {size / 2**20:.0f} | {seconds * 1e3:.0f} | {grown / size:.3f} | {threads} | {rp:.2f} | "
                f"{lp:.2f} | {rt:.1f} | {lt:.1f} | {rt / lt:.2f}x |"
            )
            bars.setdefault(f, {})[f"decode, {threads}T"] = rt / lt
    tables = [short]
    long_summary = {}
    if args.long_prompt:
        long_table = [
            f"The same after a {args.long_prompt}-token prompt (prefill in chunks of up to 512 tokens on both "
            f"sides), {args.tokens} new tokens.",
            "",
            "| format | threads | relaxc prefill (ms) | llama.cpp prefill (ms) | prefill llama.cpp / relaxc "
            "| relaxc decode (tok/s) | llama.cpp decode (tok/s) | decode relaxc / llama.cpp |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for f in formats:
            for threads in [1, 2]:
                long_summary[f"{f}/{threads}"] = medians(long, f, threads)
                rp, lp, rt, lt = long_summary[f"{f}/{threads}"].values()
                long_table.append(
                    f"| {f} | {threads} | {rp:.1f} | {lp:.1f} | {lp / rp:.2f}x | {rt:.1f} | {lt:.1f} | {rt / lt:.2f}x |"
                )
                bars[f][f"decode after {args.long_prompt}, {threads}T"] = rt / lt
        tables.append(long_table)
    print(report.machine())
    print("\n\n".join("\n".join(t) for t in tables))
    with open(os.path.join(args.work, "summary.json"), "w") as out:
        json.dump({"checks": checks, "results": summary, "long_prompt": long_summary}, out, indent=1)
    if args.publish:
        report.publish(
            "llm-gguf" if args.size == "mid" else f"llm-gguf-{args.size}",
            "GGUF decode: relaxc's tokens/s / llama.cpp's (above 1: relaxc is faster)",
            tables,
            bars,
            "relaxc / llama.cpp decode speed",
            packages=("llama_cpp_python", "apache-tvm", "gguf", "numpy"),
            extra={"checks": checks, "results": summary, "long_prompt": long_summary},
        )


if __name__ == "__main__":
    main()
