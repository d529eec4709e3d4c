"""Helpers shared by the converter families."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import FloatImm, IntImm, PrimExpr
from tilecraft.tensorir.stmt import AssertStmt

from .... import op as _op
from ....expr import Expr, const
from ....op._broadcast import broadcast_index, broadcast_shapes, out_name
from ....op.manipulate import _call_prim, _call_te, _prim_func

# hand-written kernels: a PrimFunc over buffers whose root block runs a statement, and its call
# (shape variables no argument binds become scalar parameters)
prim_func = _prim_func
call_prim = _call_prim
from ....struct_info import TensorStructInfo
from ..known import as_int
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
    call = _call_te(ctx.bb, kernel, *inputs, name=name)
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
    return ctx.emit(_call_te(ctx.bb, te_func, *args, scalars=scalars, name=name, **kwargs), name)


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
    call = _call_prim(ctx.bb, func, name, list(args), sinfo if len(sinfo) > 1 else sinfo[0],
                      tir_vars=scalars)
    return ctx.emit(call, name)


def int_vector(ctx, values) -> Expr:
    """A 1-D int64 tensor of ints / PrimExprs (symbolic dims)."""
    arr = np.empty(len(values), dtype=object)
    arr[:] = [as_int(v) for v in values]
    if all(isinstance(v, int) for v in arr):
        return const(np.array(list(arr), dtype=np.int64))
    return ctx.materialize(arr, "int64")


def runtime_ints(ctx, node, i, what) -> Expr:
    """Input ``i`` as a 1-D int64 tensor (computed at run time; a scalar becomes one entry)."""
    x = ctx.input(node, i)
    if len(ctx.shape(x)) == 0:
        x = ctx.emit(_op.reshape(x, (1,)))
    return cast(ctx, x, "int64")


def static_length(ctx, x: Expr, what: str) -> int:
    """The length of a 1-D tensor, which must be static (it sets a rank or a count)."""
    shape = ctx.shape(x, what)
    n = static_int(shape[0]) if len(shape) == 1 else None
    if n is None:
        raise ConversionError(f"{what} must be a 1-D tensor of static length (it sets the rank "
                              f"or the number of results), got {x.struct_info!r}")
    return n
