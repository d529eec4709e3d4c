"""Creation operators: full, zeros, ones, full_like, zeros_like, ones_like, arange, eye, tril,
triu.

Shapes may be symbolic (``zeros(("n", 4))``; dims no input binds become scalar parameters of the
kernel, given by the VM). ``arange`` with a symbolic ``end`` has the symbolic length
``ceil((end - start) / step)``. ``tril`` / ``triu`` take a (possibly symbolic) diagonal offset
``k``, for causal attention masks. All legalize to ``tensorir.te``; ``full_like`` and its
variants are ``ELEMWISE``, the rest ``INJECTIVE``.

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo, op
>>> x = Var("x", TensorStructInfo(("n",), "int64"))
>>> op.arange(0, x.shape[0], 2).struct_info
Tensor(((n + 1) // 2,), 'int64')
"""
from __future__ import annotations

import math

import numpy as np

from tilecraft.tensorir import te
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import FloatImm, IntImm, PrimExpr, Select, Var as TirVar
from tilecraft.tensorir.functor import post_order_visit

from ..expr import Call, Constant, Expr, PrimValue, RelaxError, const
from ..struct_info import PrimStructInfo, StructInfo, TensorStructInfo
from .base import OpPattern, as_expr, call as _make_call, register_op
from .helpers import (call_te, imm, int64_expr, max_expr, shape_analyzer, shape_expr, shape_values,
                      tensor_sinfo)

__all__ = ["full", "zeros", "ones", "full_like", "zeros_like", "ones_like", "arange", "eye",
           "tril", "triu"]


def _fill_expr(op: str, fill_value, dtype: str | None) -> Expr:
    """A 0-d tensor for ``fill_value`` (a Python number, or a Relax 0-d tensor)."""
    if isinstance(fill_value, Expr):
        return fill_value
    if isinstance(fill_value, PrimExpr):
        raise RelaxError(f"{op}: fill_value must be a number or a 0-d tensor, got the PrimExpr "
                         f"{fill_value!r}")
    if dtype is not None:
        return const(np.array(fill_value, dtype=dt.to_numpy(dtype)))
    return const(fill_value)


def _fill_arg(call: Call, i: int) -> TensorStructInfo:
    si = tensor_sinfo(call.op.name, call, i, "fill_value")
    fill = call.args[i]
    # relax.const of a scalar currently gives a (1,)-shaped constant; accept any 1-element one
    if isinstance(fill, Constant) and fill.data.size == 1:
        return si
    if si.ndim not in (0, -1):
        raise RelaxError(f"{call.op.name}: fill_value must be a 0-d tensor, got {si!r}", call)
    return si


def _fill_te(call: Call, dtype: str):
    """``(tensor args, value function)``: a constant fill is folded into the kernel."""
    fill = call.args[-1]
    if isinstance(fill, Constant):
        v = fill.data.item()
        return [], lambda: imm(v, dtype)
    return [fill], lambda f: f[()].astype(dtype)


# ==============================================================================================
# full / zeros / ones


def full(shape, fill_value, dtype: str | None = None) -> Call:
    """A tensor of ``shape`` filled with ``fill_value`` (a number or a 0-d tensor); ``dtype``
    defaults to the fill value's.

    Examples
    --------
    >>> full((2, "n"), 1.5).struct_info
    Tensor((2, n), 'float32')
    """
    fill = _fill_expr("relax.full", fill_value, dtype)
    return _make_call("relax.full", [shape_expr("relax.full", shape), fill],
                      {"dtype": None if dtype is None else dt.check(dtype)})


def _infer_full(call: Call) -> StructInfo:
    fill = _fill_arg(call, 1)
    dtype = call.attr_dict["dtype"] or fill.dtype
    values = shape_values(call, 0)
    return TensorStructInfo(values, dtype, ndim=call.args[0].struct_info.ndim)


def _legalize_full(bb, call: Call):
    out = call.struct_info
    if out.shape is None:
        raise RelaxError(f"{call.op.name}: the shape must be known to legalize", call)
    tensors, value = _fill_te(call, out.dtype)

    def full_te(*fill):
        return te.compute(out.shape, lambda *i: value(*fill), "T_full")
    return call_te(bb, full_te, *tensors, primfunc_name_hint="full")


register_op("relax.full", _infer_full, _legalize_full, OpPattern.INJECTIVE,
            doc="A tensor of a shape filled with a value.")


def _const_op(name: str, value: int):
    def make(shape, dtype: str = "float32") -> Call:
        return _make_call(name, [shape_expr(name, shape)], {"dtype": dt.check(dtype)})

    def infer(call: Call) -> StructInfo:
        return TensorStructInfo(shape_values(call, 0), call.attr_dict["dtype"],
                                ndim=call.args[0].struct_info.ndim)

    def legalize(bb, call: Call):
        out = call.struct_info
        if out.shape is None:
            raise RelaxError(f"{call.op.name}: the shape must be known to legalize", call)

        def const_te():
            return te.compute(out.shape, lambda *i: imm(value, out.dtype), f"T_{name[6:]}")
        return call_te(bb, const_te, primfunc_name_hint=name[6:])

    register_op(name, infer, legalize, OpPattern.INJECTIVE,
                doc=f"A tensor of a shape filled with {value}.")
    return make


_zeros = _const_op("relax.zeros", 0)
_ones = _const_op("relax.ones", 1)


def zeros(shape, dtype: str = "float32") -> Call:
    """A tensor of zeros: ``zeros(("n", 4), "float32")``.

    Examples
    --------
    >>> zeros((3,), "int32").struct_info
    Tensor((3,), 'int32')
    """
    return _zeros(shape, dtype)


def ones(shape, dtype: str = "float32") -> Call:
    """A tensor of ones: ``ones(("n", 4), "float32")``.

    Examples
    --------
    >>> ones((3,)).struct_info
    Tensor((3,), 'float32')
    """
    return _ones(shape, dtype)


# ==============================================================================================
# full_like / zeros_like / ones_like


def full_like(x: Expr, fill_value, dtype: str | None = None) -> Call:
    """A tensor shaped like ``x`` filled with ``fill_value``; ``dtype`` defaults to ``x``'s.

    Examples
    --------
    >>> x = Var("x", TensorStructInfo(("n", 3), "float32"))
    >>> full_like(x, 7, "int32").struct_info
    Tensor((n, 3), 'int32')
    """
    x = as_expr(x)
    fill = _fill_expr("relax.full_like", fill_value, dtype or getattr(x.struct_info, "dtype",
                                                                      None))
    return _make_call("relax.full_like", [x, fill],
                      {"dtype": None if dtype is None else dt.check(dtype)})


def _infer_full_like(call: Call) -> StructInfo:
    si = tensor_sinfo(call.op.name, call, 0, "data")
    _fill_arg(call, 1)
    return TensorStructInfo(si.shape, call.attr_dict["dtype"] or si.dtype, ndim=si.ndim)


def _legalize_full_like(bb, call: Call):
    out = call.struct_info
    tensors, value = _fill_te(call, out.dtype)

    def full_like_te(a, *fill):
        return te.compute(a.shape, lambda *i: value(*fill), "T_full_like")
    return call_te(bb, full_like_te, call.args[0], *tensors, primfunc_name_hint="full_like")


register_op("relax.full_like", _infer_full_like, _legalize_full_like, OpPattern.ELEMWISE,
            doc="A tensor shaped like another, filled with a value.")


def _like_op(name: str, value: int):
    def make(x, dtype: str | None = None) -> Call:
        return _make_call(name, [as_expr(x)],
                          {"dtype": None if dtype is None else dt.check(dtype)})

    def infer(call: Call) -> StructInfo:
        si = tensor_sinfo(call.op.name, call, 0, "data")
        return TensorStructInfo(si.shape, call.attr_dict["dtype"] or si.dtype, ndim=si.ndim)

    def legalize(bb, call: Call):
        dtype = call.struct_info.dtype

        def like_te(a):
            return te.compute(a.shape, lambda *i: imm(value, dtype), f"T_{name[6:]}")
        return call_te(bb, like_te, call.args[0], primfunc_name_hint=name[6:])

    register_op(name, infer, legalize, OpPattern.ELEMWISE,
                doc=f"A tensor shaped like another, filled with {value}.")
    return make


_zeros_like = _like_op("relax.zeros_like", 0)
_ones_like = _like_op("relax.ones_like", 1)


def zeros_like(x: Expr, dtype: str | None = None) -> Call:
    """Zeros shaped like ``x`` (``dtype`` defaults to ``x``'s).

    Examples
    --------
    >>> zeros_like(Var("x", TensorStructInfo(("n",), "int32"))).struct_info
    Tensor((n,), 'int32')
    """
    return _zeros_like(x, dtype)


def ones_like(x: Expr, dtype: str | None = None) -> Call:
    """Ones shaped like ``x`` (``dtype`` defaults to ``x``'s).

    Examples
    --------
    >>> ones_like(Var("x", TensorStructInfo(("n",), "float32")), "int64").struct_info
    Tensor((n,), 'int64')
    """
    return _ones_like(x, dtype)


# ==============================================================================================
# arange


def _prim_value(op: str, v, what: str) -> Expr:
    if isinstance(v, Expr):
        if not isinstance(v.struct_info, PrimStructInfo):
            raise RelaxError(f"{op}: {what} must be a scalar (PrimValue), got {v.struct_info!r}",
                             v)
        return v
    if isinstance(v, bool):
        raise RelaxError(f"{op}: {what} must be a number, got {v!r}")
    if isinstance(v, (int, np.integer)):
        return PrimValue(IntImm(int(v), "int64"))
    if isinstance(v, (float, np.floating)):
        return PrimValue(FloatImm(float(v), "float64"))
    if isinstance(v, PrimExpr):
        return PrimValue(v.astype("int64") if dt.is_integer(v.dtype) else v)
    raise RelaxError(f"{op}: {what} must be a number or a PrimExpr, got {v!r}")


def _prim_of(call: Call, i: int) -> PrimExpr | None:
    si = call.args[i].struct_info
    if not isinstance(si, PrimStructInfo):
        raise RelaxError(f"{call.op.name}: argument {i} must be a scalar, got {si!r}", call)
    return si.value


def arange(start, end=None, step=1, dtype: str | None = None) -> Call:
    """``[start, start + step, ...)`` up to ``end``, as ``numpy.arange`` (``arange(n)`` starts at
    0). Bounds are numbers or int64 PrimExprs (a symbolic ``end`` gives the symbolic length
    ``ceil((end - start) / step)``). ``dtype`` defaults to int64 for integer bounds, else float32.

    Examples
    --------
    >>> arange(2, 11, 3).struct_info
    Tensor((3,), 'int64')
    """
    if end is None:
        start, end = 0, start
    args = [_prim_value("relax.arange", v, w) for v, w in ((start, "start"), (end, "end"),
                                                           (step, "step"))]
    if dtype is None:
        ints = all(dt.is_integer(a.struct_info.dtype) for a in args)
        dtype = "int64" if ints else "float32"
    return _make_call("relax.arange", args, {"dtype": dt.check(dtype)})


def _arange_len(call: Call) -> PrimExpr | None:
    start, end, step = (_prim_of(call, i) for i in range(3))
    if start is None or end is None or step is None:
        return None
    vals = [start, end, step]
    if all(isinstance(v, (IntImm, FloatImm)) for v in vals):
        a, b, s = (v.value for v in vals)
        if s == 0:
            raise RelaxError(f"{call.op.name}: step cannot be 0", call)
        return IntImm(max(0, math.ceil((b - a) / s)) if any(isinstance(v, FloatImm) for v in vals)
                      else max(0, -((a - b) // s)), "int64")
    if not all(dt.is_integer(v.dtype) for v in vals):
        raise RelaxError(f"{call.op.name}: symbolic bounds must be integers, got start={start}, "
                         f"end={end}, step={step}", call)
    if not isinstance(step, IntImm) or step.value == 0:
        raise RelaxError(f"{call.op.name}: a symbolic arange needs a static non-zero step, got "
                         f"{step}", call)
    s = step.value
    start, end = int64_expr(start), int64_expr(end)
    ana = shape_analyzer(start, end)
    n = (end - start + (s - 1)) // s if s > 0 else (start - end + (-s - 1)) // (-s)
    return max_expr(ana, 0, ana.simplify(n))


def _infer_arange(call: Call) -> StructInfo:
    n = _arange_len(call)
    dtype = call.attr_dict["dtype"]
    return TensorStructInfo(None if n is None else (n,), dtype, ndim=1)


def _legalize_arange(bb, call: Call):
    out = call.struct_info
    if out.shape is None:
        raise RelaxError(f"{call.op.name}: the bounds must be known scalars to legalize", call)
    start, _, step = (_prim_of(call, i) for i in range(3))
    dtype = out.dtype
    scalars = _free_vars(start, step)

    def arange_te():
        def f(i):
            if dt.is_float(dtype) or dt.is_float(start.dtype) or dt.is_float(step.dtype):
                return (start.astype(dtype) if not isinstance(start, (IntImm, FloatImm))
                        else imm(start.value, dtype)) + i.astype(dtype) * (
                    step.astype(dtype) if not isinstance(step, (IntImm, FloatImm))
                    else imm(step.value, dtype))
            return (start.astype("int64") + i * step.astype("int64")).astype(dtype)
        return te.compute(out.shape, f, "T_arange")
    return call_te(bb, arange_te, scalars=scalars, primfunc_name_hint="arange")


def _free_vars(*exprs) -> list[TirVar]:
    out: list[TirVar] = []
    for e in exprs:
        if isinstance(e, PrimExpr):
            post_order_visit(e, lambda n: out.append(n) if isinstance(n, TirVar) and
                             all(n is not o for o in out) else None)
    return out


register_op("relax.arange", _infer_arange, _legalize_arange, OpPattern.INJECTIVE,
            doc="Evenly spaced values in [start, end) (numpy.arange).")


# ==============================================================================================
# eye / tril / triu


def eye(n, m=None, k=0, dtype: str = "float32") -> Call:
    """An ``n x m`` matrix with ones on diagonal ``k`` (``numpy.eye``); ``n``, ``m`` and ``k``
    are ints or int64 PrimExprs.

    Examples
    --------
    >>> eye(3, 4, 1).struct_info
    Tensor((3, 4), 'float32')
    """
    args = [_prim_value("relax.eye", v, w) for v, w in ((n, "n"), (n if m is None else m, "m"),
                                                        (k, "k"))]
    return _make_call("relax.eye", args, {"dtype": dt.check(dtype)})


def _infer_eye(call: Call) -> StructInfo:
    n, m, _ = (_prim_of(call, i) for i in range(3))
    if n is None or m is None:
        return TensorStructInfo(None, call.attr_dict["dtype"], ndim=2)
    for v, w in ((n, "n"), (m, "m")):
        if not dt.is_integer(v.dtype) or (isinstance(v, IntImm) and v.value < 0):
            raise RelaxError(f"{call.op.name}: {w} must be a non-negative integer, got {v}", call)
    return TensorStructInfo((n, m), call.attr_dict["dtype"])


def _legalize_eye(bb, call: Call):
    out = call.struct_info
    k = _prim_of(call, 2)
    if out.shape is None or k is None:
        raise RelaxError(f"{call.op.name}: n, m and k must be known to legalize", call)
    k = int64_expr(k)

    def eye_te():
        return te.compute(out.shape, lambda i, j: Select(j - i == k, imm(1, out.dtype),
                                                         imm(0, out.dtype)), "T_eye")
    return call_te(bb, eye_te, scalars=_free_vars(k), primfunc_name_hint="eye")


register_op("relax.eye", _infer_eye, _legalize_eye, OpPattern.INJECTIVE,
            doc="A matrix with ones on a diagonal (numpy.eye).")


def _tri_op(name: str, lower: bool):
    def make(x, k=0) -> Call:
        return _make_call(name, [as_expr(x), _prim_value(name, k, "k")])

    def infer(call: Call) -> StructInfo:
        si = tensor_sinfo(call.op.name, call, 0, "data")
        if 0 <= si.ndim < 2:
            raise RelaxError(f"{call.op.name}: needs a tensor of rank >= 2, got {si!r}", call)
        kv = call.args[1].struct_info
        if not isinstance(kv, PrimStructInfo) or not dt.is_integer(kv.dtype):
            raise RelaxError(f"{call.op.name}: k must be an integer scalar, got {kv!r}", call)
        return si

    def legalize(bb, call: Call):
        x = call.args[0]
        k = _prim_of(call, 1)
        if k is None:
            raise RelaxError(f"{call.op.name}: k must be a known value to legalize", call)
        k = int64_expr(k)
        dtype = x.struct_info.dtype

        def tri_te(a):
            def f(*i):
                r, c = i[-2], i[-1]
                keep = (c - r <= k) if lower else (c - r >= k)
                return Select(keep, a[i], imm(0, dtype))
            return te.compute(a.shape, f, f"T_{name[6:]}")
        return call_te(bb, tri_te, x, scalars=_free_vars(k), primfunc_name_hint=name[6:])

    register_op(name, infer, legalize, OpPattern.INJECTIVE,
                doc=f"Zero the elements {'above' if lower else 'below'} diagonal k of the last "
                    f"two dims.")
    return make


_tril = _tri_op("relax.tril", True)
_triu = _tri_op("relax.triu", False)


def tril(x: Expr, k=0) -> Call:
    """The lower triangle of the last two dims of ``x``: elements with ``col - row <= k`` kept,
    others zero (``numpy.tril``). ``k`` may be an int64 PrimExpr (``kv_len - q_len`` for a
    causal mask over a KV cache).

    Examples
    --------
    >>> tril(Var("x", TensorStructInfo(("n", "n"), "float32"))).struct_info
    Tensor((n, n), 'float32')
    """
    return _tril(x, k)


def triu(x: Expr, k=0) -> Call:
    """The upper triangle of the last two dims of ``x``: elements with ``col - row >= k`` kept,
    others zero (``numpy.triu``). ``triu(full((n, n), -inf), 1)`` is a causal attention mask.

    Examples
    --------
    >>> triu(Var("x", TensorStructInfo((4, 4), "float32")), 1).struct_info
    Tensor((4, 4), 'float32')
    """
    return _triu(x, k)
