"""ONNX models for relaxc's kernel-library benchmarks and fixtures, built with onnx.helper from
seeded random weights (no framework needed), in the forms exporters write them:

  resnet     a small ResNet (CIFAR-style ResNet-18 at half width): conv 3x3 stem, four stages of
             two basic blocks (32, 64, 128, 256 channels; strides 1, 2, 2, 2), conv + BatchNorm +
             ReLU, residual adds, global average pool, Gemm; input [n, 3, 56, 56]
  mobilenet  a small MobileNetV2: stem conv, inverted residual blocks (1x1 expand, 3x3 depthwise,
             1x1 project, Clip 0..6 as ReLU6, residual adds where shapes allow), global average
             pool, Gemm; input [n, 3, 96, 96]
  bert       one BERT-base encoder layer: hidden 768, 12 heads, FFN 3072, biases, attention scaled
             by 1/8, erf-GELU written out (Div, Erf, Add, Mul, Mul), post-LayerNorm; [b, s, 768]
  gpt        one GPT-2 block: pre-LayerNorm, fused QKV projection split three ways, causal mask,
             tanh-GELU written out, residuals; [b, s, 768]

Each builder takes the batch (and sequence length) and returns (onnx.ModelProto, inputs). Sizes
can be scaled down (the fixtures in fixtures/tvm/lib_* are small versions), and `batch=None`
makes the batch dim symbolic ("n"; the inputs then have batch 2).
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Graph:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []
        self.count = 0

    def name(self, prefix):
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, array, prefix="c"):
        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), n))
        return n

    def weight(self, shape, fan_in):
        return self.const((self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), "w")

    def node(self, op, inputs, **attrs):
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def model(self, inputs, output, out_shape, batch=1):
        symbolic = lambda shape: ["n" if d is None else d for d in shape]
        inputs = [(n, symbolic(s)) for n, s in inputs]
        out_shape = symbolic(out_shape)
        graph = helper.make_graph(
            self.nodes,
            "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)],
            self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model

    # -- building blocks --

    def conv_bn(self, x, cin, cout, k, stride=1, groups=1, act="relu"):
        w = self.weight((cout, cin // groups, k, k), cin // groups * k * k)
        y = self.node("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=groups)
        scale = self.const((1.0 + 0.1 * self.rng.standard_normal(cout)).astype(np.float32))
        bias = self.const((0.1 * self.rng.standard_normal(cout)).astype(np.float32))
        mean = self.const((0.1 * self.rng.standard_normal(cout)).astype(np.float32))
        var = self.const((1.0 + 0.1 * np.abs(self.rng.standard_normal(cout))).astype(np.float32))
        y = self.node("BatchNormalization", [y, scale, bias, mean, var], epsilon=1e-5)
        if act == "relu":
            y = self.node("Relu", [y])
        elif act == "relu6":
            y = self.node("Clip", [y, self.const(np.float32(0)), self.const(np.float32(6))])
        return y

    def linear(self, x, din, dout, bias=True):
        y = self.node("MatMul", [x, self.weight((din, dout), din)])
        if bias:
            y = self.node("Add", [y, self.const((0.02 * self.rng.standard_normal(dout)).astype(np.float32))])
        return y

    def layer_norm(self, x, d):
        gamma = self.const((1.0 + 0.1 * self.rng.standard_normal(d)).astype(np.float32))
        beta = self.const((0.1 * self.rng.standard_normal(d)).astype(np.float32))
        return self.node("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-5)

    def classifier(self, x, c, classes=10):
        y = self.node("GlobalAveragePool", [x])
        y = self.node("Flatten", [y])
        return self.node("Gemm", [y, self.weight((c, classes), c), self.const(np.zeros(classes, np.float32))])


def _input(seed, batch, shape):
    rng = np.random.default_rng(seed + 100)
    return [rng.standard_normal([2 if batch is None else batch, *shape]).astype(np.float32)]


def resnet(batch, seed=1, widths=(32, 64, 128, 256), size=56):
    g = _Graph(seed)
    y = g.conv_bn("x", 3, widths[0], 3)
    cin = widths[0]
    for cout, stride in zip(widths, [1, 2, 2, 2]):
        for block in range(2):
            s = stride if block == 0 else 1
            h = g.conv_bn(y, cin, cout, 3, s)
            h = g.conv_bn(h, cout, cout, 3, 1, act=None)
            shortcut = y if (s == 1 and cin == cout) else g.conv_bn(y, cin, cout, 1, s, act=None)
            y = g.node("Relu", [g.node("Add", [h, shortcut])])
            cin = cout
    out = g.classifier(y, cin)
    model = g.model([("x", [batch, 3, size, size])], out, [batch, 10])
    return model, _input(seed, batch, (3, size, size))


def mobilenet(batch, seed=2, size=96):
    g = _Graph(seed)
    y = g.conv_bn("x", 3, 16, 3, 2, act="relu6")
    cin = 16
    # (expansion, channels, blocks, stride): MobileNetV2's table at half width, shortened.
    for t, c, n, s in [(1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 3, 2), (6, 32, 2, 2), (6, 48, 2, 1), (6, 80, 2, 2)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            h = y if t == 1 else g.conv_bn(y, cin, hidden, 1, act="relu6")
            h = g.conv_bn(h, hidden, hidden, 3, stride, groups=hidden, act="relu6")
            h = g.conv_bn(h, hidden, c, 1, act=None)
            y = g.node("Add", [h, y]) if stride == 1 and cin == c else h
            cin = c
    y = g.conv_bn(y, cin, 320, 1, act="relu6")
    out = g.classifier(y, 320)
    model = g.model([("x", [batch, 3, size, size])], out, [batch, 10])
    return model, _input(seed, batch, (3, size, size))


def _attention(g, q, k, v, seq, heads, d, mask=None):
    head = d // heads
    # Reshape's 0 copies the input's dim: the batch may be symbolic.
    shape = g.const(np.array([0, seq, heads, head], np.int64))
    qh = g.node("Transpose", [g.node("Reshape", [q, shape])], perm=[0, 2, 1, 3])
    kh = g.node("Transpose", [g.node("Reshape", [k, shape])], perm=[0, 2, 3, 1])
    vh = g.node("Transpose", [g.node("Reshape", [v, shape])], perm=[0, 2, 1, 3])
    s = g.node("Div", [g.node("MatMul", [qh, kh]), g.const(np.float32(np.sqrt(head)))])
    if mask is not None:
        s = g.node("Add", [s, mask])
    p = g.node("Softmax", [s], axis=-1)
    o = g.node("Transpose", [g.node("MatMul", [p, vh])], perm=[0, 2, 1, 3])
    return g.node("Reshape", [o, g.const(np.array([0, seq, d], np.int64))])


def bert(batch, seq, seed=3, d=768, heads=12, ffn=3072):
    g = _Graph(seed)
    q, k, v = g.linear("x", d, d), g.linear("x", d, d), g.linear("x", d, d)
    a = _attention(g, q, k, v, seq, heads, d)
    h = g.layer_norm(g.node("Add", [g.linear(a, d, d), "x"]), d)
    f = g.linear(h, d, ffn)
    erf = g.node("Erf", [g.node("Div", [f, g.const(np.float32(np.sqrt(2.0)))])])
    gelu = g.node("Mul", [g.node("Mul", [f, g.node("Add", [erf, g.const(np.float32(1.0))])]), g.const(np.float32(0.5))])
    out = g.layer_norm(g.node("Add", [g.linear(gelu, ffn, d), h]), d)
    model = g.model([("x", [batch, seq, d])], out, [batch, seq, d])
    return model, _input(seed, batch, (seq, d))


def gpt(batch, seq, seed=4, d=768, heads=12, ffn=3072):
    g = _Graph(seed)
    h = g.layer_norm("x", d)
    qkv = g.linear(h, d, 3 * d)
    q, k, v = (g.name("split") for _ in range(3))
    g.nodes.append(helper.make_node("Split", [qkv, g.const(np.array([d, d, d], np.int64))], [q, k, v], axis=-1))
    mask = g.const(np.triu(np.full((seq, seq), -1e4, np.float32), 1))
    a = _attention(g, q, k, v, seq, heads, d, mask)
    x1 = g.node("Add", ["x", g.linear(a, d, d)])
    f = g.linear(g.layer_norm(x1, d), d, ffn)
    cube = g.node("Mul", [g.node("Mul", [f, f]), f])
    inner = g.node(
        "Mul",
        [
            g.node("Add", [f, g.node("Mul", [cube, g.const(np.float32(0.044715))])]),
            g.const(np.float32(np.sqrt(2.0 / np.pi))),
        ],
    )
    gelu = g.node(
        "Mul",
        [
            g.node("Mul", [f, g.const(np.float32(0.5))]),
            g.node("Add", [g.node("Tanh", [inner]), g.const(np.float32(1.0))]),
        ],
    )
    out = g.node("Add", [x1, g.linear(gelu, ffn, d)])
    model = g.model([("x", [batch, seq, d])], out, [batch, seq, d])
    return model, _input(seed, batch, (seq, d))


# The configurations the end-to-end benchmark runs: (label, builder, arguments).
CONFIGS = [
    ("resnet_n1", resnet, (1,)),
    ("resnet_n4", resnet, (4,)),
    ("mobilenet_n2", mobilenet, (2,)),
    ("bert_b1s7", bert, (1, 7)),
    ("bert_b3s16", bert, (3, 16)),
    ("gpt_b1s5", gpt, (1, 5)),
    ("gpt_b2s12", gpt, (2, 12)),
]
