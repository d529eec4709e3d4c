"""Loop primitives: split, fuse, reorder, parallel, vectorize, unroll, bind, annotate,
unannotate, add_unit_loop.

Each scheduled function is checked against the unscheduled one with the interpreter on random
data, its printed text on the key lines, its trace by a JSON round trip, and each illegal request
raises ScheduleError naming the primitive and the loop while leaving the schedule unchanged.
"""
import json
import re

import numpy as np
import pytest

from tilecraft.tensorir import te, var
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.parser import parse
from tilecraft.tensorir.schedule import LoopRV, Schedule, ScheduleError, Trace
from tilecraft.tensorir.schedule._loop_utils import is_quasi_affine
from tilecraft.tensorir.structural import structural_equal

RNG = np.random.default_rng(0)


# -- workloads ------------------------------------------------------------------------------------

def elementwise(m=10, n=12):
    A = te.placeholder((m, n), "float32", "A")
    B = te.compute((m, n), lambda i, j: A[i, j] * 2.0 + 1.0, "B")
    return te.create_prim_func([A, B])


def elementwise_3d(a=3, b=5, c=7):
    A = te.placeholder((a, b, c), "float32", "A")
    B = te.compute((a, b, c), lambda i, j, k: A[i, j, k] - 3.0, "B")
    return te.create_prim_func([A, B])


def matmul(m=13, n=9, k=11):
    A = te.placeholder((m, k), "float32", "A")
    B = te.placeholder((k, n), "float32", "B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), "C")
    return te.create_prim_func([A, B, C])


def two_stage():
    A = te.placeholder((16, 8), "float32", "A")
    B = te.compute((16, 8), lambda i, j: A[i, j] * 2.0, "B")
    C = te.compute((16, 8), lambda i, j: B[i, j] + 1.0, "C")
    return te.create_prim_func([A, C])


def symbolic_1d():
    n = var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * 3.0, "B")
    return te.create_prim_func([A, B])


def symbolic_2d():
    n, m = var("n"), var("m")
    A = te.placeholder((n, m), "float32", "A")
    B = te.compute((n, m), lambda i, j: A[i, j] + 0.5, "B")
    return te.create_prim_func([A, B])


# -- checks ---------------------------------------------------------------------------------------

def assert_same(orig, sch, shapes):
    inputs = [RNG.standard_normal(s).astype("float32") for s in shapes]
    want = [a.copy() for a in inputs]
    got = [a.copy() for a in inputs]
    interpret(orig, *want)
    interpret(sch.func, *got)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def assert_round_trip(sch, orig):
    data = json.loads(json.dumps(sch.trace.to_json()))
    replay = Trace.from_json(data).apply(orig)
    assert structural_equal(replay.func, sch.func), replay.func.script()
    assert replay.trace.to_json() == sch.trace.to_json()


def assert_rejected(sch, call, *patterns):
    """``call()`` raises ScheduleError matching every pattern; the schedule is unchanged."""
    before, n_trace = sch.func, len(sch.trace)
    with pytest.raises(ScheduleError) as info:
        call()
    for p in patterns:
        assert re.search(p, str(info.value)), f"{p!r} not in {str(info.value)!r}"
    assert sch.func is before or structural_equal(sch.func, before)
    assert len(sch.trace) == n_trace
    return info.value


def names(sch, loops):
    return [sch.get(lp).loop_var.name for lp in loops]


# -- split ----------------------------------------------------------------------------------------

def test_split_divisible():
    f = elementwise(16, 12)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    i0, i1 = sch.split(i, [None, 4])
    j0, j1, j2 = sch.split(j, [2, 3, 2])
    assert names(sch, [i0, i1, j0, j1, j2]) == ["i_0", "i_1", "j_0", "j_1", "j_2"]
    text = sch.func.script()
    assert "for i_0, i_1, j_0, j_1, j_2 in T.grid(4, 4, 2, 3, 2):" in text
    assert "vi = T.axis.spatial(16, i_0 * 4 + i_1)" in text
    assert "vj = T.axis.spatial(12, j_0 * 6 + j_1 * 2 + j_2)" in text
    assert "T.where" not in text
    assert_same(f, sch, [(16, 12), (16, 12)])
    assert_round_trip(sch, f)


def test_split_with_tail_gets_a_predicate():
    f = elementwise(10, 7)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    sch.split(i, [None, 4])
    sch.split(j, [None, 2, 3])
    text = sch.func.script()
    assert "for i_0, i_1, j_0, j_1, j_2 in T.grid(3, 4, 2, 2, 3):" in text
    assert "T.where(i_0 * 4 + i_1 < 10 and j_0 * 6 + j_1 * 3 + j_2 < 7)" in text
    assert_same(f, sch, [(10, 7), (10, 7)])
    assert_round_trip(sch, f)


def test_split_symbolic_extent():
    f = symbolic_1d()
    sch = Schedule(f)
    i, = sch.get_loops(sch.get_block("B"))
    i0, i1 = sch.split(i, [None, 8])
    text = sch.func.script()
    assert "for i_0, i_1 in T.grid((n + 7) // 8, 8):" in text
    assert "T.where(i_0 * 8 + i_1 < n)" in text
    for n in (1, 8, 13, 30):
        assert_same(f, sch, [(n,), (n,)])
    assert_round_trip(sch, f)


def test_split_symbolic_inner_none():
    f = symbolic_1d()
    sch = Schedule(f)
    i, = sch.get_loops(sch.get_block("B"))
    sch.split(i, [4, None])
    text = sch.func.script()
    assert "T.grid(4, (n + 3) // 4)" in text
    for n in (3, 9, 17):
        assert_same(f, sch, [(n,), (n,)])


def test_split_sampled_factors_and_replay():
    f = elementwise(16, 24)
    sch = Schedule(f, seed=5)
    i, j = sch.get_loops(sch.get_block("B"))
    factors = sch.sample_perfect_tile(j, n=3, max_innermost_factor=4)
    loops = sch.split(j, factors)
    assert [sch.get(lp).extent.value for lp in loops] == [sch.get(v) for v in factors]
    assert_same(f, sch, [(16, 24), (16, 24)])
    assert_round_trip(sch, f)


def test_split_reduction_loop():
    f = matmul()
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("C"))
    ko, ki = sch.split(k, [None, 4])
    assert "vk = T.axis.reduce(11, k_0 * 4 + k_1)" in sch.func.script()
    assert_same(f, sch, [(13, 11), (11, 9), (13, 9)])


def test_split_preserve_unit_iters_false():
    f = elementwise(16, 12)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    sch.split(i, [None, 1], preserve_unit_iters=False)
    text = sch.func.script()
    assert "vi = T.axis.spatial(16, i_0)" in text
    assert "T.grid(16, 1, 12)" in text
    assert_same(f, sch, [(16, 12), (16, 12)])
    assert_round_trip(sch, f)
    kept = Schedule(f)
    i, _ = kept.get_loops(kept.get_block("B"))
    kept.split(i, [None, 1])
    assert "vi = T.axis.spatial(16, i_0 + i_1)" in kept.func.script()


def test_split_loop_with_nonzero_min():
    f = parse('''
@T.prim_func
def main(A: T.Buffer((12,), "float32"), B: T.Buffer((12,), "float32")):
    with T.block("root"):
        for i in range(2, 12):
            with T.block("B"):
                vi = T.axis.spatial(12, i)
                T.reads(A[vi])
                T.writes(B[vi])
                B[vi] = A[vi] * 2.0
''')
    sch = Schedule(f)
    i, = sch.get_loops(sch.get_block("B"))
    sch.split(i, [None, 4])
    text = sch.func.script()
    assert "vi = T.axis.spatial(12, i_0 * 4 + i_1 + 2)" in text
    assert "T.where(i_0 * 4 + i_1 < 10)" in text
    a = RNG.standard_normal(12).astype("float32")
    want, got = np.full(12, 7.0, "float32"), np.full(12, 7.0, "float32")
    interpret(f, a, want)
    interpret(sch.func, a, got)
    np.testing.assert_array_equal(got, want)
    assert (got[:2] == 7.0).all()


def test_split_keeps_other_loops_and_blocks():
    f = two_stage()
    sch = Schedule(f)
    c = sch.get_block("C")
    i, j = sch.get_loops(c)
    sch.split(j, [2, 4])
    assert sch.get(i).loop_var.name == "i"  # the kept loop's RV is still valid
    assert [sch.get(lp).loop_var.name for lp in sch.get_loops(sch.get_block("B"))] == ["i", "j"]
    assert_same(f, sch, [(16, 8), (16, 8)])


def test_split_twice_with_tails_and_fuse_back():
    f = elementwise(10, 3)
    sch = Schedule(f)
    i, _ = sch.get_loops(sch.get_block("B"))
    i0, i1 = sch.split(i, [None, 4])
    a, b = sch.split(i0, [None, 2])
    sch.fuse(b, i1)
    text = sch.func.script()
    assert "vi = T.axis.spatial(10, i_0_0 * 8 + i_0_1_i_1_fused)" in text
    assert "T.where(i_0_0 * 8 + i_0_1_i_1_fused < 10" in text  # substituted and simplified
    assert_same(f, sch, [(10, 3), (10, 3)])
    assert_round_trip(sch, f)


NESTED = '''
@T.prim_func
def main(A: T.Buffer((4, 10), "float32"), B: T.Buffer((4, 10), "float32")):
    with T.block("root"):
        for i in range(4):
            with T.block("outer"):
                vi = T.axis.spatial(4, i)
                T.reads(A[vi, 0:10])
                T.writes(B[vi, 0:10])
                for j in range(10):
                    with T.block("inner"):
                        vj = T.axis.spatial(10, j)
                        T.reads(A[vi, vj])
                        T.writes(B[vi, vj])
                        B[vi, vj] = A[vi, vj] * 3.0
'''


def test_split_in_nested_block_scope():
    g = parse(NESTED)
    sch = Schedule(g)
    i, = sch.get_loops(sch.get_block("outer"))
    j, = sch.get_loops(sch.get_block("inner"))
    j0, j1 = sch.split(j, [None, 3])
    sch.vectorize(j1)
    sch.parallel(i)
    sch.split(i, [None, 3])  # the outer block gets the predicate, the inner one its own
    text = sch.func.script()
    assert "T.where(i_0 * 3 + i_1 < 4)" in text and "T.where(j_0 * 3 + j_1 < 10)" in text
    assert_same(g, sch, [(4, 10), (4, 10)])
    assert_round_trip(sch, g)


def test_split_with_statements_outside_blocks_uses_an_if():
    g = parse('''
@T.prim_func
def main(A: T.Buffer((10,), "float32"), B: T.Buffer((10,), "float32"),
         C: T.Buffer((10,), "float32")):
    with T.block("root"):
        for i in range(10):
            B[i] = A[i] * 2.0
            with T.block("C"):
                vi = T.axis.spatial(10, i)
                T.reads(A[vi])
                T.writes(C[vi])
                C[vi] = A[vi] + 1.0
''')
    sch = Schedule(g)
    i, = sch.get_loops(sch.get_block("C"))
    sch.split(i, [None, 4])
    text = sch.func.script()
    assert "if i_0 * 4 + i_1 < 10:" in text and "T.where" not in text
    assert_same(g, sch, [(10,), (10,), (10,)])


def test_split_errors():
    f = elementwise(10, 12)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    assert_rejected(sch, lambda: sch.split(i, [3, 4]), r"^split:", r"loop i\b",
                    "factors .* whose product is wrong")
    assert_rejected(sch, lambda: sch.split(i, [None, None]), r"^split:", r"loop i\b",
                    "at most one factor may be None")
    assert_rejected(sch, lambda: sch.split(j, [0, None]), r"^split:", r"loop j\b", "positive")
    assert_rejected(sch, lambda: sch.split(j, [None, -2]), r"^split:", r"loop j\b", "positive")
    assert_rejected(sch, lambda: sch.split(j, [2.5, None]), r"^split:", r"loop j\b")
    assert_rejected(sch, lambda: sch.split(j, []), r"^split:", r"loop j\b")
    g = symbolic_1d()
    sch2 = Schedule(g)
    k, = sch2.get_loops(sch2.get_block("B"))
    assert_rejected(sch2, lambda: sch2.split(k, [4, 8]), r"^split:", r"loop i\b",
                    "product is wrong", "None")


def test_stale_and_foreign_loop_rvs():
    f = elementwise(16, 12)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    sch.split(i, [4, 4])
    assert_rejected(sch, lambda: sch.split(i, [2, 8]), r"^split:", r"loop i\b",
                    "no longer exists")
    assert_rejected(sch, lambda: sch.vectorize(i), r"^vectorize:", r"loop i\b", "no longer exists")
    assert_rejected(sch, lambda: sch.fuse(i, j), r"^fuse:", r"loop i\b", "no longer exists")
    other = Schedule(f)
    assert_rejected(other, lambda: other.split(j, [None, 4]), r"^split:", "does not belong")
    assert_rejected(other, lambda: other.parallel(LoopRV("l42")), r"^parallel:", "does not belong")


# -- fuse -----------------------------------------------------------------------------------------

def test_fuse_two_loops():
    f = elementwise(10, 12)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    fused = sch.fuse(i, j)
    assert sch.get(fused).loop_var.name == "i_j_fused"
    text = sch.func.script()
    assert "for i_j_fused in range(120):" in text
    assert "vi = T.axis.spatial(10, i_j_fused // 12)" in text
    assert "vj = T.axis.spatial(12, i_j_fused % 12)" in text
    assert_same(f, sch, [(10, 12), (10, 12)])
    assert_round_trip(sch, f)


def test_fuse_three_loops_then_split_with_tail():
    f = elementwise_3d(3, 5, 7)
    sch = Schedule(f)
    fused = sch.fuse(*sch.get_loops(sch.get_block("B")))
    text = sch.func.script()
    assert "for i_j_k_fused in range(105):" in text
    assert "vi = T.axis.spatial(3, i_j_k_fused // 35)" in text
    assert "vj = T.axis.spatial(5, i_j_k_fused // 7 % 5)" in text
    assert "vk = T.axis.spatial(7, i_j_k_fused % 7)" in text
    assert_same(f, sch, [(3, 5, 7), (3, 5, 7)])
    sch.split(fused, [None, 16])
    assert "T.where(i_j_k_fused_0 * 16 + i_j_k_fused_1 < 105)" in sch.func.script()
    assert_same(f, sch, [(3, 5, 7), (3, 5, 7)])
    assert_round_trip(sch, f)


def test_fuse_symbolic():
    f = symbolic_2d()
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    fused = sch.fuse(i, j)
    text = sch.func.script()
    assert "for i_j_fused in range(n * m):" in text
    assert "vi = T.axis.spatial(n, i_j_fused // m)" in text
    assert "vj = T.axis.spatial(m, i_j_fused % m)" in text
    sch.split(fused, [None, 4])
    for shape in ((3, 5), (4, 4), (1, 7)):
        assert_same(f, sch, [shape, shape])
    assert_round_trip(sch, f)


def test_fuse_split_loops_back_and_list_form():
    f = elementwise(16, 12)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    i0, i1 = sch.split(i, [4, 4])
    fused = sch.fuse([i0, i1])  # a list works too
    assert "vi = T.axis.spatial(16, i_0_i_1_fused)" in sch.func.script()
    assert_same(f, sch, [(16, 12), (16, 12)])
    assert_round_trip(sch, f)


def test_fuse_spatial_loops_of_reduction():
    f = matmul()
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.fuse(i, j)
    assert_same(f, sch, [(13, 11), (11, 9), (13, 9)])


def test_fuse_preserve_unit_iters_false():
    f = elementwise_3d(1, 6, 4)
    sch = Schedule(f)
    sch.fuse(*sch.get_loops(sch.get_block("B")), preserve_unit_iters=False)
    text = sch.func.script()
    assert "for i_j_k_fused in range(24):" in text
    assert "vi = T.axis.spatial(1, 0)" in text
    assert_same(f, sch, [(1, 6, 4), (1, 6, 4)])
    assert_round_trip(sch, f)


def test_fuse_errors():
    f = elementwise_3d()
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("B"))
    assert_rejected(sch, lambda: sch.fuse(i, k), r"^fuse:", "fusing non-adjacent loops i and k")
    assert_rejected(sch, lambda: sch.fuse(j, i), r"^fuse:", "fusing non-adjacent loops j and i")
    assert_rejected(sch, lambda: sch.fuse(i, i), r"^fuse:", r"loop i\b", "more than once")
    sch.parallel(i)
    assert_rejected(sch, lambda: sch.fuse(i, j), r"^fuse:", r"loop i\b", "parallel",
                    "only serial loops")
    sch.annotate(k, "pragma_auto_unroll_max_step", 4)
    assert_rejected(sch, lambda: sch.fuse(j, k), r"^fuse:", r"loop k\b", "annotat")
    g = two_stage()
    s2 = Schedule(g)
    bi, _ = s2.get_loops(s2.get_block("B"))
    ci, _ = s2.get_loops(s2.get_block("C"))
    assert_rejected(s2, lambda: s2.fuse(bi, ci), r"^fuse:", "non-adjacent")


# -- reorder --------------------------------------------------------------------------------------

def test_reorder_reduce_loop_outermost():
    f = matmul()
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.reorder(k, i)
    assert names(sch, sch.get_loops(sch.get_block("C"))) == ["k", "j", "i"]
    assert "for k, j, i in T.grid(11, 9, 13):" in sch.func.script()
    assert names(sch, [i, j, k]) == ["i", "j", "k"]  # the LoopRVs stay valid
    assert_same(f, sch, [(13, 11), (11, 9), (13, 9)])
    assert_round_trip(sch, f)


def test_reorder_tiled_matmul_keeps_unnamed_positions():
    f = matmul(16, 12, 8)
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("C"))
    i0, i1 = sch.split(i, [None, 4])
    j0, j1 = sch.split(j, [None, 4])
    k0, k1 = sch.split(k, [None, 2])
    sch.reorder(i0, j0, k0, i1, j1, k1)
    assert names(sch, sch.get_loops(sch.get_block("C"))) == \
        ["i_0", "j_0", "k_0", "i_1", "j_1", "k_1"]
    assert_same(f, sch, [(16, 8), (8, 12), (16, 12)])
    # only two named: the others stay where they are
    sch.reorder(k1, j0)
    assert names(sch, sch.get_loops(sch.get_block("C"))) == \
        ["i_0", "k_1", "k_0", "i_1", "j_1", "j_0"]
    assert_same(f, sch, [(16, 8), (8, 12), (16, 12)])
    assert_round_trip(sch, f)


def test_reorder_keeps_kinds_and_annotations():
    f = elementwise(8, 6)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    sch.vectorize(j)
    sch.annotate(i, "pragma_auto_unroll_max_step", 16)
    sch.reorder(j, i)
    outer, inner = (sch.get(lp) for lp in sch.get_loops(sch.get_block("B")))
    assert (outer.loop_var.name, outer.kind) == ("j", "vectorized")
    assert inner.loop_var.name == "i"
    assert inner.annotation_dict == {"pragma_auto_unroll_max_step": 16}
    assert_same(f, sch, [(8, 6), (8, 6)])
    assert_round_trip(sch, f)


def test_reorder_errors():
    f = two_stage()
    sch = Schedule(f)
    bi, bj = sch.get_loops(sch.get_block("B"))
    ci, cj = sch.get_loops(sch.get_block("C"))
    assert_rejected(sch, lambda: sch.reorder(cj, bi), r"^reorder:", r"\bj\b", r"\bi\b",
                    "not in the same loop nest")
    assert_rejected(sch, lambda: sch.reorder(bj, bj), r"^reorder:", r"loop j\b", "more than once")
    # a block between the loops (a nested block in the inner loop's scope)
    g = parse('''
@T.prim_func
def main(A: T.Buffer((4, 4), "float32"), B: T.Buffer((4, 4), "float32")):
    with T.block("root"):
        for i in range(4):
            with T.block("outer"):
                vi = T.axis.spatial(4, i)
                T.reads(A[vi, 0:4])
                T.writes(B[vi, 0:4])
                for j in range(4):
                    with T.block("inner"):
                        vj = T.axis.spatial(4, j)
                        T.reads(A[vi, vj])
                        T.writes(B[vi, vj])
                        B[vi, vj] = A[vi, vj]
''')
    s2 = Schedule(g)
    i, = s2.get_loops(s2.get_block("outer"))
    j, = s2.get_loops(s2.get_block("inner"))
    assert_rejected(s2, lambda: s2.reorder(j, i), r"^reorder:", r"\bi\b", r"\bj\b",
                    "block outer lies between them")
    # two nests under one loop: not perfectly nested
    h = parse('''
@T.prim_func
def main(A: T.Buffer((4, 4), "float32"), B: T.Buffer((4, 4), "float32"),
         C: T.Buffer((4, 4), "float32")):
    with T.block("root"):
        for i in range(4):
            for j in range(4):
                with T.block("B"):
                    vi = T.axis.spatial(4, i)
                    vj = T.axis.spatial(4, j)
                    T.reads(A[vi, vj])
                    T.writes(B[vi, vj])
                    B[vi, vj] = A[vi, vj]
            for j2 in range(4):
                with T.block("C"):
                    vi = T.axis.spatial(4, i)
                    vj = T.axis.spatial(4, j2)
                    T.reads(A[vi, vj])
                    T.writes(C[vi, vj])
                    C[vi, vj] = A[vi, vj]
''')
    s3 = Schedule(h)
    i, j = s3.get_loops(s3.get_block("B"))
    assert_rejected(s3, lambda: s3.reorder(j, i), r"^reorder:", "not in one chain",
                    "sequence of statements")


def test_reorder_non_affine_binding_rejected():
    g = parse('''
@T.prim_func
def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    with T.block("root"):
        for i, j in T.grid(4, 4):
            with T.block("B"):
                vi = T.axis.spatial(16, i * j)
                T.reads(A[vi])
                T.writes(B[vi])
                B[vi] = A[vi]
''')
    sch = Schedule(g)
    i, j = sch.get_loops(sch.get_block("B"))
    assert_rejected(sch, lambda: sch.reorder(j, i), r"^reorder:", "block B", "not affine")
    assert_rejected(sch, lambda: sch.parallel(i), r"^parallel:", r"loop i\b", "not affine")


# -- parallel / vectorize / unroll / bind ---------------------------------------------------------

def test_parallel_vectorize_unroll():
    f = elementwise(10, 12)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    j0, j1 = sch.split(j, [None, 4])
    sch.parallel(i)
    sch.vectorize(j1)
    sch.unroll(j0)
    text = sch.func.script()
    assert "for i in T.parallel(10):" in text
    assert "for j_0 in T.unroll(3):" in text
    assert "for j_1 in T.vectorized(4):" in text
    assert_same(f, sch, [(10, 12), (10, 12)])
    assert_round_trip(sch, f)


def test_unroll_reduction_loop_and_vectorize_symbolic():
    f = matmul()
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.unroll(k)
    sch.vectorize(j)
    sch.parallel(i)
    assert "for k in T.unroll(11):" in sch.func.script()
    assert_same(f, sch, [(13, 11), (11, 9), (13, 9)])
    g = symbolic_1d()
    s2 = Schedule(g)
    i, = s2.get_loops(s2.get_block("B"))
    s2.vectorize(i)  # allowed, as in TVM: codegen falls back for an unknown lane count
    assert "for i in T.vectorized(n):" in s2.func.script()
    assert_same(g, s2, [(5,), (5,)])


def test_bind():
    f = elementwise(16, 12)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    j0, j1 = sch.split(j, [None, 4])
    sch.bind(i, "blockIdx.x")
    sch.bind(j0, "vthread.x")
    sch.bind(j1, "threadIdx.x")
    text = sch.func.script()
    assert 'for i in T.thread_binding(16, thread="blockIdx.x"):' in text
    assert 'for j_0 in T.thread_binding(3, thread="vthread.x"):' in text
    assert 'for j_1 in T.thread_binding(4, thread="threadIdx.x"):' in text
    assert_same(f, sch, [(16, 12), (16, 12)])
    assert_round_trip(sch, f)
    # the same tag in separate nests is fine
    g = two_stage()
    s2 = Schedule(g)
    for name in ("B", "C"):
        bi, bj = s2.get_loops(s2.get_block(name))
        s2.bind(bi, "blockIdx.x")
        s2.bind(bj, "threadIdx.x")
    assert_same(g, s2, [(16, 8), (16, 8)])


def test_reduce_loop_cannot_be_parallel_vectorized_or_bound():
    f = matmul()
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("C"))
    assert_rejected(sch, lambda: sch.vectorize(k), r"^vectorize:",
                    "cannot vectorize loop k: it is bound to the reduction iter var vk of block C")
    assert_rejected(sch, lambda: sch.parallel(k), r"^parallel:", "cannot parallelize loop k: it "
                    "is bound to the reduction iter var vk of block C")
    assert_rejected(sch, lambda: sch.bind(k, "blockIdx.x"), r"^bind:", r"loop k\b",
                    "reduction iter var vk of block C", "cross-thread reduction")
    # threadIdx may take a reduction loop: a cross-thread reduction
    # (tests/tensorir/test_device_lowering.py lowers one)
    sch2 = Schedule(f)
    k2 = sch2.get_loops(sch2.get_block("C"))[2]
    sch2.bind(k2, "threadIdx.x")
    assert sch2.get(k2).thread_tag == "threadIdx.x"
    # a fused spatial+reduce loop is bound to a reduce iter var too
    fused = sch.fuse(j, k)
    assert_rejected(sch, lambda: sch.parallel(fused), r"^parallel:", "j_k_fused", "vk")


def test_kind_conflicts():
    f = elementwise_3d(4, 4, 4)
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("B"))
    sch.bind(i, "threadIdx.x")
    assert_rejected(sch, lambda: sch.bind(i, "threadIdx.y"), r"^bind:", r"loop i\b",
                    "already bound to threadIdx.x")
    assert_rejected(sch, lambda: sch.vectorize(i), r"^vectorize:", r"loop i\b",
                    "already bound to threadIdx.x")
    assert_rejected(sch, lambda: sch.parallel(i), r"^parallel:", r"loop i\b", "already")
    assert_rejected(sch, lambda: sch.unroll(i), r"^unroll:", r"loop i\b", "thread binding")
    sch.bind(j, "blockIdx.x")
    # nested threadIdx loops of one axis are the same threads (cooperative fetch); blockIdx
    # axes cannot repeat
    assert_rejected(sch, lambda: sch.bind(k, "blockIdx.x"), r"^bind:", r"loop k\b",
                    r"loop j of the same nest is already bound to it")
    assert_rejected(sch, lambda: sch.bind(j, "warp.x"), r"^bind:", r"loop j\b",
                    "unknown thread axis")
    sch.vectorize(k)
    assert_rejected(sch, lambda: sch.parallel(k), r"^parallel:", r"loop k\b", "already vectorized")
    sch.unroll(k)  # unroll accepts a vectorized loop
    assert sch.get(k).kind == "unrolled"


# -- annotate / unannotate / add_unit_loop --------------------------------------------------------

def test_annotate_and_unannotate():
    f = matmul()
    sch = Schedule(f, seed=1)
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    unroll = sch.sample_categorical([0, 16, 64], [0.2, 0.5, 0.3])
    sch.annotate(c, "meta_schedule.unroll_explicit", unroll)
    sch.annotate(c, "meta_schedule.parallel", 64)
    sch.annotate(i, "pragma_auto_unroll_max_step", 512)
    sch.annotate(j, "tiles", [4, 2.5, "x", [1, 2]])
    block = sch.get(c)
    assert dict(block.annotations) == {"meta_schedule.unroll_explicit": sch.get(unroll),
                                       "meta_schedule.parallel": 64}
    assert sch.get(j).annotation_dict == {"tiles": [4, 2.5, "x", [1, 2]]}
    text = sch.func.script()
    assert '"meta_schedule.parallel": 64' in text
    assert 'annotations={"pragma_auto_unroll_max_step": 512}' in text
    assert_round_trip(sch, f)
    sch.unannotate(c, "meta_schedule.parallel")
    sch.unannotate(i, "pragma_auto_unroll_max_step")
    assert "meta_schedule.parallel" not in dict(sch.get(c).annotations)
    assert sch.get(i).annotations == ()
    assert_same(f, sch, [(13, 11), (11, 9), (13, 9)])
    assert_round_trip(sch, f)
    assert_rejected(sch, lambda: sch.unannotate(i, "nope"), r"^unannotate:", r"loop i\b",
                    "no annotation 'nope'")
    assert_rejected(sch, lambda: sch.annotate(c, "x", {"a": 1}), r"^annotate:", "block C")
    assert_rejected(sch, lambda: sch.annotate(c, "", 1), r"^annotate:", "key")


def test_add_unit_loop():
    f = matmul()
    sch = Schedule(f)
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    u = sch.add_unit_loop(c)
    assert names(sch, sch.get_loops(c)) == ["i", "j", "k", "u"]
    u2 = sch.add_unit_loop(i)
    assert names(sch, sch.get_loops(c)) == ["u", "i", "j", "k", "u"]
    assert sch.get(u2).extent.value == 1
    assert_same(f, sch, [(13, 11), (11, 9), (13, 9)])
    assert_round_trip(sch, f)
    root = sch.get_block("root")
    assert_rejected(sch, lambda: sch.add_unit_loop(root), r"^add_unit_loop:", "block root",
                    "root block")


def test_quasi_affine():
    i, j, n = var("i"), var("j"), var("n")
    assert is_quasi_affine(i * 4 + j // 3 % 2 + n, {i, j})
    assert is_quasi_affine((i * n + j) // n, {i, j})
    assert not is_quasi_affine(i * j, {i, j})
    assert not is_quasi_affine(n // (i + 1), {i, j})


# -- compiled ------------------------------------------------------------------------------------

def _build(mod):
    from tilecraft import targets
    return targets.build(mod, "llvm")


def test_compiled_split_vectorize_parallel_elementwise():
    f = symbolic_2d()
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("B"))
    j0, j1 = sch.split(j, [None, 8])
    sch.vectorize(j1)
    sch.parallel(sch.fuse(i, j0))
    lib = _build(sch.mod)
    for shape in ((5, 19), (3, 16), (1, 3)):
        a = RNG.standard_normal(shape).astype("float32")
        b = np.full(shape, np.nan, "float32")
        lib["main"](a, b)
        np.testing.assert_allclose(b, a + 0.5, rtol=1e-6)


def test_compiled_reordered_matmul():
    f = matmul(19, 10, 13)
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("C"))
    i0, i1 = sch.split(i, [None, 4])
    j0, j1 = sch.split(j, [None, 4])
    sch.reorder(i0, j0, k, i1, j1)
    sch.vectorize(j1)
    sch.parallel(i0)
    lib = _build(sch.mod)
    a = RNG.standard_normal((19, 13)).astype("float32")
    b = RNG.standard_normal((13, 10)).astype("float32")
    c = np.full((19, 10), np.nan, "float32")
    lib["main"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
