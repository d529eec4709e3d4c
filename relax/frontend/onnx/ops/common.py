"""Helpers shared by the converter families."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import FloatImm, IntImm, PrimExpr

from .... import op as _op
from ....expr import Expr, const
from ....op.helpers import broadcast_index, broadcast_shapes, call_te, out_name
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


def emit_map(ctx, fcompute: Callable, *inputs: Expr, dtype: str | None = None,
             name: str = "map", opaque: bool = False) -> Expr:
    """An elementwise kernel over broadcast ``inputs``: ``out[i] = fcompute(*[x[i] ...])``,
    for operations the Relax operator set lacks (``Atan``, ``IsNaN``, bitwise ops).
    ``opaque``: never fused with its neighbours (for long expressions that use their input
    many times: fusion would inline the producer into every use)."""
    shapes = [ctx.shape(x) for x in inputs]
    out_shape = broadcast_shapes(name, *shapes)
    out_dtype = dtype or ctx.dtype(inputs[0])

    def kernel(*ts):
        def body(*idx):
            vals = [t[broadcast_index(idx, t.shape, out_shape)] for t in ts]
            return fcompute(*vals)
        return te.compute(out_shape, body, out_name(name, *ts))
    call = call_te(ctx.bb, kernel, *inputs, primfunc_name_hint=name)
    if opaque:
        mark_opaque(ctx, call)
    return ctx.emit(call, name)


def mark_opaque(ctx, call) -> None:
    """Give the kernel ``call`` calls the OPAQUE fusion pattern."""
    from ....op.base import OpPattern
    gvar = call.args[0]
    func = ctx.bb._funcs[gvar.name_hint]
    ctx.bb.update_func(gvar, func.with_attr("op_pattern", int(OpPattern.OPAQUE)))


def cast(ctx, x: Expr, dtype: str) -> Expr:
    if ctx.dtype(x) == dtype:
        return x
    return ctx.emit(_op.astype(x, dtype))


def prod(dims):
    out = IntImm(1, "int64")
    for d in dims:
        out = out * d
    return out


def emit_kernel(ctx, te_func: Callable, *args, name: str = "kernel", scalars=(), **kwargs) -> Expr:
    """``te_func`` (tensor arguments become te placeholders) as a kernel call, emitted; symbolic
    dims that no input binds (output sizes from ``runtime_dims``) become scalar parameters."""
    return ctx.emit(call_te(ctx.bb, te_func, *args, scalars=scalars, primfunc_name_hint=name,
                            **kwargs), name)
