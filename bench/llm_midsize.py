#!/usr/bin/env python3
"""Mid-size Llama: relaxc (the model built with relaxc.tvm.build, compiled mode) against
llama.cpp (llama-cpp-python from PyPI) on the very same weights, and TVM's default build for the
greedy tokens.

The model is fixtures/tvm/llm.py's Llama at a real size (--size mid, the default): vocab 32000,
hidden 1024, 8 layers, 16 query heads and 4 KV heads of 64, FFN 2816 (156 M parameters, f32,
seeded random weights), or at the tiny fixture's sizes (--size tiny: vocab 64, hidden 32), built
with TVM's nn front end, weights bound as constants. The same weights are written as a GGUF file
(f32) for llama.cpp, Q and K rows permuted as llama.cpp's converter permutes a Hugging Face
Llama's (llama.cpp rotates adjacent pairs, TVM's RoPE the two halves).

Before timing, the first prefill's logits of relaxc and llama.cpp must agree, and relaxc's first
8 greedy tokens must be TVM's (default kernels). Then, in interleaved rounds, at 1 and 2 threads:
prefill time of a 6-token prompt and decode tokens/s over --tokens new tokens; medians.

Needs TVM 0.27, llama-cpp-python, gguf and numpy; builds are cached in --work (default
/tmp/relaxc-llm-<size>, about 2.5 GB for mid).

With --quantize FMT (f16, q8_0, q4_0, q4_K) the dense weights are quantized by relaxc.tvm.build
itself (no GGUF on relaxc's side), and llama.cpp runs its own quantization of the same weights
(q4_K: llama.cpp's Q4_K_S file type); the greedy tokens must be TVM's VM's on the same executable.

usage: python3 bench/llm_midsize.py [--size mid|tiny] [--quantize FMT] [--relaxc target/release/relaxc]
                                    [--tokens 32] [--rounds 3]
"""

import argparse
import importlib.util
import os
import platform
import re
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = [1, 17, 42, 5, 9, 33]
SIZES = {
    "mid": dict(vocab=32000, hidden=1024, layers=8, heads=16, kv_heads=4, head_dim=64, ffn=2816),
    # TinyLlama 1.1B's shape (1.1 B parameters): the size people decode on a laptop's CPU.
    "1b": dict(vocab=32000, hidden=2048, layers=22, heads=32, kv_heads=4, head_dim=64, ffn=5632),
    "tiny": {},
}
SEED = 20261124


def llm_module():
    spec = importlib.util.spec_from_file_location("tiny_llm", os.path.join(ROOT, "fixtures/tvm/llm.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# relaxc.tvm.build's quantize= formats, and the llama.cpp file type of the same weights' format.
LLAMA_FTYPES = {
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q4_K": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
}


def build(work, relaxc_bin, size, quantize=None):
    """The relaxc model (.so), the GGUF file and TVM's greedy tokens, built once per work dir.
    With quantize, the model's dense weights are quantized by relaxc.tvm.build into that format,
    the GGUF file is llama.cpp's quantization of the same weights into it (llama.cpp's own
    quantizer), and TVM's tokens are its VM's on the very executable relaxc compiles."""
    suffix = f"_{quantize}" if quantize else ""
    names = (f"llama_lib{suffix}.so", f"llama{suffix}.gguf", f"tvm_tokens{suffix}.npy")
    so, gguf_path, tokens_path = (os.path.join(work, n) for n in names)
    if all(os.path.exists(p) for p in (so, gguf_path, tokens_path)):
        return so, gguf_path, np.load(tokens_path)
    os.makedirs(work, exist_ok=True)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ.setdefault("RELAXC", relaxc_bin)
    import relaxc.tvm

    from tvm import relax

    llm = llm_module()
    shape = llm.Shape(**SIZES[size])
    mod, values = llm.export_with_weights(shape, SEED)
    weights = {k: v.numpy() for k, v in values.items()}
    print(f"model: {sum(w.size for w in weights.values()) / 1e6:.3f} M parameters", flush=True)
    f32_gguf = os.path.join(work, "llama.gguf")
    if not os.path.exists(f32_gguf):
        write_gguf(f32_gguf, weights, shape)
    if quantize:
        quantize_gguf(f32_gguf, gguf_path, LLAMA_FTYPES[quantize])
    for fn in ["embed", "prefill", "decode"]:
        mod = relax.transform.BindParams(fn, values)(mod)
    t = time.time()
    ex = relaxc.tvm.build(mod, target="llvm", quantize=quantize)
    tar = os.path.join(work, "llama_lib.tar")
    ex.export_library(tar)
    print(f"relaxc.tvm.build + export: {time.time() - t:.0f} s", flush=True)
    t = time.time()
    subprocess.run([relaxc_bin, "compile", tar, "--exec-mode", "compiled", "-o", so], check=True)
    print(f"relaxc compile: {time.time() - t:.0f} s", flush=True)
    os.remove(tar)
    t = time.time()
    # Quantized: TVM's VM runs relaxc.tvm.build's executable itself (its kernels registered).
    reference = ex if quantize else relax.build(mod, target="llvm")
    tokens = tvm_greedy(reference, 8, shape.hidden)
    print(
        f"TVM {'VM on the quantized build' if quantize else 'default build'}, 8 greedy tokens: {time.time() - t:.0f} s",
        flush=True,
    )
    np.save(tokens_path, np.array(tokens, np.int32))
    return so, gguf_path, np.array(tokens, np.int32)


def tvm_greedy(ex, n, hidden):
    """TVM's own VM and KV cache, greedy, as fixtures/tvm/llm.py drives it."""
    import tvm_ffi

    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(ex, tvm.cpu())
    g = tvm.get_global_func
    add, begin, end = (
        g("vm.builtin.kv_state_add_sequence"),
        g("vm.builtin.kv_state_begin_forward"),
        g("vm.builtin.kv_state_end_forward"),
    )
    kv = vm["create_paged_kv_cache"](*[tvm_ffi.Shape([v]) for v in [1, 512, 64, 16]], tvm_ffi.Shape([0]))
    add(kv, 0)

    def step(ids):
        e = vm["embed"](tvm.runtime.tensor(np.array(ids, "int32"))).numpy()
        fn = "prefill" if len(ids) > 1 else "decode"
        begin(kv, tvm_ffi.Shape([0]), tvm_ffi.Shape([len(ids)]))
        logits, _ = vm[fn](tvm.runtime.tensor(e.reshape(1, len(ids), hidden)), kv)
        end(kv)
        return int(logits.numpy().reshape(-1).argmax())

    tokens = [step(PROMPT)]
    while len(tokens) < n:
        tokens.append(step([tokens[-1]]))
    return tokens


def quantize_gguf(f32_path, path, ftype):
    """llama.cpp's quantizer (llama-cpp-python) writes the f32 file's weights as file type `ftype`
    (llama_cpp's name for it, e.g. LLAMA_FTYPE_MOSTLY_Q8_0)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype)
    if llama_cpp.llama_model_quantize(f32_path.encode(), path.encode(), params) != 0:
        sys.exit(f"llama.cpp's quantizer failed on {ftype}")


def permute_rope(w, heads):
    """Rows of a Q or K projection reordered so that llama.cpp's adjacent-pair rotation computes
    TVM's half rotation (llama.cpp's convert_hf_to_gguf does the same to a Hugging Face Llama)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, w, c):
    import gguf

    out = gguf.GGUFWriter(path, "llama")
    out.add_name("relaxc-midsize")
    out.add_context_length(2048)
    out.add_embedding_length(c.hidden)
    out.add_block_count(c.layers)
    out.add_feed_forward_length(c.ffn)
    out.add_head_count(c.heads)
    out.add_head_count_kv(c.kv_heads)
    out.add_rope_dimension_count(c.head_dim)
    out.add_layer_norm_rms_eps(1e-5)
    out.add_rope_freq_base(10000.0)
    out.add_file_type(gguf.LlamaFileType.ALL_F32)
    # A character-level SentencePiece vocabulary, so that text means the same to llama.cpp and to
    # the tokenizer.json relaxc.llm writes (bench/serve.py sends both servers text): <unk>, <s>,
    # </s>, the 256 byte-fallback tokens, one token per printable ASCII character (a space is
    # SentencePiece's U+2581), and unused tokens up to the model's vocabulary size.
    chars = ["\u2581"] + [chr(i) for i in range(33, 127)]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + chars
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(chars)
    if c.vocab < len(tokens):  # the tiny model: ids only
        tokens, types = [f"<t{i}>" for i in range(c.vocab)], [gguf.TokenType.NORMAL] * c.vocab
    types += [gguf.TokenType.UNUSED] * (c.vocab - len(tokens))
    tokens += [f"<unused{i}>" for i in range(c.vocab - len(tokens))]
    out.add_tokenizer_model("llama")
    out.add_token_list([t.encode() for t in tokens])
    out.add_token_scores([0.0] * c.vocab)
    out.add_token_types(types)
    out.add_unk_token_id(0)
    out.add_bos_token_id(1)
    out.add_eos_token_id(2)
    out.add_tensor("token_embd.weight", w["embed_tokens.weight"])
    q_rows, kv_rows = c.heads * c.head_dim, c.kv_heads * c.head_dim
    for i in range(c.layers):
        p = f"layers.{i}."
        qkv = w[p + "attn.qkv_proj.weight"]
        q, k, v = qkv[:q_rows], qkv[q_rows : q_rows + kv_rows], qkv[q_rows + kv_rows :]
        gate_up = w[p + "mlp.gate_up.weight"]
        for name, tensor in [
            ("attn_norm", w[p + "attn_norm.weight"]),
            ("attn_q", permute_rope(q, c.heads)),
            ("attn_k", permute_rope(k, c.kv_heads)),
            ("attn_v", v),
            ("attn_output", w[p + "attn.o_proj.weight"]),
            ("ffn_norm", w[p + "mlp_norm.weight"]),
            ("ffn_gate", gate_up[: c.ffn]),
            ("ffn_up", gate_up[c.ffn :]),
            ("ffn_down", w[p + "mlp.down.weight"]),
        ]:
            out.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(tensor, np.float32))
    out.add_tensor("output_norm.weight", w["norm.weight"])
    out.add_tensor("output.weight", w["lm_head.weight"])
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()


def relaxc_generate(relaxc, so, threads, tokens, runs, logits=None):
    cmd = [
        relaxc,
        "generate",
        so,
        "--prompt",
        ",".join(map(str, PROMPT)),
        "--max-new-tokens",
        str(tokens),
        "--max-total-seq-len",
        "512",
        "--prefill-chunk-size",
        "64",
    ]
    if runs:
        cmd += ["--bench", str(runs)]
    if logits:
        cmd += ["--logits", logits]
    env = dict(os.environ, TVM_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    new = [int(t) for t in out.splitlines()[0].split(":")[1].split()]
    prefill = float(re.search(r"prefill: (?:median )?([0-9.]+) ms", out).group(1))
    tps = float(re.search(r"decode: (?:median )?([0-9.]+) tokens/s", out).group(1))
    return new, prefill, tps


LLAMA_CPP = r"""
import sys, time, json, numpy as np
import llama_cpp
from llama_cpp import Llama
path, threads, tokens, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
prompt = json.loads(sys.argv[5])
# sys.argv[7] == "f32": the KV cache in float32, as relaxc keeps it (llama.cpp's default is f16).
kv = {"type_k": 0, "type_v": 0} if sys.argv[7] == "f32" else {}
# sys.argv[8]: a variant of llama.cpp's own arithmetic, to see how far it moves its own logits:
# "flash" (flash attention on; off by default on CPU), "plain" (weights not repacked at load).
variant = sys.argv[8] if len(sys.argv) > 8 else ""
if variant == "flash":
    kv["flash_attn"] = True
if variant == "plain":  # Llama() takes its model defaults from the llama_cpp.llama_cpp module
    import llama_cpp.llama_cpp as low_level
    defaults = low_level.llama_model_default_params
    def plain_params():
        params = defaults()
        params.use_extra_bufts = False
        return params
    low_level.llama_model_default_params = plain_params
# sys.argv[9]: the context; batches of up to 512 prompt tokens (llama.cpp's default micro-batch).
n_ctx = int(sys.argv[9]) if len(sys.argv) > 9 else 512
llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=min(512, n_ctx), n_threads=threads, n_threads_batch=threads,
            verbose=False, **kv)
prefills, rates, first, generated = [], [], None, None
vocab = llm.n_vocab()
last = lambda: np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(vocab,))
for run in range(runs + 1):
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    logits = np.array(last(), np.float32)
    prefill = time.perf_counter() - t
    out = [int(logits.argmax())]
    t = time.perf_counter()
    while len(out) < tokens:
        llm.eval([out[-1]])
        out.append(int(np.argmax(last())))
    decode = time.perf_counter() - t
    if run == 0:
        first, generated = logits, out
    else:
        prefills.append(prefill * 1e3)
        rates.append((tokens - 1) / decode)
np.save(sys.argv[6], first)
print(json.dumps({"tokens": generated, "prefill_ms": float(np.median(prefills)), "tps": float(np.median(rates))}))
"""


def llama_cpp(gguf_path, threads, tokens, runs, logits_path, kv_cache="f16", variant="", prompt=None, context=512):
    """llama.cpp's greedy tokens, prefill ms and decode tokens/s on the file; the first prefill's
    logits saved at logits_path. kv_cache="f32" keeps its KV cache in float32, as relaxc does, for
    comparing numbers; timings use its default, f16. variant "flash" turns its flash attention on,
    "plain" keeps its weights as the file has them (no repacking): both change only the order of
    its arithmetic. prompt (default PROMPT) and context size set the run's length."""
    import json

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            LLAMA_CPP,
            gguf_path,
            str(threads),
            str(tokens),
            str(runs),
            json.dumps(PROMPT if prompt is None else prompt),
            logits_path,
            kv_cache,
            variant,
            str(context),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["tokens"], r["prefill_ms"], r["tps"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relaxc", default=os.path.join(ROOT, "target/release/relaxc"))
    ap.add_argument("--size", choices=sorted(SIZES), default="mid")
    ap.add_argument("--work", help="build cache (default /tmp/relaxc-llm-<size>)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3, help="generations per measurement (after a warm-up)")
    ap.add_argument(
        "--quantize",
        choices=sorted(LLAMA_FTYPES),
        help="quantize the dense weights at build time (relaxc.tvm.build's quantize=); llama.cpp runs "
        "its own quantization of the same weights into the same format",
    )
    args = ap.parse_args()
    relaxc = os.path.abspath(args.relaxc)
    work = args.work or f"/tmp/relaxc-llm-{'midsize' if args.size == 'mid' else args.size}"
    so, gguf_path, tvm_tokens = build(work, relaxc, args.size, args.quantize)

    # Agreement before timing: first prefill's logits, and TVM's first 8 greedy tokens.
    ours = os.path.join(work, "relaxc_logits.npz")
    new, _, _ = relaxc_generate(relaxc, so, 2, 8, 0, logits=ours)
    theirs = os.path.join(work, "llama_cpp_logits.npy")
    cpp_tokens, _, _ = llama_cpp(gguf_path, 2, 8, 0, theirs, kv_cache="f32")
    a, b = np.load(ours)["logits"][0], np.load(theirs)
    diff = float(np.abs(a - b).max() / np.abs(b).max())
    print(
        f"first prefill logits: relaxc vs llama.cpp (its KV cache in f32) max |diff| {diff:.2e} of the largest logit; "
        f"argmax {a.argmax()} / {b.argmax()}"
    )
    print(f"greedy tokens: TVM {[int(t) for t in tvm_tokens]}, relaxc {new}, llama.cpp {cpp_tokens}")
    # Quantized to int8 or 4 bits, the two are not the same model: llama.cpp's file types keep some
    # matrices wider (Q4_0 and Q4_K_S write the output projection in q6_K, Q4_K_S some in q5_K)
    # and quantize the embeddings, where relaxc.tvm.build quantizes every dense layer alike and
    # leaves the embeddings in f32; and both round activations to int8, which on this
    # random-weight model alone puts two runtimes up to ~3e-2 apart (bench/llm_gguf.py measures
    # that floor). Their distance is printed; the tokens must be TVM's on the same executable.
    exact = args.quantize in (None, "f16")
    if (exact and diff > 1e-3) or [int(t) for t in tvm_tokens] != new[:8]:
        sys.exit("relaxc disagrees with llama.cpp or TVM: not timing")

    results = {}
    for r in range(args.rounds):
        for threads in [1, 2]:
            _, p, t = relaxc_generate(relaxc, so, threads, args.tokens, args.runs)
            results.setdefault(("relaxc", threads), []).append((p, t))
            _, p, t = llama_cpp(gguf_path, threads, args.tokens, args.runs, theirs)
            results.setdefault(("llama.cpp", threads), []).append((p, t))
        print(f"round {r + 1} of {args.rounds} done", flush=True)
    cpu = next(
        (l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor()
    )
    print(
        f"\n{cpu}, {os.cpu_count()} cores; {len(PROMPT)}-token prompt, {args.tokens} new tokens; medians of {args.rounds} "
        f"rounds of {args.runs} runs"
    )
    print(
        "| threads | relaxc prefill (ms) | llama.cpp prefill (ms) | relaxc decode (tok/s) | llama.cpp decode (tok/s) | decode relaxc / llama.cpp |"
    )
    print("|---|---|---|---|---|---|")
    for threads in [1, 2]:
        rp = statistics.median(p for p, _ in results[("relaxc", threads)])
        rt = statistics.median(t for _, t in results[("relaxc", threads)])
        lp = statistics.median(p for p, _ in results[("llama.cpp", threads)])
        lt = statistics.median(t for _, t in results[("llama.cpp", threads)])
        print(f"| {threads} | {rp:.3f} | {lp:.3f} | {rt:.1f} | {lt:.1f} | {rt / lt:.2f}x |")


if __name__ == "__main__":
    main()
