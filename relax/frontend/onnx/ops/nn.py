"""Network operators: Conv, ConvTranspose, pooling, normalizations, Gemm / MatMul / Einsum,
Softmax, Dropout, LRN.

``auto_pad`` (``SAME_UPPER`` / ``SAME_LOWER`` / ``VALID``) becomes explicit padding: static for
static spatial dims and stride 1; with a symbolic spatial dim and a stride above 1 the padding
depends on the size at run time and the node is refused with a clear message.
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import IntImm, Select

from .... import op as _op
from ....expr import TupleGetItem, const
from ...common import UnsupportedError
from ..emit import emit_checked_kernel, emit_kernel
from ..registry import ConversionError, converter
from . import quant
from .common import (cast, conv_auto_pads, conv_kernel_shape, norm_axes, norm_axis, prod, scalar,
                     static_int)
from .tensor import _simplify


def _add_bias(ctx, y, b, rank):
    if b is None:
        return y
    b = ctx.emit(_op.reshape(b, (ctx.shape(b)[0],) + (1,) * (rank - 2)))
    return _op.add(ctx.emit(y), b)


# ---------------------------------------------------------------------------------------------
# convolution


def _conv_check(node):
    if node.attr("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID", "SAME_UPPER",
                                               "SAME_LOWER"):
        return [f"auto_pad {node.attr('auto_pad')!r} is not supported"]
    return []


@converter("Conv", family="nn", check=_conv_check,
           doc="1-D, 2-D and 3-D convolution (groups, dilations, auto_pad)")
def _conv(ctx, node):
    x, w, b = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    xs, ws = ctx.shape(x), ctx.shape(w)
    n = len(xs) - 2
    kernel = conv_kernel_shape(node, ws)
    strides = node.attr("strides", [1] * n)
    dil = node.attr("dilations", [1] * n)
    pads = conv_auto_pads(node, xs[2:], kernel, strides, dil)
    groups = node.attr("group", 1)
    q = quant.qdq_conv2d(ctx, node, ctx.value(node, 0), ctx.value(node, 1), strides, pads, dil,
                         groups) if n == 2 else None
    if q is not None:    # a QDQ pair: the int8 convolution
        return _add_bias(ctx, q, b, len(xs))
    if n == 1:
        y = _op.nn.conv1d(x, w, strides, pads, dil, groups)
    elif n == 2:
        y = _op.nn.conv2d(x, w, strides, pads, dil, groups)
    elif n == 3:
        y = _op.nn.conv3d(x, w, strides, pads, dil, groups)
    else:
        raise ConversionError(f"Conv of {n} spatial dims is not supported (1 to 3)")
    return _add_bias(ctx, y, b, len(xs))


def _conv_transpose_check(node):
    return _conv_check(node)


@converter("ConvTranspose", family="nn", check=_conv_transpose_check,
           doc="1-D and 2-D transposed convolution (output_shape, output_padding, auto_pad)")
def _conv_transpose(ctx, node):
    x, w, b = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    xs, ws = ctx.shape(x), ctx.shape(w)
    n = len(xs) - 2
    if n not in (1, 2):
        raise ConversionError(f"ConvTranspose of {n} spatial dims is not supported (1 or 2)")
    kernel = conv_kernel_shape(node, ws)
    strides = node.attr("strides", [1] * n)
    dil = node.attr("dilations", [1] * n)
    out_pad = list(node.attr("output_padding", [0] * n))
    groups = node.attr("group", 1)
    out_shape = node.attr("output_shape")
    mode = node.attr("auto_pad", "NOTSET")
    if out_shape is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
        ins = [static_int(d) for d in xs[2:]]
        if any(i is None for i in ins):
            raise ConversionError("ConvTranspose with output_shape or auto_pad SAME needs static "
                                  "spatial dims")
        if out_shape is None:
            out_shape = [i * s for i, s in zip(ins, strides)]
        out_shape = list(out_shape)[-n:]
        begins, ends = [], []
        for i in range(n):
            total = strides[i] * (ins[i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 \
                - out_shape[i]
            if mode == "SAME_UPPER":
                bgn, end = total // 2, total - total // 2
            else:
                bgn, end = total - total // 2, total // 2
            begins.append(bgn)
            ends.append(end)
        pads = begins + ends
    else:
        pads = list(node.attr("pads", [0] * (2 * n)))
    # negative padding means a bigger output: zeros at the border the kernel does not reach
    grow_b = [max(-p, 0) for p in pads[:n]]
    grow_e = [max(-p, 0) for p in pads[n:]]
    pads = [max(p, 0) for p in pads]
    # output_padding at least the stride (allowed by output_shape) is zero rows at the end
    extra = []
    for i in range(n):
        limit = max(strides[i], dil[i]) - 1
        extra.append(max(out_pad[i] - limit, 0))
        out_pad[i] = min(out_pad[i], limit)
    if n == 1:
        y = _op.nn.conv1d_transpose(x, w, strides, pads, out_pad, dil, groups)
    else:
        y = _op.nn.conv2d_transpose(x, w, strides, pads, out_pad, dil, groups)
    if any(grow_b) or any(grow_e) or any(extra):
        y = ctx.emit(y)
        width = [(0, 0), (0, 0)] + [(grow_b[i], grow_e[i] + extra[i]) for i in range(n)]
        y = _op.pad(y, width, 0.0)
    return _add_bias(ctx, y, b, len(xs))


# ---------------------------------------------------------------------------------------------
# pooling


def _pool_check(node):
    out = _conv_check(node)
    if node.op_type == "MaxPool" and node.attr("storage_order", 0) and len(node.outputs) > 1:
        out.append("MaxPool indices with storage_order=1 are not supported")
    return out


def _pool_args(ctx, node, x):
    xs = ctx.shape(x)
    n = len(xs) - 2
    kernel = list(node.attr("kernel_shape"))
    strides = node.attr("strides", [1] * n)
    dil = node.attr("dilations", [1] * n)
    if node.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        # pooling SAME: output = ceil(in / stride) (with dilations, as onnxruntime)
        pads = conv_auto_pads(node, xs[2:], kernel, strides, dil)
    else:
        pads = conv_auto_pads(node, xs[2:], kernel, strides, dil)
    return n, kernel, strides, dil, pads


_POOL = {("max", 1): _op.nn.max_pool1d, ("max", 2): _op.nn.max_pool2d,
         ("max", 3): _op.nn.max_pool3d, ("avg", 1): _op.nn.avg_pool1d,
         ("avg", 2): _op.nn.avg_pool2d, ("avg", 3): _op.nn.avg_pool3d}


@converter("MaxPool", family="nn", check=_pool_check,
           doc="max pooling (ceil_mode, dilations, auto_pad; the Indices output)")
def _max_pool(ctx, node):
    x = ctx.input(node, 0)
    n, kernel, strides, dil, pads = _pool_args(ctx, node, x)
    ceil = bool(node.attr("ceil_mode", 0))
    if n not in (1, 2, 3):
        raise ConversionError(f"MaxPool of {n} spatial dims is not supported")
    d = ctx.dtype(x)
    if not dt.is_float(d):
        # integer max pooling: pad with the smallest value through a float-free kernel
        y = _int_max_pool(ctx, x, kernel, strides, dil, pads, ceil)
    else:
        y = _POOL[("max", n)](x, kernel, strides, pads, dil, ceil)
    if node.has_output(1):
        y = ctx.emit(y)
        return [y, _max_pool_indices(ctx, x, y, kernel, strides, dil, pads)]
    return y


def _window_kernel(ctx, x, out_shape, kernel, strides, dil, pads, combine_init, name):
    n = len(kernel)

    def k(data):
        rvs = [te.reduce_axis((0, kk), f"r{i}") for i, kk in enumerate(kernel)]

        def f(*i):
            idx = list(i[:2])
            conds = []
            for s in range(n):
                p = i[2 + s] * strides[s] - pads[s] + rvs[s] * dil[s]
                idx.append(p)
                conds += [p >= 0, p < data.shape[2 + s]]
            return combine_init(data, idx, te.all(*conds), rvs)
        return te.compute(out_shape, f, name)
    return emit_kernel(ctx, k, x, name=name)


def _int_max_pool(ctx, x, kernel, strides, dil, pads, ceil):
    d = ctx.dtype(x)
    ref = _POOL[("max", len(kernel))](cast(ctx, x, "float64"), kernel, strides, pads, dil, ceil)
    out_shape = ref.struct_info.shape
    low = te.const(int(np.iinfo(dt.to_numpy(d)).min), d)

    def comb(data, idx, inside, rvs):
        return te.max(te.if_then_else(inside, data[tuple(idx)], low), axis=rvs)
    return _window_kernel(ctx, x, out_shape, kernel, strides, dil, pads, comb, "int_max_pool")


def _max_pool_indices(ctx, x, y, kernel, strides, dil, pads):
    """The flat (row-major, per image) index of each window's first maximum, as onnxruntime."""
    n = len(kernel)
    xs = ctx.shape(x)
    out_shape = ctx.shape(y)

    def k(data, mx):
        rvs = [te.reduce_axis((0, kk), f"r{i}") for i, kk in enumerate(kernel)]

        def f(*i):
            idx = list(i[:2])
            conds = []
            flat = i[0] * xs[1] + i[1]
            for s in range(n):
                p = i[2 + s] * strides[s] - pads[s] + rvs[s] * dil[s]
                idx.append(p)
                conds += [p >= 0, p < data.shape[2 + s]]
                flat = flat * xs[2 + s] + p
            hit = te.all(*conds) & (te.if_then_else(te.all(*conds), data[tuple(idx)],
                                                    mx[i]) == mx[i])
            big = te.const(np.iinfo(np.int64).max, "int64")
            return te.min(Select(hit, flat.astype("int64"), big), axis=rvs)
        return te.compute(out_shape, f, "T_argmax_pool")
    return emit_kernel(ctx, k, x, y, name="max_pool_indices")


@converter("AveragePool", family="nn", check=_pool_check,
           doc="average pooling (count_include_pad, ceil_mode, dilations, auto_pad)")
def _avg_pool(ctx, node):
    x = ctx.input(node, 0)
    n, kernel, strides, dil, pads = _pool_args(ctx, node, x)
    ceil = bool(node.attr("ceil_mode", 0))
    include = bool(node.attr("count_include_pad", 0))
    if n not in (1, 2, 3):
        raise ConversionError(f"AveragePool of {n} spatial dims is not supported")
    if include and ceil:
        return _avg_pool_ceil_include(ctx, x, kernel, strides, dil, pads)
    return _POOL[("avg", n)](x, kernel, strides, pads, dil, ceil, include)


def _avg_pool_ceil_include(ctx, x, kernel, strides, dil, pads):
    """count_include_pad with ceil_mode: the divisor counts the explicit padding but not the
    window part beyond it (onnxruntime's rule)."""
    n = len(kernel)
    ref = _POOL[("avg", n)](x, kernel, strides, pads, dil, True, True)
    out_shape = ref.struct_info.shape
    xs = ctx.shape(x)
    d = ctx.dtype(x)
    acc = "float32" if d == "float16" else d

    def k(data):
        rvs = [te.reduce_axis((0, kk), f"r{i}") for i, kk in enumerate(kernel)]

        def f(*i):
            idx = list(i[:2])
            conds, count_conds = [], []
            for s in range(n):
                p = i[2 + s] * strides[s] - pads[s] + rvs[s] * dil[s]
                idx.append(p)
                conds += [p >= 0, p < data.shape[2 + s]]
                count_conds += [p < data.shape[2 + s] + pads[n + s]]
            v = te.if_then_else(te.all(*conds), data[tuple(idx)].astype(acc), te.const(0, acc))
            return te.sum(v, axis=rvs)
        s = te.compute(out_shape, f, "T_sum")

        def c(*i):
            cnt = IntImm(1, "int64")
            for t in range(n):
                start = i[2 + t] * strides[t] - pads[t]
                hi = xs[2 + t] + pads[n + t]
                span = te.min(start + (kernel[t] - 1) * dil[t] + 1, hi) - start
                taps = (span + (dil[t] - 1)) // dil[t]
                cnt = cnt * te.max(taps, IntImm(1, "int64"))
            return (s[i] / cnt.astype(acc)).astype(d)
        return te.compute(out_shape, c, "T_avg_pool")
    return emit_kernel(ctx, k, x, name="avg_pool")


def _global_pool(kind):
    def convert(ctx, node):
        x = ctx.input(node, 0)
        axes = list(range(2, len(ctx.shape(x))))
        if kind == "avg":
            return _op.mean(x, axes, keepdims=True)
        return _op.max(x, axes, keepdims=True)
    return convert


converter("GlobalAveragePool", family="nn", doc="mean over the spatial dims")(
    _global_pool("avg"))
converter("GlobalMaxPool", family="nn", doc="max over the spatial dims")(_global_pool("max"))


@converter("LpPool", family="nn", check=_pool_check, doc="(sum |x| ** p) ** (1 / p) over windows")
def _lp_pool(ctx, node):
    x = ctx.input(node, 0)
    n, kernel, strides, dil, pads = _pool_args(ctx, node, x)
    p = float(node.attr("p", 2))
    d = ctx.dtype(x)
    ceil = bool(node.attr("ceil_mode", 0))
    xp = ctx.emit(_op.power(ctx.emit(_op.abs(x)), scalar(p, d)))
    avg = ctx.emit(_POOL[("avg", n)](xp, kernel, strides, pads, dil, ceil, True))
    total = ctx.emit(_op.multiply(avg, scalar(float(np.prod(kernel)), d)))
    return _op.power(total, scalar(1.0 / p, d))


@converter("GlobalLpPool", family="nn", doc="(sum |x| ** p) ** (1 / p) over the spatial dims")
def _global_lp_pool(ctx, node):
    x = ctx.input(node, 0)
    p = float(node.attr("p", 2))
    d = ctx.dtype(x)
    axes = list(range(2, len(ctx.shape(x))))
    s = ctx.emit(_op.sum(ctx.emit(_op.power(ctx.emit(_op.abs(x)), scalar(p, d))), axes,
                         keepdims=True))
    return _op.power(s, scalar(1.0 / p, d))


# ---------------------------------------------------------------------------------------------
# normalization


def _channel(ctx, v, rank):
    return ctx.emit(_op.reshape(v, (ctx.shape(v)[0],) + (1,) * (rank - 2)))


@converter("BatchNormalization", family="nn",
           doc="batch normalization (inference; training_mode computes batch statistics)")
def _batch_norm(ctx, node):
    x, scale, bias, mean, var = (ctx.input(node, i) for i in range(5))
    eps = node.attr("epsilon", 1e-5)
    training = node.attr("training_mode", 0) or (node.version < 9 and node.has_output(1)
                                                 and not node.attr("is_test", 0))
    rank = len(ctx.shape(x))
    if not training:
        if rank == 1:
            raise ConversionError("BatchNormalization of a 1-D input")
        bn = ctx.emit(_op.nn.batch_norm(x, scale, bias, mean, var, axis=1, epsilon=eps))
        return TupleGetItem(bn, 0)
    d = ctx.dtype(x)
    momentum = node.attr("momentum", 0.9)
    axes = [0] + list(range(2, rank))
    bmean = ctx.emit(_op.mean(x, axes))
    bvar = ctx.emit(_op.variance(x, axes))
    xc = ctx.emit(_op.subtract(x, _channel(ctx, bmean, rank)))
    inv = ctx.emit(_op.rsqrt(ctx.emit(_op.add(_channel(ctx, bvar, rank), scalar(eps, d)))))
    y = ctx.emit(_op.add(ctx.emit(_op.multiply(ctx.emit(_op.multiply(xc, inv)),
                                               _channel(ctx, scale, rank))),
                         _channel(ctx, bias, rank)))
    m = scalar(momentum, d)
    one_m = scalar(1.0 - momentum, d)
    rmean = ctx.emit(_op.add(ctx.emit(_op.multiply(mean, m)), ctx.emit(_op.multiply(bmean, one_m))))
    rvar = ctx.emit(_op.add(ctx.emit(_op.multiply(var, m)), ctx.emit(_op.multiply(bvar, one_m))))
    return [y, rmean, rvar]


@converter("InstanceNormalization", family="nn", doc="normalize each (n, c) over the spatial dims")
def _instance_norm(ctx, node):
    x, scale, bias = (ctx.input(node, i) for i in range(3))
    rank = len(ctx.shape(x))
    d = ctx.dtype(x)
    axes = list(range(2, rank))
    mean = ctx.emit(_op.mean(x, axes, keepdims=True))
    var = ctx.emit(_op.variance(x, axes, keepdims=True))
    xc = ctx.emit(_op.subtract(x, mean))
    inv = ctx.emit(_op.rsqrt(ctx.emit(_op.add(var, scalar(node.attr("epsilon", 1e-5), d)))))
    y = ctx.emit(_op.multiply(ctx.emit(_op.multiply(xc, inv)), _channel(ctx, scale, rank)))
    return _op.add(y, _channel(ctx, bias, rank))


@converter("LayerNormalization", family="nn",
           doc="normalize over the dims from axis on (Mean and InvStdDev outputs too)")
def _layer_norm(ctx, node):
    x, scale, bias = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    xs = ctx.shape(x)
    rank = len(xs)
    axis = norm_axis(node.attr("axis", -1), rank)
    eps = node.attr("epsilon", 1e-5)
    d = ctx.dtype(x)
    axes = list(range(axis, rank))
    norm_shape = [static_int(v) for v in xs[axis:]]
    simple = not node.has_output(1) and not node.has_output(2) and \
        [static_int(v) for v in ctx.shape(scale)] == norm_shape and \
        (bias is None or [static_int(v) for v in ctx.shape(bias)] == norm_shape) and \
        None not in norm_shape and d in ("float32", "float64")
    if simple:
        if bias is None:
            bias = const(np.zeros(norm_shape, dtype=dt.to_numpy(d)))
        return _op.nn.layer_norm(x, scale, bias, axes, eps)
    stash = "float32" if node.attr("stash_type", 1) == 1 and d != "float64" else d
    xw = cast(ctx, x, stash)
    mean = ctx.emit(_op.mean(xw, axes, keepdims=True))
    xc = ctx.emit(_op.subtract(xw, mean))
    var = ctx.emit(_op.mean(ctx.emit(_op.multiply(xc, xc)), axes, keepdims=True))
    inv = ctx.emit(_op.rsqrt(ctx.emit(_op.add(var, scalar(eps, stash)))))
    y = cast(ctx, ctx.emit(_op.multiply(xc, inv)), d)
    y = ctx.emit(_op.multiply(y, scale))
    if bias is not None:
        y = ctx.emit(_op.add(y, bias))
    return [y, mean, inv]


@converter("GroupNormalization", family="nn", doc="normalize channel groups over the spatial dims")
def _group_norm(ctx, node):
    x, scale, bias = (ctx.input(node, i) for i in range(3))
    xs = ctx.shape(x)
    rank = len(xs)
    g = node.attr("num_groups")
    eps = node.attr("epsilon", 1e-5)
    d = ctx.dtype(x)
    n, c = xs[0], xs[1]
    cs = static_int(c)
    if cs is None:
        raise ConversionError("GroupNormalization needs a static channel count")
    xg = ctx.emit(_op.reshape(x, (n, g, cs // g, -1)))
    mean = ctx.emit(_op.mean(xg, [2, 3], keepdims=True))
    xc = ctx.emit(_op.subtract(xg, mean))
    var = ctx.emit(_op.mean(ctx.emit(_op.multiply(xc, xc)), [2, 3], keepdims=True))
    y = ctx.emit(_op.multiply(xc, ctx.emit(_op.rsqrt(ctx.emit(_op.add(var, scalar(eps, d)))))))
    y = ctx.emit(_op.reshape(y, xs))
    if static_int(ctx.shape(scale)[0]) == g and g != cs:
        scale = ctx.emit(_op.repeat(scale, cs // g, 0))
        bias = ctx.emit(_op.repeat(bias, cs // g, 0))
    return _op.add(ctx.emit(_op.multiply(y, _channel(ctx, scale, rank))), _channel(ctx, bias, rank))


@converter("RMSNormalization", family="nn", doc="x / sqrt(mean(x ** 2) + epsilon) * scale")
def _rms_norm(ctx, node):
    x, scale = ctx.input(node, 0), ctx.input(node, 1)
    xs = ctx.shape(x)
    rank = len(xs)
    axis = norm_axis(node.attr("axis", -1), rank)
    eps = node.attr("epsilon", 1e-5)
    d = ctx.dtype(x)
    stash = "float32" if node.attr("stash_type", 1) == 1 and d != "float64" else d
    xw = cast(ctx, x, stash)
    ms = ctx.emit(_op.mean(ctx.emit(_op.multiply(xw, xw)), list(range(axis, rank)),
                           keepdims=True))
    y = ctx.emit(_op.multiply(xw, ctx.emit(_op.rsqrt(ctx.emit(_op.add(ms, scalar(eps, stash)))))))
    y = cast(ctx, y, d)
    return _op.multiply(y, scale)


@converter("LpNormalization", family="nn", doc="x / ||x||_p along axis")
def _lp_norm(ctx, node):
    x = ctx.input(node, 0)
    axis = norm_axis(node.attr("axis", -1), len(ctx.shape(x)))
    p = node.attr("p", 2)
    if p == 1:
        nrm = ctx.emit(_op.sum(ctx.emit(_op.abs(x)), [axis], keepdims=True))
    elif p == 2:
        nrm = ctx.emit(_op.sqrt(ctx.emit(_op.sum(ctx.emit(_op.multiply(x, x)), [axis],
                                                 keepdims=True))))
    else:
        raise ConversionError(f"LpNormalization with p={p} (only 1 and 2)")
    d = ctx.dtype(x)
    zero = ctx.emit(_op.equal(nrm, scalar(0, d)))
    safe = ctx.emit(_op.where(zero, scalar(1, d), nrm))
    return _op.where(zero, scalar(0, d), ctx.emit(_op.divide(x, safe)))


@converter("LRN", family="nn", doc="local response normalization across channels")
def _lrn(ctx, node):
    x = ctx.input(node, 0)
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    xs = ctx.shape(x)
    d = ctx.dtype(x)
    lo = (size - 1) // 2

    def k(data):
        r = te.reduce_axis((0, size), "rc")

        def sq(*i):
            c = i[1] - lo + r
            idx = (i[0], c) + tuple(i[2:])
            inside = (c >= 0) & (c < data.shape[1])
            v = te.if_then_else(inside, data[idx], te.const(0, d))
            return te.sum(v * v, axis=r)
        return te.compute(xs, sq, "T_lrn_sum")
    s = emit_kernel(ctx, k, x, name="lrn_square_sum")
    den = ctx.emit(_op.power(ctx.emit(_op.add(ctx.emit(_op.multiply(s, scalar(alpha / size, d))),
                                              scalar(bias, d))), scalar(beta, d)))
    return _op.divide(x, den)


@converter("MeanVarianceNormalization", family="nn", doc="(x - mean) / std over axes")
def _mvn(ctx, node):
    x = ctx.input(node, 0)
    axes = node.attr("axes", [0, 2, 3])
    axes = norm_axes(axes, len(ctx.shape(x)))
    d = ctx.dtype(x)
    mean = ctx.emit(_op.mean(x, axes, keepdims=True))
    xc = ctx.emit(_op.subtract(x, mean))
    var = ctx.emit(_op.mean(ctx.emit(_op.multiply(xc, xc)), axes, keepdims=True))
    return _op.divide(xc, ctx.emit(_op.add(ctx.emit(_op.sqrt(var)), scalar(1e-9, d))))


# ---------------------------------------------------------------------------------------------
# linear algebra


@converter("MatMul", family="linear", doc="numpy matmul (float16 accumulates in float32)")
def _matmul(ctx, node):
    q = quant.qdq_dense(ctx, ctx.value(node, 0), ctx.value(node, 1))
    if q is not None:    # a QDQ pair: the int8 kernel
        return q
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    if ctx.dtype(a) == "float16":
        # as onnxruntime and numpy: float16 products summed in float32
        return _op.astype(ctx.emit(_op.matmul(a, b, out_dtype="float32")), "float16")
    return _op.matmul(a, b)


@converter("Gemm", family="linear", doc="alpha A' B' + beta C (transA, transB)")
def _gemm(ctx, node):
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    q = None if node.attr("transA", 0) or alpha != 1.0 else \
        quant.qdq_dense(ctx, ctx.value(node, 0), ctx.value(node, 1), bool(node.attr("transB", 0)))
    if q is not None:    # a QDQ pair: the int8 kernel, then the bias
        c = ctx.input(node, 2)
        if c is None or beta == 0.0:
            return q
        return _op.add(q, c if beta == 1.0 else ctx.emit(_op.multiply(c, scalar(beta, "float32"))))
    a, b, c = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    d = ctx.dtype(a)
    if node.attr("transA", 0):
        a = ctx.emit(_op.permute_dims(a, [1, 0]))
    acc = "float32" if d == "float16" else None   # float16 sums in float32
    if node.attr("transB", 0):
        y = ctx.emit(_op.linear(a, b, out_dtype=acc))
    else:
        y = ctx.emit(_op.matmul(a, b, out_dtype=acc))
    if acc is not None:
        y = ctx.emit(_op.astype(y, d))
    if alpha != 1.0:
        y = ctx.emit(_op.multiply(y, scalar(alpha, d)))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = ctx.emit(_op.multiply(c, scalar(beta, d)))
        y = _op.add(y, c)
    return y


@converter("Einsum", family="linear", doc="Einstein summation")
def _einsum(ctx, node):
    eq = node.attr("equation").replace(" ", "")
    return _op.einsum(eq, *[x for x in ctx.inputs(node) if x is not None])


# ---------------------------------------------------------------------------------------------
# softmax family


def _coerced_2d(ctx, node, x, fn):
    """Opsets < 13: softmax over the input flattened to 2-D at ``axis``."""
    xs = ctx.shape(x)
    axis = norm_axis(node.attr("axis", 1), len(xs))
    if axis == len(xs) - 1:
        return fn(x, -1)
    flat = ctx.emit(_op.reshape(x, (_simplify(prod(xs[:axis])), _simplify(prod(xs[axis:])))))
    y = ctx.emit(fn(flat, 1))
    return _op.reshape(y, xs)


def _softmax(fn):
    def convert(ctx, node):
        x = ctx.input(node, 0)
        if node.version < 13:
            return _coerced_2d(ctx, node, x, fn)
        return fn(x, norm_axis(node.attr("axis", -1), len(ctx.shape(x))))
    return convert


converter("Softmax", family="nn", doc="softmax along axis (opset < 13: of the 2-D coercion)")(
    _softmax(_op.nn.softmax))
converter("LogSoftmax", family="nn", doc="log softmax along axis")(_softmax(_op.nn.log_softmax))


def _hardmax_fn(ctx):
    def fn(x, axis):
        xs = ctx.shape(x)
        axis = norm_axis(axis, len(xs))
        am = ctx.emit(_op.argmax(x, axis, keepdims=True))
        n = xs[axis]
        ar = ctx.emit(_op.arange(0, n, 1, "int64"))
        ar = ctx.emit(_op.reshape(ar, tuple(n if k == axis else 1 for k in range(len(xs)))))
        hit = ctx.emit(_op.equal(ar, am))
        return _op.astype(hit, ctx.dtype(x))
    return fn


@converter("Hardmax", family="nn", doc="1 at the first maximum along axis, else 0")
def _hardmax(ctx, node):
    return _softmax(_hardmax_fn(ctx))(ctx, node)


@converter("Dropout", family="nn",
           doc="the identity at inference or with ratio 0 (and an all-true mask)")
def _dropout(ctx, node):
    x = ctx.input(node, 0)
    y = ctx.value(node, 0)
    if node.version >= 12 and node.has_input(2):
        t = ctx.known(node, 2)
        ratio = ctx.known(node, 1) if node.has_input(1) else np.array(0.5)
        t_known = t is not None and t.dtype != object
        r_known = ratio is not None and ratio.dtype != object
        training = bool(t.reshape(-1)[0]) if t_known else None
        random = float(ratio.reshape(-1)[0]) != 0.0 if r_known else None
        if training is False or random is False:
            pass
        elif training and random:
            raise UnsupportedError("from_onnx", ["Dropout in training mode with a ratio "
                                                 "above 0 (random) is not supported"])
        else:
            # decided when the model runs: the identity, unless training with a ratio above 0
            y = _checked_identity(ctx, node, x)
    outs = [y]
    if node.has_output(1):
        outs.append(_op.ones(ctx.shape(x), "bool"))
    return outs


def _checked_identity(ctx, node, x):
    """``x``, from a kernel that stops the call when Dropout's training_mode and ratio (inputs
    computed at run time) ask for random dropping."""
    t = ctx.input(node, 2)
    ratio = ctx.input(node, 1) if node.has_input(1) else scalar(0.5, "float32")
    t = ctx.emit(_op.reshape(t, (1,)))
    ratio = ctx.emit(_op.reshape(ratio, (1,)))
    shape = ctx.shape(x)

    def kernel(data, tm, r):
        out = te.compute(shape, lambda *i: data[i], "T_dropout")
        zero = IntImm(0, "int64")
        return out, [((tm[zero] == te.const(0, tm.dtype)) | (r[zero] == te.const(0, r.dtype)),
                      f"{node.describe()}: Dropout in training mode with a ratio above 0 "
                      f"(random) is not supported")]
    return emit_checked_kernel(ctx, kernel, x, t, ratio, name="dropout")


# ---------------------------------------------------------------------------------------------
# DFT


@converter("DFT", family="linear", const_inputs={1: "dft_length", 2: "axis"},
           doc="discrete Fourier transform along an axis (inverse, onesided: rfft / irfft), "
               "as matmuls with cosine and sine tables")
def _dft(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    rank = len(xs)
    d = ctx.dtype(x)
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    if node.version >= 20:
        axis = ctx.known_ints(node, 2, "axis") if node.has_input(2) else [-2]
        axis = axis[0]
    else:
        axis = node.attr("axis", 1)
    axis = norm_axis(axis, rank)
    if axis == rank - 1:
        raise ConversionError("DFT along the last (real / imaginary) axis")
    n_in = static_int(xs[axis])
    channels = static_int(xs[-1])
    if n_in is None or channels not in (1, 2):
        raise ConversionError("DFT needs a static signal length and a last dim of 1 or 2")
    length = ctx.known_ints(node, 1, "dft_length") if node.has_input(1) else None
    if length is not None:
        length = int(length[0])
    elif inverse and onesided:
        length = 2 * (n_in - 1)
    else:
        length = n_in
    e = ctx.emit

    def part(k):
        p = e(_op.strided_slice(x, [rank - 1], [k], [k + 1]))
        p = e(_op.squeeze(p, [rank - 1]))
        perm = [i for i in range(rank - 1) if i != axis] + [axis]
        return e(_op.permute_dims(p, perm)), perm
    re, perm = part(0)
    im = part(1)[0] if channels == 2 else None
    # in float64, as the reference's FFT: outputs that should be 0 come out within 1e-7
    re = cast(ctx, re, "float64")
    im = cast(ctx, im, "float64") if im is not None else None
    # the input samples used: truncated or zero-padded to what the transform reads
    used = length // 2 + 1 if (inverse and onesided) else length

    def fit(t):
        if t is None:
            return None
        n = n_in
        if n > used:
            t = e(_op.strided_slice(t, [rank - 2], [0], [used]))
        elif n < used:
            width = [(0, 0)] * (rank - 2) + [(0, used - n)]
            t = e(_op.pad(t, width, 0.0))
        return t
    re, im = fit(re), fit(im)
    n_out = length if not (onesided and not inverse) else length // 2 + 1
    if inverse and onesided:
        n_out = length
    kk = np.arange(used)[:, None]
    nn = np.arange(n_out)[None, :]
    theta = 2.0 * np.pi * kk * nn / length
    cos, sin = np.cos(theta), np.sin(theta)
    cst = lambda a: const(a.astype("float64"))  # noqa: E731
    if not inverse:
        out_re = e(_op.matmul(re, cst(cos)))
        out_im = e(_op.negative(e(_op.matmul(re, cst(sin)))))
        if im is not None:
            out_re = e(_op.add(out_re, e(_op.matmul(im, cst(sin)))))
            out_im = e(_op.add(out_im, e(_op.matmul(im, cst(cos)))))
    elif onesided:
        # irfft: the half spectrum, each bin but DC (and Nyquist) counted twice
        c = np.full((used, 1), 2.0)
        c[0] = 1.0
        if length % 2 == 0:
            c[-1] = 1.0
        out_re = e(_op.matmul(re, cst(c * cos / length)))
        if im is not None:
            out_re = e(_op.subtract(out_re, e(_op.matmul(im, cst(c * sin / length)))))
        out_im = None
    else:
        out_re = e(_op.matmul(re, cst(cos / length)))
        out_im = e(_op.matmul(re, cst(sin / length)))
        if im is not None:
            out_re = e(_op.subtract(out_re, e(_op.matmul(im, cst(sin / length)))))
            out_im = e(_op.add(out_im, e(_op.matmul(im, cst(cos / length)))))
    inv = [perm.index(i) for i in range(rank - 1)]

    def back(t):
        t = e(_op.permute_dims(t, inv))
        return e(_op.expand_dims(t, rank - 1))
    parts = [back(out_re)] + ([back(out_im)] if out_im is not None else [])
    y = e(_op.concat(parts, rank - 1)) if len(parts) > 1 else parts[0]
    return cast(ctx, y, d)
