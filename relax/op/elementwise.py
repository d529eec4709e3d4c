"""Elementwise and broadcasting operators: arithmetic, math functions, comparisons, logic,
``where``, ``clip`` and ``astype``.

Binary operators broadcast as numpy does, with symbolic dims (see ``relax.op.helpers``: a
constant 1 broadcasts; two dims that cannot be proven equal are assumed equal and checked by the
kernel at run time). Both operands must have the same dtype (a Python scalar operand takes the
tensor's dtype). Results have the operands' dtype, except comparisons (``bool``).

Semantics for integers (as TVM's TOPI, which is C's, not numpy's):

* ``divide``: true division for floats; *truncating* division for integers (``-7 / 2 = -3``).
  Use ``floor_divide`` for numpy's ``//``.
* ``mod``: truncating remainder (sign of the dividend, numpy ``fmod``); ``floor_mod``: the
  remainder of ``floor_divide`` (sign of the divisor, numpy ``%``). Both work for floats too.
* ``power`` of integers is computed in float64 and rounded.
* ``floor`` / ``ceil`` / ``round`` / ``trunc`` of integers are the identity; ``round`` rounds
  half to even, as numpy.

Fusion pattern kinds follow TVM: unary operators, ``clip`` and ``astype`` are ``ELEMWISE``;
binary operators, comparisons and ``where`` are ``BROADCAST``.

Examples
--------
>>> import numpy as np
>>> from tilecraft.relax import Var, TensorStructInfo, op
>>> x = Var("x", TensorStructInfo(("n", 1), "float32"))
>>> y = Var("y", TensorStructInfo((1, 4), "float32"))
>>> op.add(x, y).struct_info
Tensor((n, 4), 'float32')
"""
from __future__ import annotations

import math

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import (Cast, FloatImm, FloorDiv, FloorMod, IntImm, Max, Min, Mod, Not,
                           PrimExpr, Select, Div, call as tir_call)

from ..expr import Call, Constant, Expr, RelaxError, const
from ..struct_info import TensorStructInfo
from .base import OpPattern, as_expr, call as make_call, register_op
from .helpers import (DTYPE_ANY, DTYPE_BOOL, DTYPE_FLOAT, DTYPE_NUMERIC, broadcast_assumptions,
                      broadcast_index, broadcast_shapes, broadcast_sinfo, call_te,
                      check_dtype_class, check_nargs, check_same_dtype, dim_checks, out_name,
                      tensor_sinfo)

__all__ = [
    # binary arithmetic
    "add", "subtract", "multiply", "divide", "floor_divide", "mod", "floor_mod", "power",
    "maximum", "minimum",
    # unary
    "negative", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf",
    "floor", "ceil", "round", "trunc", "sign", "square",
    # logic and comparison
    "logical_and", "logical_or", "logical_xor", "logical_not",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
    # others
    "where", "clip", "astype", "cast",
]

def _short(op_name: str) -> str:
    return op_name.rsplit(".", 1)[-1]


# ---------------------------------------------------------------------------------------------
# argument conversion

def _is_py_scalar(x) -> bool:
    import numpy as np
    return isinstance(x, (bool, int, float, np.generic))


def _scalar_like(op_name: str, value, other: Expr) -> Constant:
    """A 0-d constant of ``other``'s dtype holding the Python scalar ``value``."""
    import numpy as np
    if isinstance(value, np.generic):
        value = value.item()
    si = other.struct_info
    if not isinstance(si, TensorStructInfo):
        return const(value)
    d = si.dtype
    if isinstance(value, float) and not float(value).is_integer() and not dt.is_float(d):
        raise RelaxError(f"{op_name}: cannot combine the Python float {value} with a {d} tensor; "
                         f"cast the tensor with relax.op.astype first")
    if isinstance(value, bool) or dt.is_bool(d):
        return const(bool(value), d)
    return const(value, d)


def _binary_args(op_name: str, x, y) -> tuple[Expr, Expr]:
    if isinstance(x, Expr) and _is_py_scalar(y):
        return x, _scalar_like(op_name, y, x)
    if isinstance(y, Expr) and _is_py_scalar(x):
        return _scalar_like(op_name, x, y), y
    return as_expr(x, op_name), as_expr(y, op_name)


# ---------------------------------------------------------------------------------------------
# unary operators

def _make_unary_infer(op_name: str, cls: str, out_dtype=None):
    def infer(call: Call):
        check_nargs(op_name, call, 1)
        si = tensor_sinfo(op_name, call, 0, "the input")
        check_dtype_class(op_name, cls, si.dtype, call)
        d = si.dtype if out_dtype is None else out_dtype
        return TensorStructInfo(si.shape, d, si.ndim)
    return infer


def _make_unary_legalize(op_name: str, fcompute):
    short = _short(op_name)

    def te_func(a):
        return te.compute(a.shape, lambda *i: fcompute(a[i]), out_name("T_" + short, a))

    def legalize(bb, call: Call):
        return bb.call_te(te_func, call.args[0], primfunc_name_hint=short)
    return legalize


def _register_unary(op_name: str, fcompute, cls: str, doc: str):
    register_op(op_name, _make_unary_infer(op_name, cls), _make_unary_legalize(op_name, fcompute),
                OpPattern.ELEMWISE, doc)


def _unary_call(op_name: str, x) -> Call:
    return make_call(op_name, [as_expr(x, op_name)])


def _neg(x: PrimExpr) -> PrimExpr:
    return -x


def _int_identity(ffloat):
    def f(x: PrimExpr) -> PrimExpr:
        return ffloat(x) if dt.is_float(x.dtype) else x
    return f


def _sign(x: PrimExpr) -> PrimExpr:
    one = FloatImm(1.0, x.dtype) if dt.is_float(x.dtype) else IntImm(1, x.dtype)
    zero = FloatImm(0.0, x.dtype) if dt.is_float(x.dtype) else IntImm(0, x.dtype)
    if dt.is_uint(x.dtype):
        return Select(x > zero, one, zero)
    out = Select(x > zero, one, Select(x < zero, -one, zero))
    if dt.is_float(x.dtype):
        out = Select(x != x, x, out)  # NaN stays NaN, as in numpy
    return out


_UNARY = {
    # name: (te function, dtype class, doc)
    "negative": (_neg, DTYPE_NUMERIC, "-x"),
    "abs": (te.abs, DTYPE_NUMERIC, "|x|"),
    "exp": (te.exp, DTYPE_FLOAT, "e**x"),
    "log": (te.log, DTYPE_FLOAT, "natural logarithm"),
    "sqrt": (te.sqrt, DTYPE_FLOAT, "square root"),
    "rsqrt": (te.rsqrt, DTYPE_FLOAT, "1 / sqrt(x)"),
    "sin": (te.sin, DTYPE_FLOAT, "sine"),
    "cos": (te.cos, DTYPE_FLOAT, "cosine"),
    "tanh": (te.tanh, DTYPE_FLOAT, "hyperbolic tangent"),
    "sigmoid": (te.sigmoid, DTYPE_FLOAT, "1 / (1 + exp(-x))"),
    "erf": (te.erf, DTYPE_FLOAT, "the error function"),
    "floor": (_int_identity(te.floor), DTYPE_NUMERIC, "round down (identity for integers)"),
    "ceil": (_int_identity(te.ceil), DTYPE_NUMERIC, "round up (identity for integers)"),
    "round": (_int_identity(te.round), DTYPE_NUMERIC,
              "round to the nearest integer, half to even (identity for integers)"),
    "trunc": (_int_identity(lambda x: tir_call("trunc", x)), DTYPE_NUMERIC,
              "round towards zero (identity for integers)"),
    "sign": (_sign, DTYPE_NUMERIC, "-1, 0 or 1 (NaN stays NaN)"),
    "square": (lambda x: x * x, DTYPE_NUMERIC, "x * x"),
    "logical_not": (Not, DTYPE_BOOL, "not x (bool tensors)"),
}

for _name, (_f, _cls, _doc) in _UNARY.items():
    _register_unary("relax." + _name, _f, _cls, _doc)


def negative(x: Expr) -> Call:
    """Elementwise ``-x``.

    Examples
    --------
    >>> negative(x)   # doctest: +SKIP
    """
    return _unary_call("relax.negative", x)


def abs(x: Expr) -> Call:
    """Elementwise absolute value (integers too)."""
    return _unary_call("relax.abs", x)


def exp(x: Expr) -> Call:
    """Elementwise ``e**x`` of a float tensor.

    Examples
    --------
    >>> exp(x).struct_info   # doctest: +SKIP
    Tensor((n, 4), 'float32')
    """
    return _unary_call("relax.exp", x)


def log(x: Expr) -> Call:
    """Elementwise natural logarithm of a float tensor."""
    return _unary_call("relax.log", x)


def sqrt(x: Expr) -> Call:
    """Elementwise square root of a float tensor."""
    return _unary_call("relax.sqrt", x)


def rsqrt(x: Expr) -> Call:
    """Elementwise ``1 / sqrt(x)`` of a float tensor."""
    return _unary_call("relax.rsqrt", x)


def sin(x: Expr) -> Call:
    """Elementwise sine of a float tensor."""
    return _unary_call("relax.sin", x)


def cos(x: Expr) -> Call:
    """Elementwise cosine of a float tensor."""
    return _unary_call("relax.cos", x)


def tanh(x: Expr) -> Call:
    """Elementwise hyperbolic tangent of a float tensor."""
    return _unary_call("relax.tanh", x)


def sigmoid(x: Expr) -> Call:
    """Elementwise ``1 / (1 + exp(-x))`` of a float tensor."""
    return _unary_call("relax.sigmoid", x)


def erf(x: Expr) -> Call:
    """Elementwise error function of a float tensor."""
    return _unary_call("relax.erf", x)


def floor(x: Expr) -> Call:
    """Elementwise round down (the identity for integer tensors)."""
    return _unary_call("relax.floor", x)


def ceil(x: Expr) -> Call:
    """Elementwise round up (the identity for integer tensors)."""
    return _unary_call("relax.ceil", x)


def round(x: Expr) -> Call:
    """Elementwise round to nearest, half to even as numpy (the identity for integers)."""
    return _unary_call("relax.round", x)


def trunc(x: Expr) -> Call:
    """Elementwise round towards zero (the identity for integers)."""
    return _unary_call("relax.trunc", x)


def sign(x: Expr) -> Call:
    """Elementwise sign: -1, 0 or 1 in the input dtype (NaN stays NaN)."""
    return _unary_call("relax.sign", x)


def square(x: Expr) -> Call:
    """Elementwise ``x * x``."""
    return _unary_call("relax.square", x)


def logical_not(x: Expr) -> Call:
    """Elementwise ``not x`` of a bool tensor."""
    return _unary_call("relax.logical_not", x)


# ---------------------------------------------------------------------------------------------
# binary operators

def _make_binary_infer(op_name: str, cls: str, result_bool: bool):
    def infer(call: Call):
        check_nargs(op_name, call, 2)
        a = tensor_sinfo(op_name, call, 0, "the first operand")
        b = tensor_sinfo(op_name, call, 1, "the second operand")
        d = check_same_dtype(op_name, [a, b], ["the first operand", "the second operand"], call)
        check_dtype_class(op_name, cls, d, call)
        return broadcast_sinfo(op_name, [a, b], "bool" if result_bool else d, call)
    return infer


def _make_broadcast_legalize(op_name: str, fcompute):
    """Legalization of an n-ary broadcasting op: ``fcompute(*loaded elements) -> PrimExpr``."""
    short = _short(op_name)

    def te_func(*ts):
        shape = broadcast_shapes(op_name, *[t.shape for t in ts])
        return te.compute(shape, lambda *i: fcompute(*[t[broadcast_index(i, t.shape, shape)]
                                                       for t in ts]),
                          out_name("T_" + short, *ts))

    def legalize(bb, call: Call):
        checks = broadcast_assumptions(op_name, *[a.struct_info.shape for a in call.args])
        return call_te(bb, te_func, *call.args, checks=dim_checks(op_name, checks),
                       primfunc_name_hint=short)
    return legalize


def _register_binary(op_name: str, fcompute, cls: str, doc: str, result_bool: bool = False):
    register_op(op_name, _make_binary_infer(op_name, cls, result_bool),
                _make_broadcast_legalize(op_name, fcompute), OpPattern.BROADCAST, doc)


def _power(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    if dt.is_float(a.dtype):
        return te.pow(a, b)
    r = te.pow(Cast("float64", a), Cast("float64", b))
    return Cast(a.dtype, te.round(r))


def _logical_xor(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    return a != b


_BINARY = {
    # name: (te function, dtype class, doc, bool result)
    "add": (lambda a, b: a + b, DTYPE_NUMERIC, "a + b", False),
    "subtract": (lambda a, b: a - b, DTYPE_NUMERIC, "a - b", False),
    "multiply": (lambda a, b: a * b, DTYPE_NUMERIC, "a * b", False),
    "divide": (Div, DTYPE_NUMERIC, "a / b (truncating for integers)", False),
    "floor_divide": (FloorDiv, DTYPE_NUMERIC, "floor(a / b)", False),
    "mod": (Mod, DTYPE_NUMERIC, "truncating remainder (numpy fmod)", False),
    "floor_mod": (FloorMod, DTYPE_NUMERIC, "remainder of floor_divide (numpy %)", False),
    "power": (_power, DTYPE_NUMERIC, "a ** b", False),
    "maximum": (Max, DTYPE_NUMERIC, "max(a, b) (NaN propagates)", False),
    "minimum": (Min, DTYPE_NUMERIC, "min(a, b) (NaN propagates)", False),
    "logical_and": (lambda a, b: a & b, DTYPE_BOOL, "a and b", False),
    "logical_or": (lambda a, b: a | b, DTYPE_BOOL, "a or b", False),
    "logical_xor": (_logical_xor, DTYPE_BOOL, "a xor b", False),
    "equal": (lambda a, b: a == b, DTYPE_ANY, "a == b", True),
    "not_equal": (lambda a, b: a != b, DTYPE_ANY, "a != b", True),
    "less": (lambda a, b: a < b, DTYPE_NUMERIC, "a < b", True),
    "less_equal": (lambda a, b: a <= b, DTYPE_NUMERIC, "a <= b", True),
    "greater": (lambda a, b: a > b, DTYPE_NUMERIC, "a > b", True),
    "greater_equal": (lambda a, b: a >= b, DTYPE_NUMERIC, "a >= b", True),
}

for _name, (_f, _cls, _doc, _rb) in _BINARY.items():
    _register_binary("relax." + _name, _f, _cls, _doc, _rb)


def _small_integer_exponent(call: Call) -> int | None:
    """The exponent of ``power(x, c)`` when ``c`` is a one-element float constant holding 2 or
    3 that adds no dims to ``x``, else None."""
    x, c = call.args
    if not isinstance(c, Constant) or c.data.size != 1 or not dt.is_float(str(c.data.dtype)):
        return None
    si = x.struct_info
    if not isinstance(si, TensorStructInfo) or si.ndim < c.data.ndim or \
            not dt.is_float(si.dtype):
        return None
    v = float(c.data.reshape(-1)[0])
    return int(v) if v in (2.0, 3.0) else None


_legalize_power_generic = _make_broadcast_legalize("relax.power", _power)


def _legalize_power(bb, call: Call):
    """``x ** 2`` and ``x ** 3`` (GPT-2's GELU, variance by hand) as products: ``pow`` is a
    scalar libm call per element, a product a vector multiply (within 2 ulp of ``powf``)."""
    n = _small_integer_exponent(call)
    if n is None:
        return _legalize_power_generic(bb, call)

    def te_func(x):
        def f(*i):
            v = x[i]
            return v * v if n == 2 else v * v * v
        return te.compute(x.shape, f, out_name("T_power", x))
    return call_te(bb, te_func, call.args[0], primfunc_name_hint="power")


register_op("relax.power", _make_binary_infer("relax.power", DTYPE_NUMERIC, False), _legalize_power,
            OpPattern.BROADCAST, "a ** b")


def _scalar_operand(call: Call) -> tuple[int, float | int] | None:
    """``(position of the tensor operand, the value)`` when one operand of the binary ``call``
    is a one-element constant that adds no dims to the other (``maximum(x, 0)``), else None."""
    for k, c in enumerate(call.args):
        other = call.args[1 - k]
        si = other.struct_info
        if isinstance(c, Constant) and c.data.size == 1 and \
                isinstance(si, TensorStructInfo) and si.ndim >= c.data.ndim and \
                str(c.data.dtype) == si.dtype:
            return 1 - k, c.data.reshape(-1)[0].item()
    return None


def _make_scalar_legalize(op_name: str, fcompute):
    """``op_name``'s legalization with a one-element constant operand (``_scalar_operand``)
    as a literal in the kernel, not a buffer it loads: ``max(x, 0)`` and ``min(x, 6)`` of an
    ONNX ``Clip`` (or of ``Max`` / ``Min`` with constants) then compile as ``torch``'s
    ``relu6`` does, one ``vmaxps`` / ``vminps`` each, where a loaded bound of unknown value
    takes a compare and a blend per NaN check (MobileNet-V2's exports through ONNX and
    ``torch.export`` get the same kernels). The other operands take the broadcasting
    legalization."""
    generic = _make_broadcast_legalize(op_name, fcompute)
    short = _short(op_name)

    def legalize(bb, call: Call):
        found = _scalar_operand(call)
        if found is None:
            return generic(bb, call)
        k, value = found

        def te_func(x):
            v = te.const(value, x.dtype)

            def f(*i):
                return fcompute(x[i], v) if k == 0 else fcompute(v, x[i])
            return te.compute(x.shape, f, out_name("T_" + short, x))
        return call_te(bb, te_func, call.args[k], primfunc_name_hint=short)
    return legalize


for _name, _f in (("maximum", Max), ("minimum", Min)):
    register_op("relax." + _name, _make_binary_infer("relax." + _name, DTYPE_NUMERIC, False),
                _make_scalar_legalize("relax." + _name, _f), OpPattern.BROADCAST,
                _BINARY[_name][2])


def _binary_call(op_name: str, x, y) -> Call:
    x, y = _binary_args(op_name, x, y)
    return make_call(op_name, [x, y])


def add(x1, x2) -> Call:
    """``x1 + x2`` with numpy broadcasting (a Python scalar takes the other side's dtype).

    Examples
    --------
    >>> import numpy as np
    >>> from tilecraft.relax import Var, TensorStructInfo, const
    >>> x = Var("x", TensorStructInfo(("n", 1), "float32"))
    >>> add(x, const(np.ones((1, 4), "float32"))).struct_info
    Tensor((n, 4), 'float32')
    """
    return _binary_call("relax.add", x1, x2)


def subtract(x1, x2) -> Call:
    """``x1 - x2`` with broadcasting."""
    return _binary_call("relax.subtract", x1, x2)


def multiply(x1, x2) -> Call:
    """``x1 * x2`` with broadcasting."""
    return _binary_call("relax.multiply", x1, x2)


def divide(x1, x2) -> Call:
    """``x1 / x2`` with broadcasting: true division for floats, truncating division (C, TVM's
    TOPI) for integers; ``floor_divide`` is numpy's ``//``."""
    return _binary_call("relax.divide", x1, x2)


def floor_divide(x1, x2) -> Call:
    """``floor(x1 / x2)`` with broadcasting (numpy ``//``; ints and floats)."""
    return _binary_call("relax.floor_divide", x1, x2)


def mod(x1, x2) -> Call:
    """Truncating remainder with broadcasting: the sign of ``x1`` (numpy ``fmod``)."""
    return _binary_call("relax.mod", x1, x2)


def floor_mod(x1, x2) -> Call:
    """Remainder of ``floor_divide`` with broadcasting: the sign of ``x2`` (numpy ``%``)."""
    return _binary_call("relax.floor_mod", x1, x2)


def power(x1, x2) -> Call:
    """``x1 ** x2`` with broadcasting (integers go through float64 and are rounded)."""
    return _binary_call("relax.power", x1, x2)


def maximum(x1, x2) -> Call:
    """Elementwise maximum with broadcasting (NaN propagates, as numpy)."""
    return _binary_call("relax.maximum", x1, x2)


def minimum(x1, x2) -> Call:
    """Elementwise minimum with broadcasting (NaN propagates, as numpy)."""
    return _binary_call("relax.minimum", x1, x2)


def logical_and(x1, x2) -> Call:
    """``x1 and x2`` of bool tensors, with broadcasting."""
    return _binary_call("relax.logical_and", x1, x2)


def logical_or(x1, x2) -> Call:
    """``x1 or x2`` of bool tensors, with broadcasting."""
    return _binary_call("relax.logical_or", x1, x2)


def logical_xor(x1, x2) -> Call:
    """``x1 xor x2`` of bool tensors, with broadcasting."""
    return _binary_call("relax.logical_xor", x1, x2)


def equal(x1, x2) -> Call:
    """``x1 == x2`` with broadcasting; a bool tensor."""
    return _binary_call("relax.equal", x1, x2)


def not_equal(x1, x2) -> Call:
    """``x1 != x2`` with broadcasting; a bool tensor (True where either is NaN)."""
    return _binary_call("relax.not_equal", x1, x2)


def less(x1, x2) -> Call:
    """``x1 < x2`` with broadcasting; a bool tensor."""
    return _binary_call("relax.less", x1, x2)


def less_equal(x1, x2) -> Call:
    """``x1 <= x2`` with broadcasting; a bool tensor."""
    return _binary_call("relax.less_equal", x1, x2)


def greater(x1, x2) -> Call:
    """``x1 > x2`` with broadcasting; a bool tensor."""
    return _binary_call("relax.greater", x1, x2)


def greater_equal(x1, x2) -> Call:
    """``x1 >= x2`` with broadcasting; a bool tensor."""
    return _binary_call("relax.greater_equal", x1, x2)


# ---------------------------------------------------------------------------------------------
# where

def _infer_where(call: Call):
    op_name = "relax.where"
    check_nargs(op_name, call, 3)
    c = tensor_sinfo(op_name, call, 0, "the condition")
    x = tensor_sinfo(op_name, call, 1, "the first branch")
    y = tensor_sinfo(op_name, call, 2, "the second branch")
    if not dt.is_bool(c.dtype):
        raise RelaxError(f"{op_name}: the condition must be a bool tensor, got {c.dtype}", call)
    d = check_same_dtype(op_name, [x, y], ["the first branch", "the second branch"], call)
    return broadcast_sinfo(op_name, [c, x, y], d, call)


register_op("relax.where", _infer_where,
            _make_broadcast_legalize("relax.where", lambda c, a, b: Select(c, a, b)),
            OpPattern.BROADCAST, "x where condition else y, broadcasting all three")


def where(condition, x1, x2) -> Call:
    """``x1`` where ``condition`` (a bool tensor) holds, else ``x2``; the three broadcast together.

    Examples
    --------
    >>> where(c, x, y).struct_info   # doctest: +SKIP
    Tensor((n, 4), 'float32')
    """
    condition = as_expr(condition, "relax.where")
    if _is_py_scalar(x1) and _is_py_scalar(x2):
        x1, x2 = as_expr(x1, "relax.where"), as_expr(x2, "relax.where")
    else:
        x1, x2 = _binary_args("relax.where", x1, x2)
    return make_call("relax.where", [condition, x1, x2])


# ---------------------------------------------------------------------------------------------
# clip

def _infer_clip(call: Call):
    op_name = "relax.clip"
    check_nargs(op_name, call, 1)
    si = tensor_sinfo(op_name, call, 0, "the input")
    check_dtype_class(op_name, DTYPE_NUMERIC, si.dtype, call)
    return TensorStructInfo(si.shape, si.dtype, si.ndim)


def _bound(value, dtype):
    if value is None:
        return None
    if dt.is_float(dtype):
        return FloatImm(float(value), dtype)
    # an integer tensor clipped to a fractional bound: the bound rounded inwards (same result)
    return IntImm(int(value), dtype)


def _legalize_clip(bb, call: Call):
    attrs = call.attr_dict
    lo_v, hi_v = attrs.get("min"), attrs.get("max")

    def te_func(a):
        lo, hi = _bound(lo_v, a.dtype), _bound(hi_v, a.dtype)

        def f(*i):
            v = a[i]
            if lo is not None:
                v = Max(v, lo)
            if hi is not None:
                v = Min(v, hi)  # numpy: minimum(maximum(x, min), max)
            return v
        return te.compute(a.shape, f, out_name("T_clip", a))
    return bb.call_te(te_func, call.args[0], primfunc_name_hint="clip")


register_op("relax.clip", _infer_clip, _legalize_clip, OpPattern.ELEMWISE,
            "min(max(x, min), max)")


def _clip_bound(name, v, dtype):
    import numpy as np
    if v is None:
        return None
    if isinstance(v, Constant) and v.data.ndim == 0:
        v = v.data.item()
    if isinstance(v, (IntImm, FloatImm)):
        v = v.value
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RelaxError(f"relax.clip: {name} must be a Python number (or None), got {v!r}")
    if dtype is not None and dt.is_integer(dtype) and isinstance(v, float):
        if math.isinf(v):
            return None  # no bound
        v = math.ceil(v) if name == "min" else math.floor(v)
    return v


def clip(x, min=None, max=None) -> Call:
    """Clamp ``x`` to ``[min, max]`` (Python numbers; None leaves that side open), as
    ``numpy.clip``: ``minimum(maximum(x, min), max)``.

    Examples
    --------
    >>> clip(x, 0.0, 6.0)   # doctest: +SKIP
    """
    x = as_expr(x, "relax.clip")
    d = x.struct_info.dtype if isinstance(x.struct_info, TensorStructInfo) else None
    attrs = {"min": _clip_bound("min", min, d), "max": _clip_bound("max", max, d)}
    return make_call("relax.clip", [x], attrs)


# ---------------------------------------------------------------------------------------------
# astype

def _infer_astype(call: Call):
    op_name = "relax.astype"
    check_nargs(op_name, call, 1)
    si = tensor_sinfo(op_name, call, 0, "the input")
    return TensorStructInfo(si.shape, call.attr_dict["dtype"], si.ndim)


def _legalize_astype(bb, call: Call):
    d = call.attr_dict["dtype"]

    def te_func(a):
        return te.compute(a.shape, lambda *i: a[i].astype(d), out_name("T_astype", a))
    return bb.call_te(te_func, call.args[0], primfunc_name_hint="astype")


register_op("relax.astype", _infer_astype, _legalize_astype, OpPattern.ELEMWISE,
            "convert the elements to another dtype")


def astype(x, dtype: str) -> Call:
    """Convert the elements of ``x`` to ``dtype`` (float -> int truncates towards zero;
    -> bool is ``x != 0``).

    Examples
    --------
    >>> astype(x, "float16").struct_info   # doctest: +SKIP
    Tensor((n, 4), 'float16')
    """
    try:
        dt.check(dtype)
    except dt.DataTypeError as err:
        raise RelaxError(f"relax.astype: {err}") from None
    if dt.lanes(dtype) != 1:
        raise RelaxError(f"relax.astype: tensor elements must be scalars, got {dtype}")
    return make_call("relax.astype", [as_expr(x, "relax.astype")], {"dtype": str(dtype)})


cast = astype
