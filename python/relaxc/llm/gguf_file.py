"""What relaxc.llm reads from a GGUF file: the architecture and its sizes, RoPE, and the format
of every tensor, through the gguf package's reader (memory-mapped: nothing but the header is
read). Files outside what the model covers are refused here, by name, before anything is built.
"""

import numpy as np

from .model import BLOCKS, Config

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3")
_TYPES = {
    0: "f32",
    1: "f16",
    2: "q4_0",
    3: "q4_1",
    6: "q5_0",
    7: "q5_1",
    8: "q8_0",
    12: "q4_K",
    14: "q6_K",
}


class GGUFError(ValueError):
    """A GGUF file this builder cannot turn into a model, with the reason."""


def _value(reader, key, default=None, required=True):
    field = reader.get_field(key)
    if field is None:
        if required and default is None:
            raise GGUFError(f"{key} is missing from the file's metadata")
        return default
    parts = [field.parts[i] for i in field.data]
    if len(parts) == 1:
        part = parts[0]
        if part.dtype == np.uint8 and field.types and field.types[0].name == "STRING":
            return bytes(part).decode("utf-8")
        return part.tolist()[0] if part.size == 1 else part.tolist()
    return parts


def _string(reader, key):
    field = reader.get_field(key)
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


def read_config(path):
    """The Config of the model in the GGUF file at path."""
    import gguf

    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # the gguf package raises several kinds for a damaged file
        raise GGUFError(f"{path} is not a readable GGUF file: {e}") from e
    arch = _string(reader, "general.architecture")
    if arch is None:
        raise GGUFError(f"{path}: general.architecture is missing")
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"{path}: architecture {arch!r} is not supported (relaxc.llm builds {', '.join(ARCHITECTURES)})"
        )
    formats, dims = {}, {}
    for t in reader.tensors:
        fmt = _TYPES.get(int(t.tensor_type))
        if fmt is None:
            raise GGUFError(
                f"{path}: tensor {t.name} is {t.tensor_type.name}, which relaxc's kernels do not read "
                f"(they read {', '.join(_TYPES.values())})"
            )
        formats[t.name] = fmt
        dims[t.name] = [int(d) for d in t.shape]  # innermost first, as GGUF lists them

    def meta(key, default=None):
        return _value(reader, f"{arch}.{key}", default)

    hidden = int(meta("embedding_length"))
    heads = int(meta("attention.head_count"))
    kv_heads = int(meta("attention.head_count_kv", heads))
    head_dim = int(meta("attention.key_length", hidden // heads))
    scaling = _string(reader, f"{arch}.rope.scaling.type") or "none"
    if scaling not in ("none", "linear"):
        raise GGUFError(f"{path}: RoPE scaling {scaling!r} is not supported (none or linear)")
    factor = float(meta("rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
    _check_rope_freqs(path, reader, formats, dims, head_dim)
    if "token_embd.weight" not in formats:
        raise GGUFError(f"{path}: token_embd.weight is missing")
    for name, fmt in formats.items():
        if fmt in BLOCKS and len(dims[name]) == 2 and dims[name][0] % BLOCKS[fmt][0] != 0:
            raise GGUFError(f"{path}: tensor {name} has rows of {dims[name][0]} values, not whole {fmt} blocks")
    layers = int(meta("block_count"))
    for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
        if name in formats:
            raise GGUFError(
                f"{path}: {name}: Phi-3's long-context RoPE scaling (LongRoPE, the 128k variants) is not "
                "supported; the 4k-context files are"
            )
    # Phi-3's fused matrices: Q, K and V in one (attn_qkv), the gate and up in one (ffn_up, the gate
    # its first half).
    fused = "blk.0.attn_qkv.weight" in formats
    # Qwen3's RMS norms of each head's Q and K (one weight per head dimension), before RoPE.
    qk_norm = "blk.0.attn_q_norm.weight" in formats
    for i in range(layers):
        for part in ("attn_q_norm", "attn_k_norm") if qk_norm else ():
            name = f"blk.{i}.{part}.weight"
            if formats.get(name) != "f32" or dims.get(name) != [head_dim]:
                raise GGUFError(
                    f"{path}: tensor {name} must be f32 with {head_dim} values (one per head dimension), got "
                    f"{formats.get(name, 'nothing')} of shape {dims.get(name)}"
                )
        parts = ["attn_norm", "attn_output", "ffn_norm", "ffn_up", "ffn_down"]
        parts += ["attn_qkv"] if fused else ["attn_q", "attn_k", "attn_v", "ffn_gate"]
        for part in parts:
            if f"blk.{i}.{part}.weight" not in formats:
                raise GGUFError(f"{path}: tensor blk.{i}.{part}.weight is missing")
    return Config(
        arch=arch,
        vocab=dims["token_embd.weight"][1],
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=int(meta("feed_forward_length")),
        rms_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        rope_scale=factor,
        rope_freqs="rope_freqs.weight" in formats,
        context=int(meta("context_length", 2048)),
        formats=formats,
        qkv_bias="blk.0.attn_q.bias" in formats,
        tied_embeddings="output.weight" not in formats,
        rope_mode="normal" if arch in ("llama", "mistral") else "neox",
        qk_norm=qk_norm,
        fused=fused,
    )


def _check_rope_freqs(path, reader, formats, dims, head_dim):
    """rope_freqs.weight, where the file has it: the per-frequency divisors of RoPE's angles that
    llama.cpp's converter writes for Llama 3.1 and later (their "llama3" scaling), one positive
    float32 per pair of a head's dimensions. relaxc.rope divides by them as llama.cpp does."""
    name = "rope_freqs.weight"
    if name not in formats:
        return
    if formats[name] != "f32" or dims[name] != [head_dim // 2]:
        raise GGUFError(
            f"{path}: tensor {name} must be f32 with {head_dim // 2} values (one per pair of a head's "
            f"{head_dim} dimensions), got {formats[name]} of shape {dims[name]}"
        )
    values = next(np.array(t.data, np.float32) for t in reader.tensors if t.name == name)
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise GGUFError(f"{path}: tensor {name} holds a value that is not a positive number")
