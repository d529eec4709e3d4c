"""A ResNet-50 bottleneck block (the identity-shortcut kind), NCHW, inference batch norm."""
from __future__ import annotations

import numpy as np

from tilecraft.relax import BlockBuilder, TensorStructInfo, TupleGetItem, Var, const, op

from .common import Model, initializer, make_onnx_model, tensor_value_info, uniform


def resnet_bottleneck(channels: int = 256, width: int = 64, height: int = 56,
                      image_width: int = 56, epsilon: float = 1e-5, dtype: str = "float32",
                      seed: int = 0, batch: int | str = "batch") -> Model:
    """The bottleneck block of ResNet-50's first stage on ``x: (batch, channels, H, W)``
    (symbolic ``batch``; an int makes it static)::

        h = relu(bn1(conv1x1(x, channels -> width)))
        h = relu(bn2(conv3x3(h, width -> width, padding 1)))
        y = relu(bn3(conv1x1(h, width -> channels)) + x)

    Convolutions are OIHW without bias; each batch norm is the inference form
    (``training=False``: the moving mean and variance are used). Weights come from
    ``numpy.random.default_rng(seed)``.

    Examples
    --------
    >>> m = resnet_bottleneck(channels=16, width=8, height=8, image_width=8)
    >>> m.dims
    ('batch',)
    """
    rng = np.random.default_rng(seed)
    convs = [("1", channels, width, 1, 0), ("2", width, width, 3, 1), ("3", width, channels, 1, 0)]
    p = {}
    for nm, cin, cout, k, _ in convs:
        p[f"conv{nm}_w"] = uniform(rng, (cout, cin, k, k), cin * k * k, dtype)
        p[f"bn{nm}_gamma"] = (1.0 + 0.1 * rng.standard_normal(cout)).astype(dtype)
        p[f"bn{nm}_beta"] = (0.1 * rng.standard_normal(cout)).astype(dtype)
        p[f"bn{nm}_mean"] = (0.1 * rng.standard_normal(cout)).astype(dtype)
        p[f"bn{nm}_var"] = rng.uniform(0.5, 1.5, cout).astype(dtype)

    # Relax
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, channels, height, image_width), dtype))

    def conv_bn(h, nm, k, pad):
        c = bb.emit(op.nn.conv2d(h, const(p[f"conv{nm}_w"]), strides=1, padding=pad))
        bn = bb.emit(op.nn.batch_norm(c, *(const(p[f"bn{nm}_{s}"])
                                           for s in ("gamma", "beta", "mean", "var")),
                                      axis=1, epsilon=epsilon))
        return bb.emit(TupleGetItem(bn, 0))

    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for nm, _, _, k, pad in convs[:2]:
                h = bb.emit(op.nn.relu(conv_bn(h, nm, k, pad)))
            h = conv_bn(h, "3", 1, 0)
            y = bb.emit(op.nn.relu(bb.emit(op.add(h, x))))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    mod = bb.get()

    # numpy
    p64 = {k: v.astype(np.float64) for k, v in p.items()}

    def conv(t, w, pad):
        if pad:
            t = np.pad(t, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        o, _, kh, kw = w.shape
        n, _, hh, ww = t.shape
        oh, ow = hh - kh + 1, ww - kw + 1
        out = np.zeros((n, o, oh, ow))
        for i in range(kh):
            for j in range(kw):
                out += np.einsum("nchw,oc->nohw", t[:, :, i:i + oh, j:j + ow], w[:, :, i, j],
                                 optimize=True)
        return out

    def bn(t, nm):
        c = (slice(None), None, None)
        return ((t - p64[f"bn{nm}_mean"][c]) / np.sqrt(p64[f"bn{nm}_var"][c] + epsilon)
                * p64[f"bn{nm}_gamma"][c] + p64[f"bn{nm}_beta"][c])

    def reference(x: np.ndarray) -> np.ndarray:
        t = x.astype(np.float64)
        h = t
        for nm, _, _, k, pad in convs[:2]:
            h = np.maximum(bn(conv(h, p64[f"conv{nm}_w"], pad), nm), 0.0)
        h = bn(conv(h, p64["conv3_w"], 0), "3")
        return np.maximum(h + t, 0.0).astype(dtype)

    # ONNX
    from onnx import helper
    n = helper.make_node
    inits = [initializer(k, v) for k, v in p.items()]
    nodes = []
    prev = "x"
    for nm, _, _, k, pad in convs:
        nodes.append(n("Conv", [prev, f"conv{nm}_w"], [f"c{nm}"], kernel_shape=[k, k],
                       pads=[pad] * 4, strides=[1, 1]))
        nodes.append(n("BatchNormalization", [f"c{nm}"] + [f"bn{nm}_{s}" for s in
                                                           ("gamma", "beta", "mean", "var")],
                       [f"b{nm}"], epsilon=epsilon))
        if nm != "3":
            nodes.append(n("Relu", [f"b{nm}"], [f"r{nm}"]))
            prev = f"r{nm}"
    nodes += [n("Add", ["b3", "x"], ["res"]), n("Relu", ["res"], ["y"])]
    shape = [batch, channels, height, image_width]
    onnx_model = make_onnx_model(nodes, [tensor_value_info("x", dtype, shape)],
                                 [tensor_value_info("y", dtype, shape)], inits,
                                 "resnet_bottleneck")

    def make_inputs(rng: np.random.Generator, batch: int) -> list[np.ndarray]:
        return [rng.standard_normal((batch, channels, height, image_width)).astype(dtype)]

    dims = (batch,) if isinstance(batch, str) else ()
    return Model("resnet_bottleneck", mod, reference, onnx_model, ["x"], dims, make_inputs, p)
