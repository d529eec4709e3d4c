"""A multi-layer perceptron: ``x @ W + b`` and relu per layer, no relu after the last one."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op

from .common import Model, initializer, make_onnx_model, tensor_value_info, uniform


def mlp(in_features: int = 784, hidden: Sequence[int] = (1024, 1024, 1024),
        out_features: int = 10, dtype: str = "float32", seed: int = 0,
        batch: int | str = "batch") -> Model:
    """A perceptron ``in_features -> hidden... -> out_features`` with relu between the layers,
    on an input ``x: (batch, in_features)`` with a symbolic ``batch`` (an int ``batch`` makes
    it static, for comparison).

    The weights are ``(in, out)`` matrices (``relax.op.matmul(x, W)``, ONNX ``MatMul``) and
    ``(out,)`` biases, uniform in ``+-1/sqrt(in)`` from ``numpy.random.default_rng(seed)``.

    Examples
    --------
    >>> m = mlp()                      # 784-1024-1024-1024-10: four layers
    >>> m.input_names, m.dims
    (['x'], ('batch',))
    """
    rng = np.random.default_rng(seed)
    sizes = [in_features, *hidden, out_features]
    weights = [(uniform(rng, (a, b), a, dtype), uniform(rng, (b,), a, dtype))
               for a, b in zip(sizes[:-1], sizes[1:])]
    last = len(weights) - 1

    # Relax
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, in_features), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i, (w, b) in enumerate(weights):
                h = bb.emit(op.matmul(h, const(w)))
                h = bb.emit(op.add(h, const(b)))
                if i != last:
                    h = bb.emit(op.nn.relu(h))
            gv = bb.emit_output(h)
        bb.emit_func_output(gv)
    mod = bb.get()

    # numpy
    def reference(x: np.ndarray) -> np.ndarray:
        h = x.astype(np.float64)
        for i, (w, b) in enumerate(weights):
            h = h @ w.astype(np.float64) + b
            if i != last:
                h = np.maximum(h, 0.0)
        return h.astype(dtype)

    # ONNX
    from onnx import helper
    nodes, inits = [], []
    prev = "x"
    for i, (w, b) in enumerate(weights):
        inits += [initializer(f"W{i}", w), initializer(f"b{i}", b)]
        nodes.append(helper.make_node("MatMul", [prev, f"W{i}"], [f"mm{i}"]))
        out = f"h{i}" if i != last else "y"
        if i != last:
            nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"a{i}"]))
            nodes.append(helper.make_node("Relu", [f"a{i}"], [out]))
        else:
            nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [out]))
        prev = out
    onnx_model = make_onnx_model(
        nodes, [tensor_value_info("x", dtype, [batch, in_features])],
        [tensor_value_info("y", dtype, [batch, out_features])], inits, "mlp")

    def make_inputs(rng: np.random.Generator, batch: int) -> list[np.ndarray]:
        return [rng.standard_normal((batch, in_features)).astype(dtype)]

    dims = (batch,) if isinstance(batch, str) else ()

    params = {}
    for i, (w, b) in enumerate(weights):
        params[f"W{i}"], params[f"b{i}"] = w, b
    return Model("mlp", mod, reference, onnx_model, ["x"], dims, make_inputs, params)
