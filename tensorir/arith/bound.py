"""Constant integer intervals with infinities: ``ConstIntBound`` and the arithmetic on them.

Bounds are Python ints. ``ConstIntBound.POS_INF`` (``2**63 - 1``) and ``ConstIntBound.NEG_INF``
(``-2**63``) stand for "no bound": a value at or beyond them is treated as infinite, as in TVM,
so an unconstrained ``int64`` variable is unbounded on both sides. Arithmetic assumes no
overflow (the usual premise of index analysis): ``x + 1`` of an ``int32`` ``x`` below ``2**31 - 1``
is bounded by ``2**31``, not wrapped.
"""
from __future__ import annotations

from .const_fold import truncdiv

POS_INF = 2 ** 63 - 1
NEG_INF = -(2 ** 63)


class ConstIntBound:
    """Inclusive constant bounds ``[min_value, max_value]`` of an integer expression.

    ``min_value == ConstIntBound.NEG_INF`` means unbounded below, ``max_value ==
    ConstIntBound.POS_INF`` unbounded above.

    Examples
    --------
    >>> from tilecraft.tensorir import var, Range
    >>> from tilecraft.tensorir import arith
    >>> i = var("i")
    >>> b = arith.const_int_bound(i * 4 + 3, {i: Range(0, 8)})
    >>> (b.min_value, b.max_value)
    (3, 31)
    """

    POS_INF = POS_INF
    NEG_INF = NEG_INF
    __slots__ = ("min_value", "max_value")

    def __init__(self, min_value: int, max_value: int):
        self.min_value = clamp(int(min_value))
        self.max_value = clamp(int(max_value))

    def is_const(self, value: int | None = None) -> bool:
        """A single known value (that value, if given)."""
        return (self.min_value == self.max_value and not is_inf(self.min_value)
                and (value is None or self.min_value == value))

    def is_everything(self) -> bool:
        return self.min_value == NEG_INF and self.max_value == POS_INF

    def is_non_negative(self) -> bool:
        return self.min_value >= 0

    def is_positive(self) -> bool:
        return self.min_value > 0

    def __contains__(self, value: int) -> bool:
        return self.min_value <= value <= self.max_value

    def __eq__(self, other):
        if isinstance(other, ConstIntBound):
            return (self.min_value, self.max_value) == (other.min_value, other.max_value)
        if isinstance(other, tuple):
            return (self.min_value, self.max_value) == other
        return NotImplemented

    def __hash__(self):
        return hash((self.min_value, self.max_value))

    def __iter__(self):
        yield self.min_value
        yield self.max_value

    def __repr__(self):
        lo = "-inf" if self.min_value == NEG_INF else str(self.min_value)
        hi = "+inf" if self.max_value == POS_INF else str(self.max_value)
        return f"ConstIntBound[{lo}, {hi}]"


# ---------------------------------------------------------------------------------------------
# infinity-aware helpers on plain ints (values clamped to the sentinels)


def clamp(x: int) -> int:
    if x >= POS_INF:
        return POS_INF
    if x <= NEG_INF:
        return NEG_INF
    return x


def is_inf(x: int) -> bool:
    return x >= POS_INF or x <= NEG_INF


def add(a: int, b: int, upper: bool = False) -> int:
    """``a + b``; an infinite operand wins. ``+inf + -inf`` (only from an empty interval) gives
    the conservative side: ``+inf`` for an upper bound, ``-inf`` for a lower one."""
    if a >= POS_INF or b >= POS_INF:
        if a <= NEG_INF or b <= NEG_INF:
            return POS_INF if upper else NEG_INF
        return POS_INF
    if a <= NEG_INF or b <= NEG_INF:
        return NEG_INF
    return clamp(a + b)


def mul(a: int, b: int) -> int:
    if a == 0 or b == 0:
        return 0
    if is_inf(a) or is_inf(b):
        return POS_INF if (a > 0) == (b > 0) else NEG_INF
    return clamp(a * b)


def scale(lo: int, hi: int, c: int) -> tuple[int, int]:
    """``[lo, hi] * c`` for a constant ``c``."""
    if c >= 0:
        return mul(lo, c), mul(hi, c)
    return mul(hi, c), mul(lo, c)


def mul_interval(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    ps = (mul(a[0], b[0]), mul(a[0], b[1]), mul(a[1], b[0]), mul(a[1], b[1]))
    return min(ps), max(ps)


def _div_scalar(x: int, y: int, floor: bool) -> int:
    """``x / y`` rounded, for finite ``y > 0``; infinities stay infinite."""
    if is_inf(x):
        return x
    return x // y if floor else truncdiv(x, y)


def div_interval(a: tuple[int, int], b: tuple[int, int], floor: bool) -> tuple[int, int]:
    """Bounds of ``a // b`` (floor) or ``truncdiv(a, b)``; everything if ``b`` may be zero."""
    xlo, xhi = a
    ylo, yhi = b
    if ylo <= 0 <= yhi:
        return NEG_INF, POS_INF
    if yhi < 0:  # x / y == (-x) / (-y), for both roundings
        xlo, xhi = neg(xhi), neg(xlo)
        ylo, yhi = neg(yhi), neg(ylo)
    # y in [ylo, yhi], 0 < ylo: the quotient moves towards 0 (or -1 for floor of negatives) as y
    # grows, so the extremes are at the smallest y for the far side and the largest y otherwise.
    def at_large_y(x):
        if yhi >= POS_INF:
            return -1 if (floor and x < 0) else 0
        return _div_scalar(x, yhi, floor)

    lo = _div_scalar(xlo, ylo, floor) if xlo < 0 else at_large_y(xlo)
    hi = _div_scalar(xhi, ylo, floor) if xhi >= 0 else at_large_y(xhi)
    return lo, hi


def neg(x: int) -> int:
    if x >= POS_INF:
        return NEG_INF
    if x <= NEG_INF:
        return POS_INF
    return -x


def intersect(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return max(a[0], b[0]), min(a[1], b[1])


def union(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return min(a[0], b[0]), max(a[1], b[1])


EVERYTHING = (NEG_INF, POS_INF)
