"""arith.division: the non-negativity test every code generator asks, and floor division as
truncating division. The general form is checked through the interpreter (which divides like
C) against numpy's floor division, on random operands of every sign; the test itself on the
cases where the generators' three former versions disagreed."""
import numpy as np
import pytest

from tilecraft.tensorir import Range, arith, te, var
from tilecraft.tensorir.expr import (Cast, Div, FloorDiv, FloorMod, IntImm, Let, Max, Min, Mod,
                                     TIRError)
from tilecraft.tensorir.interpret import interpret

RNG = np.random.default_rng(7)


def _ana(**ranges):
    ana = arith.Analyzer()
    vs = {}
    for name, (lo, ext) in ranges.items():
        vs[name] = var(name, "int32")
        ana.bind(vs[name], Range(IntImm(lo, "int32"), IntImm(ext, "int32")))
    return ana, vs


def test_is_nonneg_uses_the_facts_of_the_analyzer():
    ana, v = _ana(i=(0, 16), k=(1, 15))
    i, k = v["i"], v["k"]
    assert arith.is_nonneg(i, ana) and arith.is_nonneg(i * 3 + k, ana)
    assert not arith.is_nonneg(i - 1, ana)
    assert arith.is_nonneg(i - 1 + k, ana)                  # k >= 1: a symbolic fact
    assert arith.is_nonneg(Max(i - 4, IntImm(0, "int32")), ana)
    assert not arith.is_nonneg(Min(i - 4, IntImm(0, "int32")), ana)
    assert arith.is_nonneg(FloorMod(i - 8, IntImm(4, "int32")), ana)   # floormod by c > 0
    assert not arith.is_nonneg(Mod(i - 8, IntImm(4, "int32")), ana)    # truncmod: sign of a
    n = var("n", "int32")
    assert not arith.is_nonneg(n)                           # nothing known
    ana.update_bound(n, 0, None)                            # a shape size
    assert arith.is_nonneg(n, ana)


def test_is_nonneg_of_a_narrowing_cast_is_false_where_it_wraps():
    # LLVM's former syntactic test called Cast(int8, i) non-negative because i is: wrong for
    # i >= 128 (the byte wraps to a negative value)
    ana, v = _ana(i=(0, 256), j=(0, 100))
    assert not arith.is_nonneg(Cast("int8", v["i"]), ana)
    assert arith.is_nonneg(Cast("int8", v["j"]), ana)       # 0..99 fits: no wrap
    assert arith.is_nonneg(Cast("int64", v["i"]), ana)      # widening


def test_is_nonneg_by_dtype():
    assert arith.is_nonneg(var("u", "uint32")) and arith.is_nonneg(var("b", "bool"))
    assert not arith.is_nonneg(var("f", "float32"))


def test_floor_is_trunc_needs_both_operands_nonneg():
    ana, v = _ana(i=(0, 64), j=(-8, 16))
    i, j = v["i"], v["j"]
    four = IntImm(4, "int32")
    assert arith.floor_is_trunc(FloorDiv(i, four), ana)
    assert not arith.floor_is_trunc(FloorDiv(j, four), ana)
    assert not arith.floor_is_trunc(FloorDiv(i, IntImm(-4, "int32")), ana)
    n = var("n", "int32")
    assert not arith.floor_is_trunc(FloorMod(i, n), ana)   # the divisor's sign is unknown
    ana.update_bound(n, 0, None)
    assert arith.floor_is_trunc(FloorMod(i, n), ana)       # a symbolic size divides like C
    assert isinstance(arith.lower_floor_divmod(FloorDiv(i, n), ana), Div)
    assert isinstance(arith.lower_floor_divmod(FloorMod(i, n), ana), Mod)
    with pytest.raises(TIRError, match="integer FloorDiv or FloorMod"):
        arith.floor_is_trunc(Div(i, four), ana)


def test_general_form_binds_its_operands_once():
    a, b = var("a", "int32"), var("b", "int32")
    e = arith.floor_divmod_general(FloorDiv(a * 2 + 1, b - 3))
    lets = []
    while isinstance(e, Let):
        lets.append(e.var.name)
        e = e.body
    assert lets == ["a", "b", "r", "q"]


@pytest.mark.parametrize("dtype", ["int32", "int8", "int64"])
@pytest.mark.parametrize("divisor", ["data", 7, -3, 1, -1])
def test_general_form_is_floor_division(dtype, divisor):
    n = 257
    lo, hi = (-120, 120) if dtype == "int8" else (-1000, 1000)
    a = RNG.integers(lo, hi, n).astype(dtype)
    a[:3] = [0, lo, hi - 1]
    b = RNG.integers(1, 12, n).astype(dtype) * RNG.choice([-1, 1], n).astype(dtype)
    A = te.placeholder((n,), dtype, "A")
    B = te.placeholder((n,), dtype, "B")

    def d(i):
        return B[i] if divisor == "data" else IntImm(divisor, dtype)

    Q = te.compute((n,), lambda i: arith.floor_divmod_general(FloorDiv(A[i] + IntImm(0, dtype),
                                                                       d(i))), "Q")
    R = te.compute((n,), lambda i: arith.floor_divmod_general(FloorMod(A[i] + IntImm(0, dtype),
                                                                       d(i))), "R")
    q, r = np.zeros(n, dtype), np.zeros(n, dtype)
    interpret(te.create_prim_func([A, B, Q, R]), a, b, q, r)
    dv = b if divisor == "data" else np.full(n, divisor, dtype)
    np.testing.assert_array_equal(q, a // dv)
    np.testing.assert_array_equal(r, a % dv)


def test_lower_keeps_truncating_division_where_it_is_floor():
    ana, v = _ana(i=(0, 64))
    i = v["i"]
    n = 64
    A = te.placeholder((n,), "int32", "A")
    # (i - 32) may be negative: the general form; i // 5 is truncating division
    for e, expect_div in ((FloorDiv(i, IntImm(5, "int32")), True),
                          (FloorDiv(i - 32, IntImm(5, "int32")), False)):
        low = arith.lower_floor_divmod(e, ana)
        assert isinstance(low, Div) == expect_div
    Q = te.compute((n,), lambda j: A[j] + arith.lower_floor_divmod(
        FloorDiv(j.astype("int32") - 32, IntImm(5, "int32")), ana), "Q")
    a = np.zeros(n, "int32")
    q = np.zeros(n, "int32")
    interpret(te.create_prim_func([A, Q]), a, q)
    np.testing.assert_array_equal(q, (np.arange(n) - 32) // 5)
