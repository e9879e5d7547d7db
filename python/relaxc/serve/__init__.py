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

from .cli import main
from .deployment import Replica, app
from .engine import Engine, Sequence, is_llm
from .inference import (
    BadRequest,
    TensorModel,
    batchable,
    infer_response,
    model_metadata,
    parse_infer_request,
    signature,
)

__all__ = [
    "BadRequest",
    "Engine",
    "Replica",
    "Sequence",
    "TensorModel",
    "app",
    "batchable",
    "infer_response",
    "is_llm",
    "main",
    "model_metadata",
    "parse_infer_request",
    "signature",
]
