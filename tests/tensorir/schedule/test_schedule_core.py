"""Schedule infrastructure: random variables, queries, sampling, traces and their JSON form."""
import json

import pytest

from tilecraft.tensorir import te
from tilecraft.tensorir.schedule import BlockRV, LoopRV, Schedule, ScheduleError, Trace
from tilecraft.tensorir.structural import structural_equal


def two_stage():
    A = te.placeholder((128, 64), "float32", "A")
    B = te.compute((128, 64), lambda i, j: A[i, j] * 2.0, "B")
    C = te.compute((128, 64), lambda i, j: B[i, j] + 1.0, "C")
    return te.create_prim_func([A, C])


def test_get_block_and_loops():
    sch = Schedule(two_stage())
    b = sch.get_block("C")
    assert isinstance(b, BlockRV) and sch.get(b).name == "C"
    loops = sch.get_loops(b)
    assert all(isinstance(l, LoopRV) for l in loops)
    assert [sch.get(l).loop_var.name for l in loops] == ["i", "j"]
    assert [sch.get(l).extent.value for l in loops] == [128, 64]


def test_unknown_block_names_the_known_ones():
    sch = Schedule(two_stage())
    with pytest.raises(ScheduleError, match=r"get_block: no block named 'X'.*'B', 'C'"):
        sch.get_block("X")


def test_children_producers_consumers():
    sch = Schedule(two_stage())
    root = sch.get_block("root")
    assert [sch.get(b).name for b in sch.get_child_blocks(root)] == ["B", "C"]
    c = sch.get_block("C")
    assert [sch.get(b).name for b in sch.get_producers(c)] == ["B"]
    assert [sch.get(b).name for b in sch.get_consumers(sch.get_block("B"))] == ["C"]
    assert sch.get_consumers(c) == []
    i, _ = sch.get_loops(c)
    assert [sch.get(b).name for b in sch.get_child_blocks(i)] == ["C"]


def test_rv_from_other_schedule_rejected():
    s1, s2 = Schedule(two_stage()), Schedule(two_stage())
    b = s1.get_block("B")
    s2.get_block("C")
    with pytest.raises(ScheduleError, match="does not belong"):
        s2.get_loops(BlockRV("b99"))


def test_sample_perfect_tile_is_seeded_and_perfect():
    for seed in range(20):
        sch = Schedule(two_stage(), seed=seed)
        i, _ = sch.get_loops(sch.get_block("B"))
        fs = [sch.get(v) for v in sch.sample_perfect_tile(i, n=3, max_innermost_factor=8)]
        assert fs[0] * fs[1] * fs[2] == 128 and fs[2] <= 8
        again = Schedule(two_stage(), seed=seed)
        i2, _ = again.get_loops(again.get_block("B"))
        assert [again.get(v) for v in again.sample_perfect_tile(i2, 3, 8)] == fs


def test_sample_categorical_distribution_and_decision():
    sch = Schedule(two_stage(), seed=0)
    draws = [sch.get(sch.sample_categorical([1, 2, 3], [0.0, 1.0, 0.0])) for _ in range(20)]
    assert draws == [2] * 20
    with pytest.raises(ScheduleError, match="candidates"):
        sch.sample_categorical([1, 2], [1.0])


def test_trace_json_round_trip_and_changed_decision():
    f = two_stage()
    sch = Schedule(f, seed=3)
    i, _ = sch.get_loops(sch.get_block("B"))
    sch.sample_perfect_tile(i, n=2, max_innermost_factor=16)
    data = json.loads(json.dumps(sch.trace.to_json()))
    replay = Trace.from_json(data).apply(f)
    assert replay.trace.to_json() == sch.trace.to_json()
    assert structural_equal(replay.func, sch.func)
    idx = next(k for k, inst in enumerate(sch.trace) if inst.kind == "sample_perfect_tile")
    changed = sch.trace.with_decision(idx, [8, 16]).apply(f)
    assert changed.trace.instructions[idx].decision == [8, 16]
    with pytest.raises(ScheduleError, match="not a perfect"):
        sch.trace.with_decision(idx, [3, 16]).apply(f)


def test_bad_trace_data():
    with pytest.raises(ValueError, match="version"):
        Trace.from_json({"version": 99, "instructions": []})
    with pytest.raises(ValueError, match="unknown primitive"):
        Trace.from_json([["frobnicate", [], {}, [], None]]).apply(two_stage())
    with pytest.raises(ValueError, match="before it is defined"):
        Trace.from_json([["get_loops", ["$b7"], {}, [], None]]).apply(two_stage())


def test_copy_is_independent():
    sch = Schedule(two_stage(), seed=1)
    b = sch.get_block("B")
    other = sch.copy()
    other.get_loops(b)
    assert len(other.trace) == len(sch.trace) + 1
