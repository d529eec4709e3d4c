"""Quantization: QuantizeLinear, DequantizeLinear (per tensor, per axis, blocked),
DynamicQuantizeLinear, QLinearMatMul, QLinearConv, MatMulInteger, ConvInteger.

Arithmetic follows the ONNX reference implementation: integer products accumulate exactly in
int32, rescaling is in floating point, rounding is half to even, results saturate to the range
of the output type (int8, uint8, int16, uint16, and the lowbit types of ``lowbit.py``: int4,
uint4, int2, uint2 as values, float8 and float4 as bit patterns).
"""
from __future__ import annotations

from .... import op as _op
from .. import lowbit
from ..lowbit import format_of
from ..registry import ConversionError, ONNX_DTYPES, converter, onnx_dtype_name
from ..values import Value
from .common import cast, norm_axis, scalar, static_int
from .nn import _auto_pads, _kernel_shape

_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
           "int32": (-2 ** 31, 2 ** 31 - 1)}


def _param(ctx, v, x, axis, block_size):
    """A scale / zero point reshaped to broadcast against ``x`` (per tensor, per axis along
    ``axis``, or repeated ``block_size`` times along it)."""
    if v is None:
        return None
    vs = ctx.shape(v)
    xs = ctx.shape(x)
    if len(vs) == 0:
        return v
    if len(vs) == 1 and static_int(vs[0]) == 1 and not block_size:
        return ctx.emit(_op.reshape(v, ()))
    axis = norm_axis(axis, len(xs))
    if not block_size:
        return ctx.emit(_op.reshape(v, tuple(vs[0] if k == axis else 1 for k in range(len(xs)))))
    rep = ctx.emit(_op.repeat(v, block_size, axis))
    n = static_int(xs[axis])
    if n is not None and static_int(ctx.shape(rep)[axis]) != n:
        rep = ctx.emit(_op.strided_slice(rep, [axis], [0], [n]))
    return rep


def _saturate_round(ctx, y, target):
    """round half to even, clip to ``target``'s range, cast."""
    lo, hi = _RANGES[target]
    d = ctx.dtype(y)
    y = ctx.emit(_op.round(y))
    y = ctx.emit(_op.minimum(ctx.emit(_op.maximum(y, scalar(lo, d))), scalar(hi, d)))
    return _op.astype(y, target)


def _q_check(node):
    od = node.attr("output_dtype")
    if od and od not in ONNX_DTYPES and format_of(od) is None:
        return [f"output_dtype {onnx_dtype_name(od)} is not supported (no tilecraft dtype)"]
    return []


def _float_input(ctx, v):
    """A value as a float32-or-wider tensor (lowbit floats decoded, lowbit ints as values)."""
    x = ctx.expr(v)
    if v.logical is not None and lowbit.is_float_format(v.logical):
        return lowbit.decode(ctx, x, lowbit.BY_NAME[v.logical])
    return x


@converter("QuantizeLinear", family="quant", check=_q_check,
           doc="saturate(round(x / scale) + zero_point) (per tensor, per axis, blocked; int8, "
               "uint8, int16, uint16, int4, uint4, int2, uint2, float8, float4)")
def _quantize(ctx, node):
    x, scale = ctx.input(node, 0), ctx.input(node, 1)
    zpv = ctx.value(node, 2)
    axis = node.attr("axis", 1)
    block = node.attr("block_size", 0)
    fmt = None
    if zpv is not None and zpv.logical is not None:
        fmt = lowbit.BY_NAME[zpv.logical]
    elif node.attr("output_dtype") and lowbit.format_of(node.attr("output_dtype")):
        fmt = lowbit.format_of(node.attr("output_dtype"))
    if fmt is not None:
        target = fmt.storage
    elif zpv is not None:
        target = zpv.dtype
    else:
        target = ONNX_DTYPES[node.attr("output_dtype")] if node.attr("output_dtype") else "uint8"
    if fmt is None and (target not in _RANGES or target == "int32"):
        raise ConversionError(f"QuantizeLinear to {target} is not supported")
    s = _param(ctx, scale, x, axis, block)
    d = ctx.dtype(x)
    if ctx.dtype(s) != d:
        s = cast(ctx, s, d)
    q = ctx.emit(_op.divide(x, s))
    if isinstance(fmt, lowbit.FloatFormat):
        if zpv is not None and fmt.kind == "finite":
            z = _param(ctx, _float_input(ctx, zpv), x, axis, block)
            q = ctx.emit(_op.add(cast(ctx, q, "float32"), cast(ctx, z, "float32")))
        sat = bool(node.attr("saturate", 1)) or fmt.kind == "finite"
        return Value(lowbit.encode(ctx, q, fmt, saturate=sat), logical=fmt.name)
    q = ctx.emit(_op.round(q))
    wide = "float64" if d == "float64" else "float32"
    q = cast(ctx, q, wide)
    if zpv is not None:
        z = cast(ctx, _param(ctx, ctx.expr(zpv), x, axis, block), wide)
        q = ctx.emit(_op.add(q, z))
    lo, hi = (fmt.lo, fmt.hi) if fmt is not None else _RANGES[target]
    q = ctx.emit(_op.minimum(ctx.emit(_op.maximum(q, scalar(lo, wide))), scalar(hi, wide)))
    out = ctx.emit(_op.astype(q, target))
    return Value(out, logical=fmt.name) if fmt is not None else out


@converter("DequantizeLinear", family="quant", check=_q_check,
           doc="(x - zero_point) * scale (per tensor, per axis, blocked; lowbit types too)")
def _dequantize(ctx, node):
    xv, scale, zpv = ctx.value(node, 0), ctx.input(node, 1), ctx.value(node, 2)
    x = ctx.expr(xv)
    axis = node.attr("axis", 1)
    block = node.attr("block_size", 0)
    xf = cast(ctx, _float_input(ctx, xv), "float32")
    if zpv is not None:
        z = _param(ctx, _float_input(ctx, zpv), x, axis, block)
        xf = ctx.emit(_op.subtract(xf, cast(ctx, z, "float32")))
    s = cast(ctx, _param(ctx, scale, x, axis, block), "float32")
    y = ctx.emit(_op.multiply(xf, s))
    out = ONNX_DTYPES[node.attr("output_dtype")] if node.attr("output_dtype") else \
        ctx.dtype(scale)
    return cast(ctx, y, out) if out != "float32" else y


@converter("DynamicQuantizeLinear", family="quant",
           doc="uint8 quantization with the scale and zero point computed from the data")
def _dynamic_quantize(ctx, node):
    x = ctx.input(node, 0)
    d = ctx.dtype(x)
    e = ctx.emit
    mx = e(_op.maximum(e(_op.max(x)), scalar(0, d)))
    mn = e(_op.minimum(e(_op.min(x)), scalar(0, d)))
    rng = e(_op.subtract(mx, mn))
    rng = e(_op.where(e(_op.equal(mx, mn)), scalar(1, d), rng))
    s = e(_op.divide(rng, scalar(255, d)))
    zp0 = e(_op.subtract(scalar(0, d), e(_op.divide(mn, s))))
    zp0 = e(_op.minimum(e(_op.maximum(zp0, scalar(0, d))), scalar(255, d)))
    zpr = e(_op.round(zp0))
    q = e(_op.add(e(_op.round(e(_op.divide(x, s)))), zpr))
    q = e(_op.minimum(e(_op.maximum(q, scalar(0, d))), scalar(255, d)))
    return [_op.astype(q, "uint8"), s, _op.astype(zpr, "uint8")]


def _centered(ctx, x, zp, axis_shape=None):
    """int32 ``x - zero_point``."""
    xi = cast(ctx, x, "int32")
    if zp is None:
        return xi
    z = cast(ctx, zp, "int32")
    if axis_shape is not None and len(ctx.shape(z)) == 1 and static_int(ctx.shape(z)[0]) != 1:
        z = ctx.emit(_op.reshape(z, axis_shape))
    elif len(ctx.shape(z)) == 1 and static_int(ctx.shape(z)[0]) == 1:
        z = ctx.emit(_op.reshape(z, ()))
    return ctx.emit(_op.subtract(xi, z))


@converter("MatMulInteger", family="quant", doc="int32 (a - a_zero_point) @ (b - b_zero_point)")
def _matmul_integer(ctx, node):
    a, b, azp, bzp = (ctx.input(node, i) for i in range(4))
    return _op.matmul(_centered(ctx, a, azp), _centered(ctx, b, bzp), out_dtype="int32")


def _requantize(ctx, acc, xs, ws, ys, yzp, x_dtype, float_dtype="float64", channel=None):
    """saturate(round(acc * (x_scale * w_scale / y_scale) + y_zero_point))."""
    e = ctx.emit
    mult = e(_op.divide(e(_op.multiply(xs, ws)), ys))
    if channel is not None:
        mult = e(_op.reshape(mult, channel))
    r = e(_op.multiply(cast(ctx, acc, float_dtype), cast(ctx, mult, float_dtype)))
    target = ctx.dtype(yzp) if yzp is not None else x_dtype
    if yzp is not None:
        r = e(_op.add(r, cast(ctx, yzp, float_dtype)))
    return _saturate_round(ctx, r, target)


def _scalar_of(ctx, v):
    if len(ctx.shape(v)) == 1 and static_int(ctx.shape(v)[0]) == 1:
        return ctx.emit(_op.reshape(v, ()))
    return v


@converter("QLinearMatMul", family="quant", doc="quantized matmul with requantization")
def _qlinear_matmul(ctx, node):
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = (ctx.input(node, i) for i in range(8))
    acc = ctx.emit(_op.matmul(_centered(ctx, a, a_zp), _centered(ctx, b, b_zp),
                              out_dtype="int32"))
    return _requantize(ctx, acc, _scalar_of(ctx, a_s), _scalar_of(ctx, b_s),
                       _scalar_of(ctx, y_s), _scalar_of(ctx, y_zp) if y_zp is not None else None,
                       ctx.dtype(a))


def _int_conv(ctx, node, x, w):
    xs, ws = ctx.shape(x), ctx.shape(w)
    n = len(xs) - 2
    kernel = _kernel_shape(node, ws)
    strides = node.attr("strides", [1] * n)
    dil = node.attr("dilations", [1] * n)
    pads = _auto_pads(node, xs[2:], kernel, strides, dil)
    groups = node.attr("group", 1)
    fn = {1: _op.nn.conv1d, 2: _op.nn.conv2d, 3: _op.nn.conv3d}.get(n)
    if fn is None:
        raise ConversionError(f"integer Conv of {n} spatial dims is not supported")
    return ctx.emit(fn(x, w, strides, pads, dil, groups, out_dtype="int32"))


@converter("ConvInteger", family="quant", doc="int32 convolution of zero-point-centered inputs")
def _conv_integer(ctx, node):
    x, w, xzp, wzp = (ctx.input(node, i) for i in range(4))
    rank = len(ctx.shape(w))
    xc = _centered(ctx, x, xzp)
    wc = _centered(ctx, w, wzp, (-1,) + (1,) * (rank - 1))
    return _int_conv(ctx, node, xc, wc)


@converter("QLinearConv", family="quant", doc="quantized convolution with requantization")
def _qlinear_conv(ctx, node):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, b = (ctx.input(node, i) for i in range(9))
    rank = len(ctx.shape(x))
    xc = _centered(ctx, x, x_zp)
    wc = _centered(ctx, w, w_zp, (-1,) + (1,) * (len(ctx.shape(w)) - 1))
    acc = _int_conv(ctx, node, xc, wc)
    if b is not None:
        acc = ctx.emit(_op.add(acc, ctx.emit(_op.reshape(cast(ctx, b, "int32"),
                                                          (-1,) + (1,) * (rank - 2)))))
    ws = _scalar_of(ctx, w_s)
    channel = None
    if len(ctx.shape(ws)) == 1:
        channel = (1, -1) + (1,) * (rank - 2)
    return _requantize(ctx, acc, _scalar_of(ctx, x_s), ws, _scalar_of(ctx, y_s),
                       _scalar_of(ctx, y_zp) if y_zp is not None else None, ctx.dtype(x),
                       channel=channel)
