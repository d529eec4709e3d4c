"""sample_tile (tiles of symbolic loops), enter_postproc and the Trace helpers the tuner uses."""
import numpy as np
import pytest

from tilecraft.tensorir import interpret, te, var
from tilecraft.tensorir.schedule import Schedule, ScheduleError, Trace
from tilecraft.tensorir.schedule.sampling import representative_extent


def scaled(n):
    A = te.placeholder((n, 48), "float32", "A")
    B = te.compute((n, 48), lambda i, j: A[i, j] * 2.0, "B")
    return te.create_prim_func([A, B])


def test_representative_extent():
    n = var("n")
    assert representative_extent((n + 15) // 16, {"n": 64}) == 4
    assert representative_extent(n * 3, {"m": 2}) is None
    assert representative_extent(12, None) == 12


def test_sample_tile_symbolic_extent_replays_for_every_n():
    n = te.var("n")
    f = scaled(n)
    rng = np.random.default_rng(0)
    for seed in range(8):
        sch = Schedule(f, seed=seed)
        i, j = sch.get_loops(sch.get_block("B"))
        inner = sch.sample_tile(i, 3, max_innermost_factor=8, shape_hints={"n": 64})
        factors = [sch.get(v) for v in inner]
        dec = sch.trace.instructions[-1].decision
        assert len(dec) == 3 and dec[1:] == factors and dec[0] * factors[0] * factors[1] == 64
        assert factors[1] <= 8
        sch.split(i, [None, *inner])
        # the same trace on the symbolic function: correct for any n
        again = Trace.from_json(sch.trace.to_json()).apply(f)
        for nv in (1, 7, 64, 100):
            a = rng.uniform(-1, 1, (nv, 48)).astype("float32")
            b = np.zeros_like(a)
            interpret(again.mod["main"], a, b, n=nv)
            np.testing.assert_allclose(b, a * 2)


def test_sample_tile_constant_extent_and_bad_decisions():
    sch = Schedule(scaled(96), seed=1)
    i, j = sch.get_loops(sch.get_block("B"))
    inner = sch.sample_tile(j, 4, max_innermost_factor=4)
    dec = sch.trace.instructions[-1].decision
    assert np.prod(dec) == 48 and len(inner) == 3 and dec[-1] <= 4
    with pytest.raises(ScheduleError, match="sample_tile.*decision"):
        sch.sample_tile(i, 2, 4, decision=[3, 8])          # innermost above the bound
    with pytest.raises(ScheduleError, match="n must be an int >= 2"):
        sch.sample_tile(i, 1)


def test_sample_tile_needs_hints_for_symbolic_extent():
    sch = Schedule(scaled(te.var("n")))
    i, _ = sch.get_loops(sch.get_block("B"))
    with pytest.raises(ScheduleError, match="symbolic extent"):
        sch.sample_tile(i, 2, 4)


def test_dropped_decisions_resample_and_postproc_mark():
    f = scaled(128)
    sch = Schedule(f, seed=0)
    i, j = sch.get_loops(sch.get_block("B"))
    sch.split(i, [None, *sch.sample_tile(i, 3, 16)])
    sch.enter_postproc()
    sch.vectorize(sch.get_loops(sch.get_block("B"))[-1])
    trace = sch.trace
    assert trace.postproc_index is not None
    cut = trace.without_postproc()
    assert [x.kind for x in cut][-1] == "split" and len(cut) == trace.postproc_index
    fresh = cut.with_decisions_dropped()
    assert all(x.decision is None for x in fresh)
    drawn = {str(fresh.apply(f, seed=s).trace.decisions) for s in range(10)}
    assert len(drawn) > 1                                   # fresh draws differ by seed
    assert trace.instructions[2].decision is not None     # the original is untouched
