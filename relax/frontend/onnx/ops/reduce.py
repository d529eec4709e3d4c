"""Reductions: Reduce* (axes as an attribute or, from ReduceSum 13 / opset 18, an input: known at
import time, or computed at run time (``dynamic.py``); keepdims; noop_with_empty_axes),
ArgMax / ArgMin (select_last_index), CumSum, CumProd (axis known or computed at run time) and
TopK (K known or computed at run time)."""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import FloatImm, PrimExpr, Select

from .... import op as _op
from ....expr import TupleGetItem
from ....op.helpers import float_acc_dtype
from ..emit import emit_kernel
from ..registry import ConversionError, converter
from . import dynamic
from .common import cast, norm_axes, norm_axis, runtime_ints, scalar, static_int, static_length


class _RuntimeAxes:
    """Reduce axes computed at run time: the int64 tensor that holds them."""

    def __init__(self, tensor):
        self.tensor = tensor


def _reduce_axes(ctx, node, rank):
    """The reduced axes, None for "no reduction" (``noop_with_empty_axes``), or ``_RuntimeAxes``
    when the input is computed at run time."""
    from_input = node.version >= 18 or (node.op_type == "ReduceSum" and node.version >= 13)
    if from_input:
        axes = ctx.maybe_ints(node, 1) if node.has_input(1) else None
        if node.has_input(1) and (axes is None or any(isinstance(a, PrimExpr) for a in axes)):
            t = runtime_ints(ctx, node, 1, "axes")
            n = static_length(ctx, t, "axes")
            if n > rank:
                raise ConversionError(f"{n} axes for a tensor of rank {rank}")
            if n:
                return _RuntimeAxes(t)
            axes = []
    else:
        axes = node.attr("axes")
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return None
        return list(range(rank))
    return sorted(norm_axes(axes, rank))


_COMBINER = {"sum": "sum", "mean": "sum", "max": "max", "min": "min", "prod": "prod",
             "l1": "sum", "l2": "sum", "sumsquare": "sum", "logsum": "sum"}


def _runtime_reduce(ctx, node, x, kind, axes: _RuntimeAxes, keep):
    """A reduction over axes computed at run time: ``x[i_k + r_k]`` reduced over ``r_k`` in
    ``[0, e_k)``, with ``(o_k, e_k)`` = ``(1, d_k)`` for reduced dims and ``(d_k, 1)`` for the
    others (see ``dynamic.py``); without keepdims the result is reshaped to the kept dims."""
    xs = ctx.shape(x)
    rank = len(xs)
    d = ctx.dtype(x)
    n_axes = static_length(ctx, axes.tensor, "axes")
    mask = dynamic.axes_mask(ctx, node, axes.tensor, rank)
    out, ext = dynamic.reduce_layout(ctx, mask, xs)
    if kind in ("mean", "l2", "logsum", "logsumexp") and not dt.is_float(d):
        raise ConversionError(f"{node.op_type} of {d} over axes computed at run time "
                              f"(float inputs only)")
    acc = float_acc_dtype(d)
    combiner = _COMBINER.get(kind, "max")
    reducer = {"sum": te.sum, "prod": te.prod, "max": te.max, "min": te.min}[combiner]

    def source(v):
        if kind == "l1":
            return te.abs(v)
        if kind in ("l2", "sumsquare"):
            return v * v
        return v

    def reduce_kernel(data):
        rk = [te.reduce_axis((0, e), f"r{k}") for k, e in enumerate(ext)]

        def f(*i):
            v = source(data[tuple(i[k] + rk[k].var for k in range(rank))].astype(acc))
            return reducer(v, axis=rk)
        return te.compute(out, f, "T_reduce")
    y = emit_kernel(ctx, reduce_kernel, x, name=f"reduce_{combiner}", scalars=ext)
    count = None
    for e in ext:
        count = e if count is None else count * e
    if kind == "logsumexp":
        # max + log(sum(exp(x - max))): no overflow; an all -inf slice gives -inf
        def lse_kernel(data, mx):
            rk = [te.reduce_axis((0, e), f"r{k}") for k, e in enumerate(ext)]

            def f(*i):
                m = mx[i]
                safe = Select(te.abs(m) == FloatImm(np.inf, acc), FloatImm(0.0, acc), m)
                v = data[tuple(i[k] + rk[k].var for k in range(rank))].astype(acc)
                return te.sum(te.exp(v - safe), axis=rk)
            s = te.compute(out, f, "T_sum_exp")

            def g(*i):
                m = mx[i]
                safe = Select(te.abs(m) == FloatImm(np.inf, acc), FloatImm(0.0, acc), m)
                return te.log(s[i]) + safe
            return te.compute(out, g, "T_logsumexp")
        y = emit_kernel(ctx, lse_kernel, x, y, name="logsumexp", scalars=ext)
    elif kind == "mean":
        y = emit_kernel(ctx, lambda t: te.compute(out, lambda *i: t[i] / count.astype(acc),
                                                  "T_mean"), y, name="mean", scalars=ext)
    elif kind == "l2":
        y = ctx.emit(_op.sqrt(y))
    elif kind == "logsum":
        y = ctx.emit(_op.log(y))
    y = cast(ctx, y, d)
    if not keep:
        kept = dynamic.kept_dims(ctx, mask, xs, rank - n_axes, "kept")
        y = dynamic.reshape_to(ctx, y, kept)
    return y


def _reducer(kind):
    def convert(ctx, node):
        x = ctx.input(node, 0)
        rank = len(ctx.shape(x))
        axes = _reduce_axes(ctx, node, rank)
        keep = bool(node.attr("keepdims", 1))
        d = ctx.dtype(x)
        if isinstance(axes, _RuntimeAxes):
            return _runtime_reduce(ctx, node, x, kind, axes, keep)
        if axes is None:
            if kind in ("l1", "sumsquare"):
                return _op.abs(x) if kind == "l1" else _op.multiply(x, x)
            if kind == "l2":
                return _op.abs(x)
            if kind in ("logsum",):
                return _op.log(x)
            if kind == "logsumexp":
                return _op.add(x, scalar(0, d))
            return _op.add(x, scalar(0, d)) if d != "bool" else x
        e = ctx.emit
        if kind == "sum":
            return _op.sum(x, axes, keep)
        if kind == "mean":
            return _op.mean(x, axes, keep)
        if kind == "max":
            return _op.max(x, axes, keep)
        if kind == "min":
            return _op.min(x, axes, keep)
        if kind == "prod":
            return _op.prod(x, axes, keep)
        if kind == "l1":
            return _op.sum(e(_op.abs(x)), axes, keep)
        if kind == "sumsquare":
            return _op.sum(e(_op.multiply(x, x)), axes, keep)
        if kind == "l2":
            if not dt.is_float(d):
                s = e(_op.sum(e(_op.multiply(x, x)), axes, keep))
                r = e(_op.sqrt(cast(ctx, s, "float64")))
                return _op.astype(r, d)
            return _op.sqrt(e(_op.sum(e(_op.multiply(x, x)), axes, keep)))
        if kind == "logsum":
            return _op.log(e(_op.sum(x, axes, keep)))
        if kind == "logsumexp":
            # max + log(sum(exp(x - max))): no overflow; an all -inf slice gives -inf
            m = e(_op.max(x, axes, True))
            safe = e(_op.where(e(_op.equal(e(_op.abs(m)), scalar(np.inf, d))),
                               scalar(0, d), m))
            s = e(_op.sum(e(_op.exp(e(_op.subtract(x, safe)))), axes, keep))
            mk = safe if keep else e(_op.squeeze(safe, axes))
            return _op.add(e(_op.log(s)), mk)
        raise AssertionError(kind)
    return convert


for _op_type, _kind, _doc in [("ReduceSum", "sum", "sum"), ("ReduceMean", "mean", "mean"),
                              ("ReduceMax", "max", "maximum"), ("ReduceMin", "min", "minimum"),
                              ("ReduceProd", "prod", "product"),
                              ("ReduceL1", "l1", "sum of |x|"),
                              ("ReduceL2", "l2", "sqrt of the sum of x ** 2"),
                              ("ReduceSumSquare", "sumsquare", "sum of x ** 2"),
                              ("ReduceLogSum", "logsum", "log of the sum"),
                              ("ReduceLogSumExp", "logsumexp", "log of the sum of e ** x")]:
    converter(_op_type, family="reduce", doc=f"{_doc} over axes")(_reducer(_kind))


def _arg(kind):
    def convert(ctx, node):
        x = ctx.input(node, 0)
        xs = ctx.shape(x)
        axis = norm_axis(node.attr("axis", 0), len(xs))
        keep = bool(node.attr("keepdims", 1))
        fn = _op.argmax if kind == "max" else _op.argmin
        if node.attr("select_last_index", 0):
            flipped = ctx.emit(_op.flip(x, axis))
            idx = ctx.emit(fn(flipped, axis, keep))
            n = static_int(xs[axis])
            last = scalar(n - 1, "int64") if n is not None else \
                ctx.materialize(np.array(xs[axis] - 1, dtype=object), "int64")
            return _op.subtract(last, idx)
        return fn(x, axis, keep)
    return convert


converter("ArgMax", family="reduce", doc="index of the maximum along axis")(_arg("max"))
converter("ArgMin", family="reduce", doc="index of the minimum along axis")(_arg("min"))


def _scan_axis(ctx, node, rank):
    """The axis of CumSum / CumProd: an int, or a symbolic value when computed at run time."""
    v = ctx.maybe_ints(node, 1)
    if v is None or isinstance(v[0], PrimExpr):
        return dynamic.runtime_axis(ctx, node, runtime_ints(ctx, node, 1, "axis"), rank)
    return norm_axis(v[0], rank)


def _scan_kernel(ctx, x, axis, combiner, exclusive, reverse, name):
    """``out[i] = combine(x[i with j at axis])`` over the ``j`` before ``i[axis]`` (after it,
    reversed; ``i[axis]`` itself unless exclusive): one reduction per output, for an axis known
    at run time only (``dynamic.py``)."""
    xs = ctx.shape(x)
    d = ctx.dtype(x)
    acc = float_acc_dtype(d)
    n = dynamic.dim_at(xs, axis)
    reducer = te.sum if combiner == "sum" else te.prod

    def k(data):
        r = te.reduce_axis((0, n), "rj")

        def f(*i):
            j = r.var
            at = dynamic.index_at(i, axis)
            take = (j > at) if reverse else (j < at)
            if not exclusive:
                take = take | (j == at)
            v = data[dynamic.replace_at(i, axis, j)].astype(acc)
            return reducer(Select(take, v, te.identity_of(combiner, acc)), axis=r)
        return te.compute(xs, f, f"T_{name}")
    return cast(ctx, emit_kernel(ctx, k, x, name=name, scalars=[axis]), d)


@converter("CumSum", family="reduce", doc="cumulative sum along axis (exclusive, reverse)")
def _cumsum(ctx, node):
    x = ctx.input(node, 0)
    axis = _scan_axis(ctx, node, len(ctx.shape(x)))
    excl = bool(node.attr("exclusive", 0))
    rev = bool(node.attr("reverse", 0))
    if isinstance(axis, PrimExpr):
        return _scan_kernel(ctx, x, axis, "sum", excl, rev, "cumsum")
    if rev:
        y = ctx.emit(_op.cumsum(ctx.emit(_op.flip(x, axis)), axis, exclusive=excl))
        return _op.flip(y, axis)
    return _op.cumsum(x, axis, exclusive=excl)


@converter("CumProd", family="reduce", doc="cumulative product along axis (exclusive, reverse)")
def _cumprod(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    axis = _scan_axis(ctx, node, len(xs))
    excl = bool(node.attr("exclusive", 0))
    rev = bool(node.attr("reverse", 0))
    if isinstance(axis, PrimExpr):
        return _scan_kernel(ctx, x, axis, "prod", excl, rev, "cumprod")
    n = xs[axis]
    d = ctx.dtype(x)

    def k(data):
        r = te.reduce_axis((0, n), "rj")

        def f(*i):
            j = r.var
            take = (j > i[axis]) if rev else (j < i[axis])
            if not excl:
                take = take | (j == i[axis])
            idx = i[:axis] + (j,) + i[axis + 1:]
            return te.prod(Select(take, data[idx], te.const(1, d)), axis=r)
        return te.compute(xs, f, "T_cumprod")
    return emit_kernel(ctx, k, x, name="cumprod")


@converter("TopK", family="reduce",
           doc="the k largest / smallest elements along axis and their indices")
def _topk(ctx, node):
    x = ctx.input(node, 0)
    rank = len(ctx.shape(x))
    axis = norm_axis(node.attr("axis", -1), rank)
    if node.version < 10:
        k = node.attr("k")
    else:
        kv = ctx.maybe_ints(node, 1)
        if kv is None:   # computed at run time: a fresh dim (the kernel checks it fits)
            (k,) = ctx.runtime_dims(runtime_ints(ctx, node, 1, "K"), "k")
        else:
            k = kv[0]
    largest = bool(node.attr("largest", 1))
    if isinstance(k, int) and k == 0:
        raise ConversionError("TopK with K = 0")
    res = ctx.emit(_op.topk(x, k, axis, "both", largest, "int64"))
    return [TupleGetItem(res, 0), TupleGetItem(res, 1)]


del _op_type, _kind, _doc
