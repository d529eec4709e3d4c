"""Vectorized, unrolled and parallel loops in the LLVM back end."""
import os
import textwrap

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import AssertStmt, Buffer, BufferStore, For, IfThenElse, LetStmt, Var, te, var
from tilecraft.tensorir.stmt import Allocate, seq

from tilecraft.targets.llvm.codegen import PARALLEL_GRAIN

from targets_testutil import lower, lowered_func, run_sub, with_loop_kinds


def elementwise(shape, f, dtype="float32"):
    """B = f(A), lowered; loops are named i (and j for 2-D)."""
    A = te.placeholder(shape, dtype, "A")
    if len(shape) == 1:
        B = te.compute(shape, lambda i: f(A[i]), "B")
    else:
        B = te.compute(shape, lambda i, j: f(A[i, j]), "B")
    return lower(te.create_prim_func([A, B]))


# -- vectorized ------------------------------------------------------------------------------

def test_constant_extent_becomes_one_vector(rng):
    n = te.var("n")
    func = with_loop_kinds(elementwise((n, 37), lambda a: te.exp(a) * 2.0 + a), j="vectorized")
    mod = targets.build(func, "llvm")
    raw = mod.get_source("ll-raw")
    assert "load <37 x float>" in raw and "store <37 x float>" in raw
    assert "fmul <37 x float>" in raw  # exp is inline vector code too
    for rows in (1, 4):
        a = rng.standard_normal((rows, 37)).astype("float32")
        b = np.zeros_like(a)
        mod["main"](a, b)
        np.testing.assert_allclose(b, np.exp(a) * 2 + a, rtol=1e-6)


@pytest.mark.parametrize("size", [1, 7, 16, 17, 63, 200])
def test_symbolic_extent_vectorized_with_masked_tail(size, rng):
    n = te.var("n")
    func = with_loop_kinds(elementwise((n,), lambda a: a * a - 1.0), i="vectorized")
    mod = targets.build(func, "llvm")
    raw = mod.get_source("ll-raw")
    assert "x float>" in raw and "llvm.masked.store" in raw
    a = rng.standard_normal(size).astype("float32")
    b = np.full(size + 3, 42, "float32")  # the tail must not write past the array
    mod["main"](a, b[:size])
    np.testing.assert_allclose(b[:size], a * a - 1, rtol=1e-6)
    assert (b[size:] == 42).all()


def test_long_constant_extent_steps_and_tail(rng):
    func = with_loop_kinds(elementwise((1003,), lambda a: te.sqrt(te.abs(a))), i="vectorized")
    mod = targets.build(func, "llvm")
    assert "x float>" in mod.get_source("ll-raw")
    a = rng.standard_normal(1003).astype("float32")
    b = np.zeros(1003, "float32")
    mod["main"](a, b)
    np.testing.assert_allclose(b, np.sqrt(np.abs(a)), rtol=1e-6)


def _split_kernel(factor):
    """for io: for ii (vectorized, factor): if io*f+ii < n: B[io*f+ii] = A[io*f+ii] * 3 + 1."""
    n = var("n")
    A, B = Buffer("A", (n,), "float32"), Buffer("B", (n,), "float32")
    io, ii = var("io"), var("ii")
    idx = io * factor + ii
    body = IfThenElse(idx < n, BufferStore(B, A[idx] * 3.0 + 1.0, [idx]))
    loop = For(io, 0, (n + factor - 1) // factor, "serial",
               For(ii, 0, factor, "vectorized", body))
    return lowered_func([A, B], loop)


@pytest.mark.parametrize("size", [1, 8, 13, 100])
def test_predicated_tail_becomes_masks(size, rng):
    mod = targets.build(_split_kernel(8), "llvm")
    raw = mod.get_source("ll-raw")
    assert "llvm.masked.load.v8f32" in raw and "llvm.masked.store.v8f32" in raw
    a = rng.standard_normal(size).astype("float32")
    b = np.zeros(size, "float32")
    mod["main"](a, b)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-6)


@pytest.mark.parametrize("size", [1, 7, 8, 13, 100])
def test_masked_step_on_a_stack_accumulator_is_a_blend(size, rng):
    """A row sum on 8 partial results in a stack buffer over a symbolic row (rfactor's tail):
    the masked last step reads and writes the accumulator as whole vectors (load, select,
    store), which LLVM keeps in a register; only the row's own load stays masked."""
    n = var("n")
    A, B = Buffer("A", (n,), "float32"), Buffer("B", (1,), "float32")
    acc = Buffer("acc", (8,), "float32", scope="local")
    io, ii, k = var("io"), var("ii"), var("k")
    idx = io * 8 + ii
    init = For(ii, 0, 8, "vectorized", BufferStore(acc, 0.0, [ii]))
    update = For(io, 0, (n + 7) // 8, "serial", For(ii, 0, 8, "vectorized", IfThenElse(
        idx < n, BufferStore(acc, acc[ii] + A[idx], [ii]))))
    total = For(k, 0, 8, "serial", BufferStore(B, B[0] + acc[k], [0]))
    body = Allocate(acc, seq(init, update, BufferStore(B, 0.0, [0]), total))
    mod = targets.build(lowered_func([A, B], body), "llvm")
    raw = mod.get_source("ll-raw")
    assert "llvm.masked.load.v8f32" in raw and "llvm.masked.store" not in raw
    assert "select <8 x i1>" in raw
    a = rng.standard_normal(size).astype("float32")
    b = np.zeros(1, "float32")
    mod["main"](a, b)
    np.testing.assert_allclose(b[0], a.astype(np.float64).sum(), rtol=1e-5, atol=1e-6)


def test_strided_access_becomes_gather_and_scatter(rng):
    # transpose with the row index vectorized: both sides are strided
    A = te.placeholder((16, 12), "float32", "A")
    B = te.compute((12, 16), lambda i, j: A[j, i] + 1.0, "B")
    func = with_loop_kinds(lower(te.create_prim_func([A, B])), j="vectorized")
    mod = targets.build(func, "llvm")
    assert "llvm.masked.gather.v16f32" in mod.get_source("ll-raw")
    a = rng.standard_normal((16, 12)).astype("float32")
    b = np.zeros((12, 16), "float32")
    mod["main"](a, b)
    np.testing.assert_allclose(b, a.T + 1)
    # the store strided: for i: for j (vectorized): C[j, i] = A[i, j] * 2 (by hand)
    X, Y = Buffer("X", (12, 16), "float32"), Buffer("Y", (16, 12), "float32")
    Xf, Yf = Buffer("X", (192,), "float32"), Buffer("Y", (192,), "float32")
    i, j = var("i"), var("j")
    body = For(i, 0, 12, "serial", For(j, 0, 16, "vectorized",
                                       BufferStore(Yf, Xf[i * 16 + j] * 2.0, [j * 12 + i])))
    mod = targets.build(lowered_func([X, Y], body, flat={X: Xf, Y: Yf}), "llvm")
    raw = mod.get_source("ll-raw")
    assert "llvm.masked.scatter.v16f32" in raw and "load <16 x float>" in raw
    x = rng.standard_normal((12, 16)).astype("float32")
    y = np.zeros((16, 12), "float32")
    mod["main"](x, y)
    np.testing.assert_allclose(y, x.T * 2)


def test_strided_load_from_a_register_tile_is_lane_loads(rng):
    # a 7 x 16 tile on the stack, filled by rows (one vector each), read across: for c
    # (unrolled): Y[c, 0:7] = T[0:7, c] (lanes 16 apart). No gather: per-lane loads that LLVM
    # turns into a transpose in registers once the tile is promoted (the channel-vector
    # convolution's write-back).
    X, Y = Buffer("X", (7, 16), "float32"), Buffer("Y", (16, 7), "float32")
    Xf, Yf = Buffer("X", (112,), "float32"), Buffer("Y", (112,), "float32")
    T = Buffer("T", (112,), "float32", scope="local")
    p, c, k = var("p"), var("c"), var("k")
    fill = For(p, 0, 7, "unrolled", For(k, 0, 16, "vectorized",
                                          BufferStore(T, Xf[p * 16 + k] + 1.0, [p * 16 + k])))
    read = For(c, 0, 16, "unrolled", For(k, 0, 7, "vectorized",
                                         BufferStore(Yf, T[k * 16 + c] * 2.0, [c * 7 + k])))
    body = Allocate(T, seq(fill, read))
    mod = targets.build(lowered_func([X, Y], body, flat={X: Xf, Y: Yf}), "llvm")
    raw = mod.get_source("ll-raw")
    assert "masked.gather" not in raw and "insertelement <7 x float>" in raw
    assert "gather" not in mod.get_source("asm")
    x = rng.standard_normal((7, 16)).astype("float32")
    y = np.zeros((16, 7), "float32")
    mod["main"](x, y)
    np.testing.assert_allclose(y, (x.T + 1) * 2, rtol=1e-6)


@pytest.mark.parametrize("stride", [2, 3, 4])
def test_small_stride_loads_are_one_masked_load_and_a_shuffle(rng, stride):
    # B[i] = A[s * i + 1]: the lanes read every s-th element. A symbolic n gives whole vector
    # steps and a masked tail; A is exactly as long as the last element read, so reading past
    # it (the wide load's unused lanes) would be out of bounds: those lanes are masked off.
    n = te.var("n")
    A = te.placeholder((n * stride - stride + 2,), "float32", "A")
    B = te.compute((n,), lambda i: A[i * stride + 1] * 2.0, "B")
    func = with_loop_kinds(lower(te.create_prim_func([A, B])), i="vectorized")
    mod = targets.build(func, "llvm")
    raw = mod.get_source("ll-raw")
    assert "masked.gather" not in raw
    assert f"llvm.masked.load.v{16 * stride}f32" in raw or \
        f"llvm.masked.load.v{8 * stride}f32" in raw or f"llvm.masked.load.v{4 * stride}f32" in raw
    for size in (1, 5, 16, 37):
        a = rng.standard_normal(size * stride - stride + 2).astype("float32")
        b = np.zeros(size, "float32")
        mod["main"](a, b)
        np.testing.assert_allclose(b, a[1::stride][:size] * 2)


def test_lane_varying_if_then_else_guards_loads(rng):
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: te.if_then_else(i + 1 < n, A[i + 1], -1.0), "B")
    func = with_loop_kinds(lower(te.create_prim_func([A, B])), i="vectorized")
    mod = targets.build(func, "llvm")
    assert "llvm.masked.load" in mod.get_source("ll-raw")
    for size in (1, 9, 64):
        a = rng.standard_normal(size).astype("float32")
        b = np.zeros(size, "float32")
        mod["main"](a, b)
        np.testing.assert_array_equal(b, np.append(a[1:], -1))


def test_vectorized_dtypes_and_non_affine_index(rng):
    A = te.placeholder((64,), "float16", "A")
    M = te.placeholder((64,), "bool", "M")
    I = te.placeholder((64,), "int8", "I")
    B = te.compute((64,), lambda i: te.if_then_else(M[i], A[i] * A[i], A[i]), "B")
    C = te.compute((64,), lambda i: (I[i] // 3 + I[(i * 7) % 64]).astype("int8"), "C")
    D = te.compute((64,), lambda i: M[i] & (I[i] > 0), "D")
    func = lower(te.create_prim_func([A, M, I, B, C, D]))
    func = with_loop_kinds(func, i="vectorized")
    mod = targets.build(func, "llvm")
    raw = mod.get_source("ll-raw")
    assert "<64 x i8>" in raw
    a = rng.standard_normal(64).astype("float16")
    m = rng.random(64) > 0.5
    ii = rng.integers(-128, 127, 64).astype("int8")
    b, c, d = np.zeros(64, "float16"), np.zeros(64, "int8"), np.zeros(64, bool)
    mod["main"](a, m, ii, b, c, d)
    np.testing.assert_array_equal(b, np.where(m, a * a, a))
    np.testing.assert_array_equal(c, (ii // 3 + ii[(np.arange(64) * 7) % 64]).astype("int8"))
    np.testing.assert_array_equal(d, m & (ii > 0))


def test_unvectorizable_body_falls_back_to_scalar_loop(rng):
    # j holds the reduction loop k: the body cannot become vector code
    A = te.placeholder((6, 20), "float32", "A")
    W = te.placeholder((20, 9), "float32", "W")
    k = te.reduce_axis((0, 20), "k")
    C = te.compute((6, 9), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    func = with_loop_kinds(lower(te.create_prim_func([A, W, C])), j="vectorized")
    mod = targets.build(func, "llvm")
    assert "llvm.loop.vectorize.enable" in mod.get_source("ll-raw")
    a = rng.standard_normal((6, 20)).astype("float32")
    w = rng.standard_normal((20, 9)).astype("float32")
    c = np.zeros((6, 9), "float32")
    mod["main"](a, w, c)
    np.testing.assert_allclose(c, a @ w, rtol=1e-5, atol=1e-5)
    # k vectorized: every lane stores to the same C[i, j] (a reduction), also scalar
    func = with_loop_kinds(lower(te.create_prim_func([A, W, C])), k="vectorized")
    mod = targets.build(func, "llvm")
    assert "llvm.loop.vectorize.enable" in mod.get_source("ll-raw")
    c[:] = 0
    mod["main"](a, w, c)
    np.testing.assert_allclose(c, a @ w, rtol=1e-5, atol=1e-5)


def test_let_inside_vectorized_loop(rng):
    n = var("n")
    A, B = Buffer("A", (n,), "float32"), Buffer("B", (n,), "float32")
    i, t = var("i"), Var("t", "float32")
    body = LetStmt(t, A[i] * 2.0, BufferStore(B, t * t + t, [i]))
    mod = targets.build(lowered_func([A, B], For(i, 0, n, "vectorized", body)), "llvm")
    a = rng.standard_normal(21).astype("float32")
    b = np.zeros(21, "float32")
    mod["main"](a, b)
    np.testing.assert_allclose(b, (2 * a) ** 2 + 2 * a, rtol=1e-6)


# -- unrolled ---------------------------------------------------------------------------------

@pytest.mark.parametrize("extent", [4, 100])
def test_unrolled_loops(extent, rng):
    func = with_loop_kinds(elementwise((3, extent), lambda a: a - 0.5), j="unrolled")
    mod = targets.build(func, "llvm")
    raw = mod.get_source("ll-raw")
    if extent > 64:
        assert "llvm.loop.unroll.full" in raw
    else:
        assert "for.j" not in raw
    a = rng.standard_normal((3, extent)).astype("float32")
    b = np.zeros_like(a)
    mod["main"](a, b)
    np.testing.assert_allclose(b, a - 0.5)


# -- parallel ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [0, 1, 2, 3, 101])
def test_parallel_rows_with_two_threads(rows, rng):
    n = te.var("n")
    func = with_loop_kinds(elementwise((n, 33), lambda a: te.tanh(a) + 1.0), i="parallel",
                           j="vectorized")
    mod = targets.build(func, "llvm -num-cores=2")
    assert mod.num_threads == 2
    assert "tilecraft_rt_parallel_launch" in mod.get_source("ll-raw")
    a = rng.standard_normal((rows, 33)).astype("float32")
    b = np.zeros_like(a)
    mod["main"](a, b)
    np.testing.assert_allclose(b, np.tanh(a) + 1, rtol=1e-6, atol=1e-6)


def test_parallel_reduction_with_intermediate_and_nested_parallel(rng):
    n = te.var("n")
    A = te.placeholder((n, 50), "float64", "A")
    k = te.reduce_axis((0, 50), "k")
    T = te.compute((n, 50), lambda i, j: A[i, j] * A[i, j], "T")
    S = te.compute((n,), lambda i: te.sum(T[i, k], axis=k), "S")
    func = lower(te.create_prim_func([A, S]))
    # every loop named i is parallel; the reduction's k loop too (nested: runs serially)
    func = with_loop_kinds(func, i="parallel", j="parallel", k="parallel")
    mod = targets.build(func, "llvm -num-cores=2")
    for rows in (1, 7, 64):
        a = rng.standard_normal((rows, 50))
        s = np.zeros(rows)
        mod["main"](a, s)
        np.testing.assert_allclose(s, (a * a).sum(1))


def test_parallel_with_local_allocation_per_task(rng):
    n = var("n")
    A, B = Buffer("A", (n, 8), "float32"), Buffer("B", (n,), "float32")
    Af = Buffer("A", (n * 8,), "float32")
    tmp = Buffer("tmp", (8,), "float32", scope="local")
    big = Buffer("big", (2000,), "float32", scope="local")  # 8000 bytes: heap, per task
    i, j = var("i"), var("j")
    fill = For(j, 0, 8, "serial", seq(BufferStore(tmp, Af[i * 8 + j] * 2.0, [j]),
                                      BufferStore(big, Af[i * 8 + j], [j * 100])))
    acc = For(j, 0, 8, "serial", BufferStore(B, B[i] + tmp[j] + big[j * 100], [i]))
    body = Allocate(tmp, Allocate(big, seq(BufferStore(B, 0.0, [i]), fill, acc)))
    func = lowered_func([A, B], For(i, 0, n, "parallel", body), flat={A: Af})
    mod = targets.build(func, "llvm -num-cores=2")
    for rows in (1, 2, 31):
        a = rng.standard_normal((rows, 8)).astype("float32")
        b = np.zeros(rows, "float32")
        mod["main"](a, b)
        np.testing.assert_allclose(b, 3 * a.sum(1), rtol=1e-5)


def test_assert_inside_parallel_body_raises_and_frees(rng):
    n = var("n")
    A, B = Buffer("A", (n,), "float32"), Buffer("B", (n,), "float32")
    big = Buffer("big", (5000,), "float32")
    i = var("i")
    body = Allocate(big, AssertStmt(A[i] < 100.0, "A[i] must stay below 100",
                                    seq(BufferStore(big, A[i], [0]),
                                        BufferStore(B, big[0], [i]))))
    mod = targets.build(lowered_func([A, B], For(i, 0, n, "parallel", body)),
                        "llvm -num-cores=2")
    # two statements an iteration: past PARALLEL_GRAIN from 16384 rows, so the pool runs it
    a = rng.standard_normal(40000).astype("float32")
    b = np.zeros(40000, "float32")
    mod["main"](a, b)
    np.testing.assert_array_equal(b, a)
    a[33333] = 1000
    with pytest.raises(ValueError, match="main: A\\[i\\] must stay below 100"):
        mod["main"](a, b)
    a[33333] = 0
    mod["main"](a, b)  # the next call works again
    mod.num_threads = 1
    a[0] = 500
    with pytest.raises(ValueError, match="must stay below 100"):
        mod["main"](a, b)


def test_parallel_pool_survives_many_launches_and_thread_counts(rng):
    n = te.var("n")
    func = with_loop_kinds(elementwise((n,), lambda a: a + 1.0), i="parallel")
    mod = targets.build(func, "llvm")
    a = rng.standard_normal(4 * PARALLEL_GRAIN).astype("float32")   # enough work for the pool
    b = np.zeros_like(a)
    for threads in (2, 1, 3, 8, 0):
        mod.num_threads = threads
        for _ in range(50):
            b[:] = 0
            mod["main"](a, b)
        np.testing.assert_array_equal(b, a + 1)


def test_parallel_launch_only_where_the_work_pays():
    # a symbolic parallel loop: below PARALLEL_GRAIN iterations per task it runs on the calling
    # thread (no worker is ever started), above it the pool's workers share it
    here = os.path.dirname(os.path.abspath(__file__))
    code = textwrap.dedent(f"""
        import os
        import sys
        sys.path[:0] = [{here!r}, {os.path.dirname(here)!r}]
        import numpy as np
        from tilecraft import targets
        from tilecraft.targets.llvm.codegen import PARALLEL_GRAIN
        from tilecraft.tensorir import te
        from targets_testutil import lower, with_loop_kinds
        n = te.var("n")
        A = te.placeholder((n, 16), "float32", "A")
        B = te.compute((n, 16), lambda i, j: A[i, j] * 2.0, "B")
        func = with_loop_kinds(lower(te.create_prim_func([A, B])), i="parallel",
                               j="vectorized")
        mod = targets.build(func, "llvm -num-cores=4")
        def threads():
            return len(os.listdir("/proc/self/task"))
        before = threads()
        for rows in (1, 8, 100, (PARALLEL_GRAIN - 1) // 16):
            a = np.random.default_rng(rows).standard_normal((rows, 16)).astype("float32")
            b = np.zeros_like(a)
            mod["main"](a, b)
            np.testing.assert_array_equal(b, a * 2)
        small = threads()
        a = np.ones((PARALLEL_GRAIN * 4 // 16, 16), "float32")
        b = np.zeros_like(a)
        mod["main"](a, b)
        np.testing.assert_array_equal(b, a * 2)
        print("THREADS", before, small, threads())
    """)
    proc = run_sub(code)
    assert proc.returncode == 0, proc.stderr
    before, small, big = map(int, proc.stdout.split("THREADS")[1].split())
    assert small == before      # no launch below the grain
    assert big > small          # the pool's workers above it
