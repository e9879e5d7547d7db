"""relaxc.llm.tokenizer: a GGUF file's vocabulary as Hugging Face's tokenizer.json gives the token
ids llama.cpp gives, and the text back, for a SentencePiece vocabulary (Llama's kind: byte
fallback, a space prefix) and a byte-level BPE one (GPT-2's), on lines of words, numbers, runs of
spaces, tabs and new lines, accents, emoji and CJK (fixtures/gguf/tokenize.json, recorded from
llama.cpp by fixtures/gguf/generate_tokenizers.py).

Needs gguf and tokenizers (no TVM, no llama.cpp).
"""

import json
import os
import sys

import pytest
from test_tvm_ffi import ROOT

sys.path.insert(0, os.path.join(ROOT, "python"))
pytest.importorskip("gguf", reason="the gguf package reads the vocabulary (pip install gguf)")
pytest.importorskip(
    "tokenizers",
    reason="the tokenizers package builds tokenizer.json (pip install tokenizers)",
)
from relaxc.llm import tokenizer

FIXTURE = os.path.join(ROOT, "fixtures", "gguf")
with open(os.path.join(FIXTURE, "tokenize.json")) as f:
    RECORDED = json.load(f)


@pytest.mark.parametrize("vocab", sorted(RECORDED))
def test_llama_cpps_ids_and_text(vocab, tmp_path):
    tok_path, config_path = (
        str(tmp_path / "tokenizer.json"),
        str(tmp_path / "tokenizer_config.json"),
    )
    tokenizer.write(os.path.join(FIXTURE, vocab), tok_path, config_path)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)  # what a user loads: the written file, not the object
    for case in RECORDED[vocab]:
        assert tok.encode(case["text"]).ids == case["ids"], case["text"]
        assert tok.decode(case["ids"], skip_special_tokens=True) == case["back"], case["text"]
    with open(config_path) as f:
        config = json.load(f)
    assert config["eos_token"] and "add_bos_token" in config


def test_unsupported_vocabularies_are_named(tmp_path):
    with pytest.raises(ValueError, match="holds no tokenizer"):
        tokenizer.build(_without_tokenizer(tmp_path))


def _without_tokenizer(tmp_path):
    import gguf

    path = str(tmp_path / "bare.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("bare")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
