"""Shape-manipulation operators: reshape, flatten, permute_dims, expand_dims, squeeze, concat,
split, strided_slice, tile, broadcast_to, pad, flip, repeat.

Every operator infers its output struct info symbolically (``tensorir.arith``): dims that are
provably incompatible raise ``RelaxError`` naming the op and the dims when the graph is built;
dims that cannot be decided (two different symbolic variables) are assumed compatible and the
legalized kernel checks them at run time with an ``AssertStmt`` around its loops (element
counts of ``reshape``, squeezed dims, concatenated dims, split divisibility, broadcast dims).
Symbolic shape variables are assumed to be non-negative.

All of them legalize to ``tensorir.te`` (through ``helpers.call_te``) and are
``INJECTIVE`` (pure data movement) as in TVM, except ``broadcast_to`` (``BROADCAST``).

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo, op
>>> x = Var("x", TensorStructInfo(("n", 12, 64), "float32"))
>>> op.reshape(x, (-1, 64)).struct_info
Tensor((n * 12, 64), 'float32')
"""
from __future__ import annotations

from math import gcd
from typing import Sequence

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import IntImm, Max, Min, Mul, PrimExpr
from tilecraft.tensorir.structural import structural_equal

from ..expr import Call, Expr, RelaxError, Tuple, TupleGetItem
from ..struct_info import StructInfo, TensorStructInfo, TupleStructInfo, shape_of_sinfo
from .base import OpPattern, as_expr, call as _make_call, register_op
from .helpers import (RESHAPE_VIEW, broadcast_assumptions, broadcast_index, broadcast_shapes,
                      call_te, fmt_dim, fmt_shape, imm, int64_expr, max_expr, min_expr,
                      normalize_axis, product, shape_analyzer, shape_expr, shape_values,
                      te_reshape, tensor_sinfo, unravel_index)

__all__ = ["reshape", "flatten", "permute_dims", "transpose", "expand_dims", "squeeze", "concat",
           "split", "strided_slice", "tile", "broadcast_to", "pad", "flip", "repeat"]

# A static begin/end at least this large means "to the end of the dimension" (ONNX and PyTorch
# write INT32_MAX / INT64_MAX for that); symbolic dims are assumed smaller than it.
_TO_THE_END = 2 ** 31 - 1


# ==============================================================================================
# helpers of the operators below (those other operator files use are in helpers.py)


def _factors(e) -> list[PrimExpr]:
    if isinstance(e, Mul):
        return _factors(e.a) + _factors(e.b)
    return [e]


def _cancel(num_dims, den_dims, ana) -> tuple[PrimExpr, PrimExpr]:
    """``prod(num_dims) / prod(den_dims)`` as ``(numerator, denominator)`` with common
    symbolic factors and the gcd of the constants cancelled: ``(n, 12, 64) / (n * 12, 8)``
    gives ``(8, 1)``. (The simplifier does not cancel symbolic factors across a division.)"""
    num = [f for d in num_dims for f in _factors(ana.simplify(d))]
    den = [f for d in den_dims for f in _factors(ana.simplify(d))]
    for f in list(den):
        if isinstance(f, IntImm):
            continue
        for k, g in enumerate(num):
            if structural_equal(f, g):
                del num[k]
                den.remove(f)
                break
    cn = 1
    for f in [f for f in num if isinstance(f, IntImm)]:
        cn *= f.value
    cd = 1
    for f in [f for f in den if isinstance(f, IntImm)]:
        cd *= f.value
    g = gcd(cn, cd) or 1
    num = [IntImm(cn // g, "int64")] + [f for f in num if not isinstance(f, IntImm)]
    den = [IntImm(cd // g, "int64")] + [f for f in den if not isinstance(f, IntImm)]
    return product(num, ana), product(den, ana)


def _static(e) -> int | None:
    return e.value if isinstance(e, IntImm) else None


def _norm_axes(op: str, axes, ndim: int, node=None, what: str = "axis") -> tuple[int, ...]:
    if isinstance(axes, int) or hasattr(axes, "__index__"):
        axes = [axes]
    out = tuple(normalize_axis(op, a, ndim, what, node=node) for a in axes)
    if len(set(out)) != len(out):
        raise RelaxError(f"{op}: repeated {what} in {tuple(axes)!r}", node)
    return out


def _int_tuple(op: str, values, what: str) -> tuple[int, ...]:
    if isinstance(values, int) or hasattr(values, "__index__"):
        values = [values]
    out = []
    for v in values:
        if isinstance(v, bool) or not (isinstance(v, int) or hasattr(v, "__index__")):
            raise RelaxError(f"{op}: {what} must be integers, got {tuple(values)!r}")
        out.append(int(v))
    return tuple(out)


def _check(ana, cond, message: str):
    """``(cond, message)`` for a run-time check, or None when ``cond`` is provable."""
    return None if ana.can_prove(cond) else (cond, message)


def _tuple_fields(bb, expr: Expr) -> list[Expr]:
    """The fields of a tuple-valued expression (a Tuple, or a variable bound to one)."""
    if isinstance(expr, Tuple):
        return list(expr.fields)
    si = expr.struct_info
    if not isinstance(si, TupleStructInfo):
        raise RelaxError(f"expected a tuple of tensors, got {si!r}", expr)
    return [bb.emit(TupleGetItem(expr, i)) for i in range(len(si.fields))]


# ==============================================================================================
# reshape / flatten


def reshape(x: Expr, shape) -> Call:
    """Reshape ``x`` to ``shape`` (row-major), as ``numpy.reshape``.

    ``shape`` is a tuple of ints and int64 PrimExprs with at most one ``-1`` (inferred from the
    element count, symbolically: ``(n, 12, 64) -> (-1, 64)`` gives ``(n * 12, 64)``), or a
    ``ShapeExpr`` / Var of ``ShapeStructInfo``. The element counts must be equal: provably
    different counts raise ``RelaxError``; counts that cannot be compared at build time are
    checked at run time by the kernel. (ONNX's "0 copies the input dim" is the frontend's job.)

    Examples
    --------
    >>> x = Var("x", TensorStructInfo((2, 3, 4), "float32"))
    >>> reshape(x, (6, -1)).struct_info
    Tensor((6, 4), 'float32')
    """
    x = as_expr(x)
    if isinstance(shape, Expr):
        return _make_call("relax.reshape", [x, shape_expr("relax.reshape", shape)])
    if isinstance(shape, (int, PrimExpr)):
        shape = (shape,)
    shape = list(shape)
    holes = [i for i, d in enumerate(shape) if isinstance(d, int) and not isinstance(d, bool)
             and d < 0]
    for i in holes:
        if shape[i] != -1:
            raise RelaxError(f"relax.reshape: bad dimension {shape[i]} in {tuple(shape)!r} (only "
                             f"-1 may be negative)", x)
    if len(holes) > 1:
        raise RelaxError(f"relax.reshape: at most one dimension can be -1, got {tuple(shape)!r}",
                         x)
    if holes:
        si = x.struct_info
        if not isinstance(si, TensorStructInfo) or si.shape is None:
            raise RelaxError(f"relax.reshape: cannot infer the -1 in {tuple(shape)!r} for an input "
                             f"of unknown shape ({si!r})", x)
        known = [int64_expr(d) for j, d in enumerate(shape) if j != holes[0]]
        ana = shape_analyzer(si.shape, known)
        total, part = product(si.shape, ana), product(known, ana)
        if _static(part) == 0:
            raise RelaxError(f"relax.reshape: cannot infer the -1 in {tuple(shape)!r}: the other "
                             f"dims have 0 elements", x)
        num, den = _cancel(si.shape, known, ana)
        if _static(den) != 1 and ana.can_prove(num % den != 0):
            raise RelaxError(f"relax.reshape: cannot reshape {fmt_shape(si.shape)} into "
                             f"{tuple(shape)!r}: {fmt_dim(total)} elements are not a multiple "
                             f"of {fmt_dim(part)}", x)
        shape[holes[0]] = num if _static(den) == 1 else ana.simplify(num // den)
    return _make_call("relax.reshape", [x, shape_expr("relax.reshape", shape)])


def _infer_reshape(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    new = shape_values(call, 1)
    if new is None:
        return TensorStructInfo(None, si.dtype, ndim=call.args[1].struct_info.ndim)
    if si.shape is not None:
        ana = shape_analyzer(si.shape, new)
        a, b = product(si.shape, ana), product(new, ana)
        if ana.can_prove(a != b):
            raise RelaxError(f"relax.reshape: cannot reshape {fmt_shape(si.shape)} into "
                             f"{fmt_shape(new)}: {fmt_dim(a)} elements into {fmt_dim(b)}", call)
    return TensorStructInfo(new, si.dtype)


def _reshape_checks(call: Call, old, new):
    ana = shape_analyzer(old, new)
    return [_check(ana, product(old, ana) == product(new, ana),
                   f"{call.op.name}: the element count of the input {fmt_shape(old)} differs from "
                   f"that of the output {fmt_shape(new)}")]


def _legalize_reshape(bb, call: Call):
    x = call.args[0]
    new = call.struct_info.shape
    if new is None:
        raise RelaxError(f"{call.op.name}: the target shape is unknown; match_cast it to a "
                         f"shape of known rank and dims first", call)
    old = shape_of_sinfo(x.struct_info, f"{call.op.name} input")
    return call_te(bb, te_reshape, x, new, checks=_reshape_checks(call, old, new),
                   primfunc_name_hint="reshape", attrs={RESHAPE_VIEW: True})


register_op("relax.reshape", _infer_reshape, _legalize_reshape, OpPattern.INJECTIVE,
            doc="Reshape a tensor (row-major); the element count must not change.")


def flatten(x: Expr, start_dim: int = 0, end_dim: int = -1) -> Call:
    """Merge dims ``start_dim..end_dim`` (inclusive) into one, as ``torch.flatten``.

    The defaults flatten to 1-D, as TVM's ``relax.op.flatten`` (a 0-d tensor becomes ``(1,)``).
    ONNX ``Flatten(axis=a)`` (always 2-D) is ``flatten(flatten(x, a), 0, a - 1)`` for ``a >= 1``
    and ``reshape(x, (1, -1))`` for ``a == 0``.

    Examples
    --------
    >>> x = Var("x", TensorStructInfo(("n", 3, 4, 5), "float32"))
    >>> flatten(x, 1).struct_info
    Tensor((n, 60), 'float32')
    """
    return _make_call("relax.flatten", [as_expr(x)],
                      {"start_dim": int(start_dim), "end_dim": int(end_dim)})


def _infer_flatten(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    a = call.attr_dict
    if si.ndim == 0:
        return TensorStructInfo((1,), si.dtype)
    if si.ndim < 0:
        return TensorStructInfo(None, si.dtype)
    s = normalize_axis(call.op.name, a["start_dim"], si.ndim, "start_dim", node=call)
    e = normalize_axis(call.op.name, a["end_dim"], si.ndim, "end_dim", node=call)
    if e < s:
        raise RelaxError(f"{call.op.name}: end_dim {a['end_dim']} comes before start_dim "
                         f"{a['start_dim']} for a tensor of rank {si.ndim}", call)
    if si.shape is None:
        return TensorStructInfo(None, si.dtype, ndim=si.ndim - (e - s))
    shape = si.shape[:s] + (product(si.shape[s:e + 1]),) + si.shape[e + 1:]
    return TensorStructInfo(shape, si.dtype)


register_op("relax.flatten", _infer_flatten, _legalize_reshape, OpPattern.INJECTIVE,
            doc="Merge a range of dims into one (to 1-D by default).")


# ==============================================================================================
# permute_dims / expand_dims / squeeze


def permute_dims(x: Expr, axes: Sequence[int] | None = None) -> Call:
    """Permute the dims of ``x``: output dim ``i`` is input dim ``axes[i]``; ``None`` reverses
    them (``numpy.transpose``).

    Examples
    --------
    >>> x = Var("x", TensorStructInfo(("n", 3, 4), "float32"))
    >>> permute_dims(x, (2, 0, 1)).struct_info
    Tensor((4, n, 3), 'float32')
    """
    return _make_call("relax.permute_dims", [as_expr(x)],
                      {"axes": None if axes is None else _int_tuple("relax.permute_dims", axes,
                                                                    "axes")})


transpose = permute_dims


def _perm(call: Call, ndim: int) -> tuple[int, ...]:
    axes = call.attr_dict["axes"]
    if axes is None:
        return tuple(reversed(range(ndim)))
    if len(axes) != ndim:
        raise RelaxError(f"{call.op.name}: axes {axes} has {len(axes)} entries for a tensor of "
                         f"rank {ndim}", call)
    perm = tuple(normalize_axis(call.op.name, a, ndim, "axes entry", node=call) for a in axes)
    if sorted(perm) != list(range(ndim)):
        raise RelaxError(f"{call.op.name}: axes {axes} is not a permutation of {ndim} axes", call)
    return perm


def _infer_permute_dims(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    if si.ndim < 0:
        return TensorStructInfo(None, si.dtype)
    perm = _perm(call, si.ndim)
    if si.shape is None:
        return TensorStructInfo(None, si.dtype, ndim=si.ndim)
    return TensorStructInfo([si.shape[p] for p in perm], si.dtype)


def _legalize_permute_dims(bb, call: Call):
    x = call.args[0]
    perm = _perm(call, x.struct_info.ndim)

    def permute(a):
        inv = [perm.index(d) for d in range(len(perm))]
        return te.compute([a.shape[p] for p in perm], lambda *i: a[tuple(i[k] for k in inv)],
                          "T_transpose")
    return call_te(bb, permute, x, primfunc_name_hint="transpose")


register_op("relax.permute_dims", _infer_permute_dims, _legalize_permute_dims,
            OpPattern.INJECTIVE, doc="Permute (transpose) the dims of a tensor.")


def expand_dims(x: Expr, axis) -> Call:
    """Insert dims of extent 1 at the positions ``axis`` (an int or a list) of the output.

    Examples
    --------
    >>> x = Var("x", TensorStructInfo(("n", 4), "float32"))
    >>> expand_dims(x, (0, -1)).struct_info
    Tensor((1, n, 4, 1), 'float32')
    """
    return _make_call("relax.expand_dims", [as_expr(x)],
                      {"axis": _int_tuple("relax.expand_dims", axis, "axis")})


def _expand_axes(call: Call, ndim: int) -> tuple[int, ...]:
    axes = call.attr_dict["axis"]
    return _norm_axes(call.op.name, axes, ndim + len(axes), call)


def _infer_expand_dims(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    if si.ndim < 0:
        return TensorStructInfo(None, si.dtype)
    axes = _expand_axes(call, si.ndim)
    out_ndim = si.ndim + len(axes)
    if si.shape is None:
        return TensorStructInfo(None, si.dtype, ndim=out_ndim)
    it = iter(si.shape)
    return TensorStructInfo([1 if d in axes else next(it) for d in range(out_ndim)], si.dtype)


def _legalize_expand_dims(bb, call: Call):
    x = call.args[0]
    axes = _expand_axes(call, x.struct_info.ndim)
    shape = call.struct_info.shape

    def expand(a):
        keep = [d for d in range(len(shape)) if d not in axes]
        return te.compute(shape, lambda *i: a[tuple(i[d] for d in keep)], "T_expand_dims")
    return call_te(bb, expand, x, primfunc_name_hint="expand_dims", attrs={RESHAPE_VIEW: True})


register_op("relax.expand_dims", _infer_expand_dims, _legalize_expand_dims, OpPattern.INJECTIVE,
            doc="Insert dims of extent 1.")


def squeeze(x: Expr, axis=None) -> Call:
    """Remove dims of extent 1: those of ``axis`` (an int or a list), or with ``axis=None`` every
    dim that is statically 1 (symbolic dims are kept then).

    A listed dim that is statically not 1 raises ``RelaxError``; a symbolic one is assumed to be
    1 and checked at run time.

    Examples
    --------
    >>> x = Var("x", TensorStructInfo((1, "n", 1), "float32"))
    >>> squeeze(x).struct_info
    Tensor((n,), 'float32')
    """
    return _make_call("relax.squeeze", [as_expr(x)],
                      {"axis": None if axis is None else _int_tuple("relax.squeeze", axis,
                                                                    "axis")})


def _squeeze_axes(call: Call, si: TensorStructInfo) -> tuple[int, ...]:
    axis = call.attr_dict["axis"]
    if axis is None:
        return tuple(d for d, e in enumerate(si.shape) if _static(e) == 1)
    axes = _norm_axes(call.op.name, axis, si.ndim, call)
    if si.shape is not None:
        for d in axes:
            if _static(si.shape[d]) not in (None, 1):
                raise RelaxError(f"{call.op.name}: dimension {d} of {fmt_shape(si.shape)} is "
                                 f"{fmt_dim(si.shape[d])}, not 1; it cannot be squeezed", call)
    return axes


def _infer_squeeze(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    if si.shape is None:
        if call.attr_dict["axis"] is None or si.ndim < 0:
            return TensorStructInfo(None, si.dtype)
        axes = _norm_axes(call.op.name, call.attr_dict["axis"], si.ndim, call)
        return TensorStructInfo(None, si.dtype, ndim=si.ndim - len(axes))
    axes = _squeeze_axes(call, si)
    return TensorStructInfo([e for d, e in enumerate(si.shape) if d not in axes], si.dtype)


def _legalize_squeeze(bb, call: Call):
    x = call.args[0]
    si = x.struct_info
    axes = _squeeze_axes(call, si)
    ana = shape_analyzer(si.shape)
    checks = [_check(ana, si.shape[d] == 1,
                     f"{call.op.name}: dimension {d} of {fmt_shape(si.shape)} must be 1")
              for d in axes]
    # only a squeeze of dims known to be 1 moves no element whatever the input: a view
    view = {RESHAPE_VIEW: True} if not [c for c in checks if c is not None] else None
    return call_te(bb, te_reshape, x, call.struct_info.shape, checks=checks,
                   primfunc_name_hint="squeeze", attrs=view)


register_op("relax.squeeze", _infer_squeeze, _legalize_squeeze, OpPattern.INJECTIVE,
            doc="Remove dims of extent 1.")


# ==============================================================================================
# concat / split


def concat(tensors, axis: int = 0) -> Call:
    """Concatenate tensors along ``axis``; symbolic extents add up: ``(n, 4)`` and ``(m, 4)``
    give ``(n + m, 4)``. The other dims must agree (checked at run time when symbolic).

    ``tensors`` is a list of tensor expressions or one tuple-valued expression.

    Examples
    --------
    >>> a = Var("a", TensorStructInfo(("n", 4), "float32"))
    >>> b = Var("b", TensorStructInfo(("m", 4), "float32"))
    >>> concat([a, b]).struct_info
    Tensor((n + m, 4), 'float32')
    """
    if isinstance(tensors, (list, tuple)):
        tensors = Tuple([as_expr(t) for t in tensors])
    return _make_call("relax.concat", [tensors], {"axis": int(axis)})


def _concat_fields(call: Call) -> list[TensorStructInfo]:
    si = call.args[0].struct_info
    if not isinstance(si, TupleStructInfo):
        raise RelaxError(f"{call.op.name}: expects a tuple of tensors, got {si!r}", call)
    if not si.fields:
        raise RelaxError(f"{call.op.name}: needs at least one tensor", call)
    for k, f in enumerate(si.fields):
        if not isinstance(f, TensorStructInfo):
            raise RelaxError(f"{call.op.name}: input {k} is not a tensor ({f!r})", call)
    return list(si.fields)


def _infer_concat(call: Call) -> StructInfo:
    fields = _concat_fields(call)
    dtype = fields[0].dtype
    for k, f in enumerate(fields):
        if f.dtype != dtype:
            raise RelaxError(f"{call.op.name}: input {k} has dtype {f.dtype}, input 0 has "
                             f"{dtype}", call)
    ndims = {f.ndim for f in fields if f.ndim >= 0}
    if len(ndims) > 1:
        raise RelaxError(f"{call.op.name}: the inputs have different ranks "
                         f"{[f.ndim for f in fields]}", call)
    if not ndims:
        return TensorStructInfo(None, dtype)
    ndim = ndims.pop()
    if ndim == 0:
        raise RelaxError(f"{call.op.name}: cannot concatenate 0-d tensors", call)
    axis = normalize_axis(call.op.name, call.attr_dict["axis"], ndim, node=call)
    if any(f.shape is None for f in fields):
        return TensorStructInfo(None, dtype, ndim=ndim)
    ana = shape_analyzer([f.shape for f in fields])
    out = []
    for d in range(ndim):
        if d == axis:
            # symbolic extents in input order, then the static ones: (n, 4) ++ (m, 4) -> n + m
            const = sum(f.shape[d].value for f in fields if isinstance(f.shape[d], IntImm))
            terms = [f.shape[d] for f in fields if not isinstance(f.shape[d], IntImm)]
            total: PrimExpr = terms[0] if terms else IntImm(const, "int64")
            for t in terms[1:]:
                total = total + t
            if terms and const:
                total = total + const
            out.append(total)
            continue
        dim = fields[0].shape[d]
        for k, f in enumerate(fields[1:], 1):
            if ana.can_prove(f.shape[d] != dim):
                raise RelaxError(f"{call.op.name}: dimension {d} differs: {fmt_dim(dim)} "
                                 f"(input 0 {fmt_shape(fields[0].shape)}) vs {fmt_dim(f.shape[d])} "
                                 f"(input {k} {fmt_shape(f.shape)}), concatenating along axis "
                                 f"{axis}", call)
            if not isinstance(dim, IntImm) and isinstance(f.shape[d], IntImm):
                dim = f.shape[d]  # prefer a static dim
        out.append(dim)
    return TensorStructInfo(out, dtype)


def _legalize_concat(bb, call: Call):
    tensors = _tuple_fields(bb, call.args[0])
    out_shape = call.struct_info.shape
    axis = normalize_axis(call.op.name, call.attr_dict["axis"], len(out_shape), node=call)
    shapes = [shape_of_sinfo(t.struct_info, f"{call.op.name} input") for t in tensors]
    ana = shape_analyzer(shapes)
    checks = []
    for k, s in enumerate(shapes):
        for d in range(len(out_shape)):
            if d != axis:
                checks.append(_check(ana, s[d] == out_shape[d],
                                     f"{call.op.name}: dimension {d} of input {k} {fmt_shape(s)} "
                                     f"differs from {fmt_dim(out_shape[d])}"))

    def concatenate(ts):
        offsets = [IntImm(0, "int64")]
        for t in ts:
            offsets.append(ana.simplify(offsets[-1] + t.shape[axis]))

        def f(*i):
            def at(k):
                return ts[k][i[:axis] + (i[axis] - offsets[k],) + i[axis + 1:]]
            value = at(len(ts) - 1)
            for k in reversed(range(len(ts) - 1)):
                value = te.if_then_else(i[axis] < offsets[k + 1], at(k), value)
            return value
        return te.compute(out_shape, f, "T_concat")
    return call_te(bb, concatenate, tensors, checks=checks, primfunc_name_hint="concatenate")


register_op("relax.concat", _infer_concat, _legalize_concat, OpPattern.INJECTIVE,
            doc="Concatenate tensors along an axis.")


def split(x: Expr, indices_or_sections, axis: int = 0) -> Call:
    """Split ``x`` along ``axis`` into a tuple, as ``numpy.split``.

    An int gives that many equal sections (it must divide the dim; a symbolic dim is checked at
    run time); a list of indices gives the pieces ``[0:i0], [i0:i1], ..., [ik:]`` (indices are
    clamped and may be negative, like slice bounds).

    Examples
    --------
    >>> x = Var("x", TensorStructInfo(("n", 12), "float32"))
    >>> split(x, [4, 10], axis=1).struct_info
    Tuple(Tensor((n, 4), 'float32'), Tensor((n, 6), 'float32'), Tensor((n, 2), 'float32'))
    """
    if isinstance(indices_or_sections, (list, tuple)):
        ios = _int_tuple("relax.split", indices_or_sections, "indices")
    else:
        ios = int(indices_or_sections)
        if ios < 1:
            raise RelaxError(f"relax.split: the number of sections must be >= 1, got {ios}")
    return _make_call("relax.split", [as_expr(x)], {"indices_or_sections": ios,
                                                    "axis": int(axis)})


def _split_pieces(call: Call, si: TensorStructInfo):
    """``[(begin, extent)]`` of each piece along the (normalized) axis."""
    axis = normalize_axis(call.op.name, call.attr_dict["axis"], si.ndim, node=call)
    ios = call.attr_dict["indices_or_sections"]
    n = si.shape[axis]
    ana = shape_analyzer(si.shape)
    if isinstance(ios, int):
        if ana.can_prove(n % ios != 0):
            raise RelaxError(f"{call.op.name}: {ios} sections do not divide dimension {axis} "
                             f"of {fmt_shape(si.shape)} (extent {fmt_dim(n)})", call)
        size = ana.simplify(n // ios)
        return axis, [(ana.simplify(size * k), size) for k in range(ios)]
    bounds = [None] + list(ios) + [None]
    pieces = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        start, extent = _slice_range(ana, 0 if lo is None else lo,
                                     _TO_THE_END if hi is None else hi, 1, n)
        pieces.append((start, extent))
    return axis, pieces


def _infer_split(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    ios = call.attr_dict["indices_or_sections"]
    count = ios if isinstance(ios, int) else len(ios) + 1
    if si.ndim < 0:
        return TupleStructInfo([TensorStructInfo(None, si.dtype)] * count)
    if si.ndim == 0:
        raise RelaxError(f"{call.op.name}: cannot split a 0-d tensor", call)
    if si.shape is None:
        normalize_axis(call.op.name, call.attr_dict["axis"], si.ndim, node=call)
        return TupleStructInfo([TensorStructInfo(None, si.dtype, ndim=si.ndim)] * count)
    axis, pieces = _split_pieces(call, si)
    return TupleStructInfo([TensorStructInfo(si.shape[:axis] + (ext,) + si.shape[axis + 1:],
                                             si.dtype) for _, ext in pieces])


def _legalize_split(bb, call: Call):
    x = call.args[0]
    si = x.struct_info
    axis, pieces = _split_pieces(call, si)
    ios = call.attr_dict["indices_or_sections"]
    checks = []
    if isinstance(ios, int):
        ana = shape_analyzer(si.shape)
        checks.append(_check(ana, si.shape[axis] % ios == 0,
                             f"{call.op.name}: {ios} sections do not divide dimension {axis} of "
                             f"{fmt_shape(si.shape)}"))

    def split_te(a):
        outs = []
        for k, (start, ext) in enumerate(pieces):
            shape = a.shape[:axis] + (ext,) + a.shape[axis + 1:]
            outs.append(te.compute(
                shape, lambda *i, _s=start: a[i[:axis] + (i[axis] + _s,) + i[axis + 1:]],
                f"T_split_{k}"))
        return outs
    return call_te(bb, split_te, x, checks=checks, primfunc_name_hint="split")


register_op("relax.split", _infer_split, _legalize_split, OpPattern.INJECTIVE,
            doc="Split a tensor into a tuple of pieces along an axis.")


# ==============================================================================================
# strided_slice


def _sub(ana, a, b) -> PrimExpr:
    """``a - b`` with ``x - min(p, q) = max(x - p, x - q)`` (and the max dual) applied, which
    the simplifier does not do: ``n - min(1, n)`` becomes ``max(n - 1, 0)``."""
    if isinstance(b, Min):
        return max_expr(ana, _sub(ana, a, b.a), _sub(ana, a, b.b))
    if isinstance(b, Max):
        return min_expr(ana, _sub(ana, a, b.a), _sub(ana, a, b.b))
    if isinstance(a, Min):
        return min_expr(ana, _sub(ana, a.a, b), _sub(ana, a.b, b))
    if isinstance(a, Max):
        return max_expr(ana, _sub(ana, a.a, b), _sub(ana, a.b, b))
    return ana.simplify(a - b)


def _slice_range(ana, begin, end, stride: int, n, assume_inbound: bool = False):
    """``(start, extent)`` of ``range(n)[begin:end:stride]``, as Python / numpy / ONNX Slice:
    negative bounds count from the end, bounds are clamped. Static bounds of at least
    ``_TO_THE_END`` mean the end of the dim (for a negative stride: a huge negative ``end``
    means before the start)."""
    n = int64_expr(n)

    def norm(v):
        if isinstance(v, int) and v >= _TO_THE_END:
            return None, "end"
        if isinstance(v, int) and v <= -_TO_THE_END:
            return None, "begin"
        v = int64_expr(v)
        if ana.can_prove(v >= 0):
            return ana.simplify(v), None
        if ana.can_prove(v < 0):
            return ana.simplify(v + n), None
        # a symbolic bound of unknown sign counts from the start (``x[:, :seq_len]``); it is
        # still clamped to the dim
        return ana.simplify(v), None

    b, bflag = norm(begin)
    e, eflag = norm(end)
    if stride > 0:
        lower, upper = IntImm(0, "int64"), n
    else:
        lower, upper = IntImm(-1, "int64"), ana.simplify(n - 1)

    def clamp(v, flag):
        if flag == "end":
            return upper
        if flag == "begin":
            return lower
        if assume_inbound:
            return v
        return max_expr(ana, lower, min_expr(ana, v, upper))

    start, stop = clamp(b, bflag), clamp(e, eflag)
    same_sign = (isinstance(begin, int) and isinstance(end, int) and not bflag and not eflag
                 and (begin >= 0) == (end >= 0))
    if stride > 0 and same_sign and not assume_inbound and not isinstance(n, IntImm):
        # closed forms of stop - start for static bounds on a symbolic dim
        if begin >= 0:
            span = min_expr(ana, max_expr(ana, n - begin, 0), max(end - begin, 0))
        else:
            span = min_expr(ana, max(end - begin, 0), max_expr(ana, n + end, 0))
        extent = span if stride == 1 else (span + (stride - 1)) // stride
        return start, ana.simplify(extent)
    if stride > 0:
        span = _sub(ana, stop, start)
        extent = span if stride == 1 else (span + (stride - 1)) // stride
    else:
        span = _sub(ana, start, stop)
        extent = span if stride == -1 else (span + (-stride - 1)) // (-stride)
    extent = ana.simplify(extent)
    if not assume_inbound:
        extent = max_expr(ana, 0, extent)
    return start, extent


def strided_slice(x: Expr, axes: Sequence[int] | None, begin: Sequence, end: Sequence,
                  strides: Sequence[int] | None = None, assume_inbound: bool = False) -> Call:
    """Slice ``x[begin:end:stride]`` along each of ``axes`` (others are kept whole), with the
    semantics of numpy slicing and ONNX ``Slice``: negative ``begin`` / ``end`` count from the
    end, out-of-range bounds are clamped, strides may be negative (then a ``begin`` past the end
    starts at the last element). ``begin`` / ``end`` entries may be int64 PrimExprs (one whose
    sign cannot be proven counts from the start, as ``x[:, :seq_len]``; it is still clamped);
    static entries of at least 2**31 - 1 (INT32_MAX, INT64_MAX) mean "to the end".

    With symbolic dims the extents keep the clamping as ``min`` / ``max`` where it cannot be
    decided; ``assume_inbound=True`` trusts the (sign-normalized) bounds to lie inside the dim,
    giving simpler extents (accesses are still bounds-checked by the kernel).

    Examples
    --------
    >>> x = Var("x", TensorStructInfo((10, "n"), "float32"))
    >>> strided_slice(x, [0], [-3], [100]).struct_info
    Tensor((3, n), 'float32')
    >>> strided_slice(x, [0], [8], [1], [-2]).struct_info
    Tensor((4, n), 'float32')
    """
    begin, end = list(begin), list(end)
    if axes is None:
        axes = list(range(len(begin)))
    axes = _int_tuple("relax.strided_slice", axes, "axes")
    strides = (1,) * len(axes) if strides is None else _int_tuple("relax.strided_slice", strides,
                                                                  "strides")
    if not len(axes) == len(begin) == len(end) == len(strides):
        raise RelaxError(f"relax.strided_slice: axes, begin, end and strides must have the same "
                         f"length, got {len(axes)}, {len(begin)}, {len(end)}, {len(strides)}")
    for s in strides:
        if s == 0:
            raise RelaxError(f"relax.strided_slice: a stride cannot be 0 (strides {strides})")

    def entry(v):
        if isinstance(v, PrimExpr):
            return int64_expr(v)
        return int(v)
    return _make_call("relax.strided_slice", [as_expr(x)],
                      {"axes": axes, "begin": tuple(entry(v) for v in begin),
                       "end": tuple(entry(v) for v in end), "strides": strides,
                       "assume_inbound": bool(assume_inbound)})


def _slice_ranges(call: Call, si: TensorStructInfo) -> list:
    """Per dim of the input: ``(start, extent, stride)``."""
    a = call.attr_dict
    axes = _norm_axes(call.op.name, a["axes"], si.ndim, call, "axes entry")
    ana = shape_analyzer(si.shape)
    out = [(IntImm(0, "int64"), d, 1) for d in si.shape]
    for ax, b, e, s in zip(axes, a["begin"], a["end"], a["strides"]):
        start, ext = _slice_range(ana, b, e, s, si.shape[ax], a["assume_inbound"])
        out[ax] = (start, ext, s)
    return out


def _infer_strided_slice(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    if si.shape is None:
        if si.ndim >= 0:
            _norm_axes(call.op.name, call.attr_dict["axes"], si.ndim, call, "axes entry")
        return TensorStructInfo(None, si.dtype, ndim=si.ndim)
    return TensorStructInfo([ext for _, ext, _ in _slice_ranges(call, si)], si.dtype)


def _legalize_strided_slice(bb, call: Call):
    x = call.args[0]
    ranges = _slice_ranges(call, x.struct_info)

    def slice_te(a):
        return te.compute([ext for _, ext, _ in ranges],
                          lambda *i: a[tuple(st + iv * s for iv, (st, _, s) in zip(i, ranges))],
                          "T_strided_slice")
    # a symbolic begin or stride that no buffer dim holds (begin = n when the result has m
    # rows) is a scalar parameter of the kernel
    return call_te(bb, slice_te, x, primfunc_name_hint="strided_slice",
                   scalars=[e for st, _, s in ranges for e in (st, s) if isinstance(e, PrimExpr)])


register_op("relax.strided_slice", _infer_strided_slice, _legalize_strided_slice,
            OpPattern.INJECTIVE, doc="Slice with begin/end/strides per axis (numpy semantics).")


# ==============================================================================================
# tile / broadcast_to / repeat / flip


def tile(x: Expr, repeats) -> Call:
    """Repeat the whole of ``x`` ``repeats[d]`` times along each dim, as ``numpy.tile`` (a shorter
    ``repeats`` is padded with 1s in front; a longer one adds leading dims).

    Examples
    --------
    >>> x = Var("x", TensorStructInfo(("n", 3), "float32"))
    >>> tile(x, (2, 2)).struct_info
    Tensor((n * 2, 6), 'float32')
    """
    reps = _int_tuple("relax.tile", repeats, "repeats")
    if any(r < 0 for r in reps):
        raise RelaxError(f"relax.tile: repeats must be >= 0, got {reps}")
    return _make_call("relax.tile", [as_expr(x)], {"repeats": reps})


def _tile_plan(call: Call, si: TensorStructInfo):
    reps = call.attr_dict["repeats"]
    ndim = max(si.ndim, len(reps))
    reps = (1,) * (ndim - len(reps)) + tuple(reps)
    return reps, ndim - si.ndim


def _infer_tile(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    if si.ndim < 0:
        return TensorStructInfo(None, si.dtype)
    reps, lead = _tile_plan(call, si)
    if si.shape is None:
        return TensorStructInfo(None, si.dtype, ndim=len(reps))
    shape = (IntImm(1, "int64"),) * lead + si.shape
    ana = shape_analyzer(si.shape)
    return TensorStructInfo([ana.simplify(d * r) for d, r in zip(shape, reps)], si.dtype)


def _legalize_tile(bb, call: Call):
    x = call.args[0]
    _, lead = _tile_plan(call, x.struct_info)

    def tile_te(a):
        return te.compute(call.struct_info.shape,
                          lambda *i: a[tuple(iv % d for iv, d in zip(i[lead:], a.shape))],
                          "T_tile")
    return call_te(bb, tile_te, x, primfunc_name_hint="tile")


register_op("relax.tile", _infer_tile, _legalize_tile, OpPattern.INJECTIVE,
            doc="Repeat a whole tensor along each dim (numpy.tile).")


def broadcast_to(x: Expr, shape) -> Call:
    """Broadcast ``x`` to ``shape`` with numpy's rules (dims aligned on the right; a dim of 1
    stretches). A symbolic dim against a different target dim is assumed equal and checked at
    run time.

    Examples
    --------
    >>> x = Var("x", TensorStructInfo((1, 4), "float32"))
    >>> broadcast_to(x, ("n", 3, 4)).struct_info
    Tensor((n, 3, 4), 'float32')
    """
    return _make_call("relax.broadcast_to", [as_expr(x), shape_expr("relax.broadcast_to",
                                                                     shape)])


def _broadcast_check(call: Call, shape, target):
    """Raise unless ``shape`` broadcasts to exactly ``target``; the dim pairs assumed equal."""
    if len(target) < len(shape):
        raise RelaxError(f"{call.op.name}: cannot broadcast {fmt_shape(shape)} to "
                         f"{fmt_shape(target)} of lower rank", call)
    out = broadcast_shapes(call.op.name, shape, target, node=call)
    ana = shape_analyzer(shape, target)
    for d, (o, t) in enumerate(zip(out, target)):
        if not ana.can_prove_equal(o, t):  # e.g. (3,) to (1,): the input is larger
            raise RelaxError(f"{call.op.name}: cannot broadcast {fmt_shape(shape)} to "
                             f"{fmt_shape(target)}: dimension {d} would be {fmt_dim(o)}", call)
    return broadcast_assumptions(call.op.name, shape, target)


def _infer_broadcast_to(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    target = shape_values(call, 1)
    if target is None:
        return TensorStructInfo(None, si.dtype, ndim=call.args[1].struct_info.ndim)
    if si.shape is not None:
        _broadcast_check(call, si.shape, target)
    elif si.ndim > len(target):
        raise RelaxError(f"{call.op.name}: cannot broadcast a rank-{si.ndim} tensor to "
                         f"{fmt_shape(target)}", call)
    return TensorStructInfo(target, si.dtype)


def _legalize_broadcast_to(bb, call: Call):
    x = call.args[0]
    si = x.struct_info
    target = call.struct_info.shape
    if target is None or si.shape is None:
        raise RelaxError(f"{call.op.name}: shapes must be known to legalize ({si!r} to "
                         f"{call.struct_info!r})", call)
    checks = [(a == b, f"{call.op.name}: dimension {fmt_dim(a)} and dimension {fmt_dim(b)} "
                       f"must be equal (symbolic dims are not broadcast at run time)")
              for a, b in _broadcast_check(call, si.shape, target)]

    def bcast(a):
        return te.compute(target, lambda *i: a[broadcast_index(i, a.shape, target)],
                          "T_broadcast_to")
    return call_te(bb, bcast, x, checks=checks, primfunc_name_hint="broadcast_to")


register_op("relax.broadcast_to", _infer_broadcast_to, _legalize_broadcast_to,
            OpPattern.BROADCAST, doc="Broadcast a tensor to a shape (numpy rules).")


def repeat(x: Expr, repeats: int, axis: int | None = None) -> Call:
    """Repeat each element ``repeats`` times along ``axis`` (``None``: of the flattened tensor),
    as ``numpy.repeat`` with an int ``repeats``.

    Examples
    --------
    >>> x = Var("x", TensorStructInfo(("n", 3), "float32"))
    >>> repeat(x, 2, axis=1).struct_info
    Tensor((n, 6), 'float32')
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 0:
        raise RelaxError(f"relax.repeat: repeats must be an int >= 0, got {repeats!r}")
    return _make_call("relax.repeat", [as_expr(x)],
                      {"repeats": repeats, "axis": None if axis is None else int(axis)})


def _infer_repeat(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    r, axis = call.attr_dict["repeats"], call.attr_dict["axis"]
    if si.shape is None:
        if axis is None:
            return TensorStructInfo(None, si.dtype, ndim=1)
        if si.ndim >= 0:
            normalize_axis(call.op.name, axis, si.ndim, node=call)
        return TensorStructInfo(None, si.dtype, ndim=si.ndim)
    ana = shape_analyzer(si.shape)
    if axis is None:
        return TensorStructInfo([ana.simplify(product(si.shape, ana) * r)], si.dtype)
    axis = normalize_axis(call.op.name, axis, si.ndim, node=call)
    return TensorStructInfo(si.shape[:axis] + (ana.simplify(si.shape[axis] * r),) +
                            si.shape[axis + 1:], si.dtype)


def _legalize_repeat(bb, call: Call):
    x = call.args[0]
    si = x.struct_info
    r, axis = call.attr_dict["repeats"], call.attr_dict["axis"]
    out = call.struct_info.shape
    if axis is None:
        def repeat_flat(a):
            return te.compute(out, lambda i: a[unravel_index(i // r, a.shape)], "T_repeat")
        return call_te(bb, repeat_flat, x, primfunc_name_hint="repeat")
    axis = normalize_axis(call.op.name, axis, si.ndim, node=call)

    def repeat_te(a):
        return te.compute(out, lambda *i: a[i[:axis] + (i[axis] // r,) + i[axis + 1:]],
                          "T_repeat")
    return call_te(bb, repeat_te, x, primfunc_name_hint="repeat")


register_op("relax.repeat", _infer_repeat, _legalize_repeat, OpPattern.INJECTIVE,
            doc="Repeat each element along an axis (numpy.repeat).")


def flip(x: Expr, axis) -> Call:
    """Reverse ``x`` along ``axis`` (an int or a list), as ``numpy.flip``.

    Examples
    --------
    >>> x = Var("x", TensorStructInfo(("n", 3), "float32"))
    >>> flip(x, 0).struct_info
    Tensor((n, 3), 'float32')
    """
    return _make_call("relax.flip", [as_expr(x)], {"axis": _int_tuple("relax.flip", axis,
                                                                      "axis")})


def _infer_flip(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    if si.ndim >= 0:
        _norm_axes(call.op.name, call.attr_dict["axis"], si.ndim, call)
    return si


def _legalize_flip(bb, call: Call):
    x = call.args[0]
    axes = _norm_axes(call.op.name, call.attr_dict["axis"], x.struct_info.ndim, call)

    def flip_te(a):
        return te.compute(a.shape, lambda *i: a[tuple(a.shape[d] - 1 - iv if d in axes else iv
                                                       for d, iv in enumerate(i))], "T_flip")
    return call_te(bb, flip_te, x, primfunc_name_hint="flip")


register_op("relax.flip", _infer_flip, _legalize_flip, OpPattern.INJECTIVE,
            doc="Reverse a tensor along axes.")


# ==============================================================================================
# pad


def pad(x: Expr, pad_width, pad_value=0, pad_mode: str = "constant") -> Call:
    """Pad ``x``: ``pad_width`` is numpy's ``[(before, after), ...]`` (one pair per dim) or TVM's
    flat ``[before_0, after_0, before_1, after_1, ...]``.

    ``pad_mode``: ``"constant"`` (``pad_value``, a Python number; negative widths crop, as ONNX
    Pad), ``"edge"`` (repeat the border element) or ``"reflect"`` (mirror without repeating the
    border, as numpy; widths must be smaller than the dim).

    Examples
    --------
    >>> x = Var("x", TensorStructInfo(("n", 3), "float32"))
    >>> pad(x, [(1, 2), (0, 1)]).struct_info
    Tensor((n + 3, 4), 'float32')
    """
    flat: list[int] = []
    for p in pad_width:
        if isinstance(p, (list, tuple)):
            if len(p) != 2:
                raise RelaxError(f"relax.pad: each pad_width entry must be (before, after), got "
                                 f"{p!r}")
            flat.extend(p)
        else:
            flat.append(p)
    flat_t = _int_tuple("relax.pad", flat, "pad_width")
    if pad_mode not in ("constant", "edge", "reflect"):
        raise RelaxError(f"relax.pad: unknown pad_mode {pad_mode!r} (constant, edge, reflect)")
    if pad_mode != "constant" and any(w < 0 for w in flat_t):
        raise RelaxError(f"relax.pad: negative pad widths {flat_t} are only allowed in constant "
                         f"mode")
    if isinstance(pad_value, bool) or not isinstance(pad_value, (int, float)):
        raise RelaxError(f"relax.pad: pad_value must be a Python number, got {pad_value!r}")
    return _make_call("relax.pad", [as_expr(x)], {"pad_width": flat_t, "pad_value": pad_value,
                                                  "pad_mode": pad_mode})


def _pad_pairs(call: Call, si: TensorStructInfo):
    w = call.attr_dict["pad_width"]
    if len(w) != 2 * si.ndim:
        raise RelaxError(f"{call.op.name}: pad_width needs {2 * si.ndim} entries (before and "
                         f"after for each of {si.ndim} dims), got {len(w)}", call)
    return [(w[2 * d], w[2 * d + 1]) for d in range(si.ndim)]


def _infer_pad(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    if si.ndim < 0:
        return TensorStructInfo(None, si.dtype)
    pairs = _pad_pairs(call, si)
    if si.shape is None:
        return TensorStructInfo(None, si.dtype, ndim=si.ndim)
    ana = shape_analyzer(si.shape)
    mode = call.attr_dict["pad_mode"]
    out = []
    for d, (n, (b, a)) in enumerate(zip(si.shape, pairs)):
        e = ana.simplify(n + b + a)
        if ana.can_prove(e < 0):
            raise RelaxError(f"{call.op.name}: cropping {-b} + {-a} from dimension {d} of "
                             f"{fmt_shape(si.shape)} leaves a negative extent", call)
        if mode == "reflect" and (b > 0 or a > 0) and ana.can_prove(n <= max(b, a)):
            raise RelaxError(f"{call.op.name}: reflect padding of ({b}, {a}) needs dimension {d} "
                             f"of {fmt_shape(si.shape)} to be larger than each width", call)
        if mode == "edge" and (b > 0 or a > 0) and ana.can_prove(n == 0):
            raise RelaxError(f"{call.op.name}: edge padding of an empty dimension {d}", call)
        out.append(e)
    return TensorStructInfo(out, si.dtype)


def _legalize_pad(bb, call: Call):
    x = call.args[0]
    si = x.struct_info
    pairs = _pad_pairs(call, si)
    mode = call.attr_dict["pad_mode"]
    value = imm(call.attr_dict["pad_value"], si.dtype)
    out = call.struct_info.shape
    ana = shape_analyzer(si.shape)
    checks = []
    if mode == "reflect":
        checks = [_check(ana, n > max(b, a), f"{call.op.name}: reflect padding of ({b}, {a}) "
                                              f"needs dimension {d} to be larger than each width")
                  for d, (n, (b, a)) in enumerate(zip(si.shape, pairs)) if b > 0 or a > 0]

    def pad_te(t):
        def f(*i):
            src, inside = [], []
            for iv, n, (b, a) in zip(i, t.shape, pairs):
                j = iv - b
                if mode == "constant":
                    if b > 0:
                        inside.append(j >= 0)
                    if a > 0:
                        inside.append(j < n)
                    src.append(j)
                elif not (b or a):
                    src.append(j)
                elif mode == "edge":
                    # min(max(j, 0), n - 1); the max-of-min form sends tensorir's Simplify into
                    # endless recursion with symbolic n
                    src.append(Min(Max(j, IntImm(0, "int64")), n - 1))
                else:
                    # reflect: min(|j|, 2 (n - 1) - |j|), with min/max only (the Select form
                    # has the same Simplify problem)
                    mag = Max(j, -j)
                    src.append(Min(mag, (n - 1) * 2 - mag))
            load = t[tuple(src)]
            return te.if_then_else(te.all(*inside), load, value) if inside else load
        return te.compute(out, f, "T_pad")
    return call_te(bb, pad_te, x, checks=checks, primfunc_name_hint="pad")


register_op("relax.pad", _infer_pad, _legalize_pad, OpPattern.INJECTIVE,
            doc="Pad a tensor (constant, edge or reflect).")
