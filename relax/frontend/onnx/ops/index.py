"""Indexing: Gather, GatherElements, GatherND, ScatterElements / Scatter, ScatterND, OneHot,
Compress, NonZero (known inputs), ReverseSequence."""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import FloorDiv, FloorMod, IntImm, Select, Var as TirVar
from tilecraft.tensorir.stmt import Block, BlockRealize, BufferRegion, BufferStore, For, Range, seq

from .... import op as _op
from ....expr import const
from ....op.helpers import call_prim
from ....struct_info import TensorStructInfo
from ..emit import emit_kernel
from ..registry import ConversionError, converter
from ..values import Known
from . import dynamic
from .common import cast, norm_axis, scalar, static_int


def _normalized(ctx, idx, n):
    """Indices with negative values counted from the end of a dim of extent ``n``."""
    d = ctx.dtype(idx)
    if dt.is_uint(d):
        return idx
    if isinstance(n, IntImm):
        nn = scalar(int(n.value), d)
    else:
        nn = cast(ctx, ctx.materialize(np.array(n, dtype=object), "int64"), d)
    neg = ctx.emit(_op.less(idx, scalar(0, d)))
    return ctx.emit(_op.where(neg, ctx.emit(_op.add(idx, nn)), idx))


@converter("Gather", family="index", doc="take along axis (negative indices count from the end)")
def _gather(ctx, node):
    x, idx = ctx.input(node, 0), ctx.input(node, 1)
    xs = ctx.shape(x)
    axis = norm_axis(node.attr("axis", 0), len(xs))
    known = ctx.known(node, 1)
    n = static_int(xs[axis])
    if known is not None and known.dtype != object and known.size and n is not None and \
            (known.min() < -n or known.max() >= n):
        raise ConversionError(f"Gather: indices {known.reshape(-1).tolist()[:8]} out of range "
                              f"for dimension {axis} of extent {n}")
    return _op.take(x, idx, axis)


@converter("GatherElements", family="index", doc="torch.gather")
def _gather_elements(ctx, node):
    x, idx = ctx.input(node, 0), ctx.input(node, 1)
    xs = ctx.shape(x)
    axis = norm_axis(node.attr("axis", 0), len(xs))
    return _op.gather_elements(x, _normalized(ctx, idx, xs[axis]), axis)


@converter("GatherND", family="index", doc="gather slices by index tuples (batch_dims)")
def _gather_nd(ctx, node):
    x, idx = ctx.input(node, 0), ctx.input(node, 1)
    b = node.attr("batch_dims", 0)
    xs, ids = ctx.shape(x), ctx.shape(idx)
    q = static_int(ids[-1])
    if q is None:
        raise ConversionError("GatherND needs a static last indices dim")
    # negative indices: add the dim they index
    dims = [xs[b + k] for k in range(q)]
    if all(isinstance(d, IntImm) for d in dims) and not dt.is_uint(ctx.dtype(idx)):
        nn = np.array([int(d.value) for d in dims], dtype=dt.to_numpy(ctx.dtype(idx)))
        neg = ctx.emit(_op.less(idx, scalar(0, ctx.dtype(idx))))
        idx = ctx.emit(_op.where(neg, ctx.emit(_op.add(idx, const(nn))), idx))
    return _op.gather_nd(x, idx, b)


_REDUCTIONS = {"none": "update", "add": "add", "mul": "mul", "min": "min", "max": "max"}


def _scatter_check(node):
    r = node.attr("reduction", "none")
    if r not in _REDUCTIONS:
        return [f"reduction {r!r} is not supported"]
    return []


@converter("ScatterElements", "Scatter", family="index", check=_scatter_check,
           doc="scatter updates along axis (reduction none / add / mul / min / max)")
def _scatter_elements(ctx, node):
    x, idx, upd = (ctx.input(node, i) for i in range(3))
    xs = ctx.shape(x)
    axis = norm_axis(node.attr("axis", 0), len(xs))
    return _op.scatter_elements(x, _normalized(ctx, idx, xs[axis]), upd, axis,
                                _REDUCTIONS[node.attr("reduction", "none")])


@converter("ScatterND", family="index", check=_scatter_check,
           doc="scatter slices at index tuples (reduction none / add / mul / min / max)")
def _scatter_nd(ctx, node):
    x, idx, upd = (ctx.input(node, i) for i in range(3))
    xs, ids = ctx.shape(x), ctx.shape(idx)
    q = static_int(ids[-1])
    if q is None:
        raise ConversionError("ScatterND needs a static last indices dim")
    reduction = _REDUCTIONS[node.attr("reduction", "none")]
    d = ctx.dtype(x)
    data = te.placeholder(xs, d, "data")
    ind = te.placeholder(ids, ctx.dtype(idx), "indices")
    ushape = tuple(ids[:-1]) + tuple(xs[q:])
    updates = te.placeholder(ushape, d, "updates")
    out = te.compute(xs, lambda *i: data[i], "T_scatter_nd_copy")
    func = te.create_prim_func([data, ind, updates, out])
    I, U, O = ind.buffer, updates.buffer, out.buffer
    # one opaque serial block: duplicates are applied in order, as the ONNX reference
    outer = [TirVar(f"i{k}", "int64") for k in range(len(ids) - 1)]
    inner = [TirVar(f"j{k}", "int64") for k in range(len(xs) - q)]
    tgt = []
    for k in range(q):
        v = I[tuple(outer) + (IntImm(k, "int64"),)].astype("int64")
        tgt.append(Select(v < 0, v + O.shape[k], v))
    tgt = tuple(tgt) + tuple(inner)
    src = tuple(outer) + tuple(inner)
    cur, new = O[tgt], U[src]
    value = {"update": new, "add": cur + new, "mul": cur * new,
             "min": te.minimum(cur, new), "max": te.maximum(cur, new)}[reduction]
    stmt = BufferStore(O, value, tgt)
    for v, n in reversed(list(zip(outer + inner, list(ids[:-1]) + list(xs[q:])))):
        stmt = For(v, 0, n, "serial", stmt)

    def full(buf):
        return BufferRegion(buf, [Range(IntImm(0, "int64"), dd) for dd in buf.shape])
    block = Block("scatter_nd", [], [full(I), full(U), full(O)], [full(O)], stmt)
    root = func.body.block
    func = func.replace(body=func.body.replace(block=root.replace(
        body=seq(root.body, BlockRealize([], None, block)))))
    return ctx.emit(call_prim(ctx.bb, func, "scatter_nd", [x, idx, upd],
                               TensorStructInfo(xs, d)), "scatter_nd")


@converter("OneHot", family="index",
           doc="one-hot along axis (values = [off, on]; negative indices count from the end)")
def _one_hot(ctx, node):
    idx, values = ctx.input(node, 0), ctx.input(node, 2)
    depth_v = ctx.known(node, 1)
    if depth_v is not None and depth_v.dtype != object:
        depth = int(np.asarray(depth_v).reshape(-1)[0])
        depth_t = scalar(depth, "int64")
    else:   # computed at run time (a float depth is truncated, as ONNX's reference does)
        t = ctx.input(node, 1)
        t = ctx.emit(_op.reshape(t, (1,)))
        if not dt.is_integer(ctx.dtype(t)):
            t = ctx.emit(_op.trunc(t))
        (depth,) = ctx.runtime_dims(cast(ctx, t, "int64"), "depth")
        depth_t = ctx.materialize(np.array(depth, dtype=object), "int64")
    ids = ctx.shape(idx)
    rank = len(ids) + 1
    axis = norm_axis(node.attr("axis", -1), rank)
    vd = ctx.dtype(values)
    idx64 = cast(ctx, idx, "int64") if dt.is_integer(ctx.dtype(idx)) else \
        cast(ctx, ctx.emit(_op.trunc(idx)), "int64")
    neg = ctx.emit(_op.less(idx64, scalar(0, "int64")))
    idx64 = ctx.emit(_op.where(neg, ctx.emit(_op.add(idx64, depth_t)), idx64))
    idx64 = ctx.emit(_op.expand_dims(idx64, axis))
    ar = ctx.emit(_op.arange(0, depth, 1, "int64"))
    ar = ctx.emit(_op.reshape(ar, tuple(depth if k == axis else 1 for k in range(rank))))
    hit = ctx.emit(_op.equal(ar, idx64))
    off = ctx.emit(_op.strided_slice(values, [0], [0], [1]))
    on = ctx.emit(_op.strided_slice(values, [0], [1], [2]))
    off = ctx.emit(_op.reshape(off, ()))
    on = ctx.emit(_op.reshape(on, ()))
    del vd
    return _op.where(hit, on, off)


@converter("Compress", family="index",
           doc="the slices where condition holds (a size that depends on the data)")
def _compress(ctx, node):
    x = ctx.input(node, 0)
    axis = node.attr("axis")
    if axis is None:
        x = ctx.emit(_op.reshape(x, (-1,)))
        axis = 0
    else:
        axis = norm_axis(axis, len(ctx.shape(x)))
    cond = ctx.known(node, 1)
    if cond is not None and cond.dtype != object:
        picks = np.nonzero(cond.reshape(-1).astype(bool))[0].astype(np.int64)
        return _op.take(x, const(picks), axis)
    # at run time: the positions where the condition holds (their count is a fresh dim);
    # take checks them against the dim (a condition longer than the dim that selects past it)
    flags = ctx.emit(_op.reshape(ctx.input(node, 1), (-1,)))
    flags = cast(ctx, ctx.emit(_op.not_equal(flags, scalar(0, ctx.dtype(flags))))
                 if ctx.dtype(flags) != "bool" else flags, "int64")
    picks, _ = dynamic.true_positions(ctx, flags, "selected")
    return _op.take(x, picks, axis)


@converter("NonZero", family="index",
           doc="indices of the non-zero elements (a size that depends on the data)")
def _nonzero(ctx, node):
    v = ctx.known(node, 0)
    if v is not None and v.dtype != object:
        return Known(np.array(np.nonzero(v), dtype=np.int64))
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    flat = ctx.emit(_op.reshape(x, (-1,)))
    flags = cast(ctx, ctx.emit(_op.not_equal(flat, scalar(0, ctx.dtype(x))))
                 if ctx.dtype(x) != "bool" else flat, "int64")
    pos, n = dynamic.true_positions(ctx, flags, "nonzero")
    rank = len(xs)

    def kernel(p):
        def f(k, j):
            coord = IntImm(0, "int64")
            flat_i = p[j]
            for d in reversed(range(rank)):   # unravel: the coordinate of dim d
                coord = Select(k == d, FloorMod(flat_i, xs[d]) if d else flat_i, coord)
                flat_i = FloorDiv(flat_i, xs[d])
            return coord
        return te.compute((rank, n), f, "T_nonzero")
    return emit_kernel(ctx, kernel, pos, name="nonzero")


@converter("ReverseSequence", family="index",
           doc="reverse the first seq_len[b] steps of each batch entry")
def _reverse_sequence(ctx, node):
    x, lens = ctx.input(node, 0), ctx.input(node, 1)
    xs = ctx.shape(x)
    ba = node.attr("batch_axis", 1)
    ta = node.attr("time_axis", 0)

    def k(data, ln):
        def f(*i):
            L = ln[i[ba]].astype("int64")
            t = i[ta]
            src = list(i)
            src[ta] = Select(t < L, L - 1 - t, t)
            return data[tuple(src)]
        return te.compute(xs, f, "T_reverse_sequence")
    return emit_kernel(ctx, k, x, lens, name="reverse_sequence")
