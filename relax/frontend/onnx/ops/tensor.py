"""Shape and data-movement operators: Shape, Reshape, Transpose, Squeeze, Concat, Split, Slice,
Expand, Tile, Pad, Range, ConstantOfShape, Trilu, DepthToSpace...

Inputs that give a shape, a slice bound or a count are used symbolically when they are known at
import time (constants, or arithmetic on ``Shape``), so the result keeps exact symbolic dims.
When they are computed at run time the converters take the dynamic path: the sizes are computed
as int64 tensors, turned into fresh symbolic dims (``GraphContext.runtime_dims``), and a kernel
reads the offsets it needs (slice starts, pad widths) from a small int64 tensor.
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir import arith
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.arith import Analyzer
from tilecraft.tensorir.expr import FloorDiv, FloorMod, IntImm, Max, Min, PrimExpr, Select
from tilecraft.tensorir.functor import post_order_visit

from .... import op as _op
from ....expr import Expr, ShapeExpr, TupleGetItem, const
from ....struct_info import TensorStructInfo
from .. import lowbit
from ..emit import emit_kernel
from ..known import as_int, is_symbolic
from ..registry import ConversionError, ONNX_DTYPES, converter
from ..values import Known, Value
from . import dynamic
from .common import (cast, int_vector, norm_axes, norm_axis, prod, runtime_ints, scalar,
                     static_int, static_length)

_I64 = "int64"


def _i(v) -> PrimExpr:
    return v if isinstance(v, PrimExpr) else IntImm(int(v), _I64)


# ---------------------------------------------------------------------------------------------
# Shape, Size, Constant


@converter("Shape", family="tensor", doc="the dims of the input (symbolic dims stay symbolic)")
def _shape(ctx, node):
    v = ctx.value(node, 0)
    dims = v.shape
    if dims is None:
        raise ConversionError("Shape of a tensor of unknown rank")
    arr = np.empty(len(dims), dtype=object)
    arr[:] = [as_int(d) for d in dims]
    rank = len(dims)
    start, end = node.attr("start", 0), node.attr("end", None)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = rank if end is None else max(0, min(rank, end + rank if end < 0 else end))
    arr = arr[start:end]
    if all(isinstance(d, int) for d in arr):
        return Known(np.array(list(arr), dtype=np.int64))
    return Known(arr, _I64)


@converter("Size", family="tensor", doc="the number of elements")
def _size(ctx, node):
    dims = ctx.value(node, 0).shape
    total = as_int(_simplify(prod(dims)))
    if isinstance(total, int):
        return Known(np.array(total, dtype=np.int64))
    arr = np.empty((), dtype=object)
    arr[()] = total
    return Known(arr, _I64)


def _simplify(e):
    return arith.Analyzer().simplify(e)


def _constant_check(node):
    if "sparse_value" in node.attrs:
        return ["sparse_value is not supported"]
    if "value_string" in node.attrs or "value_strings" in node.attrs:
        return ["string constants are not supported"]
    return []


@converter("Constant", family="tensor", check=_constant_check, doc="a constant tensor")
def _constant(ctx, node):
    a = node.attrs
    if "value" in a:
        for attr in node.proto.attribute:
            fmt = lowbit.format_of(attr.t.data_type) if attr.name == "value" else None
            if fmt is not None:
                return Value(known=a["value"], logical=fmt.name)
        return Known(a["value"])
    if "value_float" in a:
        return Known(np.array(a["value_float"], dtype=np.float32))
    if "value_floats" in a:
        return Known(np.array(a["value_floats"], dtype=np.float32))
    if "value_int" in a:
        return Known(np.array(a["value_int"], dtype=np.int64))
    if "value_ints" in a:
        return Known(np.array(a["value_ints"], dtype=np.int64))
    raise ConversionError("Constant has no value attribute")


@converter("ConstantOfShape", family="tensor", doc="a tensor of the given shape filled with value")
def _constant_of_shape(ctx, node):
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else value.reshape(-1)
    dims = ctx.maybe_ints(node, 0)
    if dims is None:
        dims = ctx.runtime_dims(runtime_ints(ctx, node, 0, "shape"), "dim")
    dtype = str(value.dtype)
    return _op.full(tuple(_i(d) for d in dims), const(value.reshape(())), dtype)


# ---------------------------------------------------------------------------------------------
# Reshape, Flatten, Squeeze, Unsqueeze, Transpose


@converter("Reshape", family="tensor",
           doc="reshape to a shape (0 copies the input dim unless allowzero; -1 is inferred)")
def _reshape(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    allowzero = node.attr("allowzero", 0)
    shape = node.attr("shape") if node.version < 5 else ctx.maybe_ints(node, 1)
    if shape is not None:
        out = []
        for k, s in enumerate(shape):
            if isinstance(s, int) and s == 0 and not allowzero:
                if k >= len(xs):
                    raise ConversionError(f"Reshape: shape {shape} copies dim {k} of a rank "
                                          f"{len(xs)} input")
                s = xs[k]
            out.append(s)
        if sum(1 for s in out if isinstance(s, int) and s == -1) > 1:
            raise ConversionError(f"Reshape: more than one -1 in {shape}")
        return _op.reshape(x, tuple(out))
    # computed at run time
    s = runtime_ints(ctx, node, 1, "shape")
    k = static_int(ctx.shape(s)[0])
    if not allowzero:
        copy = int_vector(ctx, [xs[j] if j < len(xs) else 1 for j in range(k)])
        s = ctx.emit(_op.where(ctx.emit(_op.equal(s, scalar(0, _I64))), copy, s))
    total = int_vector(ctx, [_simplify(prod(xs))])
    is_hole = ctx.emit(_op.equal(s, scalar(-1, _I64)))
    known = ctx.emit(_op.prod(ctx.emit(_op.where(is_hole, scalar(1, _I64), s)), keepdims=True))
    known = ctx.emit(_op.maximum(known, scalar(1, _I64)))
    s = ctx.emit(_op.where(is_hole, ctx.emit(_op.divide(total, known)), s))
    dims = ctx.runtime_dims(s, "dim")
    return _op.reshape(x, ShapeExpr(dims))


@converter("Flatten", family="tensor", doc="reshape to 2-D at axis")
def _flatten(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    axis = node.attr("axis", 1)
    axis = axis + len(xs) if axis < 0 else axis
    if not 0 <= axis <= len(xs):
        raise ConversionError(f"Flatten: axis {node.attr('axis')} out of range for rank {len(xs)}")
    return _op.reshape(x, (_simplify(prod(xs[:axis])), _simplify(prod(xs[axis:]))))


@converter("Transpose", family="tensor", doc="permute the dims (perm; default: reverse)")
def _transpose(ctx, node):
    x = ctx.input(node, 0)
    perm = node.attr("perm")
    rank = len(ctx.shape(x))
    if perm is None:
        perm = list(reversed(range(rank)))
    return _op.permute_dims(x, norm_axes(perm, rank, "perm"))


def _axes(ctx, node, i, what="axes"):
    """``axes`` from the attribute (older versions) or input ``i``: a list of ints when known
    at import time, else the int64 tensor computed at run time."""
    if "axes" in node.attrs:
        return node.attr("axes")
    if not node.has_input(i):
        return None
    vals = ctx.maybe_ints(node, i)
    if vals is not None and not any(isinstance(v, PrimExpr) for v in vals):
        return vals
    return runtime_ints(ctx, node, i, what)


@converter("Squeeze", family="tensor", doc="remove dims of extent 1")
def _squeeze(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    axes = _axes(ctx, node, 1)
    if isinstance(axes, Expr):
        # axes computed at run time: the kept dims, then a reshape (which checks that the
        # removed dims hold one element each)
        n = static_length(ctx, axes, "axes")
        if n > len(xs):
            raise ConversionError(f"Squeeze: {n} axes for a tensor of rank {len(xs)}")
        mask = dynamic.axes_mask(ctx, node, axes, len(xs))
        return dynamic.reshape_to(ctx, x, dynamic.kept_dims(ctx, mask, xs, len(xs) - n, "dim"))
    if axes is None:
        axes = [k for k, d in enumerate(xs) if static_int(d) == 1]
    axes = norm_axes(axes, len(xs))
    for a in axes:
        if static_int(xs[a]) not in (1, None):
            raise ConversionError(f"Squeeze: dimension {a} of {xs} is not 1")
    if not axes:
        return ctx.value(node, 0)
    return _op.squeeze(x, axes)


@converter("Unsqueeze", family="tensor", doc="insert dims of extent 1 at axes")
def _unsqueeze(ctx, node):
    x = ctx.input(node, 0)
    rank = len(ctx.shape(x))
    axes = _axes(ctx, node, 1)
    if isinstance(axes, Expr):
        n = static_length(ctx, axes, "axes")
        mask = dynamic.axes_mask(ctx, node, axes, rank + n)
        return dynamic.reshape_to(ctx, x, dynamic.inserted_dims(ctx, mask, ctx.shape(x), "dim"))
    axes = sorted(norm_axes(axes, rank + len(axes)))
    out = list(ctx.shape(x))
    for a in axes:
        out.insert(a, IntImm(1, _I64))
    return _op.reshape(x, tuple(out))


# ---------------------------------------------------------------------------------------------
# Concat, Split


@converter("Concat", family="tensor", doc="concatenate along axis")
def _concat(ctx, node):
    xs = [x for x in ctx.inputs(node) if x is not None]
    rank = len(ctx.shape(xs[0]))
    axis = norm_axis(node.attr("axis", 0 if node.version < 4 else None), rank)
    # zero-size pieces (ONNX allows them) add nothing
    keep = [x for x in xs if static_int(ctx.shape(x)[axis]) != 0] or xs[:1]
    if len(keep) == 1:
        return _op.add(keep[0], scalar(0, ctx.dtype(keep[0]))) if ctx.dtype(keep[0]) != "bool" \
            else _op.logical_or(keep[0], keep[0])
    return _op.concat(keep, axis)


@converter("Split", family="tensor",
           doc="split along axis (sizes from split, or num_outputs equal pieces)")
def _split(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    axis = norm_axis(node.attr("axis", 0), len(xs))
    n_out = len(node.outputs)
    if "split" in node.attrs:
        sizes = node.attr("split")
    elif node.version >= 13 and node.has_input(1):
        sizes = ctx.maybe_ints(node, 1)
        if sizes is None:
            sizes = _runtime_split(ctx, node, xs[axis], n_out)
    else:
        sizes = None
    dim = xs[axis]
    if sizes is None:
        n = node.attr("num_outputs", n_out)
        d = static_int(dim)
        if d is not None and d % n != 0:
            chunk = -(-d // n)
            sizes = [chunk] * (d // chunk) + ([d % chunk] if d % chunk else [])
        else:
            res = ctx.emit(_op.split(x, n, axis))
            return [TupleGetItem(res, k) for k in range(n)]
    if len(sizes) != n_out:
        raise ConversionError(f"Split: {len(sizes)} sizes for {n_out} outputs")
    outs, begin = [], IntImm(0, _I64)
    for s in sizes:
        end = _simplify(begin + _i(s))
        outs.append(_op.strided_slice(x, [axis], [begin], [end], assume_inbound=True))
        begin = end
    return outs


def _runtime_split(ctx, node, dim, n_out):
    """Split sizes computed at run time, as fresh dims; the last must make up the dim (checked
    when the model runs, by the match_cast)."""
    t = runtime_ints(ctx, node, 1, "split")
    n = static_length(ctx, t, "split")
    if n != n_out:
        raise ConversionError(f"Split: {n} sizes for {n_out} outputs")
    names = [ctx.fresh_var("split") for _ in range(n - 1)]
    rest = dim
    for v in names:
        rest = rest - v
    return list(ctx.runtime_dims(t, "split", names + [_simplify(rest)]))


# ---------------------------------------------------------------------------------------------
# Slice


def _slice_params(ctx, node):
    """(starts, ends, axes, steps) of a Slice: lists of ints / PrimExprs, or None where an input
    is computed at run time."""
    if node.version < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        return starts, ends, node.attr("axes"), None
    return (ctx.maybe_ints(node, 1), ctx.maybe_ints(node, 2),
            ctx.maybe_ints(node, 3) if node.has_input(3) else None,
            ctx.maybe_ints(node, 4) if node.has_input(4) else None)


@converter("Slice", family="tensor", doc="x[starts:ends:steps] along axes")
def _slice(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    rank = len(xs)
    starts, ends, axes, steps = _slice_params(ctx, node)
    static_axes = axes is not None or not node.has_input(3)
    static_steps = steps is not None or not (node.version >= 10 and node.has_input(4))
    if starts is not None and ends is not None and static_axes and static_steps and \
            all(isinstance(v, int) for v in (axes or []) + (steps or [])):
        n = len(starts)
        axes = norm_axes(axes if axes is not None else list(range(n)), rank)
        steps = steps if steps is not None else [1] * n
        if any(s == 0 for s in steps):
            raise ConversionError("Slice: a step is 0")
        return _op.strided_slice(x, axes, starts, ends, steps)
    starts_t = runtime_ints(ctx, node, 1, "starts")
    ends_t = runtime_ints(ctx, node, 2, "ends")
    n = static_length(ctx, starts_t, "starts")
    if node.has_input(4):
        steps_t = runtime_ints(ctx, node, 4, "steps")
    else:
        steps_t = const(np.ones(n, dtype=np.int64))
    if node.has_input(3) and (axes is None or not all(isinstance(a, int) for a in axes)):
        # axes computed at run time: every dim is sliced, those not named from 0 to the end
        slots = dynamic.axes_slots(ctx, node, runtime_ints(ctx, node, 3, "axes"), rank)
        big = np.iinfo(np.int64).max
        return _dynamic_slice(ctx, x, xs, dynamic.spread(ctx, slots, starts_t, 0),
                              dynamic.spread(ctx, slots, ends_t, big),
                              dynamic.spread(ctx, slots, steps_t, 1), list(range(rank)))
    axes = norm_axes(axes if axes is not None else list(range(n)), rank)
    return _dynamic_slice(ctx, x, xs, starts_t, ends_t, steps_t, axes)


def _dynamic_slice(ctx, x, xs, starts, ends, steps, axes):
    """Slice with starts / ends / steps computed at run time (int64 tensors, one entry per axis
    of ``axes``): the ONNX clamping rules evaluated on int64 tensors, the counts as fresh dims,
    the starts and steps read by the kernel."""
    n = len(axes)
    dims = int_vector(ctx, [xs[a] for a in axes])
    zero, one = scalar(0, _I64), scalar(1, _I64)
    e = ctx.emit

    def norm(v):
        neg = e(_op.less(v, zero))
        return e(_op.where(neg, e(_op.add(v, dims)), v))
    s, t = norm(starts), norm(ends)
    pos = e(_op.greater(steps, zero))
    dm1 = e(_op.subtract(dims, one))
    s = e(_op.where(pos, e(_op.minimum(e(_op.maximum(s, zero)), dims)),
                    e(_op.minimum(e(_op.maximum(s, zero)), dm1))))
    t = e(_op.where(pos, e(_op.minimum(e(_op.maximum(t, zero)), dims)),
                    e(_op.minimum(e(_op.maximum(t, scalar(-1, _I64))), dm1))))
    mag = e(_op.abs(steps))
    span = e(_op.where(pos, e(_op.subtract(t, s)), e(_op.subtract(s, t))))
    count = e(_op.maximum(e(_op.divide(e(_op.add(span, e(_op.subtract(mag, one)))), mag)), zero))
    counts = ctx.runtime_dims(count, "slice_len")
    params = e(_op.concat([s, steps], 0))
    out_shape = list(xs)
    for a, c in zip(axes, counts):
        out_shape[a] = c
    pos_of = {a: j for j, a in enumerate(axes)}

    def kernel(data, p):
        def f(*i):
            idx = []
            for k, iv in enumerate(i):
                if k in pos_of:
                    j = pos_of[k]
                    idx.append(p[j] + iv * p[n + j])
                else:
                    idx.append(iv)
            return data[tuple(idx)]
        return te.compute(out_shape, f, "T_slice")
    return emit_kernel(ctx, kernel, x, params, name="dynamic_slice")


# ---------------------------------------------------------------------------------------------
# Expand, Tile


@converter("Expand", family="tensor", doc="broadcast to a shape (bidirectionally)")
def _expand(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    target = ctx.maybe_ints(node, 1)
    if target is None:
        t = runtime_ints(ctx, node, 1, "shape")
        k = static_int(ctx.shape(t)[0])
        rank = max(k, len(xs))
        xpad = int_vector(ctx, [1] * (rank - len(xs)) + list(xs))
        if k < rank:
            t = ctx.emit(_op.concat([const(np.ones(rank - k, np.int64)), t], 0))
        out = ctx.emit(_op.where(ctx.emit(_op.equal(t, scalar(1, _I64))), xpad, t))
        # where the input dim is not 1 the output dim is that dim (checked at run time)
        padded = [IntImm(1, _I64)] * (rank - len(xs)) + list(xs)
        expected = [None if static_int(d) == 1 else d for d in padded]
        dims = ctx.runtime_dims(out, "dim", expected)
        return _op.broadcast_to(x, ShapeExpr(dims))
    rank = max(len(target), len(xs))
    tpad = [1] * (rank - len(target)) + list(target)
    xpad = [IntImm(1, _I64)] * (rank - len(xs)) + list(xs)
    out = []
    for t, d in zip(tpad, xpad):
        if isinstance(t, int) and t == 1:
            out.append(d)
        elif static_int(d) == 1 or isinstance(t, int):
            out.append(_i(t))
        else:
            out.append(t)
    x = _unify_dims(ctx, node, x, xpad, out)
    return _op.broadcast_to(x, tuple(out))


def _uses(var_ids: set, *exprs) -> bool:
    """Whether any of ``exprs`` uses a variable whose id is in ``var_ids``."""
    found = []
    for e in exprs:
        post_order_visit(_i(e), lambda n: found.append(n) if id(n) in var_ids else None)
    return bool(found)


def _unify_dims(ctx, node, x, xpad, out):
    """``x`` cast to the dims it must have to expand to ``out``: where a dim of ``x`` is not 1
    and not provably its output dim (``min(seq, 256)`` to ``seq``: a position table sliced by
    the sequence length), the conditions that make them equal are checked when the model runs
    (``seq <= 256``, see ``frontend.shape_facts``) and the dim is taken as the output's."""
    facts = ctx.importer.facts
    plain = Analyzer()          # what relax.broadcast_to proves by itself, without the facts
    dims = list(xpad)
    changed = False
    for k, (d, o) in enumerate(zip(xpad, out)):
        o = _i(o)
        if static_int(d) == 1 or plain.can_prove_equal(d, o):
            continue
        if static_int(d) is not None and static_int(o) is not None:
            continue                # two constants that differ: broadcast_to says so
        if not _uses(ctx.importer.runtime_vars, d, o) and not ctx.importer.branch_depth:
            facts.require_equal(d, o, f"node {node.name!r} (Expand)")
        # else a dim computed at run time: the match_cast below checks it where it is known
        dims[k] = o
        changed = True
    if not changed:
        return x
    shape = tuple(dims[len(xpad) - len(ctx.shape(x)):])
    return ctx.bb.match_cast(x, TensorStructInfo(shape, ctx.dtype(x)))


@converter("Tile", family="tensor", doc="repeat the whole tensor along each dim")
def _tile(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    reps = ctx.maybe_ints(node, 1)
    if reps is not None and all(isinstance(r, int) for r in reps):
        return _op.tile(x, reps)
    if reps is None:
        reps = ctx.runtime_dims(runtime_ints(ctx, node, 1, "repeats"), "repeat")
    # x[None, :, None, :, ...] broadcast to (r0, d0, r1, d1, ...), then merged
    inter = []
    for d in xs:
        inter += [IntImm(1, _I64), d]
    y = ctx.emit(_op.reshape(x, tuple(inter)))
    big = []
    for r, d in zip(reps, xs):
        big += [_i(r), d]
    y = ctx.emit(_op.broadcast_to(y, tuple(big)))
    return _op.reshape(y, tuple(_simplify(_i(r) * d) for r, d in zip(reps, xs)))


# ---------------------------------------------------------------------------------------------
# Pad


def _pad_check(node):
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        return [f"Pad mode {mode!r} is not supported"]
    return []


@converter("Pad", family="tensor", check=_pad_check,
           doc="pad (constant, reflect, edge, wrap; negative pads crop)")
def _pad(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    rank = len(xs)
    d = ctx.dtype(x)
    mode = node.attr("mode", "constant")
    if node.version < 11:
        pads = node.attr("pads", node.attr("paddings"))
        value_expr, value_num = None, node.attr("value", 0.0)
        axes = None
    else:
        pads = ctx.maybe_ints(node, 1)
        value_num, value_expr = 0, None
        if node.has_input(2):
            kv = ctx.known(node, 2)
            if kv is not None and kv.dtype != object and kv.size == 1:
                value_num = kv.reshape(-1)[0].item()
            else:
                value_expr = ctx.input(node, 2)
        axes = ctx.maybe_ints(node, 3) if node.has_input(3) else None
    runtime_axes = None
    if axes is not None and not all(isinstance(v, int) for v in axes) or \
            node.version >= 18 and node.has_input(3) and axes is None:
        runtime_axes = runtime_ints(ctx, node, 3, "axes")   # computed at run time
        axes = None
    axes = norm_axes(axes, rank) if axes is not None else list(range(rank))
    if runtime_axes is None and pads is not None and all(isinstance(p, int) for p in pads):
        if len(pads) != 2 * len(axes):
            raise ConversionError(f"Pad: {len(pads)} pads for {len(axes)} axes")
        width = [(0, 0)] * rank
        for j, a in enumerate(axes):
            width[a] = (pads[j], pads[j + len(axes)])
        if value_expr is None and mode in ("constant", "edge", "reflect") and \
                (mode == "constant" or all(b >= 0 and e >= 0 for b, e in width)):
            if dt.is_integer(d) or d == "bool":
                value_num = int(value_num)
            return _op.pad(x, width, float(value_num) if dt.is_float(d) else value_num, mode)
        befores = const(np.array([b for b, _ in width], np.int64))
        out_shape = [_simplify(n + b + e) for n, (b, e) in zip(xs, width)]
    else:
        p = runtime_ints(ctx, node, 1, "pads") if pads is None else int_vector(ctx, pads)
        k = len(axes) if runtime_axes is None else static_length(ctx, runtime_axes, "axes")
        if static_length(ctx, p, "pads") != 2 * k:
            raise ConversionError(f"Pad: {static_length(ctx, p, 'pads')} pads for {k} axes")
        b = ctx.emit(_op.strided_slice(p, [0], [0], [k]))
        a = ctx.emit(_op.strided_slice(p, [0], [k], [2 * k]))
        full_b, full_a = b, a
        if runtime_axes is not None:
            slots = dynamic.axes_slots(ctx, node, runtime_axes, rank)
            full_b = dynamic.spread(ctx, slots, b, 0)
            full_a = dynamic.spread(ctx, slots, a, 0)
        elif axes != list(range(rank)):
            idx = const(np.array([axes.index(r) if r in axes else k for r in range(rank)],
                                 np.int64))
            zb = ctx.emit(_op.concat([b, const(np.zeros(1, np.int64))], 0))
            za = ctx.emit(_op.concat([a, const(np.zeros(1, np.int64))], 0))
            full_b = ctx.emit(_op.take(zb, idx, 0))
            full_a = ctx.emit(_op.take(za, idx, 0))
        dims = int_vector(ctx, list(xs))
        out_dims = ctx.emit(_op.add(ctx.emit(_op.add(dims, full_b)), full_a))
        out_shape = list(ctx.runtime_dims(out_dims, "padded"))
        befores = full_b
    if value_expr is None:
        value_expr = scalar(value_num, d)
    elif len(ctx.shape(value_expr)) != 0:
        value_expr = ctx.emit(_op.reshape(value_expr, ()))
    return _pad_kernel(ctx, x, befores, value_expr, out_shape, mode)


def _pad_kernel(ctx, x, befores, value, out_shape, mode):
    def kernel(data, b, v):
        def f(*i):
            src, inside = [], []
            for k, (iv, n) in enumerate(zip(i, data.shape)):
                j = iv - b[k]
                if mode == "constant":
                    inside += [j >= 0, j < n]
                    src.append(j)
                elif mode == "edge":
                    src.append(Min(Max(j, IntImm(0, _I64)), n - 1))
                elif mode == "wrap":
                    src.append(FloorMod(j, Max(n, IntImm(1, _I64))))
                else:
                    period = Max((n - 1) * 2, IntImm(1, _I64))
                    r = FloorMod(j, period)
                    src.append(Select(r >= n, period - r, r))
            load = data[tuple(src)]
            return te.if_then_else(te.all(*inside), load, v[()]) if inside else load
        return te.compute(out_shape, f, "T_pad")
    return emit_kernel(ctx, kernel, x, befores, value, name="pad")


# ---------------------------------------------------------------------------------------------
# Range, EyeLike, Trilu


@converter("Range", family="tensor", doc="start, start + delta, ... up to limit")
def _range(ctx, node):
    start, limit, delta = (ctx.value(node, i) for i in range(3))
    d = start.dtype
    ks = [v.known for v in (start, limit, delta)]
    if all(k is not None for k in ks) and not any(is_symbolic(k) for k in ks):
        s, l, t = (k.reshape(()).item() for k in ks)
        return _op.arange(s, l, t, d)
    ints = [ctx.maybe_ints(node, i) for i in range(3)]
    if dt.is_integer(d) and all(v is not None for v in ints) and isinstance(ints[2][0], int) \
            and ints[2][0] > 0 and d == _I64:
        return _op.arange(_i(ints[0][0]), _i(ints[1][0]), ints[2][0], d)
    # at run time: n = max(ceil((limit - start) / delta), 0)
    e = ctx.emit
    s, l, t = (ctx.expr(v) for v in (start, limit, delta))
    wide = "float64"
    span = e(_op.divide(e(_op.subtract(cast(ctx, l, wide), cast(ctx, s, wide))), cast(ctx, t, wide)))
    n = e(_op.maximum(e(_op.ceil(span)), scalar(0, wide)))
    n = e(_op.reshape(cast(ctx, n, _I64), (1,)))
    (count,) = ctx.runtime_dims(n, "range_len")

    def kernel(a, b):
        def f(i):
            if dt.is_float(d):
                return a[()] + i.astype(d) * b[()]
            return a[()] + i.astype(d) * b[()]
        return te.compute((count,), f, "T_range")
    return emit_kernel(ctx, kernel, s, t, name="range")


@converter("EyeLike", family="tensor", doc="ones on diagonal k, shaped like the input")
def _eye_like(ctx, node):
    x = ctx.input(node, 0)
    n, m = ctx.shape(x)
    dtype = node.attr("dtype")
    d = ONNX_DTYPES[dtype] if dtype is not None else ctx.dtype(x)
    return _op.eye(n, m, node.attr("k", 0), d)


@converter("Trilu", family="tensor", doc="the upper or lower triangle (diagonal offset k)")
def _trilu(ctx, node):
    x = ctx.input(node, 0)
    upper = node.attr("upper", 1)
    k = ctx.maybe_ints(node, 1) if node.has_input(1) else [0]
    if k is not None:
        return _op.triu(x, k[0]) if upper else _op.tril(x, k[0])
    kt = ctx.input(node, 1)
    kt = cast(ctx, kt if len(ctx.shape(kt)) == 0 else ctx.emit(_op.reshape(kt, ())), _I64)
    shape = ctx.shape(x)

    def kernel(data, kk):
        def f(*i):
            diff = i[-1] - i[-2]
            keep = diff >= kk[()] if upper else diff <= kk[()]
            return Select(keep, data[i], te.const(0, data.dtype))
        return te.compute(shape, f, "T_trilu")
    return emit_kernel(ctx, kernel, x, kt, name="trilu")


# ---------------------------------------------------------------------------------------------
# DepthToSpace, SpaceToDepth


@converter("DepthToSpace", family="tensor", doc="move channel blocks into space (DCR / CRD)")
def _depth_to_space(ctx, node):
    x = ctx.input(node, 0)
    n, c, h, w = ctx.shape(x)
    b = node.attr("blocksize")
    cc = _simplify(c // (b * b))
    if node.attr("mode", "DCR") == "DCR":
        y = ctx.emit(_op.reshape(x, (n, b, b, cc, h, w)))
        y = ctx.emit(_op.permute_dims(y, [0, 3, 4, 1, 5, 2]))
    else:
        y = ctx.emit(_op.reshape(x, (n, cc, b, b, h, w)))
        y = ctx.emit(_op.permute_dims(y, [0, 1, 4, 2, 5, 3]))
    return _op.reshape(y, (n, cc, _simplify(h * b), _simplify(w * b)))


@converter("SpaceToDepth", family="tensor", doc="move spatial blocks into channels")
def _space_to_depth(ctx, node):
    x = ctx.input(node, 0)
    n, c, h, w = ctx.shape(x)
    b = node.attr("blocksize")
    hh, ww = _simplify(h // b), _simplify(w // b)
    y = ctx.emit(_op.reshape(x, (n, c, hh, b, ww, b)))
    if node.attr("mode", "DCR") == "CRD":
        y = ctx.emit(_op.permute_dims(y, [0, 1, 3, 5, 2, 4]))
    else:
        y = ctx.emit(_op.permute_dims(y, [0, 3, 5, 1, 2, 4]))
    return _op.reshape(y, (n, _simplify(c * b * b), hh, ww))


# ---------------------------------------------------------------------------------------------
# CenterCropPad


@converter("CenterCropPad", family="tensor",
           doc="crop or pad each axis symmetrically to a shape")
def _center_crop_pad(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    axes = node.attr("axes")
    axes = norm_axes(axes, len(xs)) if axes is not None else list(range(len(xs)))
    target = ctx.maybe_ints(node, 1)
    if target is None:   # computed at run time: fresh dims
        t = runtime_ints(ctx, node, 1, "shape")
        if static_length(ctx, t, "shape") != len(axes):
            raise ConversionError(f"CenterCropPad: the shape has {static_length(ctx, t, 'shape')} "
                                  f"entries for {len(axes)} axes")
        target = list(ctx.runtime_dims(t, "crop"))
    if len(target) != len(axes):
        raise ConversionError(f"CenterCropPad: the shape has {len(target)} entries for "
                              f"{len(axes)} axes")
    if all(static_int(xs[a]) is not None and static_int(t) is not None
           for a, t in zip(axes, target)):
        return _center_crop_pad_static(ctx, node, x, xs, axes, [static_int(t) for t in target])
    # symbolic sizes: one kernel; a cropped axis starts at (d - t) // 2, a padded one puts
    # (t - d) // 2 zeros first (ONNX's reference)
    out = list(xs)
    for a, t in zip(axes, target):
        out[a] = _i(t)
    offset = {a: Select(_i(t) <= xs[a], FloorDiv(xs[a] - _i(t), 2),
                        -FloorDiv(_i(t) - xs[a], 2)) for a, t in zip(axes, target)}

    def kernel(data):
        def f(*i):
            src = [iv + offset[k] if k in offset else iv for k, iv in enumerate(i)]
            inside = te.all(*[(src[k] >= 0) & (src[k] < xs[k]) for k in offset])
            return te.if_then_else(inside, data[tuple(src)], te.const(0, data.dtype))
        return te.compute(out, f, "T_center_crop_pad")
    return emit_kernel(ctx, kernel, x, name="center_crop_pad",
                       scalars=[_i(t) for t in target])


def _center_crop_pad_static(ctx, node, x, xs, axes, target):
    y = x
    for a, t in zip(axes, target):
        d = static_int(xs[a])
        if t < d:
            off = (d - t) // 2
            y = ctx.emit(_op.strided_slice(y, [a], [off], [off + t]))
        elif t > d:
            before = (t - d) // 2
            width = [(0, 0)] * len(xs)
            width[a] = (before, t - d - before)
            dtype = ctx.dtype(y)
            y = ctx.emit(_op.pad(y, width, 0.0 if dt.is_float(dtype) else 0))
    if y is x:
        return ctx.value(node, 0)
    return y
