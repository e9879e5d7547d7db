"""A GGUF file's tokenizer as Hugging Face's tokenizer.json, built with the tokenizers library.

GGUF stores the vocabulary itself (tokenizer.ggml.*): BPE vocabularies ("gpt2": byte-level tokens
and their merges, with a pre-tokenizer named by tokenizer.ggml.pre) and SentencePiece ones
("llama": pieces with scores, byte-fallback tokens <0xXX>). A SentencePiece vocabulary becomes BPE
merges the way transformers' converters turn a SentencePiece model into them: every split of a
piece into two pieces of the vocabulary is a merge, ranked by the merged piece's score, which is
the order in which llama.cpp's tokenizer merges. The chat template and the special tokens go to
tokenizer_config.json beside it.
"""

import json

import numpy as np

# tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer patterns by tokenizer.ggml.pre, as llama.cpp's llama-vocab splits text before BPE.
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = {
    "gpt-2": None,
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "qwen2": _QWEN2,
}


class TokenizerError(ValueError):
    """A vocabulary this converter cannot turn into tokenizer.json, with the reason."""


def _field(reader, key):
    """A metadata value: str, number, or list (of str or numbers); None if absent."""
    f = reader.get_field(key)
    if f is None:
        return None
    kind = f.types[0].name if f.types else ""
    if kind == "ARRAY":
        item = f.types[1].name if len(f.types) > 1 else ""
        if item == "STRING":
            return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if kind == "STRING":
        return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")
    return f.parts[f.data[0]].tolist()[0]


def _spm_merges(vocab, scores):
    """BPE merges from a SentencePiece vocabulary: each split of a piece into two pieces of the
    vocabulary, highest merged-piece score first (ties: the pieces' ids)."""
    merges = []
    for piece, piece_id in vocab.items():
        score = scores[piece_id]
        local = [(piece[:i], piece[i:]) for i in range(1, len(piece)) if piece[:i] in vocab and piece[i:] in vocab]
        local.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        merges.extend((score, left, right) for left, right in local)
    merges.sort(key=lambda m: -m[0])
    return [(left, right) for _, left, right in merges]


def build(path):
    """The tokenizers.Tokenizer of the GGUF file at path, and its config (special tokens, chat
    template) for tokenizer_config.json."""
    import gguf
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    reader = gguf.GGUFReader(path, "r")
    kind = _field(reader, "tokenizer.ggml.model")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise TokenizerError(f"{path} holds no tokenizer (tokenizer.ggml.model and .tokens)")
    types = _field(reader, "tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    bos, eos = (
        _field(reader, "tokenizer.ggml.bos_token_id"),
        _field(reader, "tokenizer.ggml.eos_token_id"),
    )
    unk = _field(reader, "tokenizer.ggml.unknown_token_id")
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "llama":
        scores = _field(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
        add_bos = _field(reader, "tokenizer.ggml.add_bos_token")
        add_bos = True if add_bos is None else bool(add_bos)
        space_prefix = _field(reader, "tokenizer.ggml.add_space_prefix")
        space_prefix = True if space_prefix is None else bool(space_prefix)
        plain = {t: i for t, i in vocab.items() if types[i] in (NORMAL, UNUSED)}
        model = models.BPE(
            vocab=vocab,
            merges=_spm_merges(plain, scores),
            unk_token=tokens[unk] if unk is not None else None,
            fuse_unk=True,
            byte_fallback=True,
        )
        tok = Tokenizer(model)
        steps = [normalizers.Replace(" ", "\u2581")]
        tok.normalizer = normalizers.Sequence(([normalizers.Prepend("\u2581")] if space_prefix else []) + steps)
        tok.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
            + ([decoders.Strip(" ", 1, 0)] if space_prefix else [])
        )
    elif kind == "gpt2":
        add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token") or False)
        merges = _field(reader, "tokenizer.ggml.merges")
        if merges is None:
            raise TokenizerError(f"{path}: a gpt2 vocabulary without tokenizer.ggml.merges")
        pre = _field(reader, "tokenizer.ggml.pre") or "default (none named)"
        if pre not in PRE_TOKENIZERS:
            raise TokenizerError(f"{path}: pre-tokenizer {pre!r} is not supported ({', '.join(PRE_TOKENIZERS)})")
        tok = Tokenizer(
            models.BPE(
                vocab=vocab,
                merges=[tuple(m.split(" ", 1)) for m in merges],
                fuse_unk=False,
            )
        )
        pattern = PRE_TOKENIZERS[pre]
        if pattern is None:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        tok.decoder = decoders.ByteLevel()
    else:
        raise TokenizerError(f"{path}: tokenizer model {kind!r} is not supported (llama, gpt2)")
    special = [
        AddedToken(t, special=True, normalized=False)
        for i, t in enumerate(tokens)
        if types[i] in (CONTROL, USER_DEFINED)
    ]
    tok.add_special_tokens(special)
    if add_bos and bos is not None:
        b = tokens[bos]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{b} $A", pair=f"{b} $A {b} $B", special_tokens=[(b, bos)]
        )
    config = {
        "bos_token": tokens[bos] if bos is not None else None,
        "eos_token": tokens[eos] if eos is not None else None,
        "add_bos_token": bool(add_bos),
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "model_max_length": int(np.iinfo(np.int32).max),
    }
    return tok, config


def write(path, tokenizer_json, config_json):
    """Writes the tokenizer of the GGUF file at path to tokenizer_json (Hugging Face's
    tokenizer.json) and its special tokens and chat template to config_json
    (tokenizer_config.json's fields)."""
    tok, config = build(path)
    tok.save(tokenizer_json)
    with open(config_json, "w") as f:
        json.dump({k: v for k, v in config.items() if v is not None}, f, indent=1)
