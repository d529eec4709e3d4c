"""Normalizations: ``batch_norm``, ``layer_norm``, ``group_norm``, ``rms_norm``.

Statistics are population statistics (divide by N), computed in two passes (mean, then the
mean squared deviation) and accumulated in float32 for float16 inputs; the result has the
input's dtype. All are ``COMM_REDUCE`` for fusion, like the reductions and softmax.

Parameter tensors (gamma, beta, moving statistics, weight) must have the data's dtype and the
shape the op expects; a provably wrong dim raises ``RelaxError`` naming the op, one that cannot
be proven right (two different symbolic dims) is checked by the kernel at run time.

``batch_norm`` returns a tuple ``(out, mean, var)`` as TVM does: in inference mode
(``training=False``, the default here) normalizes with the moving statistics and returns them
unchanged; with ``training=True`` normalizes with the batch statistics and returns the updated
moving statistics ``(1 - momentum) * moving + momentum * batch``.

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo
>>> from tilecraft.relax.op import nn
>>> x = Var("x", TensorStructInfo(("n", 16, 768), "float32"))
>>> g = Var("g", TensorStructInfo((768,), "float32"))
>>> nn.layer_norm(x, g, g, axes=-1).struct_info
Tensor((n, 16, 768), 'float32')
"""
from __future__ import annotations

from tilecraft.tensorir import arith, dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import Cast, FloatImm, FloorMod, IntImm

from ...expr import Call, Expr, RelaxError
from ...struct_info import TensorStructInfo, TupleStructInfo
from ..helpers import (call_te, check_nargs, dim_checks, dims_differ, dims_equal, float_acc_dtype,
                       fmt_dim, fmt_shape, normalize_axes, normalize_axis, out_name, tensor_sinfo)
from ..base import OpPattern, as_expr, call as make_call, register_op
from ..reduction import keep_index, reduce_count, te_reduce

__all__ = ["batch_norm", "layer_norm", "group_norm", "rms_norm"]


# ---------------------------------------------------------------------------------------------
# checks shared by the inference and the legalization

def _param_checks(op_name: str, what: str, si: TensorStructInfo, expected, dtype: str,
                  node=None) -> list:
    """Check a parameter tensor against the ``expected`` shape and ``dtype``; return the dim
    pairs that could not be proven equal (to be checked at run time)."""
    if si.dtype != dtype:
        raise RelaxError(f"{op_name}: {what} has dtype {si.dtype} but the data is {dtype}", node)
    if si.ndim >= 0 and si.ndim != len(expected):
        raise RelaxError(f"{op_name}: {what} must have shape {fmt_shape(expected)} "
                         f"({len(expected)} dimension(s)), got rank {si.ndim}", node)
    if si.shape is None or expected is None:
        return []
    checks = []
    for k, (a, b) in enumerate(zip(expected, si.shape)):
        if dims_equal(a, b):
            continue
        if dims_differ(a, b):
            raise RelaxError(f"{op_name}: {what} must have shape {fmt_shape(expected)}, got "
                             f"{fmt_shape(si.shape)} (dimension {k}: {fmt_dim(b)} vs "
                             f"{fmt_dim(a)})", node)
        checks.append((a, b))
    return checks


def _data_sinfo(op_name: str, call: Call) -> TensorStructInfo:
    si = tensor_sinfo(op_name, call, 0, "the data")
    if not dt.is_float(si.dtype):
        raise RelaxError(f"{op_name}: needs a float tensor, got {si.dtype}", call)
    return si


def _eps(op_name, epsilon) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise RelaxError(f"{op_name}: epsilon must be a number, got {epsilon!r}")
    return float(epsilon)


# ---------------------------------------------------------------------------------------------
# batch_norm

def _bn_checks(call: Call) -> tuple[TensorStructInfo, list]:
    op_name = "relax.nn.batch_norm"
    check_nargs(op_name, call, 5)
    si = _data_sinfo(op_name, call)
    axis = call.attr_dict["axis"]
    checks = []
    names = ["gamma", "beta", "moving_mean", "moving_var"]
    if si.ndim >= 0:
        ax = normalize_axis(op_name, axis, si.ndim)
        c = (si.shape[ax],) if si.shape is not None else None
    else:
        c = None
    for k, nm in enumerate(names, start=1):
        p = tensor_sinfo(op_name, call, k, nm)
        if c is None:
            if p.dtype != si.dtype:
                raise RelaxError(f"{op_name}: {nm} has dtype {p.dtype} but the data is "
                                 f"{si.dtype}", call)
            continue
        checks += _param_checks(op_name, nm, p, c, si.dtype, call)
    return si, checks


def _infer_batch_norm(call: Call):
    si, _ = _bn_checks(call)
    mean_si = call.args[3].struct_info
    var_si = call.args[4].struct_info
    return TupleStructInfo([TensorStructInfo(si.shape, si.dtype, si.ndim),
                            TensorStructInfo(mean_si.shape, mean_si.dtype, mean_si.ndim),
                            TensorStructInfo(var_si.shape, var_si.dtype, var_si.ndim)])


def te_batch_norm(x, gamma, beta, moving_mean, moving_var, axis, epsilon, center, scale,
                  momentum, training):
    """te: batch normalization; returns [out, mean, var] (see the module docstring)."""
    ax = normalize_axis("relax.nn.batch_norm", axis, x.ndim)
    acc = float_acc_dtype(x.dtype)
    eps = FloatImm(epsilon, acc)
    if training:
        axes = [d for d in range(x.ndim) if d != ax]
        n = reduce_count(x.shape, axes, acc)
        s = te_reduce(x, axes, False, "sum", out_name("T_bn_sum", x), acc_dtype=acc)

        def sq(v, idx):
            d = v.astype(acc) - s[(idx[ax],)] / n
            return d * d
        ss = te_reduce(x, axes, False, "sum", out_name("T_bn_sqsum", x), source=sq,
                       acc_dtype=acc)

        def mean_of(c):
            return s[(c,)] / n

        def var_of(c):
            return ss[(c,)] / n
    else:
        def mean_of(c):
            return moving_mean[(c,)].astype(acc)

        def var_of(c):
            return moving_var[(c,)].astype(acc)

    def f(*i):
        c = i[ax]
        v = (x[i].astype(acc) - mean_of(c)) * te.rsqrt(var_of(c) + eps)
        if scale:
            v = v * gamma[(c,)].astype(acc)
        if center:
            v = v + beta[(c,)].astype(acc)
        return v.astype(x.dtype)
    out = te.compute(x.shape, f, out_name("T_batch_norm", x, gamma, beta, moving_mean,
                                           moving_var))
    if not training:
        return [out, moving_mean, moving_var]
    m = FloatImm(momentum, acc)
    one_m = FloatImm(1.0 - momentum, acc)
    new_mean = te.compute(moving_mean.shape,
                          lambda c: (one_m * moving_mean[c].astype(acc) + m * mean_of(c))
                          .astype(x.dtype), out_name("T_bn_mean", moving_mean, moving_var))
    new_var = te.compute(moving_var.shape,
                         lambda c: (one_m * moving_var[c].astype(acc) + m * var_of(c))
                         .astype(x.dtype), out_name("T_bn_var", moving_mean, moving_var))
    return [out, new_mean, new_var]


def _legalize_batch_norm(bb, call: Call):
    _, checks = _bn_checks(call)
    a = call.attr_dict
    return call_te(bb, te_batch_norm, *call.args, a["axis"], a["epsilon"], a["center"],
                   a["scale"], a["momentum"], a["training"],
                   checks=dim_checks("relax.nn.batch_norm", checks),
                   primfunc_name_hint="batch_norm")


register_op("relax.nn.batch_norm", _infer_batch_norm, _legalize_batch_norm,
            OpPattern.COMM_REDUCE, "batch normalization; a tuple (out, mean, var)")


def batch_norm(data: Expr, gamma: Expr, beta: Expr, moving_mean: Expr, moving_var: Expr,
               axis: int = 1, epsilon: float = 1e-5, center: bool = True, scale: bool = True,
               momentum: float = 0.1, training: bool = False) -> Call:
    """Batch normalization over the channel ``axis``; returns a tuple ``(out, mean, var)``.

    ``out = (data - mean) / sqrt(var + epsilon) * gamma + beta`` per channel (gamma left out if
    not ``scale``, beta if not ``center``). Inference (``training=False``): the moving
    statistics are used and returned as they are. Training: the batch statistics are used and
    the moving ones returned updated with ``momentum``.

    Examples
    --------
    >>> bn = batch_norm(x, gamma, beta, mean, var, axis=1)   # doctest: +SKIP
    >>> out = bb.emit(relax.TupleGetItem(bb.emit(bn), 0))      # doctest: +SKIP
    """
    op_name = "relax.nn.batch_norm"
    args = [as_expr(a, op_name) for a in (data, gamma, beta, moving_mean, moving_var)]
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise RelaxError(f"{op_name}: axis must be an int, got {axis!r}")
    attrs = {"axis": axis, "epsilon": _eps(op_name, epsilon), "center": bool(center),
             "scale": bool(scale), "momentum": float(momentum), "training": bool(training)}
    return make_call(op_name, args, attrs)


# ---------------------------------------------------------------------------------------------
# layer_norm

def _ln_checks(call: Call):
    op_name = "relax.nn.layer_norm"
    check_nargs(op_name, call, 3)
    si = _data_sinfo(op_name, call)
    checks = []
    axes = None
    if si.ndim >= 0:
        axes = normalize_axes(op_name, call.attr_dict["axes"], si.ndim, "axes")
    expected = None if axes is None or si.shape is None else tuple(si.shape[a] for a in axes)
    for k, nm in ((1, "gamma"), (2, "beta")):
        p = tensor_sinfo(op_name, call, k, nm)
        if expected is None:
            if p.dtype != si.dtype:
                raise RelaxError(f"{op_name}: {nm} has dtype {p.dtype} but the data is "
                                 f"{si.dtype}", call)
            continue
        checks += _param_checks(op_name, nm, p, expected, si.dtype, call)
    return si, checks


def _infer_layer_norm(call: Call):
    si, _ = _ln_checks(call)
    return TensorStructInfo(si.shape, si.dtype, si.ndim)


def _normalize_te(x, axes, acc, eps):
    """(sum, sum of squared deviations, count) over ``axes``, keepdims-shaped."""
    n = reduce_count(x.shape, axes, acc)
    s = te_reduce(x, axes, True, "sum", out_name("T_norm_sum", x), acc_dtype=acc)

    def sq(v, idx):
        d = v.astype(acc) - s[keep_index(idx, axes)] / n
        return d * d
    ss = te_reduce(x, axes, True, "sum", out_name("T_norm_sqsum", x), source=sq, acc_dtype=acc)
    return s, ss, n


def te_layer_norm(x, gamma, beta, axes, epsilon, center, scale):
    """te: layer normalization over ``axes``; gamma and beta have the shape of those dims."""
    axes = normalize_axes("relax.nn.layer_norm", axes, x.ndim, "axes")
    acc = float_acc_dtype(x.dtype)
    eps = FloatImm(epsilon, acc)
    s, ss, n = _normalize_te(x, axes, acc, eps)

    def f(*i):
        k = keep_index(i, axes)
        v = (x[i].astype(acc) - s[k] / n) * te.rsqrt(ss[k] / n + eps)
        gi = tuple(i[a] for a in axes)
        if scale:
            v = v * gamma[gi].astype(acc)
        if center:
            v = v + beta[gi].astype(acc)
        return v.astype(x.dtype)
    return te.compute(x.shape, f, out_name("T_layer_norm", x, gamma, beta))


def _legalize_layer_norm(bb, call: Call):
    _, checks = _ln_checks(call)
    a = call.attr_dict
    return call_te(bb, te_layer_norm, *call.args, list(a["axes"]), a["epsilon"],
                   a["center"], a["scale"], checks=dim_checks("relax.nn.layer_norm", checks),
                   primfunc_name_hint="layer_norm")


register_op("relax.nn.layer_norm", _infer_layer_norm, _legalize_layer_norm,
            OpPattern.COMM_REDUCE, "layer normalization over axes")


def _axes_attr(op_name, axes):
    items = axes if isinstance(axes, (list, tuple)) else [axes]
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int):
            raise RelaxError(f"{op_name}: axes must be an int or a list of ints, got {axes!r}")
    return tuple(items)


def layer_norm(data: Expr, gamma: Expr, beta: Expr, axes=-1, epsilon: float = 1e-5,
               center: bool = True, scale: bool = True) -> Call:
    """Layer normalization over ``axes`` (an int or a list):
    ``(data - mean) / sqrt(var + epsilon) * gamma + beta``, gamma and beta of the shape of the
    normalized dims.

    Examples
    --------
    >>> layer_norm(x, g, b, axes=-1).struct_info   # doctest: +SKIP
    Tensor((n, 16, 768), 'float32')
    """
    op_name = "relax.nn.layer_norm"
    args = [as_expr(a, op_name) for a in (data, gamma, beta)]
    attrs = {"axes": _axes_attr(op_name, axes), "epsilon": _eps(op_name, epsilon),
             "center": bool(center), "scale": bool(scale)}
    return make_call(op_name, args, attrs)


# ---------------------------------------------------------------------------------------------
# group_norm

def _gn_axes(op_name, si, attrs):
    ch = normalize_axis(op_name, attrs["channel_axis"], si.ndim, "channel_axis")
    axes = attrs["axes"]
    if axes is None:
        axes = [d for d in range(si.ndim) if d not in (0, ch)]
    else:
        axes = normalize_axes(op_name, list(axes), si.ndim, "axes")
    if ch in axes:
        raise RelaxError(f"{op_name}: axes {list(attrs['axes'])} must not contain the channel "
                         f"axis {ch}")
    return ch, axes


def _gn_checks(call: Call):
    op_name = "relax.nn.group_norm"
    check_nargs(op_name, call, 3)
    si = _data_sinfo(op_name, call)
    attrs = call.attr_dict
    g = attrs["num_groups"]
    checks = []
    c = None
    if si.ndim >= 0:
        ch, _ = _gn_axes(op_name, si, attrs)
        if si.shape is not None:
            c = si.shape[ch]
            if isinstance(c, IntImm):
                if c.value % g:
                    raise RelaxError(f"{op_name}: the channel dim {c.value} is not divisible by "
                                     f"num_groups={g}", call)
            else:
                checks.append((FloorMod(c, IntImm(g, "int64")), IntImm(0, "int64"),
                               f"{op_name}: the channel dim {fmt_dim(c)} must be divisible by "
                               f"num_groups={g}"))
    for k, nm in ((1, "gamma"), (2, "beta")):
        p = tensor_sinfo(op_name, call, k, nm)
        if c is None:
            if p.dtype != si.dtype:
                raise RelaxError(f"{op_name}: {nm} has dtype {p.dtype} but the data is "
                                 f"{si.dtype}", call)
            continue
        checks += _param_checks(op_name, nm, p, (c,), si.dtype, call)
    return si, checks


def _infer_group_norm(call: Call):
    si, _ = _gn_checks(call)
    return TensorStructInfo(si.shape, si.dtype, si.ndim)


def te_group_norm(x, gamma, beta, num_groups, channel_axis, axes, epsilon, center, scale):
    """te: group normalization: channels split into ``num_groups`` groups, each normalized over
    its channels and ``axes``."""
    op_name = "relax.nn.group_norm"
    ch, axes = _gn_axes(op_name, TensorStructInfo(x.shape, x.dtype),
                        {"channel_axis": channel_axis, "axes": axes})
    acc = float_acc_dtype(x.dtype)
    eps = FloatImm(epsilon, acc)
    G = IntImm(num_groups, "int64")
    cg = x.shape[ch] // G
    # statistics: the data's shape with channels -> groups and the axes -> 1
    stat_shape = [G if d == ch else (IntImm(1, "int64") if d in axes else s)
                  for d, s in enumerate(x.shape)]
    n_expr = cg
    for d in axes:
        n_expr = n_expr * x.shape[d]
    n_expr = arith.simplify(n_expr)
    n = FloatImm(float(n_expr.value), acc) if isinstance(n_expr, IntImm) else Cast(acc, n_expr)

    def reduce_stat(name, source):
        kc = te.reduce_axis((0, cg), "kc")
        ks = [te.reduce_axis((0, x.shape[d]), f"k{j}") for j, d in enumerate(axes)]

        def f(*i):
            idx, r = [], 0
            for d in range(x.ndim):
                if d == ch:
                    idx.append(i[d] * cg + kc.var)
                elif d in axes:
                    idx.append(ks[r].var)
                    r += 1
                else:
                    idx.append(i[d])
            idx = tuple(idx)
            return te.sum(source(x[idx].astype(acc), i), axis=[kc] + ks)
        return te.compute(stat_shape, f, out_name(name, x, gamma, beta))

    def stat_index(i):
        return tuple(i[d] // cg if d == ch else (IntImm(0, "int64") if d in axes else i[d])
                     for d in range(x.ndim))

    s = reduce_stat("T_gn_sum", lambda v, si: v)

    def sq(v, si):
        d = v - s[si] / n
        return d * d
    ss = reduce_stat("T_gn_sqsum", sq)

    def f(*i):
        k = stat_index(i)
        v = (x[i].astype(acc) - s[k] / n) * te.rsqrt(ss[k] / n + eps)
        c = i[ch]
        if scale:
            v = v * gamma[(c,)].astype(acc)
        if center:
            v = v + beta[(c,)].astype(acc)
        return v.astype(x.dtype)
    return te.compute(x.shape, f, out_name("T_group_norm", x, gamma, beta))


def _legalize_group_norm(bb, call: Call):
    _, checks = _gn_checks(call)
    a = call.attr_dict
    return call_te(bb, te_group_norm, *call.args, a["num_groups"], a["channel_axis"],
                   None if a["axes"] is None else list(a["axes"]), a["epsilon"],
                   a["center"], a["scale"], checks=dim_checks("relax.nn.group_norm", checks),
                   primfunc_name_hint="group_norm")


register_op("relax.nn.group_norm", _infer_group_norm, _legalize_group_norm,
            OpPattern.COMM_REDUCE, "group normalization")


def group_norm(data: Expr, gamma: Expr, beta: Expr, num_groups: int, channel_axis: int = 1,
               axes=None, epsilon: float = 1e-5, center: bool = True,
               scale: bool = True) -> Call:
    """Group normalization: the ``channel_axis`` dim (C, divisible by ``num_groups``) is split
    into groups; each group is normalized over its channels and ``axes`` (default: every dim
    but 0, the batch, and the channel axis), then scaled by ``gamma`` and shifted by ``beta``
    (both of shape (C,)).

    Examples
    --------
    >>> group_norm(x, g, b, num_groups=4).struct_info   # doctest: +SKIP
    Tensor((n, 32, 8, 8), 'float32')
    """
    op_name = "relax.nn.group_norm"
    args = [as_expr(a, op_name) for a in (data, gamma, beta)]
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise RelaxError(f"{op_name}: num_groups must be a positive int, got {num_groups!r}")
    if isinstance(channel_axis, bool) or not isinstance(channel_axis, int):
        raise RelaxError(f"{op_name}: channel_axis must be an int, got {channel_axis!r}")
    attrs = {"num_groups": num_groups, "channel_axis": channel_axis,
             "axes": None if axes is None else _axes_attr(op_name, axes),
             "epsilon": _eps(op_name, epsilon), "center": bool(center), "scale": bool(scale)}
    return make_call(op_name, args, attrs)


# ---------------------------------------------------------------------------------------------
# rms_norm

def _rms_checks(call: Call):
    op_name = "relax.nn.rms_norm"
    check_nargs(op_name, call, 2)
    si = _data_sinfo(op_name, call)
    p = tensor_sinfo(op_name, call, 1, "weight")
    if si.ndim < 0 or si.shape is None:
        if p.dtype != si.dtype:
            raise RelaxError(f"{op_name}: weight has dtype {p.dtype} but the data is {si.dtype}",
                             call)
        if si.ndim >= 0:
            normalize_axes(op_name, call.attr_dict["axes"], si.ndim, "axes")
        return si, []
    axes = normalize_axes(op_name, call.attr_dict["axes"], si.ndim, "axes")
    expected = tuple(si.shape[a] for a in axes)
    return si, _param_checks(op_name, "weight", p, expected, si.dtype, call)


def _infer_rms_norm(call: Call):
    si, _ = _rms_checks(call)
    return TensorStructInfo(si.shape, si.dtype, si.ndim)


def te_rms_norm(x, weight, axes, epsilon):
    """te: ``x / sqrt(mean(x^2 over axes) + epsilon) * weight``."""
    axes = normalize_axes("relax.nn.rms_norm", axes, x.ndim, "axes")
    acc = float_acc_dtype(x.dtype)
    eps = FloatImm(epsilon, acc)
    n = reduce_count(x.shape, axes, acc)

    def sq(v, idx):
        v = v.astype(acc)
        return v * v
    ss = te_reduce(x, axes, True, "sum", out_name("T_rms_sqsum", x, weight), source=sq,
                   acc_dtype=acc)

    def f(*i):
        k = keep_index(i, axes)
        v = x[i].astype(acc) * te.rsqrt(ss[k] / n + eps)
        return (v * weight[tuple(i[a] for a in axes)].astype(acc)).astype(x.dtype)
    return te.compute(x.shape, f, out_name("T_rms_norm", x, weight))


def _legalize_rms_norm(bb, call: Call):
    _, checks = _rms_checks(call)
    a = call.attr_dict
    return call_te(bb, te_rms_norm, *call.args, list(a["axes"]), a["epsilon"],
                   checks=dim_checks("relax.nn.rms_norm", checks), primfunc_name_hint="rms_norm")


register_op("relax.nn.rms_norm", _infer_rms_norm, _legalize_rms_norm, OpPattern.COMM_REDUCE,
            "root-mean-square normalization")


def rms_norm(data: Expr, weight: Expr, axes=-1, epsilon: float = 1e-5) -> Call:
    """RMS normalization over ``axes``: ``data / sqrt(mean(data^2) + epsilon) * weight``
    (weight of the shape of the normalized dims).

    Examples
    --------
    >>> rms_norm(x, w, axes=-1).struct_info   # doctest: +SKIP
    Tensor((n, 16, 768), 'float32')
    """
    op_name = "relax.nn.rms_norm"
    args = [as_expr(a, op_name) for a in (data, weight)]
    return make_call(op_name, args, {"axes": _axes_attr(op_name, axes),
                                     "epsilon": _eps(op_name, epsilon)})
