"""Reductions: Reduce* (axes as an attribute or, from ReduceSum 13 / opset 18, an input known at
import time; keepdims; noop_with_empty_axes), ArgMax / ArgMin (select_last_index), CumSum,
CumProd and TopK."""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import PrimExpr, Select

from .... import op as _op
from ....expr import TupleGetItem
from ..registry import ConversionError, NeedsConstant, converter
from ..emit import emit_kernel
from .common import cast, norm_axes, norm_axis, scalar, static_int


def _reduce_axes(ctx, node, rank):
    """The reduced axes, or None for "no reduction" (``noop_with_empty_axes``)."""
    from_input = node.version >= 18 or (node.op_type == "ReduceSum" and node.version >= 13)
    if from_input:
        axes = ctx.known_ints(node, 1, "axes") if node.has_input(1) else None
        if axes is not None and any(isinstance(a, PrimExpr) for a in axes):
            raise NeedsConstant("input 1 (axes) must be a constant", node.inputs[1])
    else:
        axes = node.attr("axes")
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return None
        return list(range(rank))
    return sorted(norm_axes(axes, rank))


def _reducer(kind):
    def convert(ctx, node):
        x = ctx.input(node, 0)
        rank = len(ctx.shape(x))
        axes = _reduce_axes(ctx, node, rank)
        keep = bool(node.attr("keepdims", 1))
        d = ctx.dtype(x)
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
    converter(_op_type, family="reduce", const_inputs={1: "axes"},
              doc=f"{_doc} over axes")(_reducer(_kind))


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
    v = ctx.known_ints(node, 1, "axis")
    if v is None or isinstance(v[0], PrimExpr):
        raise NeedsConstant("input 1 (axis) must be a constant", node.inputs[1])
    return norm_axis(v[0], rank)


@converter("CumSum", family="reduce", const_inputs={1: "axis"},
           doc="cumulative sum along axis (exclusive, reverse)")
def _cumsum(ctx, node):
    x = ctx.input(node, 0)
    axis = _scan_axis(ctx, node, len(ctx.shape(x)))
    excl = bool(node.attr("exclusive", 0))
    if node.attr("reverse", 0):
        y = ctx.emit(_op.cumsum(ctx.emit(_op.flip(x, axis)), axis, exclusive=excl))
        return _op.flip(y, axis)
    return _op.cumsum(x, axis, exclusive=excl)


@converter("CumProd", family="reduce", const_inputs={1: "axis"},
           doc="cumulative product along axis (exclusive, reverse)")
def _cumprod(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    axis = _scan_axis(ctx, node, len(xs))
    excl = bool(node.attr("exclusive", 0))
    rev = bool(node.attr("reverse", 0))
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


@converter("TopK", family="reduce", const_inputs={1: "K"},
           doc="the k largest / smallest elements along axis and their indices")
def _topk(ctx, node):
    x = ctx.input(node, 0)
    rank = len(ctx.shape(x))
    axis = norm_axis(node.attr("axis", -1), rank)
    if node.version < 10:
        k = node.attr("k")
    else:
        kv = ctx.known_ints(node, 1, "K")
        if isinstance(kv[0], PrimExpr):
            raise NeedsConstant("input 1 (K) must be a constant", node.inputs[1])
        k = kv[0]
    largest = bool(node.attr("largest", 1))
    if k == 0:
        raise ConversionError("TopK with K = 0")
    res = ctx.emit(_op.topk(x, k, axis, "both", largest, "int64"))
    return [TupleGetItem(res, 0), TupleGetItem(res, 1)]


del _op_type, _kind, _doc
