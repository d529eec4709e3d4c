"""tensorir.interpret: the numpy reference evaluator, checked against numpy on random inputs.

Most tests run each function twice, on the vectorized fast path and on the scalar path
(``_vectorize=False``), and compare both with numpy.
"""
import math
import time

import numpy as np
import pytest

from tilecraft import tensorir as T
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import TIRError, call
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.interpret import _kernel_source, interpret
from tilecraft.tensorir.stmt import (Allocate, AssertStmt, Block, BlockRealize, BufferStore, Evaluate, For,
                           IfThenElse, IterVar, LetStmt, Range, seq)

RNG = np.random.default_rng(20240601)


def rand(shape, dtype="float32", lo=-4, hi=5):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(lo if np.dtype(dtype).kind == "i" else 0, hi, size=shape).astype(dtype)
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    return RNG.standard_normal(shape).astype(dtype)


def run(func, *arrays, exact=True, rtol=1e-6, atol=1e-6, **kw):
    """Run ``func`` on both paths (on copies); check they agree; return the fast path's arrays."""
    results = []
    for vec in (True, False):
        arrs = [a.copy() if isinstance(a, np.ndarray) else a for a in arrays]
        interpret(func, *arrs, _vectorize=vec, **kw)
        results.append(arrs)
    for fast, slow in zip(*results):
        if isinstance(fast, np.ndarray):
            if exact:
                np.testing.assert_array_equal(fast, slow)
            else:
                np.testing.assert_allclose(fast, slow, rtol=rtol, atol=atol)
    return results[0]


def vectorized(func, *arrays, **kw) -> bool:
    """Does the fast path run some loop of ``func`` as numpy vectors?"""
    return "_axshape(" in _kernel_source(func, *arrays, **kw)


def handle(buf):
    return T.Var(buf.name + "_handle", "handle")


def prim(buffers, body, scalars=(), attrs=None, root_allocs=()):
    """A PrimFunc over ``buffers``; the body is wrapped in a root block when ``root_allocs``."""
    hs = [handle(b) for b in buffers]
    if root_allocs:
        body = BlockRealize([], None, Block("root", [], [], [], body, alloc_buffers=root_allocs))
    return PrimFunc(hs + list(scalars), body, dict(zip(hs, buffers)), attrs=attrs)


def loop(var, ext, body, lo=0, kind="serial"):
    return For(var, lo, ext, kind, body)


def block(name, bindings, body, predicate=None, init=None, allocs=()):
    """A BlockRealize binding fresh iter vars: ``bindings`` = [(value, extent, kind)]; ``body``
    is a function of the iter vars."""
    ivs = [IterVar(T.Var(f"v{k}"), Range(0, ext), kind)
           for k, (_, ext, kind) in enumerate(bindings)]
    vs = [iv.var for iv in ivs]
    stmt = body(*vs)
    init_stmt = init(*vs) if init is not None else None
    return BlockRealize([v for v, _, _ in bindings], predicate,
                        Block(name, ivs, [], [], stmt, init=init_stmt, alloc_buffers=allocs))


# ------------------------------------------------------------------------------------------
# te functions


def test_elementwise_and_doc_example():
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * 2.0, "B")
    f = te.create_prim_func([A, B])
    a = np.arange(4, dtype="float32")
    b = np.empty(4, "float32")
    assert interpret(f, a, b) is None
    np.testing.assert_array_equal(b, [0, 2, 4, 6])
    for size in (1, 7, 100):
        a = rand(size)
        (_, b) = run(f, a, np.empty(size, "float32"))
        np.testing.assert_array_equal(b, a * np.float32(2))
    assert vectorized(f, a, b)


def test_broadcast_and_symbolic_dims_at_several_sizes():
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n, m), "float32", "A")
    bias = te.placeholder((m,), "float32", "bias")
    B = te.compute((n, m), lambda i, j: A[i, j] + bias[j] * A[i, 0], "B")
    f = te.create_prim_func([A, bias, B])
    for shape in [(1, 1), (3, 5), (17, 2), (64, 33)]:
        a, bb = rand(shape), rand(shape[1])
        out = run(f, a, bb, np.zeros(shape, "float32"))[2]
        np.testing.assert_allclose(out, a + bb[None, :] * a[:, :1], rtol=1e-6)


def test_matmul_reduction_with_init():
    n = te.var("n")
    A = te.placeholder((n, 24), "float32", "A")
    W = te.placeholder((24, 10), "float32", "W")
    k = te.reduce_axis((0, 24), "k")
    C = te.compute((n, 10), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    f = te.create_prim_func([A, W, C])
    for rows in (1, 5, 40):
        a, w = rand((rows, 24)), rand((24, 10))
        c = np.full((rows, 10), 123.0, "float32")  # init must overwrite whatever is there
        out = run(f, a, w, c, exact=False, rtol=1e-5, atol=1e-5)[2]
        np.testing.assert_allclose(out, a @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("combiner", ["sum", "max", "min", "prod"])
def test_reductions_small_and_large(combiner):
    # few rows and long rows: the reduction is vectorized along k
    for rows, cols in [(3, 7), (4, 5000)]:
        A = te.placeholder((rows, cols), "float64", "A")
        k = te.reduce_axis((0, cols), "k")
        red = {"sum": te.sum, "max": te.max, "min": te.min, "prod": te.prod}[combiner]
        src = (lambda i, kk: 1.0 + A[i, kk] * 0.001) if combiner == "prod" else \
            (lambda i, kk: A[i, kk])
        B = te.compute((rows,), lambda i: red(src(i, k), axis=k), "B")
        f = te.create_prim_func([A, B])
        a = rand((rows, cols), "float64")
        out = run(f, a, np.zeros(rows), exact=False, rtol=1e-12, atol=1e-12)[1]
        ref = {"sum": np.sum(a, 1), "max": a.max(1), "min": a.min(1),
               "prod": np.prod(1.0 + a * 0.001, 1)}[combiner]
        np.testing.assert_allclose(out, ref, rtol=1e-12)


def test_integer_reduction_is_exact_and_wraps():
    A = te.placeholder((100000,), "int32", "A")
    k = te.reduce_axis((0, 100000), "k")
    B = te.compute((1,), lambda i: te.sum(A[k] * 40000, axis=k), "B")
    f = te.create_prim_func([A, B])
    a = rand(100000, "int32", -30000, 30000)
    out = run(f, a, np.zeros(1, "int32"))[1]
    with np.errstate(over="ignore"):
        ref = np.sum(a * np.int32(40000), dtype=np.int32)
    assert out[0] == ref
    assert vectorized(f, a, out)


def test_sum_with_where_condition():
    A = te.placeholder((6, 9), "float32", "A")
    k = te.reduce_axis((0, 9), "k")
    B = te.compute((6,), lambda i: te.sum(A[i, k], axis=k, where=A[i, k] > 0.0), "B")
    f = te.create_prim_func([A, B])
    a = rand((6, 9))
    out = run(f, a, np.zeros(6, "float32"), exact=False)[1]
    np.testing.assert_allclose(out, np.where(a > 0, a, 0).sum(1), rtol=1e-5)


def test_intermediate_buffers_are_allocated():
    A = te.placeholder((8, 6), "float32", "A")
    B = te.compute((8, 6), lambda i, j: te.exp(A[i, j]), "B")
    k = te.reduce_axis((0, 6), "k")
    C = te.compute((8,), lambda i: te.max(B[i, k], axis=k), "C")
    D = te.compute((8, 6), lambda i, j: B[i, j] / C[i], "D")
    f = te.create_prim_func([A, D])
    a = rand((8, 6))
    d = run(f, a, np.zeros((8, 6), "float32"))[1]
    e = np.exp(a)
    np.testing.assert_allclose(d, e / e.max(1, keepdims=True), rtol=1e-6)


def test_if_then_else_guards_out_of_bounds_loads():
    # zero padding: the load A[i - 1] only happens where it is in bounds
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n + 2,), lambda i: te.if_then_else(
        te.all(i >= 1, i <= n), A[i - 1], te.const(0.0, "float32")), "B")
    f = te.create_prim_func([A, B])
    a = rand(11)
    b = run(f, a, np.zeros(13, "float32"))[1]
    np.testing.assert_array_equal(b, np.pad(a, 1))


def test_select_evaluates_both_sides_so_out_of_bounds_raises():
    A = te.placeholder((4,), "float32", "A")
    B = te.compute((4,), lambda i: T.Select(i < 3, A[i + 1], A[i]), "B")
    f = te.create_prim_func([A, B])
    for vec in (True, False):
        with pytest.raises(IndexError, match="buffer A"):
            interpret(f, rand(4), np.zeros(4, "float32"), _vectorize=vec)
    # a Select of loads that are all in bounds
    C = te.compute((4,), lambda i: T.Select(A[i] > 0.0, A[i], A[3 - i]), "C")
    g = te.create_prim_func([A, C])
    a = rand(4)
    c = run(g, a, np.zeros(4, "float32"))[1]
    np.testing.assert_array_equal(c, np.where(a > 0, a, a[::-1]))


def test_and_or_short_circuit_guards_loads():
    A = te.placeholder((5,), "int32", "A")
    B = te.compute((8,), lambda i: te.if_then_else(
        te.all(i < 5, A[te.min(i, 4)] > 0) & (A[i] > 1), 1, 0).astype("int32"), "B")
    f = te.create_prim_func([A, B])
    a = rand(5, "int32")
    b = run(f, a, np.zeros(8, "int32"))[1]
    ref = np.array([int(i < 5 and a[i] > 0 and a[i] > 1) for i in range(8)], "int32")
    np.testing.assert_array_equal(b, ref)


def test_integer_wraparound_and_division_semantics():
    A = te.placeholder((64,), "int32", "A")
    Bq = te.placeholder((64,), "int32", "Bq")
    outs = {
        "add": lambda i: A[i] + 2147483600,
        "mul": lambda i: A[i] * 1000003,
        "floordiv": lambda i: A[i] // Bq[i],
        "floormod": lambda i: A[i] % Bq[i],
        "truncdiv": lambda i: T.truncdiv(A[i], Bq[i]),
        "truncmod": lambda i: T.truncmod(A[i], Bq[i]),
        "cdiv": lambda i: T.truncdiv(A[i], 7),
        "cmod": lambda i: T.truncmod(A[i], 7),
        "fdiv7": lambda i: A[i] // 7,
        "fmod7": lambda i: A[i] % 7,
    }
    a = rand(64, "int32", -1000, 1000)
    a[:2] = [2**31 - 1, -2**31]
    bq = rand(64, "int32", -9, 10)
    bq[bq == 0] = 3
    for name, fn in outs.items():
        B = te.compute((64,), fn, "B")
        f = te.create_prim_func([A, Bq, B])
        got = run(f, a, bq, np.zeros(64, "int32"))[2]
        a64, b64 = a.astype(np.int64), bq.astype(np.int64)
        ref = {
            "add": a64 + 2147483600, "mul": a64 * 1000003, "floordiv": a64 // b64,
            "floormod": a64 % b64, "truncdiv": np.trunc(a64 / b64), "truncmod": np.fmod(a64, b64),
            "cdiv": np.trunc(a64 / 7), "cmod": np.fmod(a64, 7), "fdiv7": a64 // 7,
            "fmod7": a64 % 7,
        }[name]
        wrapped = ((np.asarray(ref, np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)
        np.testing.assert_array_equal(got, wrapped, err_msg=name)


def test_integer_division_by_zero_raises():
    A = te.placeholder((4,), "int64", "A")
    B = te.compute((4,), lambda i: 10 // A[i], "B")
    f = te.create_prim_func([A, B])
    for vec in (True, False):
        with pytest.raises(ZeroDivisionError):
            interpret(f, np.array([1, 2, 0, 3]), np.zeros(4, "int64"), _vectorize=vec)
    # a division only evaluated where the divisor is non-zero is fine
    C = te.compute((4,), lambda i: te.if_then_else(A[i] != 0, 10 // A[i], 0), "C")
    g = te.create_prim_func([A, C])
    c = run(g, np.array([1, 2, 0, 3]), np.zeros(4, "int64"))[1]
    np.testing.assert_array_equal(c, [10, 5, 0, 3])


def test_unsigned_and_small_int_wrap():
    A = te.placeholder((16,), "uint8", "A")
    B = te.compute((16,), lambda i: A[i] * 3 - 250, "B")
    f = te.create_prim_func([A, B])
    a = rand(16, "uint8", 0, 256)
    b = run(f, a, np.zeros(16, "uint8"))[1]
    np.testing.assert_array_equal(b, ((a.astype(int) * 3 - 250) % 256).astype("uint8"))


def test_float16_stays_float16():
    A = te.placeholder((50,), "float16", "A")
    B = te.compute((50,), lambda i: A[i] * A[i] + te.const(0.1, "float16"), "B")
    f = te.create_prim_func([A, B])
    a = rand(50, "float16")
    b = run(f, a, np.zeros(50, "float16"))[1]
    np.testing.assert_array_equal(b, a * a + np.float16(0.1))


def test_float32_arithmetic_is_not_done_in_float64():
    A = te.placeholder((1000,), "float32", "A")
    B = te.compute((1000,), lambda i: (A[i] + 1e-3) * 3.1 - A[i] * 0.3, "B")
    f = te.create_prim_func([A, B])
    a = rand(1000)
    b = run(f, a, np.zeros(1000, "float32"))[1]
    ref = (a + np.float32(1e-3)) * np.float32(3.1) - a * np.float32(0.3)
    np.testing.assert_array_equal(b, ref)


def test_casts():
    A = te.placeholder((40,), "float32", "A")
    a = rand(40) * 100
    cases = {
        "int32": lambda i: A[i].astype("int32"),
        "int8": lambda i: A[i].astype("int32").astype("int8"),
        "uint16": lambda i: A[i].astype("int32").astype("uint16"),
        "bool": lambda i: A[i].astype("bool"),
        "float16": lambda i: A[i].astype("float16"),
        "float64": lambda i: A[i].astype("float64") / 3.0,
    }
    for dtype, fn in cases.items():
        B = te.compute((40,), fn, "B")
        f = te.create_prim_func([A, B])
        b = run(f, a, np.zeros(40, dtype))[1]
        ref = {"int32": a.astype("int32"), "int8": a.astype("int32").astype("int8"),
               "uint16": a.astype("int32").astype("uint16"), "bool": a.astype(bool),
               "float16": a.astype("float16"), "float64": a.astype("float64") / 3.0}[dtype]
        np.testing.assert_array_equal(b, ref, err_msg=dtype)


INTRINSIC_CASES = {
    "exp": (te.exp, np.exp, (-3, 3)), "log": (te.log, np.log, (0.1, 5)),
    "sqrt": (te.sqrt, np.sqrt, (0, 5)), "rsqrt": (te.rsqrt, lambda x: 1 / np.sqrt(x), (0.1, 5)),
    "tanh": (te.tanh, np.tanh, (-3, 3)),
    "sigmoid": (te.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-30, 30)),
    "erf": (te.erf, np.vectorize(math.erf), (-3, 3)), "fabs": (te.abs, np.abs, (-3, 3)),
    "floor": (te.floor, np.floor, (-3, 3)), "ceil": (te.ceil, np.ceil, (-3, 3)),
    "round": (te.round, np.rint, (-3, 3)), "sin": (te.sin, np.sin, (-3, 3)),
    "cos": (te.cos, np.cos, (-3, 3)),
    "exp2": (lambda x: call("exp2", x), np.exp2, (-3, 3)),
    "log2": (lambda x: call("log2", x), np.log2, (0.1, 5)),
    "trunc": (lambda x: call("trunc", x), np.trunc, (-3, 3)),
    "pow": (lambda x: te.pow(x, te.const(1.7, x.dtype)), lambda x: np.power(x, 1.7), (0, 3)),
}


@pytest.mark.parametrize("name", sorted(INTRINSIC_CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_intrinsics_match_numpy(name, dtype):
    fn, ref, (lo, hi) = INTRINSIC_CASES[name]
    A = te.placeholder((64,), dtype, "A")
    B = te.compute((64,), lambda i: fn(A[i]), "B")
    f = te.create_prim_func([A, B])
    a = RNG.uniform(lo, hi, 64).astype(dtype)
    if name == "round":
        a[:4] = [0.5, 1.5, -2.5, 2.5]  # ties go to even
    # numpy's SIMD loops may differ from its scalar ones in the last bit: compare with a tolerance
    b = run(f, a, np.zeros(64, dtype), exact=False, rtol=1e-6 if dtype == "float32" else 1e-15,
            atol=0)[1]
    assert b.dtype == dtype
    expected = ref(a.astype("float64")).astype(dtype) if dtype == "float32" else ref(a)
    tol = 2e-7 if dtype == "float32" else 1e-15
    np.testing.assert_allclose(b, expected, rtol=tol * 4, atol=tol)
    if name == "erf" and dtype == "float64":
        np.testing.assert_array_equal(b, [math.erf(x) for x in a])


def test_min_max_let_and_compare():
    A = te.placeholder((30,), "int64", "A")
    x = T.Var("x")
    B = te.compute((30,), lambda i: T.Let(x, A[i] * 2, te.max(x, 5) - te.min(x, -3) +
                                         T.Select(x == A[i], 100, 0)), "B")
    f = te.create_prim_func([A, B])
    a = rand(30, "int64", -10, 10)
    b = run(f, a, np.zeros(30, "int64"))[1]
    np.testing.assert_array_equal(b, np.maximum(2 * a, 5) - np.minimum(2 * a, -3) +
                                  np.where(2 * a == a, 100, 0))


def test_module_and_scalar_parameters():
    n = te.var("n")
    alpha = T.Var("alpha", "float32")
    shift = T.Var("shift", "int64")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[(i + shift) % n] * alpha, "B")
    f = te.create_prim_func([A, B, alpha, shift])
    a = rand(9)
    ref = np.roll(a, -2) * np.float32(0.5)
    b = np.zeros(9, "float32")
    interpret(f, a, b, 0.5, 2)
    np.testing.assert_array_equal(b, ref)
    b[:] = 0
    interpret(IRModule({"other": f}), a, b, alpha=0.5, shift=2)
    np.testing.assert_array_equal(b, ref)
    g = te.create_prim_func([A, B])
    b[:] = 0
    interpret(IRModule({"f": f, "g": g}), a, b, 0.5, 2, func_name="f")
    np.testing.assert_array_equal(b, ref)
    with pytest.raises(ValueError, match="func_name"):
        interpret(IRModule({"f": f, "g": g}), a, b, 0.5, 2)
    with pytest.raises(ValueError, match="alpha"):
        interpret(f, a, b, shift=2)
    with pytest.raises(ValueError, match="scalar parameter shift"):
        interpret(f, a, b, 0.5)
    with pytest.raises(ValueError, match="unknown variable 'beta'"):
        interpret(f, a, b, 0.5, 2, beta=1)


# ------------------------------------------------------------------------------------------
# argument checking


def test_shape_rank_and_dtype_errors_name_the_argument():
    n = te.var("n")
    A = te.placeholder((n, 4), "float32", "A")
    B = te.compute((n * 2, 4), lambda i, j: A[i // 2, j], "B")
    f = te.create_prim_func([A, B])
    a = rand((3, 4))
    interpret(f, a, np.zeros((6, 4), "float32"))
    with pytest.raises(ValueError, match=r"argument B: dimension 0 must be n \* 2 = 6, got 5"):
        interpret(f, a, np.zeros((5, 4), "float32"))
    with pytest.raises(ValueError, match="argument A: dimension 1 must be 4, got 5"):
        interpret(f, rand((3, 5)), np.zeros((6, 4), "float32"))
    with pytest.raises(ValueError, match="argument A: expected dtype float32, got float64"):
        interpret(f, a.astype("float64"), np.zeros((6, 4), "float32"))
    with pytest.raises(ValueError, match="argument A"):
        interpret(f, rand((3, 4, 1)), np.zeros((6, 4), "float32"))
    with pytest.raises(TypeError, match="argument A must be a numpy array"):
        interpret(f, [[1.0] * 4], np.zeros((6, 4), "float32"))
    with pytest.raises(ValueError, match="missing the array for buffer argument B"):
        interpret(f, a)
    # a dimension bound twice must agree
    C = te.placeholder((n,), "float32", "C")
    D = te.compute((n,), lambda i: C[i] + 1.0, "D")
    g = te.create_prim_func([C, D])
    with pytest.raises(ValueError, match=r"argument D: dimension 0 is 4, but n is already 3"):
        interpret(g, rand(3), np.zeros(4, "float32"))
    with pytest.raises(ValueError, match="argument D"):
        interpret(g, rand(3), np.zeros(4, "float32"), n=3)


def test_out_of_bounds_raises_index_error_naming_the_buffer():
    A = T.Buffer("A", (8,), "float32")
    B = T.Buffer("B", (8,), "float32")
    i = T.Var("i")
    for idx, bad in [(i + 1, "8"), (i - 1, "-1")]:
        f = prim([A, B], loop(i, 8, BufferStore(B, A[idx], [i])))
        for vec in (True, False):
            with pytest.raises(IndexError, match=rf"buffer A.*{bad}"):
                interpret(f, rand(8), np.zeros(8, "float32"), _vectorize=vec)
    g = prim([A, B], loop(i, 8, BufferStore(B, A[i], [i * 2])))
    for vec in (True, False):
        with pytest.raises(IndexError, match="buffer B"):
            interpret(g, rand(8), np.zeros(8, "float32"), _vectorize=vec)


def test_failing_assert_raises_with_its_message():
    n = T.Var("n")
    A = T.Buffer("A", (n,), "float32")
    i = T.Var("i")
    body = AssertStmt(n >= 4, "n must be at least 4",
                      loop(i, n, seq(AssertStmt(A[i] < 100.0, "A holds a huge value",
                                                BufferStore(A, A[i] + 1.0, [i])))))
    f = prim([A], body)
    a = rand(5)
    out = run(f, a)[0]
    np.testing.assert_array_equal(out, a + np.float32(1))
    for vec in (True, False):
        with pytest.raises(RuntimeError, match="n must be at least 4"):
            interpret(f, rand(3), _vectorize=vec)
        a = rand(6)
        a[4] = 1000
        with pytest.raises(RuntimeError, match="A holds a huge value"):
            interpret(f, a, _vectorize=vec)


# ------------------------------------------------------------------------------------------
# hand-built IR


def test_if_then_else_let_and_evaluate_statements():
    A = T.Buffer("A", (20,), "int32")
    B = T.Buffer("B", (20,), "int32")
    i, x = T.Var("i"), T.Var("x", "int32")
    body = loop(i, 20, LetStmt(x, A[i] * 3, seq(
        Evaluate(T.const(0, "int32")),
        IfThenElse(x > 0, BufferStore(B, x, [i]),
                   IfThenElse(x < -6, BufferStore(B, -x, [i]), BufferStore(B, A[i], [i]))))))
    f = prim([A, B], body)
    a = rand(20, "int32")
    b = run(f, a, np.zeros(20, "int32"))[1]
    ref = np.where(3 * a > 0, 3 * a, np.where(3 * a < -6, -3 * a, a))
    np.testing.assert_array_equal(b, ref)
    assert vectorized(f, a, b)


def test_allocate_inside_a_loop_is_private_per_iteration():
    A = T.Buffer("A", (16, 4), "float32")
    B = T.Buffer("B", (16,), "float32")
    tmp = T.Buffer("tmp", (4,), "float32", scope="local")
    i, j, k = T.Var("i"), T.Var("j"), T.Var("k")
    body = loop(i, 16, Allocate(tmp, seq(
        loop(j, 4, BufferStore(tmp, A[i, j] * 2.0, [j])),
        BufferStore(B, T.const(0.0), [i]),
        loop(k, 4, BufferStore(B, B[i] + tmp[3 - k], [i])))))
    f = prim([A, B], body)
    a = rand((16, 4))
    b = run(f, a, np.zeros(16, "float32"), exact=False)[1]
    np.testing.assert_allclose(b, (a * 2).sum(1), rtol=1e-5)
    assert vectorized(f, a, b)


def test_intermediates_start_as_nan_to_show_missing_init():
    A = T.Buffer("A", (4,), "float32")
    B = T.Buffer("B", (4,), "float32")
    acc = T.Buffer("acc", (4,), "float32")
    i = T.Var("i")
    body = seq(loop(i, 4, BufferStore(acc, acc[i] + A[i], [i])),  # no init: reads garbage
               loop(i, 4, BufferStore(B, acc[i], [i])))
    f = prim([A, B], body, root_allocs=[acc])
    b = run(f, rand(4), np.zeros(4, "float32"))[1]
    assert np.isnan(b).all()


def test_nested_blocks_with_predicates_split_loop():
    # B[i] = A[i] + 1 over a loop split by 8 with a tail guarded by the predicate
    n = T.Var("n")
    A = T.Buffer("A", (n,), "float32")
    B = T.Buffer("B", (n,), "float32")
    io, ii = T.Var("io"), T.Var("ii")
    inner = block("B", [(io * 8 + ii, n, "spatial")],
                  lambda vi: BufferStore(B, A[vi] + 1.0, [vi]), predicate=io * 8 + ii < n)
    outer = BlockRealize([io], None, Block("outer", [IterVar(T.Var("vo"), Range(0, (n + 7) // 8))],
                                           [], [], loop(ii, 8, inner)))
    body = loop(io, (n + 7) // 8, outer)
    f = prim([A, B], body)
    for size in (5, 8, 21):
        a = rand(size)
        b = run(f, a, np.zeros(size, "float32"))[1]
        np.testing.assert_array_equal(b, a + np.float32(1))
    assert vectorized(f, a, b)


def test_tiled_matmul_blocks_with_init_and_split_reduction():
    # for io, jo, ko, ii, ki, ji: C[io*4+ii, jo*4+ji] += A[.., ko*4+ki] * B[.., ..], init at k == 0
    M = 16
    A = T.Buffer("A", (M, M), "float32")
    Bm = T.Buffer("B", (M, M), "float32")
    C = T.Buffer("C", (M, M), "float32")
    io, jo, ko, ii, ki, ji = (T.Var(n) for n in ["io", "jo", "ko", "ii", "ki", "ji"])
    blk = block("C", [(io * 4 + ii, M, "spatial"), (jo * 4 + ji, M, "spatial"),
                      (ko * 4 + ki, M, "reduce")],
                lambda vi, vj, vk: BufferStore(C, C[vi, vj] + A[vi, vk] * Bm[vk, vj], [vi, vj]),
                init=lambda vi, vj, vk: BufferStore(C, T.const(0.0), [vi, vj]))
    nest = blk
    for v in [ji, ki, ii, ko, jo, io]:
        nest = loop(v, 4, nest)
    f = prim([A, Bm, C], nest)
    a, b = rand((M, M)), rand((M, M))
    c = run(f, a, b, np.full((M, M), 7.0, "float32"), exact=False, rtol=1e-5, atol=1e-5)[2]
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    src = _kernel_source(f, a, b, c)
    assert src.count("np.arange(") >= 4  # io, jo, ii, ji run as vectors


def test_init_of_a_reduction_whose_domain_does_not_start_at_zero():
    # the init runs when the reduce iter var equals its dom.min (3 here), then 3..9 accumulate
    A = T.Buffer("A", (10,), "float64")
    Bo = T.Buffer("B", (1,), "float64")
    k = T.Var("k")
    ivs = [IterVar(T.Var("vk"), Range(3, 7), "reduce")]
    vk = ivs[0].var
    blk = BlockRealize([k], None, Block("B", ivs, [], [], BufferStore(Bo, Bo[0] + A[vk], [0]),
                                        init=BufferStore(Bo, A[0] * 100.0, [0])))
    f = prim([A, Bo], loop(k, 7, blk, lo=3))
    a = rand(10, "float64")
    b = run(f, a, np.full(1, 5.0), exact=False, rtol=1e-13)[1]
    np.testing.assert_allclose(b[0], a[0] * 100 + a[3:].sum(), rtol=1e-13)
    # the init condition met in the middle of the loop restarts the accumulation
    f2 = prim([A, Bo], loop(k, 10, blk))
    b2 = run(f2, a, np.full(1, 5.0), exact=False, rtol=1e-13)[1]
    np.testing.assert_allclose(b2[0], a[0] * 100 + a[3:].sum(), rtol=1e-13)


def test_strided_intermediate_and_strided_parameter():
    n, m, s = T.Var("n"), T.Var("m"), T.Var("s")
    A = T.Buffer("A", (n, m), "float32", strides=(s, 1))
    B = T.Buffer("B", (n, m), "float32")
    tmp = T.Buffer("tmp", (n, m), "float32", strides=(m + 3, 1))  # storage_align-style padding
    i, j = T.Var("i"), T.Var("j")
    body = seq(loop(i, n, loop(j, m, BufferStore(tmp, A[i, j] * 3.0, [i, j]))),
               loop(i, n, loop(j, m, BufferStore(B, tmp[i, j] + 1.0, [i, j]))))
    f = prim([A, B], body, root_allocs=[tmp])
    big = rand((5, 11))
    view = big[:, 2:9]                       # element strides (11, 1)
    b = run(f, view, np.zeros((5, 7), "float32"))[1]
    np.testing.assert_array_equal(b, view * np.float32(3) + np.float32(1))
    assert vectorized(f, view, b)
    # flat memory for a buffer with constant strides
    C = T.Buffer("C", (3, 4), "float32", strides=(6, 1))
    D = T.Buffer("D", (3, 4), "float32")
    g = prim([C, D], loop(i, 3, loop(j, 4, BufferStore(D, C[i, j], [i, j]))))
    mem = rand(18)
    d = run(g, mem, np.zeros((3, 4), "float32"))[1]
    np.testing.assert_array_equal(d, mem.reshape(3, 6)[:, :4])
    with pytest.raises(ValueError, match="argument C"):
        interpret(g, rand((3, 4)), np.zeros((3, 4), "float32"))


def test_lowered_style_flattened_function_with_arg_buffers():
    n, m = T.Var("n"), T.Var("m")
    A2, B2 = T.Buffer("A", (n, m), "float32"), T.Buffer("B", (n, m), "float32")
    A, B = T.Buffer("A", (n * m,), "float32"), T.Buffer("B", (n * m,), "float32")
    tmp = T.Buffer("tmp", (m,), "float32", scope="local")
    i, j = T.Var("i"), T.Var("j")
    body = AssertStmt(m > 0, "m must be positive", loop(i, n, Allocate(tmp, seq(
        loop(j, m, BufferStore(tmp, A[i * m + j] * 2.0, [j]), kind="vectorized"),
        loop(j, m, BufferStore(B, tmp[m - 1 - j] + A[i * m + j], [i * m + j]), kind="unrolled"))),
        kind="parallel"))
    f = prim([A, B], body, attrs={"arg_buffers": (A2, B2)})
    a = rand((6, 5))
    b = run(f, a, np.zeros((6, 5), "float32"))[1]
    np.testing.assert_array_equal(b, a[:, ::-1] * np.float32(2) + a)
    assert vectorized(f, a, b)
    with pytest.raises(ValueError, match="argument B"):
        interpret(f, a, np.zeros((5, 6), "float32"))
    # a non-contiguous output cannot be viewed flat: it is written back after the call
    bt = np.zeros((5, 6), "float32").T
    interpret(f, a, bt)
    np.testing.assert_array_equal(bt, b)
    # without arg_buffers: shape vars are scalar parameters, the arrays are viewed flat
    g = prim([A, B], body, scalars=[n, m])
    b2 = run(g, a, np.zeros((6, 5), "float32"), 6, 5)[1]
    np.testing.assert_array_equal(b2, b)
    b3 = np.zeros((6, 5), "float32")
    interpret(g, a, b3, n=6, m=5)
    np.testing.assert_array_equal(b3, b)
    with pytest.raises(ValueError, match="argument A"):
        interpret(g, a, b3, 5, 5)
    with pytest.raises(RuntimeError, match="m must be positive"):
        interpret(g, np.zeros(0, "float32"), np.zeros(0, "float32"), 6, 0)


def test_fused_loop_with_floordiv_floormod_is_vectorized():
    A = T.Buffer("A", (12, 10), "float32")
    B = T.Buffer("B", (12, 10), "float32")
    f_ = T.Var("fused")
    blk = block("B", [(f_ // 10, 12, "spatial"), (f_ % 10, 10, "spatial")],
                lambda vi, vj: BufferStore(B, A[vi, vj] - A[vi, 0], [vi, vj]))
    f = prim([A, B], loop(f_, 120, blk, kind="parallel"))
    a = rand((12, 10))
    b = run(f, a, np.zeros((12, 10), "float32"))[1]
    np.testing.assert_array_equal(b, a - a[:, :1])
    assert vectorized(f, a, b)


def test_thread_bound_loops_and_shared_memory():
    A = T.Buffer("A", (64,), "float32")
    B = T.Buffer("B", (64,), "float32")
    sh = T.Buffer("sh", (16,), "float32", scope="shared")
    bx, tx, t2 = T.Var("bx"), T.Var("tx"), T.Var("t2")
    body = For(bx, 0, 4, "thread_binding", Allocate(sh, seq(
        For(tx, 0, 16, "thread_binding", BufferStore(sh, A[bx * 16 + tx], [tx]),
            thread_tag="threadIdx.x"),
        For(t2, 0, 16, "thread_binding", BufferStore(B, sh[15 - t2] * 2.0, [bx * 16 + t2]),
            thread_tag="threadIdx.x"))), thread_tag="blockIdx.x")
    f = prim([A, B], body)
    a = rand(64)
    b = run(f, a, np.zeros(64, "float32"))[1]
    np.testing.assert_array_equal(b, a.reshape(4, 16)[:, ::-1].reshape(-1) * np.float32(2))


def test_loop_carried_dependence_stays_sequential():
    # prefix sum in place and a stencil reading the element written one iteration earlier
    A = T.Buffer("A", (200,), "int64")
    i = T.Var("i")
    f = prim([A], loop(i, 199, BufferStore(A, A[i] + A[i + 1], [i + 1])))
    a = rand(200, "int64")
    out = run(f, a)[0]
    np.testing.assert_array_equal(out, np.cumsum(a))
    assert not vectorized(f, a)
    # reads of the next element (an anti-dependence) must see the old values
    g = prim([A], loop(i, 199, BufferStore(A, A[i + 1] * 2, [i])))
    out = run(g, a)[0]
    np.testing.assert_array_equal(out, np.concatenate([a[1:] * 2, a[-1:]]))
    # overlapping stores: the last iteration wins
    Bo = T.Buffer("B", (50,), "int64")
    h = prim([A, Bo], loop(i, 200, BufferStore(Bo, A[i], [i // 4])))
    out = run(h, a, np.zeros(50, "int64"))[1]
    np.testing.assert_array_equal(out, a[3::4])
    # a loop that writes through an index read from memory (a scatter)
    idx = T.Buffer("idx", (200,), "int64")
    s = prim([A, idx, Bo], loop(i, 200, BufferStore(Bo, A[i], [idx[i]])))
    ix = rand(200, "int64", 0, 50)
    out = run(s, a, ix, np.zeros(50, "int64"))[2]
    ref = np.zeros(50, "int64")
    for k in range(200):
        ref[ix[k]] = a[k]
    np.testing.assert_array_equal(out, ref)


def test_in_place_call_with_aliased_arrays_is_exact():
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[te.min(i + 1, n - 1)] + 1.0, "B")
    f = te.create_prim_func([A, B])
    a = rand(10)
    ref = a.copy()
    for i in range(9):
        ref[i] = ref[i + 1] + np.float32(1)
    ref[9] += np.float32(1)
    interpret(f, a, a)
    np.testing.assert_array_equal(a, ref)


def test_deep_loop_nest_and_long_expression():
    # more nested loops than CPython allows statically nested blocks, and a long expression
    A = T.Buffer("A", (2,) * 12, "int32")
    vs = [T.Var(f"i{k}") for k in range(12)]
    expr = A[tuple(vs)]
    for k in range(60):
        expr = expr * 3 + (k % 5)
    body = BufferStore(A, expr, vs)
    for v in reversed(vs):
        body = loop(v, 2, loop(T.Var("u"), 1, body))
    f = prim([A], body)
    a = rand((2,) * 12, "int32")
    out = run(f, a)[0]
    ref = a.astype(np.int64)
    for k in range(60):
        ref = (ref * 3 + (k % 5)) % 2**32
    np.testing.assert_array_equal(out, ((ref + 2**31) % 2**32 - 2**31).astype("int32"))


def test_unknown_nodes_and_scopes_are_reported():
    A = T.Buffer("A", (4,), "float32")
    other = T.Buffer("other", (4,), "float32")
    i = T.Var("i")
    f = prim([A], loop(i, 4, BufferStore(A, other[i], [i])))
    with pytest.raises(TIRError, match="buffer other"):
        interpret(f, rand(4))
    g = prim([A], loop(i, 4, BufferStore(A, call("exp", A[i]) + T.Var("free", "float32"), [i])))
    with pytest.raises(ValueError, match="free"):
        interpret(g, rand(4))
    out = rand(4)
    ref = np.exp(out) + np.float32(2)
    interpret(g, out, free=2.0)
    np.testing.assert_allclose(out, ref, rtol=1e-6)


# ------------------------------------------------------------------------------------------
# fast path against slow path on random programs


def _random_expr(rng, loads, vars_, depth):
    """A random int32/float32 expression tree over loads of the inputs."""
    kind = rng.integers(0, 9) if depth > 0 else rng.integers(0, 2)
    if kind == 0:
        buf, index = loads[rng.integers(len(loads))]
        return buf[index]
    if kind == 1:
        return T.const(int(rng.integers(-5, 6)), "int32")
    a = _random_expr(rng, loads, vars_, depth - 1)
    b = _random_expr(rng, loads, vars_, depth - 1)
    if kind == 2:
        return a + b
    if kind == 3:
        return a * b - 1
    if kind == 4:
        return T.max_(a, b) if hasattr(T, "max_") else T.Max(a, b)
    if kind == 5:
        return T.Select(a < b, a, b + 2)
    if kind == 6:
        return a // (T.Max(b, T.const(1, "int32")))
    if kind == 7:
        return T.truncmod(a, 7) + T.Min(a, b)
    return te.if_then_else(a > b, a - b, b)


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_fast_path_equals_scalar_path(seed):
    rng = np.random.default_rng(seed)
    n0, n1 = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    A = T.Buffer("A", (n0 + 2, n1 + 2), "int32")
    Bv = T.Buffer("Bv", (n1 + 2,), "int32")
    C = T.Buffer("C", (n0, n1), "int32")
    i, j = T.Var("i"), T.Var("j")
    loads = [(A, (i + int(rng.integers(0, 3)), j + int(rng.integers(0, 3)))),
             (Bv, (j + int(rng.integers(0, 3)),)), (C, (i, j))]
    value = _random_expr(rng, loads, [i, j], 4)
    # a guarded load that would be out of bounds without its guard
    guarded = te.if_then_else(i + j < n1, A[i, i + j + 2], T.const(0, "int32"))
    stmt = BufferStore(C, value + guarded, [i, j])
    if rng.random() < 0.5:
        stmt = IfThenElse(A[i, j] > 0, stmt, BufferStore(C, C[i, j] - 1, [i, j]))
    if rng.random() < 0.5:  # a reduction loop inside
        k = T.Var("k")
        stmt = seq(stmt, loop(k, n1 + 2, BufferStore(C, C[i, j] + A[i + 1, k] * 3, [i, j])))
    f = prim([A, Bv, C], loop(i, n0, loop(j, n1, stmt)))
    a = rand((n0 + 2, n1 + 2), "int32", -50, 50)
    bv = rand(n1 + 2, "int32", -50, 50)
    c = rand((n0, n1), "int32")
    run(f, a, bv, c)
    assert vectorized(f, a, bv, c)


@pytest.mark.parametrize("seed", range(6))
def test_random_float_programs_fast_path_equals_scalar_path(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(2, 40))
    A = te.placeholder((n, 3), "float32", "A")
    ops = [lambda x, y: x + y, lambda x, y: x * y, lambda x, y: te.exp(x * 0.1) - y,
           lambda x, y: te.max(x, y), lambda x, y: T.Select(x > y, x, y * 0.5),
           lambda x, y: te.sigmoid(x) / (te.abs(y) + 1.0), lambda x, y: te.erf(x) + te.tanh(y)]
    picks = rng.integers(0, len(ops), size=6)

    def body(i, j):
        v = A[i, j]
        for p in picks:
            v = ops[p](v, A[(i + 1) % n, (j + 2) % 3])
        return v

    B = te.compute((n, 3), body, "B")
    k = te.reduce_axis((0, 3), "k")
    C = te.compute((n,), lambda i: te.sum(B[i, k] * A[i, k], axis=k), "C")
    f = te.create_prim_func([A, C])
    run(f, rand((n, 3)), np.zeros(n, "float32"), exact=False, rtol=1e-5, atol=1e-6)


def test_reduction_form_with_predicate_and_idle_rows():
    # few rows: the k loop runs as one numpy reduction; row 2 is never active and keeps its value
    A = T.Buffer("A", (4, 3000), "int64")
    Bo = T.Buffer("B", (4,), "int64")
    i, k = T.Var("i"), T.Var("k")
    blk = block("B", [(i, 4, "spatial"), (k, 3000, "reduce")],
                lambda vi, vk: BufferStore(Bo, T.Max(Bo[vi], A[vi, vk] * 2), [vi]),
                init=lambda vi, vk: BufferStore(Bo, T.const(-10**9), [vi]),
                predicate=(i != 2) & (k < 1000 + i * 500))
    f = prim([A, Bo], loop(i, 4, loop(k, 3000, blk)))
    a = rand((4, 3000), "int64", -10**6, 10**6)
    b = run(f, a, np.full(4, 77, "int64"))[1]
    ref = [(a[r, :1000 + r * 500] * 2).max() if r != 2 else 77 for r in range(4)]
    np.testing.assert_array_equal(b, ref)
    assert "_rreduce(" in _kernel_source(f, a, b)


def test_tiles_that_read_a_neighbour_tile_stay_sequential():
    # for io: for ii in 8: X[io*8 + ii] = X[io*8 + ii + 1] + 1 reads what tile io + 1 writes first
    X = T.Buffer("X", (41,), "int64")
    io, ii = T.Var("io"), T.Var("ii")
    f = prim([X], loop(io, 5, loop(ii, 8, BufferStore(X, X[io * 8 + ii + 1] + 1, [io * 8 + ii]))))
    x = rand(41, "int64")
    out = run(f, x)[0]
    ref = x.copy()
    for t in range(40):
        ref[t] = ref[t + 1] + 1
    np.testing.assert_array_equal(out, ref)
    # tiles that only touch their own elements are vectorized
    g = prim([X], loop(io, 5, loop(ii, 8, BufferStore(X, X[io * 8 + 7 - ii] + 1, [io * 8 + ii]))))
    out = run(g, x)[0]
    ref = x.copy()
    for t in range(40):
        ref[t] = ref[(t // 8) * 8 + 7 - t % 8] + 1
    np.testing.assert_array_equal(out, ref)


def _random_loop_nest(seed):
    """Random loops over two int64 buffers with random affine (and div/mod) indices, stores at
    several depths, conditions, lets, local buffers and blocks: many have dependences."""
    rng = np.random.default_rng(seed)
    depth = int(rng.integers(1, 5))
    vs = [T.Var(f"i{d}") for d in range(depth)]
    exts = [int(rng.choice([1, 2, 3, 4, 5, 8, 13])) for _ in range(depth)]

    def affine(at):
        coefs = [int(rng.choice([0, 0, 1, 1, 2, 3, 4, 5, 8, 13])) if k < at else 0
                 for k in range(depth)]
        if rng.random() < 0.6:  # row-major over the loops, as after split / flatten
            stride = 1
            for k in reversed(range(at)):
                coefs[k] = stride if rng.random() < 0.85 else 0
                stride *= exts[k]
        off = int(rng.integers(0, 3))
        e, top = T.const(off), off
        for c, v, x in zip(coefs, vs, exts):
            if not c:
                continue
            r = rng.random()
            if r < 0.15:
                d = int(rng.integers(1, 4))
                e, top = e + (v // d) * c, top + c * ((x - 1) // d)
            elif r < 0.25:
                d = int(rng.integers(1, 4))
                e, top = e + (v % d) * c, top + c * (d - 1)
            else:
                e, top = e + v * c, top + c * (x - 1)
        return e, top

    plan = []
    for _ in range(int(rng.integers(1, 5))):
        at = int(rng.integers(0, depth + 1))
        tgt = affine(at)
        loads = [affine(at) if rng.random() < 0.6 else tgt for _ in range(int(rng.integers(1, 3)))]
        plan.append((rng.choice(["plain", "reduce", "cond", "let", "alloc"]), tgt, loads, at))
    size = 1 + max([t[1] for _, t, _, _ in plan] + [x[1] for _, _, ls, _ in plan for x in ls])
    X, Y = T.Buffer("X", (size,), "int64"), T.Buffer("Y", (size,), "int64")
    # sometimes the deeper loops use a buffer allocated inside loop 0 instead of Y
    local = depth >= 2 and rng.random() < 0.5
    Yl = T.Buffer("Yl", (size,), "int64", scope="local") if local else Y

    def build(d):
        body = []
        for kind, (t, _), ls, at in plan:
            if at != d:
                continue
            y = Yl if d >= 2 else Y
            dst = X if rng.random() < 0.7 else y
            other = y if dst is X else X
            val = T.const(int(rng.integers(1, 4)))
            for index, _ in ls:
                val = val + (X if rng.random() < 0.5 else y)[index] * int(rng.integers(1, 3))
            if kind == "reduce":
                op = rng.choice(["add", "max", "mul"])
                cur, src = dst[t], other[ls[0][0]]
                new = cur + src * 3 + 1 if op == "add" else \
                    T.Max(cur, src * 3 + 1) if op == "max" else cur * (src % 5 - 2)
                st = BufferStore(dst, new, [t])
            else:
                st = BufferStore(dst, val, [t])
            if kind == "cond":
                cond = X[ls[0][0]] > 0 if rng.random() < 0.5 or d == 0 else vs[0] < 2
                st = IfThenElse(cond, st,
                                BufferStore(dst, val - 1, [t]) if rng.random() < 0.5 else None)
            elif kind == "let":
                x = T.Var("x")
                st = LetStmt(x, val, BufferStore(dst, x * 2 + dst[t], [t]))
            elif kind == "alloc":
                tmp = T.Buffer("tmp", (3,), "int64", scope="local")
                st = Allocate(tmp, seq(BufferStore(tmp, val, [1]),
                                       BufferStore(dst, tmp[1] + 1, [t])))
            if d > 0 and rng.random() < 0.2:
                iv = IterVar(T.Var("vk"), Range(0, exts[d - 1]), "reduce")
                init = BufferStore(dst, T.const(5), [t]) \
                    if isinstance(st, BufferStore) and rng.random() < 0.5 else None
                pred = vs[d - 1] < max(1, exts[d - 1] - 1) if rng.random() < 0.5 else None
                st = BlockRealize([vs[d - 1]], pred, Block("b", [iv], [], [], st, init=init))
            body.append(st)
        if d < depth:
            inner = For(vs[d], 0, exts[d], str(rng.choice(["serial", "parallel", "vectorized"])),
                        build(d + 1))
            if local and d == 1:
                ii = T.Var("ii")
                inner = Allocate(Yl, seq(loop(ii, size, BufferStore(Yl, ii * 3 - 1, [ii])), inner))
            body.insert(int(rng.integers(0, len(body) + 1)), inner)
        return seq(*body) if body else Evaluate(T.const(0))

    return prim([X, Y], build(0)), size


def test_random_loop_nests_fast_path_equals_scalar_path(monkeypatch):
    """The dependence test against sequential execution, with tiny vector chunks (many chunks
    per loop), the reduction form always allowed and, for half of the programs, the nested
    block limits tiny (generated helper functions everywhere)."""
    import sys
    mod = sys.modules["tilecraft.tensorir.interpret"]
    monkeypatch.setitem(mod._RUNTIME, "_CAP", 7)
    monkeypatch.setattr(mod, "_REDUCE_BOX", 10**9)
    n_vec = 0
    for seed in range(160):
        if seed == 80:
            monkeypatch.setattr(mod, "_MAX_LOOP_NEST", 1)
            monkeypatch.setattr(mod, "_MAX_INDENT", 3)
        f, size = _random_loop_nest(seed)
        x, y = rand(size, "int64", -3, 4), rand(size, "int64", -3, 4)
        run(f, x, y)
        n_vec += vectorized(f, x, y)
    assert n_vec > 20


# ------------------------------------------------------------------------------------------
# integration with the schedule and lowering of this package


def test_scheduled_and_lowered_functions():
    from tilecraft.tensorir import transform
    from tilecraft.tensorir.schedule import Schedule
    n = 40
    A = te.placeholder((n, 24), "float32", "A")
    W = te.placeholder((24, 16), "float32", "W")
    k = te.reduce_axis((0, 24), "k")
    C = te.compute((n, 16), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    f = te.create_prim_func([A, W, C])
    a, w = rand((n, 24)), rand((24, 16))
    sch = Schedule(f)
    i, j, kk = sch.get_loops(sch.get_block("C"))
    io, ii = sch.split(i, [None, 8])
    jo, ji = sch.split(j, [None, 4])
    sch.reorder(io, jo, kk, ii, ji)
    sch.vectorize(ji)
    sch.parallel(io)
    for g in (sch.mod["main"], transform.lower(sch.mod["main"])):
        c = run(g, a, w, np.zeros((n, 16), "float32"), exact=False, rtol=1e-5, atol=1e-5)[2]
        np.testing.assert_allclose(c, a @ w, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------
# speed: a 10^6-point kernel (timed, not asserted)


def test_million_point_kernels_run_fast():
    N = 1024
    A = te.placeholder((N, N), "float32", "A")
    B = te.compute((N, N), lambda i, j: te.exp(A[i, j]) * 0.5 + A[j, i], "B")
    f = te.create_prim_func([A, B])
    a, b = rand((N, N)), np.zeros((N, N), "float32")
    t0 = time.perf_counter()
    interpret(f, a, b)
    t1 = time.perf_counter()
    np.testing.assert_allclose(b, np.exp(a) * np.float32(0.5) + a.T, rtol=1e-6)
    M = 128
    X = te.placeholder((M, M), "float32", "X")
    Y = te.placeholder((M, M), "float32", "Y")
    r = te.reduce_axis((0, M), "r")
    Z = te.compute((M, M), lambda i, j: te.sum(X[i, r] * Y[r, j], axis=r), "Z")
    g = te.create_prim_func([X, Y, Z])
    x, y, z = rand((M, M)), rand((M, M)), np.zeros((M, M), "float32")
    t2 = time.perf_counter()
    interpret(g, x, y, z)
    t3 = time.perf_counter()
    np.testing.assert_allclose(z, x @ y, rtol=1e-4, atol=1e-4)
    print(f"\n1024x1024 elementwise: {t1 - t0:.3f} s; 128^3 matmul: {t3 - t2:.3f} s")
