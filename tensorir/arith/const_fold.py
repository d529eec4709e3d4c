"""Constant folding: evaluate one operator on immediates with the exact semantics of its dtype.

Integers follow C / TVM semantics: ``Div`` and ``Mod`` truncate towards zero, ``FloorDiv`` and
``FloorMod`` round towards minus infinity (Python ``//`` and ``%``), results wrap to the width of
the dtype. Floats are computed in their own precision through numpy scalars, so a folded
``float32`` expression gives the bits the generated code would compute. Division by an integer
zero is never folded (the program's behaviour there is the target's business, not ours).

    >>> from tilecraft.tensorir import IntImm
    >>> fold_binary(FloorDiv, IntImm(-7), IntImm(2)).value
    -4
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtype as dt
from ..expr import (EQ, GE, GT, LE, LT, NE, Add, And, Div, FloatImm, FloorDiv, FloorMod, IntImm,
                    Max, Min, Mod, Mul, Or, PrimExpr, Sub)

# --------------------------------------------------------------------------------------------
# integer semantics on Python ints


def truncdiv(a: int, b: int) -> int:
    """C division: rounds towards zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def truncmod(a: int, b: int) -> int:
    """C remainder: has the sign of the dividend."""
    return a - b * truncdiv(a, b)


_INT_INFO: dict[str, tuple] = {}


def _int_info(dtype: str) -> tuple:
    """(code, bits, lo, hi) of an integer or bool dtype, cached: this is on every hot path."""
    info = _INT_INFO.get(dtype)
    if info is None:
        code, bits, _ = dt.parse(dtype)
        if code == "bool":
            lo, hi = 0, 1
        elif code == "uint":
            lo, hi = 0, (1 << bits) - 1
        else:
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        info = _INT_INFO[dtype] = (code, bits, lo, hi)
    return info


def wrap_int(value: int, dtype: str) -> int:
    """``value`` reduced to the range of the integer (or bool) ``dtype`` (two's complement)."""
    code, bits, lo, hi = _int_info(dtype)
    if lo <= value <= hi:
        return value
    if code == "bool":
        return 1 if value else 0
    value &= (1 << bits) - 1
    if code == "int" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def int_range(dtype: str) -> tuple[int, int]:
    """Inclusive value range of an integer or bool dtype."""
    info = _int_info(dtype)
    return info[2], info[3]


def _np_float(value: float, dtype: str):
    return np.dtype(dt.element_of(dtype)).type(value)


_INT_BINARY = {
    Add: lambda a, b: a + b,
    Sub: lambda a, b: a - b,
    Mul: lambda a, b: a * b,
    Min: min,
    Max: max,
}
_CMP = {
    EQ: lambda a, b: a == b,
    NE: lambda a, b: a != b,
    LT: lambda a, b: a < b,
    LE: lambda a, b: a <= b,
    GT: lambda a, b: a > b,
    GE: lambda a, b: a >= b,
}


def fold_binary(op: type, a: PrimExpr, b: PrimExpr) -> PrimExpr | None:
    """The immediate ``op(a, b)`` if both are immediates and it can be folded, else None."""
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        x, y, d = a.value, b.value, a.dtype
        if op in _CMP:
            return IntImm(int(_CMP[op](x, y)), dt.with_lanes("bool", dt.lanes(d)))
        if op is And:
            return IntImm(int(bool(x) and bool(y)), d)
        if op is Or:
            return IntImm(int(bool(x) or bool(y)), d)
        if op in _INT_BINARY:
            return IntImm(wrap_int(_INT_BINARY[op](x, y), d), d)
        if y == 0:
            return None
        if op is FloorDiv:
            return IntImm(wrap_int(x // y, d), d)
        if op is FloorMod:
            return IntImm(wrap_int(x % y, d), d)
        if op is Div:
            return IntImm(wrap_int(truncdiv(x, y), d), d)
        if op is Mod:
            return IntImm(wrap_int(truncmod(x, y), d), d)
        return None
    if isinstance(a, FloatImm) and isinstance(b, FloatImm):
        d = a.dtype
        x, y = _np_float(a.value, d), _np_float(b.value, d)
        with np.errstate(all="ignore"):
            if op in _CMP:
                return IntImm(int(bool(_CMP[op](x, y))), dt.with_lanes("bool", dt.lanes(d)))
            if op is Add:
                r = x + y
            elif op is Sub:
                r = x - y
            elif op is Mul:
                r = x * y
            elif op is Div:
                r = x / y
            elif op is Min:
                r = np.minimum(x, y)
            elif op is Max:
                r = np.maximum(x, y)
            elif op is FloorDiv:
                r = np.floor(x / y)
            elif op is FloorMod:
                r = x - np.floor(x / y) * y
            elif op is Mod:
                r = np.fmod(x, y)
            else:
                return None
        return FloatImm(float(_np_float(r, d)), d)
    return None


def fold_cast(dtype: str, value: PrimExpr) -> PrimExpr | None:
    """The immediate ``Cast(dtype, value)`` for an immediate ``value``, else None."""
    if dt.lanes(dtype) != 1 or not isinstance(value, (IntImm, FloatImm)):
        return None
    if dt.is_float(dtype):
        with np.errstate(all="ignore"):
            return FloatImm(float(_np_float(value.value, dtype)), dtype)
    if dt.is_bool(dtype):
        return IntImm(int(value.value != 0), dtype)
    if not dt.is_integer(dtype):
        return None
    v = value.value
    if isinstance(value, FloatImm):
        if not math.isfinite(v):
            return None  # undefined in C; leave it to the target
        v = int(v)  # truncates towards zero, like C
        lo, hi = int_range(dtype)
        if not lo <= v <= hi:
            return None
    return IntImm(wrap_int(v, dtype), dtype)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_FLOAT_INTRINSICS = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tanh": np.tanh, "sigmoid": _sigmoid, "fabs": np.abs, "floor": np.floor, "ceil": np.ceil,
    "sin": np.sin, "cos": np.cos, "exp2": np.exp2, "log2": np.log2,
    "trunc": np.trunc, "pow": np.power,
    "erf": lambda x: math.erf(float(x)),
}


def fold_intrinsic(op: str, dtype: str, args) -> PrimExpr | None:
    """Fold a float intrinsic (``exp``, ``sqrt``, ...) whose arguments are all FloatImms.

    ``round`` is not folded: back ends disagree on halfway cases (away from zero or to even).
    """
    fn = _FLOAT_INTRINSICS.get(op)
    if fn is None or not dt.is_float(dtype) or dt.lanes(dtype) != 1:
        return None
    if not all(isinstance(a, FloatImm) and a.dtype == dtype for a in args):
        return None
    with np.errstate(all="ignore"):
        r = fn(*[_np_float(a.value, dtype) for a in args])
    return FloatImm(float(_np_float(r, dtype)), dtype)


def fold_add(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """``a + b`` with the constant cases folded (keeps lowered IR readable before Simplify)."""
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return IntImm(a.value + b.value, a.dtype)
    if isinstance(a, IntImm) and a.value == 0:
        return b
    if isinstance(b, IntImm) and b.value == 0:
        return a
    return a + b


def fold_mul(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """``a * b`` with the constant cases folded."""
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return IntImm(a.value * b.value, a.dtype)
    if isinstance(a, IntImm) and a.value == 1:
        return b
    if isinstance(b, IntImm) and b.value == 1:
        return a
    if (isinstance(a, IntImm) and a.value == 0) or (isinstance(b, IntImm) and b.value == 0):
        return IntImm(0, a.dtype)
    return a * b
