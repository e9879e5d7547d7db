"""OpenAI's API with the official `openai` client, on the tiny Llama exported with decode fixed at
one sequence and served with a tokenizer trained for the tests (fixtures/tokenizer): 32
concurrent requests give their single answers; text and token-id prompts give `relaxc
generate`'s tokens; completions and chat completions round-trip text, streaming and not; stop
strings end the text before them; usage counts what was sent and generated; bad requests get 400
with OpenAI's error object and the server goes on."""

import concurrent.futures
import json
import os
import random
import subprocess
import sys

import pytest
from conftest import ROOT, Server, build, relaxc

openai = pytest.importorskip("openai", reason="pip install openai (the official client)")
sys.path.insert(0, os.path.join(ROOT, "python"))
from relaxc.serve.text import Tokenizer

TOKENIZER = os.path.join(ROOT, "fixtures", "tokenizer", "tiny_bpe", "tokenizer.json")
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("openai"))
    model = build("tiny_llama_fixed", tmp)
    server = Server(
        model,
        "--name",
        "tiny",
        "--tokenizer",
        TOKENIZER,
        "--kv-tokens",
        "4096",
        "--max-batch-size",
        "32",
    )
    yield server, model
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    server, _ = served
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(TOKENIZER)


def generate(model, *args):
    out = subprocess.run([relaxc(), "generate", model, *args], check=True, capture_output=True, text=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("tokens:"))
    return [int(t) for t in line.split(":")[1].split()]


def test_32_concurrent_requests_equal_their_single_answers(served):
    server, _ = served
    rng = random.Random(1)
    prompts = [[rng.randrange(64) for _ in range(rng.randrange(1, 20))] for _ in range(32)]

    def complete(p):
        status, reply = server.post(
            "/v1/completions",
            {"prompt": p, "max_tokens": 12, "temperature": 0, **NO_EOS},
        )
        assert status == 200, reply
        return reply["choices"][0]["token_ids"]

    alone = [complete(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(complete, prompts))
    assert together == alone
    stats = server.get("/v1/relaxc/stats")
    assert stats["decode_batch"] == 1 and stats["failed"] == 0


def test_text_and_token_prompts_give_relaxc_generates_tokens(served, client, tokenizer):
    server, model = served
    want = generate(model, "--tokenizer", TOKENIZER, "--prompt", "the cat sat", "--max-new-tokens", "12")
    reply = client.completions.create(
        model="tiny", prompt="the cat sat", max_tokens=12, temperature=0, extra_body=NO_EOS
    )
    choice = reply.choices[0]
    assert choice.token_ids == want and choice.text == tokenizer.decode(want) and choice.finish_reason == "length"
    ids = tokenizer.encode("the cat sat")
    assert (
        reply.usage.prompt_tokens == len(ids)
        and reply.usage.completion_tokens == 12
        and reply.usage.total_tokens == len(ids) + 12
    )
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=0, extra_body=NO_EOS)
    assert (
        by_ids.choices[0].token_ids
        == want
        == generate(model, "--prompt", ",".join(map(str, ids)), "--max-new-tokens", "12")
    )


def test_streaming_completions_give_the_same_text(client):
    whole = client.completions.create(model="tiny", prompt="a dog ran", max_tokens=24, temperature=0, extra_body=NO_EOS)
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt="a dog ran",
            max_tokens=24,
            temperature=0,
            stream=True,
            extra_body=NO_EOS,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    assert chunks[-1].usage.completion_tokens == 24


def test_a_stop_string_ends_the_text_before_it(client):
    whole = client.completions.create(
        model="tiny", prompt="the end", max_tokens=32, temperature=0, extra_body=NO_EOS
    ).choices[0]
    text = whole.text
    # A stop string that first appears after the start: two characters from the text's middle.
    k = next(i for i in range(len(text) // 2, len(text) - 2) if text.find(text[i : i + 2]) == i)
    stop = text[k : k + 2]
    for stream in (False, True):
        reply = client.completions.create(
            model="tiny",
            prompt="the end",
            max_tokens=32,
            temperature=0,
            stop=[stop],
            stream=stream,
            extra_body=NO_EOS,
        )
        if stream:
            chunks = [c.choices[0] for c in reply]
            got, finish = "".join(c.text for c in chunks), chunks[-1].finish_reason
        else:
            got, finish = reply.choices[0].text, reply.choices[0].finish_reason
            assert reply.usage.completion_tokens < 32
        assert got == text[:k] and finish == "stop", (stream, stop, got, text)


def test_a_stop_token_ends_generation(client):
    whole = client.completions.create(
        model="tiny", prompt="the end", max_tokens=16, temperature=0, extra_body=NO_EOS
    ).choices[0]
    stop = whole.token_ids[5]
    first = whole.token_ids.index(stop)
    reply = client.completions.create(
        model="tiny",
        prompt="the end",
        max_tokens=16,
        temperature=0,
        extra_body={**NO_EOS, "stop_token_ids": [stop]},
    )
    assert reply.choices[0].token_ids == whole.token_ids[: first + 1] and reply.choices[0].finish_reason == "stop"


def test_chat_completions_apply_the_chat_template(served, client, tokenizer):
    _, model = served
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "tell me a story"},
    ]
    reply = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0, extra_body=NO_EOS
    )
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages), special=False)
    want = generate(model, "--prompt", ",".join(map(str, prompt)), "--max-new-tokens", "10")
    message = reply.choices[0].message
    assert message.role == "assistant" and message.content == tokenizer.decode(want)
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.completion_tokens == 10
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=10,
            temperature=0,
            stream=True,
            extra_body=NO_EOS,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_sampling_n_seed_and_logprobs(client):
    args = dict(
        model="tiny",
        prompt="the sea",
        max_tokens=12,
        temperature=1.0,
        top_p=0.9,
        seed=7,
        n=3,
        extra_body=NO_EOS,
    )
    a, b = client.completions.create(**args), client.completions.create(**args)
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices], "the same seed, the same choices"
    assert len({tuple(c.token_ids) for c in a.choices}) > 1, "each choice samples on its own"
    assert a.usage.completion_tokens == 36
    greedy = client.completions.create(
        model="tiny",
        prompt="the sea",
        max_tokens=4,
        temperature=0,
        logprobs=3,
        extra_body=NO_EOS,
    )
    lp = greedy.choices[0].logprobs
    assert len(lp.token_logprobs) == 4 and all(len(t) == 3 for t in lp.top_logprobs)
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(max(t.values()) == pytest.approx(x) for t, x in zip(lp.top_logprobs, lp.token_logprobs)), (
        "greedy: each token is its step's most likely"
    )
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body=NO_EOS,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 for c in content)


@pytest.mark.parametrize(
    "body, words",
    [
        ({"model": "gpt-4", "prompt": "hi"}, "is not served here"),
        ({"model": "tiny", "messages": []}, "messages must be a non-empty list"),
        ({"model": "tiny", "prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"model": "tiny", "prompt": "hi", "max_tokens": -3}, "max_tokens"),
        (
            {"model": "tiny", "prompt": [5] * 4000, "max_tokens": 200},
            "exceed the KV cache",
        ),
        ({"model": "tiny", "prompt": "hi", "temperature": "hot"}, "temperature"),
        (
            {"model": "tiny", "messages": [{"role": "robot", "content": "hi"}]},
            "roles are system, user and assistant",
        ),
        (b'{"model": "tiny", "prompt": ', "malformed JSON"),
    ],
)
def test_bad_requests_get_400_with_openais_error_object(served, body, words):
    server, _ = served
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    status, reply = server.post(path, body)
    assert status == 400 and words in reply["error"]["message"] and reply["error"]["type"] == "invalid_request_error", (
        reply
    )
    status, reply = server.post("/v1/completions", {"prompt": [1, 2], "max_tokens": 2})
    assert status == 200, "the server goes on serving"


def test_the_client_sees_its_errors_and_the_model_list(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[], max_tokens=4)
    assert "messages must be a non-empty list" in str(e.value)
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert json.loads(client.models.retrieve("tiny").model_dump_json())["owned_by"] == "relaxc"
