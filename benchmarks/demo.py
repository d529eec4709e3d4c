"""The demo kernel: a fused elementwise expression compiled for this CPU, beside numpy.

``y = max(x * a + b, 0) * c`` over 16M float32 values: one pass over memory for tilecraft, four
temporaries-producing passes for numpy. Checked against numpy before it is timed.
"""
from __future__ import annotations

import numpy as np

import targets
from tensorir import te

from .common import side_by_side

N = 1 << 24


def make_kernel():
    n = te.var("n")
    x = te.placeholder((n,), "float32", "x")
    y = te.compute((n,), lambda i: te.max(x[i] * 1.5 + 0.25, 0.0) * 2.0, "y")
    return te.create_prim_func([x, y])


def run() -> list[dict]:
    func = make_kernel()
    mod = targets.build(func, targets.Target("llvm"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(N, dtype=np.float32)
    y = np.empty_like(x)
    mod["main"](x, y)
    ref = np.maximum(x * np.float32(1.5) + np.float32(0.25), np.float32(0)) * np.float32(2.0)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)

    ours, numpy_s = side_by_side(lambda: mod["main"](x, y),
                                 lambda: np.maximum(x * np.float32(1.5) + np.float32(0.25),
                                                    np.float32(0)) * np.float32(2.0))
    gbs = lambda s: 2 * 4 * N / s / 1e9  # bytes read + written
    return [{"kernel": "fused max(x*a+b,0)*c, 16M f32", "tilecraft_ms": ours * 1e3,
             "numpy_ms": numpy_s * 1e3, "tilecraft_GB/s": gbs(ours),
             "speedup_vs_numpy": numpy_s / ours, "checked": "allclose vs numpy"}]
