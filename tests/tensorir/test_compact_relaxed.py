"""CompactBufferAllocation on tiles whose region the interval analysis over-approximates:

* a cooperative fetch fused over the tile and split by a thread count that does not divide it
  (``fused // 5`` under ``fused < 60``): the region ignores the guard and exceeds the buffer's
  dimension, which then stays whole while the other dimensions shrink (it used to keep the
  whole buffer);
* a clamped index (``min(i + 1, n - 1)``) whose tile extent depends on the outer loop but has
  a constant upper bound: the tile gets that bound (it used to stay ``(n,)``, not a register
  tile).

Each lowered function is run by the interpreter (which checks every access) against numpy."""
import numpy as np
import pytest

from tilecraft import tensorir as T
from tilecraft.tensorir import Schedule, te, transform
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import Allocate


def _allocs(func):
    out = {}
    post_order_visit(func.body, lambda n: out.setdefault(n.buffer.name, n.buffer)
                     if isinstance(n, Allocate) else None)
    return out


def _shape(buf):
    return tuple(int(s.value) for s in buf.shape)


def guarded_fetch(m=16, n=12, k=35, bk=5, ty=4, tx=12):
    """C = A @ W.T; W's (n, bk) tile staged in shared memory by all ty * tx threads, the
    fetch fused and split by the thread count (a guard where it does not divide)."""
    A = te.placeholder((m, k), "float32", "A")
    W = te.placeholder((n, k), "float32", "W")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * W[j, r], axis=r), "C")
    sch = Schedule(te.create_prim_func([A, W, C]))
    b = sch.get_block("C")
    i, j, kk = sch.get_loops(b)
    i0, i1 = sch.split(i, [None, ty])
    k0, k1 = sch.split(kk, [None, bk])
    sch.reorder(i0, i1, j, k0, k1)
    sch.bind(i0, "blockIdx.x")
    sch.bind(i1, "threadIdx.y")
    sch.bind(j, "threadIdx.x")
    sh = sch.cache_read(b, 1, "shared")
    sch.compute_at(sh, k0)
    fused = sch.fuse(*sch.get_loops(sh)[-2:])
    _, fy, fx = sch.split(fused, [None, ty, tx])
    sch.bind(fy, "threadIdx.y")
    sch.bind(fx, "threadIdx.x")
    return sch.func


@pytest.mark.parametrize("k, bk, ty, tx", [(35, 5, 4, 12), (36, 9, 2, 12), (40, 8, 4, 12)])
def test_guarded_cooperative_fetch_is_compacted(k, bk, ty, tx):
    func = guarded_fetch(k=k, bk=bk, ty=ty, tx=tx)
    low = transform.lower(func, "opencl")
    w = _allocs(low)["W_shared"]
    assert np.prod(_shape(w)) == 12 * bk, low.script()      # (12, bk), not (12, k)
    rng = np.random.default_rng(k)
    a = rng.standard_normal((16, k)).astype("float32")
    wt = rng.standard_normal((12, k)).astype("float32")
    c = np.zeros((16, 12), "float32")
    T.interpret(low, a, wt, c)
    np.testing.assert_allclose(c, a @ wt.T, rtol=1e-4, atol=1e-5)


def clamped_local():
    """B[i] = A[min(i + 1, n - 1)] + A[i], A cached in registers per 4 outputs."""
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[T.Min(i + 1, n - 1)] + A[i], "B")
    sch = Schedule(te.create_prim_func([A, B]))
    b = sch.get_block("B")
    (i,) = sch.get_loops(b)
    i0, _ = sch.split(i, [None, 4])
    c = sch.cache_read(b, 0, "local")
    sch.compute_at(c, i0)
    return sch.func


def test_clamped_tile_gets_its_constant_bound():
    low = transform.lower(clamped_local())
    assert _shape(_allocs(low)["A_local"]) == (5,), low.script()
    for n in (1, 2, 3, 4, 5, 8, 13):
        a = np.random.default_rng(n).standard_normal(n).astype("float32")
        b = np.full(n, np.nan, "float32")
        T.interpret(low, a, b)
        np.testing.assert_array_equal(b, a[np.minimum(np.arange(n) + 1, n - 1)] + a)


def test_unbounded_symbolic_tile_is_left_alone():
    # a tile as long as a symbolic dim has no constant bound: the allocation keeps its shape
    n = te.var("n")
    A = te.placeholder((n, 4), "float32", "A")
    B = te.compute((n, 4), lambda i, j: A[i, j] * 2.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    b = sch.get_block("B")
    i, j = sch.get_loops(b)
    sch.reorder(j, i)
    c = sch.cache_read(b, 0, "local")
    sch.compute_at(c, j)     # the tile A_local[0:n, j] runs over all of n
    low = transform.lower(sch.func)
    (buf,) = [b for name, b in _allocs(low).items() if name == "A_local"]
    assert not isinstance(buf.shape[0], T.IntImm), low.script()     # n * 4 once flat
    a = np.random.default_rng(0).standard_normal((6, 4)).astype("float32")
    out = np.zeros((6, 4), "float32")
    T.interpret(low, a, out)
    np.testing.assert_array_equal(out, a * 2)


def _random_stencil(seed):
    """B = sum of A at clamped offsets; A cached (local or shared) at a random loop of a 2-D
    tiling. Returns (func, offsets)."""
    import random
    r = random.Random(seed)
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n, m), "float32", "A")
    offs = [(r.randint(-2, 2), r.randint(-2, 2)) for _ in range(r.randint(1, 3))]
    max_of_min = r.random() < 0.7

    def clamp(e, ext):
        if max_of_min:
            return T.Max(T.Min(e, ext - 1), T.IntImm(0))
        return T.Min(T.Max(e, T.IntImm(0)), ext - 1)

    def f(i, j):
        loads = [A[clamp(i + di, n), clamp(j + dj, m)] for di, dj in offs]
        out = loads[0]
        for x in loads[1:]:
            out = out + x
        return out
    B = te.compute((n, m), f, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    b = sch.get_block("B")
    i, j = sch.get_loops(b)
    i0, i1 = sch.split(i, [None, r.choice([2, 3, 4])])
    j0, j1 = sch.split(j, [None, r.choice([2, 4, 8])])
    sch.reorder(i0, j0, i1, j1)
    c = sch.cache_read(b, 0, r.choice(["local", "shared"]))
    sch.compute_at(c, r.choice([i0, j0, i1]))
    return sch.func, offs


@pytest.mark.parametrize("seed", range(16))
def test_random_clamped_stencils(seed):
    func, offs = _random_stencil(seed)
    low = transform.lower(func)
    for n, m in ((1, 1), (3, 5), (7, 9)):
        a = np.random.default_rng(seed).standard_normal((n, m)).astype("float32")
        out = np.full((n, m), np.nan, "float32")
        T.interpret(low, a, out)
        ii, jj = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
        want = sum(a[np.clip(ii + di, 0, n - 1), np.clip(jj + dj, 0, m - 1)] for di, dj in offs)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_random_clamped_stencils_mostly_get_constant_tiles():
    # the cache at i_1 or j_0 has a tile of constant bound; at i_0 it spans all of m
    constant = 0
    for seed in range(16):
        (buf,) = _allocs(transform.lower(_random_stencil(seed)[0])).values()
        constant += all(isinstance(s, T.IntImm) for s in buf.shape)
    assert constant >= 8, constant


def batched_transposed_tile():
    """C[b] = A[b] @ W over a symbolic batch ``n``; per ``b`` the (8, 16) tile of A staged in
    shared memory transposed to (16, 8) with its rows padded (``storage_align(.., 32, 4)``), as
    the GPU GEMM rule stages a dense layer's row tile."""
    from tilecraft.tensorir.schedule.index_map import IndexMap
    n = te.var("n")
    A = te.placeholder((n, 8, 16), "float32", "A")
    W = te.placeholder((16, 8), "float32", "W")
    r = te.reduce_axis((0, 16), "k")
    C = te.compute((n, 8, 8), lambda b, i, j: te.sum(A[b, i, r] * W[r, j], axis=r), "C")
    sch = Schedule(te.create_prim_func([A, W, C]))
    blk = sch.get_block("C")
    sh = sch.cache_read(blk, 0, "shared")
    sch.compute_at(sh, sch.get_loops(blk)[0])
    sch.transform_layout(sh, 0, IndexMap.from_func(lambda b, i, k: (b, k, i), ndim=3), "write")
    sch.storage_align(sh, 0, 1, 32, 4)
    return sch.func


def test_padded_tile_under_a_symbolic_outer_dim_keeps_its_padding():
    # the outermost dim sizes no stride: a symbolic one used to drop the tile's padding (every
    # dense layer over a symbolic batch lost its bank-conflict-free row tile on the GPU)
    low = transform.lower(batched_transposed_tile())
    buf = _allocs(low)["A_shared"]
    # flat: 16 rows of 8 words at a stride of 36 (the compact tile would be 128 words)
    assert _shape(buf) == (15 * 36 + 8,), low.script()
    assert "k * 36" in low.script()
    w = np.random.default_rng(1).standard_normal((16, 8)).astype("float32")
    for n in (1, 3):
        a = np.random.default_rng(n).standard_normal((n, 8, 16)).astype("float32")
        c = np.full((n, 8, 8), np.nan, "float32")
        T.interpret(low, a, w, c)
        np.testing.assert_allclose(c, a @ w, rtol=1e-4, atol=1e-5)
