"""Axes computed at run time (``ReduceSum``'s ``axes``, ``Squeeze`` / ``Unsqueeze``'s ``axes``,
``CumSum``'s ``axis``...), as onnxruntime takes them.

The number of axes is the static length of the input, so the rank of every result is known at
import time; which dims they are is not. The converters turn the axes into a 0 / 1 mask over the
input's dims (``axes_mask``: a small kernel that also refuses an axis out of range or given twice,
as ONNX says, with the node's name in the message), compute the result's dims from it as int64
tensors, and give them fresh symbolic dims (``GraphContext.runtime_dims``: ``tensor_to_shape``
and ``match_cast``). Kernels then index with those dims: a reduction over run-time axes gives
every dim ``k`` an output extent ``o_k`` (1 where reduced, else the input's) and a reduce extent
``e_k`` (the input's where reduced, else 1), and reads ``x[i_k + r_k]``.
"""
from __future__ import annotations

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import IntImm, PrimExpr, Select, Var as TirVar
from tilecraft.tensorir.stmt import (Block, BlockRealize, Buffer, BufferRegion, BufferStore, For,
                                     IfThenElse, Range)

from .... import op as _op
from ....expr import Expr, ShapeExpr
from ....struct_info import TensorStructInfo
from ....op.helpers import call_prim, make_prim_func
from ..emit import emit_checked_kernel, emit_kernel
from .common import int_vector, scalar, static_int, static_length

_I64 = "int64"


def _i(v) -> PrimExpr:
    return v if isinstance(v, PrimExpr) else IntImm(int(v), _I64)


def _norm(v: PrimExpr, rank: int) -> PrimExpr:
    v = v.astype(_I64)
    return Select(v < 0, v + rank, v)


def _axes_checks(a, m: int, rank: int, where: str, what: str) -> list:
    """The in-kernel checks of ``m`` run-time axes read from ``a``: each in [-rank, rank), no
    two naming the same dimension (as onnxruntime refuses them)."""
    checks = []
    for j in range(m):
        v = a[j].astype(_I64)
        checks.append(((v >= -rank) & (v < rank),
                       f"{where}: {what}[{j}] is out of range for a tensor of rank {rank}"))
    for j in range(m):
        for j2 in range(j + 1, m):
            checks.append((_norm(a[j], rank) != _norm(a[j2], rank),
                           f"{where}: {what}[{j}] and {what}[{j2}] name the same dimension"))
    return checks


def axes_mask(ctx, node, axes: Expr, rank: int, what: str = "axes") -> Expr:
    """An int64 tensor of ``rank`` entries, 1 where a dim is one of ``axes`` (a 1-D integer
    tensor computed at run time; negative axes count from the end). The kernel stops the call
    when an axis is out of ``[-rank, rank)`` or repeats another."""
    m = static_length(ctx, axes, what)
    where = node.describe()

    def kernel(a):
        def f(i):
            hit = None
            for j in range(m):
                h = _norm(a[j], rank) == i
                hit = h if hit is None else hit | h
            return Select(hit, IntImm(1, _I64), IntImm(0, _I64)) if hit is not None else \
                IntImm(0, _I64)
        out = te.compute((rank,), f, "T_axes_mask")
        return out, _axes_checks(a, m, rank, where, what)
    return emit_checked_kernel(ctx, kernel, axes, name="axes_mask")


def select_dims(ctx, mask: Expr, if_set, if_clear) -> Expr:
    """Per dim ``k``: ``if_set[k]`` where the mask is 1, else ``if_clear[k]`` (int64 vectors
    of ints / symbolic dims)."""
    return ctx.emit(_op.where(ctx.emit(_op.equal(mask, scalar(1, _I64))),
                              int_vector(ctx, if_set), int_vector(ctx, if_clear)))


def kept_dims(ctx, mask: Expr, dims, n_out: int, what: str) -> tuple:
    """The dims whose mask entry is 0, in order (``n_out`` of them), as fresh symbolic dims."""
    rank = len(dims)
    vec = int_vector(ctx, dims)

    def kernel(mk, d):
        def f(j):
            total = IntImm(0, _I64)
            before = IntImm(0, _I64)    # kept dims ahead of dim k
            for k in range(rank):
                keep = mk[k] == 0
                total = total + Select(keep & (before == j), d[k], IntImm(0, _I64))
                before = before + Select(keep, IntImm(1, _I64), IntImm(0, _I64))
            return total
        return te.compute((n_out,), f, "T_kept_dims")
    kept = emit_kernel(ctx, kernel, mask, vec, name="kept_dims")
    return ctx.runtime_dims(kept, what)


def inserted_dims(ctx, mask: Expr, dims, what: str) -> tuple:
    """The dims of a tensor of ``dims`` with a 1 inserted where the mask (of the result's rank)
    is 1, as fresh symbolic dims (``Unsqueeze`` with axes computed at run time)."""
    # one entry more than the input has: the kernel's reads stay in bounds where it selects a 1
    vec = int_vector(ctx, list(dims) + [1])
    rank = static_int(ctx.shape(mask)[0])

    def kernel(mk, d):
        def f(j):
            # the input dim at output position j: the count of 0 entries before j
            total = IntImm(0, _I64)
            before = IntImm(0, _I64)
            for k in range(rank):
                here = (IntImm(k, _I64) == j)
                total = total + Select(here & (mk[k] == 0), d[before], IntImm(0, _I64))
                before = before + Select(mk[k] == 0, IntImm(1, _I64), IntImm(0, _I64))
            return Select(mk[j] == 1, IntImm(1, _I64), total)
        return te.compute((rank,), f, "T_inserted_dims")
    out = emit_kernel(ctx, kernel, mask, vec, name="inserted_dims")
    return ctx.runtime_dims(out, what)


def reduce_layout(ctx, mask: Expr, dims) -> tuple:
    """``(out, extent)``: per dim, the output extent (1 where reduced) and the reduce extent (the
    input's where reduced, else 1), as fresh symbolic dims; dims of static extent 1 stay 1."""
    ones = [1] * len(dims)
    expected = [IntImm(1, _I64) if static_int(d) == 1 else None for d in dims]
    out = ctx.runtime_dims(select_dims(ctx, mask, ones, dims), "reduced", expected)
    ext = ctx.runtime_dims(select_dims(ctx, mask, dims, ones), "extent", expected)
    return out, ext


def reshape_to(ctx, x: Expr, dims) -> Expr:
    return ctx.emit(_op.reshape(x, ShapeExpr([_i(d) for d in dims])))


def runtime_axis(ctx, node, t: Expr, rank: int, what: str = "axis") -> PrimExpr:
    """A single axis computed at run time (a 1-element integer tensor), normalized to
    ``[0, rank)``, as a fresh symbolic value; the kernel that normalizes it stops the call when
    it is out of range."""
    if static_length(ctx, t, what) != 1:
        raise ValueError(f"{what} must hold one value")
    where = node.describe()

    def kernel(a):
        v = a[0].astype(_I64)
        out = te.compute((1,), lambda i: _norm(a[i], rank), "T_axis")
        return out, [((v >= -rank) & (v < rank),
                      f"{where}: {what} is out of range for a tensor of rank {rank}")]
    (ax,) = ctx.runtime_dims(emit_checked_kernel(ctx, kernel, t, name="axis"), what)
    return ax


def dim_at(dims, axis: PrimExpr) -> PrimExpr:
    """``dims[axis]`` for an axis known at run time only (a chain of selects)."""
    out = IntImm(0, _I64)
    for k in reversed(range(len(dims))):
        out = Select(axis == k, _i(dims[k]), out)
    return out


def index_at(idx, axis: PrimExpr) -> PrimExpr:
    """``idx[axis]`` of an index tuple, for an axis known at run time only."""
    return dim_at(idx, axis)


def replace_at(idx, axis: PrimExpr, value: PrimExpr) -> tuple:
    """``idx`` with entry ``axis`` (known at run time only) replaced by ``value``."""
    return tuple(Select(axis == k, value, i) for k, i in enumerate(idx))


def axes_slots(ctx, node, axes: Expr, rank: int, what: str = "axes") -> Expr:
    """An int64 tensor of ``rank`` entries: for each dim, the position in ``axes`` (computed at
    run time) that names it, or -1. Checked as ``axes_mask``."""
    m = static_length(ctx, axes, what)
    where = node.describe()

    def kernel(a):
        def f(i):
            slot = IntImm(-1, _I64)
            for j in reversed(range(m)):
                slot = Select(_norm(a[j], rank) == i, IntImm(j, _I64), slot)
            return slot
        out = te.compute((rank,), f, "T_axes_slots")
        return out, _axes_checks(a, m, rank, where, what)
    return emit_checked_kernel(ctx, kernel, axes, name="axes_slots")


def spread(ctx, slots: Expr, values: Expr, default) -> Expr:
    """Per dim ``k``: ``values[slots[k]]`` where ``slots[k] >= 0``, else ``default[k]`` (an int64
    vector, or one int for every dim)."""
    rank = static_int(ctx.shape(slots)[0])
    defaults = int_vector(ctx, default if isinstance(default, (list, tuple)) else [default] * rank)
    zero = scalar(0, _I64)
    picked = ctx.emit(_op.take(values, ctx.emit(_op.maximum(slots, zero)), 0))
    return ctx.emit(_op.where(ctx.emit(_op.greater_equal(slots, zero)), picked, defaults))


def true_positions(ctx, flags: Expr, what: str) -> tuple:
    """``(positions, n)``: the positions of the non-zero entries of ``flags`` (a 1-D int64
    tensor of 0 / 1), in order, and their count ``n`` as a fresh symbolic dim (a size that
    depends on the data: ``NonZero``, ``Compress``). One serial pass scatters each position to
    its rank among the non-zero entries (an inclusive cumsum)."""
    ranks = ctx.emit(_op.cumsum(flags, axis=0))
    total = ctx.emit(_op.sum(flags, keepdims=True))
    (n,) = ctx.runtime_dims(total, what)
    length = ctx.shape(flags)[0]
    fl = Buffer("flags", (length,), _I64)
    rk = Buffer("ranks", (length,), _I64)
    out = Buffer("positions", (n,), _I64)
    i = TirVar("i", _I64)
    body = For(i, 0, length, "serial",
               IfThenElse(fl[i] != 0, BufferStore(out, i, (rk[i] - 1,))))

    def full(buf):
        return BufferRegion(buf, [Range(IntImm(0, _I64), d) for d in buf.shape])
    block = Block("true_positions", [], [full(fl), full(rk)], [full(out)], body)
    func = make_prim_func([fl, rk, out], BlockRealize([], None, block), "true_positions")
    call = call_prim(ctx.bb, func, "true_positions", [flags, ranks],
                     TensorStructInfo((n,), _I64))
    return ctx.emit(call, "positions"), n
