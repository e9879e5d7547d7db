"""The Ray Serve deployment: a replica loads the model once through tvm-ffi and answers HTTP,
tensor models over the Open Inference Protocol (relaxc.serve.inference, with Ray Serve's batching
where the model allows it) and LLMs over OpenAI's completions (relaxc.serve.openai) on its engine
(relaxc.serve.engine); app() binds it for a Ray Serve application."""

import asyncio
import json
import os
import tempfile
import time
import uuid

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
from .openai import completion_chunk, parse_completion_request


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
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="relaxc"
        )
        self.llm = Engine(self.path, **llm_options) if is_llm(self.path) else None
        self.model = None if self.llm else TensorModel(self.path)
        self.batching = (
            bool(self.model) and max_batch_size > 1 and batchable(self.model.signature)
        )
        self.batched_requests = 0  # requests that ran in a call together with others
        if self.batching:
            from ray import serve

            self._batched = serve.batch(
                max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_s
            )(self._infer_batch)

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
        joined = [
            np.concatenate([r[i] for r in requests]) for i in range(len(requests[0]))
        ]
        try:
            outputs = await self._run(self.model.infer, joined)
        except BadRequest:
            return [await self._infer_one(r) for r in requests]
        bounds = np.cumsum([0] + sizes)
        return [
            [o[bounds[k] : bounds[k + 1]] for o in outputs]
            for k in range(len(requests))
        ]

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
            return _json(
                200,
                {"batching": self.batching, "batched_requests": self.batched_requests},
            )
        if path == f"{base}/ready" and request.method == "GET":
            return _json(200, {"name": self.name, "ready": True})
        if (
            path in (f"{base}/infer", f"{base}/versions/1/infer")
            and request.method == "POST"
        ):
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
        return _json(
            404, {"error": f"no route {request.method} {path} (model {self.name!r})"}
        )

    async def _llm_route(self, request, path):
        if path == "/v1/relaxc/stats" and request.method == "GET":
            return _json(200, self.llm.stats())
        if path == "/v1/models" and request.method == "GET":
            return _json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": self.name, "object": "model", "owned_by": "relaxc"}
                    ],
                },
            )
        if path != "/v1/completions" or request.method != "POST":
            return _json(
                404,
                {
                    "error": f"no route {request.method} {path} (LLM {self.name!r}: POST /v1/completions)"
                },
            )
        body = await request.body()
        if len(body) > self.max_body:
            raise BadRequest(
                f"request body of {len(body)} bytes is over the server's limit of {self.max_body}"
            )
        try:
            req = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"malformed JSON: {e}") from None
        fields = parse_completion_request(req)
        prompt, max_tokens, stream = (
            fields["prompt"],
            fields["max_tokens"],
            fields["stream"],
        )
        loop = asyncio.get_running_loop()
        events = asyncio.Queue()

        def emit(token, error):
            loop.call_soon_threadsafe(events.put_nowait, (token, error))

        seq = self.llm.submit(
            prompt,
            max_tokens,
            fields["temperature"],
            fields["top_p"],
            fields["seed"],
            emit,
            stream,
        )
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(tokens, finish):
            return completion_chunk(cid, created, self.name, tokens, finish)

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
            _, error = await events.get()  # the end: the tokens are in seq.tokens
            if error:
                return _json(500, {"error": error})
        finally:
            seq.cancelled = True
        tokens = list(seq.tokens)
        body = chunk(tokens, "length")
        body["usage"] = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(tokens),
            "total_tokens": len(prompt) + len(tokens),
        }
        return _json(200, body)


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
    deployment = serve.deployment(
        Replica,
        name=name,
        num_replicas=replicas,
        max_ongoing_requests=256,
        ray_actor_options={
            "num_cpus": threads_per_replica if num_cpus is None else num_cpus
        },
    )
    return deployment.bind(
        model,
        name,
        threads_per_replica,
        max_batch_size,
        batch_wait_ms / 1000.0,
        max_body_bytes,
        llm_options or {},
    )
