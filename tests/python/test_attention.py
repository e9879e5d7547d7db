"""relaxc's paged-KV-cache attention kernels (relaxc.attention_ragged, _paged_prefill,
_paged_decode) against attention written out in numpy (float64): several sequences of different
lengths, grouped query heads, pages of several sizes with a partly filled last page, an empty
sequence, causal and not; the outputs and the base-2 log-sum-exp TVM's merge kernel expects. Then
the same bits at 1, 2 and 3 threads and on AVX2 as on AVX-512, close on the portable build, and
the errors. With TVM, the rewrite that swaps them into a module's KV cache (tests/llm.rs compares
every scenario of a Llama on them with TVM's own kernels). Needs numpy, pytest and apache-tvm-ffi.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_each_raises, unpinned_env
from test_kernels import ROOT, t
from test_tvm_ffi import relaxc_binary

EMPTY_LSE = -5e4


def reference(q, keys, values, visible, sm_scale):
    """Output [hq, d] and base-2 lse [hq] of one query row q [hq, d] against keys/values
    [n, hkv, d], of which the first `visible` rows count."""
    hq, d = q.shape
    group = hq // keys.shape[1]
    out, lse = np.zeros((hq, d)), np.full(hq, EMPTY_LSE)
    if visible <= 0:
        return out, lse
    for h in range(hq):
        k, v = keys[:visible, h // group].astype(np.float64), values[:visible, h // group].astype(np.float64)
        s = k @ q[h].astype(np.float64) * sm_scale
        m = s.max()
        p = np.exp(s - m)
        out[h] = p @ v / p.sum()
        lse[h] = (m + np.log(p.sum())) / np.log(2)
    return out, lse


def assert_close(got, want, what):
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max()) / scale
    assert err < 1e-5, f"{what}: {err:.2e} from numpy's"


def page_table(rng, lengths, hkv, d, page_size, spare=3):
    """Pages [P, 2, hkv, page_size, d] holding each sequence's rows at shuffled page ids, and the
    (page_indptr, page_values, length_info) that name them; returns them with each sequence's
    keys and values as [n, hkv, d]."""
    counts = [(n + page_size - 1) // page_size for n in lengths]
    total = sum(counts) + spare
    pages = rng.standard_normal((total, 2, hkv, page_size, d)).astype(np.float32)
    ids = rng.permutation(total)[: sum(counts)].astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    last = np.array([(n - 1) % page_size + 1 if n else 0 for n in lengths], np.int32)
    keys, values = [], []
    for b, n in enumerate(lengths):
        rows = [pages[ids[indptr[b] + r // page_size], :, :, r % page_size] for r in range(n)]
        stacked = np.array(rows).reshape(n, 2, hkv, d)
        keys.append(stacked[:, 0])
        values.append(stacked[:, 1])
    return pages, indptr, ids, last, keys, values


def rope_args(n_seq, rows):
    return t(np.zeros(rows, np.int32)), t(np.zeros(n_seq, np.int32))


@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 8), (16, 4, 64), (6, 6, 20)])
def test_ragged_prefill_is_causal_attention(library, hq, hkv, d):
    rng = np.random.default_rng(hq * 100 + d)
    lengths = [5, 1, 70, 3]
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    rows = int(indptr[-1])
    q = rng.standard_normal((rows, hq, d)).astype(np.float32)
    k = rng.standard_normal((rows, hkv, d)).astype(np.float32)
    v = rng.standard_normal((rows, hkv, d)).astype(np.float32)
    sm = 1 / np.sqrt(d)
    for causal in (1, 0):
        out, lse = np.zeros((rows, hq, d), np.float32), np.zeros((rows, hq), np.float32)
        q_pos, k_off = rope_args(len(lengths), rows)
        library["relaxc.attention_ragged"](
            t(q), t(indptr), t(k), t(v), t(indptr), q_pos, k_off, t(out), t(lse), causal, 0, 1.0, 10000.0, sm
        )
        for b, n in enumerate(lengths):
            for i in range(n):
                row = indptr[b] + i
                seq = slice(indptr[b], indptr[b + 1])
                want, want_lse = reference(q[row], k[seq], v[seq], i + 1 if causal else n, sm)
                assert_close(out[row], want, f"causal={causal} sequence {b} row {i}")
                assert_close(lse[row], want_lse, f"causal={causal} sequence {b} row {i} lse")


@pytest.mark.parametrize("page_size", [16, 5])
def test_paged_prefill_and_decode_read_the_pages(library, page_size):
    rng = np.random.default_rng(page_size)
    hq, hkv, d = 8, 2, 16
    lengths = [40, 0, 7, 16]  # one sequence with no pages: zeros and the empty lse
    pages, page_indptr, ids, last, keys, values = page_table(rng, lengths, hkv, d, page_size)
    sm = 0.3
    # Prefill: 3 new rows per sequence against the cached pages, causal and not.
    q_lengths = [3, 3, 2, 3]
    q_indptr = np.concatenate([[0], np.cumsum(q_lengths)]).astype(np.int32)
    rows = int(q_indptr[-1])
    q = rng.standard_normal((rows, hq, d)).astype(np.float32)
    for causal in (0, 1):
        out, lse = np.zeros((rows, hq, d), np.float32), np.zeros((rows, hq), np.float32)
        k_off, q_pos = t(np.zeros(len(lengths), np.int32)), t(np.zeros(rows, np.int32))
        library["relaxc.attention_paged_prefill"](
            t(q), t(q_indptr), t(pages), t(page_indptr), t(ids), t(last), k_off, q_pos,
            t(out), t(lse), causal, 0, 1.0, 10000.0, sm,
        )  # fmt: skip
        for b, n in enumerate(lengths):
            for i in range(q_lengths[b]):
                visible = min(n, n - q_lengths[b] + i + 1) if causal else n
                want, want_lse = reference(q[q_indptr[b] + i], keys[b], values[b], visible, sm)
                assert_close(out[q_indptr[b] + i], want, f"prefill causal={causal} sequence {b} row {i}")
                assert_close(lse[q_indptr[b] + i], want_lse, f"prefill causal={causal} sequence {b} row {i} lse")
    # Decode: one row per sequence against all its rows.
    q = rng.standard_normal((len(lengths), hq, d)).astype(np.float32)
    out, lse = np.zeros((len(lengths), hq, d), np.float32), np.zeros((len(lengths), hq), np.float32)
    k_off, q_pos = rope_args(len(lengths), len(lengths))
    library["relaxc.attention_paged_decode"](
        t(q), t(pages), t(page_indptr), t(ids), t(last), k_off, q_pos, t(out), t(lse), 0, 1.0, 10000.0, sm
    )
    for b, n in enumerate(lengths):
        want, want_lse = reference(q[b], keys[b], values[b], n, sm)
        assert_close(out[b], want, f"decode sequence {b}")
        assert_close(lse[b], want_lse, f"decode sequence {b} lse")


THREAD_SCRIPT = r"""
import sys, numpy as np, tvm_ffi
path, out_path = sys.argv[1], sys.argv[2]
names = dict(l.split("\t") for l in open(path + ".tsv").read().splitlines())
lib = tvm_ffi.load_module(path)
ragged, decode = lib[names["relaxc.attention_ragged"]], lib[names["relaxc.attention_paged_decode"]]
t = lambda a: tvm_ffi.from_dlpack(np.ascontiguousarray(a))
rng = np.random.default_rng(5)
zeros = lambda n: t(np.zeros(n, np.int32))

# Two causal sequences, rows [0, split) and [split, rows): the output and lse.
def ragged_case(hq, hkv, d, rows, split, sm_scale):
    q = rng.standard_normal((rows, hq, d)).astype(np.float32)
    k = rng.standard_normal((rows, hkv, d)).astype(np.float32)
    v = rng.standard_normal((rows, hkv, d)).astype(np.float32)
    indptr = np.array([0, split, rows], np.int32)
    out, lse = np.zeros((rows, hq, d), np.float32), np.zeros((rows, hq), np.float32)
    ragged(t(q), t(indptr), t(k), t(v), t(indptr), zeros(rows), zeros(2), t(out), t(lse), 1, 0, 1.0, 1e4, sm_scale)
    return out, lse

hq, hkv, d = 16, 4, 64
out, lse = ragged_case(hq, hkv, d, 300, 120, 0.125)
pages = rng.standard_normal((40, 2, hkv, 16, d)).astype(np.float32)
ids = rng.permutation(40).astype(np.int32)
qd = rng.standard_normal((2, hq, d)).astype(np.float32)
od, ld = np.zeros((2, hq, d), np.float32), np.zeros((2, hq), np.float32)
decode(t(qd), t(pages), t(np.array([0, 30, 40], np.int32)), t(ids), t(np.array([9, 16], np.int32)), zeros(2),
       zeros(2), t(od), t(ld), 0, 1.0, 1e4, 0.125)
# Six query heads per KV head (AVX-512 takes four side by side, then one and one) and a head dim
# past a multiple of 64.
out2, lse2 = ragged_case(12, 2, 80, 70, 33, 0.1)
np.savez(out_path, ragged=out, ragged_lse=lse, decode=od, decode_lse=ld, ragged_grouped=out2, ragged_grouped_lse=lse2)
"""


def run_script(tmp_path, name, env):
    path = str(tmp_path / "lib.so")
    if not os.path.exists(path):
        out = subprocess.run(
            [relaxc_binary(), "kernel-library", "-o", path], capture_output=True, text=True, check=True
        )
        (tmp_path / "lib.so.tsv").write_text(out.stdout)
        (tmp_path / "run.py").write_text(THREAD_SCRIPT)
    dest = str(tmp_path / f"{name}.npz")
    subprocess.run([sys.executable, str(tmp_path / "run.py"), path, dest], check=True, env=unpinned_env(**env))
    return np.load(dest)


def test_same_bits_at_any_thread_count_and_on_avx2_as_on_avx512(tmp_path):
    runs = {f"{n} threads": {"TVM_NUM_THREADS": str(n)} for n in [1, 2, 3]}
    results = {name: run_script(tmp_path, name.replace(" ", "_"), env) for name, env in runs.items()}
    first = results["1 threads"]
    for name, got in results.items():
        for key in first.files:
            assert np.array_equal(first[key].view(np.uint32), got[key].view(np.uint32)), f"{key}: {name} differs"
    # AVX2 gives AVX-512's bits (x86 machines differ in which they have); the portable build
    # (multiplies and adds unfused) rounds differently, but only so.
    avx2 = run_script(tmp_path, "avx2", {"TVM_NUM_THREADS": "2", "RELAXC_QUANT_ISA": "avx2"})
    portable = run_script(tmp_path, "portable", {"TVM_NUM_THREADS": "2", "RELAXC_QUANT_ISA": "portable"})
    for key in first.files:
        assert np.array_equal(first[key].view(np.uint32), avx2[key].view(np.uint32)), f"{key}: AVX2 differs"
        assert_close(portable[key], first[key].astype(np.float64), f"{key} on the portable build")


def test_bad_calls_are_errors_naming_the_kernel(library):
    rng = np.random.default_rng(0)
    pages, page_indptr, ids, last, _, _ = page_table(rng, [20], 2, 8, 16)
    q = t(np.zeros((1, 4, 8), np.float32))
    out, lse = t(np.zeros((1, 4, 8), np.float32)), t(np.zeros((1, 4), np.float32))
    decode = library["relaxc.attention_paged_decode"]
    zeros = t(np.zeros(1, np.int32))

    def call(pages=pages, ids=ids, last=last, q=q, rotary=0, lse=lse, indptr=page_indptr):
        return lambda: decode(q, t(pages), t(indptr), t(ids), t(last), zeros, zeros, out, lse, rotary, 1.0, 1e4, 0.3)

    assert_each_raises(
        [
            (call(ids=np.array([0, 99], np.int32)), ValueError, "page id 99 of sequence 0 is outside the 5 pages"),
            (call(last=np.array([17], np.int32)), ValueError, "sequence 0's last page holds 17 rows of 16"),
            (call(indptr=np.array([-1, 2], np.int32)), ValueError, "page_indptr starts below 0"),
            (call(rotary=1), ValueError, "rotary_mode 1"),
            (call(q=t(np.zeros((1, 3, 8), np.float32))), ValueError, "3 query heads are not a multiple of 2 KV heads"),
            (call(q=t(np.zeros((1, 4, 6), np.float32))), ValueError, "q's head dim"),
            (call(pages=np.zeros((5, 2, 8), np.float32)), ValueError, "pages must be"),
            (call(ids=np.zeros(2, np.float32)), TypeError, "page_values"),
            (call(lse=t(np.zeros((1, 3), np.float32))), ValueError, "lse must be"),
            (lambda: decode(q), TypeError, "relaxc.attention_paged_decode expects 13 arguments, got 1"),
        ]
    )


def test_the_rewrite_puts_them_in_a_float32_cache():
    pytest.importorskip("tvm", reason="the rewrite runs on TVM modules")
    from relaxc.llm.gguf_file import read_config
    from relaxc.llm.model import LlamaFamily
    from relaxc.tvm.attention import use_library_attention

    model = LlamaFamily(read_config(os.path.join(ROOT, "fixtures/gguf/tiny_mixed.gguf")))
    mod, _ = model.export_tvm(spec=model.spec())

    def names(m):
        return {g.name_hint for g in m.functions}

    assert {"batch_prefill_ragged_kv", "batch_decode_paged_kv_cpu"} <= names(mod)
    rewritten = use_library_attention(mod)
    text = rewritten["create_paged_kv_cache"].script()
    for kernel in ["attention_ragged", "attention_paged_prefill", "attention_paged_decode"]:
        assert f'R.ExternFunc("relaxc.{kernel}")' in text
    assert not {"batch_prefill_ragged_kv", "batch_prefill_paged_kv_cpu", "batch_decode_paged_kv_cpu"} & names(rewritten)
    # The sliding-window kernels (and the merge) stay TVM's.
    assert "batch_decode_paged_kv_cpu_sliding_window" in names(rewritten)
