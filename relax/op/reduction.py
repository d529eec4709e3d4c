"""Reductions: ``sum``, ``mean``, ``max``, ``min``, ``prod``, ``variance``, ``std`` over axes, and
``argmax`` / ``argmin``.

``axis``: None reduces every dimension, an int or a list of ints (negative counts from the end)
reduces those; an empty list reduces nothing (numpy's ``axis=()``). ``keepdims=True`` keeps the
reduced dimensions with size 1.

Dtypes: the result has the input's dtype (integer sums wrap in that dtype, unlike numpy's
int64 accumulation). float16 inputs accumulate in float32 (sum, mean, prod, variance, std).
``mean``, ``variance`` and ``std`` need float tensors; ``variance`` is the population variance
(numpy's ``ddof=0``), computed in two passes (mean first) for accuracy. ``argmax`` / ``argmin``
return int64 indices of the first extreme element (the first NaN, if any, as numpy); with
``axis=None`` the index is into the flattened tensor.

All are ``COMM_REDUCE`` for fusion (elementwise producers fuse into them).

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo
>>> x = Var("x", TensorStructInfo(("n", 8, 4), "float32"))
>>> sum(x, axis=[1, -1]).struct_info
Tensor((n), 'float32')
>>> mean(x, axis=1, keepdims=True).struct_info
Tensor((n, 1, 4), 'float32')
"""
from __future__ import annotations

import builtins

from tilecraft.tensorir import arith, dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import Cast, FloatImm, IntImm, Select, max_value

from ..expr import Call, Expr, RelaxError
from ..struct_info import TensorStructInfo
from .base import OpPattern, as_expr, call as make_call, register_op
from .helpers import (check_nargs, float_acc_dtype, normalize_axes, normalize_axis, out_name,
                      tensor_sinfo)

__all__ = ["sum", "mean", "max", "min", "prod", "variance", "std", "argmax", "argmin"]


# ---------------------------------------------------------------------------------------------
# shape helpers (also used by relax.op.nn.norm)

def reduce_shape(shape, axes, keepdims: bool) -> list:
    """The shape after reducing ``axes`` (normalized ints)."""
    out = []
    for d, s in enumerate(shape):
        if d in axes:
            if keepdims:
                out.append(IntImm(1, "int64"))
        else:
            out.append(s)
    return out


def full_index(out_idx, axes, ndim: int, keepdims: bool, rvars) -> tuple:
    """The input index for output index ``out_idx`` and reduce variables ``rvars`` (one per
    axis in ``axes``)."""
    idx, p, r = [], 0, 0
    for d in range(ndim):
        if d in axes:
            idx.append(rvars[r])
            r += 1
            if keepdims:
                p += 1
        else:
            idx.append(out_idx[p])
            p += 1
    return tuple(idx)


def keep_index(idx, axes) -> tuple:
    """The index into a keepdims-shaped statistic for the full input index ``idx``."""
    return tuple(IntImm(0, "int64") if d in axes else i for d, i in enumerate(idx))


def expand_index(out_idx, axes, ndim: int) -> tuple:
    """The keepdims-shaped index for an output index without the reduced dims."""
    idx, p = [], 0
    for d in range(ndim):
        if d in axes:
            idx.append(IntImm(0, "int64"))
        else:
            idx.append(out_idx[p])
            p += 1
    return tuple(idx)


def reduce_count(shape, axes, dtype: str):
    """The number of reduced elements as a ``dtype`` scalar expression."""
    n = IntImm(1, "int64")
    for d in axes:
        n = n * shape[d]
    n = arith.simplify(n)
    if isinstance(n, IntImm):
        return FloatImm(float(n.value), dtype)
    return Cast(dtype, n)


def te_reduce(x, axes, keepdims: bool, combiner: str, name: str, source=None,
              acc_dtype: str | None = None):
    """te: reduce ``x`` over ``axes`` with ``combiner`` (sum/prod/max/min) of
    ``source(element, full index)``, accumulating in ``acc_dtype``."""
    shape = reduce_shape(x.shape, axes, keepdims)
    rk = [te.reduce_axis((0, x.shape[d]), f"k{j}") for j, d in enumerate(axes)]
    reducer = {"sum": te.sum, "prod": te.prod, "max": te.max, "min": te.min}[combiner]

    def f(*i):
        idx = full_index(i, axes, x.ndim, keepdims, [k.var for k in rk])
        v = x[idx]
        if source is not None:
            v = source(v, idx)
        if acc_dtype is not None:
            v = v.astype(acc_dtype)
        if not rk:
            return v
        return reducer(v, axis=rk)
    return te.compute(shape, f, name)


# ---------------------------------------------------------------------------------------------
# inference

def _axes_attr(axis):
    if axis is None:
        return None
    if isinstance(axis, (list, tuple)):
        return tuple(int(a) if not isinstance(a, bool) else a for a in axis)
    return (axis,)


def _reduced_sinfo(op_name, si, axis, keepdims, dtype):
    if si.ndim < 0:
        if axis is None and not keepdims:
            return TensorStructInfo((), dtype)
        if axis is not None and builtins.any(a < 0 for a in axis):
            raise RelaxError(f"{op_name}: negative axes need a tensor of known rank")
        return TensorStructInfo(None, dtype, -1)
    axes = normalize_axes(op_name, axis, si.ndim)
    if si.shape is None:
        return TensorStructInfo(None, dtype, si.ndim if keepdims else si.ndim - len(axes))
    return TensorStructInfo(reduce_shape(si.shape, axes, keepdims), dtype)


DTYPE_NUMERIC = ("numeric", "a numeric (int, uint or float)")
DTYPE_FLOAT = ("float", "a float")
_NONBOOL_OR_BOOL = ("any", "a numeric or bool")


def _check_dtype(op_name, cls, dtype, node):
    ok = {"numeric": dt.is_float(dtype) or dt.is_integer(dtype),
          "float": dt.is_float(dtype), "any": True}[cls[0]]
    if not ok:
        raise RelaxError(f"{op_name}: needs {cls[1]} tensor, got {dtype}", node)


def _make_infer(op_name, cls, out_dtype=None):
    def infer(call: Call):
        check_nargs(op_name, call, 1)
        si = tensor_sinfo(op_name, call, 0, "the input")
        _check_dtype(op_name, cls, si.dtype, call)
        attrs = call.attr_dict
        return _reduced_sinfo(op_name, si, attrs.get("axis"), attrs.get("keepdims", False),
                              out_dtype or si.dtype)
    return infer


# ---------------------------------------------------------------------------------------------
# legalization

def _simple_reduce(op_name, combiner):
    short = op_name.rsplit(".", 1)[-1]

    def te_func(x, axis, keepdims):
        axes = normalize_axes(op_name, axis, x.ndim)
        acc = float_acc_dtype(x.dtype) if combiner in ("sum", "prod") else x.dtype
        if acc == x.dtype:
            return te_reduce(x, axes, keepdims, combiner, out_name("T_" + short, x))
        r = te_reduce(x, axes, keepdims, combiner, out_name("T_" + short + "_acc", x),
                      acc_dtype=acc)
        return te.compute(r.shape, lambda *i: r[i].astype(x.dtype), out_name("T_" + short, x))

    def legalize(bb, call: Call):
        a = call.attr_dict
        return bb.call_te(te_func, call.args[0], a.get("axis"), a.get("keepdims", False),
                          primfunc_name_hint=short)
    return legalize


def _te_mean(x, axis, keepdims):
    axes = normalize_axes("relax.mean", axis, x.ndim)
    acc = float_acc_dtype(x.dtype)
    s = te_reduce(x, axes, keepdims, "sum", out_name("T_mean_sum", x), acc_dtype=acc)
    n = reduce_count(x.shape, axes, acc)
    return te.compute(s.shape, lambda *i: (s[i] / n).astype(x.dtype), out_name("T_mean", x))


def _te_variance(x, axis, keepdims, take_sqrt=False):
    op_name = "relax.std" if take_sqrt else "relax.variance"
    axes = normalize_axes(op_name, axis, x.ndim)
    acc = float_acc_dtype(x.dtype)
    n = reduce_count(x.shape, axes, acc)
    s = te_reduce(x, axes, True, "sum", out_name("T_var_sum", x), acc_dtype=acc)

    def sq(v, idx):
        d = v.astype(acc) - s[keep_index(idx, axes)] / n
        return d * d
    ss = te_reduce(x, axes, True, "sum", out_name("T_var_sqsum", x), source=sq, acc_dtype=acc)

    def f(*i):
        idx = i if keepdims else expand_index(i, axes, x.ndim)
        v = ss[idx] / n
        if take_sqrt:
            v = te.sqrt(v)
        return v.astype(x.dtype)
    shape = reduce_shape(x.shape, axes, keepdims)
    return te.compute(shape, f, out_name("T_std" if take_sqrt else "T_variance", x))


def _te_std(x, axis, keepdims):
    return _te_variance(x, axis, keepdims, take_sqrt=True)


def _legalize_with(te_func, short):
    def legalize(bb, call: Call):
        a = call.attr_dict
        return bb.call_te(te_func, call.args[0], a.get("axis"), a.get("keepdims", False),
                          primfunc_name_hint=short)
    return legalize


def _te_arg(op_name, combiner):
    short = op_name.rsplit(".", 1)[-1]

    def te_func(x, axis, keepdims):
        axes = normalize_axes(op_name, None if axis is None else axis, x.ndim)
        ext = te_reduce(x, axes, True, combiner, out_name("T_" + short + "_value", x))
        # flat index over the reduced dims, row-major (the flattened index when axis is None)
        strides, acc = {}, IntImm(1, "int64")
        for d in reversed(axes):
            strides[d] = acc
            acc = acc * x.shape[d]
        big = max_value("int64")
        rk = [te.reduce_axis((0, x.shape[d]), f"k{j}") for j, d in enumerate(axes)]
        shape = reduce_shape(x.shape, axes, keepdims)

        def f(*i):
            idx = full_index(i, axes, x.ndim, keepdims, [k.var for k in rk])
            flat = IntImm(0, "int64")
            for d, k in zip(axes, rk):
                flat = flat + k.var * strides[d]
            v = x[idx]
            hit = v == ext[keep_index(idx, axes)]
            if dt.is_float(x.dtype):
                hit = hit | (v != v)  # the first NaN wins, as in numpy
            src = Select(hit, flat, big)
            if not rk:
                return IntImm(0, "int64")  # a 0-d input: the one element is at index 0
            return te.min(src, axis=rk)
        return te.compute(shape, f, out_name("T_" + short, x))

    def legalize(bb, call: Call):
        a = call.attr_dict
        axis = a.get("axis")
        return bb.call_te(te_func, call.args[0], None if axis is None else [axis],
                          a.get("keepdims", False), primfunc_name_hint=short)
    return legalize


def _make_arg_infer(op_name):
    def infer(call: Call):
        check_nargs(op_name, call, 1)
        si = tensor_sinfo(op_name, call, 0, "the input")
        a = call.attr_dict
        axis = a.get("axis")
        if axis is not None and si.ndim >= 0:
            normalize_axis(op_name, axis, si.ndim)
        return _reduced_sinfo(op_name, si, None if axis is None else (axis,),
                              a.get("keepdims", False), "int64")
    return infer


register_op("relax.sum", _make_infer("relax.sum", DTYPE_NUMERIC),
            _simple_reduce("relax.sum", "sum"), OpPattern.COMM_REDUCE, "sum over axes")
register_op("relax.prod", _make_infer("relax.prod", DTYPE_NUMERIC),
            _simple_reduce("relax.prod", "prod"), OpPattern.COMM_REDUCE, "product over axes")
register_op("relax.max", _make_infer("relax.max", _NONBOOL_OR_BOOL),
            _simple_reduce("relax.max", "max"), OpPattern.COMM_REDUCE, "maximum over axes")
register_op("relax.min", _make_infer("relax.min", _NONBOOL_OR_BOOL),
            _simple_reduce("relax.min", "min"), OpPattern.COMM_REDUCE, "minimum over axes")
register_op("relax.mean", _make_infer("relax.mean", DTYPE_FLOAT), _legalize_with(_te_mean, "mean"),
            OpPattern.COMM_REDUCE, "mean over axes")
register_op("relax.variance", _make_infer("relax.variance", DTYPE_FLOAT),
            _legalize_with(_te_variance, "variance"), OpPattern.COMM_REDUCE,
            "population variance over axes")
register_op("relax.std", _make_infer("relax.std", DTYPE_FLOAT), _legalize_with(_te_std, "std"),
            OpPattern.COMM_REDUCE, "population standard deviation over axes")
register_op("relax.argmax", _make_arg_infer("relax.argmax"), _te_arg("relax.argmax", "max"),
            OpPattern.COMM_REDUCE, "index of the maximum (int64)")
register_op("relax.argmin", _make_arg_infer("relax.argmin"), _te_arg("relax.argmin", "min"),
            OpPattern.COMM_REDUCE, "index of the minimum (int64)")


# ---------------------------------------------------------------------------------------------
# API

def _check_axis_arg(op_name, axis):
    if axis is None:
        return None
    items = axis if isinstance(axis, (list, tuple)) else [axis]
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int):
            try:
                import numpy as np
                if isinstance(a, np.integer):
                    continue
            except ImportError:  # pragma: no cover
                pass
            raise RelaxError(f"{op_name}: axis must be None, an int or a list of ints, got "
                             f"{axis!r}")
    return tuple(int(a) for a in items)


def _reduce_call(op_name, x, axis, keepdims):
    return make_call(op_name, [as_expr(x, op_name)],
                     {"axis": _check_axis_arg(op_name, axis), "keepdims": bool(keepdims)})


def sum(x: Expr, axis=None, keepdims: bool = False) -> Call:
    """Sum over ``axis`` (None: all; an int or a list).

    Examples
    --------
    >>> sum(x, axis=-1).struct_info   # doctest: +SKIP
    Tensor((n, 8), 'float32')
    """
    return _reduce_call("relax.sum", x, axis, keepdims)


def mean(x: Expr, axis=None, keepdims: bool = False) -> Call:
    """Mean over ``axis`` of a float tensor."""
    return _reduce_call("relax.mean", x, axis, keepdims)


def max(x: Expr, axis=None, keepdims: bool = False) -> Call:
    """Maximum over ``axis`` (NaN propagates)."""
    return _reduce_call("relax.max", x, axis, keepdims)


def min(x: Expr, axis=None, keepdims: bool = False) -> Call:
    """Minimum over ``axis`` (NaN propagates)."""
    return _reduce_call("relax.min", x, axis, keepdims)


def prod(x: Expr, axis=None, keepdims: bool = False) -> Call:
    """Product over ``axis``."""
    return _reduce_call("relax.prod", x, axis, keepdims)


def variance(x: Expr, axis=None, keepdims: bool = False) -> Call:
    """Population variance (``mean((x - mean(x))**2)``) over ``axis`` of a float tensor."""
    return _reduce_call("relax.variance", x, axis, keepdims)


def std(x: Expr, axis=None, keepdims: bool = False) -> Call:
    """Population standard deviation over ``axis`` of a float tensor."""
    return _reduce_call("relax.std", x, axis, keepdims)


def _arg_call(op_name, x, axis, keepdims):
    if axis is not None:
        if isinstance(axis, (list, tuple)) or isinstance(axis, bool):
            raise RelaxError(f"{op_name}: axis must be None or an int, got {axis!r}")
        axis = _check_axis_arg(op_name, axis)[0]
    return make_call(op_name, [as_expr(x, op_name)], {"axis": axis, "keepdims": bool(keepdims)})


def argmax(x: Expr, axis: int | None = None, keepdims: bool = False) -> Call:
    """Index (int64) of the first maximum along ``axis`` (None: into the flattened tensor).

    Examples
    --------
    >>> argmax(x, axis=1).struct_info   # doctest: +SKIP
    Tensor((n, 4), 'int64')
    """
    return _arg_call("relax.argmax", x, axis, keepdims)


def argmin(x: Expr, axis: int | None = None, keepdims: bool = False) -> Call:
    """Index (int64) of the first minimum along ``axis`` (None: into the flattened tensor)."""
    return _arg_call("relax.argmin", x, axis, keepdims)
