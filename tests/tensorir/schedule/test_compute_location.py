"""Compute-location primitives: compute_inline, reverse_compute_inline, compute_at,
reverse_compute_at, sample_compute_location.

Every scheduled function is run with the interpreter on random data against the unscheduled one
(or numpy), its printed text is checked on the key lines, its trace by a JSON round trip, and
each illegal request raises ScheduleError naming the primitive and the block or loop while
leaving the schedule unchanged.
"""
import json

import numpy as np
import pytest

from tilecraft.tensorir import te, var
from tilecraft.tensorir.expr import FloatImm
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.schedule import LoopRV, Schedule, ScheduleError, Trace
from tilecraft.tensorir.schedule import tree
from tilecraft.tensorir.structural import structural_equal
from tilecraft.tensorir.schedule.regions import with_regions
from tilecraft.tensorir.stmt import BufferStore

RNG = np.random.default_rng(7)


# -- workloads ------------------------------------------------------------------------------------

def chain(m=10, n=12):
    """A -> B = exp(A) -> C = B * 2 -> D = C + 1."""
    A = te.placeholder((m, n), "float32", "A")
    B = te.compute((m, n), lambda i, j: te.exp(A[i, j]), "B")
    C = te.compute((m, n), lambda i, j: B[i, j] * 2.0, "C")
    D = te.compute((m, n), lambda i, j: C[i, j] + 1.0, "D")
    return te.create_prim_func([A, D])


def exp_then_add(n=32, m=12):
    A = te.placeholder((n, m), "float32", "A")
    B = te.compute((n, m), lambda i, j: te.exp(A[i, j]), "B")
    C = te.compute((n, m), lambda i, j: B[i, j] + 1.0, "C")
    return te.create_prim_func([A, C])


def symbolic_exp():
    n = var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: te.exp(A[i]), "B")
    C = te.compute((n,), lambda i: B[i] * 3.0 + 1.0, "C")
    return te.create_prim_func([A, C])


def gemm_bias_relu(m=30, n=24, k=16):
    A = te.placeholder((m, k), "float32", "A")
    B = te.placeholder((k, n), "float32", "B")
    bias = te.placeholder((n,), "float32", "bias")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), "C")
    D = te.compute((m, n), lambda i, j: C[i, j] + bias[j], "D")
    E = te.compute((m, n), lambda i, j: te.max(D[i, j], 0.0), "E")
    return te.create_prim_func([A, B, bias, E])


def matmul_relu(m=16, n=12, k=8):
    A = te.placeholder((m, k), "float32", "A")
    B = te.placeholder((k, n), "float32", "B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), "C")
    D = te.compute((m, n), lambda i, j: te.max(C[i, j], 0.0), "D")
    return te.create_prim_func([A, B, D])


def conv1d_pad(n=14, w=3):
    """A_pad = zero-padded A (1 on each side); C[i] = sum_r A_pad[i + r] * W[r]."""
    A = te.placeholder((n,), "float32", "A")
    W = te.placeholder((w,), "float32", "W")
    P = te.compute((n + w - 1,), lambda i: te.if_then_else(te.all(i >= 1, i < n + 1),
                                                           A[i - 1], 0.0), "A_pad")
    r = te.reduce_axis((0, w), "r")
    C = te.compute((n,), lambda i: te.sum(P[i + r.var] * W[r], axis=r), "C")
    return te.create_prim_func([A, W, C])


def conv1d_ref(a, w):
    ap = np.pad(a, (w.size - 1) // 2)
    return np.array([ap[i:i + w.size] @ w for i in range(a.size)], dtype="float32")


# -- checks ---------------------------------------------------------------------------------------

def random_args(func, **dims):
    """Random float32 arrays for each buffer parameter (symbolic dims from ``dims``)."""
    out = []
    for buf in func.buffers:
        shape = []
        for s in buf.shape:
            shape.append(int(s.value) if hasattr(s, "value") else dims[s.name])
        out.append(RNG.standard_normal(shape).astype("float32"))
    return out


def assert_same(orig, new, atol=1e-5, **dims):
    """``new`` computes what ``orig`` computes (every parameter buffer compared)."""
    args = random_args(orig, **dims)
    want = [a.copy() for a in args]
    got = [a.copy() for a in args]
    interpret(orig, *want)
    interpret(new, *got)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=atol)


def assert_round_trip(orig, sch):
    data = json.loads(json.dumps(sch.trace.to_json()))
    replay = Trace.from_json(data).apply(orig)
    assert structural_equal(replay.func, sch.func)


def loops_of(sch, block_name):
    return [sch.get(l) for l in sch.get_loops(sch.get_block(block_name))]


def block_names(func):
    return [br.block.name for br in tree.all_blocks(func)]


def assert_rejected(sch, action, *words):
    """``action(sch)`` raises a ScheduleError whose message holds ``words``; ``sch`` unchanged."""
    before = sch.func
    n = len(sch.trace)
    with pytest.raises(ScheduleError) as err:
        action(sch)
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    assert sch.func is before and structural_equal(sch.func, before)
    # nothing but the lookups the action made was recorded
    assert all(i.kind in ("get_block", "get_loops") for i in sch.trace.instructions[n:])


def rewrite_store(func, block_name, fn):
    """``func`` with block ``block_name``'s BufferStore replaced by ``fn(store, block)``."""
    br, _ = tree.find_block(func, block_name)
    block = br.block
    new_block = with_regions(block.replace(body=fn(block.body, block),
                                           annotations=dict(block.annotations)))
    return tree.replace(func, block, new_block)


# -- compute_inline -------------------------------------------------------------------------------

def test_compute_inline_one_stage():
    f = chain()
    sch = Schedule(f)
    sch.compute_inline(sch.get_block("B"))
    assert block_names(sch.func) == ["root", "C", "D"]
    text = sch.func.script()
    assert "C[vi, vj] = T.exp(A[vi, vj]) * 2.0" in text
    assert "T.reads(A[vi, vj])" in text
    assert "B = T.alloc_buffer" not in text and "C = T.alloc_buffer" in text
    assert_same(f, sch.func)
    assert_round_trip(f, sch)


def test_compute_inline_two_stages_numpy():
    f = chain(7, 5)
    sch = Schedule(f)
    sch.compute_inline(sch.get_block("B"))
    sch.compute_inline(sch.get_block("C"))
    assert block_names(sch.func) == ["root", "D"]
    assert "alloc_buffer" not in sch.func.script()
    a = RNG.standard_normal((7, 5)).astype("float32")
    d = np.zeros_like(a)
    interpret(sch.func, a, d)
    np.testing.assert_allclose(d, np.exp(a) * 2 + 1, rtol=1e-5)
    assert_round_trip(f, sch)


def test_compute_inline_into_split_symbolic_consumer():
    f = symbolic_exp()
    sch = Schedule(f)
    io, ii = sch.split(sch.get_loops(sch.get_block("C"))[0], [None, 4])
    sch.compute_inline(sch.get_block("B"))
    assert "C[vi] = T.exp(A[vi]) * 3.0 + 1.0" in sch.func.script()
    for n in (1, 6, 8, 13):
        assert_same(f, sch.func, n=n)
    assert_round_trip(f, sch)


def test_compute_inline_transposed_and_shifted_reads():
    A = te.placeholder((6, 9), "float32", "A")
    B = te.compute((9, 6), lambda i, j: A[j, i] + 1.0, "B")
    C = te.compute((8, 6), lambda i, j: B[i + 1, j] * B[i, 5 - j], "C")
    f = te.create_prim_func([A, C])
    sch = Schedule(f)
    sch.compute_inline(sch.get_block("B"))
    text = sch.func.script()
    assert "A[vj, vi + 1]" in text and "A[5 - vj, vi]" in text
    assert_same(f, sch.func)


# -- reverse_compute_inline -----------------------------------------------------------------------

def test_reverse_compute_inline_bias_relu():
    f = gemm_bias_relu()
    sch = Schedule(f)
    sch.reverse_compute_inline(sch.get_block("E"))
    assert block_names(sch.func) == ["root", "C", "D"]
    text = sch.func.script()
    assert "E[vi, vj] = T.max(C[vi, vj] + bias[vj], 0.0)" in text
    assert "T.writes(E[vi, vj])" in text and "T.reads(C[vi, vj], bias[vj])" in text
    assert "D = T.alloc_buffer" not in text
    a, b, bias, e = random_args(f)
    interpret(sch.func, a, b, bias, e)
    np.testing.assert_allclose(e, np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-4)
    assert_round_trip(f, sch)
    # the matmul producer is a reduction (it has an init): TVM refuses it, so do we
    assert_rejected(sch, lambda s: s.reverse_compute_inline(s.get_block("D")),
                    "reverse_compute_inline", "'D'", "'C'", "reduction")


def test_reverse_compute_inline_reads_the_same_point_twice():
    """A GELU-style epilogue reads the producer twice at one point (``x * erf(x)``): both reads
    become the producer's value (a matmul's register write-back on the GPU)."""
    A = te.placeholder((6, 8), "float32", "A")
    B = te.compute((6, 8), lambda i, j: A[i, j] + 1.0, "B")
    C = te.compute((6, 8), lambda i, j: B[i, j] * te.erf(B[i, j] * 0.7), "C")
    f = te.create_prim_func([A, C])
    sch = Schedule(f)
    sch.reverse_compute_inline(sch.get_block("C"))
    assert block_names(sch.func) == ["root", "B"]
    assert_same(f, sch.func)
    assert_round_trip(f, sch)


def test_reverse_compute_inline_with_index_change_and_split_tail():
    n = var("n")
    A = te.placeholder((n, 4), "float32", "A")
    B = te.compute((n, 4), lambda i, j: A[i, j] * 2.0, "B")
    C = te.compute((4, n), lambda j, i: B[i, j] - 1.0, "C")
    f = te.create_prim_func([A, C])
    sch = Schedule(f)
    sch.split(sch.get_loops(sch.get_block("B"))[0], [None, 3])
    sch.reverse_compute_inline(sch.get_block("C"))
    assert "C[vj, vi] = A[vi, vj] * 2.0 - 1.0" in sch.func.script()
    for nv in (1, 5, 9):
        assert_same(f, sch.func, n=nv)
    assert_round_trip(f, sch)


def test_reverse_compute_inline_reshape_read():
    """A consumer reading its producer's flat result reshaped (``B[c, y * 4 + x]``, the flat
    convolution's output read as NCHW) inlines: the producer's point ``p`` is ``(p // 4,
    p % 4)`` of the consumer."""
    A = te.placeholder((3, 12), "float32", "A")
    bias = te.placeholder((3,), "float32", "bias")
    B = te.compute((3, 12), lambda c, p: A[c, p] * 2.0, "B")
    C = te.compute((3, 3, 4), lambda c, y, x: te.max(B[c, y * 4 + x] + bias[c], 0.0), "C")
    f = te.create_prim_func([A, bias, C])
    sch = Schedule(f)
    sch.split(sch.get_loops(sch.get_block("B"))[1], [None, 8])  # a tile straddling rows
    sch.reverse_compute_inline(sch.get_block("C"))
    assert block_names(sch.func) == ["root", "B"]
    assert "C[vc, vp // 4, vp % 4] = T.max(A[vc, vp] * 2.0 + bias[vc], 0.0)" in sch.func.script()
    assert_same(f, sch.func)
    assert_round_trip(f, sch)


def test_reverse_compute_inline_unit_index_folded():
    """An index folded to the value of a unit iter var (``B[0, j]`` with ``i`` in ``[0, 1)``, a
    batch of one) still reads each point once."""
    A = te.placeholder((1, 8), "float32", "A")
    B = te.compute((1, 8), lambda i, j: A[i, j] + 1.0, "B")
    C = te.compute((1, 8), lambda i, j: B[0, j] * 3.0, "C")
    f = te.create_prim_func([A, C])
    sch = Schedule(f)
    sch.reverse_compute_inline(sch.get_block("C"))
    assert block_names(sch.func) == ["root", "B"]
    assert_same(f, sch.func)
    assert_round_trip(f, sch)


def test_reverse_compute_inline_reshape_with_junk_columns_rejected():
    """A flat result with junk columns (rows of 4, the consumer reads 3 of each) is not a
    reshape: inlining would store the junk over the next row."""
    A = te.placeholder((3, 12), "float32", "A")
    B = te.compute((3, 12), lambda c, p: A[c, p] * 2.0, "B")
    C = te.compute((3, 3, 3), lambda c, y, x: B[c, y * 4 + x] + 1.0, "C")
    sch = Schedule(te.create_prim_func([A, C]))
    assert_rejected(sch, lambda s: s.reverse_compute_inline(s.get_block("C")),
                    "reverse_compute_inline", "'C'", "iter vars")
    # rows of 4 but only 2 of the 3 rows read: the producer writes points nobody reads
    C2 = te.compute((3, 2, 4), lambda c, y, x: B[c, y * 4 + x] + 1.0, "C2")
    sch = Schedule(te.create_prim_func([A, C2]))
    assert_rejected(sch, lambda s: s.reverse_compute_inline(s.get_block("C2")),
                    "reverse_compute_inline", "'C2'", "outside")


# -- compute_at -----------------------------------------------------------------------------------

def test_compute_at_exp_under_tile_loop():
    f = exp_then_add(32, 12)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("C"))
    io, ii = sch.split(i, [None, 4])
    sch.compute_at(sch.get_block("B"), io)
    # only the tile the consumer reads: 4 rows x 12 columns per iteration of i_0
    b_loops = loops_of(sch, "B")
    assert b_loops[0] is sch.get(io)
    assert [l.extent.value for l in b_loops] == [8, 4, 12]
    text = sch.func.script()
    assert "vi = T.axis.spatial(32, i_0 * 4 + ax0)" in text
    assert "T.where" not in text
    # the producer nest comes first inside i_0, then the consumer's remaining loops
    body = sch.get(io).body
    assert [type(s).__name__ for s in body.seq] == ["For", "For"]
    assert_same(f, sch.func)
    assert_round_trip(f, sch)


def test_compute_at_inner_loop_and_preserve_unit_loops():
    f = exp_then_add(8, 6)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("C"))
    sch.compute_at(sch.get_block("B"), j)
    assert [l.extent.value for l in loops_of(sch, "B")] == [8, 6]  # no unit loops
    assert "vi = T.axis.spatial(8, i)" in sch.func.script()
    assert_same(f, sch.func)
    assert_round_trip(f, sch)

    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("C"))
    sch.compute_at(sch.get_block("B"), j, preserve_unit_loops=True)
    assert [l.extent.value for l in loops_of(sch, "B")] == [8, 6, 1, 1]
    assert_same(f, sch.func)
    assert_round_trip(f, sch)


def test_compute_at_padding_into_conv_window():
    f = conv1d_pad(14, 3)
    sch = Schedule(f)
    i, r = sch.get_loops(sch.get_block("C"))
    io, ii = sch.split(i, [None, 4])
    sch.compute_at(sch.get_block("A_pad"), io)
    # the window makes the region (4 + 3 - 1 = 6) larger than the tile (4); the last tile
    # would run past A_pad's 16 elements, so a predicate clips it
    assert [l.extent.value for l in loops_of(sch, "A_pad")] == [4, 6]
    text = sch.func.script()
    assert "vi = T.axis.spatial(16, i_0 * 4 + ax0)" in text
    assert "T.where(i_0 * 4 + ax0 < 16)" in text
    a, w, c = random_args(f)
    interpret(sch.func, a, w, c)
    np.testing.assert_allclose(c, conv1d_ref(a, w), rtol=1e-5, atol=1e-5)
    assert_same(f, sch.func)
    assert_round_trip(f, sch)


def test_compute_at_symbolic_split_tail():
    f = symbolic_exp()
    sch = Schedule(f)
    io, ii = sch.split(sch.get_loops(sch.get_block("C"))[0], [None, 4])
    sch.compute_at(sch.get_block("B"), io)
    b_loops = loops_of(sch, "B")
    assert b_loops[1].extent.value == 4
    assert "T.where(i_0 * 4 + ax0 < n)" in sch.func.script()
    for n in (1, 4, 7, 13):
        assert_same(f, sch.func, n=n)
    assert_round_trip(f, sch)


def test_compute_at_symbolic_untiled():
    n = var("n")
    A = te.placeholder((n, 5), "float32", "A")
    B = te.compute((n, 5), lambda i, j: A[i, j] * A[i, j], "B")
    C = te.compute((n, 5), lambda i, j: B[i, j] - 2.0, "C")
    f = te.create_prim_func([A, C])
    sch = Schedule(f)
    sch.compute_at(sch.get_block("B"), sch.get_loops(sch.get_block("C"))[0])
    for nv in (1, 3):
        assert_same(f, sch.func, n=nv)


def test_compute_at_keeps_rfactor_tail_predicates():
    """rfactor over a symbolic row split by 4 leaves ``vk_0 * 4 + vk_1 < n`` on the partial
    results and ``vk_1 < n`` on the write-back: compute_at keeps both, over the new loops,
    and the partial results initialised whole (decompose_reduction) sum the row exactly."""
    n = var("n")
    A = te.placeholder((3, n), "float32", "A")
    k = te.reduce_axis((0, n), "k")
    B = te.compute((3,), lambda i: te.sum(A[i, k], axis=k), "B")
    C = te.compute((3, n), lambda i, j: A[i, j] / B[i], "C")
    f = te.create_prim_func([A, C])
    sch = Schedule(f)
    ko, ki = sch.split(sch.get_loops(sch.get_block("B"))[-1], [None, 4])
    rf = sch.rfactor(ki, 0)
    row = sch.get_loops(sch.get_block("C"))[0]
    sch.compute_at(sch.get_block("B"), row)
    sch.compute_at(rf, row)
    text = sch.func.script()
    assert "T.where(ax0 < n)" in text and "T.where(ax0 + ax1 * 4 < n)" in text
    sch.decompose_reduction(rf, sch.get_loops(rf)[1])
    for nv in (1, 3, 4, 9):
        assert_same(f, sch.func, n=nv)
    assert_round_trip(f, sch)


def test_reverse_compute_at_keeps_a_predicate_over_its_iter_vars():
    """A consumer that runs on rows below 5 only (``i < 5``, ``i`` its row's whole binding)
    keeps that test, over the new loops, once moved under its producer's row loop."""
    sch = Schedule(exp_then_add(8, 4))
    br, _ = tree.find_block(sch.func, "C")
    g = tree.replace(sch.func, br, br.replace(predicate=br.iter_values[0] < 5))
    sch = Schedule(g)
    sch.reverse_compute_at(sch.get_block("C"), sch.get_loops(sch.get_block("B"))[0])
    assert "T.where(i < 5)" in sch.func.script()
    assert_same(g, sch.func)


def test_compute_at_reduction_producer_keeps_reduce_loop():
    f = gemm_bias_relu(6, 5, 7)
    sch = Schedule(f)
    sch.compute_inline(sch.get_block("D"))
    i, j = sch.get_loops(sch.get_block("E"))
    sch.compute_at(sch.get_block("C"), i)
    # C's row i: one loop over the 5 columns, the whole reduction (7) inside
    assert [l.extent.value for l in loops_of(sch, "C")] == [6, 5, 7]
    text = sch.func.script()
    assert "vk = T.axis.reduce(7, ax1)" in text and "with T.init():" in text
    assert_same(f, sch.func, atol=1e-4)
    assert_round_trip(f, sch)


def test_compute_at_two_consumers_under_one_loop():
    A = te.placeholder((9, 4), "float32", "A")
    B = te.compute((9, 4), lambda i, j: A[i, j] + 1.0, "B")
    C = te.compute((9, 4), lambda i, j: B[i, j] * 2.0, "C")
    D = te.compute((9, 4), lambda i, j: B[i, j] * C[i, j], "D")
    f = te.create_prim_func([A, D])
    sch = Schedule(f)
    i, _ = sch.get_loops(sch.get_block("D"))
    sch.reverse_compute_at(sch.get_block("D"), sch.get_loops(sch.get_block("C"))[0])
    sch.compute_at(sch.get_block("B"), sch.get_loops(sch.get_block("C"))[0])
    assert [l.extent.value for l in loops_of(sch, "B")] == [9, 4]
    assert_same(f, sch.func)
    assert_round_trip(f, sch)


def test_compute_at_moves_again_deeper_and_back():
    f = exp_then_add(8, 6)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("C"))
    sch.compute_at(sch.get_block("B"), i)
    sch.compute_at(sch.get_block("B"), j)  # B is already under i: move it down to j
    assert loops_of(sch, "B") == [sch.get(i), sch.get(j)]
    assert "vj = T.axis.spatial(6, j)" in sch.func.script()
    assert_same(f, sch.func)
    sch.compute_at(sch.get_block("B"), i)  # and back up
    assert [l.extent.value for l in loops_of(sch, "B")] == [8, 6]
    assert_same(f, sch.func)
    assert_round_trip(f, sch)


def test_compute_at_under_fused_consumer_loop():
    f = exp_then_add(8, 6)
    sch = Schedule(f)
    fused = sch.fuse(*sch.get_loops(sch.get_block("C")))
    fo, fi = sch.split(fused, [None, 5])
    sch.compute_at(sch.get_block("B"), fo)
    # a tile of 5 of the 48 fused points straddles at most 2 rows: a constant extent (the
    # largest over i_j_fused_0) and a predicate for the tiles that touch one row
    assert [l.extent.value for l in loops_of(sch, "B")] == [10, 2, 6]
    assert "T.where(ax0 <" in sch.func.script()
    assert_same(f, sch.func)
    assert_round_trip(f, sch)


def test_compute_at_relaxes_thread_loops_for_a_global_buffer():
    f = exp_then_add(8, 16)
    sch = Schedule(f)
    i, j = sch.get_loops(sch.get_block("C"))
    jo, ji = sch.split(j, [None, 4])
    plain = sch.copy()
    sch.bind(jo, "threadIdx.x")
    sch.compute_at(sch.get_block("B"), jo)
    # B lives in global memory, shared by every thread: each thread computes the columns of all
    # 4 threads (a later split + bind of ax0 would share the work)
    assert [l.extent.value for l in loops_of(sch, "B")] == [8, 4, 16]
    assert_same(f, sch.func)
    plain.compute_at(plain.get_block("B"), jo)
    assert [l.extent.value for l in loops_of(plain, "B")] == [8, 4, 4]


# -- reverse_compute_at ---------------------------------------------------------------------------

def test_reverse_compute_at_relu_under_matmul_tile():
    f = matmul_relu(16, 12, 8)
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("C"))
    io, ii = sch.split(i, [None, 4])
    jo, ji = sch.split(j, [None, 6])
    sch.reorder(io, jo, ii, ji, k)
    sch.reverse_compute_at(sch.get_block("D"), jo)
    d_loops = loops_of(sch, "D")
    assert d_loops[:2] == [sch.get(io), sch.get(jo)]
    assert [l.extent.value for l in d_loops[2:]] == [4, 6]
    text = sch.func.script()
    assert "vi = T.axis.spatial(16, i_0 * 4 + ax0)" in text
    assert "vj = T.axis.spatial(12, j_0 * 6 + ax1)" in text
    # D follows C inside j_0
    body = sch.get(jo).body
    assert [br.block.name for br in tree.child_block_realizes(body)] == ["C", "D"]
    a, b, d = random_args(f)
    interpret(sch.func, a, b, d)
    np.testing.assert_allclose(d, np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
    assert_round_trip(f, sch)


def test_reverse_compute_at_symbolic_tail():
    n = var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] + 2.0, "B")
    C = te.compute((n,), lambda i: B[i] * B[i], "C")
    f = te.create_prim_func([A, C])
    sch = Schedule(f)
    io, ii = sch.split(sch.get_loops(sch.get_block("B"))[0], [None, 8])
    sch.reverse_compute_at(sch.get_block("C"), io)
    assert "T.where(i_0 * 8 + ax0 < n)" in sch.func.script()
    for nv in (1, 8, 11, 20):
        assert_same(f, sch.func, n=nv)
    assert_round_trip(f, sch)


def test_reverse_compute_at_under_a_tile_of_fused_loops():
    # B's (y, x) fused and split by 8: with 8 | 56 each tile is one run of 8 in one row, and
    # C under the tile copies exactly that run (a whole row would copy 48 values not yet
    # computed: the ResNet-50 1x1 convolution that went wrong on AVX2)
    f = exp_then_add(6, 56)
    sch = Schedule(f)
    p = sch.fuse(*sch.get_loops(sch.get_block("B")))
    po, _ = sch.split(p, [None, 8])
    sch.reverse_compute_at(sch.get_block("C"), po)
    assert [l.extent.value for l in loops_of(sch, "C")[1:]] == [8]
    assert_same(f, sch.func)


def test_reverse_compute_at_refuses_an_inexact_region():
    # by 8 over rows of 12 a tile may straddle two rows: no box is exact, and a covering
    # box would make C copy elements of B no iteration has computed yet
    f = exp_then_add(6, 12)
    sch = Schedule(f)
    p = sch.fuse(*sch.get_loops(sch.get_block("B")))
    po, _ = sch.split(p, [None, 8])
    assert_rejected(sch, lambda s: s.reverse_compute_at(s.get_block("C"), po),
                    "reverse_compute_at", "not exact", "'C'", "not yet computed")


def test_reverse_compute_at_from_inside_the_loop_outwards():
    f = matmul_relu(4, 6, 3)
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.reverse_compute_at(sch.get_block("D"), j)
    assert loops_of(sch, "D") == [sch.get(i), sch.get(j)]
    sch.reverse_compute_at(sch.get_block("D"), i)
    assert [l.extent.value for l in loops_of(sch, "D")] == [4, 6]
    assert_same(f, sch.func, atol=1e-4)
    assert_round_trip(f, sch)


# -- sample_compute_location ----------------------------------------------------------------------

def test_sample_compute_location_candidates_and_replay():
    f = exp_then_add(8, 6)
    seen = set()
    for seed in range(30):
        sch = Schedule(f, seed=seed)
        b = sch.get_block("B")
        loop = sch.sample_compute_location(b)
        decision = sch.trace.instructions[-1].decision
        seen.add(decision)
        assert isinstance(loop, LoopRV)
        if decision >= 0:
            c_loops = sch.get_loops(sch.get_block("C"))
            assert sch.get(loop) is sch.get(c_loops[decision])
        else:  # a location RV (root / inline): not a loop
            with pytest.raises(ScheduleError, match="compute location"):
                sch.get(loop)
        sch.compute_at(b, loop)  # the tuner's rule: always compute_at the sampled location
        if decision == -2:
            assert "B" not in block_names(sch.func)  # the inline decision inlines
        assert_same(f, sch.func)
        assert_round_trip(f, sch)
    assert seen == {-2, -1, 0, 1}


def test_sample_compute_location_decisions():
    f = exp_then_add(8, 6)
    sch = Schedule(f)
    loop = sch.sample_compute_location(sch.get_block("B"), decision=1)
    assert sch.get(loop) is sch.get(sch.get_loops(sch.get_block("C"))[1])
    sch = Schedule(f)
    root = sch.sample_compute_location(sch.get_block("B"), decision=-1)
    sch.compute_at(sch.get_block("B"), root)
    assert "B" in block_names(sch.func) and structural_equal(f, sch.func)
    with pytest.raises(ScheduleError, match="root"):
        sch.split(root, [None, 2])  # a location RV is no loop
    sch = Schedule(f)
    inline = sch.sample_compute_location(sch.get_block("B"), decision=-2)
    assert "B" in block_names(sch.func)  # sampling changes nothing
    sch.compute_at(sch.get_block("B"), inline)
    assert "B" not in block_names(sch.func)
    sch = Schedule(f)
    assert_rejected(sch, lambda s: s.sample_compute_location(s.get_block("B"), decision=5),
                    "sample_compute_location", "'B'", "decision 5")
    # a block writing an output cannot be inlined nor moved: only the root is left
    sch = Schedule(f)
    sch.sample_compute_location(sch.get_block("C"))
    assert sch.trace.instructions[-1].decision == -1


def test_sample_compute_location_skips_illegal_loops():
    from tilecraft.tensorir.schedule.primitives_compute import compute_location_candidates
    f = conv1d_pad(8, 3)
    # the padding stage can be inlined, or computed at either loop of the convolution
    assert [d for d, _ in compute_location_candidates(f, "A_pad")] == [-2, -1, 0, 1]
    # the convolution writes the output: it stays where it is
    assert [d for d, _ in compute_location_candidates(f, "C")] == [-1]
    # a predicate compute_at could not keep rules out every loop (inlining is still fine)
    sch = Schedule(exp_then_add(8, 4))
    sch.split(sch.get_loops(sch.get_block("B"))[0], [None, 4])
    br, _ = tree.find_block(sch.func, "B")
    g = tree.replace(sch.func, br, br.replace(predicate=br.iter_values[0] < 5))
    assert [d for d, _ in compute_location_candidates(g, "B")] == [-2, -1]


# -- illegal requests -----------------------------------------------------------------------------

def test_compute_inline_illegal():
    f = gemm_bias_relu(4, 5, 6)
    sch = Schedule(f)
    assert_rejected(sch, lambda s: s.compute_inline(s.get_block("C")),
                    "compute_inline", "cannot inline a reduction block 'C'")
    assert_rejected(sch, lambda s: s.compute_inline(s.get_block("E")),
                    "compute_inline", "'E'", "output buffer E")
    assert_rejected(sch, lambda s: s.compute_inline(s.get_block("root")),
                    "compute_inline", "'root'", "root block")
    # a store at B[vi, 3 - vj] is not at the iter vars
    g = rewrite_store(chain(4, 4), "B",
                      lambda st, blk: BufferStore(st.buffer, st.value,
                                                  [blk.iter_vars[0].var, 3 - blk.iter_vars[1].var]))
    sch = Schedule(g)
    assert_rejected(sch, lambda s: s.compute_inline(s.get_block("B")),
                    "compute_inline", "'B'", "iter vars")
    # a block nobody reads (C no longer reads B)
    g = rewrite_store(chain(4, 4), "C",
                      lambda st, blk: BufferStore(st.buffer, FloatImm(1.0, "float32"), st.indices))
    sch = Schedule(g)
    assert_rejected(sch, lambda s: s.compute_inline(s.get_block("B")),
                    "compute_inline", "'B'", "no consumer")


def test_reverse_compute_inline_illegal():
    A = te.placeholder((8, 8), "float32", "A")
    B = te.compute((8, 8), lambda i, j: A[i, j] + 1.0, "B")
    C2 = te.compute((8, 8), lambda i, j: B[i, j] * B[j, i], "C2")
    f = te.create_prim_func([A, C2])
    sch = Schedule(f)
    assert_rejected(sch, lambda s: s.reverse_compute_inline(s.get_block("C2")),
                    "reverse_compute_inline", "'C2'", "reads B 2 times at different points")

    C3 = te.compute((4, 8), lambda i, j: B[2 * i, j] - 1.0, "C3")
    sch = Schedule(te.create_prim_func([A, C3]))
    assert_rejected(sch, lambda s: s.reverse_compute_inline(s.get_block("C3")),
                    "reverse_compute_inline", "'C3'", "iter vars")

    C4 = te.compute((8, 8), lambda i, j: B[i, j] * 3.0, "C4")
    sch = Schedule(te.create_prim_func([A, B, C4]))  # B is an output
    assert_rejected(sch, lambda s: s.reverse_compute_inline(s.get_block("C4")),
                    "reverse_compute_inline", "'C4'", "output buffer B")

    # B read by two consumers: removing it would starve the other one
    C5 = te.compute((8, 8), lambda i, j: B[i, j] * 3.0, "C5")
    C6 = te.compute((8, 8), lambda i, j: B[i, j] + C5[i, j], "C6")
    sch = Schedule(te.create_prim_func([A, C6]))
    assert_rejected(sch, lambda s: s.reverse_compute_inline(s.get_block("C5")),
                    "reverse_compute_inline", "'C5'", "read by other blocks")


def test_compute_at_illegal():
    f = chain(6, 4)
    sch = Schedule(f)
    # B's own loop holds no consumer of B
    assert_rejected(sch, lambda s: s.compute_at(s.get_block("B"),
                                                s.get_loops(s.get_block("B"))[0]),
                    "compute_at", "compute_at outside the consumer's loop nest", "'B'", "loop i")
    # D's loops hold no consumer of B either (C reads B)
    assert_rejected(sch, lambda s: s.compute_at(s.get_block("B"),
                                                s.get_loops(s.get_block("D"))[0]),
                    "compute_at", "outside the consumer's loop nest")
    # writes an output buffer
    assert_rejected(sch, lambda s: s.compute_at(s.get_block("D"),
                                                s.get_loops(s.get_block("C"))[0]),
                    "compute_at", "'D'", "output buffer D")

    # two consumers, only one under the loop
    A = te.placeholder((6,), "float32", "A")
    B = te.compute((6,), lambda i: A[i] + 1.0, "B")
    C = te.compute((6,), lambda i: B[i] * 2.0, "C")
    D = te.compute((6,), lambda i: B[i] + C[i], "D")
    sch = Schedule(te.create_prim_func([A, D]))
    assert_rejected(sch, lambda s: s.compute_at(s.get_block("B"),
                                                s.get_loops(s.get_block("D"))[0]),
                    "compute_at", "'B'", "not every consumer", "['C']")

    # a predicate that does more than guard the domain would be lost
    g = exp_then_add(8, 4)
    sch = Schedule(g)
    sch.split(sch.get_loops(sch.get_block("B"))[0], [None, 4])
    br, _ = tree.find_block(sch.func, "B")
    strict = br.replace(predicate=br.iter_values[0] < 5)
    sch2 = Schedule(tree.replace(sch.func, br, strict))
    assert_rejected(sch2, lambda s: s.compute_at(s.get_block("B"),
                                                 s.get_loops(s.get_block("C"))[0]),
                    "compute_at", "'B'", "predicate")


def test_compute_at_keeps_dependences_of_blocks_it_passes():
    A = te.placeholder((6,), "float32", "A")
    B = te.compute((6,), lambda i: A[i] + 1.0, "B")
    Y = te.compute((6,), lambda i: A[i] * 3.0, "Y")
    C = te.compute((6,), lambda i: B[i] * Y[i], "C")
    f = te.create_prim_func([A, C, Y])  # blocks in the order B, Y, C
    assert block_names(f) == ["root", "B", "Y", "C"]
    # legal: B passes Y, and both only read A
    sch = Schedule(f)
    sch.compute_at(sch.get_block("B"), sch.get_loops(sch.get_block("C"))[0])
    assert_same(f, sch.func)
    # make Y overwrite A (after B read it): B may no longer pass Y
    a_buf = f.buffers[0]
    g = rewrite_store(f, "Y", lambda st, blk: BufferStore(a_buf, st.value, st.indices))
    sch = Schedule(g)
    assert_rejected(sch, lambda s: s.compute_at(s.get_block("B"),
                                                s.get_loops(s.get_block("C"))[0]),
                    "compute_at", "'B'", "'Y' writes A which 'B' reads")
    # C may not move before Y, which writes the Y it reads
    sch = Schedule(f)
    assert_rejected(sch, lambda s: s.reverse_compute_at(s.get_block("C"),
                                                        s.get_loops(s.get_block("B"))[0]),
                    "reverse_compute_at", "'C'", "'Y' writes Y which 'C' reads")


def test_reverse_compute_at_illegal():
    f = matmul_relu(4, 4, 4)
    sch = Schedule(f)
    i, j, k = sch.get_loops(sch.get_block("C"))
    assert_rejected(sch, lambda s: s.reverse_compute_at(s.get_block("D"), k),
                    "reverse_compute_at", "loop k", "reduction loop", "'C'")
    assert_rejected(sch, lambda s: s.reverse_compute_at(s.get_block("C"),
                                                        s.get_loops(s.get_block("D"))[0]),
                    "reverse_compute_at", "'C'", "no producer")
    sch = Schedule(chain(4, 4))
    assert_rejected(sch, lambda s: s.reverse_compute_at(s.get_block("D"),
                                                        s.get_loops(s.get_block("B"))[1]),
                    "reverse_compute_at", "outside the producer's loop nest", "loop j", "'D'")

    A = te.placeholder((9,), "float32", "A")
    B = te.compute((9,), lambda i: A[i] + 1.0, "B")
    C = te.compute((8,), lambda i: B[i + 1] - B[i], "C")
    sch = Schedule(te.create_prim_func([A, C]))
    assert_rejected(sch, lambda s: s.reverse_compute_at(s.get_block("C"),
                                                        s.get_loops(s.get_block("B"))[0]),
                    "reverse_compute_at", "'C'", "spatial iter vars")


# -- compiled -------------------------------------------------------------------------------------

def test_compiled_fused_gemm_bias_relu():
    from tilecraft.targets import build
    f = gemm_bias_relu(30, 24, 16)
    sch = Schedule(f)
    sch.reverse_compute_inline(sch.get_block("E"))
    i, j, k = sch.get_loops(sch.get_block("C"))
    io, ii = sch.split(i, [None, 8])
    jo, ji = sch.split(j, [None, 8])
    sch.reorder(io, jo, k, ii, ji)
    sch.reverse_compute_at(sch.get_block("D"), jo)
    sch.parallel(io)
    a, b, bias, e = random_args(f)
    mod = build(sch.mod, "llvm")
    mod["main"](a, b, bias, e)
    np.testing.assert_allclose(e, np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-4)
