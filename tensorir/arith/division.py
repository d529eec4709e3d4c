"""Integer floor division for code generators: the one non-negativity test, and ``floordiv`` /
``floormod`` in terms of the truncating division of C, OpenCL C, WGSL and LLVM.

TensorIR's ``FloorDiv`` / ``FloorMod`` round toward minus infinity (Python's ``//`` and ``%``);
the hardware and the C-like languages truncate toward zero (``Div`` / ``Mod``). The two agree
when both operands are non-negative, which is nearly always the case for index arithmetic, so
every generator asks the same questions here:

* ``is_nonneg(e, analyzer)``: is the integer ``e`` provably ``>= 0`` under what the analyzer
  knows (loop and thread ranges, let values, conditions, non-negative shape variables)?
* ``floor_is_trunc(e, analyzer)``: does ``FloorDiv`` / ``FloorMod`` node ``e`` equal its truncating
  ``Div`` / ``Mod``?  Yes when both operands are provably non-negative (a divisor of zero is
  outside the domain of integer division: the interpreter raises, and every generator spells
  ``Div`` and the general form alike there);
* ``lower_floor_divmod(e, analyzer)``: ``e`` as truncating division: ``Div`` / ``Mod`` where
  ``floor_is_trunc``, else ``floor_divmod_general(e)``;
* ``floor_divmod_general(e)``: the form right for all signs, from one truncating quotient ``q``
  and remainder ``r``: ``floordiv = q - (r != 0 and (r < 0) != (b < 0))`` and
  ``floormod = r + b`` under the same condition, else ``r`` (the test shrinks to ``r < 0`` /
  ``r > 0`` when the divisor is a positive / negative constant).

The C-like generators print the general form once per program, as the body of a helper function
(``tc_floordiv_int``); LLVM emits it inline.

Examples
--------
>>> from tilecraft.tensorir import var, Range
>>> from tilecraft.tensorir.arith import Analyzer
>>> i, k = var("i"), var("k")
>>> ana = Analyzer()
>>> ana.bind(i, Range(0, 16))
>>> lower_floor_divmod(i // 4, ana)
T.truncdiv(i, 4)
>>> floor_is_trunc((i - 8) // 4, ana)
False
>>> lower_floor_divmod(k % 4, ana)
T.Let(T.Select(r < 0, r + 4, r), where={r: T.truncmod(k, 4)})
"""
from __future__ import annotations

from .. import dtype as dt
from ..expr import (GT, LT, NE, And, Cast, Div, FloorDiv, FloorMod, IntImm, Let, Mod, PrimExpr,
                    Select, Sub, TIRError, Var)
from .analyzer import Analyzer


def is_nonneg(e: PrimExpr, analyzer: Analyzer | None = None) -> bool:
    """Whether integer (or bool) ``e`` is provably ``>= 0`` under ``analyzer``'s facts.

    Unsigned integers and bools always are; floats never count (this is about integer division).

    Examples
    --------
    >>> from tilecraft.tensorir import var, Range
    >>> from tilecraft.tensorir.arith import Analyzer
    >>> i = var("i")
    >>> ana = Analyzer()
    >>> ana.bind(i, Range(0, 8))
    >>> is_nonneg(i - 1, ana), is_nonneg(i * 2 + 1, ana)
    (False, True)
    """
    if dt.is_bool(e.dtype) or dt.is_uint(e.dtype):
        return True
    if not dt.is_int(e.dtype):
        return False
    try:
        return (analyzer or Analyzer()).const_int_bound(e).min_value >= 0
    except TIRError:
        return False


def floor_is_trunc(e: FloorDiv | FloorMod, analyzer: Analyzer | None = None) -> bool:
    """Whether integer ``FloorDiv`` / ``FloorMod`` ``e`` equals the truncating ``Div`` / ``Mod``
    of its operands: both provably non-negative."""
    _check(e)
    return is_nonneg(e.a, analyzer) and is_nonneg(e.b, analyzer)


def lower_floor_divmod(e: FloorDiv | FloorMod, analyzer: Analyzer | None = None) -> PrimExpr:
    """Integer ``FloorDiv`` / ``FloorMod`` ``e`` in terms of truncating ``Div`` / ``Mod``: the
    plain ``Div`` / ``Mod`` where ``floor_is_trunc(e, analyzer)``, else the general form."""
    _check(e)
    if floor_is_trunc(e, analyzer):
        return (Div if isinstance(e, FloorDiv) else Mod)(e.a, e.b)
    return floor_divmod_general(e)


def floor_divmod_general(e: FloorDiv | FloorMod) -> PrimExpr:
    """``e`` for operands of any sign, from the truncating quotient and remainder.

    Operands that are not a variable or a constant are bound by ``Let`` once (a generator that
    evaluates lets computes each once); so are the remainder and the quotient.
    """
    _check(e)
    a, b = e.a, e.b
    body_vars = []

    def bind(name, value):
        if isinstance(value, (Var, IntImm)):
            return value
        v = Var(name, value.dtype)
        body_vars.append((v, value))
        return v

    a = bind("a", a)
    b = bind("b", b)
    r = bind("r", Mod(a, b))
    zero = IntImm(0, e.dtype)
    c = b.value if isinstance(b, IntImm) else None
    if c is not None and c > 0:
        adjust = LT(r, zero)        # r has the sign of a: a negative remainder rounds down
    elif c is not None and c < 0:
        adjust = GT(r, zero)
    else:
        adjust = And(NE(r, zero), NE(LT(r, zero), LT(b, zero)))
    if isinstance(e, FloorDiv):
        out = Sub(bind("q", Div(a, b)), Cast(e.dtype, adjust))
    else:
        out = Select(adjust, r + b, r)
    for v, value in reversed(body_vars):
        out = Let(v, value, out)
    return out


def _check(e):
    if not isinstance(e, (FloorDiv, FloorMod)) or not dt.is_integer(e.dtype):
        raise TIRError(f"expected an integer FloorDiv or FloorMod, got {e!r}", e)


__all__ = ["is_nonneg", "floor_is_trunc", "lower_floor_divmod", "floor_divmod_general"]
