"""Helpers shared by the converter families (the kernels they emit themselves are in
``emit.py``)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import FloatImm, IntImm, PrimExpr

from .... import op as _op
from ....expr import Expr, const
from ..registry import ConversionError


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ConversionError(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    out = [norm_axis(int(a), rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise ConversionError(f"{what} {list(axes)} repeat a dimension")
    return out


def static_int(x) -> int | None:
    if isinstance(x, IntImm):
        return int(x.value)
    if isinstance(x, (int, np.integer)):
        return int(x)
    return None


def scalar(value, dtype: str) -> Expr:
    """A 0-d constant of ``dtype``."""
    return const(np.array(value, dtype=dt.to_numpy(dtype)))


def imm(value, dtype: str) -> PrimExpr:
    if dt.is_float(dtype):
        return FloatImm(float(value), dtype)
    return IntImm(int(value), dtype)


def cast(ctx, x: Expr, dtype: str) -> Expr:
    if ctx.dtype(x) == dtype:
        return x
    return ctx.emit(_op.astype(x, dtype))


def prod(dims):
    out = IntImm(1, "int64")
    for d in dims:
        out = out * d
    return out

