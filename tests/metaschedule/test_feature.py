"""PerStoreFeature: every column is named and documented, and the columns say what the loop
nests do (arithmetic counts, loop kinds and extents, strides, reuse, allocations, guards)."""
import math

import numpy as np
import pytest

from tilecraft.tensorir import Schedule, te, transform
from tilecraft.metaschedule.feature import (FEATURE_DOCS, FEATURE_NAMES, NUM_FEATURES, PerStoreFeature,
                                  analytic_cost, describe_features)

from search_testutil import gemm_func


def col(row, name):
    return float(row[FEATURE_NAMES.index(name)])


def L(x):
    return math.log2(1 + x)


def elementwise(n=128, fn=None):
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), fn or (lambda i: te.exp(A[i]) * 2.0 + 1.0), "B")
    return te.create_prim_func([A, B])


def test_columns_named_and_documented():
    assert len(FEATURE_NAMES) == NUM_FEATURES == len(set(FEATURE_NAMES))
    assert all(FEATURE_DOCS[n] for n in FEATURE_NAMES)
    text = describe_features()
    assert len(text.splitlines()) == NUM_FEATURES and "float_mad" in text


def test_one_row_per_store_fixed_width():
    f = gemm_func(16, 16, 16)
    feats = PerStoreFeature().extract([f, elementwise()])
    assert feats[0].shape == (2, NUM_FEATURES)        # init store + update store
    assert feats[1].shape == (1, NUM_FEATURES)
    assert all(x.dtype == np.float32 and np.isfinite(x).all() for x in feats)


def test_arithmetic_counts():
    row = PerStoreFeature().extract([elementwise(128)])[0][0]
    assert col(row, "float_math_func") == pytest.approx(L(128))
    assert col(row, "float_mad") == pytest.approx(L(128))     # exp(a) * 2 + 1
    assert col(row, "float_divmod") == 0
    rows = PerStoreFeature().extract([gemm_func(16, 16, 16)])[0]
    update = max(rows, key=lambda r: col(r, "float_mad"))
    assert col(update, "float_mad") == pytest.approx(L(16 ** 3))
    assert col(update, "is_accumulate") == 1
    assert col(update, "reduce_extent") == pytest.approx(L(16))
    init = min(rows, key=lambda r: col(r, "float_mad"))
    assert col(init, "float_mad") == 0 and col(init, "is_accumulate") == 0


def test_loop_kinds_and_extents():
    f = elementwise(1024)
    sch = Schedule(f)
    i, = sch.get_loops(sch.get_block("B"))
    io, ii, iv = sch.split(i, [None, 4, 16])
    sch.parallel(io)
    sch.unroll(ii)
    sch.vectorize(iv)
    row = PerStoreFeature().extract([sch.func])[0][0]
    assert col(row, "vectorized_len") == pytest.approx(L(16))
    assert col(row, "vectorized_innermost") == 1
    assert col(row, "unrolled_prod") == pytest.approx(L(4))
    assert col(row, "parallel_prod") == pytest.approx(L(16))
    assert col(row, "parallel_num") == 1 and col(row, "serial_num") == 0
    assert col(row, "register_block") == pytest.approx(L(64))
    assert col(row, "trip_count") == pytest.approx(L(1024))
    assert col(row, "num_loops") == 3


def test_thread_binding_columns():
    f = elementwise(1024)
    sch = Schedule(f)
    i, = sch.get_loops(sch.get_block("B"))
    bx, tx = sch.split(i, [None, 64])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    row = PerStoreFeature().extract([sch.func])[0][0]
    assert col(row, "bind_blockIdx.x") == pytest.approx(L(16))
    assert col(row, "bind_threadIdx.x") == pytest.approx(L(64))


def test_strides_and_reuse():
    n = 64
    A = te.placeholder((n, n), "float32", "A")
    T = te.compute((n, n), lambda i, j: A[j, i], "T")       # transpose: A walked by rows
    row = PerStoreFeature().extract([te.create_prim_func([A, T])])[0][0]
    slots = {}
    for s in range(2):
        if col(row, f"buf{s}_read"):
            slots["A"] = s
        if col(row, f"buf{s}_write"):
            slots["T"] = s
    assert col(row, f"buf{slots['A']}_inner_stride") == pytest.approx(L(n))
    assert col(row, f"buf{slots['T']}_inner_stride") == pytest.approx(L(1))
    assert col(row, f"buf{slots['A']}_reuse_none") == 1
    # GEMM: A[i, k] is re-read for every j, C[i, j] is read and written by the update
    rows = PerStoreFeature().extract([gemm_func(32, 32, 32)])[0]
    update = max(rows, key=lambda r: col(r, "float_mad"))
    kinds = {(col(update, f"buf{s}_readwrite"), col(update, f"buf{s}_reuse_loop"))
             for s in range(3)}
    assert (1.0, 1.0) in kinds                       # C: read-write, reused over k
    assert all(col(update, f"buf{s}_reuse_loop") == 1 for s in range(3))
    assert col(update, "buf3_bytes") == 0            # only 3 buffers: the other slots are 0


def test_allocation_and_guards():
    f = gemm_func(30, 32, 16)
    sch = Schedule(f)
    b = sch.get_block("C")
    i, j, k = sch.get_loops(b)
    io, ii = sch.split(i, [None, 8])                 # 30 = 3 * 8 + 6: a guarded tail
    acc = sch.cache_write(b, 0, "local")
    sch.reverse_compute_at(acc, io)
    rows = PerStoreFeature().extract([sch.func])[0]
    local = [r for r in rows if col(r, "alloc_local") == 1]
    assert local, "the stores into C_local describe their allocation"
    assert all(col(r, "alloc_bytes") > 0 for r in local)
    fracs = [col(r, "guard_fraction") for r in rows]
    assert min(fracs) < 1.0
    # with loop partitioning the full tiles and the tail add up to the 30 rows
    update = [r for r in rows if col(r, "float_mad") > 0]
    total = sum(2 ** col(r, "trip_count") - 1 for r in update)
    assert total == pytest.approx(30 * 32 * 16, rel=0.05)


def test_symbolic_extents_at_shape_vars():
    n = te.var("n")
    f = gemm_func(n, 32, 32)
    fe = PerStoreFeature()
    small = fe.extract([f], shape_vars={"n": 4})[0]
    big = fe.extract([f], shape_vars={"n": 400})[0]
    t = FEATURE_NAMES.index("trip_count")
    assert small[:, t].max() == pytest.approx(L(4 * 32 * 32))
    assert big[:, t].max() == pytest.approx(L(400 * 32 * 32))
    default = PerStoreFeature(shape_vars={"n": 400}).extract([f])[0]
    np.testing.assert_array_equal(default, big)


def test_lowered_and_unlowered_agree():
    f = gemm_func(32, 32, 32)
    fe = PerStoreFeature()
    np.testing.assert_array_equal(fe.extract([f])[0], fe.extract([transform.lower(f)])[0])


def test_analytic_cost_orders_schedules():
    """The prior prefers a register-tiled, vectorized, parallel GEMM to the plain loops."""
    f = gemm_func(256, 256, 256)
    sch = Schedule(f)
    b = sch.get_block("C")
    i, j, k = sch.get_loops(b)
    i0, i1 = sch.split(i, [None, 4])
    j0, j1 = sch.split(j, [None, 16])
    sch.reorder(i0, j0, k, i1, j1)
    sch.decompose_reduction(b, k)
    sch.unroll(i1)
    sch.vectorize(j1)
    sch.parallel(sch.fuse(i0, j0))
    fe = PerStoreFeature("llvm")
    naive, tiled = fe.extract([f, sch.func])
    assert analytic_cost(tiled) * 4 < analytic_cost(naive)
    # every est_ column is a finite log value
    est = [i for i, n in enumerate(FEATURE_NAMES) if n.startswith("est_")]
    assert np.isfinite(tiled[:, est]).all() and (tiled[:, est] >= 0).all()


def test_bad_input():
    with pytest.raises(TypeError, match="PrimFunc"):
        PerStoreFeature().extract(["not a function"])
