"""The tiny Llama served on Ray: completions equal `relaxc generate`'s tokens; concurrent
requests are batched into shared decode steps and each still gets its own single-request answer;
streaming sends one event per token; a client that goes away frees its sequence; a replica killed
under load is restarted by Ray and no request is answered wrongly."""

import concurrent.futures
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from conftest import ROOT, Server, build, relaxc

PROMPT = [1, 17, 42, 5, 33, 8]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("llm"))
    model = build("tiny_llama", tmp)
    server = Server(model, "--replicas", "2", "--name", "llama", "--kv-tokens", "70000", "--max-batch-size", "16")
    yield server, model
    server.stop()


def generate(model, prompt, n):
    out = subprocess.run(
        [relaxc(), "generate", model, "--prompt", ",".join(map(str, prompt)), "--max-new-tokens", str(n)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    line = next(l for l in out.splitlines() if l.startswith("tokens:"))
    return [int(t) for t in line.split(":")[1].split()]


def complete(server, prompt, n, retries=0, **extra):
    for attempt in range(retries + 1):
        try:
            status, reply = server.post(
                "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, **extra}
            )
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            status, reply = 0, str(e)
        if status == 200:
            return reply["choices"][0]["token_ids"]
        if attempt == retries or status == 400:
            raise AssertionError(f"{status}: {reply}")
        time.sleep(0.5 * (attempt + 1))


def test_completion_equals_relaxc_generate(served):
    server, model = served
    assert complete(server, PROMPT, 9) == generate(model, PROMPT, 9)


def test_metrics_in_prometheus_text(served):
    """GET /metrics answers in Prometheus's text format, each replica its own counts (Ray routes a
    scrape to one of them)."""
    server, _ = served
    complete(server, PROMPT, 3)
    with urllib.request.urlopen(server.base + "/metrics", timeout=60) as r:
        kind, text = r.headers["Content-Type"], r.read().decode()
    assert kind.startswith("text/plain") and "version=0.0.4" in kind
    assert "# TYPE relaxc:generation_tokens_total counter" in text
    assert 'relaxc:time_to_first_token_seconds_bucket{model_name="llama",le="+Inf"}' in text
    assert 'relaxc:kv_cache_usage_ratio{model_name="llama"}' in text


def test_32_concurrent_requests_equal_their_single_answers(served):
    server, _ = served
    rng = random.Random(0)
    prompts = [[rng.randrange(64) for _ in range(rng.randrange(1, 12))] for _ in range(32)]
    alone = [complete(server, p, 12) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda p: complete(server, p, 12), prompts))
    assert together == alone


def test_streaming_sends_one_event_per_token(served):
    server, model = served
    status, response = server.post(
        "/v1/completions", {"prompt": PROMPT, "max_tokens": 9, "temperature": 0, "stream": True}, raw=True
    )
    assert status == 200
    events = [line.decode().strip() for line in response if line.strip()]
    assert events[-1] == "data: [DONE]"
    tokens = [json.loads(e[len("data: ") :])["choices"][0]["token_ids"] for e in events[:-1]]
    assert all(len(t) == 1 for t in tokens)
    assert [t[0] for t in tokens] == generate(model, PROMPT, 9)


@pytest.mark.parametrize(
    "body, words",
    [
        ({"prompt": "hello", "max_tokens": 4}, "no tokenizer"),
        ({"prompt": [1, 2, 999], "max_tokens": 4}, "outside the model's vocabulary"),
        ({"prompt": [], "max_tokens": 4}, "non-empty list"),
        ({"prompt": [1], "max_tokens": 0}, "max_tokens"),
        ({"prompt": [1], "max_tokens": 80000}, "exceed the KV cache"),
        (b"[1, 2", "malformed JSON"),
    ],
)
def test_bad_completions_get_400(served, body, words):
    server, _ = served
    status, reply = server.post("/v1/completions", body)
    assert status == 400 and words in reply["error"]["message"], reply


def stats(server):
    return [server.get("/v1/relaxc/stats") for _ in range(8)]


def test_a_client_that_disconnects_frees_its_sequence(served):
    server, _ = served
    before = stats(server)
    pages = max(s["available_pages"] for s in before)
    status, response = server.post(
        "/v1/completions", {"prompt": PROMPT, "max_tokens": 60000, "temperature": 0, "stream": True}, raw=True
    )
    assert status == 200
    for _ in range(3):
        response.readline()
    response.close()  # gone, 60,000 tokens early
    deadline = time.time() + 60
    while time.time() < deadline:
        now = stats(server)
        if (
            all(s["running"] == 0 and s["available_pages"] == pages for s in now)
            and sum(s["cancelled"] for s in now) >= 1
        ):
            return
        time.sleep(0.5)
    raise AssertionError(f"after the disconnect: {stats(server)}")


def replica_pids(server):
    """The replicas of this server's Ray cluster (its processes share the server's session)."""
    out = subprocess.run(
        ["pgrep", "-s", str(server.proc.pid), "-f", f"ServeReplica:{server.name}"], capture_output=True, text=True
    ).stdout
    return [int(p) for p in out.split()]


def test_a_killed_replica_is_restarted_and_no_request_is_answered_wrongly(served):
    server, model = served
    want = generate(model, PROMPT, 24)
    pids = replica_pids(server)
    assert len(pids) == 2, pids
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(complete, server, PROMPT, 24, 8) for _ in range(48)]
        time.sleep(0.3)
        os.kill(pids[0], signal.SIGKILL)
        results = [f.result(timeout=300) for f in futures]
    assert all(r == want for r in results)
    deadline = time.time() + 180
    while time.time() < deadline and (len(replica_pids(server)) != 2 or pids[0] in replica_pids(server)):
        time.sleep(1)
    assert len(replica_pids(server)) == 2 and pids[0] not in replica_pids(server)
    assert complete(server, PROMPT, 24) == want


def test_weights_outside_the_model(tmp_path):
    """The tiny Llama exported with its weights as parameters, served with --weights: the tokens
    TVM generated (fixtures/tiny_llama_params/generate.npz)."""
    import numpy as np
    from conftest import FIXTURES

    params = os.path.join(FIXTURES, "tiny_llama_params")
    want = np.load(os.path.join(params, "generate.npz"))
    model = build("tiny_llama_params", str(tmp_path))
    server = Server(model, "--name", "params", "--weights", os.path.join(params, "params.safetensors"))
    try:
        prompt = [int(t) for t in want["prompt"]]
        assert complete(server, prompt, len(want["tokens"])) == [int(t) for t in want["tokens"]]
    finally:
        server.stop()


def test_a_gguf_file_is_served_directly(tmp_path):
    """`python -m relaxc.serve MODEL.gguf` builds the model once (kept in $RELAXC_CACHE), reads the
    weights from the file and answers with TVM's greedy tokens; a second server finds it built."""
    pytest.importorskip("tvm", reason="building a GGUF file's model needs Apache TVM")
    pytest.importorskip("gguf", reason="building a GGUF file's model needs the gguf package")
    import numpy as np

    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "fixtures", "gguf")
    gguf = os.path.join(folder, "tiny_mixed.gguf")
    want = np.load(os.path.join(folder, "generate.npz"))
    prompt, tokens = [int(t) for t in want["prompt"]], [int(t) for t in want["tokens"]]
    env = dict(os.environ, RELAXC_CACHE=str(tmp_path / "cache"))
    for built in (False, True):
        server = Server(gguf, env=env)
        try:
            assert server.name == "tiny_mixed"
            log = "".join(server.log)
            assert ("built before" in log) == built and ("building the model once" in log) != built, log
            assert complete(server, prompt, len(tokens)) == tokens
        finally:
            server.stop()


def test_a_bad_gguf_file_is_refused_by_name(tmp_path):
    pytest.importorskip("tvm", reason="building a GGUF file's model needs Apache TVM")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(20))
    env = dict(os.environ, RELAXC_CACHE=str(tmp_path / "cache"), PYTHONPATH=os.path.join(ROOT, "python"))
    done = subprocess.run(
        [sys.executable, "-m", "relaxc.serve", str(bad)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 2 and "broken.gguf" in done.stderr, done.stderr[-2000:]
