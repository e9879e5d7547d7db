#!/usr/bin/env python3
"""End to end against ONNX Runtime: each ONNX model imported by TVM's ONNX front end, built with
relaxc.tvm.build (operators on relaxc's kernel library), compiled by relaxc in compiled mode, and
timed beside ONNX Runtime (CPUExecutionProvider, default optimisations, IOBinding) on the same
model, at 1 and 2 threads.

Models: the ONNX fixtures (fixtures/tvm: onnx_cnn, onnx_transformer) and bench/onnx_models.py's
small ResNet, MobileNetV2, BERT layer and GPT block at the batch sizes the issue names. Before
timing, relaxc's outputs must be within 1e-4 of ORT's (relative to the output's magnitude).

Each measurement is its own process (`relaxc run --bench` timed in-process around the call; ORT
timed in-process around run_with_iobinding), in interleaved rounds; the table gives medians over
rounds of each process's median, and relaxc / ORT per round, median of those ratios.

usage: python3 bench/e2e.py [--relaxc target/release/relaxc] [--rounds 5] [--only NAME...] [--publish]

--publish writes the run into the book (docs/src/benchmarks/e2e.md, its plot and JSON; bench/report.py).
"""

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "fixtures", "tvm"))
sys.path.insert(0, os.path.join(ROOT, "python"))


def fixture_models():
    """The ONNX fixtures as ONNX models with their first input set."""
    import generate
    import onnx_programs

    captured = {}
    original = onnx_programs.onnx_model

    def keep(nodes, inputs, outputs, inits):
        import onnx
        from onnx import helper

        graph = helper.make_graph(nodes, "m", inputs, outputs, initializer=inits)
        captured["model"] = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        onnx.checker.check_model(captured["model"])
        return original(nodes, inputs, outputs, inits)

    onnx_programs.onnx_model = keep
    out = []
    for name in ["onnx_cnn", "onnx_transformer"]:
        _, ok, _ = generate.MODELS[name]()
        case, args = list(ok.items())[-1]
        out.append((f"{name}_{case}", captured["model"], args))
    onnx_programs.onnx_model = original
    return out


def bench_models():
    import onnx_models

    return [(label, *builder(*args)) for label, builder, args in onnx_models.CONFIGS]


ORT_TIMER = r"""
import sys, time, statistics, numpy as np, onnxruntime as ort
path, inputs, threads, calls = sys.argv[1], np.load(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
io = s.io_binding()
for i, arg in zip(s.get_inputs(), sorted(inputs.files, key=lambda k: int(k[3:]))):
    io.bind_ortvalue_input(i.name, ort.OrtValue.ortvalue_from_numpy(inputs[arg]))
io.bind_output(s.get_outputs()[0].name)
for _ in range(10):
    s.run_with_iobinding(io)
np.save(sys.argv[5], io.copy_outputs_to_cpu()[0])
times = []
for _ in range(calls):
    t = time.perf_counter(); s.run_with_iobinding(io); times.append(time.perf_counter() - t)
print(statistics.median(times) * 1e6)
"""


def microseconds(text):
    value, unit = re.search(r"median ([0-9.]+) (µs|us|ms)", text).groups()
    return float(value) * (1000 if unit == "ms" else 1)


def prepare(work, relaxc_bin, models):
    import numpy as np
    import onnx
    import relaxc.tvm
    from tvm.relax.frontend.onnx import from_onnx

    built = []
    for label, model, args in models:
        onnx_path, so, inputs = (os.path.join(work, f"{label}.{ext}") for ext in ("onnx", "so", "npz"))
        onnx.save(model, onnx_path)
        np.savez(inputs, **{f"arg{i}": a for i, a in enumerate(args)})
        tar = os.path.join(work, f"{label}.tar")
        relaxc.tvm.build(from_onnx(model, keep_params_in_input=False), target="llvm").export_library(tar)
        subprocess.run([relaxc_bin, "compile", tar, "--exec-mode", "compiled", "-o", so], check=True)
        built.append((label, onnx_path, so, inputs))
    return built


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relaxc", default=os.path.join(ROOT, "target/release/relaxc"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--publish", action="store_true", help="write this run into the book's page for it")
    args = ap.parse_args()
    relaxc = os.path.abspath(args.relaxc)
    os.environ.setdefault("RELAXC", relaxc)

    models = [m for m in fixture_models() + bench_models() if not args.only or m[0] in args.only]
    with tempfile.TemporaryDirectory(prefix="relaxc-e2e-") as work:
        run(args, relaxc, models, work)


def run(args, relaxc, models, work):
    """Builds the models in work, checks and times them, prints the table."""
    import numpy as np

    built = prepare(work, relaxc, models)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    rows = {}
    for r in range(args.rounds):
        for label, onnx_path, so, inputs in built:
            for threads in [1, 2]:
                ref = os.path.join(work, f"{label}.ort.npy")
                ort_us = float(
                    subprocess.run(
                        [sys.executable, "-c", ORT_TIMER, onnx_path, inputs, str(threads), str(args.calls), ref],
                        env=env,
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout.split()[-1]
                )
                out = os.path.join(work, f"{label}.out.npz")
                run = subprocess.run(
                    [relaxc, "run", so, "--inputs", inputs, "--outputs", out, "--bench", str(args.calls)],
                    env=dict(env, TVM_NUM_THREADS=str(threads)),
                    check=True,
                    capture_output=True,
                    text=True,
                )
                ours = microseconds(run.stdout)
                got, want = np.load(out)["out0"], np.load(ref)
                err = float(np.abs(got.astype(np.float64) - want).max() / max(1.0, np.abs(want).max()))
                if err > 1e-4:
                    sys.exit(f"{label}: relaxc is {err:.1e} from ONNX Runtime")
                rows.setdefault((label, threads), []).append((ort_us, ours, ours / ort_us))
        print(f"round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
    import report

    table = [
        f"Medians of {args.rounds} interleaved rounds of {args.calls} calls, each measurement its own process; "
        "relaxc / ORT is the median of the rounds' ratios of times (below 1: relaxc is faster).",
        "",
        "| model | ORT 1T (µs) | relaxc 1T (µs) | relaxc / ORT 1T | ORT 2T (µs) | relaxc 2T (µs) | relaxc / ORT 2T |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios = {1: [], 2: []}
    bars = {}
    for label, *_ in built:
        cells = []
        for threads in [1, 2]:
            data = rows[(label, threads)]
            ratio = statistics.median(d[2] for d in data)
            ratios[threads].append(ratio)
            bars.setdefault(label, {})[report.threads(threads)] = 1 / ratio
            cells += [
                f"{statistics.median(d[0] for d in data):.0f}",
                f"{statistics.median(d[1] for d in data):.0f}",
                f"{ratio:.2f}x",
            ]
        table.append(f"| {label} | " + " | ".join(cells) + " |")
    geo = {t: math.exp(sum(map(math.log, v)) / len(v)) for t, v in ratios.items()}
    table.append(f"| geometric mean | | | {geo[1]:.2f}x | | | {geo[2]:.2f}x |")
    bars["geometric mean"] = {report.threads(t): 1 / g for t, g in geo.items()}
    print(report.machine())
    print("\n".join(table))
    if args.publish:
        report.publish(
            "e2e",
            "Small models: ONNX Runtime's time / relaxc's (above 1: relaxc is faster)",
            [table],
            bars,
            "ORT time / relaxc time",
            packages=("onnxruntime", "apache-tvm", "onnx", "numpy"),
            extra={"rows": {f"{label}/{t}": v for (label, t), v in rows.items()}},
        )


if __name__ == "__main__":
    main()
