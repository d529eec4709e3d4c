"""Scans, selection and shape values: cumsum, topk, shape_of, shape_to_tensor.

``cumsum`` and ``topk`` are hand-written TensorIR kernels (a sequential scan / selection per
row: te cannot express either), ``OPAQUE``. Each row is one block whose spatial iter vars are
the other dims (rows may run in parallel); the sequential loop is inside the block body.

``shape_of`` has no legalization: ``legalize=None`` means it is a VM builtin -- the call stays
in the program and the VM evaluates it to the shape value of its argument.

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo, op
>>> x = Var("x", TensorStructInfo(("n", 8), "float32"))
>>> op.topk(x, 3).struct_info
Tuple(Tensor((n, 3), 'float32'), Tensor((n, 3), 'int64'))
"""
from __future__ import annotations

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import IntImm, PrimExpr, Var as TirVar
from tilecraft.tensorir.stmt import (Block, BlockRealize, Buffer, BufferRegion, BufferStore, For, IfThenElse,
                           IterVar, Range, seq)
from tilecraft.tensorir.functor import post_order_visit

from ..expr import Call, Expr, PrimValue, RelaxError, ShapeExpr, TupleGetItem
from ..struct_info import (ShapeStructInfo, StructInfo, TensorStructInfo, TupleStructInfo,
                           shape_of_sinfo)
from .base import OpPattern, as_expr, call as _make_call, register_op
from .helpers import (call_prim, call_te, fmt_dim, fmt_shape, imm, make_prim_func, normalize_axis,
                      product, te_reshape, tensor_sinfo, with_checks)

__all__ = ["cumsum", "topk", "shape_of", "shape_to_tensor", "tensor_to_shape"]


def _row_nest(shape, axis: int, name: str, make_body, reads, writes) -> tuple:
    """Loops over every dim but ``axis`` around one block per row (spatial iter vars for those
    dims). ``make_body(idx)`` gets ``idx(pos)``: the full index of element ``pos`` of the row;
    ``reads`` / ``writes``: buffers the row reads / writes (the whole row of each)."""
    others = [d for d in range(len(shape)) if d != axis]
    loops = [TirVar(f"i{d}", "int64") for d in others]
    ivars = [TirVar(f"v{d}", "int64") for d in others]

    def idx(pos):
        it = iter(ivars)
        return tuple(pos if d == axis else next(it) for d in range(len(shape)))

    def row(buf):
        it = iter(ivars)
        return BufferRegion(buf, [Range(IntImm(0, "int64"), buf.shape[d]) if d == axis
                                  else Range(next(it), IntImm(1, "int64"))
                                  for d in range(len(shape))])
    block = Block(name, [IterVar(v, Range(IntImm(0, "int64"), shape[d]), "spatial")
                         for v, d in zip(ivars, others)],
                  [row(b) for b in reads], [row(b) for b in writes], make_body(idx))
    stmt = BlockRealize(loops, None, block)
    for lv, d in reversed(list(zip(loops, others))):
        stmt = For(lv, 0, shape[d], "serial", stmt)
    return stmt


# ==============================================================================================
# cumsum


def cumsum(x: Expr, axis: int | None = None, dtype: str | None = None,
           exclusive: bool = False) -> Call:
    """Cumulative sum along ``axis`` (``None``: of the flattened tensor), as ``numpy.cumsum``;
    ``exclusive=True`` leaves out the element itself (the first is 0), as ONNX ``CumSum``.
    ``dtype``: the accumulation and output dtype (default: ``x``'s).

    Examples
    --------
    >>> x = Var("x", TensorStructInfo(("n", 8), "int32"))
    >>> cumsum(x, axis=1, dtype="int64").struct_info
    Tensor((n, 8), 'int64')
    """
    return _make_call("relax.cumsum", [as_expr(x)],
                      {"axis": None if axis is None else int(axis),
                       "dtype": None if dtype is None else dt.check(dtype),
                       "exclusive": bool(exclusive)})


def _infer_cumsum(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    a = call.attr_dict
    dtype = a["dtype"] or si.dtype
    if a["axis"] is None:
        if si.shape is None:
            return TensorStructInfo(None, dtype, ndim=1)
        return TensorStructInfo((product(si.shape),), dtype)
    if si.ndim >= 0:
        if si.ndim == 0:
            raise RelaxError(f"{call.op.name}: cannot scan along an axis of a 0-d tensor", call)
        normalize_axis(call.op.name, a["axis"], si.ndim, node=call)
    return TensorStructInfo(si.shape, dtype, ndim=si.ndim)


def _legalize_cumsum(bb, call: Call):
    x = call.args[0]
    a = call.attr_dict
    si = x.struct_info
    out = call.struct_info
    if a["axis"] is None:
        # flatten first (a copy kernel), then scan the 1-D tensor
        flat_shape = out.shape
        x = bb.emit(call_te(bb, te_reshape, x, flat_shape, primfunc_name_hint="reshape"))
        si, axis = x.struct_info, 0
    else:
        axis = normalize_axis(call.op.name, a["axis"], si.ndim, node=call)
    shape = shape_of_sinfo(si, f"{call.op.name} input")
    X = Buffer("data", shape, si.dtype)
    Y = Buffer("out", shape, out.dtype)
    n = shape[axis]
    k = TirVar("k", "int64")

    def body(idx):
        def val(pos):
            return X[idx(pos)].astype(out.dtype)
        zero = imm(0, out.dtype)
        first = zero if a["exclusive"] else val(IntImm(0, "int64"))
        step = Y[idx(k)] + (val(k) if a["exclusive"] else val(k + 1))
        # the scan: out[0] = first; out[k + 1] = out[k] + x[k or k + 1]
        return IfThenElse(n > 0, seq(BufferStore(Y, first, idx(IntImm(0, "int64"))),
                                     For(k, 0, n - 1, "serial",
                                         BufferStore(Y, step, idx(k + 1)))))
    nest = _row_nest(shape, axis, "cumsum", body, [X], [Y])
    func = make_prim_func([X, Y], nest, "cumsum")
    return call_prim(bb, func, "cumsum", [x], TensorStructInfo(shape, out.dtype))


register_op("relax.cumsum", _infer_cumsum, _legalize_cumsum, OpPattern.OPAQUE,
            doc="Cumulative sum along an axis (inclusive or exclusive).")


# ==============================================================================================
# topk


def topk(x: Expr, k: int = 1, axis: int = -1, ret_type: str = "both", largest: bool = True,
         dtype: str = "int64") -> Call:
    """The ``k`` largest (``largest=False``: smallest) elements along ``axis``, sorted, and their
    indices (of ``dtype``), as ONNX ``TopK`` / ``torch.topk``. Equal values come in index order.
    ``k < 1`` selects all elements (a sort). ``k`` may be a symbolic value (a ``tensorir``
    expression, such as a size computed at run time); the kernel then checks that it is at most
    the dim. ``ret_type``: ``"both"`` (a tuple (values, indices)), ``"values"`` or ``"indices"``.
    NaNs are not ordered (they are never selected unless nothing else is left).

    Examples
    --------
    >>> x = Var("x", TensorStructInfo((4, 10), "float32"))
    >>> topk(x, 2, ret_type="indices").struct_info
    Tensor((4, 2), 'int64')
    """
    args = [as_expr(x)]
    if isinstance(k, IntImm):
        k = int(k.value)
    if isinstance(k, PrimExpr) and not isinstance(k, bool):
        args.append(PrimValue(k.astype("int64")))   # symbolic: an argument, k None
        k = None
    elif isinstance(k, bool) or not isinstance(k, int):
        raise RelaxError(f"relax.topk: k must be an int or a tensorir expression, got {k!r}")
    if ret_type not in ("both", "values", "indices"):
        raise RelaxError(f"relax.topk: unknown ret_type {ret_type!r} (both, values, indices)")
    if not dt.is_integer(dt.check(dtype)):
        raise RelaxError(f"relax.topk: the index dtype must be an integer type, got {dtype}")
    return _make_call("relax.topk", args, {"k": k, "axis": int(axis),
                                                   "ret_type": ret_type,
                                                   "largest": bool(largest), "dtype": dtype})


def _topk_shape(call: Call, si: TensorStructInfo):
    a = call.attr_dict
    if si.ndim == 0:
        raise RelaxError(f"{call.op.name}: needs a tensor of rank >= 1", call)
    axis = normalize_axis(call.op.name, a["axis"], si.ndim, node=call)
    n = si.shape[axis]
    k = a["k"]
    if k is None:   # symbolic k: the second argument
        kk = call.args[1].struct_info.value
        return axis, kk, si.shape[:axis] + (kk,) + si.shape[axis + 1:]
    if k < 1:
        return axis, n, si.shape
    if isinstance(n, IntImm) and k > n.value:
        raise RelaxError(f"{call.op.name}: k = {k} is larger than dimension {axis} of "
                         f"{fmt_shape(si.shape)} ({fmt_dim(n)})", call)
    return axis, IntImm(k, "int64"), si.shape[:axis] + (IntImm(k, "int64"),) + si.shape[axis + 1:]


def _infer_topk(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    a = call.attr_dict
    if si.shape is None:
        if si.ndim >= 0:
            normalize_axis(call.op.name, a["axis"], si.ndim, node=call)
        vals = TensorStructInfo(None, si.dtype, ndim=si.ndim)
        inds = TensorStructInfo(None, a["dtype"], ndim=si.ndim)
    else:
        _, _, shape = _topk_shape(call, si)
        vals = TensorStructInfo(shape, si.dtype)
        inds = TensorStructInfo(shape, a["dtype"])
    return {"both": TupleStructInfo([vals, inds]), "values": vals,
            "indices": inds}[a["ret_type"]]


def _legalize_topk(bb, call: Call):
    x = call.args[0]
    si = x.struct_info
    a = call.attr_dict
    axis, kk, out_shape = _topk_shape(call, si)
    shape = shape_of_sinfo(si, f"{call.op.name} input")
    X = Buffer("data", shape, si.dtype)
    V = Buffer("values", out_shape, si.dtype)
    I = Buffer("indices", out_shape, a["dtype"])
    n = shape[axis]
    j, e = TirVar("j", "int64"), TirVar("e", "int64")
    none = imm(-1, a["dtype"])

    def before(av, ai, bv, bi):
        """(av, ai) comes strictly before (bv, bi) in the output order."""
        first = (av > bv) if a["largest"] else (av < bv)
        return first | ((av == bv) & (ai < bi))

    def body(idx):
        # selection: the j-th output is the first element, in output order, after the
        # (j-1)-th; V / I at j hold the best candidate so far (I = -1: none yet)
        cand_v, cand_i = X[idx(e)], e.astype(a["dtype"])
        after_prev = te.if_then_else(j == 0, True,
                                     before(V[idx(j - 1)], I[idx(j - 1)], cand_v, cand_i))
        better = te.if_then_else(I[idx(j)] == none, True,
                                 before(cand_v, cand_i, V[idx(j)], I[idx(j)]))
        take = IfThenElse(after_prev, IfThenElse(better, seq(
            BufferStore(V, cand_v, idx(j)), BufferStore(I, cand_i, idx(j)))))
        return For(j, 0, kk, "serial", seq(BufferStore(I, none, idx(j)),
                                           For(e, 0, n, "serial", take)))
    nest = _row_nest(shape, axis, "topk", body, [X], [V, I])
    func = make_prim_func([X, V, I], nest, "topk")
    if a["k"] is None:
        func = with_checks(func, [(kk <= n, f"{call.op.name}: k is larger than dimension "
                                            f"{axis} of the input")])
    res = call_prim(bb, func, "topk", [x], [TensorStructInfo(out_shape, si.dtype),
                                             TensorStructInfo(out_shape, a["dtype"])])
    if a["ret_type"] == "both":
        return res
    return TupleGetItem(bb.emit(res), 0 if a["ret_type"] == "values" else 1)


register_op("relax.topk", _infer_topk, _legalize_topk, OpPattern.OPAQUE,
            doc="The k largest / smallest elements along an axis and their indices.")


# ==============================================================================================
# shape_of / shape_to_tensor


def shape_of(x: Expr) -> Call:
    """The shape of tensor ``x`` as a shape value (``ShapeStructInfo`` with ``x``'s symbolic dims
    when known). A VM builtin: it has no legalization (``legalize=None``); the VM evaluates the
    call.

    Examples
    --------
    >>> shape_of(Var("x", TensorStructInfo(("n", 4), "float32"))).struct_info.values[1]
    4
    """
    return _make_call("relax.shape_of", [as_expr(x)])


def _infer_shape_of(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    if si.shape is not None:
        return ShapeStructInfo(si.shape)
    return ShapeStructInfo(ndim=si.ndim)


register_op("relax.shape_of", _infer_shape_of, None, OpPattern.OPAQUE,
            doc="The shape of a tensor (a VM builtin: not legalized).")


def shape_to_tensor(shape) -> Call:
    """A 1-D int64 tensor of the dims of ``shape`` (a ShapeExpr, a Var of ShapeStructInfo, or a
    tuple), as ONNX ``Shape`` gives them. Legalized when the dims are known expressions (the
    symbolic ones become scalar parameters of the kernel).

    Examples
    --------
    >>> shape_to_tensor(ShapeExpr((2, "n"))).struct_info
    Tensor((2,), 'int64')
    """
    if not isinstance(shape, Expr):
        shape = ShapeExpr(shape)
    return _make_call("relax.shape_to_tensor", [shape])


def _infer_shape_to_tensor(call: Call) -> StructInfo:
    si = call.args[0].struct_info
    if not isinstance(si, ShapeStructInfo):
        raise RelaxError(f"{call.op.name}: expects a shape value, got {si!r}", call)
    return TensorStructInfo(None if si.ndim < 0 else (si.ndim,), "int64", ndim=1)


def _legalize_shape_to_tensor(bb, call: Call):
    values = call.args[0].struct_info.values
    if values is None:
        raise RelaxError(f"{call.op.name}: the dims of the shape must be known to legalize",
                         call)
    scalars: list[TirVar] = []
    for d in values:
        post_order_visit(d, lambda v: scalars.append(v) if isinstance(v, TirVar) and
                         all(v is not s for s in scalars) else None)

    def f(i):
        value: PrimExpr = IntImm(0, "int64")
        for pos in reversed(range(len(values))):
            value = te.if_then_else(i == pos, values[pos], value)
        return value
    out = te.compute((len(values),), f, "T_shape_to_tensor")
    func = te.create_prim_func([out] + scalars)
    return call_prim(bb, func, "shape_to_tensor", [], TensorStructInfo((len(values),), "int64"),
                      tir_vars=scalars or None)


register_op("relax.shape_to_tensor", _infer_shape_to_tensor, _legalize_shape_to_tensor,
            OpPattern.INJECTIVE, doc="A shape value as a 1-D int64 tensor.")


def tensor_to_shape(x: Expr) -> Call:
    """The values of a 1-D integer tensor ``x`` as a shape value (the inverse of
    ``shape_to_tensor``), for shapes computed at run time (ONNX ``Reshape`` of a computed
    shape). The dims are unknown until run time: ``match_cast`` the result to a
    ``ShapeStructInfo`` of fresh symbolic variables to name them. A VM builtin.

    Examples
    --------
    >>> t = Var("t", TensorStructInfo((3,), "int64"))
    >>> tensor_to_shape(t).struct_info.ndim
    3
    """
    return _make_call("relax.tensor_to_shape", [as_expr(x)])


def _infer_tensor_to_shape(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    if si.ndim not in (-1, 1) or not (si.dtype.startswith("int") or si.dtype.startswith("uint")):
        raise RelaxError(f"{call.op.name}: expects a 1-D integer tensor, got {si!r}", call)
    n = si.shape[0] if si.shape is not None else None
    return ShapeStructInfo(ndim=n.value if isinstance(n, IntImm) else -1)


register_op("relax.tensor_to_shape", _infer_tensor_to_shape, None, OpPattern.OPAQUE,
            doc="A 1-D integer tensor as a shape value (a VM builtin: not legalized).")
