"""The LLM engine of a replica: one paged KV cache driven through the model's tvm-ffi entry points
on a thread of its own. Requests join the running batch at the next step; new prompts are
prefilled together where the model has MLC's batch_prefill (one call per chunk of the cache's
prefill size) and one by one where it has only prefill; every running sequence then decodes, one
token per step, in one call where decode's batch is symbolic and one call per sequence where the
export fixed it at 1. A call that fails is undone in the cache and retried one sequence at a
time, so an error fails only the request it belongs to. Finished or cancelled sequences are
removed and their pages freed."""

import queue
import threading
import time

import numpy as np

from .inference import BadRequest, _elf_section, signature
from .metrics import Metrics


class Sequence:
    """One completion (one choice of a request) in the engine.

    `emit(item, error)` is called on the engine thread: with a dict per token when streaming
    (token, text, finish_reason on the last, logprob and top_logprobs if asked), then once with item None at the end (error None, or a
    message). Without streaming only the end is sent (a wakeup of the server's event loop per
    token would cost more than the token); the results are then in tokens, text, logprobs and
    finish_reason."""

    def __init__(
        self,
        prompt,
        max_tokens,
        temperature,
        top_p,
        seed,
        emit,
        stream,
        stop_ids=(),
        text=None,
        logprobs=None,
    ):
        self.prompt, self.max_tokens = prompt, max_tokens
        self.temperature, self.top_p = temperature, top_p
        self.rng = np.random.default_rng(seed)
        self.emit, self.stream = emit, stream
        self.stop_ids = set(stop_ids)
        self.text_stream = text  # a relaxc.serve.text.TextStream, or None (token ids only)
        self.logprobs = logprobs  # None, or how many alternatives to report per token
        self.tokens, self.text, self.token_logprobs = [], "", []
        self.finish_reason = None
        self.cancelled = False
        self.slot = None
        self.prefilled = 0  # prompt tokens in the cache
        self.arrived, self.last_token_at = time.monotonic(), None


class Functions:
    """How the engine calls a model: which decode and prefill functions it has, and how many
    sequences one decode call takes (None: any number)."""

    def __init__(self, path, names):
        self.decode = "batch_decode" if "batch_decode" in names else "decode"
        self.batch_prefill = "batch_prefill" in names
        _, dims, _ = signature(path, self.decode)["inputs"][0]
        self.decode_batch = dims[0] if dims and isinstance(dims[0], int) else None
        if self.decode_batch is not None and self.decode_batch != 1:
            raise ValueError(
                f"{path}: {self.decode} takes exactly {self.decode_batch} sequences a call; "
                "relaxc.serve runs exports whose decode batch is symbolic or 1"
            )
        self.inputs = {
            "embed": 1,
            "prefill": 2,
            "decode": 2,
            "batch_prefill": 3,
            "batch_decode": 2,
        }


class Engine:
    """Runs an LLM's steps on one thread: new sequences are prefilled as they arrive, then every
    running sequence decodes, one token per step."""

    def __init__(
        self,
        path,
        max_batch=8,
        max_total_seq_len=4096,
        prefill_chunk=256,
        page_size=16,
        weights=None,
        run=True,
    ):
        import tvm_ffi

        self.tvm_ffi = tvm_ffi
        m = tvm_ffi.load_module(path)
        self.m = m
        self.call = m["relaxc_call"]
        names = [n for n in ("prefill", "decode", "batch_prefill", "batch_decode") if _has_function(path, n)]
        self.fns = Functions(path, names)
        # A model exported with its weights as parameters takes them after its inputs, by name
        # from a tensor cache, safetensors or GGUF (as `relaxc generate --weights`).
        self.weights = {
            fn: list(m["relaxc_weights"](weights, fn, self.fns.inputs[fn])) if weights else []
            for fn in ["embed", *names]
        }
        self.max_batch, self.max_total, self.chunk = (
            max_batch,
            max_total_seq_len,
            prefill_chunk,
        )
        shape = tvm_ffi.Shape
        self.kv = m["create_paged_kv_cache"](
            *[shape([v]) for v in (max_batch, max_total_seq_len, prefill_chunk, page_size, 0)]
        )
        self.waiting = queue.Queue()
        self.running = []
        self.reserved = 0
        self.cancelled = 0  # sequences ended early because their client went away
        self.failed = 0  # sequences ended by an error in their own step
        self.calls = {"prefill": 0, "batch_prefill": 0, "decode": 0}
        self.free_slots = list(range(max_batch))
        self.vocab = None
        self.vocab = self._probe_vocab()
        self.metrics = Metrics()
        self._count_pages()
        self.pages_total = self.pages  # nothing holds a page yet
        self.thread = threading.Thread(target=self._loop, name="relaxc-llm-engine", daemon=True)
        self.stopped = False
        if run:  # run=False: no engine thread, for measuring the model's steps directly
            self.thread.start()

    # ---- the model's calls ----------------------------------------------------------------------

    def _state(self, name, *args):
        return self.call("vm.builtin." + name, self.kv, *args)

    def _forward(self, fn, slots, lengths, ids, shape, *extra):
        """One step: the embeddings of `ids` shaped as `shape`, the cache's forward pass around the
        call. A call that fails after the cache took the tokens gives them back (popn), so the
        cache is as it was and the step can be retried."""
        tvm_ffi = self.tvm_ffi
        embeds = np.from_dlpack(self.m["embed"](tvm_ffi.from_dlpack(np.array(ids, "int32")), *self.weights["embed"]))
        embeds = np.ascontiguousarray(embeds.reshape(shape))
        self._state("kv_state_begin_forward", tvm_ffi.Shape(slots), tvm_ffi.Shape(lengths))
        try:
            out = self.m[fn](tvm_ffi.from_dlpack(embeds), *extra, self.kv, *self.weights[fn])
        except Exception:
            self._state("kv_state_end_forward")
            for slot, n in zip(slots, lengths):
                self._state("kv_state_popn", slot, n)
            raise
        self._state("kv_state_end_forward")
        logits = np.from_dlpack(out[0])
        return logits.reshape(-1, logits.shape[-1])

    def _probe_vocab(self):
        self._state("kv_state_add_sequence", 0)
        try:
            return self._forward("prefill", [0], [1], [0], (1, 1, -1)).shape[-1]
        finally:
            self._state("kv_state_remove_sequence", 0)

    # ---- requests ---------------------------------------------------------------------------------

    def submit(self, prompt, max_tokens, temperature, top_p, seed, emit, stream=True, **options):
        """Queues a request (checked first: BadRequest for what can never run). `options`:
        stop_ids, text (a TextStream) and logprobs, as Sequence takes them."""
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise BadRequest("prompt must be a non-empty list of token ids")
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise BadRequest(f"token id {bad[0]} is outside the model's vocabulary (ids 0..{self.vocab - 1})")
        if len(prompt) + max_tokens > self.max_total:
            raise BadRequest(
                f"prompt and max_tokens ({len(prompt)} + {max_tokens}) exceed the KV cache's {self.max_total} tokens"
            )
        seq = Sequence(prompt, max_tokens, temperature, top_p, seed, emit, stream, **options)
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
        if seq.cancelled and seq.finish_reason is None and error is None:
            self.cancelled += 1
            self.metrics.finished["abort"] += 1
        if error is not None:
            self.failed += 1
            self.metrics.finished["error"] += 1
        elif seq.finish_reason is not None:
            self.metrics.finished[seq.finish_reason] += 1
        if seq in self.running:
            self.running.remove(seq)
        if seq.slot is not None:
            self._state("kv_state_remove_sequence", seq.slot)
            self.free_slots.append(seq.slot)
            self.reserved -= len(seq.prompt) + seq.max_tokens
            seq.slot = None
            self._count_pages()
        seq.emit(None, error)

    def _step_done(self, seq, logits):
        token = self._sample(seq, logits)
        seq.tokens.append(token)
        now, m = time.monotonic(), self.metrics
        if seq.last_token_at is None:
            m.ttft.observe(now - seq.arrived)
            m.prompt_tokens += len(seq.prompt)
        else:
            m.tpot.observe(now - seq.last_token_at)
        seq.last_token_at = now
        m.generation_tokens += 1
        item = {"token": token, "text": ""}
        if seq.logprobs is not None:
            z = logits.astype(np.float64)
            lp = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
            top = np.argsort(-lp, kind="stable")[: seq.logprobs]
            item["logprob"] = float(lp[token])
            item["top_logprobs"] = [(int(t), float(lp[t])) for t in top]
            seq.token_logprobs.append(item)
        stopped = token in seq.stop_ids
        if not stopped and seq.text_stream is not None:
            item["text"], stopped = seq.text_stream.push(token)
        done = stopped or len(seq.tokens) >= seq.max_tokens
        if done and not stopped and seq.text_stream is not None:
            item["text"] += seq.text_stream.flush()
        seq.text += item["text"]
        if done:
            seq.finish_reason = "stop" if stopped else "length"
        item["finish_reason"] = seq.finish_reason
        if seq.stream:
            seq.emit(item, None)
        if done or seq.cancelled:
            self._finish(seq)

    def _isolated(self, batch, together, alone):
        """Runs `together(batch)`; if it fails, `alone(seq)` for each, so that an error fails its
        own sequence only. Each call returns the sequences it stepped and their logits."""
        try:
            return together(batch)
        except Exception as e:
            if len(batch) == 1:
                self._finish(batch[0], f"{type(e).__name__}: {e}")
                return [], []
        stepped, rows = [], []
        for seq in batch:
            try:
                s, r = alone(seq)
            except Exception as e:
                self._finish(seq, f"{type(e).__name__}: {e}")
                continue
            stepped += s
            rows += list(r)
        return stepped, rows

    # ---- prefill ------------------------------------------------------------------------------------

    def _prefill_one(self, seq):
        """The rest of seq's prompt, chunk by chunk, with prefill."""
        logits = None
        while seq.prefilled < len(seq.prompt):
            part = seq.prompt[seq.prefilled : seq.prefilled + self.chunk]
            logits = self._forward("prefill", [seq.slot], [len(part)], part, (1, len(part), -1))
            self.calls["prefill"] += 1
            seq.prefilled += len(part)
        return [seq], logits

    def _prefill_together(self, seqs):
        """Prompts in one batch_prefill call per chunk: each call takes the next part of as many
        prompts as fit. Returns the sequences whose prompts are done, and their last logits."""
        done, rows = [], []
        pending = list(seqs)
        while pending:
            parts, room = [], self.chunk
            for seq in pending:
                if room == 0:
                    break
                n = min(room, len(seq.prompt) - seq.prefilled)
                parts.append((seq, seq.prompt[seq.prefilled : seq.prefilled + n]))
                room -= n
            ids = [t for _, p in parts for t in p]
            positions = np.cumsum([len(p) for _, p in parts]).astype("int32") - 1
            logits = self._forward(
                "batch_prefill",
                [s.slot for s, _ in parts],
                [len(p) for _, p in parts],
                ids,
                (1, len(ids), -1),
                self.tvm_ffi.from_dlpack(positions),
            )
            self.calls["batch_prefill"] += 1
            for (seq, part), row in zip(parts, logits):
                seq.prefilled += len(part)
                if seq.prefilled == len(seq.prompt):
                    done.append(seq)
                    rows.append(row)
            pending = [s for s in pending if s.prefilled < len(s.prompt)]
        return done, rows

    def _prefill(self, seqs):
        if self.fns.batch_prefill:

            def together(batch):
                start = {id(s): s.prefilled for s in batch}
                try:
                    return self._prefill_together(batch)
                except Exception:
                    # Chunks that went through stay in the cache: give them back too, so each
                    # sequence starts again from its first token.
                    for s in batch:
                        if s.prefilled > start[id(s)]:
                            self._state("kv_state_popn", s.slot, s.prefilled - start[id(s)])
                            s.prefilled = start[id(s)]
                    raise

            done, rows = self._isolated(seqs, together, lambda s: self._prefill_together([s]))
        else:
            done, rows = [], []
            for seq in seqs:
                try:
                    _, logits = self._prefill_one(seq)
                except Exception as e:
                    self._finish(seq, f"{type(e).__name__}: {e}")
                    continue
                done.append(seq)
                rows.append(logits[0])
        for seq, row in zip(done, rows):
            self.running.append(seq)
            self._step_done(seq, row)

    def _admit(self):
        """Takes waiting sequences while the batch and the cache have room, and prefills them."""
        block = not self.running
        new = []
        while len(self.running) + len(new) < self.max_batch:
            try:
                seq = self.waiting.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                break
            block = False
            if seq is None:
                self.stopped = True
                break
            if seq.cancelled:
                seq.emit(None, None)
                continue
            need = len(seq.prompt) + seq.max_tokens
            if self.reserved + need > self.max_total:
                self.waiting.put(seq)  # waits for running sequences to finish
                break
            seq.slot = self.free_slots.pop()
            self.reserved += need
            self._state("kv_state_add_sequence", seq.slot)
            new.append(seq)
        if new:
            self._prefill(new)

    # ---- decode -------------------------------------------------------------------------------------

    def _decode(self, batch):
        logits = self._forward(
            self.fns.decode,
            [s.slot for s in batch],
            [1] * len(batch),
            [s.tokens[-1] for s in batch],
            (len(batch), 1, -1),
        )
        self.calls["decode"] += 1
        return batch, logits

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
            if self.fns.decode_batch == 1:
                stepped, rows = [], []
                for seq in batch:
                    s, r = self._isolated([seq], self._decode, self._decode)
                    stepped += s
                    rows += list(r)
            else:
                stepped, rows = self._isolated(batch, self._decode, lambda s: self._decode([s]))
            for seq, row in zip(stepped, rows):
                self._step_done(seq, row)

    def _count_pages(self):
        # On the engine thread (the KV cache is not to be used from two threads at once), when
        # sequences come or go or the engine idles, not on every decode step.
        self.pages = int(self.call("vm.builtin.attention_kv_cache_get_num_available_pages", self.kv))

    def stats(self):
        """Sequences running and waiting, tokens reserved, free pages (as of the last time a
        sequence came or went), sequences cancelled because their client went away or failed by
        an error of their own, and the model calls made."""
        return {
            "running": len(self.running),
            "waiting": self.waiting.qsize(),
            "reserved_tokens": self.reserved,
            "available_pages": self.pages,
            "cancelled": self.cancelled,
            "failed": self.failed,
            "calls": dict(self.calls),
            "decode_batch": self.fns.decode_batch,
        }

    def metrics_text(self, model_name):
        """GET /metrics: Prometheus's text format (relaxc.serve.metrics). KV pages as of the last
        time a sequence came or went."""
        used = self.pages_total - self.pages
        return self.metrics.render(model_name, len(self.running), self.waiting.qsize(), used, self.pages_total)

    def stop(self):
        self.waiting.put(None)


def _has_function(path, name):
    return bool(signature(path, name)["inputs"])


def is_llm(path):
    exec_bytes = _elf_section(path, b".rvm_exec") or b""
    return all(name.encode() in exec_bytes for name in ("create_paged_kv_cache", "embed", "prefill", "decode"))
