"""Elementwise operators: arithmetic, comparisons, logic, math functions, activations, casts.

Broadcasting is numpy's from opset 7 on (the ``broadcast`` attribute of older versions is gone).
Operations the Relax operator set has no operator for (inverse trigonometric and hyperbolic
functions, ``IsNaN``, bitwise operators) become small elementwise kernels (``emit_map``).
"""
from __future__ import annotations

import math

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import (Cast, FloatImm, FloorDiv, FloorMod, IntImm, Select,
                                     call as tir_call)

from .... import op as _op
from .. import lowbit
from ..emit import emit_map
from ..lowbit import format_of
from ..registry import ConversionError, ONNX_DTYPES, converter, onnx_dtype_name
from ..values import Value
from .common import cast, scalar

# ---------------------------------------------------------------------------------------------
# arithmetic


def _binary(relax_fn):
    def convert(ctx, node):
        a, b = ctx.input(node, 0), ctx.input(node, 1)
        return relax_fn(a, b)
    return convert


converter("Add", family="elementwise", doc="a + b")(_binary(_op.add))
converter("Sub", family="elementwise", doc="a - b")(_binary(_op.subtract))
converter("Mul", family="elementwise", doc="a * b")(_binary(_op.multiply))
converter("Div", family="elementwise",
          doc="a / b (truncating for integers)")(_binary(_op.divide))


@converter("Mod", family="elementwise")
def _mod(ctx, node):
    """Remainder: ``fmod=0`` takes the divisor's sign (integers), ``fmod=1`` the dividend's."""
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    if node.attr("fmod", 0):
        return _op.mod(a, b)
    if dt.is_float(ctx.dtype(a)) and node.version < 28:
        raise ConversionError(f"Mod with fmod=0 needs integer inputs before version 28 "
                              f"(version {node.version}; floats need fmod=1)")
    return _op.floor_mod(a, b)


@converter("Pow", family="elementwise")
def _pow(ctx, node):
    """x ** y; the result has x's dtype (integer bases with float exponents go through float64)."""
    x, y = ctx.input(node, 0), ctx.input(node, 1)
    xd, yd = ctx.dtype(x), ctx.dtype(y)
    if xd == yd:
        return _op.power(x, y)
    if dt.is_float(xd) and not dt.is_float(yd):
        return _op.power(x, cast(ctx, y, xd))
    wide = "float64"
    r = ctx.emit(_op.power(cast(ctx, x, wide), cast(ctx, y, wide)))
    return _op.astype(r, xd)


@converter("Neg", family="elementwise", doc="-x")
def _neg(ctx, node):
    return _op.negative(ctx.input(node, 0))


@converter("Abs", family="elementwise", doc="|x|")
def _abs(ctx, node):
    return _op.abs(ctx.input(node, 0))


@converter("Reciprocal", family="elementwise", doc="1 / x")
def _reciprocal(ctx, node):
    x = ctx.input(node, 0)
    return _op.divide(scalar(1, ctx.dtype(x)), x)


@converter("Sign", family="elementwise", doc="-1, 0 or 1")
def _sign(ctx, node):
    return _op.sign(ctx.input(node, 0))


def _variadic(relax_fn, mean: bool = False):
    def convert(ctx, node):
        xs = [x for x in ctx.inputs(node) if x is not None]
        acc = xs[0]
        for x in xs[1:]:
            acc = ctx.emit(relax_fn(acc, x))
        if mean:
            acc = _op.divide(acc, scalar(len(xs), ctx.dtype(acc)))
        elif len(xs) == 1:
            acc = _op.add(acc, scalar(0, ctx.dtype(acc))) if ctx.dtype(acc) != "bool" else acc
        return acc
    return convert


converter("Max", family="elementwise", doc="elementwise maximum of the inputs")(
    _variadic(_op.maximum))
converter("Min", family="elementwise", doc="elementwise minimum of the inputs")(
    _variadic(_op.minimum))
converter("Sum", family="elementwise", doc="elementwise sum of the inputs")(_variadic(_op.add))
converter("Mean", family="elementwise", doc="elementwise mean of the inputs")(
    _variadic(_op.add, mean=True))


# ---------------------------------------------------------------------------------------------
# comparisons and logic

converter("Equal", family="elementwise", doc="a == b")(_binary(_op.equal))
converter("Less", family="elementwise", doc="a < b")(_binary(_op.less))
converter("LessOrEqual", family="elementwise", doc="a <= b")(_binary(_op.less_equal))
converter("Greater", family="elementwise", doc="a > b")(_binary(_op.greater))
converter("GreaterOrEqual", family="elementwise", doc="a >= b")(_binary(_op.greater_equal))
converter("And", family="elementwise", doc="a and b")(_binary(_op.logical_and))
converter("Or", family="elementwise", doc="a or b")(_binary(_op.logical_or))
converter("Xor", family="elementwise", doc="a xor b")(_binary(_op.logical_xor))


@converter("Not", family="elementwise", doc="not x")
def _not(ctx, node):
    return _op.logical_not(ctx.input(node, 0))


@converter("Where", family="elementwise", doc="x where condition else y")
def _where(ctx, node):
    c, x, y = ctx.inputs(node)[:3]
    return _op.where(c, x, y)


@converter("IsNaN", family="elementwise", doc="x != x")
def _isnan(ctx, node):
    x = ctx.input(node, 0)
    return _op.not_equal(x, x)


@converter("IsInf", family="elementwise")
def _isinf(ctx, node):
    """|x| == inf (``detect_positive`` / ``detect_negative`` choose the signs)."""
    x = ctx.input(node, 0)
    d = ctx.dtype(x)
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    if not dt.is_float(d):
        return _op.zeros(ctx.shape(x), "bool")
    if pos and neg:
        return _op.equal(ctx.emit(_op.abs(x)), scalar(np.inf, d))
    if pos:
        return _op.equal(x, scalar(np.inf, d))
    if neg:
        return _op.equal(x, scalar(-np.inf, d))
    return _op.zeros(ctx.shape(x), "bool")


# ---------------------------------------------------------------------------------------------
# math


def _unary(relax_fn):
    def convert(ctx, node):
        return relax_fn(ctx.input(node, 0))
    return convert


for _name, _fn, _doc in [("Exp", _op.exp, "e ** x"), ("Log", _op.log, "natural logarithm"),
                         ("Sqrt", _op.sqrt, "square root"), ("Sin", _op.sin, "sine"),
                         ("Cos", _op.cos, "cosine"), ("Tanh", _op.tanh, "hyperbolic tangent"),
                         ("Sigmoid", _op.sigmoid, "1 / (1 + e ** -x)"),
                         ("Erf", _op.erf, "the error function"),
                         ("Floor", _op.floor, "round down"), ("Ceil", _op.ceil, "round up"),
                         ("Round", _op.round, "round half to even")]:
    converter(_name, family="elementwise", doc=_doc)(_unary(_fn))


def _atan(x):
    """arctan of a float expression: Cephes' atanf reduction and polynomial (~1e-7 relative)."""
    d = x.dtype
    c = lambda v: FloatImm(v, d)  # noqa: E731
    ax = te.abs(x)
    big = ax > c(2.414213562373095)
    mid = ax > c(0.4142135623730950)
    # atan(|x|) = pi/2 + atan(-1/|x|) (big), pi/4 + atan((|x|-1)/(|x|+1)) (mid), atan(|x|)
    safe = Select(ax == c(0.0), c(1.0), ax)
    t = Select(big, c(-1.0) / safe, Select(mid, (ax - c(1.0)) / (ax + c(1.0)), ax))
    base = Select(big, c(math.pi / 2), Select(mid, c(math.pi / 4), c(0.0)))
    z = t * t
    p = ((((c(8.05374449538e-2) * z - c(1.38776856032e-1)) * z + c(1.99777106478e-1)) * z
          - c(3.33329491539e-1)) * z * t + t)
    r = base + p
    r = Select(ax == c(float("inf")), c(math.pi / 2), r)
    return Select(x < c(0.0), -r, Select(x != x, x, r))


def _math_kernel(fcompute, name):
    def convert(ctx, node):
        x = ctx.input(node, 0)
        if not dt.is_float(ctx.dtype(x)):
            raise ConversionError(f"{node.op_type} needs a float input, got {ctx.dtype(x)}")
        d = ctx.dtype(x)
        wide = "float32" if d == "float16" else d

        def f(v):
            w = Cast(wide, v) if wide != d else v
            r = fcompute(w)
            return Cast(d, r) if wide != d else r
        return emit_map(ctx, f, x, name=name)
    return convert


def _c(v, like):
    return FloatImm(v, like.dtype)


_MATH = {
    "Tan": (lambda x: te.sin(x) / te.cos(x), "tangent"),
    "Atan": (_atan, "arctangent"),
    "Asin": (lambda x: Select(te.abs(x) > _c(1.0, x), _c(float("nan"), x),
                              _atan(x / te.sqrt((_c(1.0, x) - x) * (_c(1.0, x) + x)))),
             "arcsine"),
    "Acos": (lambda x: Select(te.abs(x) > _c(1.0, x), _c(float("nan"), x),
                              _c(2.0, x) * _atan(te.sqrt((_c(1.0, x) - x) /
                                                         (_c(1.0, x) + x)))), "arccosine"),
    "Sinh": (lambda x: (te.exp(x) - te.exp(-x)) * _c(0.5, x), "hyperbolic sine"),
    "Cosh": (lambda x: (te.exp(x) + te.exp(-x)) * _c(0.5, x), "hyperbolic cosine"),
    "Asinh": (lambda x: Select(x < _c(0.0, x),
                               -te.log(te.abs(x) + te.sqrt(x * x + _c(1.0, x))),
                               te.log(x + te.sqrt(x * x + _c(1.0, x)))), "inverse hyperbolic sine"),
    "Acosh": (lambda x: te.log(x + te.sqrt(x * x - _c(1.0, x))), "inverse hyperbolic cosine"),
    "Atanh": (lambda x: _c(0.5, x) * te.log((_c(1.0, x) + x) / (_c(1.0, x) - x)),
              "inverse hyperbolic tangent"),
}
for _name, (_f, _doc) in _MATH.items():
    converter(_name, family="elementwise", doc=_doc)(_math_kernel(_f, _name.lower()))


# ---------------------------------------------------------------------------------------------
# bitwise operators (integers), computed bit by bit with integer arithmetic


def _bits_of(dtype):
    return dt.bits(dtype)


def _pow2(y, dtype):
    """2 ** y for a non-negative integer expression y (exact through float64's exp2)."""
    return Cast(dtype, tir_call("exp2", Cast("float64", y)))


def _bitwise(combine, name):
    """``combine`` applied to each bit pair (two's complement bits for signed types)."""

    def f(a, b):
        d = a.dtype
        bits = _bits_of(d)
        ua = Cast("uint64", Cast("int64", a)) if dt.is_int(d) else Cast("uint64", a)
        ub = Cast("uint64", Cast("int64", b)) if dt.is_int(d) else Cast("uint64", b)
        two = IntImm(2, "uint64")
        total = IntImm(0, "uint64")
        for k in range(bits):
            w = IntImm(1 << k, "uint64")
            ba = FloorMod(FloorDiv(ua, w), two)
            bb = FloorMod(FloorDiv(ub, w), two)
            total = total + combine(ba, bb) * w
        return Cast(d, total)
    f.__name__ = name
    return f


def te_floordiv(a, b):
    return FloorDiv(a, b)


def te_floormod(a, b):
    return FloorMod(a, b)


def _bitwise_converter(combine, name):
    fcompute = _bitwise(combine, name)

    def convert(ctx, node):
        a, b = ctx.input(node, 0), ctx.input(node, 1)
        if not dt.is_integer(ctx.dtype(a)):
            raise ConversionError(f"{node.op_type} needs integer inputs, got {ctx.dtype(a)}")
        return emit_map(ctx, fcompute, a, b, name=name)
    return convert


def _and_bit(x, y):
    return x * y


def _or_bit(x, y):
    return x + y - x * y


def _xor_bit(x, y):
    return (x + y) - IntImm(2, x.dtype) * x * y


converter("BitwiseAnd", family="elementwise", doc="a & b (integers)")(
    _bitwise_converter(_and_bit, "bitwise_and"))
converter("BitwiseOr", family="elementwise", doc="a | b (integers)")(
    _bitwise_converter(_or_bit, "bitwise_or"))
converter("BitwiseXor", family="elementwise", doc="a ^ b (integers)")(
    _bitwise_converter(_xor_bit, "bitwise_xor"))


@converter("BitwiseNot", family="elementwise", doc="~x (integers)")
def _bitwise_not(ctx, node):
    x = ctx.input(node, 0)
    d = ctx.dtype(x)
    if dt.is_int(d):
        return _op.subtract(_op.negative(x), scalar(1, d))
    if dt.is_uint(d):
        return _op.subtract(scalar(np.iinfo(dt.to_numpy(d)).max, d), x)
    raise ConversionError(f"BitwiseNot needs an integer input, got {d}")


@converter("BitShift", family="elementwise",
           doc="x << y or x >> y (arithmetic right shift for signed integers)")
def _bitshift(ctx, node):
    x, y = ctx.input(node, 0), ctx.input(node, 1)
    d = ctx.dtype(x)
    left = node.attr("direction", "LEFT") == "LEFT"
    bits = dt.bits(d)

    if dt.is_int(d):
        return emit_map(ctx, _signed_shift(left, bits), x, y, name="bitshift")

    def f(a, s):
        s64 = Cast("uint64", s)
        p = _pow2(Select(s64 < IntImm(64, "uint64"), s64, IntImm(0, "uint64")), "uint64")
        wide = Cast("uint64", a)
        r = wide * p if left else te_floordiv(wide, p)
        r = Select(s64 >= IntImm(bits, "uint64"), IntImm(0, "uint64"), r)
        return Cast(d, r if bits == 64 else te_floormod(r, IntImm(1 << bits, "uint64")))
    return emit_map(ctx, f, x, y, name="bitshift")


def _signed_shift(left: bool, bits: int):
    """Shifts of signed integers: arithmetic right shift (floor division by 2 ** s), left shift
    wrapping in two's complement; a shift < 0 or >= the width gives the sign fill (-1 for a
    negative value shifted right, else 0)."""

    def f(a, s):
        d = a.dtype
        s64 = Cast("int64", s)
        ok = (s64 >= IntImm(0, "int64")) & (s64 < IntImm(bits, "int64"))
        sc = Select(ok, s64, IntImm(0, "int64"))
        p = _pow2(Cast("uint64", sc), "uint64")
        wide = Cast("int64", a)
        if left:
            # two's complement wrap: multiply in uint64, keep the low bits
            r = Cast(d, Cast("uint64", wide) * p)
        else:
            r = Cast(d, FloorDiv(wide, Cast("int64", p)))
        fill = Select(wide < IntImm(0, "int64"), IntImm(-1, d), IntImm(0, d)) if not left \
            else IntImm(0, d)
        return Select(ok, r, fill)
    return f


# ---------------------------------------------------------------------------------------------
# activations


@converter("Relu", family="activation", doc="max(x, 0)")
def _relu(ctx, node):
    x = ctx.input(node, 0)
    if not dt.is_float(ctx.dtype(x)):
        return _op.maximum(x, scalar(0, ctx.dtype(x)))
    return _op.nn.relu(x)


@converter("LeakyRelu", family="activation", doc="x if x >= 0 else alpha x")
def _leaky_relu(ctx, node):
    return _op.nn.leaky_relu(ctx.input(node, 0), node.attr("alpha", 0.01))


@converter("PRelu", family="activation", doc="x if x >= 0 else slope x (slope broadcasts)")
def _prelu(ctx, node):
    x, slope = ctx.input(node, 0), ctx.input(node, 1)
    xs, ss = ctx.shape(x), ctx.shape(slope)
    if node.version < 7 or (len(ss) == 1 and len(xs) > 1 and
                            not (isinstance(ss[0], IntImm) and ss[0].value == 1)
                            and not _same(ss[0], xs[-1])):
        # the slope is per channel (axis 1)
        slope = ctx.emit(_op.reshape(slope, (ss[0],) + (1,) * (len(xs) - 2)))
    zero = scalar(0, ctx.dtype(x))
    return _op.where(ctx.emit(_op.less(x, zero)), ctx.emit(_op.multiply(x, slope)), x)


def _same(a, b):
    return isinstance(a, IntImm) and isinstance(b, IntImm) and a.value == b.value


@converter("Elu", family="activation", doc="x if x > 0 else alpha (e ** x - 1)")
def _elu(ctx, node):
    return _op.nn.elu(ctx.input(node, 0), node.attr("alpha", 1.0))


@converter("Selu", family="activation", doc="gamma (x if x > 0 else alpha (e ** x - 1))")
def _selu(ctx, node):
    x = ctx.input(node, 0)
    d = ctx.dtype(x)
    alpha, gamma = node.attr("alpha", 1.67326319217681884765625), \
        node.attr("gamma", 1.05070102214813232421875)
    neg = ctx.emit(_op.multiply(ctx.emit(_op.subtract(ctx.emit(_op.exp(x)), scalar(1, d))),
                                scalar(alpha, d)))
    y = ctx.emit(_op.where(ctx.emit(_op.greater(x, scalar(0, d))), x, neg))
    return _op.multiply(y, scalar(gamma, d))


@converter("Celu", family="activation", doc="max(0, x) + min(0, alpha (e ** (x / alpha) - 1))")
def _celu(ctx, node):
    x = ctx.input(node, 0)
    d = ctx.dtype(x)
    alpha = node.attr("alpha", 1.0)
    e = ctx.emit(_op.exp(ctx.emit(_op.divide(x, scalar(alpha, d)))))
    neg = ctx.emit(_op.multiply(ctx.emit(_op.subtract(e, scalar(1, d))), scalar(alpha, d)))
    return _op.add(ctx.emit(_op.maximum(x, scalar(0, d))),
                   ctx.emit(_op.minimum(neg, scalar(0, d))))


@converter("HardSigmoid", family="activation", doc="max(0, min(1, alpha x + beta))")
def _hard_sigmoid(ctx, node):
    return _op.nn.hard_sigmoid(ctx.input(node, 0), node.attr("alpha", 0.2),
                               node.attr("beta", 0.5))


@converter("HardSwish", family="activation", doc="x max(0, min(1, x / 6 + 1 / 2))")
def _hard_swish(ctx, node):
    return _op.nn.hard_swish(ctx.input(node, 0))


@converter("Softplus", family="activation", doc="log(1 + e ** x)")
def _softplus(ctx, node):
    x = ctx.input(node, 0)
    d = ctx.dtype(x)
    # log(1 + e^x) = max(x, 0) + log(1 + e^-|x|): no overflow for large |x|
    ax = ctx.emit(_op.abs(x))
    t = ctx.emit(_op.log(ctx.emit(_op.add(ctx.emit(_op.exp(ctx.emit(_op.negative(ax)))),
                                          scalar(1, d)))))
    return _op.add(ctx.emit(_op.maximum(x, scalar(0, d))), t)


@converter("Softsign", family="activation", doc="x / (1 + |x|)")
def _softsign(ctx, node):
    x = ctx.input(node, 0)
    return _op.divide(x, ctx.emit(_op.add(ctx.emit(_op.abs(x)), scalar(1, ctx.dtype(x)))))


@converter("Gelu", family="activation", doc="GELU (approximate='none' or 'tanh')")
def _gelu(ctx, node):
    x = ctx.input(node, 0)
    if node.attr("approximate", "none") == "tanh":
        return _op.nn.gelu_tanh(x)
    return _op.nn.gelu(x)


@converter("Mish", family="activation", doc="x tanh(softplus(x))")
def _mish(ctx, node):
    x = ctx.input(node, 0)
    d = ctx.dtype(x)
    ax = ctx.emit(_op.abs(x))
    sp = ctx.emit(_op.add(ctx.emit(_op.maximum(x, scalar(0, d))),
                          ctx.emit(_op.log(ctx.emit(_op.add(
                              ctx.emit(_op.exp(ctx.emit(_op.negative(ax)))), scalar(1, d)))))))
    return _op.multiply(x, ctx.emit(_op.tanh(sp)))


@converter("Swish", family="activation", doc="x sigmoid(alpha x)")
def _swish(ctx, node):
    x = ctx.input(node, 0)
    alpha = node.attr("alpha", 1.0)
    if alpha == 1.0:
        return _op.nn.silu(x)
    return _op.multiply(x, ctx.emit(_op.sigmoid(ctx.emit(_op.multiply(
        x, scalar(alpha, ctx.dtype(x)))))))


@converter("ThresholdedRelu", family="activation", doc="x if x > alpha else 0")
def _thresholded_relu(ctx, node):
    x = ctx.input(node, 0)
    d = ctx.dtype(x)
    return _op.where(ctx.emit(_op.greater(x, scalar(node.attr("alpha", 1.0), d))), x,
                     scalar(0, d))


@converter("Shrink", family="activation", doc="x + bias if x < -lambd, x - bias if x > lambd, else 0")
def _shrink(ctx, node):
    x = ctx.input(node, 0)
    d = ctx.dtype(x)
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    lo = ctx.emit(_op.less(x, scalar(-lambd, d)))
    hi = ctx.emit(_op.greater(x, scalar(lambd, d)))
    if dt.is_float(d):
        plus, minus = ctx.emit(_op.add(x, scalar(bias, d))), ctx.emit(_op.subtract(x, scalar(bias, d)))
    else:
        plus = ctx.emit(_op.add(x, scalar(int(bias), d)))
        minus = ctx.emit(_op.subtract(x, scalar(int(bias), d)))
    return _op.where(lo, plus, ctx.emit(_op.where(hi, minus, scalar(0, d))))


@converter("Clip", family="elementwise", doc="min(max(x, min), max)")
def _clip(ctx, node):
    x = ctx.input(node, 0)
    d = ctx.dtype(x)
    if node.version < 11:
        lo, hi = node.attr("min"), node.attr("max")
        y = x
        if lo is not None:
            y = ctx.emit(_op.maximum(y, scalar(lo, d)))
        if hi is not None:
            y = ctx.emit(_op.minimum(y, scalar(hi, d)))
        return _op.add(y, scalar(0, d)) if y is x else y
    y = x
    lo, hi = ctx.input(node, 1), ctx.input(node, 2)
    if lo is not None:
        y = ctx.emit(_op.maximum(y, lo))
    if hi is not None:
        y = ctx.emit(_op.minimum(y, hi))
    if y is x:
        return _op.add(x, scalar(0, d)) if d != "bool" else x
    return y


# ---------------------------------------------------------------------------------------------
# casts


def _cast_check(node):
    to = node.attr("to")
    if to is not None and to not in ONNX_DTYPES and format_of(to) is None:
        return [f"casting to {onnx_dtype_name(to)} is not supported (no tilecraft dtype)"]
    if node.attr("round_mode") not in (None, "up") :
        pass
    return []


def cast_value(ctx, v, target: int, saturate: bool = True, round_mode: str = "up"):
    """The value ``v`` converted to the ONNX element type ``target`` (native or lowbit)."""
    src = lowbit.BY_NAME.get(v.logical) if v.logical else None
    tgt = lowbit.format_of(target)
    if tgt is not None and src is tgt:
        return v
    x = ctx.expr(v)
    if isinstance(src, lowbit.FloatFormat):
        x = lowbit.decode(ctx, x, src)
    if tgt is None:
        d = ONNX_DTYPES[target]
        if src is None and ctx.dtype(x) == d:
            return v
        return Value(ctx.emit(_op.astype(x, d)) if ctx.dtype(x) != d else x)
    if isinstance(tgt, lowbit.IntFormat):
        return Value(lowbit.encode_int(ctx, x, tgt), logical=tgt.name)
    if not dt.is_float(ctx.dtype(x)):
        x = ctx.emit(_op.astype(x, "float64"))
    # ``saturate`` is for the float8 types; bfloat16 overflows to infinity, float4 saturates
    sat = (bool(saturate) and tgt.name.startswith("float8")) or tgt.kind == "finite"
    return Value(lowbit.encode(ctx, x, tgt, saturate=sat, round_mode=round_mode),
                 logical=tgt.name)


@converter("Cast", family="elementwise", check=_cast_check,
           doc="convert to the dtype `to` (bfloat16, float8, 4- and 2-bit types too)")
def _cast(ctx, node):
    return cast_value(ctx, ctx.value(node, 0), node.attr("to"), node.attr("saturate", 1),
                      node.attr("round_mode", "up"))


@converter("CastLike", family="elementwise", doc="convert to the dtype of the second input")
def _cast_like(ctx, node):
    like = ctx.value(node, 1)
    if like.logical is not None:
        target = lowbit.ONNX_OF[like.logical]
    else:
        target = {d: k for k, d in ONNX_DTYPES.items()}[like.dtype]
    return cast_value(ctx, ctx.value(node, 0), target, node.attr("saturate", 1))


@converter("BitCast", family="elementwise",
           doc="reinterpret the bits as another type of the same width (NaN payloads are "
               "not kept)")
def _bitcast(ctx, node):
    x = ctx.input(node, 0)
    src, target = ctx.dtype(x), ONNX_DTYPES.get(node.attr("to"))
    if target is None:
        raise ConversionError(f"BitCast to {onnx_dtype_name(node.attr('to'))} is not supported")
    if dt.bits(src) != dt.bits(target) and not (src == "bool" and dt.bits(target) == 8):
        raise ConversionError(f"BitCast from {src} to {target}: the widths differ")
    if src == target:
        return ctx.value(node, 0)
    if dt.is_float(src) and dt.is_float(target):
        bits = lowbit.encode(ctx, x, lowbit.NATIVE_FLOATS[src])
        return lowbit.decode(ctx, bits, lowbit.NATIVE_FLOATS[target], target)
    if dt.is_float(src):
        bits = lowbit.encode(ctx, x, lowbit.NATIVE_FLOATS[src])
        return _op.astype(bits, target)
    if dt.is_float(target):
        return lowbit.decode(ctx, x, lowbit.NATIVE_FLOATS[target], target)
    return _op.astype(x, target)   # same-width integers: the cast keeps the bits


@converter("Identity", family="elementwise", doc="x")
def _identity(ctx, node):
    v = ctx.value(node, 0)
    return v


del _name, _fn, _doc, _f
