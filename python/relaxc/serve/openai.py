"""OpenAI's API as relaxc's LLM replicas speak it: /v1/completions, /v1/chat/completions and
/v1/models. A request's fields are checked (a 400 with OpenAI's error object for each that is
wrong), its prompt is tokenized (a chat through the model's chat template), its choices run on
the engine, and the answer goes back whole or as a stream of OpenAI's events ending in [DONE]."""

import asyncio
import json
import time
import uuid

from .inference import BadRequest

MAX_N = 16
MAX_LOGPROBS = 20


def error_body(message, kind="invalid_request_error", param=None):
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _sampling(req, chat):
    """The fields both endpoints share, checked."""
    max_tokens = req.get("max_completion_tokens") if chat and req.get("max_tokens") is None else req.get("max_tokens")
    max_tokens = 16 if max_tokens is None else max_tokens
    temperature = 1.0 if req.get("temperature") is None else req.get("temperature")
    top_p = 1.0 if req.get("top_p") is None else req.get("top_p")
    seed, n = req.get("seed"), 1 if req.get("n") is None else req.get("n")
    if not _is_int(max_tokens) or max_tokens < 1:
        raise BadRequest("max_tokens must be a positive integer")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 <= temperature <= 2:
        raise BadRequest("temperature must be a number from 0 to 2")
    if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not 0 < top_p <= 1:
        raise BadRequest("top_p must be in (0, 1]")
    if seed is not None and not _is_int(seed):
        raise BadRequest("seed must be an integer")
    if not _is_int(n) or not 1 <= n <= MAX_N:
        raise BadRequest(f"n must be an integer from 1 to {MAX_N}")
    stop = req.get("stop")
    stop = [stop] if isinstance(stop, str) else [] if stop is None else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop must be a non-empty string or a list of them")
    stop_ids = req.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) for t in stop_ids):
        raise BadRequest("stop_token_ids must be a list of token ids")
    if chat:
        logprobs = None
        if req.get("logprobs"):
            top = req.get("top_logprobs") or 0
            if not _is_int(top) or not 0 <= top <= MAX_LOGPROBS:
                raise BadRequest(f"top_logprobs must be an integer from 0 to {MAX_LOGPROBS}")
            logprobs = top
    else:
        logprobs = req.get("logprobs")
        if logprobs is not None and (not _is_int(logprobs) or not 0 <= logprobs <= MAX_LOGPROBS):
            raise BadRequest(f"logprobs must be an integer from 0 to {MAX_LOGPROBS}")
    options = req.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object")
    return {
        "max_tokens": max_tokens,
        "temperature": float(temperature),
        "top_p": float(top_p),
        "seed": seed,
        "n": n,
        "stream": bool(req.get("stream", False)),
        "stop": stop,
        "stop_ids": stop_ids,
        "logprobs": logprobs,
        "ignore_eos": bool(req.get("ignore_eos", False)),
        "include_usage": bool(options.get("include_usage", False)),
    }


def _message_text(i, message):
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadRequest(f"messages[{i}] must be an object with a role")
    content = message.get("content")
    if content is None:
        return {"role": message["role"], "content": ""}
    if isinstance(content, list):  # content parts: only text
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"messages[{i}]: only text content parts are supported")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content must be a string or a list of text parts")
    return {**message, "content": content}


class Routes:
    """The OpenAI endpoints of one LLM replica: `engine` runs the sequences, `tokenizer` (a
    relaxc.serve.text.Tokenizer, or None: token-id prompts only) reads and writes text; bodies
    over `max_body` bytes are refused."""

    def __init__(self, engine, tokenizer, name, max_body):
        self.engine, self.tokenizer, self.name, self.max_body = engine, tokenizer, name, max_body

    def models(self):
        return {
            "object": "list",
            "data": [{"id": self.name, "object": "model", "created": 0, "owned_by": "relaxc"}],
        }

    def _check_model(self, req):
        model = req.get("model")
        if model is not None and model != self.name:
            raise BadRequest(f"model {model!r} is not served here (this server serves {self.name!r})")

    def _prompt(self, req, chat):
        if chat:
            messages = req.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages must be a non-empty list")
            if self.tokenizer is None:
                raise BadRequest("chat needs the model's tokenizer: start the server with --tokenizer")
            messages = [_message_text(i, m) for i, m in enumerate(messages)]
            try:
                text = self.tokenizer.apply_chat_template(messages)
            except Exception as e:
                raise BadRequest(f"the chat template failed on these messages: {e}") from None
            return self.tokenizer.encode(text, special=False)
        prompt = req.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise BadRequest(
                    "prompt must be a list of token ids: this server has no tokenizer (start it with --tokenizer)"
                )
            if not prompt:
                raise BadRequest("prompt is empty")
            return self.tokenizer.encode(prompt)
        if not isinstance(prompt, list) or not prompt or not all(_is_int(t) for t in prompt):
            raise BadRequest("prompt must be a string or a non-empty list of token ids (one prompt per request)")
        return prompt

    def _token_text(self, token):
        if self.tokenizer is None:
            return str(token)
        return self.tokenizer.hf.id_to_token(token) or str(token)

    def _logprobs(self, items, chat):
        if chat:

            def entry(t, lp):
                text = self._token_text(t)
                return {"token": text, "logprob": lp, "bytes": list(text.encode())}

            return {
                "content": [
                    {
                        **entry(i["token"], i["logprob"]),
                        "top_logprobs": [entry(t, lp) for t, lp in i["top_logprobs"]],
                    }
                    for i in items
                ]
            }
        return {
            "tokens": [self._token_text(i["token"]) for i in items],
            "token_logprobs": [i["logprob"] for i in items],
            "top_logprobs": [{self._token_text(t): lp for t, lp in i["top_logprobs"]} for i in items],
        }

    async def handle(self, request, path):
        """Answers one request to /v1/...: a starlette response. BadRequest becomes a 400."""
        if path == "/v1/models" and request.method == "GET":
            return _json(200, self.models())
        if path == f"/v1/models/{self.name}" and request.method == "GET":
            return _json(200, self.models()["data"][0])
        chat = path == "/v1/chat/completions"
        if not (chat or path == "/v1/completions") or request.method != "POST":
            return _json(
                404,
                error_body(
                    f"no route {request.method} {path} (LLM {self.name!r}: POST /v1/completions, "
                    "POST /v1/chat/completions, GET /v1/models)",
                    "not_found_error",
                ),
            )
        body = await request.body()
        if len(body) > self.max_body:
            raise BadRequest(f"request body of {len(body)} bytes is over the server's limit of {self.max_body}")
        try:
            req = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"malformed JSON: {e}") from None
        if not isinstance(req, dict):
            raise BadRequest("a request is a JSON object")
        self._check_model(req)
        fields = _sampling(req, chat)
        prompt = self._prompt(req, chat)
        return await self._run(prompt, fields, chat)

    async def _run(self, prompt, f, chat):
        loop = asyncio.get_running_loop()
        events = asyncio.Queue()
        stop_ids = list(f["stop_ids"])
        if self.tokenizer is not None and not f["ignore_eos"]:
            stop_ids += sorted(self.tokenizer.eos_ids)
        seqs = []
        for index in range(f["n"]):

            def emit(item, error, index=index):
                loop.call_soon_threadsafe(events.put_nowait, (index, item, error))

            seed = None if f["seed"] is None else f["seed"] + index
            text = self.tokenizer.stream(f["stop"]) if self.tokenizer is not None else None
            try:
                seqs.append(
                    self.engine.submit(
                        prompt,
                        f["max_tokens"],
                        f["temperature"],
                        f["top_p"],
                        seed,
                        emit,
                        f["stream"],
                        stop_ids=stop_ids,
                        text=text,
                        logprobs=f["logprobs"],
                    )
                )
            except BadRequest:
                for s in seqs:
                    s.cancelled = True
                raise
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": self.name,
        }

        def usage():
            generated = sum(len(s.tokens) for s in seqs)
            return {
                "prompt_tokens": len(prompt),
                "completion_tokens": generated,
                "total_tokens": len(prompt) + generated,
            }

        if f["stream"]:
            from starlette.responses import StreamingResponse

            return StreamingResponse(
                self._stream(events, seqs, head, chat, f, usage),
                media_type="text/event-stream",
            )
        try:
            ended = 0
            while ended < len(seqs):
                _, item, error = await events.get()
                if item is None:
                    ended += 1
                    if error:
                        return _json(500, error_body(error, "server_error"))
        finally:
            for s in seqs:
                s.cancelled = True
        choices = []
        for i, s in enumerate(seqs):
            lp = self._logprobs(s.token_logprobs, chat) if s.logprobs is not None else None
            if chat:
                choice = {
                    "index": i,
                    "message": {"role": "assistant", "content": s.text},
                }
            else:
                choice = {"index": i, "text": s.text, "token_ids": list(s.tokens)}
            choices.append({**choice, "logprobs": lp, "finish_reason": s.finish_reason})
        kind = "chat.completion" if chat else "text_completion"
        return _json(200, {**head, "object": kind, "choices": choices, "usage": usage()})

    async def _stream(self, events, seqs, head, chat, f, usage):
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(choice):
            return f"data: {json.dumps({**head, 'object': kind, 'choices': [choice]})}\n\n"

        try:
            if chat:
                for i in range(len(seqs)):
                    yield event(
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    )
            ended = 0
            while ended < len(seqs):
                index, item, error = await events.get()
                seq = seqs[index]
                if error:
                    yield f"data: {json.dumps(error_body(error, 'server_error'))}\n\n"
                    return
                if item is None:
                    ended += 1
                    continue
                lp = self._logprobs([item], chat) if seq.logprobs is not None else None
                if chat:
                    choice = {
                        "index": index,
                        "delta": {"content": item["text"]} if item["text"] else {},
                    }
                else:
                    choice = {
                        "index": index,
                        "text": item["text"],
                        "token_ids": [item["token"]],
                    }
                yield event({**choice, "logprobs": lp, "finish_reason": item["finish_reason"]})
            if f["include_usage"]:
                yield f"data: {json.dumps({**head, 'object': kind, 'choices': [], 'usage': usage()})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            for s in seqs:
                s.cancelled = True  # the client went away (or the stream ended): free the pages


def _json(status, payload):
    from starlette.responses import JSONResponse

    return JSONResponse(payload, status_code=status)
