"""The LLM engine of a replica: one paged KV cache driven through the model's tvm-ffi entry points
on a thread of its own. Requests join the running batch at the next step (their prompts are
prefilled), every running sequence decodes in one batched step, and finished or cancelled
sequences are removed and their pages freed."""

import queue
import threading

import numpy as np

from .inference import BadRequest, _elf_section


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
        # A model exported with its weights as parameters takes them after its inputs, by name
        # from a tensor cache or safetensors (as `relaxc generate --weights`).
        self.weights = {
            fn: list(m["relaxc_weights"](weights, fn, n)) if weights else []
            for fn, n in (("embed", 1), ("prefill", 2), ("decode", 2))
        }
        self.max_batch, self.max_total, self.chunk = (
            max_batch,
            max_total_seq_len,
            prefill_chunk,
        )
        shape = tvm_ffi.Shape
        self.kv = m["create_paged_kv_cache"](
            *[
                shape([v])
                for v in (max_batch, max_total_seq_len, prefill_chunk, page_size, 0)
            ]
        )
        self.waiting = queue.Queue()
        self.running = []
        self.reserved = 0
        self.cancelled = 0  # sequences ended early because their client went away
        self.free_slots = list(range(max_batch))
        self.vocab = None
        self.vocab = self._probe_vocab()
        self._count_pages()
        self.thread = threading.Thread(
            target=self._loop, name="relaxc-llm-engine", daemon=True
        )
        self.stopped = False
        if run:  # run=False: no engine thread, for measuring the model's steps directly
            self.thread.start()

    def _state(self, name, *args):
        return self.call("vm.builtin." + name, self.kv, *args)

    def _forward(self, fn, slots, lengths, ids, rows):
        embeds = np.from_dlpack(
            self.m["embed"](
                self.tvm_ffi.from_dlpack(np.array(ids, "int32")), *self.weights["embed"]
            )
        )
        embeds = np.ascontiguousarray(
            embeds.reshape(1, len(ids), -1)
            if fn == "prefill"
            else embeds.reshape(len(ids), 1, -1)
        )
        self._state(
            "kv_state_begin_forward",
            self.tvm_ffi.Shape(slots),
            self.tvm_ffi.Shape(lengths),
        )
        try:
            out = self.m[fn](
                self.tvm_ffi.from_dlpack(embeds), self.kv, *self.weights[fn]
            )
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
        if not prompt or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            raise BadRequest("prompt must be a non-empty list of token ids")
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise BadRequest(
                f"token id {bad[0]} is outside the model's vocabulary (ids 0..{self.vocab - 1})"
            )
        if len(prompt) + max_tokens > self.max_total:
            raise BadRequest(
                f"prompt and max_tokens ({len(prompt)} + {max_tokens}) exceed the KV cache's {self.max_total} tokens"
            )
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
                    part = seq.prompt[start : start + self.chunk]
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
                logits = self._forward(
                    "decode",
                    [s.slot for s in batch],
                    [1] * len(batch),
                    [s.tokens[-1] for s in batch],
                    len(batch),
                )
            except Exception as e:  # noqa: BLE001
                for seq in batch:
                    self._finish(seq, f"{type(e).__name__}: {e}")
                continue
            for seq, row in zip(batch, logits):
                self._step_done(seq, self._sample(seq, row))

    def _count_pages(self):
        # On the engine thread (the KV cache is not to be used from two threads at once), when
        # sequences come or go or the engine idles, not on every decode step.
        self.pages = int(
            self.call("vm.builtin.attention_kv_cache_get_num_available_pages", self.kv)
        )

    def stats(self):
        """Sequences running and waiting, tokens reserved, free pages (as of the last time a
        sequence came or went), and sequences cancelled because their client went away."""
        return {
            "running": len(self.running),
            "waiting": self.waiting.qsize(),
            "reserved_tokens": self.reserved,
            "available_pages": self.pages,
            "cancelled": self.cancelled,
        }

    def stop(self):
        self.waiting.put(None)


def is_llm(path):
    exec_bytes = _elf_section(path, b".rvm_exec") or b""
    return all(
        name.encode() in exec_bytes
        for name in ("create_paged_kv_cache", "embed", "prefill", "decode")
    )


# ---- Ray Serve ---------------------------------------------------------------------------------------
