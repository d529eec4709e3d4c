"""can_prove of floor-division bounds from a constraint on the dividend: ``u // c < k``
follows from ``u < c * k`` (u an integer sum), as in a cooperative fetch fused over a tile and
guarded (``(a * 48 + b * 12 + t) // 5 < 12`` under ``a * 48 + b * 12 + t < 60``). Random
cases are checked against every point of small domains: never a false statement proved."""
import itertools

from hypothesis import given, settings, strategies as st

from tilecraft.tensorir import Range, arith, var
from tilecraft.tensorir.expr import FloorDiv, IntImm, Not

X = [var("x0"), var("x1"), var("x2")]


def _sum(coeffs):
    e = IntImm(0)
    for c, v in zip(coeffs, X):
        if c:
            e = e + v * c
    return e


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=3, max_size=3),
       st.lists(st.integers(1, 5), min_size=3, max_size=3),
       st.integers(1, 9), st.integers(0, 40), st.integers(-3, 3))
def test_floordiv_bound_from_constraint(coeffs, extents, c, bound, dk):
    u = _sum(coeffs)
    ana = arith.Analyzer()
    for v, n in zip(X, extents):
        ana.bind(v, Range(0, n))
    k = -(-bound // c) + dk          # around the tight k = ceil(bound / c)
    pts = [p for p in itertools.product(*(range(n) for n in extents))
           if sum(a * b for a, b in zip(coeffs, p)) < bound]
    truth = all(sum(a * b for a, b in zip(coeffs, p)) // c < k for p in pts)
    with ana.with_constraint(u < bound):
        proved = ana.can_prove(FloorDiv(u, IntImm(c)) < k)
        disproved = ana.can_prove(Not(FloorDiv(u, IntImm(c)) < k))
    assert not proved or truth, (coeffs, extents, c, bound, k)
    assert not disproved or not pts or not truth, (coeffs, extents, c, bound, k)


def test_guarded_cooperative_fetch_index():
    a, b, t = var("a"), var("b"), var("t")
    ana = arith.Analyzer()
    ana.bind(a, Range(0, 2))
    ana.bind(b, Range(0, 4))
    ana.bind(t, Range(0, 12))
    u = a * 48 + b * 12 + t
    with ana.with_constraint(u < 60):
        assert ana.can_prove(FloorDiv(u, IntImm(5)) < 12)
        assert not ana.can_prove(FloorDiv(u, IntImm(5)) < 11)
    with ana.with_constraint(u < 288):
        assert ana.can_prove(FloorDiv(u, IntImm(9)) < 32)
