"""Small workloads and oracles for the design-space tests (test_space_*.py)."""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir import te, interpret

RNG = np.random.default_rng(0)


def gemm(M=64, N=48, K=32):
    A = te.placeholder((M, K), "float32", "A")
    B = te.placeholder((K, N), "float32", "B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def gemm_bias_relu(M=32, N=32, K=16):
    A = te.placeholder((M, K), "float32", "A")
    B = te.placeholder((K, N), "float32", "B")
    bias = te.placeholder((N,), "float32", "bias")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    D = te.compute((M, N), lambda i, j: te.maximum(C[i, j] + bias[j], 0.0), "D")
    return te.create_prim_func([A, B, bias, D])


def conv2d_nhwc(N=1, H=6, W=6, CI=4, CO=8, KH=3, pad=1):
    X = te.placeholder((N, H, W, CI), "float32", "X")
    Wt = te.placeholder((KH, KH, CI, CO), "float32", "W")
    P = te.compute((N, H + 2 * pad, W + 2 * pad, CI), lambda n, h, w, c: te.if_then_else(
        te.all(h >= pad, h < H + pad, w >= pad, w < W + pad), X[n, h - pad, w - pad, c], 0.0),
        "pad")
    kh = te.reduce_axis((0, KH), "kh")
    kw = te.reduce_axis((0, KH), "kw")
    ci = te.reduce_axis((0, CI), "ci")
    Y = te.compute((N, H, W, CO), lambda n, h, w, co: te.sum(
        P[n, h + kh, w + kw, ci] * Wt[kh, kw, ci, co], axis=[kh, kw, ci]), "Y")
    return te.create_prim_func([X, Wt, Y])


def softmax(R=8, L=64):
    A = te.placeholder((R, L), "float32", "A")
    k = te.reduce_axis((0, L), "k")
    M = te.compute((R,), lambda i: te.max(A[i, k], axis=k), "M")
    E = te.compute((R, L), lambda i, j: te.exp(A[i, j] - M[i]), "E")
    k2 = te.reduce_axis((0, L), "k2")
    S = te.compute((R,), lambda i: te.sum(E[i, k2], axis=k2), "S")
    O = te.compute((R, L), lambda i, j: E[i, j] / S[i], "O")
    return te.create_prim_func([A, O])


def elementwise_chain(n=256):
    A = te.placeholder((n, 16), "float32", "A")
    B = te.compute((n, 16), lambda i, j: A[i, j] * 2.0, "B")
    C = te.compute((n, 16), lambda i, j: B[i, j] + 1.0, "C")
    D = te.compute((n, 16), lambda i, j: te.exp(C[i, j]) - 1.0, "D")
    return te.create_prim_func([A, D])


def row_sum(R=4, L=1024):
    A = te.placeholder((R, L), "float32", "A")
    k = te.reduce_axis((0, L), "k")
    B = te.compute((R,), lambda i: te.sum(A[i, k], axis=k), "B")
    return te.create_prim_func([A, B])


def symbolic_matmul(N=32, K=24):
    n = te.var("n")
    A = te.placeholder((n, K), "float32", "A")
    B = te.placeholder((K, N), "float32", "B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((n, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def _np_softmax(a):
    e = np.exp(a - a.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _np_conv(x, w):
    n, h, wd, ci = x.shape
    kh = w.shape[0]
    p = (kh - 1) // 2
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    out = np.zeros((n, h, wd, w.shape[3]), np.float32)
    for a in range(kh):
        for b in range(kh):
            out += np.einsum("nhwc,co->nhwo", xp[:, a:a + h, b:b + wd, :], w[a, b])
    return out


# name -> (builder, inputs(shape_vars) -> list of arrays, reference(*inputs) -> output)
WORKLOADS = {
    "gemm": (gemm, lambda: [RNG.uniform(-1, 1, (64, 32)), RNG.uniform(-1, 1, (32, 48))],
             lambda a, b: a @ b),
    "gemm_small": (lambda: gemm(16, 32, 8),
                   lambda: [RNG.uniform(-1, 1, (16, 8)), RNG.uniform(-1, 1, (8, 32))],
                   lambda a, b: a @ b),
    "gemm_bias_relu": (gemm_bias_relu,
                       lambda: [RNG.uniform(-1, 1, (32, 16)), RNG.uniform(-1, 1, (16, 32)),
                                RNG.uniform(-1, 1, (32,))],
                       lambda a, b, c: np.maximum(a @ b + c, 0)),
    "conv2d": (conv2d_nhwc, lambda: [RNG.uniform(-1, 1, (1, 6, 6, 4)),
                                     RNG.uniform(-1, 1, (3, 3, 4, 8))], _np_conv),
    "softmax": (softmax, lambda: [RNG.uniform(-1, 1, (8, 64))], _np_softmax),
    "elementwise": (elementwise_chain, lambda: [RNG.uniform(-1, 1, (256, 16))],
                    lambda a: np.exp(a * 2 + 1) - 1),
    "row_sum": (row_sum, lambda: [RNG.uniform(-1, 1, (4, 1024))], lambda a: a.sum(axis=1)),
}


def inputs_of(name):
    return [x.astype("float32") for x in WORKLOADS[name][1]()]


def check_interpret(func, inputs, expected, **shape_vars):
    """Run ``func`` with the interpreter on ``inputs`` and compare its last argument."""
    out = np.zeros(expected.shape, "float32")
    interpret(func, *inputs, out, **shape_vars)
    np.testing.assert_allclose(out, expected, rtol=2e-4, atol=2e-4)


def check_build(mod, target, inputs, expected):
    """Build for an LLVM target, run, compare."""
    from tilecraft import targets
    lib = targets.build(mod, target)
    out = np.zeros(expected.shape, "float32")
    lib["main"](*inputs, out)
    np.testing.assert_allclose(out, expected, rtol=2e-4, atol=2e-4)
