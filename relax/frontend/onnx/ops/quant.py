"""Quantization: QuantizeLinear, DequantizeLinear (per tensor, per axis, blocked),
DynamicQuantizeLinear, QLinearMatMul, QLinearConv, MatMulInteger, ConvInteger.

Arithmetic follows the ONNX reference implementation: integer products accumulate exactly in
int32, rescaling is in floating point, rounding is half to even, results saturate to the range
of the output type (int8, uint8, int16, uint16, and the lowbit types of ``lowbit.py``: int4,
uint4, int2, uint2 as values, float8 and float4 as bit patterns).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .... import op as _op
from ....expr import const
from ..registry import (ConversionError, ONNX_DTYPES, contrib_converter, converter,
                        onnx_dtype_name)
from .common import cast, norm_axis, scalar, static_int

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
    from ..lowbit import format_of
    od = node.attr("output_dtype")
    if od and od not in ONNX_DTYPES and format_of(od) is None:
        return [f"output_dtype {onnx_dtype_name(od)} is not supported (no tilecraft dtype)"]
    return []


def _float_input(ctx, v):
    """A value as a float32-or-wider tensor (lowbit floats decoded, lowbit ints as values)."""
    from .. import lowbit
    x = ctx.expr(v)
    if v.logical is not None and lowbit.is_float_format(v.logical):
        return lowbit.decode(ctx, x, lowbit.BY_NAME[v.logical])
    return x


@converter("QuantizeLinear", family="quant", check=_q_check,
           doc="saturate(round(x / scale) + zero_point) (per tensor, per axis, blocked; int8, "
               "uint8, int16, uint16, int4, uint4, int2, uint2, float8, float4)")
def _quantize(ctx, node):
    from .. import lowbit
    from ..importer import Value
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


@dataclass(frozen=True)
class Dequantized:
    """What a DequantizeLinear output stands for: ``(q - zero_point) * scale`` of the integer
    value ``q`` (an importer ``Value``) with per-tensor (``axis`` None) or per-axis
    parameters known at import time. MatMul / Gemm / Conv consumers of such outputs compute
    on ``q`` with the int8 kernels (QDQ models) instead of dequantizing to float32."""
    q: object
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None


def _dequantized(ctx, node) -> Dequantized | None:
    """The ``Dequantized`` record of a DequantizeLinear node whose parameters are known int8 /
    uint8 quantization (no blocks), or None."""
    xv, sv, zv = ctx.value(node, 0), ctx.value(node, 1), ctx.value(node, 2)
    if node.attr("block_size", 0) or xv.logical is not None or xv.dtype not in ("uint8", "int8"):
        return None
    if sv.known is None or sv.known.dtype != np.float32 or (zv is not None and zv.known is None):
        return None
    scale = np.asarray(sv.known, np.float32)
    zp = np.zeros(scale.shape, xv.dtype) if zv is None else np.asarray(zv.known)
    axis = None
    if scale.size > 1:
        shape = ctx.shape(ctx.expr(xv)) if xv.known is None else xv.known.shape
        axis = norm_axis(node.attr("axis", 1), len(shape))
    return Dequantized(xv, scale.reshape(-1), zp.reshape(-1), axis)


@converter("DequantizeLinear", family="quant", check=_q_check,
           doc="(x - zero_point) * scale (per tensor, per axis, blocked; lowbit types too); "
               "MatMul / Gemm / Conv of int8 / uint8 QDQ pairs run as int8 kernels")
def _dequantize(ctx, node):
    from ..importer import Value
    y = _dequantize_float(ctx, node)
    dq = _dequantized(ctx, node)
    return Value(ctx.emit(y), dq=dq) if dq is not None else y


def _dequantize_float(ctx, node):
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


@converter("MatMulInteger", family="quant", doc="int32 (a - a_zero_point) @ (b - b_zero_point); "
           "uint8 a with a constant int8 b of zero b_zero_point runs as the int8 dense kernel")
def _matmul_integer(ctx, node):
    a, b, azp, bzp = (ctx.input(node, i) for i in range(4))
    w, wzp = ctx.known(node, 1), ctx.known(node, 3)
    if ctx.dtype(a) == "uint8" and w is not None and w.dtype == np.int8 and w.ndim == 2 and \
            (wzp is None or not np.any(np.asarray(wzp) != 0)) and \
            (azp is None or len(ctx.shape(azp)) == 0 or
             (len(ctx.shape(azp)) == 1 and static_int(ctx.shape(azp)[0]) == 1)):
        # (a - za) @ b = a @ b - za * colsum(b): the uint8 x int8 kernel and an exact correction
        acc = ctx.emit(_op.matmul(a, const(np.ascontiguousarray(w)), out_dtype="int32"))
        if azp is None:
            return acc
        za = cast(ctx, _scalar_of(ctx, azp), "int32")
        colsum = const(w.astype(np.int64).sum(axis=0).astype(np.int32))
        return _op.subtract(acc, ctx.emit(_op.multiply(za, colsum)))
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
    from .nn import _auto_pads, _kernel_shape
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


# ---------------------------------------------------------------------------------------------
# QDQ pairs and integer matmuls -> the int8 kernels (uint8 activations x int8 weights, int32)


def _u8_activation(ctx, dq: Dequantized):
    """The activation of a QDQ pair as ``(uint8 expr, scale, zero point)``: int8 data moves
    to uint8 by adding 128 to values and zero point (exact)."""
    if dq.axis is not None or dq.q.known is not None:
        return None
    x = ctx.expr(dq.q)
    zp = int(dq.zero_point[0])
    if dq.q.dtype == "int8":
        x = ctx.emit(_op.astype(ctx.emit(_op.add(cast(ctx, x, "int16"), scalar(128, "int16"))),
                                "uint8"))
        zp += 128
    return x, float(dq.scale[0]), zp


def _int8_weight(dq: Dequantized, out_axis: int):
    """A constant symmetric int8 weight of a QDQ pair as ``(int8 array, per-output scales)``;
    None for other weights (nonzero zero points, uint8, not per tensor or per ``out_axis``)."""
    w = dq.q.known
    if w is None or w.dtype != np.int8 or np.any(dq.zero_point != 0):
        return None
    n = w.shape[out_axis]
    if dq.axis is None:
        return w, np.full(n, dq.scale[0], np.float32)
    if dq.axis != out_axis or dq.scale.size != n:
        return None
    return w, dq.scale


def _dequantize_acc(ctx, acc, zp, wsum, xs: float, ws: np.ndarray, shape):
    """``(acc - zp * wsum) * (xs * ws)`` in float32, the int32 correction exact."""
    e = ctx.emit
    acc = e(_op.subtract(acc, e(_op.multiply(zp, const(wsum.reshape(shape).astype(np.int32))))))
    mult = (np.float32(xs) * ws.astype(np.float32)).reshape(shape)
    return e(_op.multiply(e(_op.astype(acc, "float32")), const(mult)))


def qdq_dense(ctx, xv, wv, transposed: bool = False):
    """``DQ(x) @ DQ(W)`` (``DQ(W)^T`` when ``transposed``) as the int8 dense kernel, or None
    when the operands are not a quantized activation and a constant symmetric int8 weight."""
    if xv is None or wv is None or xv.dq is None or wv.dq is None:
        return None
    act = _u8_activation(ctx, xv.dq)
    wt = _int8_weight(wv.dq, 0 if transposed else 1)
    if act is None or wt is None or wt[0].ndim != 2:
        return None
    x, xs, zp = act
    w, ws = wt
    if transposed:
        w = np.ascontiguousarray(w.T)
    if len(ctx.shape(x)) < 2 or static_int(ctx.shape(x)[-1]) != w.shape[0]:
        return None
    acc = ctx.emit(_op.matmul(x, const(w), out_dtype="int32"))
    wsum = w.astype(np.int64).sum(axis=0)
    return _dequantize_acc(ctx, acc, const(np.int32(zp)), wsum, xs, ws, (-1,))


def qdq_conv2d(ctx, node, xv, wv, strides, pads, dilations, groups):
    """``Conv(DQ(x), DQ(W))`` (2-D) as an int8 convolution: the uint8 data padded with its
    zero point, int32 accumulation, the correction ``zp * sum(W[o])`` exact; or None."""
    if xv is None or wv is None or xv.dq is None or wv.dq is None:
        return None
    act = _u8_activation(ctx, xv.dq)
    wt = _int8_weight(wv.dq, 0)
    if act is None or wt is None or wt[0].ndim != 4:
        return None
    x, xs, zp = act
    w, ws = wt
    if any(int(p) for p in pads):
        x = ctx.emit(_op.pad(x, [(0, 0), (0, 0), (int(pads[0]), int(pads[2])),
                                 (int(pads[1]), int(pads[3]))], pad_value=zp))
    acc = ctx.emit(_op.nn.conv2d(x, const(w), strides, (0, 0, 0, 0), dilations, groups,
                                 out_dtype="int32"))
    wsum = w.astype(np.int64).sum(axis=(1, 2, 3))
    return _dequantize_acc(ctx, acc, const(np.int32(zp)), wsum, xs, ws, (1, -1, 1, 1))


# ---------------------------------------------------------------------------------------------
# onnxruntime's 4-bit weights: com.microsoft.MatMulNBits -> relax.dense_q4


def _nbits_check(node):
    out = []
    if node.attr("bits", 4) != 4:
        out.append(f"bits={node.attr('bits')} is not supported (4 only)")
    bs = node.attr("block_size")
    if bs is None or bs < 16 or bs & (bs - 1):
        out.append(f"block_size must be a power of two >= 16, got {bs}")
    if node.has_input(4):
        out.append("g_idx (act-order) is not supported")
    return out


def nbits_weight(b: np.ndarray, scales: np.ndarray, zero_points, k: int, n: int,
                 block_size: int):
    """MatMulNBits' 4-bit weight as ``relax.dense_q4`` operands ``(codes, scale, offset)``.

    ``b`` ``[N, k_blocks, block_size / 2]`` uint8 holds the codes of ``W^T`` two a byte (the
    even ``k`` low), ``scales`` ``[N * k_blocks]``, ``zero_points`` ``[N, ceil(k_blocks / 2)]``
    packed uint8 (default 8) or ``[N * k_blocks]`` float. ``W[k, n] = (q - zp) * scale`` ->
    ``q * scale + offset`` with ``offset = -zp * scale``.

    Examples
    --------
    >>> codes, s, o = nbits_weight(np.full((2, 1, 16), 0x98, np.uint8), np.ones(2, np.float32),
    ...                            None, 32, 2, 32)
    >>> codes.shape, float(o[0, 0]), int(codes[0, 0])
    ((16, 2), -8.0, 152)
    """
    blocks = -(-k // block_size)
    b = np.asarray(b, np.uint8).reshape(n, blocks * block_size // 2)
    codes = np.ascontiguousarray(b[:, :(k + 1) // 2].T)
    scale = np.asarray(scales).reshape(n, blocks)
    if zero_points is None:
        zp = np.full((n, blocks), 8.0, np.float32)
    elif zero_points.dtype == np.uint8:
        packed = np.asarray(zero_points).reshape(n, -1)
        zp = np.empty((n, packed.shape[1] * 2), np.float32)
        zp[:, 0::2] = packed & 15
        zp[:, 1::2] = packed >> 4
        zp = zp[:, :blocks]
    else:
        zp = np.asarray(zero_points, np.float32).reshape(n, blocks)
    offset = (-zp * scale.astype(np.float32)).astype(scale.dtype)
    return codes, np.ascontiguousarray(scale.T), np.ascontiguousarray(offset.T)


@contrib_converter("com.microsoft", "MatMulNBits", check=_nbits_check, family="quant",
                   doc="onnxruntime's 4-bit block-quantized MatMul -> relax.dense_q4 (the codes "
                       "stay packed; dequantized in registers)")
def _matmul_nbits(ctx, node):
    a = ctx.input(node, 0)
    k, n, bs = int(node.attr("K")), int(node.attr("N")), int(node.attr("block_size"))
    b, scales = ctx.known(node, 1), ctx.known(node, 2)
    zps = ctx.known(node, 3) if node.has_input(3) else None
    if b is None or scales is None or (node.has_input(3) and zps is None):
        raise ConversionError("MatMulNBits needs its weight, scales and zero points as "
                              "initializers")
    codes, scale, offset = nbits_weight(b, scales, zps, k, n, bs)
    x = a if ctx.dtype(a) in ("float32", "float16") else cast(ctx, a, "float32")
    y = ctx.emit(_op.dense_q4(x, const(codes), const(scale), const(offset), bs))
    if node.has_input(5):
        y = ctx.emit(_op.add(y, cast(ctx, ctx.input(node, 5), "float32")))
    return cast(ctx, y, ctx.dtype(a)) if ctx.dtype(a) != "float32" else y
