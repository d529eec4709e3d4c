"""Kernels the ONNX converters emit themselves, for operations the Relax operator set lacks:
``emit_map`` (an elementwise kernel), ``emit_kernel`` (any te function) and ``mark_opaque``.

The converters (``ops/``) and the low-bit type conversions (``lowbit.py``) use them.
"""
from __future__ import annotations

from typing import Callable

from tilecraft.tensorir import te

from ...expr import Expr, OpPattern
from ...op.helpers import broadcast_index, broadcast_shapes, call_te, out_name

__all__ = ["emit_map", "emit_kernel", "mark_opaque"]


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


def emit_kernel(ctx, te_func: Callable, *args, name: str = "kernel", scalars=(), **kwargs) -> Expr:
    """``te_func`` (tensor arguments become te placeholders) as a kernel call, emitted; symbolic
    dims that no input binds (output sizes from ``runtime_dims``) become scalar parameters."""
    return ctx.emit(call_te(ctx.bb, te_func, *args, scalars=scalars, primfunc_name_hint=name,
                            **kwargs), name)


def mark_opaque(ctx, call) -> None:
    """Give the kernel ``call`` calls the OPAQUE fusion pattern."""
    gvar = call.args[0]
    func = ctx.bb._funcs[gvar.name_hint]
    ctx.bb.update_func(gvar, func.with_attr("op_pattern", int(OpPattern.OPAQUE)))
