"""Indexing operators: take, gather_elements, gather_nd, scatter_elements.

Indices may be any integer dtype. A negative index counts from the end of its dim (``-1`` is the
last element), as ONNX ``Gather`` / ``GatherElements`` / ``ScatterElements`` and numpy. An index
that is still out of range after that is caught by the kernel's run-time bounds check (the
lowering verifier cannot prove a data-dependent access in bounds, so it guards it with an
assertion) -- except with ``take(..., mode="wrap" | "clip")``, which map every index into range.

``take`` / ``gather_*`` legalize to ``tensorir.te`` and are ``INJECTIVE``; ``scatter_elements``
is a hand-written TensorIR kernel (a copy, then a sequential loop over the updates, since later
updates of the same element must win) and is ``OPAQUE``.

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo, op
>>> x = Var("x", TensorStructInfo(("n", 16), "float32"))
>>> i = Var("i", TensorStructInfo(("b", "s"), "int64"))
>>> op.take(x, i, axis=0).struct_info
Tensor((b, s, 16), 'float32')
"""
from __future__ import annotations

from tilecraft.tensorir import te
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import IntImm, Max, Min, PrimExpr, Select, Var as TirVar
from tilecraft.tensorir.stmt import (Block, BlockRealize, BufferRegion, BufferStore, For, Range, seq)

from ..expr import Call, Expr, RelaxError
from ..struct_info import StructInfo, TensorStructInfo, shape_of_sinfo
from .base import OpPattern, as_expr, call as _make_call, register_op
from .helpers import (call_prim, call_te, fmt_dim, fmt_shape, normalize_axis, product,
                      shape_analyzer, tensor_sinfo, unravel_index)

__all__ = ["take", "gather_elements", "gather_nd", "scatter_elements"]


def _index_arg(call: Call, i: int, what: str = "indices") -> TensorStructInfo:
    si = tensor_sinfo(call.op.name, call, i, what)
    if not dt.is_integer(si.dtype):
        raise RelaxError(f"{call.op.name}: {what} must have an integer dtype, got {si.dtype}",
                         call)
    return si


def _wrap(idx: PrimExpr, n: PrimExpr, mode: str = "fast") -> PrimExpr:
    """An index into a dim of extent ``n``: negative counts from the end ("fast"), modulo ``n``
    ("wrap"), or clamped to ``[0, n - 1]`` ("clip")."""
    idx = idx.astype("int64")
    if mode == "wrap":
        return idx % n
    if mode == "clip":
        return Min(Max(idx, IntImm(0, "int64")), n - 1)
    return Select(idx < 0, idx + n, idx)


# ==============================================================================================
# take


def take(x: Expr, indices: Expr, axis: int | None = None, mode: str = "fast") -> Call:
    """Take elements of ``x`` at ``indices`` along ``axis``, as ``numpy.take`` (``axis=None``:
    from the flattened ``x``). ONNX ``Gather`` is ``take(x, indices, axis)``.

    The output shape is ``x.shape[:axis] + indices.shape + x.shape[axis + 1:]``. ``mode``:
    ``"fast"`` (negative indices count from the end, as ONNX Gather; others must be in range,
    checked at run time), ``"wrap"`` (modulo the dim) or ``"clip"`` (clamped).

    Examples
    --------
    >>> x = Var("x", TensorStructInfo((5, 4), "float32"))
    >>> take(x, Var("i", TensorStructInfo((3,), "int32")), axis=1).struct_info
    Tensor((5, 3), 'float32')
    """
    if mode not in ("fast", "wrap", "clip"):
        raise RelaxError(f"relax.take: unknown mode {mode!r} (fast, wrap, clip)")
    return _make_call("relax.take", [as_expr(x), as_expr(indices)],
                      {"axis": None if axis is None else int(axis), "mode": mode})


def _infer_take(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    ind = _index_arg(call, 1)
    axis = call.attr_dict["axis"]
    if axis is None:
        return TensorStructInfo(ind.shape, si.dtype, ndim=ind.ndim)
    if si.ndim < 0:
        return TensorStructInfo(None, si.dtype)
    if si.ndim == 0:
        raise RelaxError(f"{call.op.name}: cannot take along an axis of a 0-d tensor", call)
    axis = normalize_axis(call.op.name, axis, si.ndim, node=call)
    if si.shape is None or ind.shape is None:
        return TensorStructInfo(None, si.dtype,
                                ndim=-1 if ind.ndim < 0 else si.ndim - 1 + ind.ndim)
    return TensorStructInfo(si.shape[:axis] + ind.shape + si.shape[axis + 1:], si.dtype)


def _legalize_take(bb, call: Call):
    x, indices = call.args
    axis, mode = call.attr_dict["axis"], call.attr_dict["mode"]
    out = call.struct_info.shape
    if axis is not None:
        axis = normalize_axis(call.op.name, axis, x.struct_info.ndim, node=call)

    def take_te(a, ind):
        k = ind.ndim
        if axis is None:
            n = product(a.shape)

            def f(*i):
                return a[unravel_index(_wrap(ind[i], n, mode), a.shape)]
        else:
            def f(*i):
                j = _wrap(ind[i[axis:axis + k]], a.shape[axis], mode)
                return a[i[:axis] + (j,) + i[axis + k:]]
        return te.compute(out, f, "T_take")
    return call_te(bb, take_te, x, indices, primfunc_name_hint="take")


register_op("relax.take", _infer_take, _legalize_take, OpPattern.INJECTIVE,
            doc="Take elements at indices along an axis (numpy.take, ONNX Gather).")


# ==============================================================================================
# gather_elements / gather_nd


def gather_elements(x: Expr, indices: Expr, axis: int = 0) -> Call:
    """ONNX ``GatherElements`` / ``torch.gather``: ``out[i][j][k] = x[i][indices[i][j][k]][k]``
    for ``axis=1``; the output has the shape of ``indices`` (same rank as ``x``).

    Examples
    --------
    >>> x = Var("x", TensorStructInfo((3, 4), "float32"))
    >>> gather_elements(x, Var("i", TensorStructInfo((3, 2), "int64")), 1).struct_info
    Tensor((3, 2), 'float32')
    """
    return _make_call("relax.gather_elements", [as_expr(x), as_expr(indices)],
                      {"axis": int(axis)})


def _infer_gather_elements(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    ind = _index_arg(call, 1)
    if si.ndim >= 0 and ind.ndim >= 0 and si.ndim != ind.ndim:
        raise RelaxError(f"{call.op.name}: indices of rank {ind.ndim} for data of rank "
                         f"{si.ndim}; they must be equal", call)
    if si.ndim >= 0:
        normalize_axis(call.op.name, call.attr_dict["axis"], si.ndim, node=call)
    return TensorStructInfo(ind.shape, si.dtype, ndim=ind.ndim if ind.ndim >= 0 else si.ndim)


def _legalize_gather_elements(bb, call: Call):
    x, indices = call.args
    axis = normalize_axis(call.op.name, call.attr_dict["axis"], x.struct_info.ndim, node=call)

    def gather_te(a, ind):
        return te.compute(ind.shape, lambda *i: a[i[:axis] + (_wrap(ind[i], a.shape[axis]),) +
                                                  i[axis + 1:]], "T_gather_elements")
    return call_te(bb, gather_te, x, indices, primfunc_name_hint="gather_elements")


register_op("relax.gather_elements", _infer_gather_elements, _legalize_gather_elements,
            OpPattern.INJECTIVE, doc="ONNX GatherElements.")


def gather_nd(x: Expr, indices: Expr, batch_dims: int = 0) -> Call:
    """ONNX ``GatherND``: the last dim of ``indices`` (static, ``q``) indexes the first ``q``
    dims of ``x`` after ``batch_dims`` leading dims shared by both. The output shape is
    ``indices.shape[:-1] + x.shape[batch_dims + q:]``.

    Examples
    --------
    >>> x = Var("x", TensorStructInfo((4, 5, 6), "float32"))
    >>> gather_nd(x, Var("i", TensorStructInfo((3, 2), "int64"))).struct_info
    Tensor((3, 6), 'float32')
    """
    return _make_call("relax.gather_nd", [as_expr(x), as_expr(indices)],
                      {"batch_dims": int(batch_dims)})


def _gather_nd_q(call: Call, si: TensorStructInfo, ind: TensorStructInfo) -> int:
    b = call.attr_dict["batch_dims"]
    if ind.ndim < 1:
        raise RelaxError(f"{call.op.name}: indices must have rank >= 1, got {ind!r}", call)
    q = ind.shape[-1].value if ind.shape is not None and isinstance(ind.shape[-1], IntImm) \
        else None
    if q is None:
        raise RelaxError(f"{call.op.name}: the last dim of indices must be static, got "
                         f"{fmt_shape(ind.shape)}", call)
    if b < 0 or b >= ind.ndim or (si.ndim >= 0 and b + q > si.ndim):
        raise RelaxError(f"{call.op.name}: batch_dims {b} and an index depth of {q} do not fit "
                         f"data of rank {si.ndim} and indices of rank {ind.ndim}", call)
    return q


def _infer_gather_nd(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    ind = _index_arg(call, 1)
    q = _gather_nd_q(call, si, ind)
    b = call.attr_dict["batch_dims"]
    if si.shape is None:
        return TensorStructInfo(None, si.dtype,
                                ndim=-1 if si.ndim < 0 else ind.ndim - 1 + si.ndim - b - q)
    ana = shape_analyzer(si.shape, ind.shape)
    for d in range(b):
        if ana.can_prove(si.shape[d] != ind.shape[d]):
            raise RelaxError(f"{call.op.name}: batch dim {d} differs: {fmt_dim(si.shape[d])} "
                             f"(data {fmt_shape(si.shape)}) vs {fmt_dim(ind.shape[d])} (indices "
                             f"{fmt_shape(ind.shape)})", call)
    return TensorStructInfo(ind.shape[:-1] + si.shape[b + q:], si.dtype)


def _legalize_gather_nd(bb, call: Call):
    x, indices = call.args
    b = call.attr_dict["batch_dims"]
    q = _gather_nd_q(call, x.struct_info, indices.struct_info)
    out = call.struct_info.shape

    def gather_te(a, ind):
        m = ind.ndim - 1  # output dims that come from indices

        def f(*i):
            pos = tuple(_wrap(ind[i[:m] + (IntImm(j, "int64"),)], a.shape[b + j])
                        for j in range(q))
            return a[i[:b] + pos + i[m:]]
        return te.compute(out, f, "T_gather_nd")
    return call_te(bb, gather_te, x, indices, primfunc_name_hint="gather_nd")


register_op("relax.gather_nd", _infer_gather_nd, _legalize_gather_nd, OpPattern.INJECTIVE,
            doc="ONNX GatherND.")


# ==============================================================================================
# scatter_elements

_REDUCTIONS = ("update", "add", "mul", "min", "max")


def scatter_elements(x: Expr, indices: Expr, updates: Expr, axis: int = 0,
                     reduction: str = "update") -> Call:
    """ONNX ``ScatterElements``: a copy of ``x`` where, for every position ``p`` of ``indices``,
    the element at ``p`` with its ``axis`` coordinate replaced by ``indices[p]`` becomes
    ``updates[p]`` (``reduction="update"``; a later position wins on duplicates, in row-major
    order) or is combined with it (``"add"``, ``"mul"``, ``"min"``, ``"max"``).

    ``indices`` and ``updates`` have the same shape and the rank of ``x``.

    Examples
    --------
    >>> x = Var("x", TensorStructInfo((3, 4), "float32"))
    >>> i = Var("i", TensorStructInfo((2, 4), "int64"))
    >>> u = Var("u", TensorStructInfo((2, 4), "float32"))
    >>> scatter_elements(x, i, u, axis=0, reduction="add").struct_info
    Tensor((3, 4), 'float32')
    """
    if reduction not in _REDUCTIONS:
        raise RelaxError(f"relax.scatter_elements: unknown reduction {reduction!r} "
                         f"({', '.join(_REDUCTIONS)})")
    return _make_call("relax.scatter_elements", [as_expr(x), as_expr(indices), as_expr(updates)],
                      {"axis": int(axis), "reduction": reduction})


def _infer_scatter_elements(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    ind = _index_arg(call, 1)
    upd = tensor_sinfo(call.op.name, call, 2, "updates")
    if upd.dtype != si.dtype:
        raise RelaxError(f"{call.op.name}: updates have dtype {upd.dtype}, data has {si.dtype}",
                         call)
    ranks = {r for r in (si.ndim, ind.ndim, upd.ndim) if r >= 0}
    if len(ranks) > 1:
        raise RelaxError(f"{call.op.name}: data, indices and updates must have the same rank, "
                         f"got {si.ndim}, {ind.ndim}, {upd.ndim}", call)
    if si.ndim >= 0:
        normalize_axis(call.op.name, call.attr_dict["axis"], si.ndim, node=call)
    if ind.shape is not None and upd.shape is not None:
        ana = shape_analyzer(ind.shape, upd.shape)
        for d, (a, b) in enumerate(zip(ind.shape, upd.shape)):
            if ana.can_prove(a != b):
                raise RelaxError(f"{call.op.name}: indices {fmt_shape(ind.shape)} and updates "
                                 f"{fmt_shape(upd.shape)} differ in dimension {d}", call)
    return si


def _legalize_scatter_elements(bb, call: Call):
    x, indices, updates = call.args
    si = x.struct_info
    axis = normalize_axis(call.op.name, call.attr_dict["axis"], si.ndim, node=call)
    reduction = call.attr_dict["reduction"]
    shape = shape_of_sinfo(si, f"{call.op.name} data")
    ind_shape = shape_of_sinfo(indices.struct_info, f"{call.op.name} indices")

    data = te.placeholder(shape, si.dtype, "data")
    ind = te.placeholder(ind_shape, indices.struct_info.dtype, "indices")
    # updates take the shape of indices: the kernel entry checks the argument against it
    upd = te.placeholder(ind_shape, si.dtype, "updates")
    out = te.compute(shape, lambda *i: data[i], "T_scatter_copy")
    func = te.create_prim_func([data, ind, upd, out])
    I, U, O = ind.buffer, upd.buffer, out.buffer

    # the irregular part, in TensorIR: one opaque block (no iter vars: the loop order matters
    # for duplicate indices, so no schedule may reorder or parallelize it)
    loops = [TirVar(f"i{d}", "int64") for d in range(len(ind_shape))]
    pos = tuple(loops)
    tgt = pos[:axis] + (_wrap(I[pos], O.shape[axis]),) + pos[axis + 1:]
    cur, new = O[tgt], U[pos]
    value = {"update": new, "add": cur + new, "mul": cur * new,
             "min": te.minimum(cur, new), "max": te.maximum(cur, new)}[reduction]
    stmt = BufferStore(O, value, tgt)
    for v, n in reversed(list(zip(loops, ind_shape))):
        stmt = For(v, 0, n, "serial", stmt)

    def full(buf):
        return BufferRegion(buf, [Range(IntImm(0, "int64"), d) for d in buf.shape])
    block = Block("scatter_elements", [], [full(I), full(U), full(O)], [full(O)], stmt)
    root = func.body.block
    func = func.replace(body=func.body.replace(block=root.replace(
        body=seq(root.body, BlockRealize([], None, block)))))
    return call_prim(bb, func, "scatter_elements", [x, indices, updates],
                      TensorStructInfo(shape, si.dtype))


register_op("relax.scatter_elements", _infer_scatter_elements, _legalize_scatter_elements,
            OpPattern.OPAQUE, doc="ONNX ScatterElements (update / add / mul / min / max).")
