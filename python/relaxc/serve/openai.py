"""OpenAI's completions API as relaxc's LLM replicas speak it: a request's fields checked (a
BadRequest, hence a 400, for each that is wrong) and the response objects, whole or as the chunks
of a stream."""

from .inference import BadRequest


def parse_completion_request(req):
    """The fields of a /v1/completions request (a parsed JSON object), checked: a dict of prompt,
    max_tokens, temperature, top_p, seed and stream."""
    if not isinstance(req, dict):
        raise BadRequest("a completion request is a JSON object")
    prompt = req.get("prompt")
    if isinstance(prompt, str):
        raise BadRequest(
            "prompt must be a list of token ids: this server has no tokenizer"
        )
    max_tokens, temperature = req.get("max_tokens", 16), req.get("temperature", 1.0)
    top_p, seed, stream = (
        req.get("top_p", 1.0),
        req.get("seed"),
        bool(req.get("stream", False)),
    )
    if (
        not isinstance(max_tokens, int)
        or isinstance(max_tokens, bool)
        or max_tokens < 1
    ):
        raise BadRequest("max_tokens must be a positive integer")
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise BadRequest("temperature must be a number >= 0")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise BadRequest("top_p must be in (0, 1]")
    if seed is not None and (not isinstance(seed, int) or seed < 0):
        raise BadRequest("seed must be a non-negative integer")
    if req.get("n", 1) != 1:
        raise BadRequest("n must be 1")
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": float(temperature),
        "top_p": float(top_p),
        "seed": seed,
        "stream": stream,
    }


def completion_chunk(cid, created, model, tokens, finish):
    """A text_completion object (or one chunk of a stream) carrying token ids."""
    return {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "text": "", "token_ids": tokens, "finish_reason": finish}
        ],
    }
