"""Property tests: random te kernels, compiled == interpreted == numpy, on random shapes and data.

Each example draws an expression tree over two inputs (elementwise and broadcast ops, math
intrinsics, selects, casts) and optionally a reduction over one axis, builds it with a symbolic or a
fixed shape, and checks the LLVM build and the interpreter against a numpy evaluation of the same
tree.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilecraft import targets
from tilecraft.tensorir import te
from tilecraft.tensorir.interpret import interpret

UNARY = {
    "neg": (lambda x: -x, lambda x: -x),
    "exp": (lambda x: te.exp(te.min(x, 10.0)), lambda x: np.exp(np.minimum(x, 10.0))),
    "tanh": (te.tanh, np.tanh),
    "sigmoid": (te.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "abs": (te.abs, np.abs),
    "sqrt_abs": (lambda x: te.sqrt(te.abs(x)), lambda x: np.sqrt(np.abs(x))),
    "floor": (te.floor, np.floor),
    "sin": (te.sin, np.sin),
    "relu": (lambda x: te.max(x, 0.0), lambda x: np.maximum(x, 0)),
}
BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "max": (te.maximum, np.maximum),
    "min": (te.minimum, np.minimum),
    "select": (lambda a, b: te.if_then_else(a > b, a, b * 0.5),
               lambda a, b: np.where(a > b, a, b * np.float32(0.5))),
}


@st.composite
def expr_trees(draw, depth=3):
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from(["x", "y", "c"]))
    if draw(st.booleans()):
        return ("u", draw(st.sampled_from(sorted(UNARY))), draw(expr_trees(depth=depth - 1)))
    return ("b", draw(st.sampled_from(sorted(BINARY))), draw(expr_trees(depth=depth - 1)),
            draw(expr_trees(depth=depth - 1)))


def build_te(tree, x, y):
    if tree == "x":
        return x
    if tree == "y":
        return y
    if tree == "c":
        return te.const(0.75, "float32")
    if tree[0] == "u":
        return UNARY[tree[1]][0](build_te(tree[2], x, y))
    return BINARY[tree[1]][0](build_te(tree[2], x, y), build_te(tree[3], x, y))


def eval_np(tree, x, y):
    if tree == "x":
        return x
    if tree == "y":
        return y
    if tree == "c":
        return np.float32(0.75)
    if tree[0] == "u":
        with np.errstate(all="ignore"):
            return UNARY[tree[1]][1](eval_np(tree[2], x, y)).astype(np.float32)
    with np.errstate(all="ignore"):
        return np.asarray(BINARY[tree[1]][1](eval_np(tree[2], x, y), eval_np(tree[3], x, y)),
                          dtype=np.float32)


def make_kernel(tree, symbolic: bool, shape, broadcast_y: bool, reduce: bool):
    rows, cols = (te.var("n"), te.var("m")) if symbolic else shape
    X = te.placeholder((rows, cols), "float32", "X")
    Y = te.placeholder((cols,) if broadcast_y else (rows, cols), "float32", "Y")

    def elem(i, j):
        return build_te(tree, X[i, j], Y[j] if broadcast_y else Y[i, j])

    if reduce:
        k = te.reduce_axis((0, cols), "k")
        Z = te.compute((rows,), lambda i: te.sum(elem(i, k), axis=k), "Z")
    else:
        Z = te.compute((rows, cols), elem, "Z")
    return te.create_prim_func([X, Y, Z])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=expr_trees(), symbolic=st.booleans(), rows=st.integers(1, 9), cols=st.integers(1, 37),
       broadcast_y=st.booleans(), reduce=st.booleans(), seed=st.integers(0, 2**16))
def test_random_kernels_match_numpy(tree, symbolic, rows, cols, broadcast_y, reduce, seed):
    func = make_kernel(tree, symbolic, (rows, cols), broadcast_y, reduce)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    y = rng.standard_normal((cols,) if broadcast_y else (rows, cols)).astype(np.float32)
    ref = eval_np(tree, x, y[None, :] if broadcast_y else y)
    ref = np.broadcast_to(ref, (rows, cols)).astype(np.float32)
    if reduce:
        ref = ref.sum(axis=1, dtype=np.float64).astype(np.float32)
    out_shape = (rows,) if reduce else (rows, cols)

    interp = np.full(out_shape, np.nan, np.float32)
    interpret(func, x, y, interp)
    compiled = np.full(out_shape, np.nan, np.float32)
    targets.build(func, "llvm")["main"](x, y, compiled)

    tol = dict(rtol=2e-4, atol=2e-4 * max(1, cols if reduce else 1))
    np.testing.assert_allclose(interp, ref, **tol)
    np.testing.assert_allclose(compiled, ref, **tol)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "float16", "float64"])
def test_dtypes_compiled_equals_interpreted(dtype):
    n = te.var("n")
    A = te.placeholder((n,), dtype, "A")
    B = te.placeholder((n,), dtype, "B")
    C = te.compute((n,), lambda i: te.max(A[i] * B[i] + A[i], B[i]), "C")
    func = te.create_prim_func([A, B, C])
    mod = targets.build(func, "llvm")
    rng = np.random.default_rng(1)
    for size in (1, 7, 64, 1000):
        if dtype.startswith(("int", "uint")):
            info = np.iinfo(dtype)
            lo, hi = max(info.min, -50), min(info.max, 50)
            a = rng.integers(lo, hi, size).astype(dtype)
            b = rng.integers(lo, hi, size).astype(dtype)
        else:
            a = rng.standard_normal(size).astype(dtype)
            b = rng.standard_normal(size).astype(dtype)
        got = np.zeros(size, dtype)
        mod["main"](a, b, got)
        ref = np.zeros(size, dtype)
        interpret(func, a, b, ref)
        with np.errstate(over="ignore"):
            expect = np.maximum(a * b + a, b)
        if dtype == "float16":
            np.testing.assert_allclose(got, expect, rtol=2e-3, atol=2e-3)
            np.testing.assert_allclose(ref, expect, rtol=2e-3, atol=2e-3)
        else:
            np.testing.assert_array_equal(got, expect)
            np.testing.assert_array_equal(ref, expect)


def test_one_build_serves_every_size_and_checks_shapes():
    n = te.var("n")
    A = te.placeholder((n, 3), "float32", "A")
    B = te.compute((n, 3), lambda i, j: A[i, j] * 2.0 + 1.0, "B")
    mod = targets.build(te.create_prim_func([A, B]), "llvm")
    for rows in (0, 1, 5, 1000):
        a = np.random.rand(rows, 3).astype("float32")
        b = np.empty_like(a)
        mod["main"](a, b)
        np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)
    with pytest.raises(ValueError, match="B"):
        mod["main"](np.zeros((4, 3), "float32"), np.zeros((5, 3), "float32"))
    with pytest.raises(ValueError, match="A"):
        mod["main"](np.zeros((4, 2), "float32"), np.zeros((4, 2), "float32"))
    with pytest.raises(ValueError, match="float32"):
        mod["main"](np.zeros((4, 3), "float64"), np.zeros((4, 3), "float32"))
    with pytest.raises(ValueError):
        mod["main"](np.zeros((4, 3), "float32"))
