"""relaxc.tvm.build(mod, quantize=FMT): the tiny Llama of fixtures/tvm/llm.py with its dense
layers' weights quantized at build time (f16, q8_0, and q4_0 regrouped eight rows at a time),
run by TVM's own VM (relaxc's kernels registered in it) and by relaxc in both modes: the same
greedy tokens and logits bit for bit, close to the float32 model's.

Needs TVM 0.27 (skipped without it, as the summary says) besides numpy, pytest and tvm_ffi.
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
from test_tvm_ffi import ROOT, relaxc_binary

sys.path.insert(0, os.path.join(ROOT, "python"))
tvm = pytest.importorskip(
    "tvm",
    reason="TVM 0.27 builds the quantized models (pip install apache-tvm==0.27.0.post1)",
)

PROMPT = [1, 17, 42, 5, 9, 33]


def llm_module():
    spec = importlib.util.spec_from_file_location("tiny_llm", os.path.join(ROOT, "fixtures/tvm/llm.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fmt", ["f16", "q8_0", "q4_0"])
def test_quantized_build_runs_alike_in_tvm_and_relaxc(fmt, tmp_path):
    os.environ.setdefault("RELAXC", relaxc_binary())
    import relaxc.tvm

    llm = llm_module()
    mod = llm.build_module()
    ex = relaxc.tvm.build(mod, target="llvm", quantize=fmt)
    tvm_tokens, tvm_logits = llm.greedy(ex, PROMPT, 8)
    tar = str(tmp_path / "m.tar")
    ex.export_library(tar)
    listing = subprocess.run([relaxc_binary(), "inspect", tar], capture_output=True, text=True, check=True).stdout
    assert "relaxc.dense_q" in listing
    for mode in ["bytecode", "compiled"]:
        so, logits = (
            str(tmp_path / f"m.{mode}.so"),
            str(tmp_path / f"logits.{mode}.npz"),
        )
        subprocess.run([relaxc_binary(), "compile", tar, "--exec-mode", mode, "-o", so], check=True)
        out = subprocess.run(
            [
                relaxc_binary(),
                "generate",
                so,
                "--prompt",
                ",".join(map(str, PROMPT)),
                "--max-new-tokens",
                "8",
                "--logits",
                logits,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.splitlines()[0] == "tokens: " + " ".join(map(str, tvm_tokens)), mode
        assert np.load(logits)["logits"].tobytes() == np.asarray(tvm_logits, np.float32).tobytes(), mode
    # Quantization moves the logits a little from the float32 model's, no more.
    _, exact = llm.greedy(relaxc.tvm.build(mod, target="llvm"), PROMPT, 1)
    scale = np.abs(exact[0]).max()
    assert np.abs(tvm_logits[0] - exact[0]).max() <= {"f16": 1e-3, "q8_0": 3e-2, "q4_0": 2e-1}[fmt] * scale


def test_unknown_format_is_refused():
    import relaxc.tvm

    with pytest.raises(ValueError, match="quantize='q5_9'"):
        relaxc.tvm.RewriteToLibrary("q5_9")


def test_the_llm_command_builds_a_gguf_file_and_writes_its_tokenizer(tmp_path):
    """python -m relaxc.llm build on the GGUF fixture: the model generates TVM's tokens with its
    weights from the file, and its tokenizer is written beside it for --tokenizer."""
    folder = os.path.join(ROOT, "fixtures", "gguf")
    gguf_path, so = os.path.join(folder, "tiny_mixed.gguf"), str(tmp_path / "tiny.so")
    env = dict(os.environ, RELAXC=relaxc_binary(), PYTHONPATH=os.path.join(ROOT, "python"))
    subprocess.run(
        [sys.executable, "-m", "relaxc.llm", "build", gguf_path, "-o", so, "--exec-mode", "compiled"],
        check=True,
        env=env,
        capture_output=True,
    )
    want = np.load(os.path.join(folder, "generate.npz"))
    tokenizer = str(tmp_path / "tiny.tokenizer.json")
    assert os.path.exists(tokenizer) and os.path.exists(str(tmp_path / "tiny.tokenizer_config.json"))
    prompt = ",".join(str(t) for t in want["prompt"])
    out = subprocess.run(
        [relaxc_binary(), "generate", so, "--weights", gguf_path, "--max-new-tokens", "16", "--prompt", prompt],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert out[0] == "tokens: " + " ".join(str(t) for t in want["tokens"])
    from relaxc.serve.text import Tokenizer

    # The fixture's vocabulary is pieces <t0>..<t127>: the text of the tokens is theirs.
    assert Tokenizer(tokenizer).decode([int(t) for t in want["tokens"]]) == "".join(f"<t{t}>" for t in want["tokens"])


def test_kernels_a_model_brings_are_left_as_written():
    """relaxc.tvm.build schedules only the kernels that legalization and fusion make. The paged
    KV cache's attention kernels come written and scheduled with the model; at the mid-size
    Llama's shapes the reduction schedule broke its prefill kernel (a variable used but not
    passed), so `relaxc.llm build` failed. Every PrimFunc the module brought must come out as it
    went in, and the module must still build."""
    import tvm_ffi
    from relaxc.tvm.schedule import FuseAndParallelize

    llm = llm_module()
    shape = llm.Shape(vocab=512, hidden=1024, layers=1, heads=16, kv_heads=4, head_dim=64, ffn=2816)
    model = llm.TinyLlama(shape)
    mod, _ = model.export_tvm(spec=model.spec(batch="symbolic"))
    brought = {g.name_hint: f for g, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert any("prefill" in name for name in brought), sorted(brought)
    scheduled = FuseAndParallelize()(mod)
    for gvar, func in scheduled.functions_items():
        if gvar.name_hint in brought:
            # Passes may annotate the kernel (its op pattern); its code must not change.
            assert tvm_ffi.structural_equal(func.body, brought[gvar.name_hint].body, map_free_vars=True), gvar.name_hint
    tvm.relax.build(scheduled, target="llvm")


def test_rope_frequency_factors_are_taken_as_they_are_or_refused(tmp_path):
    """A GGUF file's rope_freqs.weight (Llama 3's RoPE scaling as llama.cpp's converter writes it,
    or any other divisors) is passed to relaxc.rope as it is, as llama.cpp divides by it; a tensor
    of the wrong type or length, or a divisor that is not a positive number, is refused by name."""
    sys.path.insert(0, os.path.join(ROOT, "fixtures", "gguf"))
    import generate as fixture
    from relaxc.llm.gguf_file import GGUFError, read_config

    weights = fixture.float_weights()
    for factors in [fixture.llama3_rope_factors(), np.random.default_rng(1).uniform(1, 8, 32).astype(np.float32)]:
        path = str(tmp_path / "good.gguf")
        fixture.write_gguf(path, {**weights, "rope_freqs.weight": factors})
        assert read_config(path).rope_freqs
    path = str(tmp_path / "plain.gguf")
    fixture.write_gguf(path, weights)
    assert not read_config(path).rope_freqs

    weights = fixture.float_weights()
    for bad, why in [
        (fixture.llama3_rope_factors()[:16], "must be f32 with 32 values"),
        (-fixture.llama3_rope_factors(), "not a positive number"),
    ]:
        path = str(tmp_path / "bad.gguf")
        fixture.write_gguf(path, {**weights, "rope_freqs.weight": bad})
        with pytest.raises(GGUFError, match=f"rope_freqs.weight.*{why}|{why}"):
            read_config(path)
