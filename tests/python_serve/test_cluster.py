"""Two Ray nodes on one machine, started as the README says (RAY_AUTH_MODE=token: Ray's token
authentication on, the head's token generated and given to the second node), on 127.0.0.1: `python -m relaxc.serve --replicas 2
--address auto` puts a replica on each node, and every answer is right."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, Server, build, free_port, relaxc


def ray_cli():
    found = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
    if not os.path.exists(found):
        pytest.skip("the ray command is not installed (pip install 'ray[serve]')")
    return found


def start_node(args, env):
    """`ray start ... --block` in a process group of its own (Ray's services are its children, so
    stopping the group stops them, and nothing else of Ray on the machine); returns once the node
    is up."""
    proc = subprocess.Popen(
        [ray_cli(), "start", *args, "--block"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    log = []
    deadline = time.time() + 180
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        log.append(line)
        if "Ray runtime started" in line:
            return proc
    stop_node(proc)
    raise RuntimeError("ray start failed:\n" + "".join(log[-30:]))


def stop_node(proc):
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def cluster(tmp_path):
    """A head and a worker node, each with one CPU, in a HOME of their own (where the head writes
    its token, ~/.ray/auth_token, and the worker gets a copy of it)."""
    home = tmp_path / "home"
    home.mkdir()
    # Every node has relaxc's Python package (the README: pip install ./python[serve] on each).
    env = dict(
        os.environ,
        HOME=str(home),
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="token",
        PYTHONPATH=os.path.join(ROOT, "python"),
    )
    env.pop("LD_PRELOAD", None)
    port = free_port()
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    generated = subprocess.run(
        [ray_cli(), "get-auth-token", "--generate"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert generated.returncode == 0, generated.stderr
    nodes = [start_node(["--head", "--port", str(port), "--include-dashboard", "false", *common], env)]
    try:
        token = home / ".ray" / "auth_token"
        assert token.exists(), "ray get-auth-token --generate wrote no ~/.ray/auth_token"
        node_token = tmp_path / "node_auth_token"
        shutil.copy(token, node_token)  # as the README says: the head's token, copied to the node
        worker_env = dict(env, RAY_AUTH_TOKEN_PATH=str(node_token))
        nodes.append(start_node(["--address", f"127.0.0.1:{port}", *common], worker_env))
        yield env
    finally:
        for proc in reversed(nodes):
            stop_node(proc)
        # `ray start` recorded the head's address for later `ray.init()` calls to join; `ray stop`
        # would remove it, killing the nodes does not.
        record = "/tmp/ray/ray_current_cluster"
        try:
            with open(record) as f:
                if f.read().strip().endswith(f":{port}"):
                    os.remove(record)
        except OSError:
            pass


def test_two_nodes_one_replica_each(cluster, tmp_path):
    model = build("tiny_llama", str(tmp_path))
    want = subprocess.run(
        [relaxc(), "generate", model, "--prompt", "1,17,42,5,33,8", "--max-new-tokens", "9"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()[0]
    server = Server(model, "--replicas", "2", "--address", "auto", "--name", "llama", env=cluster)
    try:
        nodes = set()
        for _ in range(40):
            status, reply = server.post(
                "/v1/completions", {"prompt": [1, 17, 42, 5, 33, 8], "max_tokens": 9, "temperature": 0}
            )
            assert status == 200, reply
            assert "tokens: " + " ".join(map(str, reply["choices"][0]["token_ids"])) == want
            nodes.add(server.get("/v1/relaxc/stats")["node"])
            if len(nodes) == 2:
                break
            time.sleep(0.1)
        assert len(nodes) == 2, f"the replicas answered from {nodes}"
    finally:
        server.stop()
