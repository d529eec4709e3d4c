"""The "light" model-zoo graphs shipped inside the onnx package, and seeded random weights for
them (their own weights are all 0.02, so their reference outputs prove little)."""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
NAMES = ["light_bvlc_alexnet", "light_densenet121", "light_inception_v1", "light_inception_v2",
         "light_resnet50", "light_shufflenet", "light_squeezenet", "light_vgg19",
         "light_zfnet512"]


def load(name: str) -> onnx.ModelProto:
    return onnx.load(os.path.join(LIGHT_DIR, name + ".onnx"))


def reference_output(name: str) -> np.ndarray:
    return numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT_DIR, name + "_output_0.pb")))


def data_input(model: onnx.ModelProto) -> tuple[str, np.ndarray]:
    """The image input and its test value, ``arange(n).reshape(shape) / n`` in float32."""
    inits = {t.name for t in model.graph.initializer}
    vi = [i for i in model.graph.input if i.name not in inits][0]
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    n = int(np.prod(shape))
    return vi.name, (np.arange(n, dtype=np.float32).reshape(shape) / n).astype(np.float32)


def _consumers(model):
    out = {}
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            out.setdefault(name, []).append((node, k))
    return out


def _random_value(rng, shape, uses):
    """Weights of a scale that keeps a deep network's activations in range."""
    node, k = uses[0] if uses else (None, 0)
    op = node.op_type if node is not None else ""
    shape = tuple(int(s) for s in shape)
    if op == "Conv" and k == 1:
        fan_in = int(np.prod(shape[1:]))
        return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
    if op == "Gemm" and k == 1:
        trans = any(a.name == "transB" and a.i for a in node.attribute)
        fan_in = shape[1] if trans else shape[0]
        return rng.standard_normal(shape) * np.sqrt(1.0 / fan_in)
    if op == "BatchNormalization" and k in (1, 4):      # scale, variance: positive
        return rng.uniform(0.5, 1.5, shape)
    if op == "Mul":                                     # DenseNet's scale after batch norm
        return rng.uniform(0.5, 1.5, shape)
    return 0.1 * rng.standard_normal(shape)


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of ``model`` whose weights (``ConstantOfShape`` of an initializer shape, and float
    initializers) are seeded random initializers, and whose final Softmax input (the logits) is
    an extra output."""
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    uses = _consumers(m)
    keep_nodes, new_inits = [], []
    replaced = set()
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = numpy_helper.to_array(inits[node.input[0]])
            # a weight feeding Unsqueeze (DenseNet) takes the Unsqueeze's consumers' role
            u = uses.get(node.output[0], [])
            if u and u[0][0].op_type == "Unsqueeze":
                u = uses.get(u[0][0].output[0], [])
            value = _random_value(rng, shape, u).astype(np.float32)
            new_inits.append(numpy_helper.from_array(value, node.output[0]))
            continue
        keep_nodes.append(node)
    for t in list(g.initializer):
        if t.data_type == onnx.TensorProto.FLOAT and t.name not in replaced:
            arr = numpy_helper.to_array(t)
            value = _random_value(rng, arr.shape, uses.get(t.name, [])).astype(np.float32)
            t.CopyFrom(numpy_helper.from_array(value, t.name))
    del g.node[:]
    g.node.extend(keep_nodes)
    g.initializer.extend(new_inits)
    softmax = [n for n in g.node if n.op_type == "Softmax"]
    if softmax:
        logits = softmax[-1].input[0]
        g.output.append(helper.make_tensor_value_info(logits, onnx.TensorProto.FLOAT, None))
    return m
