#!/usr/bin/env python3
"""The convolutions of bench/zoo.py's real models one by one: relaxc's kernel library against ONNX
Runtime, layer by layer.

For each model, every distinct Conv (input shape, weights, strides, pads, dilations, groups) at the
model's input shape becomes a one-node ONNX file with seeded weights and a bias; each is built
with `python -m relaxc.onnx` (compiled mode) and timed as bench/zoo.py times whole models (relaxc
run --bench; ORT's InferenceSession.run), interleaved, medians. The table gives each layer's
time in both runtimes, its GMAC/s in relaxc, and how many times the model runs it; the total
weighs every layer by that count, so it is the model's convolution time in each runtime.

Needs TVM 0.27, onnx, onnxsim, onnxruntime and numpy.

usage: python3 bench/conv_layers.py [--models yolo,orientation] [--threads 1] [--rounds 3] [--top 15]
"""

import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import zoo


def conv_layers(path, shapes):
    """{(input shape, weight shape, strides, pads, dilations, group): count} of the model's Convs,
    with the shapes its inputs have once the given input shapes are fixed."""
    import onnx
    import onnxsim

    model, _ = onnxsim.simplify(onnx.load(path), overwrite_input_shapes=shapes)
    model = onnx.shape_inference.infer_shapes(model)
    known = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]
    }
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    layers = {}
    for node in model.graph.node:
        if node.op_type != "Conv" or node.input[1] not in weights:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        w = weights[node.input[1]]
        key = (
            tuple(known[node.input[0]]),
            tuple(w),
            tuple(attrs.get("strides", [1, 1])),
            tuple(attrs.get("pads", [0, 0, 0, 0])),
            tuple(attrs.get("dilations", [1, 1])),
            int(attrs.get("group", 1)),
        )
        layers[key] = layers.get(key, 0) + 1
    return layers


def one_conv_model(layer, path, seed=0):
    """A one-node ONNX file of the layer, seeded weights and bias; returns its output shape."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x, w, strides, pads, dilations, group = layer
    rng = np.random.default_rng(seed)
    fan_in = int(np.prod(w[1:]))
    weight = (rng.standard_normal(w) / np.sqrt(fan_in)).astype(np.float32)
    bias = rng.standard_normal(w[0]).astype(np.float32)
    node = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], strides=list(strides), pads=list(pads), dilations=list(dilations), group=group
    )
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


def describe(layer):
    x, w, strides, pads, dilations, group = layer
    kind = "dw" if group == x[1] and group > 1 else (f"g{group}" if group > 1 else "")
    extra = f" s{strides[0]}" if strides != (1, 1) else ""
    extra += f" d{dilations[0]}" if dilations != (1, 1) else ""
    return f"{x[1]}x{x[2]}x{x[3]} -> {w[0]} {w[2]}x{w[3]}{extra} {kind}".rstrip()


def macs(layer):
    x, w, strides, pads, dilations, group = layer
    oh = (x[2] + pads[0] + pads[2] - dilations[0] * (w[2] - 1) - 1) // strides[0] + 1
    ow = (x[3] + pads[1] + pads[3] - dilations[1] * (w[3] - 1) - 1) // strides[1] + 1
    return x[0] * w[0] * oh * ow * w[1] * w[2] * w[3]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="yolo,orientation,det,rec,cls")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--top", type=int, default=15, help="layers shown per model (the largest by relaxc time)")
    parser.add_argument("--relaxc", default=os.path.join(ROOT, "target", "release", "relaxc"))
    parser.add_argument("--work", default="/tmp/relaxc-zoo")
    args = parser.parse_args()
    os.environ["RELAXC"] = args.relaxc
    import relaxc.onnx

    for name in args.models.split(","):
        requirement, filename, shapes, family = zoo.MODELS[name]
        path = zoo.fetch(args.work, requirement, filename)
        layers = conv_layers(path, shapes)
        print(f"== {name}: {family}, {sum(layers.values())} convolutions, {len(layers)} distinct", flush=True)
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            built = []
            for i, layer in enumerate(layers):
                onnx_path, so, npz = (os.path.join(tmp, f"{i}.{e}") for e in ("onnx", "so", "npz"))
                one_conv_model(layer, onnx_path)
                relaxc.onnx.build(onnx_path, so, exec_mode="compiled", log=lambda m: None)
                feeds = zoo.inputs_for(onnx_path, {"x": list(layer[0])})
                np.savez(npz, **feeds)
                np.savez(npz + ".args.npz", arg0=feeds["x"])
                built.append((layer, onnx_path, so, npz))
            times = {}
            for _ in range(args.rounds):
                for layer, onnx_path, so, npz in built:
                    r = zoo.relaxc_time(args.relaxc, so, npz + ".args.npz", args.threads, args.calls)
                    o = zoo.ort_time(onnx_path, npz, args.threads, args.calls)["median_us"]
                    times.setdefault(layer, []).append((r, o))
            for layer, _, _, _ in built:
                r = statistics.median(t[0] for t in times[layer])
                o = statistics.median(t[1] for t in times[layer])
                rows.append((layer, layers[layer], r, o))
        total_r = sum(n * r for _, n, r, _ in rows)
        total_o = sum(n * o for _, n, _, o in rows)
        print("| layer | count | relaxc (us) | ORT (us) | relaxc / ORT | relaxc GMAC/s | share of relaxc's conv time |")
        print("|---|---|---|---|---|---|---|")
        for layer, n, r, o in sorted(rows, key=lambda row: -row[1] * row[2])[: args.top]:
            print(
                f"| {describe(layer)} | {n} | {r:.1f} | {o:.1f} | {r / o:.2f} | {macs(layer) / r / 1e3:.1f} | "
                f"{n * r / total_r:.1%} |"
            )
        print(
            f"all convolutions, {args.threads} thread(s): relaxc {total_r / 1e3:.2f} ms, ORT {total_o / 1e3:.2f} ms, "
            f"ratio {total_r / total_o:.2f}\n",
            flush=True,
        )


if __name__ == "__main__":
    main()
