"""A random-weight MLP (matmul + bias, relu between layers) with a symbolic batch, and its
float64 numpy reference: shared by the tuning tests."""
from __future__ import annotations

import numpy as np

from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op


def mlp_module(sizes, seed: int = 0):
    """``(IRModule, reference)`` for layers ``sizes[0] -> sizes[1] -> ...``; input ``(batch, sizes[0])``."""
    rng = np.random.default_rng(seed)
    ws = [(rng.uniform(-0.3, 0.3, (a, b)).astype("float32"),
           rng.uniform(-0.3, 0.3, (b,)).astype("float32"))
          for a, b in zip(sizes[:-1], sizes[1:])]
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("batch", sizes[0]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i, (w, b) in enumerate(ws):
                h = bb.emit(op.add(bb.emit(op.matmul(h, const(w))), const(b)))
                if i != len(ws) - 1:
                    h = bb.emit(op.nn.relu(h))
            gv = bb.emit_output(h)
        bb.emit_func_output(gv)

    def reference(xv):
        h = xv.astype(np.float64)
        for i, (w, b) in enumerate(ws):
            h = h @ w + b
            if i != len(ws) - 1:
                h = np.maximum(h, 0)
        return h
    return bb.get(), reference
