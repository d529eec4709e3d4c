"""Tests of tensorir.arith: simplification rules, bounds, interval sets and proofs.

The oracle is a small evaluator below (Python ints with the IR's exact semantics), independent of
the constant folding inside ``arith``. Property tests draw random expressions over bound vars and
check the simplified form, the bounds and the proofs against it on every point of small domains.
"""
import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tilecraft.tensorir import Range, var
from tilecraft.tensorir import arith
from tilecraft.tensorir.expr import (EQ, GE, GT, LE, LT, NE, Add, And, BufferLoad, Call, Cast, Div,
                           FloatImm, FloorDiv, FloorMod, IntImm, Let, Max, Min, Mod, Mul, Not, Or,
                           PrimExpr, Select, Sub, TIRError, Var, floordiv, floormod, max_, min_,
                           select, truncdiv, truncmod)
from tilecraft.tensorir.stmt import Buffer
from tilecraft.tensorir.structural import structural_equal

# ---------------------------------------------------------------------------------------------
# oracle


def _tdiv(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def evaluate(e, env):
    """Value of an integer / bool expression with Python ints (exact IR semantics)."""
    t = type(e)
    if t is Var:
        return env[e]
    if t is IntImm:
        return e.value
    if t is FloatImm:
        return e.value
    if t is Not:
        return int(not evaluate(e.a, env))
    if t is Select:
        return evaluate(e.true_value if evaluate(e.condition, env) else e.false_value, env)
    if t is Cast:
        v = evaluate(e.value, env)
        if e.dtype == "bool":
            return int(v != 0)
        bits = int(e.dtype[3:] if e.dtype.startswith("int") else e.dtype[4:])
        v &= (1 << bits) - 1
        if e.dtype.startswith("int") and v >= 1 << (bits - 1):
            v -= 1 << bits
        return v
    a, b = evaluate(e.a, env), evaluate(e.b, env)
    if t is Add:
        return a + b
    if t is Sub:
        return a - b
    if t is Mul:
        return a * b
    if t is FloorDiv:
        return a // b
    if t is FloorMod:
        return a % b
    if t is Div:
        return _tdiv(a, b)
    if t is Mod:
        return a - b * _tdiv(a, b)
    if t is Min:
        return min(a, b)
    if t is Max:
        return max(a, b)
    if t is LT:
        return int(a < b)
    if t is LE:
        return int(a <= b)
    if t is GT:
        return int(a > b)
    if t is GE:
        return int(a >= b)
    if t is EQ:
        return int(a == b)
    if t is NE:
        return int(a != b)
    if t is And:
        return int(bool(a) and bool(b))
    if t is Or:
        return int(bool(a) or bool(b))
    raise NotImplementedError(t.__name__)


def points(ranges, limit=250, seed=0):
    """Every point of the box, or a random sample of ``limit`` points if it is larger."""
    vs = list(ranges)
    axes = [range(lo, hi + 1) for lo, hi in ranges.values()]
    total = 1
    for a in axes:
        total *= len(a)
    if total <= limit:
        for p in itertools.product(*axes):
            yield dict(zip(vs, p))
        return
    rng = random.Random(seed)
    for _ in range(limit):
        yield {v: rng.randint(lo, hi) for v, (lo, hi) in ranges.items()}


def same(a, b):
    return structural_equal(a, b)


i, j, k, n, m = var("i"), var("j"), var("k"), var("n"), var("m")
fused = var("fused")

# ---------------------------------------------------------------------------------------------
# the rules


def S(e, **ranges):
    """simplify with ranges given as name=(min, extent)."""
    by_name = {"i": i, "j": j, "k": k, "n": n, "m": m, "fused": fused}
    return arith.simplify(e, {by_name[nm]: Range(*r) for nm, r in ranges.items()})


def test_constant_folding_ints():
    c = lambda v: IntImm(v)  # noqa: E731
    assert S(c(7) + c(5)).value == 12
    assert S(c(7) - c(9)).value == -2
    assert S(c(7) * c(-3)).value == -21
    assert S(floordiv(c(-7), c(2))).value == -4
    assert S(floormod(c(-7), c(2))).value == 1
    assert S(truncdiv(c(-7), c(2))).value == -3
    assert S(truncmod(c(-7), c(2))).value == -1
    assert S(floordiv(c(7), c(-2))).value == -4
    assert S(floormod(c(7), c(-2))).value == -1
    assert S(min_(c(3), c(-4))).value == -4
    assert S(max_(c(3), c(-4))).value == 3
    assert S(c(3) < c(4)).value == 1 and S(c(3) >= c(4)).value == 0
    assert S(c(3) == c(3)).value == 1 and S(c(3) != c(3)).value == 0
    assert S(IntImm(2 ** 31 - 1, "int32") + IntImm(1, "int32")).value == -2 ** 31  # wraps
    assert S(Cast("int8", c(300))).value == 44
    assert S(Cast("float32", c(3))).value == 3.0
    # integer division by zero is not folded
    assert isinstance(S(floordiv(c(1), c(0))), FloorDiv)


def test_constant_folding_floats_and_bools():
    a, b = FloatImm(0.1, "float32"), FloatImm(0.2, "float32")
    r = S(a + b)
    assert isinstance(r, FloatImm) and r.value == float(np.float32(0.1) + np.float32(0.2))
    assert S(FloatImm(1.0, "float64") / FloatImm(4.0, "float64")).value == 0.25
    assert S(min_(a, b)).value == float(np.float32(0.1))
    assert S(a < b).value == 1
    assert S(Cast("int32", FloatImm(-2.7, "float32"))).value == -2
    assert S(Call("float32", "exp", [FloatImm(0.0, "float32")])).value == 1.0
    t, f = IntImm(1, "bool"), IntImm(0, "bool")
    x = var("x", "bool")
    assert S(And(t, f)).value == 0 and S(Or(t, f)).value == 1 and S(Not(f)).value == 1
    assert S(And(t, x)) is x and S(Or(f, x)) is x
    assert S(And(f, x)).value == 0 and S(Or(t, x)).value == 1
    assert S(Not(Not(x))) is x
    assert S(And(x, Not(x))).value == 0 and S(Or(x, Not(x))).value == 1


def test_float_structure_is_left_alone():
    x, y, z = var("x", "float32"), var("y", "float32"), var("z", "float32")
    e = (x + y) + z
    assert S(e) is e  # no reassociation, nothing rebuilt
    assert S(x * FloatImm(1.0, "float32")) is x
    assert S(x + FloatImm(0.0, "float32")) is x
    e2 = x - x
    assert same(S(e2), e2)  # x - x is not 0 for x = inf or nan
    e3 = x * FloatImm(0.0, "float32")
    assert same(S(e3), e3)
    # constants inside a float expression still fold
    c = FloatImm(2.0, "float32") * FloatImm(3.0, "float32")
    assert same(S(x + c), x + FloatImm(6.0, "float32"))


def test_identities():
    assert S(i * 1) is i
    assert S(i + 0) is i
    assert S(0 + i) is i
    assert S(i - 0) is i
    assert S(min_(i, i)) is i and S(max_(i, i)) is i
    assert S(i - i).value == 0
    assert S(i * 0).value == 0
    assert same(S((i + 3) + 5), i + 8)
    assert same(S((i - 3) + 5), i + 2)
    assert same(S(i * 2 + i * 3), i * 5)
    assert S(i * 4 + j - i * 4) is j
    assert same(S(i * 4 - (i * 2 + i * 2)), IntImm(0))
    assert same(S((i + j) * 2 - j), i * 2 + j)
    assert S(floordiv(i, 1)) is i and S(floormod(i, 1)).value == 0
    assert S(truncdiv(i, 1)) is i and S(truncmod(i, 1)).value == 0
    assert S(floordiv(i, i)).value == 1


def test_canonical_order_is_deterministic():
    a = S(j + i * 8 + 3)
    b = S(3 + (i * 8) + j)
    assert same(a, b)
    assert same(a, i * 8 + j + 3)
    assert same(S(j - i), S(0 - i + j))
    assert same(S(max_(j, i)), S(max_(i, j)))


def test_split_fuse_patterns():
    assert S((i * 8 + j) // 8, j=(0, 8)) is i
    assert S((i * 8 + j) % 8, j=(0, 8)) is j
    assert S((i // 4) * 4 + i % 4) is i
    assert S((fused // 7) * 7 + fused % 7) is fused
    assert S(((i * 7 + j) // 7), j=(0, 7)) is i
    assert S(((i * 7 + j) % 7), j=(0, 7)) is j
    # three-way split of one loop, then fused back
    e = (fused // 32) * 32 + ((fused // 4) % 8) * 4 + fused % 4
    assert S(e) is fused
    assert same(S((fused // 4) % 2 * 4 + fused % 4), fused % 8)
    assert same(S(fused - (fused // 4) * 4), fused % 4)
    assert same(S(floordiv(floordiv(fused, 4), 8)), fused // 32)
    assert same(S(floordiv(floormod(fused, 56), 8)), (fused // 8) % 7)
    assert same(S(floormod(floormod(fused, 56), 8)), fused % 8)
    # the bounds make the modulo vanish
    assert S(fused % 64, fused=(0, 64)) is fused
    assert same(S((fused // 8) % 16, fused=(0, 64)), fused // 8)
    # symbolic extents (dynamic shapes)
    assert S((fused // n) * n + fused % n) is fused
    assert S((i * n + j) // n, j=(0, n)) is i
    assert S((i * n + j) % n, j=(0, n)) is j


def test_floormod_with_coefficients():
    # floormod(x*c1 + y, c2) drops the multiples of c2 and divides out common factors
    assert same(S(floormod(i * 16 + j, 8)), j % 8)
    assert same(S(floormod(i * 4 + 2, 8)), (i * 2 + 1) % 4 * 2)
    assert same(S(floordiv(i * 4, 8)), i // 2)
    assert same(S(floordiv(i * 6 + 3, 3)), i * 2 + 1)
    assert S(floormod(i * 6 + 3, 3)).value == 0
    assert same(S(floordiv(i * 8 + j + 3, 8), j=(0, 5)), i)
    assert same(S(floormod(i * 8 + j + 3, 8), j=(0, 5)), j + 3)
    assert same(S(floordiv(i * 8 + j + 11, 8), j=(0, 5)), i + 1)


def test_truncdiv_of_non_negative_is_floordiv():
    assert S(truncdiv(i * 8 + j, 8), i=(0, 10), j=(0, 8)) is i
    assert S(truncmod(i * 8 + j, 8), i=(0, 10), j=(0, 8)) is j
    # possibly negative: truncdiv differs from floordiv, so it must stay
    e = S(truncdiv(i, 8), i=(-8, 16))
    assert isinstance(e, Div)


def test_comparisons_decided_by_bounds():
    assert S(i < 16, i=(0, 8)).value == 1
    assert same(S(i < 7, i=(0, 8)), i < 7)  # undecided: left as it is
    assert S(i < 0, i=(0, 8)).value == 0
    assert S(i >= 0, i=(0, 8)).value == 1
    assert S(i * 4 + j < 32, i=(0, 8), j=(0, 4)).value == 1
    assert S(i * 4 + j >= 32, i=(0, 8), j=(0, 4)).value == 0
    assert S(i == 9, i=(0, 8)).value == 0
    assert S(i * 2 == 5).value == 0  # parity
    assert S(i != 9, i=(0, 8)).value == 1
    assert S(i + 1 > i).value == 1
    assert same(S(i + 1 < j + 1), i < j)
    assert same(S(i * 4 < n * 4), i < n)
    assert same(S(i * 4 + j < 16), i * 4 + j < 16)


def test_symbolic_comparisons():
    ana = arith.Analyzer()
    ana.bind(i, Range(0, n))
    ana.bind(j, Range(0, 4))
    assert ana.can_prove(i < n)
    assert ana.can_prove(i <= n - 1)
    assert ana.can_prove(i * 4 + j < n * 4)
    assert not ana.can_prove(i * 4 + j < n * 4 - 1)
    assert not ana.can_prove(i < n - 1)
    assert ana.can_prove(min_(i, n) == i)
    assert same(ana.simplify(min_(i, n - 1)), i)


def test_select_min_max():
    assert S(select(i < 8, j, k), i=(0, 8)) is j
    assert S(select(i < 0, j, k), i=(0, 8)) is k
    assert S(select(i < 4, j, j), i=(0, 8)) is j
    assert S(min_(i, 8), i=(0, 8)) is i
    assert S(max_(i, 8), i=(0, 8)).value == 8
    assert S(min_(i + 1, i)) is i
    assert same(S(min_(min_(i, 8), 4)), min_(i, 4))
    assert same(S(max_(max_(i, 2), 5)), max_(i, 5))
    assert S(min_(max_(i, 9), 4)).value == 4
    ana = arith.Analyzer()
    ana.bind(i, Range(0, n))
    assert same(ana.simplify(min_(i + 1, n)), i + 1)


def test_not_of_comparison():
    assert same(S(Not(i < j)), j <= i)
    assert S(Not(i < 4), i=(0, 4)).value == 0


def test_bind_expression_and_update_bound():
    ana = arith.Analyzer()
    ana.bind(k, i * 4 + j)
    ana.bind(j, Range(0, 4))
    assert ana.simplify(k // 4) is i
    assert ana.simplify(k % 4) is j
    ana.update_bound(n, 0, None)
    assert ana.can_prove(n >= 0)
    assert not ana.can_prove(n >= 1)
    ana.update_bound(n, 1, 64)
    assert ana.can_prove(n >= 1) and ana.can_prove(n < 65)
    b = ana.const_int_bound(n * 2)
    assert (b.min_value, b.max_value) == (2, 128)
    # rebinding replaces the old range
    ana.bind(j, Range(0, 16))
    assert not ana.can_prove(j < 4)


def test_bind_extent_one_substitutes():
    ana = arith.Analyzer()
    ana.bind(i, Range(3, 1))
    assert ana.simplify(i * 2).value == 6


def test_with_constraint():
    ana = arith.Analyzer()
    ana.bind(i, Range(0, 64))
    with ana.with_constraint(i < n):
        assert ana.can_prove(i < n)
        assert ana.can_prove(i < n + 5)
        assert ana.can_prove(i * 2 < n * 2)
    assert not ana.can_prove(i < n)
    with ana.with_constraint(And(i >= 8, i < 16)):
        assert ana.simplify(i // 8).value == 1
        assert same(ana.simplify(i % 8), i - 8)
    with ana.with_constraint(i == 5):
        assert ana.simplify(i * 3).value == 15
    x = var("x", "bool")
    with ana.with_constraint(x):
        assert ana.can_prove(x)
    with ana.with_constraint(Not(i < 32)):
        assert ana.can_prove(i >= 32)
    assert not ana.can_prove(i >= 32)



def test_a_linear_constraint_bounds_each_of_its_variables_in_integers():
    """``tx + 16*ty < 128`` (a GPU tile fetch guarded by the thread's linear id) with tx >= 0
    gives ty <= 7: an integer bound the linear facts alone (ty < 8 - tx/16) do not reach, and
    what proves the fetch's row ``8*k + ty`` in bounds for k < 384. Checked exhaustively."""
    tx, ty, k = var("tx"), var("ty"), var("k")
    ana = arith.Analyzer()
    for v, ext in ((tx, 16), (ty, 16), (k, 384)):
        ana.bind(v, Range(0, ext))
    assert not ana.can_prove(k * 8 + ty < 3072)
    with ana.with_constraint(tx + ty * 16 < 128):
        assert ana.can_prove(ty < 8) and ana.can_prove(k * 8 + ty < 3072)
        assert not ana.can_prove(ty < 7) and not ana.can_prove(tx < 15)
        b = ana.const_int_bound(ty)
        assert (b.min_value, b.max_value) == (0, 7)
    assert not ana.can_prove(ty < 8)      # the bound leaves with the constraint
    # a lower bound, a bound through a negative coefficient, three variables: each derived
    # bound holds at every point of the box where the constraint does, and is reached there
    m = var("m")
    ana.bind(m, Range(0, 4))
    with ana.with_constraint(3 * tx - 2 * ty + m >= 20):
        btx, bty = ana.const_int_bound(tx), ana.const_int_bound(ty)
    points = [(x, y, z) for x in range(16) for y in range(16) for z in range(4)
              if 3 * x - 2 * y + z >= 20]
    assert (btx.min_value, bty.max_value) == (6, 14)
    assert min(p[0] for p in points) == 6 and max(p[1] for p in points) == 14

def test_const_int_bound():
    b = arith.const_int_bound(i * 4 + j, {i: Range(0, 8), j: Range(0, 4)})
    assert (b.min_value, b.max_value) == (0, 31)
    b = arith.const_int_bound(i * -3 + 2, {i: Range(0, 8)})
    assert (b.min_value, b.max_value) == (-19, 2)
    b = arith.const_int_bound(i // 4, {i: Range(-5, 20)})
    assert (b.min_value, b.max_value) == (-2, 3)
    b = arith.const_int_bound(floormod(i, 4), {i: Range(-5, 20)})
    assert (b.min_value, b.max_value) == (0, 3)
    b = arith.const_int_bound(truncmod(i, 4), {i: Range(-5, 20)})
    assert (b.min_value, b.max_value) == (-3, 3)
    b = arith.const_int_bound(min_(i, j), {i: Range(0, 8), j: Range(2, 3)})
    assert (b.min_value, b.max_value) == (0, 4)
    b = arith.const_int_bound(select(i < 3, i, j * 10), {i: Range(0, 8), j: Range(2, 3)})
    assert (b.min_value, b.max_value) == (0, 40)
    b = arith.const_int_bound(n)
    assert b.min_value == arith.ConstIntBound.NEG_INF and b.max_value == arith.ConstIntBound.POS_INF
    assert b.is_everything()
    b = arith.const_int_bound(var("x", "int32"))
    assert (b.min_value, b.max_value) == (-2 ** 31, 2 ** 31 - 1)
    b = arith.const_int_bound(var("u", "uint8") + 1)
    assert (b.min_value, b.max_value) == (1, 256)
    b = arith.const_int_bound(i * 4 + j - i * 4, {i: Range(0, 1000), j: Range(0, 4)})
    assert (b.min_value, b.max_value) == (0, 3)


def test_int_set_of_a_run_inside_one_period_is_exact():
    # (p * 8 + r) % 56 with r < 8: one run of 8 inside a row of 56 (the tile of a fused
    # y * 56 + x loop split by 8), not the whole row; and the same through a // lower. Each
    # set is checked against every point: a cover always, exact where no run can wrap.
    ana = arith.Analyzer()
    cases = [(floormod(i * 8 + j, 56), 8, 8, True),
             (floormod(floordiv(i * 8 + j, 2), 28), 8, 4, True),
             (floormod(i * 16 + j + 3, 56), 5, 5, True),
             (floormod(i * 8 + j + 3, 56), 8, 8, False)]   # 8 * 6 + 3 + 7 wraps past 56
    for expr, r_ext, width, exact in cases:
        s = ana.int_set(expr, {j: Range(0, r_ext)})
        widths = set()
        for iv in range(-9, 30):
            vals = [evaluate(expr, {i: iv, j: jv}) for jv in range(r_ext)]
            lo, hi = evaluate(s.min_value, {i: iv}), evaluate(s.max_value, {i: iv})
            assert lo <= min(vals) and max(vals) <= hi, (expr, iv)
            widths.add(hi - lo + 1)
        assert (widths == {width}) == exact, (expr, widths)


def test_int_set():
    s = arith.int_set(i * 4 + j, {i: Range(0, 8), j: Range(0, 4)})
    assert (s.min_value.value, s.max_value.value) == (0, 31)
    ana = arith.Analyzer()
    s = ana.int_set(i * 4 + j, {i: Range(0, n), j: Range(0, 4)})
    assert s.min_value.value == 0
    assert ana.can_prove_equal(s.max_value, n * 4 - 1)
    # a var's range may depend on another's
    s = ana.int_set(j, {i: Range(0, 8), j: Range(i * 4, 4)})
    assert (s.min_value.value, s.max_value.value) == (0, 31)
    s = ana.int_set(n - i, {i: Range(0, 8)})
    assert same(s.min_value, n - 7) and s.max_value is n
    ana.update_bound(n, 0, None)
    s = ana.int_set(i * n, {i: Range(0, 8)})
    assert s.min_value.value == 0 and same(s.max_value, n * 7)
    s = ana.int_set(floordiv(i, 4), {i: Range(0, n)})
    assert s.min_value.value == 0 and ana.can_prove_equal(s.max_value, floordiv(n - 1, 4))
    s = ana.int_set(floormod(i, 4), {i: Range(0, 64)})
    assert (s.min_value.value, s.max_value.value) == (0, 3)
    s = ana.int_set(floormod(i, 4), {i: Range(4, 2)})
    assert (s.min_value.value, s.max_value.value) == (0, 1)
    s = ana.int_set(min_(i, 5), {i: Range(0, 64)})
    assert (s.min_value.value, s.max_value.value) == (0, 5)
    s = ana.int_set(m, {i: Range(0, 8)})
    assert s.is_single_point() and s.min_value is m
    s = ana.int_set(BufferLoad(Buffer("A", [8], "int32"), [i]).astype("int64"), {i: Range(0, 8)})
    assert (s.min_value.value, s.max_value.value) == (-2 ** 31, 2 ** 31 - 1)
    s = ana.int_set(m * 2, {m: arith.IntervalSet(0, arith.IntervalSet.POS_INF)})
    assert s.min_value.value == 0 and not s.has_upper_bound()
    u = ana.union([arith.IntervalSet(0, 3), arith.IntervalSet(2, 9)])
    assert (u.min_value.value, u.max_value.value) == (0, 9)
    x = ana.intersect([arith.IntervalSet(0, 3), arith.IntervalSet(2, 9)])
    assert (x.min_value.value, x.max_value.value) == (2, 3)
    r = ana.to_range(arith.IntervalSet(i, i + 3))
    assert same(r.min, i) and r.extent.value == 4
    assert arith.IntervalSet.everything().is_everything()
    assert arith.IntervalSet.empty().is_empty()
    e = arith.IntervalSet.empty()
    assert ana.intersect([e, arith.IntervalSet(0, 3)]).is_empty()
    u = ana.union([e, arith.IntervalSet(0, 3)])
    assert (u.min_value.value, u.max_value.value) == (0, 3)
    u = ana.union([arith.IntervalSet(0, arith.IntervalSet.POS_INF), arith.IntervalSet(i, i + 3)])
    assert same(u.min_value, min_(i, 0)) and not u.has_upper_bound()
    x = ana.intersect([arith.IntervalSet.everything(), arith.IntervalSet(i, i + 3)])
    assert x.min_value is i and same(x.max_value, i + 3)


def test_can_prove_equal():
    ana = arith.Analyzer()
    assert ana.can_prove_equal((i // 4) * 4 + i % 4, i)
    assert ana.can_prove_equal((i + 1) * (j + 1), i * j + i + j + 1)
    assert not ana.can_prove_equal(i, j)
    x = var("x", "float32")
    assert ana.can_prove_equal(x + FloatImm(1.0, "float32"), x + FloatImm(1.0, "float32"))


def test_polynomial_index():
    # a flattened 4-d index with symbolic dims, written two ways
    C, H, W = var("C"), var("H"), var("W")
    b, c, h, w = var("b"), var("c"), var("h"), var("w")
    e1 = ((b * C + c) * H + h) * W + w
    e2 = b * C * H * W + c * H * W + h * W + w
    assert same(S(e1), S(e2))
    assert S(e1 - e2).value == 0


def test_bad_input():
    ana = arith.Analyzer()
    with pytest.raises(TIRError):
        ana.can_prove(i + 1)
    with pytest.raises(TIRError):
        ana.bind(i + 1, Range(0, 4))
    with pytest.raises(TIRError):
        ana.int_set(i, {i: (0, 4)})
    with pytest.raises(TIRError):
        ana.simplify("not an expression")


def test_deep_expressions():
    e = i
    for t in range(600):
        e = e + (j * (t % 5) - t)
    r = arith.simplify(e)
    assert same(r, i + j * sum(t % 5 for t in range(600)) - sum(range(600)))
    # deep nesting of non-linear nodes
    e = i
    for t in range(300):
        e = min_(e + 1, j * 2 + t) if t % 2 else floordiv(e * 3 + 1, 2)
    r = arith.simplify(e, {i: Range(0, 4), j: Range(0, 4)})
    for p in points({i: (0, 3), j: (0, 3)}):
        assert evaluate(r, p) == evaluate(e, p)


def test_memoization():
    # a typical index simplifies, and the repeated one is memoized (the same object back)
    ana = arith.Analyzer()
    i0, i1, j0, j1 = var("i0"), var("i1"), var("j0"), var("j1")
    for v, e in ((i0, 16), (i1, 4), (j0, 8), (j1, 8)):
        ana.bind(v, Range(0, e))
    idx = ((i0 * 4 + i1) // 4) * 512 + ((i0 * 4 + i1) % 4) * 64 + j0 * 8 + j1
    r = ana.simplify(idx)
    assert same(r, i0 * 512 + i1 * 64 + j0 * 8 + j1)
    assert ana.simplify(idx) is r


def test_int32_index_math():
    x, y = var("x", "int32"), var("y", "int32")
    r = arith.simplify((x * 8 + y) // 8, {y: Range(0, 8)})
    assert r is x and r.dtype == "int32"
    r = arith.simplify(x * 4 + y - x * 4 + 2)
    assert same(r, y + IntImm(2, "int32"))
    # narrowing and widening back is the identity when the value fits
    assert arith.simplify(Cast("int32", Cast("int64", x))) is x
    assert arith.simplify(Cast("int64", Cast("int32", i)), {i: Range(0, 100)}) is i
    e = Cast("int64", Cast("int32", i))
    assert same(arith.simplify(e), e)  # i might not fit in int32
    b = arith.const_int_bound(Cast("int64", x) * 2)
    assert (b.min_value, b.max_value) == (-2 ** 32, 2 ** 32 - 2)


def test_non_arith_nodes_have_simplified_children():
    A = Buffer("A", [64], "float32")
    e = BufferLoad(A, [(i // 4) * 4 + i % 4])
    r = arith.simplify(e)
    assert isinstance(r, BufferLoad) and r.indices[0] is i
    load = BufferLoad(A, [i])
    assert arith.simplify(load) is load  # unchanged nodes are returned as they are
    x = var("x", "float32")
    c = Call("float32", "if_then_else", [i < 16, x, FloatImm(0.0, "float32")])
    assert arith.simplify(c, {i: Range(0, 8)}) is x
    c2 = Call("float32", "exp", [x + FloatImm(0.0, "float32")])
    assert same(arith.simplify(c2), Call("float32", "exp", [x]))
    # a Let whose value is a constant or a var is inlined
    t = var("t")
    assert same(arith.simplify(Let(t, IntImm(3), t * 2 + i)), i + 6)
    le = Let(t, i * j, t + t)
    r = arith.simplify(le)
    assert isinstance(r, Let) and same(r.body, t * 2)
    # vector lanes are left to the code generators, children still simplified
    v = var("v", "int64x4")
    assert arith.simplify(v + v) is not None
    # int selects
    assert same(arith.simplify(select(i < j, i + 1 - 1, j)), select(i < j, i, j))


def test_constraint_bounds_atoms():
    ana = arith.Analyzer()
    ana.bind(i, Range(0, 64))
    with ana.with_constraint(floormod(i, 8) < 4):
        assert ana.can_prove(floormod(i, 8) <= 3)
        assert ana.simplify(floordiv(floormod(i, 8), 4)).value == 0
    with ana.with_constraint(Or(i < 4, i > 60)):
        assert ana.can_prove(Or(i < 4, i > 60))
        assert not ana.can_prove(i < 4)


def test_ceildiv_proofs():
    ana = arith.Analyzer()
    ana.update_bound(n, 0, None)
    assert ana.can_prove(((n + 3) // 4) * 4 >= n)
    assert ana.can_prove(((n + 3) // 4) * 4 < n + 4)
    assert not ana.can_prove(((n + 3) // 4) * 4 < n + 3)
    io, ii = var("io"), var("ii")
    ana.bind(io, Range(0, (n + 3) // 4))
    ana.bind(ii, Range(0, 4))
    assert ana.can_prove(io * 4 + ii < n + 3)
    assert not ana.can_prove(io * 4 + ii < n + 2)
    assert not ana.can_prove(io * 4 + ii < n)  # the split tail needs its predicate


def test_bounds_of_mul_and_div_by_negative_constants():
    b = arith.const_int_bound(i * -4, {i: Range(-2, 5)})
    assert (b.min_value, b.max_value) == (-8, 8)
    b = arith.const_int_bound(floordiv(i, -3), {i: Range(-2, 9)})
    assert (b.min_value, b.max_value) == (-2, 0)
    b = arith.const_int_bound(floormod(i, -3), {i: Range(-2, 9)})
    assert (b.min_value, b.max_value) == (-2, 0)
    b = arith.const_int_bound(truncdiv(i, -3), {i: Range(-7, 15)})
    assert (b.min_value, b.max_value) == (-2, 2)
    b = arith.const_int_bound(i * j, {i: Range(-2, 5), j: Range(-3, 4)})
    assert (b.min_value, b.max_value) == (-6, 6)
    b = arith.const_int_bound(floordiv(i, j), {i: Range(0, 17), j: Range(1, 4)})
    assert (b.min_value, b.max_value) == (0, 16)


# ---------------------------------------------------------------------------------------------
# property tests

VARS = [var("a"), var("b"), var("c")]


@st.composite
def int_exprs(draw, depth=4):
    """A random int64 expression over VARS (divisions by nonzero constants only)."""
    if depth == 0 or draw(st.integers(0, 5)) == 0:
        if draw(st.booleans()):
            return draw(st.sampled_from(VARS))
        return IntImm(draw(st.integers(-9, 9)))
    kind = draw(st.sampled_from(["add", "sub", "mul", "fdiv", "fmod", "tdiv", "tmod", "min",
                                 "max", "select", "add", "mul"]))
    a = draw(int_exprs(depth - 1))
    if kind in ("fdiv", "fmod", "tdiv", "tmod"):
        c = IntImm(draw(st.sampled_from([1, 2, 3, 4, 8, -2, -3, 6, 16])))
        return {"fdiv": FloorDiv, "fmod": FloorMod, "tdiv": Div, "tmod": Mod}[kind](a, c)
    if kind == "mul" and draw(st.booleans()):
        return Mul(a, IntImm(draw(st.integers(-4, 8))))
    b = draw(int_exprs(depth - 1))
    if kind == "select":
        return Select(draw(bool_exprs(depth - 1)), a, b)
    return {"add": Add, "sub": Sub, "mul": Mul, "min": Min, "max": Max}[kind](a, b)


@st.composite
def bool_exprs(draw, depth=3):
    kind = draw(st.sampled_from(["cmp", "cmp", "cmp", "and", "or", "not"]))
    if kind == "cmp" or depth <= 0:
        cls = draw(st.sampled_from([LT, LE, GT, GE, EQ, NE]))
        return cls(draw(int_exprs(max(depth - 1, 0))), draw(int_exprs(max(depth - 1, 0))))
    if kind == "not":
        return Not(draw(bool_exprs(depth - 1)))
    cls = And if kind == "and" else Or
    return cls(draw(bool_exprs(depth - 1)), draw(bool_exprs(depth - 1)))


@st.composite
def domains(draw):
    """Small ranges for VARS: (lo, hi) inclusive, so every point can be enumerated."""
    out = {}
    for v in VARS:
        lo = draw(st.integers(-6, 6))
        out[v] = (lo, lo + draw(st.integers(0, 6)))
    return out


def _bindings(dom):
    return {v: Range(lo, hi - lo + 1) for v, (lo, hi) in dom.items()}


def _safe_eval(e, p):
    try:
        return evaluate(e, p)
    except ZeroDivisionError:
        return None


@settings(max_examples=200, deadline=None)
@given(int_exprs(), domains())
def test_simplify_is_sound(e, dom):
    r = arith.simplify(e, _bindings(dom))
    for p in points(dom):
        assert evaluate(r, p) == evaluate(e, p), (p,)


@settings(max_examples=200, deadline=None)
@given(int_exprs(), domains())
def test_simplify_is_idempotent(e, dom):
    ana = arith.Analyzer()
    for v, r in _bindings(dom).items():
        ana.bind(v, r)
    once = ana.simplify(e)
    assert same(ana.simplify(once), once)


@settings(max_examples=200, deadline=None)
@given(bool_exprs(), domains())
def test_simplify_bool_is_sound(e, dom):
    r = arith.simplify(e, _bindings(dom))
    for p in points(dom):
        assert bool(evaluate(r, p)) == bool(evaluate(e, p)), (p,)


@settings(max_examples=200, deadline=None)
@given(bool_exprs(), domains())
def test_can_prove_never_proves_false(e, dom):
    if arith.can_prove(e, _bindings(dom)):
        for p in points(dom):
            assert evaluate(e, p), (p,)
    if arith.can_prove(Not(e), _bindings(dom)):
        for p in points(dom):
            assert not evaluate(e, p), (p,)


@settings(max_examples=200, deadline=None)
@given(int_exprs(), domains())
def test_const_int_bound_contains_every_value(e, dom):
    b = arith.const_int_bound(e, _bindings(dom))
    for p in points(dom):
        assert b.min_value <= evaluate(e, p) <= b.max_value, (p, b)


@settings(max_examples=200, deadline=None)
@given(int_exprs(), domains())
def test_int_set_contains_every_value(e, dom):
    s = arith.int_set(e, _bindings(dom))
    for p in points(dom):
        v = evaluate(e, p)
        if s.has_lower_bound():
            assert evaluate(s.min_value, p) <= v, (p,)
        if s.has_upper_bound():
            assert v <= evaluate(s.max_value, p), (p,)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-5, 5), min_size=3, max_size=3), st.integers(-20, 20), domains())
def test_bounds_exact_on_affine_sums(coeffs, const, dom):
    e = IntImm(const)
    for c, v in zip(coeffs, VARS):
        e = e + v * c
    values = [evaluate(e, p) for p in points(dom, limit=10 ** 6)]
    b = arith.const_int_bound(e, _bindings(dom))
    assert (b.min_value, b.max_value) == (min(values), max(values))
    s = arith.int_set(e, _bindings(dom))
    assert (s.min_value.value, s.max_value.value) == (min(values), max(values))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-4, 4), min_size=2, max_size=2), st.integers(-6, 6),
       st.integers(1, 6), st.integers(1, 6), st.sampled_from([LT, LE, EQ, NE, GT, GE]))
def test_symbolic_proofs_are_sound(coeffs, const, size_n, size_m, cmp):
    # a in [0, n), b in [0, m): proofs use the symbolic facts; check them for every n, m
    a, b, nn, mm = VARS[0], VARS[1], var("n"), var("m")
    ana = arith.Analyzer()
    ana.bind(a, Range(0, nn))
    ana.bind(b, Range(0, mm))
    lhs = a * coeffs[0] + b * coeffs[1] + const
    for rhs in (nn, mm, nn + mm, nn * 2 - 1):
        cond = cmp(lhs, rhs)
        if ana.can_prove(cond):
            for nv in range(1, size_n + 1):
                for mv in range(1, size_m + 1):
                    for av in range(nv):
                        for bv in range(mv):
                            assert evaluate(cond, {a: av, b: bv, nn: nv, mm: mv})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=2, max_size=4), st.booleans())
def test_fuse_then_index_folds_back(extents, bound_fused):
    # fuse loops of these extents into one var, rebuild each loop var with // and %, then the
    # row-major index of the original loops must be exactly the fused var again
    f = var("f")
    bindings = {f: Range(0, int(np.prod(extents)))} if bound_fused else {}
    strides = [int(np.prod(extents[d + 1:])) for d in range(len(extents))]
    loop_values = []
    for d, (e, s) in enumerate(zip(extents, strides)):
        v = floordiv(f, s) if s > 1 else f
        if d > 0 or not bound_fused:
            v = floormod(v, e)
        loop_values.append(v)
    index = IntImm(0)
    for v, s in zip(loop_values, strides):
        index = index + v * s
    r = arith.simplify(index, bindings)
    total = int(np.prod(extents))
    if total == 1:  # f is bound to the constant 0, or every term is modulo 1
        assert r.value == 0
    elif bound_fused:
        assert r is f
    else:  # the outermost loop value was wrapped, so f itself is taken modulo the total
        assert same(r, f % total)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=3), st.integers(0, 5))
def test_split_then_divide_folds_back(factors, offset):
    # i = ((o*f1 + i1)*f2 + i2)*f3 + i3 ... ; index // (f2*f3) and % must give back the parts
    o = var("o")
    inner = [var(f"i{d}") for d in range(len(factors))]
    bindings = {v: Range(0, fct) for v, fct in zip(inner, factors)}
    idx = o
    for v, fct in zip(inner, factors):
        idx = idx * fct + v
    total = int(np.prod(factors))
    assert arith.simplify(floordiv(idx, total), bindings) is o
    low = arith.simplify(floormod(idx, total), bindings)
    assert arith.simplify(o * total + low - idx, bindings).value == 0
    # a constant offset only moves into the remainder
    r = arith.simplify(floordiv(idx + offset * total, total), bindings)
    assert same(r, o + offset) if offset else r is o


@settings(max_examples=200, deadline=None)
@given(int_exprs(depth=3), st.integers(0, 2), bool_exprs(depth=1), st.booleans())
def test_simplify_sound_with_symbolic_ranges(e, shape, constraint, use_constraint):
    a, b, c = VARS
    nn, mm = var("n"), var("m")
    ana = arith.Analyzer()
    ana.update_bound(nn, 1, None)
    ana.update_bound(mm, 1, None)
    ana.bind(c, Range(-2, 5))
    if shape == 0:
        ana.bind(a, Range(0, nn))
        ana.bind(b, Range(0, mm))
        valid = lambda p: 0 <= p[a] < p[nn] and 0 <= p[b] < p[mm]  # noqa: E731
    elif shape == 1:
        ana.bind(a, Range(0, nn))
        ana.bind(b, Range(0, a))
        valid = lambda p: 0 <= p[a] < p[nn] and 0 <= p[b] < p[a]  # noqa: E731
    else:
        ana.bind(a, Range(1, nn))
        ana.bind(b, Range(a, nn * 2))
        valid = lambda p: 1 <= p[a] <= p[nn] and p[a] <= p[b] < p[a] + 2 * p[nn]  # noqa: E731
    if use_constraint:
        with ana.with_constraint(constraint):
            r = ana.simplify(e)
            bnd = ana.const_int_bound(e)
    else:
        r = ana.simplify(e)
        bnd = ana.const_int_bound(e)
    rng = random.Random(0)
    for _ in range(150):
        p = {nn: rng.randint(1, 6), mm: rng.randint(1, 6), a: rng.randint(0, 12),
             b: rng.randint(0, 16), c: rng.randint(-2, 2)}
        if not valid(p) or (use_constraint and not evaluate(constraint, p)):
            continue
        v = evaluate(e, p)
        assert evaluate(r, p) == v, (p,)
        assert bnd.min_value <= v <= bnd.max_value, (p,)


# ---------------------------------------------------------------------------------------------
# regressions: nested min / max of symbolic bounds (proof search recursion, case splitting)


def _clamp(x, lo, hi):
    return max_(min_(x, hi), lo)


def test_self_referential_clamp_fact_does_not_recurse():
    # A fact that mentions the clamp being simplified (an assert of the clamped index, as
    # Simplify assumes inside the assert's body) used to send the fact search back into
    # simplifying the same min: RecursionError.
    nn = var("n")
    ana = arith.Analyzer()
    ana.update_bound(nn, 0, None)
    ana.bind(i, Range(0, nn + 3))
    clamp = _clamp(i - 2, 0, nn - 1)
    with ana.with_constraint(clamp < nn):
        r = ana.simplify(min_(i - 2, nn - 1))
        c = ana.simplify(clamp)
        assert ana.can_prove(clamp >= 0)
        assert ana.can_prove(clamp < nn)
        assert ana.can_prove(nn >= 1)  # the fact implies it
        for nv in range(1, 6):
            for iv in range(nv + 3):
                p = {nn: nv, i: iv}
                assert evaluate(r, p) == min(iv - 2, nv - 1)
                assert evaluate(c, p) == max(min(iv - 2, nv - 1), 0)
    # a fact that simplification leaves about the clamp itself
    fact = nn - 3 < clamp
    with ana.with_constraint(fact):
        r = ana.simplify(min_(i - 2, nn - 1))
        for nv in range(0, 6):
            for iv in range(nv + 3):
                p = {nn: nv, i: iv}
                if evaluate(fact, p):
                    assert evaluate(r, p) == min(iv - 2, nv - 1)


def test_symbolic_div_extent_with_clamp_fact_does_not_recurse():
    a, b, c = var("a"), var("b"), var("c")
    ext = floordiv(a * b * c, a * b * 8)
    ana = arith.Analyzer()
    for v in (a, b, c):
        ana.update_bound(v, 0, None)
    ana.bind(i, Range(0, ext))
    clamp = _clamp(i * 8 - 1, 0, c - 1)
    with ana.with_constraint(clamp < c):
        ana.simplify(min_(i * 8 - 1, c - 1))
        assert ana.can_prove(clamp < c)
        assert not ana.can_prove(i * 8 - 1 < c - 1)


def test_min_max_against_bounds_by_case_split():
    h, u, x, cc = var("h"), var("u"), var("x"), var("cc")
    ana = arith.Analyzer()
    ana.update_bound(h, 1, None)
    assert ana.can_prove(min_(u, h - 1) < h)
    assert ana.can_prove(min_(u, h - 1) <= h - 1)
    assert ana.can_prove(_clamp(u, 0, h - 1) < h)
    assert ana.can_prove(_clamp(u, 0, h - 1) >= 0)
    assert ana.can_prove(min_(max_(u, 0), h - 1) < h)
    assert ana.can_prove(min_(max_(u, 0), h - 1) >= 0)
    assert ana.can_prove(max_(x, 0) >= 0)
    assert ana.can_prove(min_(x, cc) <= cc)
    assert ana.can_prove(max_(x, cc) >= cc)
    assert ana.can_prove(min_(x, cc) <= max_(x, cc))
    xf = var("xf", "float32")
    assert ana.can_prove(_clamp(Cast("int64", Call("float32", "floor", [xf])), 0, h - 1) < h)
    # and not what does not hold
    assert not ana.can_prove(min_(u, h) < h)
    assert not ana.can_prove(max_(u, 0) < h)
    assert not ana.can_prove(min_(x, cc) < cc)
    # h may be 0 without the bound: then clamp(u, 0, h - 1) == 0 is not < h
    plain = arith.Analyzer()
    plain.update_bound(h, 0, None)
    assert plain.can_prove(min_(u, h - 1) < h)
    assert not plain.can_prove(_clamp(u, 0, h - 1) < h)


def test_clamped_index_in_loop_proven():
    nn = var("n")
    ana = arith.Analyzer()
    ana.update_bound(nn, 1, None)
    ana.bind(i, Range(0, nn + 3))
    for e in (_clamp(i - 2, 0, nn - 1), min_(max_(i - 2, 0), nn - 1)):
        assert ana.can_prove(e >= 0)
        assert ana.can_prove(e < nn)
    assert ana.can_prove(0 <= max_(min_(i, nn - 1), 0))


def test_simplify_clamp_assert_inside_loop():
    # Simplify learns an assert's condition for its body: a clamped-index check inside a loop
    # (what VerifyMemoryAccess used to leave per element) sent it into the recursion
    from tilecraft.tensorir import interpret, transform
    from tilecraft.tensorir.function import PrimFunc
    from tilecraft.tensorir.stmt import AssertStmt, BufferStore, For
    nn = var("n")
    A = Buffer("A", (nn,), "float32")
    B = Buffer("B", (nn + 3,), "float32")
    ha, hb = var("A_h", "handle"), var("B_h", "handle")
    x = var("x")
    clamp = _clamp(x - 2, 0, nn - 1)
    body = For(x, 0, nn + 3, "serial",
               AssertStmt(clamp < nn, "clamp in bounds",
                          BufferStore(B, BufferLoad(A, (clamp,)), (x,))))
    f = transform.Simplify(PrimFunc([ha, hb], body, {ha: A, hb: B}))
    a = np.arange(4, dtype="float32") + 1
    b = np.zeros(7, "float32")
    interpret(f, a, b, n=4)
    np.testing.assert_array_equal(b, a[np.clip(np.arange(7) - 2, 0, 3)])
    with pytest.raises((RuntimeError, IndexError)):
        interpret(f, np.zeros(0, "float32"), np.zeros(3, "float32"), n=0)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([Min, Max]), st.sampled_from([Min, Max]), st.integers(-3, 3),
       st.integers(-3, 3), st.integers(-2, 2), st.sampled_from([LT, LE, GT, GE, EQ, NE]),
       st.integers(-2, 2), st.booleans())
def test_nested_min_max_proofs_are_sound(outer, inner, c1, c2, c3, cmp, off, in_loop):
    # outer(inner(i + c1, n + c2), c3) <cmp> n + off, with n >= 1 and i in [0, n + 3) or free
    nn = var("n")
    ana = arith.Analyzer()
    ana.update_bound(nn, 1, None)
    if in_loop:
        ana.bind(i, Range(0, nn + 3))
    e = outer(inner(i + c1, nn + c2), IntImm(c3))
    cond = cmp(e, nn + off)
    for c, want in ((cond, True), (Not(cond), False)):
        if ana.can_prove(c):
            for nv in range(1, 7):
                for iv in (range(nv + 3) if in_loop else range(-8, 12)):
                    assert bool(evaluate(cond, {nn: nv, i: iv})) == want, (nv, iv)


# lowering kernels that clamp with symbolic dims


def _asserts(func):
    """``[(assert, number of loops around it)]`` of a lowered function."""
    from tilecraft.tensorir.stmt import AssertStmt, For
    found = []

    def walk(node, loops):
        if isinstance(node, AssertStmt):
            found.append((node, loops))
        if isinstance(node, For):
            loops += 1
        for f in getattr(node, "_fields", ()):
            v = getattr(node, f)
            for x in (v if isinstance(v, tuple) else (v,)):
                if hasattr(x, "_fields") and not isinstance(x, PrimExpr):
                    walk(x, loops)

    walk(func.body, 0)
    return found


def test_lower_symbolic_pad_clamp():
    from tilecraft.tensorir import interpret, te, transform
    nn = te.var("n")
    A = te.placeholder((nn,), "float32", "A")
    B = te.compute((nn + 3,), lambda x: A[te.max(te.min(x - 2, nn - 1), 0)], "B")
    f = transform.lower(te.create_prim_func([A, B]))
    # the clamp needs only n >= 1: one check before the loop, not one per element
    (check, loops), = _asserts(f)
    assert loops == 0
    assert [evaluate(check.condition, {nn: v}) for v in range(4)] == [0, 1, 1, 1]
    rng = np.random.default_rng(0)
    for nv in (1, 5):
        a = rng.standard_normal(nv).astype("float32")
        b = np.zeros(nv + 3, "float32")
        interpret(f, a, b, n=nv)
        np.testing.assert_array_equal(b, a[np.clip(np.arange(nv + 3) - 2, 0, nv - 1)])
    with pytest.raises((RuntimeError, IndexError)):  # n == 0: A[0] does not exist
        interpret(f, np.zeros(0, "float32"), np.zeros(3, "float32"), n=0)


def _bilinear_kernel():
    from tilecraft.tensorir import te
    h, w, oh, ow = te.var("h"), te.var("w"), te.var("oh"), te.var("ow")
    A = te.placeholder((h, w), "float32", "A")

    def coord(o, size, osize):
        return (Cast("float32", o) + 0.5) * Cast("float32", size) / Cast("float32", osize) - 0.5

    def clamp(e, size):
        return te.max(te.min(e, size - 1), 0)

    def fcompute(y, x):
        fy, fx = coord(y, h, oh), coord(x, w, ow)
        y0 = Cast("int64", te.floor(fy))
        x0 = Cast("int64", te.floor(fx))
        ya, yb = clamp(y0, h), clamp(y0 + 1, h)
        xa, xb = clamp(x0, w), clamp(x0 + 1, w)
        dy, dx = fy - te.floor(fy), fx - te.floor(fx)
        top = A[ya, xa] * (1.0 - dx) + A[ya, xb] * dx
        bot = A[yb, xa] * (1.0 - dx) + A[yb, xb] * dx
        return top * (1.0 - dy) + bot * dy

    B = te.compute((oh, ow), fcompute, "B")
    return A, B


def _bilinear_numpy(a, oh, ow):
    h, w = a.shape
    f32 = np.float32
    fy = (np.arange(oh, dtype=f32) + f32(0.5)) * f32(h) / f32(oh) - f32(0.5)
    fx = (np.arange(ow, dtype=f32) + f32(0.5)) * f32(w) / f32(ow) - f32(0.5)
    y0, x0 = np.floor(fy).astype(np.int64), np.floor(fx).astype(np.int64)
    ya, yb = np.clip(y0, 0, h - 1), np.clip(y0 + 1, 0, h - 1)
    xa, xb = np.clip(x0, 0, w - 1), np.clip(x0 + 1, 0, w - 1)
    dy = (fy - np.floor(fy))[:, None]
    dx = (fx - np.floor(fx))[None, :]
    top = a[ya][:, xa] * (1 - dx) + a[ya][:, xb] * dx
    bot = a[yb][:, xa] * (1 - dx) + a[yb][:, xb] * dx
    return top * (1 - dy) + bot * dy


def test_lower_symbolic_bilinear_resize():
    from tilecraft.tensorir import interpret, te, transform
    A, B = _bilinear_kernel()
    f = transform.lower(te.create_prim_func([A, B]))
    assert [loops for _, loops in _asserts(f)] == [0, 0]  # "h >= 1", "w >= 1", once each
    rng = np.random.default_rng(1)
    for (hv, wv, ohv, owv) in ((3, 4, 7, 5), (6, 5, 2, 3), (1, 1, 2, 2)):
        a = rng.standard_normal((hv, wv)).astype("float32")
        b = np.zeros((ohv, owv), "float32")
        interpret(f, a, b, h=hv, w=wv, oh=ohv, ow=owv)
        np.testing.assert_allclose(b, _bilinear_numpy(a, ohv, owv), rtol=1e-5, atol=1e-5)


def test_verify_symbolic_div_extent_with_clamp():
    from tilecraft.tensorir import interpret, te, transform
    a, b, c = te.var("a"), te.var("b"), te.var("c")
    A = te.placeholder((a, b, c), "float32", "A")
    B = te.compute((a, b, floordiv(a * b * c, a * b * 8)),
                   lambda x, y, z: A[x, y, te.max(te.min(z * 8 - 1, c - 1), 0)], "B")
    f = transform.lower(te.create_prim_func([A, B]))
    assert [loops for _, loops in _asserts(f)] == [0]
    av, bv, cv = 2, 3, 21
    arr = np.random.default_rng(2).standard_normal((av, bv, cv)).astype("float32")
    out = np.zeros((av, bv, cv // 8), "float32")
    interpret(f, arr, out, a=av, b=bv, c=cv)
    np.testing.assert_array_equal(out, arr[:, :, np.clip(np.arange(cv // 8) * 8 - 1, 0, cv - 1)])


@settings(max_examples=200, deadline=None)
@given(bool_exprs(depth=2), st.integers(0, 1), st.booleans())
def test_simplify_bool_sound_with_symbolic_ranges(e, shape, clamp):
    # comparisons of min / max against symbolic bounds are split into cases: check the result
    a, b, c = VARS
    nn = var("n")
    if clamp:  # make the min / max interesting: clamp a var into [0, n)
        e = e.replace(a=_clamp(e.a, 0, nn - 1)) if type(e) in (LT, LE, GT, GE, EQ, NE) else e
    ana = arith.Analyzer()
    ana.update_bound(nn, 0, None)
    ana.bind(a, Range(0, nn + 2) if shape else Range(-1, 4))
    ana.bind(b, Range(0, nn))
    r = ana.simplify(e)
    rng = random.Random(1)
    for _ in range(120):
        p = {nn: rng.randint(0, 5), a: rng.randint(-1, 7), b: rng.randint(0, 5),
             c: rng.randint(-9, 9)}
        if not ((0 <= p[a] < p[nn] + 2) if shape else (-1 <= p[a] < 3)) or not p[b] < p[nn]:
            continue
        assert bool(evaluate(r, p)) == bool(evaluate(e, p)), (p,)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([Min, Max]), st.sampled_from([Min, Max]), st.integers(-1, 2),
       st.integers(-3, 3), st.integers(-2, 1), st.integers(-1, 2), st.integers(0, 3))
def test_lowered_clamp_checks_are_exact(outer, inner, scale, shift, c_hi, lo, extra):
    # A[outer(inner(i * scale + shift, n + c_hi), lo)] over i in [0, n + extra): whatever
    # the verifier proves, hoists or checks, running the kernel must fail exactly when an
    # index is out of bounds
    from tilecraft.tensorir import interpret, te, transform
    nn = te.var("n")
    A = te.placeholder((nn,), "float32", "A")

    def index(x):
        return outer(inner(x * scale + shift, nn + c_hi), IntImm(lo))

    B = te.compute((nn + extra,), lambda x: A[index(x)], "B")
    try:
        f = transform.lower(te.create_prim_func([A, B]))
    except transform.OutOfBoundsError:
        f = None
    pick = {Min: min, Max: max}
    for nv in range(0, 5):
        idx = [pick[outer](pick[inner](x * scale + shift, nv + c_hi), lo)
               for x in range(nv + extra)]
        ok = all(0 <= t < nv for t in idx)
        if f is None:  # provably out of bounds: only when it is so for every n that runs
            assert not ok or not idx
            continue
        a = np.arange(nv, dtype="float32") + 1
        out = np.zeros(nv + extra, "float32")
        if ok:
            interpret(f, a, out, n=nv)
            np.testing.assert_array_equal(out, a[idx] if idx else out)
        else:
            with pytest.raises((RuntimeError, IndexError)):
                interpret(f, a, out, n=nv)


def test_assume_reaches_every_new_analyzer():
    # a frontend's facts about its dims (a torch.export.Dim's range) make the shape inference
    # of every operator, which builds its own Analyzer, prove what they imply
    seq, n = var("seq"), var("n")
    clamp = arith.Analyzer().simplify  # made outside: knows nothing
    with arith.assume(seq <= 64, seq >= 0):
        ana = arith.Analyzer()
        assert ana.can_prove_equal(max_(min_(seq, 128), 0), seq)
        assert str(ana.simplify(min_(seq, 128))) == "seq"
        assert not ana.can_prove(seq <= 63)
        with arith.assume(n == seq * 2):            # contexts nest and add up
            assert arith.Analyzer().can_prove(n <= 128)
        assert not arith.Analyzer().can_prove(n <= 128)
    assert not arith.Analyzer().can_prove(seq <= 64)
    assert str(clamp(min_(seq, 128))) != "seq"
    with pytest.raises(Exception, match="bool"):
        with arith.assume(seq + 1):
            pass
