"""The Ray Serve deployment: a replica loads the model once through tvm-ffi and answers HTTP,
tensor models over the Open Inference Protocol (relaxc.serve.inference, with Ray Serve's batching
where the model allows it) and LLMs over OpenAI's completions (relaxc.serve.openai) on its engine
(relaxc.serve.engine); app() binds it for a Ray Serve application."""

import asyncio
import os
import tempfile

import numpy as np

from .engine import Engine, is_llm
from .inference import (
    BadRequest,
    TensorModel,
    batchable,
    infer_response,
    model_metadata,
    parse_infer_request,
)
from .openai import Routes, error_body
from .text import Tokenizer


def _json(status, payload):
    from starlette.responses import JSONResponse

    return JSONResponse(payload, status_code=status)


class Replica:
    """One Ray Serve replica of a model: routes the Open Inference Protocol (tensor models) or
    the completions API (LLMs)."""

    def __init__(
        self,
        model,
        name,
        threads,
        max_batch_size,
        batch_wait_s,
        max_body_bytes,
        llm_options,
    ):
        import concurrent.futures

        import ray

        data = ray.get(model) if isinstance(model, ray.ObjectRef) else model
        self.dir = tempfile.TemporaryDirectory(prefix="relaxc-serve-")
        self.path = os.path.join(self.dir.name, "model.so")
        with open(self.path, "wb") as f:
            f.write(data)
        self.name, self.max_body = name, max_body_bytes
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="relaxc")
        llm_options = dict(llm_options)
        tokenizer = llm_options.pop("tokenizer", None)
        self.llm = Engine(self.path, **llm_options) if is_llm(self.path) else None
        if self.llm:
            self.routes = Routes(self.llm, self._tokenizer(tokenizer), name, max_body_bytes)
        self.model = None if self.llm else TensorModel(self.path)
        self.batching = bool(self.model) and max_batch_size > 1 and batchable(self.model.signature)
        self.batched_requests = 0  # requests that ran in a call together with others
        if self.batching:
            from ray import serve

            self._batched = serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_s)(
                self._infer_batch
            )
        # Everything above has read its files (the model is mapped, the tokenizer parsed): remove
        # them now. Ray ends replicas with SIGKILL, which no finalizer survives, and a copy of the
        # model per replica was left in /tmp on every shutdown (0.6 GB each for the mid-size Llama).
        self.dir.cleanup()

    def _tokenizer(self, files):
        """The tokenizer from its files' contents ({"tokenizer.json": bytes, maybe
        "tokenizer_config.json": bytes}), written beside the model."""
        import ray

        if files is None:
            return None
        files = ray.get(files) if isinstance(files, ray.ObjectRef) else files
        for name, data in files.items():
            with open(os.path.join(self.dir.name, name), "wb") as f:
                f.write(data)
        return Tokenizer(os.path.join(self.dir.name, "tokenizer.json"))

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
        return [[o[bounds[k] : bounds[k + 1]] for o in outputs] for k in range(len(requests))]

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
            return _json(400, error_body(str(e)) if self.llm else {"error": str(e)})

    async def _tensor_route(self, request, path):
        base = f"/v2/models/{self.name}"
        if path in (base, f"{base}/versions/1") and request.method == "GET":
            return _json(200, model_metadata(self.name, self.model.signature))
        if path == "/v2/relaxc/stats" and request.method == "GET":
            return _json(
                200,
                {"batching": self.batching, "batched_requests": self.batched_requests},
            )
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
        if path == "/metrics" and request.method == "GET":
            from starlette.responses import PlainTextResponse

            text = self.llm.metrics_text(self.name)
            return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")
        if path == "/v1/relaxc/stats" and request.method == "GET":
            import ray

            return _json(200, {**self.llm.stats(), "node": ray.get_runtime_context().get_node_id()})
        return await self.routes.handle(request, path)


def app(
    model_path,
    name=None,
    replicas=1,
    threads_per_replica=1,
    max_batch_size=8,
    batch_wait_ms=2.0,
    max_body_bytes=64 << 20,
    llm_options=None,
    num_cpus=None,
):
    """A Ray Serve application serving `model_path` (call inside a Ray session: ray.init first)."""
    import ray
    from ray import serve

    name = name or os.path.splitext(os.path.basename(model_path))[0]
    with open(model_path, "rb") as f:
        model = ray.put(f.read())
    llm_options = dict(llm_options or {})
    if llm_options.get("tokenizer"):
        llm_options["tokenizer"] = ray.put(tokenizer_files(llm_options["tokenizer"]))
    deployment = serve.deployment(
        Replica,
        name=name,
        num_replicas=replicas,
        max_ongoing_requests=256,
        ray_actor_options={"num_cpus": threads_per_replica if num_cpus is None else num_cpus},
    )
    return deployment.bind(
        model,
        name,
        threads_per_replica,
        max_batch_size,
        batch_wait_ms / 1000.0,
        max_body_bytes,
        llm_options,
    )


def tokenizer_files(path):
    """The contents of a tokenizer.json and of its tokenizer_config.json (if there is one), to
    send to the replicas (which may be on other nodes)."""
    from .text import config_path_for

    files = {}
    with open(path, "rb") as f:
        files["tokenizer.json"] = f.read()
    config = config_path_for(path)
    if config:
        with open(config, "rb") as f:
            files["tokenizer_config.json"] = f.read()
    return files
