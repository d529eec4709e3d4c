"""decompose_reduction and rfactor: interpreter correctness on random data (odd sizes, tails,
symbolic dims), printed text, JSON trace round trips, and the illegal cases."""
import json

import numpy as np
import pytest

from tilecraft.tensorir import te, var
from tilecraft.tensorir.expr import FloatImm
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.schedule import Schedule, ScheduleError, Trace
from tilecraft.tensorir.schedule import tree
from tilecraft.tensorir.stmt import BufferStore
from tilecraft.tensorir.structural import structural_equal

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def matmul(M=7, K=6, N=5):
    A = te.placeholder((M, K), "float32", "A")
    B = te.placeholder((K, N), "float32", "B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def row_reduce(combiner="sum", n=9, m=13):
    A = te.placeholder((n, m), "float32", "A")
    k = te.reduce_axis((0, m), "k")
    fn = {"sum": te.sum, "max": te.max, "min": te.min}[combiner]
    B = te.compute((n,), lambda i: fn(A[i, k], axis=k), "B")
    return te.create_prim_func([A, B])


def check_matmul(func, M=7, K=6, N=5):
    a, b = rand(M, K), rand(K, N)
    c = np.full((M, N), np.nan, "float32")
    interpret(func, a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


ORACLE = {"sum": lambda a: a.sum(1), "max": lambda a: a.max(1), "min": lambda a: a.min(1)}


def check_rows(func, combiner="sum", n=9, m=13, **kw):
    a = rand(n, m)
    b = np.full((n,), np.nan, "float32")
    interpret(func, a, b, **kw)
    np.testing.assert_allclose(b, ORACLE[combiner](a), rtol=1e-5, atol=1e-5)


def round_trip(sch, orig):
    data = json.loads(json.dumps(sch.trace.to_json()))
    again = Trace.from_json(data).apply(orig)
    assert structural_equal(again.func, sch.func), again.func.script()


def names(func):
    return [br.block.name for br in tree.all_blocks(func)]


def expect_error(sch, fn, *patterns):
    before, n = sch.func, len(sch.trace)
    with pytest.raises(ScheduleError) as info:
        fn()
    for p in patterns:
        assert p in str(info.value), str(info.value)
    assert sch.func is before and structural_equal(sch.func, before)
    # the failed call is not recorded (queries made while building the call may be)
    assert all(inst.kind != patterns[0] for inst in sch.trace.instructions[n:])


# ---------------------------------------------------------------------------------------------
# decompose_reduction


@pytest.mark.parametrize("at", [0, 1, 2])
def test_decompose_reduction_at_each_loop(at):
    f = matmul()
    sch = Schedule(f)
    c = sch.get_block("C")
    loops = sch.get_loops(c)
    init = sch.decompose_reduction(c, loops[at])
    assert sch.get(init).name == "C_init"
    assert sch.get(c).init is None
    text = sch.func.script()
    assert "C[vi_init, vj_init] = T.float32(0)" in text
    # the init block gets copies of the spatial loops from `at` down
    init_loops = [s.loop_var.name for s, p in tree.walk(sch.func.body)
                  if hasattr(s, "loop_var") and s.loop_var.name.endswith("_init")]
    assert init_loops == ["i_init", "j_init"][at:]
    # the reduction now reads its output
    assert "T.reads(C[vi, vj], A[vi, vk], B[vk, vj])" in text
    check_matmul(sch.func)
    round_trip(sch, f)


def test_decompose_reduction_after_split_and_reorder():
    f = matmul(M=7, K=10, N=5)
    sch = Schedule(f)
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    ko, ki = sch.split(k, [None, 4])          # tail: 10 = 3 * 4 - 2
    io, ii = sch.split(i, [None, 3])          # tail: 7 = 3 * 3 - 2
    sch.reorder(io, ko, ii, j, ki)
    sch.decompose_reduction(c, ko)
    # the init block keeps the spatial tail predicate, not the reduce one
    init = sch.get(sch.get_block("C_init"))
    init_br = next(br for br in tree.all_blocks(sch.func) if br.block is init)
    assert "i_1_init" in init_br.predicate.script() and "k" not in init_br.predicate.script()
    check_matmul(sch.func, 7, 10, 5)
    round_trip(sch, f)
    expect_error(sch, lambda: sch.decompose_reduction(sch.get_block("C"), ki),
                 "decompose_reduction", "block C")  # already decomposed: no init


def test_decompose_reduction_symbolic():
    n, m = var("n"), var("m")
    A = te.placeholder((n, m), "float32", "A")
    k = te.reduce_axis((0, m), "k")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), "B")
    f = te.create_prim_func([A, B])
    sch = Schedule(f)
    b = sch.get_block("B")
    i, _ = sch.get_loops(b)
    sch.decompose_reduction(b, i)
    check_rows(sch.func, n=4, m=11)
    check_rows(sch.func, n=1, m=3)


def test_decompose_reduction_illegal():
    f = matmul(K=8)
    sch = Schedule(f)
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    ko, ki = sch.split(k, [None, 4])
    expect_error(sch, lambda: sch.decompose_reduction(c, ki), "decompose_reduction", "block C",
                 "loop k_1 is below loop k_0")
    A = te.placeholder((4,), "float32", "A")
    B = te.compute((4,), lambda x: A[x] + 1.0, "B")
    other = Schedule(te.create_prim_func([A, B]))
    b = other.get_block("B")
    expect_error(other, lambda: other.decompose_reduction(b, other.get_loops(b)[0]),
                 "decompose_reduction", "block B", "not a reduction block")
    # a loop that is not an ancestor of the block
    sch2 = Schedule(matmul())
    c2 = sch2.get_block("C")
    _, _, k2 = sch2.get_loops(c2)
    _, k2i = sch2.split(k2, [None, 2])
    sch2.rfactor(k2i, 0)
    rf = sch2.get_block("C_rf")
    wb_loop = sch2.get_loops(sch2.get_block("C"))[0]
    expect_error(sch2, lambda: sch2.decompose_reduction(rf, wb_loop), "decompose_reduction",
                 "not an ancestor of block C_rf")


# ---------------------------------------------------------------------------------------------
# rfactor


@pytest.mark.parametrize("combiner", ["sum", "max", "min"])
@pytest.mark.parametrize("factor_axis", [0, 1, -1])
def test_rfactor_row_reduction(combiner, factor_axis):
    f = row_reduce(combiner)
    sch = Schedule(f)
    b = sch.get_block("B")
    i, k = sch.get_loops(b)
    rf = sch.rfactor(k, factor_axis)
    assert sch.get(rf).name == "B_rf"
    assert names(sch.func) == ["root", "B_rf", "B"]
    rf_buf = sch.get(rf).writes[0].buffer
    assert rf_buf.name == "B_rf"
    shape = [s.value for s in rf_buf.shape]
    assert shape == ([13, 9] if factor_axis == 0 else [9, 13])
    text = sch.func.script()
    idx = "vk, vi" if factor_axis == 0 else "vi, vk"
    assert f"vk = T.axis.spatial(13, k)" in text
    assert f"vk = T.axis.reduce(13, k)" in text
    if combiner == "sum":
        assert f"B[vi] = B[vi] + B_rf[{idx}]" in text
        assert f"B_rf[{idx}] = T.float32(0)" in text
    check_rows(sch.func, combiner)
    round_trip(sch, f)


def test_rfactor_matmul_reduction_after_split():
    f = matmul(M=5, K=11, N=6)
    for which in (0, 1):
        sch = Schedule(f)
        c = sch.get_block("C")
        i, j, k = sch.get_loops(c)
        ko, ki = sch.split(k, [None, 4])      # 11 = 3 * 4 - 1: a tail predicate
        rf = sch.rfactor([ko, ki][which], 2)
        rf_block = sch.get(rf)
        extent = [3, 4][which]
        assert [s.value for s in rf_block.writes[0].buffer.shape] == [5, 6, extent]
        # the rfactor block keeps the original loops (their LoopRVs stay valid)
        assert [sch.get(l).loop_var.name for l in sch.get_loops(rf)] == ["i", "j", "k_0", "k_1"]
        wb_loops = [sch.get(l).loop_var.name for l in sch.get_loops(c)]
        assert wb_loops == ["i", "j", ["k_0", "k_1"][which]]
        check_matmul(sch.func, 5, 11, 6)
        round_trip(sch, f)


def test_rfactor_symbolic_and_then_parallel_and_decompose():
    n, m = var("n"), var("m")
    A = te.placeholder((n, m), "float32", "A")
    k = te.reduce_axis((0, m), "k")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), "B")
    f = te.create_prim_func([A, B])
    sch = Schedule(f)
    b = sch.get_block("B")
    i, kk = sch.get_loops(b)
    ko, ki = sch.split(kk, [None, 8])
    rf = sch.rfactor(ki, 0)
    assert "B_rf = T.alloc_buffer((8, n)" in sch.func.script()
    sch.reorder(ki, i, ko)
    sch.parallel(ki)
    sch.decompose_reduction(rf, ko)
    sch.decompose_reduction(b, sch.get_loops(b)[1])
    assert names(sch.func) == ["root", "B_rf_init", "B_rf", "B_init", "B"]
    for nv, mv in ((3, 21), (2, 5), (4, 16)):
        check_rows(sch.func, n=nv, m=mv)
    round_trip(sch, f)


def test_rfactor_keeps_a_non_identity_init_once():
    # a reduction whose init is not the identity (C starts at 10): partial sums start at 0
    f = row_reduce("sum", 4, 6)
    b = next(br for br in tree.all_blocks(f) if br.block.name == "B")
    init = b.block.init
    f = tree.replace(f, init, BufferStore(init.buffer, FloatImm(10.0, "float32"), init.indices))
    sch = Schedule(f)
    blk = sch.get_block("B")
    _, k = sch.get_loops(blk)
    sch.rfactor(k, 0)
    a = rand(4, 6)
    out = np.zeros(4, "float32")
    interpret(sch.func, a, out)
    np.testing.assert_allclose(out, a.sum(1) + 10.0, rtol=1e-5)


def test_rfactor_illegal():
    f = matmul()
    sch = Schedule(f)
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    expect_error(sch, lambda: sch.rfactor(i, 0), "rfactor", "loop i is not a reduction loop of "
                 "block C")
    expect_error(sch, lambda: sch.rfactor(k, 3), "rfactor", "block C", "factor_axis 3")
    # an elementwise block is not a reduction
    A = te.placeholder((4, 4), "float32", "A")
    B = te.compute((4, 4), lambda x, y: A[x, y] * 2.0, "B")
    ew = Schedule(te.create_prim_func([A, B]))
    expect_error(ew, lambda: ew.rfactor(ew.get_loops(ew.get_block("B"))[1], 0), "rfactor",
                 "block B", "not a reduction")
    # an unsupported combiner: C = C * 0.5 + A
    g = row_reduce("sum", 4, 6)
    br = next(x for x in tree.all_blocks(g) if x.block.name == "B")
    body = br.block.body
    odd = BufferStore(body.buffer, body.value.a * FloatImm(0.5, "float32") + body.value.b,
                      body.indices)
    g = tree.replace(g, body, odd)
    s2 = Schedule(g)
    expect_error(s2, lambda: s2.rfactor(s2.get_loops(s2.get_block("B"))[1], 0), "rfactor",
                 "block B", "not a reduction of a supported form")
    # a loop holding two blocks
    A = te.placeholder((4, 6), "float32", "A")
    k2 = te.reduce_axis((0, 6), "k")
    R = te.compute((4,), lambda x: te.sum(A[x, k2], axis=k2), "R")
    D = te.compute((4,), lambda x: R[x] * 2.0, "D")
    s3 = Schedule(te.create_prim_func([A, D]))
    s3.reverse_compute_at(s3.get_block("D"), s3.get_loops(s3.get_block("R"))[0])
    expect_error(s3, lambda: s3.rfactor(s3.get_loops(s3.get_block("R"))[0], 0), "rfactor",
                 "loop x")
    expect_error(s3, lambda: s3.rfactor(s3.get_loops(s3.get_block("R"))[1], 0), "rfactor",
                 "block R", "also holds blocks ['D']")


def test_decompose_reduction_not_above_a_loop_the_block_repeats_under():
    # R computed at D's loop y, which none of R's iter vars uses: R is recomputed for every y,
    # so its init must run for every y (decomposing at y would sum y + 1 times)
    A = te.placeholder((4, 6), "float32", "A")
    k = te.reduce_axis((0, 6), "k")
    R = te.compute((4,), lambda x: te.sum(A[x, k], axis=k), "R")
    D = te.compute((4, 6), lambda x, y: A[x, y] / R[x], "D")
    sch = Schedule(te.create_prim_func([A, D]))
    x, y = sch.get_loops(sch.get_block("D"))
    sch.compute_at(sch.get_block("R"), y)
    r = sch.get_block("R")
    _, yy, kk = sch.get_loops(r)
    expect_error(sch, lambda: sch.decompose_reduction(r, yy), "decompose_reduction",
                 "block R is computed again in every iteration of loop y")
    sch.decompose_reduction(r, kk)
    a = rand(4, 6)
    d = np.zeros((4, 6), "float32")
    interpret(sch.mod["main"], a, d)
    np.testing.assert_allclose(d, a / a.sum(axis=1, keepdims=True), rtol=1e-5)
