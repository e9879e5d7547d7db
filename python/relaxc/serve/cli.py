"""python -m relaxc.serve: the command line. Checks the model and the options, starts (or joins) a
Ray cluster, runs the application on Ray Serve and stops it all on SIGINT or SIGTERM."""

import argparse
import os
import signal
import time

from .. import book_page
from .deployment import app
from .engine import is_llm
from .inference import signature
from .text import Tokenizer, TokenizerError


def _wait_for_route(host, port, timeout=60.0):
    """Until the HTTP proxy lists the application's route: serve.run returns once the replicas
    are up, and a proxy learns the route a moment later (a request in between is a 404, which a
    client told "serving" should never see)."""
    import json
    import urllib.request

    connect = "127.0.0.1" if host in ("0.0.0.0", "::", "localhost") else host
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://{connect}:{port}/-/routes", timeout=5) as reply:
                if "/" in json.loads(reply.read()):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    print(f"warning: the HTTP proxy on port {port} did not list the route within {timeout:.0f} s", flush=True)


def _is_gguf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def gguf_model(gguf, log=print):
    """A GGUF file's model (`python -m relaxc.llm build`, compiled mode), built once and kept in
    $RELAXC_CACHE/serve (default ~/.cache/relaxc/serve) under a key of the file (path, size,
    modification time) and of the relaxc command that built it: (the .so, its tokenizer.json or
    None where the file has no vocabulary)."""
    import hashlib
    import tempfile

    from .. import find_relaxc

    relaxc_bin = find_relaxc()
    parts = []
    for p in (gguf, relaxc_bin):
        st = os.stat(p)
        parts.append(f"{os.path.realpath(p)}|{st.st_size}|{st.st_mtime_ns}")
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]
    root = os.environ.get("RELAXC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "relaxc")
    folder = os.path.join(root, "serve", key)
    so = os.path.join(folder, "model.so")
    tokenizer = os.path.join(folder, "model.tokenizer.json")
    if os.path.isfile(so):
        log(f"{gguf}: the model built before (cached in {folder})")
    else:
        from relaxc import llm

        os.makedirs(os.path.dirname(folder), exist_ok=True)
        log(f"{gguf}: building the model once (cached in {folder})")
        # Built beside the cache and moved in whole: a server started meanwhile builds its own.
        import shutil

        work = tempfile.mkdtemp(prefix=key + ".", dir=os.path.dirname(folder))
        try:
            llm.build(gguf, os.path.join(work, "model.so"), exec_mode="compiled", log=lambda m: log("  " + m))
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        try:
            os.rename(work, folder)
        except OSError as e:
            shutil.rmtree(work, ignore_errors=True)
            if not os.path.isfile(so):  # else another server moved its build in first: use that one
                raise RuntimeError(f"cannot keep the built model in {folder}: {e}") from None
    return so, tokenizer if os.path.isfile(tokenizer) else None


def main(argv=None):
    import relaxc.serve as package

    parser = argparse.ArgumentParser(
        prog="python -m relaxc.serve",
        description=package.__doc__.split("\n\n")[0],
        epilog=f"The manual's page: {book_page('serving')}.",
    )
    parser.add_argument(
        "model",
        help="a model .so built by relaxc compile, or an LLM's GGUF file (built once and cached: "
        "its weights read from the file, its tokenizer and chat template from its metadata)",
    )
    parser.add_argument("--replicas", type=int, default=1, help="Ray Serve replicas (default 1)")
    parser.add_argument(
        "--threads-per-replica",
        type=int,
        default=1,
        help="worker threads (and CPUs) per replica",
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument("--name", help="model name in the URLs (default: the file name)")
    parser.add_argument(
        "--address",
        help="join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting one",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=8,
        help="tensor models: requests batched together; LLMs: sequences decoded together",
    )
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=2.0,
        help="tensor models: how long a batch waits to fill",
    )
    parser.add_argument("--max-body", type=int, default=64 << 20, help="largest request body in bytes")
    parser.add_argument(
        "--kv-tokens",
        type=int,
        default=4096,
        help="LLMs: tokens the KV cache holds, over all sequences",
    )
    parser.add_argument(
        "--weights",
        help="LLMs exported with their weights as parameters: a tensor cache or safetensors "
        "(a path every replica's node can read)",
    )
    parser.add_argument(
        "--tokenizer",
        help="LLMs: the model's tokenizer.json (Hugging Face's format; `python -m relaxc.llm build` "
        "writes one beside the model) for text prompts and answers; its chat template is read from "
        "tokenizer_config.json beside it",
    )
    args = parser.parse_args(argv)
    if not os.path.isfile(args.model):
        parser.error(f"{args.model}: no such file")
    if _is_gguf(args.model):
        gguf = os.path.abspath(args.model)
        args.name = args.name or os.path.splitext(os.path.basename(gguf))[0]
        try:
            args.model, tokenizer = gguf_model(gguf, log=lambda m: print(m, flush=True))
        except ImportError as e:
            parser.error(
                f"{gguf}: building a GGUF file's model needs Apache TVM and gguf ({e}): "
                "pip install apache-tvm==0.27.0.post1 gguf"
            )
        except Exception as e:  # the file's own error (an unsupported architecture, a bad tensor)
            parser.error(f"{gguf}: {e}")
        args.weights = args.weights or gguf
        args.tokenizer = args.tokenizer or tokenizer
    if args.weights and not os.path.exists(args.weights):
        parser.error(f"--weights {args.weights}: no such file or directory")
    if args.replicas < 1 or args.threads_per_replica < 1 or args.max_batch_size < 1:
        parser.error("--replicas, --threads-per-replica and --max-batch-size must be at least 1")
    try:
        llm = is_llm(args.model)
        signature(args.model) if not llm else None
    except ValueError as e:
        parser.error(str(e))
    if args.tokenizer:
        if not llm:
            parser.error("--tokenizer is for LLMs, and this model is not one")
        if not os.path.isfile(args.tokenizer):
            parser.error(f"--tokenizer {args.tokenizer}: no such file")
        try:
            Tokenizer(args.tokenizer)
        except TokenizerError as e:
            parser.error(f"--tokenizer: {e}")

    import ray
    from ray import serve

    if args.address:
        ray.init(address=args.address, logging_level="ERROR")
    else:
        # One machine: room for every replica's threads, whatever the core count; Ray's own
        # services on loopback too when the HTTP address is. A cluster of our own ("local"), even
        # where `ray start` left the address of another (Ray would join that one otherwise).
        loopback = args.host in ("127.0.0.1", "localhost", "::1")
        ray.init(
            address="local",
            num_cpus=max(os.cpu_count() or 1, args.replicas * args.threads_per_replica),
            include_dashboard=False,
            logging_level="ERROR",
            **({"_node_ip_address": "127.0.0.1"} if loopback else {}),
        )
    name = args.name or os.path.splitext(os.path.basename(args.model))[0]
    serve.start(http_options={"host": args.host, "port": args.port})
    application = app(
        args.model,
        name,
        args.replicas,
        args.threads_per_replica,
        args.max_batch_size,
        args.batch_wait_ms,
        args.max_body,
        {
            "max_batch": args.max_batch_size,
            "max_total_seq_len": args.kv_tokens,
            "weights": os.path.abspath(args.weights) if args.weights else None,
            "tokenizer": args.tokenizer,
        },
    )
    serve.run(application, name=name, route_prefix="/")
    _wait_for_route(args.host, args.port)
    print(f"serving {name} on http://{args.host}:{args.port}", flush=True)
    # A plain flag: a handler that took a lock (threading.Event.set) could deadlock against the
    # main thread waiting inside that same lock when the signal lands.
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(True))
    while not stop:
        time.sleep(0.2)
    serve.shutdown()
    ray.shutdown()
    print("stopped", flush=True)
    return 0
