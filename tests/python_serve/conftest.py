"""Starts `python -m relaxc.serve` for the serving tests, on 127.0.0.1 and a free port, and stops
it (SIGINT, then the whole process group) when the module's tests end."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "fixtures", "tvm")


def relaxc():
    return os.environ.get("RELAXC") or os.path.join(ROOT, "target", "release", "relaxc")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(name, tmp_dir, mode="compiled"):
    out = os.path.join(tmp_dir, f"{name}.{mode}.so")
    subprocess.run(
        [relaxc(), "compile", os.path.join(FIXTURES, name, "m.tar"), "--exec-mode", mode, "-o", out], check=True
    )
    return out


class Server:
    def __init__(self, model, *options, env=None):
        self.port = free_port()
        env = dict(env or os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        env.pop("LD_PRELOAD", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "relaxc.serve", model, "--port", str(self.port), *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.log = []
        deadline = time.time() + 300
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.append(line)
            if line.startswith("serving "):
                self.name = re.match(r"serving (\S+) on", line).group(1)
                self.base = f"http://127.0.0.1:{self.port}"
                return
        self.stop()
        raise RuntimeError("relaxc.serve did not start:\n" + "".join(self.log[-40:]))

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=60) as r:
            return json.loads(r.read())

    def post(self, path, body, raw=False):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            r = urllib.request.urlopen(request, timeout=120)
            if raw:
                return r.status, r  # the caller reads (and closes) the stream
            with r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                return e.code, json.loads(text)
            except ValueError:  # Ray's own errors (a replica that died) are plain text
                return e.code, {"error": text.decode(errors="replace")}

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of Ray is left in the group
        except ProcessLookupError:
            pass
        self.proc.wait()
