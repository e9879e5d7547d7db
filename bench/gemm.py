#!/usr/bin/env python3
"""f32 GEMM: relaxc's kernel library against ONNX Runtime's MatMul and numpy (OpenBLAS), at the
shapes the benchmark models use (BERT and GPT projections at batch x sequence 5-48, a GEMV) and at
256, 512 and 1024 cubes, as a fraction of the machine's measured FMA peak.

relaxc: relaxc.dense (weights prepacked, as relaxc.tvm packs a model's constant weights), called
through the kernel library `relaxc kernel-library` builds, from Python. ORT: a one-node MatMul with
B as an initializer (as weights are), IOBinding. numpy: np.matmul with out=. Each library in its
own process, interleaved rounds, medians; the peak is a register-only FMA loop built here with cc.

usage: python3 bench/gemm.py [--relaxc target/release/relaxc] [--threads 1] [--rounds 5]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = [
    (7, 768, 768),
    (7, 3072, 768),
    (7, 768, 3072),
    (5, 2304, 768),
    (48, 768, 3072),
    (1, 4096, 1024),
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
]

PEAK_C = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
  __m256 a[12], b = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-4f);
  for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps(i * 1e-3f);
  long n = 100000000; double t = now();
  for (long i = 0; i < n; i++)
#pragma GCC unroll 12
    for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], b, c);
  t = now() - t;
  float s = 0; for (int j = 0; j < 12; j++) s += a[j][0];
  printf("%f %f\n", n * 12.0 * 16 / t * 1e-9, s);
  return 0;
}
"""

RUNNER = r"""
import sys, time, statistics, json, numpy as np
kind, threads, shapes = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
def timeit(fn):
    fn(); it = 1
    while True:
        t = time.perf_counter()
        for _ in range(it): fn()
        if time.perf_counter() - t > 0.05: break
        it *= 2
    per = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(it): fn()
        per.append((time.perf_counter() - t) / it)
    return statistics.median(per)
rng = np.random.default_rng(0)
out = {}
if kind == "relaxc":
    import tvm_ffi
    sys.path.insert(0, sys.argv[5])
    from relaxc.tvm.pack import pack_columns
    names = dict(l.split("\t") for l in open(sys.argv[4] + ".tsv").read().splitlines())
    dense = tvm_ffi.load_module(sys.argv[4])[names["relaxc.dense"]]
    sc = tvm_ffi.from_dlpack(np.array([1, 0, 0], np.float32))
for m, n, k in shapes:
    a = rng.standard_normal((m, k), dtype=np.float32); b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.zeros((m, n), np.float32)
    if kind == "numpy":
        fn = lambda: np.matmul(a, b, out=c)
    elif kind == "ort":
        import onnxruntime as ort
        from onnx import helper, TensorProto, numpy_helper
        g = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"])], "g",
            [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])], [helper.make_tensor_value_info("C", TensorProto.FLOAT, [m, n])],
            [numpy_helper.from_array(b, "B")])
        so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
        s = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), so,
                                 providers=["CPUExecutionProvider"])
        io = s.io_binding(); io.bind_ortvalue_input("A", ort.OrtValue.ortvalue_from_numpy(a))
        y = ort.OrtValue.ortvalue_from_numpy(c); io.bind_ortvalue_output("C", y)
        fn = lambda: s.run_with_iobinding(io)
    else:
        at, wt, ct = tvm_ffi.from_dlpack(a), tvm_ffi.from_dlpack(pack_columns(b)), tvm_ffi.from_dlpack(c)
        fn = lambda: dense(at, wt, None, None, "none", sc, ct)
    t = timeit(fn)
    if kind == "ort":
        c = y.numpy()
    err = float(np.abs(c - a.astype(np.float64) @ b).max() / max(1.0, np.abs(a.astype(np.float64) @ b).max()))
    out[f"{m}x{n}x{k}"] = (t * 1e6, err)
print(json.dumps(out))
"""


def main():
    import json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relaxc", default=os.path.join(ROOT, "target/release/relaxc"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="relaxc-gemm-")
    peak_c, peak = os.path.join(work, "peak.c"), os.path.join(work, "peak")
    with open(peak_c, "w") as f:
        f.write(PEAK_C)
    subprocess.run(["cc", "-O3", "-mavx2", "-mfma", peak_c, "-o", peak], check=True)
    lib = os.path.join(work, "kernels.so")
    names = subprocess.run(
        [args.relaxc, "kernel-library", "-o", lib], check=True, capture_output=True, text=True
    ).stdout
    with open(lib + ".tsv", "w") as f:
        f.write(names)
    env = dict(
        os.environ,
        OPENBLAS_NUM_THREADS=str(args.threads),
        TVM_NUM_THREADS=str(args.threads),
        OMP_NUM_THREADS=str(args.threads),
    )
    shapes = json.dumps(SHAPES)
    results, peaks = {}, []
    for _ in range(args.rounds):
        peaks.append(float(subprocess.run([peak], capture_output=True, text=True, check=True).stdout.split()[0]))
        for kind in ["relaxc", "ort", "numpy"]:
            out = subprocess.run(
                [sys.executable, "-c", RUNNER, kind, str(args.threads), shapes, lib, os.path.join(ROOT, "python")],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            for shape, (us, err) in json.loads(out.strip().splitlines()[-1]).items():
                if err > 1e-4:
                    sys.exit(f"{kind} {shape}: {err:.1e} from float64")
                results.setdefault((kind, shape), []).append(us)
    fma_peak = statistics.median(peaks) * args.threads
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(
        f"{cpu}; {args.threads} thread(s); FMA peak {fma_peak:.1f} GFLOP/s (measured); medians of {args.rounds} rounds"
    )
    print(
        "| M x N x K | relaxc (µs) | GFLOP/s | % of peak | ORT (µs) | numpy (µs) | relaxc / best of ORT and numpy (time) |"
    )
    print("|---|---|---|---|---|---|---|")
    for m, n, k in SHAPES:
        key = f"{m}x{n}x{k}"
        r, o, p = (statistics.median(results[(kind, key)]) for kind in ["relaxc", "ort", "numpy"])
        gf = 2 * m * n * k / r * 1e-3
        print(f"| {key} | {r:.1f} | {gf:.1f} | {100 * gf / fma_peak:.0f}% | {o:.1f} | {p:.1f} | {r / min(o, p):.2f}x |")


if __name__ == "__main__":
    main()
