"""arith.ramp: how an index moves across the lanes of a vectorized loop (the analysis behind
the vector loads and stores of every code generator), checked against evaluating the index at
each lane."""
import numpy as np
import pytest

from tilecraft.tensorir import Range, arith, var
from tilecraft.tensorir.expr import Cast, FloorDiv, IntImm, Let
from tilecraft.tensorir.functor import substitute

v, i, n = var("v"), var("i"), var("n")


def _lanes(e, env, lanes=8):
    """``e`` evaluated at lanes 0..lanes-1 (v = lane) with the other variables from ``env``."""
    out = []
    for k in range(lanes):
        val = arith.simplify(substitute(e, {v: IntImm(k, v.dtype), **{
            x: IntImm(c, x.dtype) for x, c in env.items()}}))
        out.append(val.value)
    return np.array(out)


@pytest.mark.parametrize("e, stride", [
    (i * 8 + v, 1), (i * 8 + v * 2, 2), (v * 3 - i, 3), (i * 8, 0), (n - v, -1),
    (Cast("int64", v) * 4, 4),                      # a cast as wide keeps the steps
    (Cast("int8", v), None),                        # narrowing may wrap between lanes
    (i * v, None), (FloorDiv(v, IntImm(2)), None), (FloorDiv(i, IntImm(2)) + v, 1),
])
def test_lane_stride(e, stride):
    assert arith.lane_stride(e, v) == stride
    if stride is not None:
        got = _lanes(e, {i: 5, n: 40})
        np.testing.assert_array_equal(np.diff(got), stride)


def test_lane_stride_follows_lets():
    t = var("t")
    lets = {}
    e = Let(t, v * 2 + i, t + 1)
    assert arith.lane_stride(e, v, lets) == 2
    assert lets == {t: v * 2 + i} or list(lets) == [t]     # the lane-varying let is recorded
    assert arith.lane_stride(t * 3, v, lets) == 6           # and used for later uses of t


def test_ramp_base_and_lane_index():
    base = arith.ramp_base(i * 8 + v + 3, v)
    assert arith.simplify(base - (i * 8 + 3)).value == 0
    assert arith.ramp_base(i * 8 + v * 2, v) is None
    ana = arith.Analyzer()
    ana.bind(i, Range(0, 4))
    at = arith.lane_index(i * 8 + v, v, IntImm(3), ana)
    assert arith.simplify(at - (i * 8 + 3)).value == 0


def test_is_aligned():
    ana = arith.Analyzer()
    ana.bind(i, Range(0, 16))
    assert arith.is_aligned(i * 8, 4, ana)
    assert arith.is_aligned(i * 8 + 4, 4, ana)
    assert not arith.is_aligned(i * 8 + 2, 4, ana)
    assert not arith.is_aligned(i * 2, 4, ana)
