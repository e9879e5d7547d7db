"""Serve a relaxc model on Ray Serve: tensor models over the Open Inference Protocol (KServe v2),
LLMs over OpenAI's completions API with continuous batching on the paged KV cache.

    python -m relaxc.serve MODEL.so [--replicas N] [--threads-per-replica T] [--host 127.0.0.1]
                           [--port 8000] [--name NAME] [--address RAY_ADDRESS]

or, to compose your own Ray Serve application, ``relaxc.serve.app(MODEL.so, name=...)``.

Each replica loads the .so once through tvm-ffi (no TVM); every worker thread gets its own VM
(the model's tvm-ffi entry points keep one per thread). The model file travels to the replicas
through Ray's object store, so replicas on other nodes need no shared file system.

Tensor models (any .so with ``main``): ``GET /v2/health/live``, ``/v2/health/ready``,
``/v2/models/NAME`` (inputs and outputs with the names, datatypes and shapes of the model's
annotations, -1 for a symbolic dimension) and ``POST /v2/models/NAME/infer`` with JSON tensors.
Requests whose inputs all have a symbolic first dimension are batched (Ray Serve's batching) up to
``--max-batch-size`` along it.

LLMs (the nn/MLC export convention, as ``relaxc generate`` reads them: create_paged_kv_cache,
embed, prefill, decode): ``POST /v1/completions`` with ``prompt`` a list of token ids,
``max_tokens``, ``temperature`` (0: greedy), ``top_p``, ``seed`` and ``stream``. One KV cache per
replica; a request joins the running batch at the next step (its prompt is prefilled, then it
decodes together with every running sequence); a finished or cancelled sequence (the client went
away) is removed and its pages freed.
"""

import argparse
import asyncio
import json
import os
import queue
import re
import signal
import struct
import sys
import tempfile
import threading
import time
import uuid

import numpy as np

# ---- The model's signature, from its executable (.rvm_exec) --------------------------------------

_OIP_DATATYPES = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float32": "FP32", "float64": "FP64",
}
_NUMPY_OF = {v: k for k, v in _OIP_DATATYPES.items()}


def _elf_section(path, wanted):
    """The bytes of one section of an ELF64 little-endian file, or None."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise ValueError(f"{path} is not a 64-bit little-endian ELF file (a relaxc model)")
        shoff, = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        _, _, _, _, str_off, str_size = sections[shstrndx]
        f.seek(str_off)
        names = f.read(str_size)
        for name_off, _, _, _, offset, size in sections:
            end = names.find(b"\0", name_off)
            if names[name_off:end] == wanted:
                f.seek(offset)
                return f.read(size)
    return None


_CONTEXT = re.compile(rb'ErrorContext\(fn=([^,]+), loc=(param\[(\d+)\]|return), (?:param=([^,]+), )?annotation=(.*?)\) ')


def _split_top(text):
    """Splits "a, b(c, d), e" at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def _tensors_of(annotation):
    """The tensors of a Relax annotation, flattened: [(dims, dtype)], a symbolic dim as its name."""
    annotation = annotation.strip()
    if annotation.startswith("R.Tuple(") and annotation.endswith(")"):
        return [t for part in _split_top(annotation[len("R.Tuple("):-1]) for t in _tensors_of(part)]
    match = re.fullmatch(r'R\.Tensor\(\((.*?)\),\s*dtype="(\w+)"\)', annotation)
    if not match:
        return [None]  # a shape, a scalar, or a tensor of unknown rank: not an OIP tensor
    dims = [d.strip() for d in match.group(1).split(",") if d.strip()]
    return [([int(d) if re.fullmatch(r"-?\d+", d) else d for d in dims], match.group(2))]


def signature(path, function="main"):
    """Inputs and outputs of `function`: {"inputs": [(name, dims, dtype)], "outputs": [...]}, a
    symbolic dim as its name (a string); None for a value that is not a tensor."""
    exec_bytes = _elf_section(path, b".rvm_exec")
    if exec_bytes is None:
        raise ValueError(f"{path} has no .rvm_exec section: it was not built by relaxc")
    inputs, outputs = {}, None
    for m in _CONTEXT.finditer(exec_bytes):
        if m.group(1).decode() != function:
            continue
        annotation = m.group(5).decode("utf-8", "replace")
        if m.group(3) is not None:
            name = (m.group(4) or b"").decode() or f"input{m.group(3).decode()}"
            tensors = _tensors_of(annotation)
            inputs[int(m.group(3))] = (name, tensors[0] if len(tensors) == 1 else None)
        elif outputs is None:
            outputs = _tensors_of(annotation)
    return {
        "inputs": [(n, t[0], t[1]) if t else (n, None, None) for _, (n, t) in sorted(inputs.items())],
        "outputs": [(f"out{i}", t[0], t[1]) if t else (f"out{i}", None, None) for i, t in enumerate(outputs or [])],
    }


def batchable(sig):
    """Whether every input and output has the same symbolic first dimension (a batch)."""
    firsts = [dims[0] if dims else None for _, dims, _ in sig["inputs"] + sig["outputs"]]
    return bool(firsts) and isinstance(firsts[0], str) and all(f == firsts[0] for f in firsts)


# ---- Tensor models -----------------------------------------------------------------------------------


class BadRequest(Exception):
    """A request the server refuses with 400 and this message."""


def _flatten(value, out):
    import tvm_ffi

    if isinstance(value, tvm_ffi.Tensor):
        out.append(np.from_dlpack(value).copy())
    elif isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        for item in value:
            _flatten(item, out)
    elif isinstance(value, (int, float, bool)):
        out.append(np.array(value))
    else:
        raise BadRequest(f"the model returned a {type(value).__name__}, which has no tensor form")
    return out


class TensorModel:
    """A loaded tensor model: `infer` takes numpy arrays and returns the flattened results."""

    def __init__(self, path, function="main"):
        import tvm_ffi

        self.module = tvm_ffi.load_module(path)
        self.function = self.module[function]
        self.signature = signature(path, function)

    def infer(self, arrays):
        import tvm_ffi

        try:
            result = self.function(*[tvm_ffi.from_dlpack(np.ascontiguousarray(a)) for a in arrays])
        except Exception as e:  # relaxc's error: the caller's fault (shape, dtype, count)
            raise BadRequest(f"{type(e).__name__}: {e}") from None
        return _flatten(result, [])


def parse_infer_request(body, sig, max_bytes):
    """The input arrays of an OIP v2 JSON inference request, in the model's parameter order."""
    if len(body) > max_bytes:
        raise BadRequest(f"request body of {len(body)} bytes is over the server's limit of {max_bytes}")
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"malformed JSON: {e}") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise BadRequest('an inference request is a JSON object with an "inputs" list')
    given = request["inputs"]
    names = [n for n, _, _ in sig["inputs"]]
    if len(given) != len(names):
        raise BadRequest(f"the model takes {len(names)} inputs ({', '.join(names)}), the request has {len(given)}")
    by_name = {}
    for i, tensor in enumerate(given):
        if not isinstance(tensor, dict):
            raise BadRequest(f"inputs[{i}] is not a tensor object")
        name, shape, datatype, data = (tensor.get(k) for k in ("name", "shape", "datatype", "data"))
        if name not in names:
            raise BadRequest(f"inputs[{i}]: the model has no input named {name!r} (it takes {', '.join(names)})")
        if datatype not in _NUMPY_OF:
            raise BadRequest(f"input {name}: unsupported datatype {datatype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise BadRequest(f"input {name}: shape must be a list of non-negative integers")
        _, dims, dtype = sig["inputs"][names.index(name)]
        if dtype is not None and _OIP_DATATYPES.get(dtype) != datatype:
            raise BadRequest(f"input {name}: datatype {datatype}, the model takes {_OIP_DATATYPES.get(dtype, dtype)}")
        if dims is not None and (len(dims) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(dims, shape))):
            raise BadRequest(f"input {name}: shape {shape}, the model takes {[d if isinstance(d, int) else -1 for d in dims]}")
        try:
            array = np.array(data, dtype=_NUMPY_OF[datatype])
        except (TypeError, ValueError, OverflowError) as e:
            raise BadRequest(f"input {name}: data does not fit {datatype}: {e}") from None
        if array.size != int(np.prod(shape)):
            raise BadRequest(f"input {name}: {array.size} values for shape {shape}")
        by_name[name] = array.reshape(shape)
    return [by_name[n] for n in names]


def infer_response(model_name, sig, outputs):
    tensors = []
    for i, array in enumerate(outputs):
        name = sig["outputs"][i][0] if i < len(sig["outputs"]) else f"out{i}"
        tensors.append({
            "name": name,
            "shape": list(array.shape),
            "datatype": _OIP_DATATYPES.get(str(array.dtype), str(array.dtype)),
            "data": array.reshape(-1).tolist(),
        })
    return {"model_name": model_name, "outputs": tensors}


def model_metadata(model_name, sig):
    def entry(name, dims, dtype):
        shape = [d if isinstance(d, int) else -1 for d in dims] if dims is not None else None
        return {"name": name, "datatype": _OIP_DATATYPES.get(dtype, dtype), "shape": shape}

    return {
        "name": model_name,
        "versions": ["1"],
        "platform": "relaxc",
        "inputs": [entry(*i) for i in sig["inputs"]],
        "outputs": [entry(*o) for o in sig["outputs"]],
    }


# ---- LLMs: continuous batching on the paged KV cache ---------------------------------------------


class Sequence:
    """One completion request in the engine."""

    def __init__(self, prompt, max_tokens, temperature, top_p, seed, emit, stream):
        self.prompt, self.max_tokens = prompt, max_tokens
        self.temperature, self.top_p = temperature, top_p
        self.rng = np.random.default_rng(seed)
        # emit(token, None) for each token when streaming, then emit(None, error or None) at the
        # end; called on the engine thread. Without streaming only the end is sent (a wakeup of
        # the server's event loop per token would cost more than the token).
        self.emit = emit
        self.stream = stream
        self.tokens = []
        self.cancelled = False
        self.slot = None


class Engine:
    """Runs an LLM's steps on one thread: new sequences are prefilled as they arrive, then every
    running sequence decodes together, one token per step."""

    def __init__(self, path, max_batch=8, max_total_seq_len=4096, prefill_chunk=256, page_size=16, weights=None,
                 run=True):
        import tvm_ffi

        self.tvm_ffi = tvm_ffi
        m = tvm_ffi.load_module(path)
        self.m = m
        self.call = m["relaxc_call"]
        # A model exported with its weights as parameters takes them after its inputs, by name
        # from a tensor cache or safetensors (as `relaxc generate --weights`).
        self.weights = {fn: list(m["relaxc_weights"](weights, fn, n)) if weights else []
                        for fn, n in (("embed", 1), ("prefill", 2), ("decode", 2))}
        self.max_batch, self.max_total, self.chunk = max_batch, max_total_seq_len, prefill_chunk
        shape = tvm_ffi.Shape
        self.kv = m["create_paged_kv_cache"](*[shape([v]) for v in (max_batch, max_total_seq_len, prefill_chunk, page_size, 0)])
        self.waiting = queue.Queue()
        self.running = []
        self.reserved = 0
        self.cancelled = 0  # sequences ended early because their client went away
        self.free_slots = list(range(max_batch))
        self.vocab = None
        self.vocab = self._probe_vocab()
        self._count_pages()
        self.thread = threading.Thread(target=self._loop, name="relaxc-llm-engine", daemon=True)
        self.stopped = False
        if run:  # run=False: no engine thread, for measuring the model's steps directly
            self.thread.start()

    def _state(self, name, *args):
        return self.call("vm.builtin." + name, self.kv, *args)

    def _forward(self, fn, slots, lengths, ids, rows):
        embeds = np.from_dlpack(self.m["embed"](self.tvm_ffi.from_dlpack(np.array(ids, "int32")), *self.weights["embed"]))
        embeds = np.ascontiguousarray(embeds.reshape(1, len(ids), -1) if fn == "prefill" else embeds.reshape(len(ids), 1, -1))
        self._state("kv_state_begin_forward", self.tvm_ffi.Shape(slots), self.tvm_ffi.Shape(lengths))
        try:
            out = self.m[fn](self.tvm_ffi.from_dlpack(embeds), self.kv, *self.weights[fn])
        finally:
            self._state("kv_state_end_forward")
        return np.from_dlpack(out[0]).reshape(rows, -1)

    def _probe_vocab(self):
        self._state("kv_state_add_sequence", 0)
        try:
            return self._forward("prefill", [0], [1], [0], 1).shape[-1]
        finally:
            self._state("kv_state_remove_sequence", 0)

    def submit(self, prompt, max_tokens, temperature, top_p, seed, emit, stream=True):
        """Queues a request (checked first: BadRequest for what can never run)."""
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise BadRequest("prompt must be a non-empty list of token ids")
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise BadRequest(f"token id {bad[0]} is outside the model's vocabulary (ids 0..{self.vocab - 1})")
        if len(prompt) + max_tokens > self.max_total:
            raise BadRequest(f"prompt and max_tokens ({len(prompt)} + {max_tokens}) exceed the KV cache's {self.max_total} tokens")
        seq = Sequence(prompt, max_tokens, temperature, top_p, seed, emit, stream)
        self.waiting.put(seq)
        return seq

    def _sample(self, seq, logits):
        if seq.temperature <= 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / seq.temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        if seq.top_p < 1.0:
            order = np.argsort(-p)
            keep = order[: int(np.searchsorted(np.cumsum(p[order]), seq.top_p) + 1)]
            mask = np.zeros_like(p)
            mask[keep] = p[keep]
            p = mask / mask.sum()
        return int(seq.rng.choice(len(p), p=p))

    def _finish(self, seq, error=None):
        if seq.cancelled and len(seq.tokens) < seq.max_tokens:
            self.cancelled += 1
        if seq in self.running:
            self.running.remove(seq)
        if seq.slot is not None:
            self._state("kv_state_remove_sequence", seq.slot)
            self.free_slots.append(seq.slot)
            self.reserved -= len(seq.prompt) + seq.max_tokens
            seq.slot = None
            self._count_pages()
        seq.emit(None, error)

    def _admit(self):
        """Takes waiting sequences while the batch and the cache have room; prefills each."""
        block = not self.running
        while len(self.running) < self.max_batch:
            try:
                seq = self.waiting.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            block = False
            if seq is None:
                self.stopped = True
                return
            if seq.cancelled:
                seq.emit(None, None)
                continue
            need = len(seq.prompt) + seq.max_tokens
            if self.reserved + need > self.max_total:
                self.waiting.put(seq)  # waits for running sequences to finish
                return
            seq.slot = self.free_slots.pop()
            self.reserved += need
            self._state("kv_state_add_sequence", seq.slot)
            try:
                for start in range(0, len(seq.prompt), self.chunk):
                    part = seq.prompt[start:start + self.chunk]
                    logits = self._forward("prefill", [seq.slot], [len(part)], part, 1)
            except Exception as e:  # noqa: BLE001 -- reported to that request
                self._finish(seq, f"{type(e).__name__}: {e}")
                continue
            self.running.append(seq)
            self._step_done(seq, self._sample(seq, logits[0]))

    def _step_done(self, seq, token):
        seq.tokens.append(token)
        if seq.stream:
            seq.emit(token, None)
        if seq.cancelled or len(seq.tokens) >= seq.max_tokens:
            self._finish(seq)

    def _loop(self):
        while not self.stopped:
            if not self.running:
                self._count_pages()
            self._admit()
            for seq in [s for s in self.running if s.cancelled]:
                self._finish(seq)
            if not self.running:
                continue
            batch = list(self.running)
            try:
                logits = self._forward("decode", [s.slot for s in batch], [1] * len(batch), [s.tokens[-1] for s in batch], len(batch))
            except Exception as e:  # noqa: BLE001
                for seq in batch:
                    self._finish(seq, f"{type(e).__name__}: {e}")
                continue
            for seq, row in zip(batch, logits):
                self._step_done(seq, self._sample(seq, row))

    def _count_pages(self):
        # On the engine thread (the KV cache is not to be used from two threads at once), when
        # sequences come or go or the engine idles, not on every decode step.
        self.pages = int(self.call("vm.builtin.attention_kv_cache_get_num_available_pages", self.kv))

    def stats(self):
        """Sequences running and waiting, tokens reserved, free pages (as of the last time a
        sequence came or went), and sequences cancelled because their client went away."""
        return {"running": len(self.running), "waiting": self.waiting.qsize(), "reserved_tokens": self.reserved,
                "available_pages": self.pages, "cancelled": self.cancelled}

    def stop(self):
        self.waiting.put(None)


def is_llm(path):
    exec_bytes = _elf_section(path, b".rvm_exec") or b""
    return all(name.encode() in exec_bytes for name in ("create_paged_kv_cache", "embed", "prefill", "decode"))


# ---- Ray Serve ---------------------------------------------------------------------------------------


def _json(status, payload):
    from starlette.responses import JSONResponse

    return JSONResponse(payload, status_code=status)


class Replica:
    """One Ray Serve replica of a model: routes the Open Inference Protocol (tensor models) or
    the completions API (LLMs)."""

    def __init__(self, model, name, threads, max_batch_size, batch_wait_s, max_body_bytes, llm_options):
        import concurrent.futures

        import ray

        data = ray.get(model) if isinstance(model, ray.ObjectRef) else model
        self.dir = tempfile.TemporaryDirectory(prefix="relaxc-serve-")
        self.path = os.path.join(self.dir.name, "model.so")
        with open(self.path, "wb") as f:
            f.write(data)
        self.name, self.max_body = name, max_body_bytes
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="relaxc")
        self.llm = Engine(self.path, **llm_options) if is_llm(self.path) else None
        self.model = None if self.llm else TensorModel(self.path)
        self.batching = bool(self.model) and max_batch_size > 1 and batchable(self.model.signature)
        self.batched_requests = 0  # requests that ran in a call together with others
        if self.batching:
            from ray import serve

            self._batched = serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_s)(self._infer_batch)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def _infer_batch(self, requests):
        """Ray Serve's batch: the requests' inputs concatenated along the batch dimension, one
        call, the results split back. A batch that fails runs its requests one by one, so each
        gets its own answer or error."""
        if len(requests) == 1:
            return [await self._infer_one(requests[0])]
        self.batched_requests += len(requests)
        sizes = [r[0].shape[0] for r in requests]
        joined = [np.concatenate([r[i] for r in requests]) for i in range(len(requests[0]))]
        try:
            outputs = await self._run(self.model.infer, joined)
        except BadRequest:
            return [await self._infer_one(r) for r in requests]
        bounds = np.cumsum([0] + sizes)
        return [[o[bounds[k]:bounds[k + 1]] for o in outputs] for k in range(len(requests))]

    async def _infer_one(self, arrays):
        try:
            return await self._run(self.model.infer, arrays)
        except BadRequest as e:
            return e

    async def __call__(self, request):
        path = request.url.path.rstrip("/")
        try:
            if path in ("/v2/health/live", "/v2/health/ready", "/health"):
                return _json(200, {"live": True, "ready": True})
            if self.llm:
                return await self._llm_route(request, path)
            return await self._tensor_route(request, path)
        except BadRequest as e:
            return _json(400, {"error": str(e)})

    async def _tensor_route(self, request, path):
        base = f"/v2/models/{self.name}"
        if path in (base, f"{base}/versions/1") and request.method == "GET":
            return _json(200, model_metadata(self.name, self.model.signature))
        if path == "/v2/relaxc/stats" and request.method == "GET":
            return _json(200, {"batching": self.batching, "batched_requests": self.batched_requests})
        if path == f"{base}/ready" and request.method == "GET":
            return _json(200, {"name": self.name, "ready": True})
        if path in (f"{base}/infer", f"{base}/versions/1/infer") and request.method == "POST":
            body = await request.body()
            arrays = parse_infer_request(body, self.model.signature, self.max_body)
            first = {a.shape[0] if a.ndim else None for a in arrays}
            if self.batching and len(first) == 1 and None not in first:
                result = await self._batched(arrays)
            else:
                result = await self._infer_one(arrays)
            if isinstance(result, BadRequest):
                raise result
            return _json(200, infer_response(self.name, self.model.signature, result))
        return _json(404, {"error": f"no route {request.method} {path} (model {self.name!r})"})

    async def _llm_route(self, request, path):
        if path == "/v1/relaxc/stats" and request.method == "GET":
            return _json(200, self.llm.stats())
        if path == "/v1/models" and request.method == "GET":
            return _json(200, {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "relaxc"}]})
        if path != "/v1/completions" or request.method != "POST":
            return _json(404, {"error": f"no route {request.method} {path} (LLM {self.name!r}: POST /v1/completions)"})
        body = await request.body()
        if len(body) > self.max_body:
            raise BadRequest(f"request body of {len(body)} bytes is over the server's limit of {self.max_body}")
        try:
            req = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"malformed JSON: {e}") from None
        if not isinstance(req, dict):
            raise BadRequest("a completion request is a JSON object")
        prompt = req.get("prompt")
        if isinstance(prompt, str):
            raise BadRequest("prompt must be a list of token ids: this server has no tokenizer")
        max_tokens, temperature = req.get("max_tokens", 16), req.get("temperature", 1.0)
        top_p, seed, stream = req.get("top_p", 1.0), req.get("seed"), bool(req.get("stream", False))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise BadRequest("max_tokens must be a positive integer")
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise BadRequest("temperature must be a number >= 0")
        if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise BadRequest("top_p must be in (0, 1]")
        if seed is not None and (not isinstance(seed, int) or seed < 0):
            raise BadRequest("seed must be a non-negative integer")
        if req.get("n", 1) != 1:
            raise BadRequest("n must be 1")
        loop = asyncio.get_running_loop()
        events = asyncio.Queue()

        def emit(token, error):
            loop.call_soon_threadsafe(events.put_nowait, (token, error))

        seq = self.llm.submit(prompt, max_tokens, float(temperature), float(top_p), seed, emit, stream)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(tokens, finish):
            return {"id": cid, "object": "text_completion", "created": created, "model": self.name,
                    "choices": [{"index": 0, "text": "", "token_ids": tokens, "finish_reason": finish}]}

        if stream:
            from starlette.responses import StreamingResponse

            async def events_out():
                try:
                    while True:
                        token, error = await events.get()
                        if error:
                            yield f"data: {json.dumps({'error': error})}\n\n"
                            return
                        if token is None:
                            yield "data: [DONE]\n\n"
                            return
                        done = len(seq.tokens) >= max_tokens and events.empty()
                        yield f"data: {json.dumps(chunk([token], 'length' if done else None))}\n\n"
                finally:
                    seq.cancelled = True  # the client went away (or the stream ended): free its pages

            return StreamingResponse(events_out(), media_type="text/event-stream")
        try:
            token, error = await events.get()  # the end: the tokens are in seq.tokens
            if error:
                return _json(500, {"error": error})
        finally:
            seq.cancelled = True
        tokens = list(seq.tokens)
        body = chunk(tokens, "length")
        body["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(tokens), "total_tokens": len(prompt) + len(tokens)}
        return _json(200, body)


def app(model_path, name=None, replicas=1, threads_per_replica=1, max_batch_size=8, batch_wait_ms=2.0,
        max_body_bytes=64 << 20, llm_options=None, num_cpus=None):
    """A Ray Serve application serving `model_path` (call inside a Ray session: ray.init first)."""
    import ray
    from ray import serve

    name = name or os.path.splitext(os.path.basename(model_path))[0]
    with open(model_path, "rb") as f:
        model = ray.put(f.read())
    deployment = serve.deployment(
        Replica,
        name=name,
        num_replicas=replicas,
        max_ongoing_requests=256,
        ray_actor_options={"num_cpus": threads_per_replica if num_cpus is None else num_cpus},
    )
    return deployment.bind(model, name, threads_per_replica, max_batch_size, batch_wait_ms / 1000.0, max_body_bytes,
                           llm_options or {})


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m relaxc.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a model .so built by relaxc compile")
    parser.add_argument("--replicas", type=int, default=1, help="Ray Serve replicas (default 1)")
    parser.add_argument("--threads-per-replica", type=int, default=1, help="worker threads (and CPUs) per replica")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument("--name", help="model name in the URLs (default: the file name)")
    parser.add_argument("--address", help="join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting one")
    parser.add_argument("--max-batch-size", type=int, default=8, help="tensor models: requests batched together; LLMs: sequences decoded together")
    parser.add_argument("--batch-wait-ms", type=float, default=2.0, help="tensor models: how long a batch waits to fill")
    parser.add_argument("--max-body", type=int, default=64 << 20, help="largest request body in bytes")
    parser.add_argument("--kv-tokens", type=int, default=4096, help="LLMs: tokens the KV cache holds, over all sequences")
    parser.add_argument("--weights", help="LLMs exported with their weights as parameters: a tensor cache or safetensors "
                        "(a path every replica's node can read)")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.model):
        parser.error(f"{args.model}: no such file")
    if args.weights and not os.path.exists(args.weights):
        parser.error(f"--weights {args.weights}: no such file or directory")
    if args.replicas < 1 or args.threads_per_replica < 1 or args.max_batch_size < 1:
        parser.error("--replicas, --threads-per-replica and --max-batch-size must be at least 1")
    try:
        signature(args.model) if not is_llm(args.model) else None
    except ValueError as e:
        parser.error(str(e))

    import ray
    from ray import serve

    if args.address:
        ray.init(address=args.address, logging_level="ERROR")
    else:
        # One machine: room for every replica's threads, whatever the core count; Ray's own
        # services on loopback too when the HTTP address is.
        loopback = args.host in ("127.0.0.1", "localhost", "::1")
        ray.init(num_cpus=max(os.cpu_count() or 1, args.replicas * args.threads_per_replica),
                 include_dashboard=False, logging_level="ERROR",
                 **({"_node_ip_address": "127.0.0.1"} if loopback else {}))
    name = args.name or os.path.splitext(os.path.basename(args.model))[0]
    serve.start(http_options={"host": args.host, "port": args.port})
    application = app(args.model, name, args.replicas, args.threads_per_replica, args.max_batch_size, args.batch_wait_ms,
                      args.max_body, {"max_batch": args.max_batch_size, "max_total_seq_len": args.kv_tokens,
                                      "weights": os.path.abspath(args.weights) if args.weights else None})
    serve.run(application, name=name, route_prefix="/")
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


if __name__ == "__main__":
    sys.exit(main())
