"""LoopPartition: split-tail tests removed from the main loop, same results everywhere."""
import numpy as np
import pytest

from tilecraft.tensorir import te
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.stmt import For, IfThenElse
from tilecraft.tensorir.transform import ConvertBlocksToLoops, LoopPartition, VerifyMemoryAccess, lower

MR, NR = 4, 8


def _matmul(n, m=NR * 3, k=5, fuse=False):
    """(unscheduled, scheduled) ``n x k @ k x m`` with ``i`` split by MR (symbolic ``n``: a
    tail test around every accumulator update), ``j`` by NR, ``k`` inside the tile loops."""
    A = te.placeholder((n, k), "float32", "A")
    B = te.placeholder((k, m), "float32", "B")
    r = te.reduce_axis((0, k), "r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), "C")
    f = te.create_prim_func([A, B, C])
    sch = Schedule(f)
    blk = sch.get_block("C")
    i, j, kk = sch.get_loops(blk)
    io, ii = sch.split(i, [None, MR])
    jo, ji = sch.split(j, [None, NR])
    sch.reorder(io, jo, kk, ii, ji)
    if fuse:
        sch.fuse(io, jo)
    return f, sch.func


def _ifs(stmt):
    """The bound tests (conditions on a row index) in ``stmt``; not the init's ``r == 0``."""
    out = []
    post_order_visit(stmt, lambda x: out.append(x) if isinstance(x, IfThenElse) and
                     "i_" in str(x.condition) else None)
    return out


def _run(func, n, k=5, m=NR * 3, **kw):
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, k)).astype("float32")
    b = rng.standard_normal((k, m)).astype("float32")
    c = np.zeros((n, m), "float32")
    interpret(func, a, b, c, **kw)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    return a, b


@pytest.mark.parametrize("fuse", [False, True])
def test_main_loop_has_no_test(fuse):
    n = te.var("n")
    _, g = _matmul(n, fuse=fuse)
    low = ConvertBlocksToLoops(VerifyMemoryAccess(g))
    assert _ifs(low.body)                       # the tail test before partitioning
    part = LoopPartition(low)
    loop = part.body
    assert isinstance(loop, For) and isinstance(loop.body, IfThenElse)
    main, tail = loop.body.then_case, loop.body.else_case
    assert "n // 4" in str(loop.body.condition)
    assert not _ifs(main)                       # main: predicate-free
    assert _ifs(tail)                           # tail: keeps the test


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("n_val", [1, 3, 4, 8, 13])
def test_symbolic_numerics_interpreted(fuse, n_val):
    n = te.var("n")
    _, g = _matmul(n, fuse=fuse)
    part = LoopPartition(ConvertBlocksToLoops(VerifyMemoryAccess(g)))
    _run(part, n_val)
    _run(lower(g), n_val)


@pytest.mark.parametrize("n_val", [3, 10])
def test_constant_tail(n_val):
    _, g = _matmul(n_val, fuse=True)
    part = LoopPartition(ConvertBlocksToLoops(VerifyMemoryAccess(g)))
    _run(part, n_val)


def test_exact_multiple_drops_tail():
    _, g = _matmul(12)
    low = ConvertBlocksToLoops(VerifyMemoryAccess(g))
    # 12 rows split by 4: no test at all, nothing to partition
    assert LoopPartition(low).body is low.body or not _ifs(LoopPartition(low).body)


def test_non_bound_conditions_untouched():
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: te.if_then_else(i % 2 == 0, A[i], 0.0), "B")
    f = te.create_prim_func([A, B])
    low = ConvertBlocksToLoops(f)
    assert LoopPartition(low).body is low.body


@pytest.mark.parametrize("n_val", [1, 4, 7, 16])
def test_symbolic_compiled(n_val):
    from tilecraft import targets
    n = te.var("n")
    _, g = _matmul(n, fuse=True)
    mod = targets.build(g, "llvm")
    rng = np.random.default_rng(n_val)
    a = rng.standard_normal((n_val, 5)).astype("float32")
    b = rng.standard_normal((5, NR * 3)).astype("float32")
    c = np.zeros((n_val, NR * 3), "float32")
    mod["main"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
