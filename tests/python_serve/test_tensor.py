"""A TVM export served on Ray with two replicas: the Open Inference Protocol answers exactly what
`relaxc run` gives, batched or not, and refuses bad requests with 400 and a message."""

import concurrent.futures
import os
import subprocess

import numpy as np
import pytest
from conftest import FIXTURES, Server, build, relaxc


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("tensor"))
    model = build("dyn_batch", tmp)
    server = Server(model, "--replicas", "2", "--name", "dyn", "--max-body", "100000")
    yield server, model, tmp
    server.stop()


def relaxc_run(model, case, tmp):
    out = os.path.join(tmp, f"{case}.out.npz")
    subprocess.run(
        [relaxc(), "run", model, "--inputs", os.path.join(FIXTURES, "dyn_batch", f"{case}.in.npz"), "--outputs", out],
        check=True,
    )
    return np.load(out)["out0"]


def request_of(x):
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}]}


def output_of(reply):
    out = reply["outputs"][0]
    assert out["datatype"] == "FP32" and out["name"] == "out0"
    return np.array(out["data"], dtype=np.float32).reshape(out["shape"])


def test_health_and_metadata(served):
    server, _, _ = served
    assert server.get("/v2/health/ready")["ready"] is True
    assert server.get("/v2/health/live")["live"] is True
    meta = server.get("/v2/models/dyn")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "out0", "datatype": "FP32", "shape": [-1, 8]}]


@pytest.mark.parametrize("case", ["ok_n1", "ok_n5", "ok_n0"])
def test_infer_equals_relaxc_run(served, case):
    server, model, tmp = served
    x = np.load(os.path.join(FIXTURES, "dyn_batch", f"{case}.in.npz"))["arg0"]
    status, reply = server.post("/v2/models/dyn/infer", request_of(x))
    assert status == 200, reply
    assert output_of(reply).tobytes() == relaxc_run(model, case, tmp).tobytes()


def test_concurrent_requests_are_batched_and_exact(served):
    """Ray Serve batches concurrent requests along the batch dimension; each answer is still the
    one relaxc run gives for that request alone."""
    server, model, tmp = served
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((int(rng.integers(1, 4)), 16)).astype(np.float32) for _ in range(24)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda x: server.post("/v2/models/dyn/infer", request_of(x)), inputs))
    stats = [server.get("/v2/relaxc/stats") for _ in range(8)]  # each from one of the two replicas
    assert all(s["batching"] for s in stats) and max(s["batched_requests"] for s in stats) >= 2, stats
    for x, (status, reply) in zip(inputs, replies):
        assert status == 200, reply
        path = os.path.join(tmp, "alone.npz")
        np.savez(path, arg0=x)
        out = os.path.join(tmp, "alone.out.npz")
        subprocess.run([relaxc(), "run", model, "--inputs", path, "--outputs", out], check=True)
        assert output_of(reply).tobytes() == np.load(out)["out0"].tobytes()


@pytest.mark.parametrize(
    "body, words",
    [
        (b"{not json", "malformed JSON"),
        ({"inputs": []}, "takes 1 inputs"),
        ({"inputs": [{"name": "y", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]}, "no input named 'y'"),
        (
            {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "INT32", "data": [0] * 16}]},
            "datatype INT32, the model takes FP32",
        ),
        (
            {"inputs": [{"name": "x", "shape": [1, 15], "datatype": "FP32", "data": [0.0] * 15}]},
            "shape [1, 15], the model takes [-1, 16]",
        ),
        (
            {"inputs": [{"name": "x", "shape": [2, 16], "datatype": "FP32", "data": [0.0] * 16}]},
            "16 values for shape [2, 16]",
        ),
        (
            {"inputs": [{"name": "x", "shape": [2000, 16], "datatype": "FP32", "data": [0.0] * 32000}]},
            "over the server's limit",
        ),
    ],
)
def test_bad_requests_get_400_with_a_message(served, body, words):
    server, _, _ = served
    status, reply = server.post("/v2/models/dyn/infer", body)
    assert status == 400 and words in reply["error"], reply
