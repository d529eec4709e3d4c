"""Activations (``relax.op.nn.relu``, ``gelu``, ``silu``, ...) and ``softmax`` / ``log_softmax``.

Activations are ``ELEMWISE`` and compute in the input dtype. ``softmax`` and ``log_softmax``
subtract the maximum along ``axis`` first (numerically stable), accumulate float16 in float32,
and are ``COMM_REDUCE`` for fusion (elementwise producers fuse into them), like the reductions
and normalizations.

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo
>>> from tilecraft.relax.op import nn
>>> x = Var("x", TensorStructInfo(("n", 10), "float32"))
>>> nn.softmax(x).struct_info
Tensor((n, 10), 'float32')
"""
from __future__ import annotations

import math

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import FloatImm, IntImm, Max, Min, Select

from ...expr import Call, Expr, RelaxError
from ...struct_info import TensorStructInfo
from ..base import OpPattern, as_expr, call as make_call, register_op
from ..elementwise import sigmoid as _sigmoid
from ..helpers import (DTYPE_FLOAT, DTYPE_NUMERIC, check_dtype_class, check_nargs, float_acc_dtype,
                       normalize_axis, out_name, tensor_sinfo)
from ..reduction import keep_index

__all__ = ["relu", "relu6", "gelu", "gelu_tanh", "silu", "sigmoid", "softplus", "leaky_relu",
           "hard_swish", "hard_sigmoid", "elu", "selu", "softmax", "log_softmax"]


def _f(v, x):
    """The Python float ``v`` as a constant of ``x``'s dtype."""
    return FloatImm(float(v), x.dtype) if dt.is_float(x.dtype) else IntImm(int(v), x.dtype)


# ---------------------------------------------------------------------------------------------
# elementwise activations: name -> (fcompute(x, attrs), dtype class, doc)

def _relu(x, a):
    return Max(x, _f(0, x))


def _relu6(x, a):
    return Min(Max(x, _f(0, x)), _f(6, x))


def _gelu(x, a):
    # 0.5 x (1 + erf(x / sqrt(2)))
    return _f(0.5, x) * x * (_f(1, x) + te.erf(x * _f(1 / math.sqrt(2.0), x)))


def _gelu_tanh(x, a):
    # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    inner = _f(math.sqrt(2.0 / math.pi), x) * (x + _f(0.044715, x) * x * x * x)
    return _f(0.5, x) * x * (_f(1, x) + te.tanh(inner))


def _silu(x, a):
    return x * te.sigmoid(x)


def _softplus(x, a):
    # log(1 + exp(beta x)) / beta, linear above the threshold (as torch) so exp cannot overflow
    beta, threshold = a["beta"], a["threshold"]
    bx = x * _f(beta, x)
    soft = te.log(_f(1, x) + te.exp(bx)) * _f(1.0 / beta, x)
    return Select(bx > _f(threshold, x), x, soft)


def _leaky_relu(x, a):
    return Select(x > _f(0, x), x, x * _f(a["alpha"], x))


def _hard_sigmoid(x, a):
    # max(0, min(1, alpha x + beta)) (ONNX; torch's is alpha = 1/6, beta = 0.5)
    v = x * _f(a["alpha"], x) + _f(a["beta"], x)
    return Min(Max(v, _f(0, x)), _f(1, x))


def _hard_swish(x, a):
    # x relu6(x + 3) / 6
    r6 = Min(Max(x + _f(3, x), _f(0, x)), _f(6, x))
    return x * r6 * _f(1.0 / 6.0, x)


def _elu(x, a):
    return Select(x > _f(0, x), x, _f(a["alpha"], x) * (te.exp(x) - _f(1, x)))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _selu(x, a):
    neg = _f(_SELU_ALPHA, x) * (te.exp(x) - _f(1, x))
    return _f(_SELU_SCALE, x) * Select(x > _f(0, x), x, neg)


_ACTS = {
    "relu": (_relu, DTYPE_NUMERIC, "max(x, 0)"),
    "relu6": (_relu6, DTYPE_NUMERIC, "min(max(x, 0), 6)"),
    "gelu": (_gelu, DTYPE_FLOAT, "0.5 x (1 + erf(x / sqrt(2)))"),
    "gelu_tanh": (_gelu_tanh, DTYPE_FLOAT, "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"),
    "silu": (_silu, DTYPE_FLOAT, "x sigmoid(x)"),
    "softplus": (_softplus, DTYPE_FLOAT, "log(1 + exp(beta x)) / beta, x above threshold"),
    "leaky_relu": (_leaky_relu, DTYPE_FLOAT, "x if x > 0 else alpha x"),
    "hard_sigmoid": (_hard_sigmoid, DTYPE_FLOAT, "max(0, min(1, alpha x + beta))"),
    "hard_swish": (_hard_swish, DTYPE_FLOAT, "x relu6(x + 3) / 6"),
    "elu": (_elu, DTYPE_FLOAT, "x if x > 0 else alpha (exp(x) - 1)"),
    "selu": (_selu, DTYPE_FLOAT, "scale elu(x, alpha) with the SELU constants"),
}


def _make_act_infer(op_name, cls):
    def infer(call: Call):
        check_nargs(op_name, call, 1)
        si = tensor_sinfo(op_name, call, 0, "the input")
        check_dtype_class(op_name, cls, si.dtype, call)
        return TensorStructInfo(si.shape, si.dtype, si.ndim)
    return infer


def _make_act_legalize(op_name, fcompute):
    short = op_name.rsplit(".", 1)[-1]

    def legalize(bb, call: Call):
        attrs = call.attr_dict

        def te_func(x):
            return te.compute(x.shape, lambda *i: fcompute(x[i], attrs), out_name("T_" + short, x))
        return bb.call_te(te_func, call.args[0], primfunc_name_hint=short)
    return legalize


for _name, (_fc, _cls, _doc) in _ACTS.items():
    register_op("relax.nn." + _name, _make_act_infer("relax.nn." + _name, _cls),
                _make_act_legalize("relax.nn." + _name, _fc), OpPattern.ELEMWISE, _doc)


def _act(name, x, **attrs):
    op_name = "relax.nn." + name
    return make_call(op_name, [as_expr(x, op_name)], attrs or None)


def _number(op_name, what, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        try:
            import numpy as np
            if isinstance(v, np.generic):
                return float(v)
        except ImportError:  # pragma: no cover
            pass
        raise RelaxError(f"{op_name}: {what} must be a number, got {v!r}")
    return float(v)


def relu(x: Expr) -> Call:
    """``max(x, 0)``.

    Examples
    --------
    >>> relu(x).struct_info   # doctest: +SKIP
    Tensor((n, 10), 'float32')
    """
    return _act("relu", x)


def relu6(x: Expr) -> Call:
    """``min(max(x, 0), 6)``."""
    return _act("relu6", x)


def gelu(x: Expr) -> Call:
    """GELU, exact (erf) form: ``0.5 x (1 + erf(x / sqrt(2)))``."""
    return _act("gelu", x)


def gelu_tanh(x: Expr) -> Call:
    """GELU, tanh approximation: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    return _act("gelu_tanh", x)


def silu(x: Expr) -> Call:
    """SiLU / swish: ``x sigmoid(x)``."""
    return _act("silu", x)


def sigmoid(x: Expr) -> Call:
    """``1 / (1 + exp(-x))``: the same operator as ``relax.op.sigmoid``."""
    return _sigmoid(x)


def softplus(x: Expr, beta: float = 1.0, threshold: float = 20.0) -> Call:
    """``log(1 + exp(beta x)) / beta``, and ``x`` where ``beta x > threshold`` (as torch)."""
    b = _number("relax.nn.softplus", "beta", beta)
    if b == 0:
        raise RelaxError("relax.nn.softplus: beta must be nonzero")
    return _act("softplus", x, beta=b, threshold=_number("relax.nn.softplus", "threshold",
                                                         threshold))


def leaky_relu(x: Expr, alpha: float = 0.01) -> Call:
    """``x if x > 0 else alpha x``."""
    return _act("leaky_relu", x, alpha=_number("relax.nn.leaky_relu", "alpha", alpha))


def hard_sigmoid(x: Expr, alpha: float = 1.0 / 6.0, beta: float = 0.5) -> Call:
    """``max(0, min(1, alpha x + beta))``; the defaults are torch's (ONNX uses alpha=0.2)."""
    return _act("hard_sigmoid", x, alpha=_number("relax.nn.hard_sigmoid", "alpha", alpha),
                beta=_number("relax.nn.hard_sigmoid", "beta", beta))


def hard_swish(x: Expr) -> Call:
    """``x relu6(x + 3) / 6``."""
    return _act("hard_swish", x)


def elu(x: Expr, alpha: float = 1.0) -> Call:
    """``x if x > 0 else alpha (exp(x) - 1)``."""
    return _act("elu", x, alpha=_number("relax.nn.elu", "alpha", alpha))


def selu(x: Expr) -> Call:
    """``scale (x if x > 0 else alpha (exp(x) - 1))`` with the self-normalizing constants."""
    return _act("selu", x)


# ---------------------------------------------------------------------------------------------
# softmax / log_softmax

def _make_softmax_infer(op_name):
    def infer(call: Call):
        check_nargs(op_name, call, 1)
        si = tensor_sinfo(op_name, call, 0, "the input")
        check_dtype_class(op_name, DTYPE_FLOAT, si.dtype, call)
        axis = call.attr_dict.get("axis", -1)
        if si.ndim >= 0:
            if si.ndim == 0:
                raise RelaxError(f"{op_name}: the input must have at least one dimension")
            normalize_axis(op_name, axis, si.ndim)
        return TensorStructInfo(si.shape, si.dtype, si.ndim)
    return infer


def te_softmax(x, axis: int, log: bool = False):
    """te: softmax (or log_softmax) of ``x`` along ``axis``, max-subtracted, accumulating
    float16 in float32."""
    ax = normalize_axis("relax.nn.log_softmax" if log else "relax.nn.softmax", axis, x.ndim)
    acc = float_acc_dtype(x.dtype)
    short = "log_softmax" if log else "softmax"
    k1 = te.reduce_axis((0, x.shape[ax]), "k")
    keep = [IntImm(1, "int64") if d == ax else s for d, s in enumerate(x.shape)]

    def at(i, k):
        return tuple(k if d == ax else v for d, v in enumerate(i))

    mx = te.compute(keep, lambda *i: te.max(x[at(i, k1.var)].astype(acc), axis=k1),
                    out_name("T_" + short + "_max", x))
    if log:
        k2 = te.reduce_axis((0, x.shape[ax]), "k")
        s = te.compute(keep, lambda *i: te.sum(te.exp(x[at(i, k2.var)].astype(acc) - mx[i]),
                                               axis=k2), out_name("T_" + short + "_sum", x))
        return te.compute(
            x.shape,
            lambda *i: (x[i].astype(acc) - mx[keep_index(i, [ax])]
                        - te.log(s[keep_index(i, [ax])])).astype(x.dtype),
            out_name("T_" + short, x))
    e = te.compute(x.shape, lambda *i: te.exp(x[i].astype(acc) - mx[keep_index(i, [ax])]),
                   out_name("T_" + short + "_exp", x))
    k2 = te.reduce_axis((0, x.shape[ax]), "k")
    s = te.compute(keep, lambda *i: te.sum(e[at(i, k2.var)], axis=k2),
                   out_name("T_" + short + "_sum", x))
    return te.compute(x.shape, lambda *i: (e[i] / s[keep_index(i, [ax])]).astype(x.dtype),
                      out_name("T_" + short, x))


def _make_softmax_legalize(log):
    def legalize(bb, call: Call):
        return bb.call_te(te_softmax, call.args[0], call.attr_dict.get("axis", -1), log,
                          primfunc_name_hint="log_softmax" if log else "softmax")
    return legalize


register_op("relax.nn.softmax", _make_softmax_infer("relax.nn.softmax"),
            _make_softmax_legalize(False), OpPattern.COMM_REDUCE,
            "exp(x - max) / sum(exp(x - max)) along an axis")
register_op("relax.nn.log_softmax", _make_softmax_infer("relax.nn.log_softmax"),
            _make_softmax_legalize(True), OpPattern.COMM_REDUCE,
            "x - max - log(sum(exp(x - max))) along an axis")


def _axis_attr(op_name, axis):
    if isinstance(axis, bool) or not isinstance(axis, int):
        try:
            import numpy as np
            if isinstance(axis, np.integer):
                return int(axis)
        except ImportError:  # pragma: no cover
            pass
        raise RelaxError(f"{op_name}: axis must be an int, got {axis!r}")
    return axis


def softmax(x: Expr, axis: int = -1) -> Call:
    """Softmax along ``axis`` (numerically stable: the maximum is subtracted first).

    Examples
    --------
    >>> softmax(x, axis=1).struct_info   # doctest: +SKIP
    Tensor((n, 10), 'float32')
    """
    return make_call("relax.nn.softmax", [as_expr(x, "relax.nn.softmax")],
                     {"axis": _axis_attr("relax.nn.softmax", axis)})


def log_softmax(x: Expr, axis: int = -1) -> Call:
    """``log(softmax(x))`` along ``axis``, computed as ``x - max - log(sum(exp(x - max)))``."""
    return make_call("relax.nn.log_softmax", [as_expr(x, "relax.nn.log_softmax")],
                     {"axis": _axis_attr("relax.nn.log_softmax", axis)})
