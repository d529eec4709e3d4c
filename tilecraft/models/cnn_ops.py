"""Single CNN layers as the model zoo's networks use them: a convolution with its bias and
relu, a pooling, a global average pooling; NCHW float32, symbolic batch.

``conv_layer(...)`` is ``relu(conv2d(x, W) + b)`` (groups, strides, padding, any kernel);
``pool_layer(kind, ...)`` is ``max_pool2d`` / ``avg_pool2d`` / ``global_avg_pool2d``. Each
returns a ``Model`` (Relax module, numpy reference, the same ONNX graph), and ``CNN_LAYERS``
lists the shapes ``benchmarks.cnn_ops_cpu`` times: the common ones of ResNet-18/50,
MobileNet-V2, DenseNet-121 and Inception-v3 (plus a ResNeXt grouped conv).
"""
from __future__ import annotations

import numpy as np

from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op

from .common import Model, initializer, make_onnx_model, tensor_value_info, uniform


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv_out(size: int, k: int, s: int, p0: int, p1: int) -> int:
    return (size + p0 + p1 - k) // s + 1


def conv_ref(x: np.ndarray, w: np.ndarray, strides, pads, groups: int) -> np.ndarray:
    """NCHW convolution in numpy (float64); ``pads`` is ``(top, left, bottom, right)``."""
    (sh, sw), (pt, pl, pb, pr) = strides, pads
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, _, h, wd = x.shape
    o, i, kh, kw = w.shape
    oh, ow = (h - kh) // sh + 1, (wd - kw) // sw + 1
    out = np.zeros((n, o, oh, ow))
    opg = o // groups
    for g in range(groups):
        for a in range(kh):
            for b in range(kw):
                patch = x[:, g * i:(g + 1) * i, a:a + sh * (oh - 1) + 1:sh,
                          b:b + sw * (ow - 1) + 1:sw]
                out[:, g * opg:(g + 1) * opg] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * opg:(g + 1) * opg, :, a, b].astype(np.float64),
                    optimize=True)
    return out


def conv_layer(in_channels: int, out_channels: int, size, kernel, strides=1, padding=0,
               groups: int = 1, seed: int = 0, batch="batch", dtype: str = "float32",
               name: str = "conv") -> Model:
    """``relu(conv2d(x, W) + b)`` on ``x: (batch, in_channels, H, W)``; ``padding`` an int,
    ``(ph, pw)`` or ``(top, left, bottom, right)``.

    Examples
    --------
    >>> m = conv_layer(16, 32, 14, 3, padding=1)
    >>> m.dims
    ('batch',)
    """
    rng = np.random.default_rng(seed)
    (h, w), (kh, kw), (sh, sw) = _pair(size), _pair(kernel), _pair(strides)
    pads = (padding,) * 4 if isinstance(padding, int) else (
        tuple(padding) * 2 if len(padding) == 2 else tuple(padding))
    weight = uniform(rng, (out_channels, in_channels // groups, kh, kw),
                     in_channels // groups * kh * kw, dtype)
    bias = (0.1 * rng.standard_normal(out_channels)).astype(dtype)
    oh, ow = conv_out(h, kh, sh, pads[0], pads[2]), conv_out(w, kw, sw, pads[1], pads[3])

    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, in_channels, h, w), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(weight), strides=(sh, sw), padding=pads,
                                     groups=groups))
            y = bb.emit(op.add(y, const(bias.reshape(-1, 1, 1))))
            gv = bb.emit_output(bb.emit(op.nn.relu(y)))
        bb.emit_func_output(gv)

    def reference(xs):
        out = conv_ref(xs, weight, (sh, sw), pads, groups) + bias.reshape(-1, 1, 1)
        return np.maximum(out, 0).astype(dtype)

    from onnx import helper
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[kh, kw],
                              strides=[sh, sw], pads=[pads[0], pads[1], pads[2], pads[3]],
                              group=groups),
             helper.make_node("Relu", ["c"], ["y"])]
    onnx_model = make_onnx_model(
        nodes, [tensor_value_info("x", dtype, [batch, in_channels, h, w])],
        [tensor_value_info("y", dtype, [batch, out_channels, oh, ow])],
        [initializer("W", weight), initializer("B", bias)], name)

    def make_inputs(rng, batch):
        return [rng.standard_normal((batch, in_channels, h, w)).astype(dtype)]

    return Model(name, bb.get(), reference, onnx_model, ["x"],
                 (batch,) if isinstance(batch, str) else (), make_inputs,
                 {"W": weight, "B": bias})


def pool_layer(kind: str, channels: int, size, pool_size=3, strides=2, padding=0,
               batch="batch", dtype: str = "float32", name: str = "pool") -> Model:
    """``max_pool2d`` / ``avg_pool2d`` (``kind`` ``"max"`` / ``"avg"``, the average counting
    only the data) or ``global_avg_pool2d`` (``"global_avg"``) on ``(batch, channels, H, W)``.

    Examples
    --------
    >>> pool_layer("max", 8, 12).dims
    ('batch',)
    """
    h, w = _pair(size)
    k, s, p = _pair(pool_size), _pair(strides), _pair(padding)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, channels, h, w), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            if kind == "global_avg":
                y = op.nn.adaptive_avg_pool2d(x, 1)
            elif kind == "max":
                y = op.nn.max_pool2d(x, k, s, p)
            else:
                y = op.nn.avg_pool2d(x, k, s, p, count_include_pad=False)
            gv = bb.emit_output(bb.emit(y))
        bb.emit_func_output(gv)

    def reference(xs):
        xs = xs.astype(np.float64)
        if kind == "global_avg":
            return xs.mean(axis=(2, 3), keepdims=True).astype(dtype)
        fill = -np.inf if kind == "max" else 0.0
        xp = np.pad(xs, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=fill)
        ones = np.pad(np.ones_like(xs), ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
        oh, ow = conv_out(h, k[0], s[0], p[0], p[0]), conv_out(w, k[1], s[1], p[1], p[1])
        taps = [xp[:, :, a:a + s[0] * (oh - 1) + 1:s[0], b:b + s[1] * (ow - 1) + 1:s[1]]
                for a in range(k[0]) for b in range(k[1])]
        if kind == "max":
            return np.max(taps, axis=0).astype(dtype)
        counts = sum(ones[:, :, a:a + s[0] * (oh - 1) + 1:s[0], b:b + s[1] * (ow - 1) + 1:s[1]]
                     for a in range(k[0]) for b in range(k[1]))
        return (np.sum(taps, axis=0) / counts).astype(dtype)

    from onnx import helper
    if kind == "global_avg":
        node, oh, ow = helper.make_node("GlobalAveragePool", ["x"], ["y"]), 1, 1
    else:
        oh, ow = conv_out(h, k[0], s[0], p[0], p[0]), conv_out(w, k[1], s[1], p[1], p[1])
        node = helper.make_node("MaxPool" if kind == "max" else "AveragePool", ["x"], ["y"],
                                kernel_shape=list(k), strides=list(s),
                                pads=[p[0], p[1], p[0], p[1]])
    onnx_model = make_onnx_model(
        [node], [tensor_value_info("x", dtype, [batch, channels, h, w])],
        [tensor_value_info("y", dtype, [batch, channels, oh, ow])], [], name)

    def make_inputs(rng, batch):
        return [rng.standard_normal((batch, channels, h, w)).astype(dtype)]

    return Model(name, bb.get(), reference, onnx_model, ["x"],
                 (batch,) if isinstance(batch, str) else (), make_inputs)


# (label, builder kwargs): what benchmarks.cnn_ops_cpu times
CNN_LAYERS = [
    ("resnet stem 7x7 s2 3->64 @224", dict(conv=(3, 64, 224, 7, 2, 3))),
    ("resnet maxpool 3x3 s2 64 @112", dict(pool=("max", 64, 112, 3, 2, 1))),
    ("resnet 1x1 64->64 @56", dict(conv=(64, 64, 56, 1, 1, 0))),
    ("resnet 3x3 64->64 @56", dict(conv=(64, 64, 56, 3, 1, 1))),
    ("resnet 1x1 64->256 @56", dict(conv=(64, 256, 56, 1, 1, 0))),
    ("resnet 1x1 256->64 @56", dict(conv=(256, 64, 56, 1, 1, 0))),
    ("resnet 3x3 s2 128->128 @56", dict(conv=(128, 128, 56, 3, 2, 1))),
    ("resnet 1x1 s2 256->512 @56", dict(conv=(256, 512, 56, 1, 2, 0))),
    ("resnet 3x3 128->128 @28", dict(conv=(128, 128, 28, 3, 1, 1))),
    ("resnet 3x3 256->256 @14", dict(conv=(256, 256, 14, 3, 1, 1))),
    ("resnet 1x1 1024->256 @14", dict(conv=(1024, 256, 14, 1, 1, 0))),
    ("resnet 3x3 512->512 @7", dict(conv=(512, 512, 7, 3, 1, 1))),
    ("resnet 1x1 2048->512 @7", dict(conv=(2048, 512, 7, 1, 1, 0))),
    ("global avg pool 2048 @7", dict(pool=("global_avg", 2048, 7))),
    ("mobilenet dw 3x3 32 @112", dict(conv=(32, 32, 112, 3, 1, 1, 32))),
    ("mobilenet dw 3x3 s2 96 @112", dict(conv=(96, 96, 112, 3, 2, 1, 96))),
    ("mobilenet dw 3x3 144 @56", dict(conv=(144, 144, 56, 3, 1, 1, 144))),
    ("mobilenet 1x1 24->144 @56", dict(conv=(24, 144, 56, 1, 1, 0))),
    ("mobilenet 1x1 144->24 @56", dict(conv=(144, 24, 56, 1, 1, 0))),
    ("densenet 3x3 128->32 @56", dict(conv=(128, 32, 56, 3, 1, 1))),
    ("densenet avgpool 2x2 s2 128 @56", dict(pool=("avg", 128, 56, 2, 2, 0))),
    ("googlenet maxpool 3x3 s1 192 @28", dict(pool=("max", 192, 28, 3, 1, 1))),
    ("inception 1x7 128->128 @17", dict(conv=(128, 128, 17, (1, 7), 1, (0, 3, 0, 3)))),
    ("inception 3x3 s2 288->384 @35", dict(conv=(288, 384, 35, 3, 2, 0))),
    ("inception 5x5 48->64 @35", dict(conv=(48, 64, 35, 5, 1, 2))),
    ("resnext 3x3 g32 128->128 @56", dict(conv=(128, 128, 56, 3, 1, 1, 32))),
]


def cnn_layer(label: str, spec: dict, batch="batch") -> Model:
    """The ``Model`` of one ``CNN_LAYERS`` entry."""
    if "conv" in spec:
        c, o, size, k, s, p, *g = spec["conv"]
        return conv_layer(c, o, size, k, s, p, groups=g[0] if g else 1, batch=batch,
                          name=label)
    kind, c, size, *rest = spec["pool"]
    if kind == "global_avg":
        return pool_layer(kind, c, size, batch=batch, name=label)
    k, s, p = rest
    return pool_layer(kind, c, size, k, s, p, batch=batch, name=label)
