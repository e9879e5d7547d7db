"""Serving on Ray: what continuous batching and a second replica buy (python -m relaxc.serve).

usage: python3 bench/serve.py [--model tiny_llama] [--tokens 512] [--requests 16] [--repeat 3]

Builds the fixture's model with target/release/relaxc, then, each on a fresh local Ray cluster on
127.0.0.1:
  1. one replica, continuous batching (--max-batch-size 16): one request alone, then N concurrent
     requests with different prompts;
  2. one replica with --max-batch-size 1: N concurrent requests, run one after another (what a
     server without continuous batching does);
  3. two replicas, continuous batching: N concurrent requests.
Prints medians over --repeat rounds and the ratios, then one decode step of the model alone (no
server) at batch 1 and N. Greedy decoding throughout; every answer is checked against the same
request's answer alone.
"""

import argparse
import concurrent.futures
import os
import random
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "python_serve"))
from conftest import Server, build


def complete(server, prompt, n):
    status, reply = server.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0})
    assert status == 200, reply
    return reply["choices"][0]["token_ids"]


def timed_concurrent(server, prompts, n):
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        out = list(pool.map(lambda p: complete(server, p, n), prompts))
    return time.perf_counter() - start, out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny_llama")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("RELAXC", os.path.join(ROOT, "target", "release", "relaxc"))
    tmp = os.path.join(ROOT, "target", "bench-serve")
    os.makedirs(tmp, exist_ok=True)
    model = build(args.model, tmp)
    rng = random.Random(0)
    prompts = [[rng.randrange(64) for _ in range(rng.randrange(4, 12))] for _ in range(args.requests)]
    results = {}
    kv = ["--kv-tokens", str(args.requests * (args.tokens + 16))]

    def concurrent(server, name):
        runs = []
        for _ in range(args.repeat):
            elapsed, out = timed_concurrent(server, prompts, args.tokens)
            assert out == alone_answers
            runs.append(elapsed)
        results[name] = statistics.median(runs)

    server = Server(model, "--replicas", "1", "--max-batch-size", str(args.requests), "--name", "one", *kv)
    try:
        alone_answers = [complete(server, p, args.tokens) for p in prompts]
        singles = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            complete(server, prompts[0], args.tokens)
            singles.append(time.perf_counter() - start)
        results["one request"] = statistics.median(singles)
        concurrent(server, "batched, 1 replica")
    finally:
        server.stop()
    for name, replicas, batch in [
        ("one at a time, 1 replica", "1", "1"),
        ("batched, 2 replicas", "2", str(args.requests)),
    ]:
        server = Server(model, "--replicas", replicas, "--max-batch-size", batch, "--name", "run", *kv)
        try:
            concurrent(server, name)
        finally:
            server.stop()

    one = results["one request"]
    n = args.requests
    print(f"{args.model}, {n} concurrent requests of {args.tokens} tokens, medians of {args.repeat}:")
    for name, seconds in results.items():
        print(f"  {name:28s} {seconds * 1000:8.1f} ms   {seconds / one:5.2f}x one request")
    print(
        f"  continuous batching: {n} requests in {results['batched, 1 replica'] / one:.2f}x one request's time "
        f"(one at a time: {results['one at a time, 1 replica'] / one:.2f}x)"
    )
    print(f"  2 replicas vs 1: {results['batched, 1 replica'] / results['batched, 2 replicas']:.2f}x the throughput")
    for batch, ms in decode_step_ms(model, [1, n]).items():
        print(f"  one decode step of the model alone (no server), {batch} sequence(s): {ms:.3f} ms")


def decode_step_ms(model, batches, steps=200):
    """The model's decode step alone, through the engine's own forward call, by batch size."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from relaxc.serve import Engine

    engine = Engine(model, max_batch=max(batches), max_total_seq_len=max(batches) * (steps + 16), run=False)
    out = {}
    for batch in batches:
        slots = list(range(batch))
        for s in slots:
            engine._state("kv_state_add_sequence", s)
            engine._forward("prefill", [s], [4], [1, 2, 3, 4], 1)
        start = time.perf_counter()
        for _ in range(steps):
            engine._forward("decode", slots, [1] * batch, [5] * batch, batch)
        out[batch] = (time.perf_counter() - start) / steps * 1000
        for s in slots:
            engine._state("kv_state_remove_sequence", s)
    return out


if __name__ == "__main__":
    main()
