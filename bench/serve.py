#!/usr/bin/env python3
"""Serving throughput where it matters: the mid-size Llama of bench/llm_midsize.py (156 M
parameters, decode bound by reading its weights), served by `python -m relaxc.serve` and by
llama-cpp-python's OpenAI-compatible server from a GGUF file of the same weights, with the same
requests.

--model lib (the default): relaxc serves bench/llm_midsize.py's model built with relaxc.tvm.build
(float32 weights bound as constants, dense layers on the kernel library, MLC's batch_prefill and
batch_decode), llama.cpp the f32 GGUF file of the same weights. --model f32|f16|q8_0|q4_0|q4_k_m:
both serve that GGUF file (llama.cpp's quantizer makes it from the f32 one), relaxc through
`python -m relaxc.llm build`'s model with --weights FILE.gguf.

The GGUF file has a character-level SentencePiece vocabulary, so a text prompt is the same tokens
to both servers (each reply's usage.prompt_tokens is checked to agree); relaxc reads it as the
tokenizer.json relaxc.llm writes from the file.

For 1, 4, 16 and 32 concurrent streams (--streams), each of --tokens new tokens (greedy, EOS
ignored: relaxc's ignore_eos, llama.cpp's logit_bias against it), both servers get the same
requests at once; the wall time from the first request to the last answer gives the aggregate
tokens/s; medians over --rounds. Every relaxc answer is checked against the same request's answer
alone (token for token), and every llama.cpp answer against its own answer alone (text).

Both servers get the same threads (--threads, default 2). Needs TVM 0.27 (to make the GGUF and
build the model), llama-cpp-python with its server's packages (sse-starlette, starlette-context,
pydantic-settings), gguf, ray[serve], tokenizers and numpy. Files are cached in --work.

usage: python3 bench/serve.py [--model lib] [--streams 1,4,16,32] [--tokens 128] [--rounds 3]
"""

import argparse
import concurrent.futures
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import llm_gguf


def _serve_helpers():
    """tests/python_serve's server launcher (loaded by path: tests/python has a conftest too)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "serve_conftest", os.path.join(ROOT, "tests", "python_serve", "conftest.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Server, module.free_port


Server, free_port = _serve_helpers()

WORDS = "the cat sat on a mat and the dog ran to the park where birds sang over the sea".split()


def post(base, path, body):
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.loads(r.read())


class LlamaCppServer:
    """llama-cpp-python's server (python -m llama_cpp.server) on 127.0.0.1."""

    def __init__(self, gguf_path, threads, context):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "llama_cpp.server", "--model", gguf_path, "--host", "127.0.0.1"]
        args += ["--port", str(self.port), "--n_threads", str(threads), "--n_threads_batch", str(threads)]
        args += ["--n_ctx", str(context), "--model_alias", "llama"]
        # Its log goes to a file: llama.cpp says a lot, and a full pipe would stop it.
        self.log = tempfile.NamedTemporaryFile("w+", prefix="llama-cpp-server-", suffix=".log")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError("llama_cpp.server failed to start:\n" + self.log.read()[-3000:])
            try:
                urllib.request.urlopen(self.base + "/v1/models", timeout=2).close()
                return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError("llama_cpp.server did not answer in 120 s")

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)


def library_build(work, relaxc_bin, gguf_path):
    """bench/llm_midsize.py's model (the same seeded weights as the GGUF file, bound as constants)
    exported with MLC's batch functions and built with relaxc.tvm.build, its dense layers on the
    kernel library's float32 GEMM; with the GGUF file's tokenizer beside it."""
    so = os.path.join(work, "llama-lib.so")
    tokenizer = os.path.join(work, "llama-lib.tokenizer.json")
    if not os.path.exists(so):
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import relaxc.tvm
        from relaxc.llm import tokenizer as gguf_tokenizer

        from tvm import relax

        llm = llm_gguf.llm_midsize.llm_module()
        shape = llm.Shape(**llm_gguf.llm_midsize.SIZES["mid"])
        mod, values = llm.export_with_weights(shape, llm_gguf.llm_midsize.SEED, batch="mlc")
        for fn in ["embed", "prefill", "decode", "batch_prefill", "batch_decode"]:
            mod = relax.transform.BindParams(fn, values)(mod)
        start = time.time()
        tar = os.path.join(work, "llama-lib.tar")
        relaxc.tvm.build(mod, target="llvm").export_library(tar)
        subprocess.run([relaxc_bin, "compile", tar, "--exec-mode", "compiled", "-o", so], check=True)
        os.remove(tar)
        gguf_tokenizer.write(gguf_path, tokenizer, os.path.join(work, "llama-lib.tokenizer_config.json"))
        print(f"built {so} in {time.time() - start:.0f} s", flush=True)
    return so, tokenizer


def relaxc_request(prompt, tokens):
    return {"model": "llama", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}


def llama_cpp_request(prompt, tokens):
    return {"model": "llama", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "logit_bias": {"2": -100.0}}


def concurrent_run(base, bodies, answer):
    """All requests at once: the wall time, the answers and the tokens generated."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda b: post(base, "/v1/completions", b), bodies))
    elapsed = time.perf_counter() - start
    return elapsed, [answer(r) for r in replies], sum(r["usage"]["completion_tokens"] for r in replies)


def token_ids(reply):
    return reply["choices"][0]["token_ids"]


def text(reply):
    return reply["choices"][0]["text"]


def measure(name, base, request, answer, alone, prompts, streams, args):
    """Aggregate tokens/s by number of concurrent streams (medians of args.rounds), each answer
    checked against the same request's answer alone."""
    results = {}
    for k in streams:
        runs = []
        for _ in range(args.rounds):
            elapsed, answers, generated = concurrent_run(base, [request(p, args.tokens) for p in prompts[:k]], answer)
            assert answers == alone[:k], f"{name}: {k} streams answered differently from each request alone"
            runs.append(generated / elapsed)
        results[k] = statistics.median(runs)
        print(f"  {name:9s} {k:3d} streams: {results[k]:8.1f} tokens/s", flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="lib", choices=["lib", "f32", *llm_gguf.FTYPES])
    parser.add_argument("--streams", default="1,4,16,32")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--relaxc", default=os.path.join(ROOT, "target", "release", "relaxc"))
    parser.add_argument("--work", default="/tmp/relaxc-serve-bench")
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    os.makedirs(args.work, exist_ok=True)
    os.environ["RELAXC"] = args.relaxc
    if args.model == "lib":
        gguf_path = llm_gguf.f32_file(args.work, "mid")
        so, tokenizer = library_build(args.work, args.relaxc, gguf_path)
        weights = []
    else:
        gguf_path = llm_gguf.quantized_file(args.work, "mid", args.model)
        so = llm_gguf.build(args.work, args.relaxc, gguf_path)
        tokenizer = so[: -len(".so")] + ".tokenizer.json"
        weights = ["--weights", gguf_path]
    rng = random.Random(0)
    prompts = [f"request {i}: " + " ".join(rng.choice(WORDS) for _ in range(6)) for i in range(max(streams))]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    print(
        f"relaxc: {os.path.basename(so)}; llama.cpp: {os.path.basename(gguf_path)}; {args.tokens} new tokens a stream, {args.threads} threads, {cpu}"
    )

    env = dict(os.environ, TVM_NUM_THREADS=str(args.threads))
    kv = max(streams) * (64 + args.tokens + 16)
    server = Server(
        so,
        "--name",
        "llama",
        *weights,
        "--tokenizer",
        tokenizer,
        "--max-batch-size",
        str(max(streams)),
        "--kv-tokens",
        str(kv),
        "--threads-per-replica",
        str(args.threads),
        env=env,
    )
    results = {"relaxc": {}, "llama.cpp": {}}
    prompt_tokens = {}
    try:
        alone = []
        for p in prompts:
            reply = post(server.base, "/v1/completions", relaxc_request(p, args.tokens))
            alone.append(token_ids(reply))
            prompt_tokens[p] = reply["usage"]["prompt_tokens"]
        results["relaxc"] = measure("relaxc", server.base, relaxc_request, token_ids, alone, prompts, streams, args)
    finally:
        server.stop()

    llama = LlamaCppServer(gguf_path, args.threads, 4 * (64 + args.tokens))
    try:
        alone = []
        for p in prompts:
            reply = post(llama.base, "/v1/completions", llama_cpp_request(p, args.tokens))
            alone.append(text(reply))
            assert reply["usage"]["prompt_tokens"] == prompt_tokens[p], (
                f"the servers tokenize {p!r} differently: {reply['usage']['prompt_tokens']} vs {prompt_tokens[p]}"
            )
        results["llama.cpp"] = measure("llama.cpp", llama.base, llama_cpp_request, text, alone, prompts, streams, args)
    finally:
        llama.stop()

    one = results["relaxc"][streams[0]]
    print(f"\naggregate tokens/s, medians of {args.rounds} ({platform.machine()}, {cpu}):")
    print("| streams | relaxc | vs 1 stream | llama-cpp-python server | relaxc / llama.cpp |")
    print("| --- | --- | --- | --- | --- |")
    for k in streams:
        r, c = results["relaxc"][k], results["llama.cpp"][k]
        print(f"| {k} | {r:.1f} | {r / one:.2f}x | {c:.1f} | {r / c:.2f}x |")


if __name__ == "__main__":
    main()
