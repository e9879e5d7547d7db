"""relaxc.llm: LLMs from GGUF files, with their weights used in place.

    python -m relaxc.llm build MODEL.gguf -o MODEL.so [--exec-mode compiled] [--target TRIPLE]
    relaxc generate MODEL.so --weights MODEL.gguf --prompt 1,2,3

``build`` reads the file's metadata (llama, mistral, qwen2, qwen3 or phi3), builds the model with TVM's nn
front end on the paged KV cache (embed, prefill, decode, as fixtures/tvm/llm.py), with every
weight a parameter named and typed as the file holds it, builds it with relaxc.tvm (dense
layers on relaxc's quantized kernels) and compiles it with relaxc. Beside MODEL.so it writes the
file's tokenizer as MODEL.tokenizer.json (Hugging Face's format, from the GGUF vocabulary; see
relaxc.llm.tokenizer) and MODEL.tokenizer_config.json (special tokens, chat template). The weights stay in the GGUF
file: ``--weights`` (or rvm.h's weights_open, or relaxc_weights from Python) maps it and passes
each tensor in place. Needs Apache TVM and the gguf package.
"""

import os
import subprocess
import tempfile
import time

from .. import find_relaxc

__all__ = ["GGUFError", "build", "export", "read_config"]


def __getattr__(name):
    # The GGUF reader needs TVM (the model's configuration lives beside its nn module), so it is
    # imported on first use: `python -m relaxc.llm` can then say which extra is missing.
    if name in ("GGUFError", "read_config"):
        from . import gguf_file

        return getattr(gguf_file, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def export(gguf_path, tar, target=None, log=print):
    """The model of the GGUF file built with relaxc.tvm and exported to `tar` (what relaxc
    compile takes); returns (its Config, its weight names in parameter order)."""
    from tvm.relax.frontend import nn  # noqa: F401 (fail early, naming TVM, when it is missing)

    import relaxc.tvm

    from .gguf_file import GGUFError, read_config
    from .model import LlamaFamily

    config = read_config(gguf_path)
    kinds = sorted(set(config.formats.values()))
    log(
        f"{os.path.basename(gguf_path)}: {config.arch}, {config.layers} layers, hidden {config.hidden}, "
        f"{config.heads}/{config.kv_heads} heads of {config.head_dim}, vocab {config.vocab}; formats {', '.join(kinds)}"
    )
    model = LlamaFamily(config)
    mod, params = model.export_tvm(spec=model.spec())
    missing = [name for name, _ in params if name.split("#")[0] not in config.formats]
    if missing:
        raise GGUFError(f"{gguf_path}: the model needs tensors the file lacks: {', '.join(missing[:5])}")
    # TVM checks a function's inputs against their annotations but not its weights (the parameters
    # past the attribute num_input). A weight from a file is input like any other: without the
    # attribute every parameter is checked, so a tensor of the wrong shape or type is an error
    # naming it, not a kernel reading past its end.
    from tvm import relax

    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function) and func.attrs is not None and "num_input" in func.attrs:
            mod[gvar] = func.without_attr("num_input")
    from relaxc.tvm.attention import use_library_attention

    # Attention in llama.cpp's arithmetic, as RoPE, the gate and the dense layers are: the logits
    # are then llama.cpp's on the same CPU (its KV cache in f32).
    mod = use_library_attention(mod, llama_cpp_arithmetic=True)
    ex = relaxc.tvm.build(mod, target=relaxc.tvm.target_for(target))
    ex.export_library(tar)
    return config, [name for name, _ in params]


def build(gguf_path, output, exec_mode="bytecode", target=None, log=print):
    """Builds the model of the GGUF file at gguf_path into the shared object `output`."""
    started = time.time()
    relaxc_bin = find_relaxc()
    with tempfile.TemporaryDirectory() as work:
        tar = os.path.join(work, "model.tar")
        config, _ = export(gguf_path, tar, target, log)
        command = [relaxc_bin, "compile", tar, "--exec-mode", exec_mode, "-o", output]
        if target:
            command += ["--target", target]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"relaxc compile failed:\n{done.stderr}")
    log(f"wrote {output} in {time.time() - started:.1f} s; run it with --weights {gguf_path}")
    write_tokenizer(gguf_path, output, log)
    return config


def write_tokenizer(gguf_path, output, log=print):
    """The file's tokenizer beside the model: MODEL.tokenizer.json and
    MODEL.tokenizer_config.json for MODEL.so (where the file has a vocabulary and the tokenizers
    package is installed; otherwise a note says why not)."""
    from . import tokenizer

    stem = output[: -len(".so")] if output.endswith(".so") else output
    paths = (stem + ".tokenizer.json", stem + ".tokenizer_config.json")
    try:
        tokenizer.write(gguf_path, *paths)
    except ImportError as e:
        log(f"no tokenizer written: {e} (pip install tokenizers)")
        return None
    except tokenizer.TokenizerError as e:
        log(f"no tokenizer written: {e}")
        return None
    log(f"wrote {paths[0]} and {paths[1]} (for --tokenizer)")
    return paths
