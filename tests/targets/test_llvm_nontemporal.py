"""Non-temporal stores (``tensorir.stmt.ANN_NONTEMPORAL_STORE`` on a vectorized loop): the LLVM
back end stores full vectors with ``!nontemporal`` where their address is aligned to a cache
line and plainly where it is not (a run-time test), from the annotation's size in bytes of the
stored buffer on (decided when compiling for a static shape, at run time for a symbolic one),
the results unchanged either way (against numpy); ragged vectors stay plain stores; the
interpreter ignores the annotation."""
import platform

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import te, transform
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.stmt import ANN_NONTEMPORAL_STORE


def _add_one(rows: int, cols: int, annotate: bool = True, parallel: bool = False,
             min_bytes: int = 1):
    """``B = A * 2 + 1`` over ``(rows, cols)`` (rows symbolic when ``rows`` is None), its column
    loop vectorized and annotated (non-temporal from ``min_bytes`` of ``B``), its rows in
    parallel with ``parallel``."""
    n = te.var("n") if rows is None else rows
    A = te.placeholder((n, cols), "float32", "A")
    B = te.compute((n, cols), lambda i, j: A[i, j] * 2.0 + 1.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    i, j = sch.get_loops(sch.get_block("B"))
    if parallel:
        sch.parallel(i)
    sch.vectorize(j)
    if annotate:
        sch.annotate(j, ANN_NONTEMPORAL_STORE, min_bytes)
    return sch.mod


def _at_offset(shape, misalign_floats: int) -> np.ndarray:
    """A zeroed float32 array of ``shape`` whose data starts ``misalign_floats`` floats past a
    64-byte boundary."""
    size = int(np.prod(shape))
    raw = np.zeros(size + 64, np.float32)
    start = (-(raw.ctypes.data // 4)) % 16 + misalign_floats
    out = raw[start:start + size].reshape(shape)
    assert out.ctypes.data % 64 == 4 * misalign_floats
    return out


@pytest.mark.parametrize("misalign", [0, 1, 8])
@pytest.mark.parametrize("rows", [5, None])
def test_nontemporal_results_at_any_alignment(rng, rows, misalign):
    mod = targets.build(_add_one(rows, 48), "llvm")
    a = rng.standard_normal((7 if rows is None else rows, 48)).astype("float32")
    b = _at_offset(a.shape, misalign)
    mod["main"](a, b)
    np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)


def test_nontemporal_metadata_only_where_annotated():
    src = targets.build(_add_one(5, 48), "llvm").get_source("ll-raw")
    assert "!nontemporal" in src and "align 64" in src
    assert "fence seq_cst" in src           # weakly ordered stores: fenced before the return
    plain = targets.build(_add_one(5, 48, annotate=False), "llvm").get_source("ll-raw")
    assert "!nontemporal" not in plain and "fence" not in plain


def test_parallel_tasks_fence_their_nontemporal_stores(rng):
    """Each parallel task fences before it returns (the pool's end-of-task signal orders
    only ordinary stores); the rows written by two threads read back whole."""
    mod = targets.build(_add_one(None, 64, parallel=True), "llvm")
    src = mod.get_source("ll-raw")
    par = src[src.index(".par1("):]
    assert "!nontemporal" in par and "fence seq_cst" in par
    mod.num_threads = 2
    for _ in range(20):
        a = rng.standard_normal((257, 64)).astype("float32")
        b = _at_offset(a.shape, 0)
        mod["main"](a, b)
        np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 assembly")
def test_nontemporal_is_movnt_on_x86():
    asm = targets.build(_add_one(5, 48), "llvm").get_source("asm")
    assert "movnt" in asm


def test_ragged_vectors_stay_plain_stores(rng):
    # 20 columns: one 20-lane step, 80 bytes, not whole cache lines
    mod = targets.build(_add_one(6, 20), "llvm")
    assert "!nontemporal" not in mod.get_source("ll-raw")
    a = rng.standard_normal((6, 20)).astype("float32")
    b = np.zeros_like(a)
    mod["main"](a, b)
    np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)


def test_interpreter_ignores_the_annotation(rng):
    lowered = transform.lower(_add_one(4, 48))["main"]
    a = rng.standard_normal((4, 48)).astype("float32")
    b = np.zeros_like(a)
    interpret(lowered, a, b)
    np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)


def test_static_buffer_under_the_threshold_stays_plain(rng):
    # 5 x 48 floats: 960 bytes
    under = targets.build(_add_one(5, 48, min_bytes=961), "llvm").get_source("ll-raw")
    assert "!nontemporal" not in under and "fence" not in under
    at = targets.build(_add_one(5, 48, min_bytes=960), "llvm").get_source("ll-raw")
    assert "!nontemporal" in at and "fence seq_cst" in at


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("misalign", [0, 3])
def test_symbolic_buffer_tested_at_run_time(rng, parallel, misalign):
    """From 100 rows of 64 floats on: the size is a run-time test, the stores correct on both
    sides of it (and either alignment), in one kernel and in parallel tasks."""
    mod = targets.build(_add_one(None, 64, parallel=parallel, min_bytes=100 * 64 * 4), "llvm")
    src = mod.get_source("ll-raw")
    assert "!nontemporal" in src
    assert any("icmp sge" in line and str(100 * 64 * 4) in line for line in src.splitlines())
    mod.num_threads = 2
    for rows in (1, 99, 100, 257):
        a = rng.standard_normal((rows, 64)).astype("float32")
        b = _at_offset(a.shape, misalign)
        mod["main"](a, b)
        np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)
