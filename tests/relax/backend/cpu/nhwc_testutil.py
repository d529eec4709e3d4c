"""Helpers for the NHWC convolution tests: one NHWC convolution with a bias as a Relax model
(symbolic batch) and its float64 numpy reference."""
from __future__ import annotations

import numpy as np

from tilecraft import relax
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op


def nhwc_conv_layer(cin: int, h: int, w: int, cout: int, k: int, rng, stride: int = 1):
    """``(executable, weight HWIO, bias)`` of ``conv2d(x, w, stride, padding=k // 2) + b`` in
    NHWC with a symbolic batch, built for ``llvm``."""
    wt = (rng.standard_normal((k, k, cin, cout)) * 0.2).astype("float32")
    b = rng.standard_normal(cout).astype("float32")
    x = Var("x", TensorStructInfo(("n", h, w, cin), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(wt), strides=stride, padding=k // 2,
                                     data_layout="NHWC", kernel_layout="HWIO"))
            gv = bb.emit_output(bb.emit(op.add(y, const(b))))
        bb.emit_func_output(gv)
    return relax.build(bb.get(), "llvm"), wt, b


def nhwc_conv_reference(x: np.ndarray, wt: np.ndarray, b: np.ndarray,
                        stride: int = 1) -> np.ndarray:
    """The layer of ``nhwc_conv_layer`` in float64 numpy."""
    k = wt.shape[0]
    _, h, w, _ = x.shape
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    xp = np.pad(x.astype(np.float64), ((0, 0), (k // 2,) * 2, (k // 2,) * 2, (0, 0)))
    return sum(np.einsum("nhwc,co->nhwo",
                         xp[:, a:a + stride * (oh - 1) + 1:stride,
                            c:c + stride * (ow - 1) + 1:stride], wt[a, c])
               for a in range(k) for c in range(k)) + b


def check_nhwc_layer(exe, wt: np.ndarray, b: np.ndarray, rng, h: int, w: int, stride: int = 1,
                     batches=(1, 3)) -> None:
    """Run ``nhwc_conv_layer``'s executable at each batch on random inputs against
    ``nhwc_conv_reference``."""
    vm = relax.VirtualMachine(exe)
    for n in batches:
        xv = rng.standard_normal((n, h, w, wt.shape[2])).astype("float32")
        np.testing.assert_allclose(vm["main"](xv).numpy(), nhwc_conv_reference(xv, wt, b, stride),
                                   rtol=1e-4, atol=1e-4)
