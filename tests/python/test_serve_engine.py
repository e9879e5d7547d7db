"""relaxc.serve's LLM engine without Ray, on the tiny Llama exported three ways: decode with a
symbolic batch (tiny_llama), decode fixed at one sequence (tiny_llama_fixed) and MLC's
batch_prefill and batch_decode (tiny_llama_mlc). Concurrent requests give exactly the tokens they
give alone; batch_prefill gives TVM's logits; a failing step fails its own request and no other;
the text of a stream comes out whole, ends before a stop string, and round-trips."""

import concurrent.futures
import os
import random
import subprocess
import sys
import threading

import numpy as np
import pytest
from test_tvm_ffi import ROOT, relaxc_binary

sys.path.insert(0, os.path.join(ROOT, "python"))
pytest.importorskip(
    "tokenizers",
    reason="pip install tokenizers (Hugging Face's) for relaxc.serve's text",
)

from relaxc.serve.engine import Engine
from relaxc.serve.text import Tokenizer

FIXTURES = os.path.join(ROOT, "fixtures", "tvm")
TOKENIZER = os.path.join(ROOT, "fixtures", "tokenizer", "tiny_bpe", "tokenizer.json")
KINDS = ["tiny_llama", "tiny_llama_fixed", "tiny_llama_mlc"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("llms")
    built = {}
    for name in KINDS:
        built[name] = str(out / f"{name}.so")
        subprocess.run(
            [
                relaxc_binary(),
                "compile",
                os.path.join(FIXTURES, name, "m.tar"),
                "--exec-mode",
                "compiled",
                "-o",
                built[name],
            ],
            check=True,
        )
    return built


def run(engine, prompt, n, **options):
    done, errors = threading.Event(), []

    def emit(item, error):
        if item is None:
            errors.append(error)
            done.set()

    seq = engine.submit(prompt, n, 0.0, 1.0, None, emit, False, **options)
    assert done.wait(120), "no answer"
    return seq, errors[0]


@pytest.mark.parametrize("name", KINDS)
def test_32_concurrent_requests_give_their_single_answers(models, name):
    engine = Engine(models[name], max_batch=32, max_total_seq_len=4096, prefill_chunk=32)
    try:
        want = np.load(os.path.join(FIXTURES, name, "generate.npz"))
        seq, error = run(engine, [int(t) for t in want["prompt"]], 16)
        assert error is None and seq.tokens == [int(t) for t in want["tokens"]], "TVM's greedy tokens"
        rng = random.Random(0)
        prompts = [[rng.randrange(64) for _ in range(rng.randrange(1, 70))] for _ in range(32)]
        alone = [run(engine, p, 12)[0].tokens for p in prompts]
        calls = dict(engine.stats()["calls"])
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            together = list(pool.map(lambda p: run(engine, p, 12), prompts))
        assert all(error is None for _, error in together)
        assert [s.tokens for s, _ in together] == alone
        stats = engine.stats()
        decodes = stats["calls"]["decode"] - calls["decode"]
        if name == "tiny_llama_fixed":
            assert stats["decode_batch"] == 1 and decodes == 32 * 11, "one decode call per sequence and step"
        else:
            assert decodes < 32 * 11, "sequences decoded together"
        if name == "tiny_llama_mlc":
            prefills = stats["calls"]["batch_prefill"] - calls["batch_prefill"]
            assert stats["calls"]["prefill"] == 0 and prefills < 32 + sum(len(p) > 32 for p in prompts), prefills
        assert stats["failed"] == 0 and stats["reserved_tokens"] == 0
    finally:
        engine.stop()


def test_batch_prefill_gives_tvms_logits(models):
    """Three prompts in one batch_prefill call, then one batch_decode step: TVM's bits."""
    want = np.load(os.path.join(FIXTURES, "tiny_llama_mlc", "batch_prefill.npz"))
    engine = Engine(
        models["tiny_llama_mlc"],
        max_batch=4,
        max_total_seq_len=256,
        prefill_chunk=32,
        run=False,
    )
    prompts = [[int(t) for t in want[f"prompt{i}"]] for i in range(3)]
    seqs = [engine.submit(p, 4, 0.0, 1.0, None, lambda *_: None, False) for p in prompts]
    for i, seq in enumerate(seqs):
        seq.slot = i
        engine._state("kv_state_add_sequence", i)
    done, rows = engine._prefill_together(seqs)
    assert engine.calls["batch_prefill"] == 1 and done == seqs
    assert np.array_equal(np.stack(rows), want["prefill_logits"][0])
    for seq, token in zip(seqs, want["decode_tokens"]):
        seq.tokens.append(int(token))
    _, logits = engine._decode(seqs)
    assert np.array_equal(logits, want["decode_logits"].reshape(3, -1))


class Poisoned:
    """The model's module with one sequence's decode steps failing, after the cache took the
    step's tokens (so the engine has to give them back)."""

    def __init__(self, engine, slot_of):
        self.module, self.engine, self.slot_of = engine.m, engine, slot_of
        self.slots = []
        state = engine._state

        def recording(name, *args):
            if name == "kv_state_begin_forward":
                self.slots = list(args[0])
            return state(name, *args)

        engine._state = recording

    def __getitem__(self, name):
        fn = self.module[name]
        if name not in ("decode", "batch_decode"):
            return fn

        def decode(*args):
            if self.slot_of() in self.slots:
                raise RuntimeError("poisoned sequence")
            return fn(*args)

        return decode


@pytest.mark.parametrize("name", KINDS)
def test_a_failing_step_fails_its_own_request_alone(models, name):
    engine = Engine(models[name], max_batch=16, max_total_seq_len=2048, prefill_chunk=32)
    try:
        pages = engine.stats()["available_pages"]
        prompts = [[(5 * i + k) % 64 for k in range(3 + i)] for i in range(8)]
        alone = [run(engine, p, 10)[0].tokens for p in prompts]
        holder = {}
        engine.m = Poisoned(engine, lambda: getattr(holder.get("victim"), "slot", -1))
        out = {}
        start = threading.Barrier(9)

        def request(i):
            start.wait()
            out[i] = run(engine, prompts[i], 10)

        threads = [threading.Thread(target=request, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        start.wait()
        victim_done, victim_error = threading.Event(), []

        def victim_emit(item, error):
            if item is None:
                victim_error.append(error)
                victim_done.set()

        holder["victim"] = engine.submit([7, 7, 7], 10, 0.0, 1.0, None, victim_emit, False)
        for t in threads:
            t.join(120)
        assert victim_done.wait(120) and victim_error[0] and "poisoned sequence" in victim_error[0], victim_error
        assert [out[i][0].tokens for i in range(8)] == alone and all(out[i][1] is None for i in range(8))
        holder.clear()
        assert run(engine, prompts[0], 10)[0].tokens == alone[0]
        stats = engine.stats()
        assert stats["failed"] == 1 and stats["available_pages"] == pages and stats["reserved_tokens"] == 0, stats
    finally:
        engine.stop()


def test_text_streams_whole_characters_and_stops_before_a_stop_string(tmp_path):
    from tokenizers import Tokenizer as HuggingFaceTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    # A byte-level BPE: "é" and "世" are more than one token, so their bytes arrive split.
    hf = HuggingFaceTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(
        ["hello world"] * 3,
        trainers.BpeTrainer(
            vocab_size=270,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    hf.save(str(tmp_path / "tokenizer.json"))
    tokenizer = Tokenizer(str(tmp_path / "tokenizer.json"))
    text = "hello wörld, 世界 — done. STOP here"
    ids = tokenizer.encode(text)
    assert len(ids) > len(text.encode()) // 2 and tokenizer.decode(ids) == text
    stream = tokenizer.stream()
    pieces = [stream.push(t)[0] for t in ids]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in p for p in pieces), "no piece ends inside a character"
    stream = tokenizer.stream(["STOP", "world!"])
    out, stopped = "", False
    for t in ids:
        piece, stopped = stream.push(t)
        out += piece
        if stopped:
            break
    assert stopped and out == "hello wörld, 世界 — done. "


def test_the_trained_tokenizer_and_its_chat_template():
    tokenizer = Tokenizer(TOKENIZER)
    assert tokenizer.eos_ids == {2} and tokenizer.bos_token == "<s>"
    ids = tokenizer.encode("the cat sat on the mat.")
    assert ids[0] == 1 and tokenizer.decode(ids) == "the cat sat on the mat."
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "tell me a story"}])
    assert prompt == "<s>user: tell me a story\nassistant:"
    with pytest.raises(Exception, match="roles are system, user and assistant"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "hi"}])


def test_generate_prints_the_text_of_its_tokens(models):
    """`relaxc generate --tokenizer` (the tokenizers crate) encodes the prompt as Python's
    tokenizers library does, and prints the text of the tokens it generates."""
    tokenizer = Tokenizer(TOKENIZER)
    command = [relaxc_binary(), "generate", models["tiny_llama"], "--tokenizer", TOKENIZER]
    out = subprocess.run(
        [*command, "--prompt", "the cat sat", "--max-new-tokens", "12"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    prompt = [int(t) for t in out[0].split(":")[1].split()]
    assert out[0].startswith("prompt tokens:") and prompt == tokenizer.encode("the cat sat")
    tokens = [int(t) for t in next(line for line in out if line.startswith("tokens:")).split(":")[1].split()]
    assert out[1] == tokenizer.decode(tokens)
    engine = Engine(models["tiny_llama"], max_batch=2, max_total_seq_len=256, prefill_chunk=32)
    try:
        assert run(engine, prompt, 12)[0].tokens == tokens
    finally:
        engine.stop()


def test_generate_stops_at_the_end_of_sequence_token(models, tmp_path):
    """With --tokenizer, `relaxc generate` stops at the eos_token of the tokenizer's configuration
    (here made a token the model generates early), and --ignore-eos generates them all."""
    import json
    import shutil

    def generate(tokenizer, *extra):
        out = subprocess.run(
            [relaxc_binary(), "generate", models["tiny_llama"], "--tokenizer", tokenizer, "--prompt", "the cat sat"]
            + ["--max-new-tokens", "12", *extra],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        return [int(t) for t in next(line for line in out if line.startswith("tokens:")).split(":")[1].split()]

    everything = generate(TOKENIZER, "--ignore-eos")
    assert len(everything) == 12
    # The first token that is not the first one: generation must stop right after it appears.
    stop = next(i for i, t in enumerate(everything) if t != everything[0])
    shutil.copy(TOKENIZER, tmp_path / "m.tokenizer.json")
    end = Tokenizer(TOKENIZER).hf.id_to_token(everything[stop])
    (tmp_path / "m.tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": end}}))
    assert generate(str(tmp_path / "m.tokenizer.json")) == everything[: stop + 1]
    assert generate(str(tmp_path / "m.tokenizer.json"), "--ignore-eos") == everything
    (tmp_path / "m.tokenizer_config.json").write_text(json.dumps({"eos_token": "<not a token>"}))
    bad = subprocess.run(
        [relaxc_binary(), "generate", models["tiny_llama"], "--tokenizer", str(tmp_path / "m.tokenizer.json")]
        + ["--prompt", "the cat sat"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "<not a token>" in bad.stderr


def test_a_gguf_model_prefills_together_with_its_weights_from_the_file(tmp_path):
    """relaxc.llm's export (batch_prefill too) with its weights read from the GGUF file: TVM's
    greedy tokens, and 16 concurrent requests prefilled together give their answers alone."""
    folder = os.path.join(ROOT, "fixtures", "gguf")
    so = str(tmp_path / "gguf.so")
    subprocess.run(
        [relaxc_binary(), "compile", os.path.join(folder, "m.tar"), "--exec-mode", "compiled", "-o", so], check=True
    )
    weights = os.path.join(folder, "tiny_mixed.gguf")
    engine = Engine(so, max_batch=16, max_total_seq_len=2048, prefill_chunk=32, weights=weights)
    try:
        want = np.load(os.path.join(folder, "generate.npz"))
        seq, error = run(engine, [int(t) for t in want["prompt"]], 16)
        assert error is None and seq.tokens == [int(t) for t in want["tokens"]]
        rng = random.Random(2)
        prompts = [[rng.randrange(128) for _ in range(rng.randrange(1, 40))] for _ in range(16)]
        alone = [run(engine, p, 8)[0].tokens for p in prompts]
        before = engine.stats()["calls"]["batch_prefill"]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            together = list(pool.map(lambda p: run(engine, p, 8), prompts))
        assert [s.tokens for s, _ in together] == alone
        assert engine.stats()["calls"]["batch_prefill"] - before < 16 + sum(len(p) > 32 for p in prompts)
    finally:
        engine.stop()


def parse_metrics(text):
    """Prometheus's text format: {(name, frozenset of label pairs): value}, HELP and TYPE lines
    checked to come before their samples."""
    import re

    samples, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("#") or not line:
            continue
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)", line)
        assert m, f"not an exposition line: {line!r}"
        name, labels, value = m.groups()
        assert any(name == t or name.startswith(t + "_") for t in typed), f"{name} before its TYPE"
        pairs = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
        samples[(name, pairs)] = float(value)
    return samples


def test_metrics_count_what_the_engine_did(models):
    """GET /metrics's text after three requests: their prompt and generated tokens, three
    finished for length, one first-token time each and one time per later token, cumulative
    buckets, and no page in use once they are done."""
    engine = Engine(models["tiny_llama"], max_batch=4, max_total_seq_len=1024, prefill_chunk=32)
    try:
        prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9] * 20]
        for p in prompts:
            seq, error = run(engine, p, 6)
            assert error is None and len(seq.tokens) == 6
        text = engine.metrics_text('tiny "llama"')
    finally:
        engine.stop()
    s = parse_metrics(text)
    model = ("model_name", 'tiny \\"llama\\"')

    def value(name, **labels):
        return s[(f"relaxc:{name}", frozenset({model, *labels.items()}))]

    assert value("prompt_tokens_total") == sum(map(len, prompts))
    assert value("generation_tokens_total") == 18
    assert value("request_finished_total", finished_reason="length") == 3
    assert value("request_finished_total", finished_reason="error") == 0
    assert value("time_to_first_token_seconds_count") == 3
    assert value("time_per_output_token_seconds_count") == 15
    buckets = [v for (n, labels), v in s.items() if n == "relaxc:time_to_first_token_seconds_bucket"]
    assert buckets == sorted(buckets) and max(buckets) == value("time_to_first_token_seconds_count")
    assert value("num_requests_running") == 0 and value("num_requests_waiting") == 0
    assert value("kv_cache_pages_total") > 0 and value("kv_cache_pages_used") == 0
