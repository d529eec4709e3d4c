"""Kernels the ONNX converters emit themselves, for operations the Relax operator set lacks:
``emit_map`` (an elementwise kernel), ``emit_kernel`` (any te function),
``emit_checked_kernel`` (one that checks the values it reads) and ``mark_opaque``.

The converters (``ops/``) and the low-bit type conversions (``lowbit.py``) use them.
"""
from __future__ import annotations

from typing import Callable, Sequence

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import Cast, IntImm
from tilecraft.tensorir.stmt import AssertStmt

from ...expr import Expr, OpPattern
from ...op.helpers import broadcast_index, broadcast_shapes, call_prim, call_te, out_name
from ...struct_info import TensorStructInfo

__all__ = ["emit_map", "emit_kernel", "emit_checked_kernel", "mark_opaque"]


def emit_map(ctx, fcompute: Callable, *inputs: Expr, dtype: str | None = None,
             name: str = "map", opaque: bool = False) -> Expr:
    """An elementwise kernel over broadcast ``inputs``: ``out[i] = fcompute(*[x[i] ...])``,
    for operations the Relax operator set lacks (``Atan``, ``IsNaN``, bitwise ops).
    ``opaque``: never fused with its neighbours (for long expressions that use their input
    many times: fusion would inline the producer into every use). ``dtype``: the output's
    dtype (``fcompute``'s result is cast to it); None keeps ``fcompute``'s."""
    shapes = [ctx.shape(x) for x in inputs]
    out_shape = broadcast_shapes(name, *shapes)

    def kernel(*ts):
        def body(*idx):
            vals = [t[broadcast_index(idx, t.shape, out_shape)] for t in ts]
            value = fcompute(*vals)
            return value if dtype is None or value.dtype == dtype else Cast(dtype, value)
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


def emit_checked_kernel(ctx, te_func: Callable, *args: Expr, name: str = "kernel",
                        scalars: Sequence = ()) -> Expr:
    """A kernel that checks values it reads: ``te_func(*placeholders)`` returns ``(out,
    checks)``, ``out`` a te tensor (or a list of them: the call is then a tuple) and ``checks``
    ``(condition, message)`` pairs over the placeholders (``a[0] < 3``), asserted when the
    kernel starts: a failed one stops the call with ``message`` (a Python exception of the
    VM), as ONNX runtimes refuse an axis out of range. ``scalars``: symbolic values the body
    uses that no buffer shape binds (sizes from ``runtime_dims``)."""
    phs = [te.placeholder(ctx.shape(a), ctx.dtype(a), f"in{k}") for k, a in enumerate(args)]
    out, checks = te_func(*phs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    scalars = [v for v in scalars if not isinstance(v, IntImm)]
    func = te.create_prim_func(phs + outs + scalars)
    root_realize = func.body
    root = root_realize.block
    body = root.body
    for cond, message in reversed(list(checks)):
        body = AssertStmt(cond, message, body)
    func = func.replace(body=root_realize.replace(block=root.replace(body=body)))
    sinfo = [TensorStructInfo(tuple(o.shape), o.dtype) for o in outs]
    call = call_prim(ctx.bb, func, name, list(args), sinfo if len(sinfo) > 1 else sinfo[0],
                     tir_vars=scalars)
    return ctx.emit(call, name)


def mark_opaque(ctx, call) -> None:
    """Give the kernel ``call`` calls the OPAQUE fusion pattern."""
    gvar = call.args[0]
    func = ctx.bb._funcs[gvar.name_hint]
    ctx.bb.update_func(gvar, func.with_attr("op_pattern", int(OpPattern.OPAQUE)))
