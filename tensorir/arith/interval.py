"""Symbolic integer intervals: ``IntervalSet``, the result of ``Analyzer.int_set``.

An unbounded side is one of the two marker variables ``IntervalSet.NEG_INF`` / ``POS_INF`` (Vars
named ``neg_inf`` / ``pos_inf``, as TVM's ``SymbolicLimits``); test for them with
``has_lower_bound()`` / ``has_upper_bound()`` before using a bound in code. Set operations that
need simplification (``union``, ``intersect``, ``to_range``) live on ``Analyzer``.
"""
from __future__ import annotations

from ..expr import IntImm, Var, convert
from ..structural import structural_equal

NEG_INF = Var("neg_inf")
POS_INF = Var("pos_inf")


def _end(e):
    return e if e is NEG_INF or e is POS_INF else convert(e)


class IntervalSet:
    """The integers ``[min_value, max_value]`` (inclusive, symbolic).

    Examples
    --------
    >>> from tilecraft.tensorir import var, Range
    >>> from tilecraft.tensorir import arith
    >>> i, j = var("i"), var("j")
    >>> s = arith.Analyzer().int_set(i * 4 + j, {i: Range(0, 8), j: Range(0, 4)})
    >>> (s.min_value.value, s.max_value.value)
    (0, 31)
    """

    NEG_INF = NEG_INF
    POS_INF = POS_INF
    __slots__ = ("min_value", "max_value")

    def __init__(self, min_value, max_value):
        self.min_value = _end(min_value)
        self.max_value = _end(max_value)

    # constructors
    @staticmethod
    def everything() -> "IntervalSet":
        return IntervalSet(NEG_INF, POS_INF)

    @staticmethod
    def empty() -> "IntervalSet":
        return IntervalSet(POS_INF, NEG_INF)

    @staticmethod
    def single_point(value) -> "IntervalSet":
        value = convert(value)
        return IntervalSet(value, value)

    @staticmethod
    def interval(min_value, max_value) -> "IntervalSet":
        return IntervalSet(min_value, max_value)

    # queries
    def has_lower_bound(self) -> bool:
        return self.min_value is not NEG_INF and self.min_value is not POS_INF

    def has_upper_bound(self) -> bool:
        return self.max_value is not POS_INF and self.max_value is not NEG_INF

    def is_bounded(self) -> bool:
        return self.has_lower_bound() and self.has_upper_bound()

    def is_everything(self) -> bool:
        return self.min_value is NEG_INF and self.max_value is POS_INF

    def is_empty(self) -> bool:
        if self.min_value is POS_INF or self.max_value is NEG_INF:
            return True
        lo, hi = self.min_value, self.max_value
        return isinstance(lo, IntImm) and isinstance(hi, IntImm) and lo.value > hi.value

    def is_single_point(self) -> bool:
        return self.is_bounded() and structural_equal(self.min_value, self.max_value)

    def __repr__(self):
        def show(e):
            if e is NEG_INF:
                return "-inf"
            if e is POS_INF:
                return "+inf"
            return repr(e)
        return f"IntervalSet[{show(self.min_value)}, {show(self.max_value)}]"
