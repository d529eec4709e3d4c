"""Convolutions: ``conv1d``, ``conv2d``, ``conv3d``, ``conv1d_transpose``, ``conv2d_transpose``.

Layouts are strings of dimension letters as in TVM: data ``N`` (batch), ``C`` (channels) and the
spatial ``D``/``H``/``W``; kernels ``O`` (output channels), ``I`` (input channels per group) and
the spatial letters — ``NCHW`` / ``NHWC`` data, ``OIHW`` / ``HWIO`` kernels (``IOHW`` for the
transposed convolution, as PyTorch and ONNX store it). Padding is an int, one value per spatial
dim, or begins-then-ends (``(top, left, bottom, right)`` in 2-D, as ONNX ``pads``).

Batch and spatial dims may be symbolic: the output spatial size is the expression
``(H + pad_begin + pad_end - dilation * (k - 1) - 1) // stride + 1``.

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo
>>> from tilecraft.relax.op.nn import conv2d
>>> x = Var("x", TensorStructInfo(("n", 3, "h", "w"), "float32"))
>>> w = Var("w", TensorStructInfo((16, 3, 3, 3), "float32"))
>>> conv2d(x, w, strides=2, padding=1).struct_info
Tensor((n, 16, (h + 1) // 2, (w + 1) // 2), 'float32')
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tilecraft.tensorir import te
from tilecraft.tensorir.arith import Analyzer
from tilecraft.tensorir.expr import IntImm, PrimExpr, floordiv, floormod

from ...expr import Expr, RelaxError
from ...struct_info import TensorStructInfo
from ..base import OpPattern, as_expr, call, register_op
from ..helpers import (call_te, check_equal_dims, dim_checks, fmt_dim, fmt_shape, out_name,
                       result_dtype)

__all__ = ["conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose"]

SPATIAL = {1: "W", 2: "HW", 3: "DHW"}
DIM_NAMES = {"D": "depth", "H": "height", "W": "width"}


# ---------------------------------------------------------------------------------------------
# attribute normalization (shared with pooling and resize)


def check_layout(op: str, layout, ndim: int, required: str, what: str) -> str:
    """``layout`` must be a permutation of ``required`` + the spatial letters of ``ndim``."""
    letters = required + SPATIAL[ndim]
    if not isinstance(layout, str) or len(layout) != len(letters) or \
            sorted(layout) != sorted(letters):
        example = {"NC": "N" + "C" + SPATIAL[ndim], "OI": "OI" + SPATIAL[ndim],
                   "IO": "IO" + SPATIAL[ndim]}.get(required, letters)
        raise RelaxError(f"{op}: unsupported {what} {layout!r}; it must be a permutation of the "
                         f"letters {letters!r} (e.g. {example!r})")
    return layout


def int_tuple(op: str, name: str, value, n: int, lo: int) -> tuple[int, ...]:
    """An int or ``n`` ints (one int also broadcasts), each ``>= lo``."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value),) * n
    try:
        value = tuple(value)
    except TypeError:
        raise RelaxError(f"{op}: {name} must be an int or {n} ints, got {value!r}") from None
    if len(value) == 1 and n > 1:
        value = value * n
    if len(value) != n or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                  for v in value):
        raise RelaxError(f"{op}: {name} must be an int or {n} ints, got {value!r}")
    value = tuple(int(v) for v in value)
    if any(v < lo for v in value):
        raise RelaxError(f"{op}: {name} must be >= {lo}, got {value}")
    return value


def pad_tuple(op: str, padding, n: int) -> tuple[int, ...]:
    """Padding as ``2 n`` ints: the begins of every spatial dim, then the ends."""
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        padding = (int(padding),) * (2 * n)
    try:
        padding = tuple(padding)
    except TypeError:
        raise RelaxError(f"{op}: padding must be an int or a tuple, got {padding!r}") from None
    if len(padding) == n:
        padding = padding + padding
    elif len(padding) == 1:
        padding = padding * (2 * n)
    if len(padding) != 2 * n or not all(isinstance(p, (int, np.integer)) and
                                        not isinstance(p, bool) for p in padding):
        ex = "(top, left, bottom, right)" if n == 2 else "(begin..., end...)"
        raise RelaxError(f"{op}: padding must be an int, {n} ints (symmetric) or {2 * n} ints "
                         f"{ex}, got {padding!r}")
    padding = tuple(int(p) for p in padding)
    if any(p < 0 for p in padding):
        raise RelaxError(f"{op}: padding must be non-negative, got {padding}")
    return padding


def tensor_shape(op: str, e: Expr, what: str, ndim: int | None = None):
    """The struct info of a tensor argument (and its shape or None), checking the rank."""
    si = e.struct_info
    if not isinstance(si, TensorStructInfo):
        raise RelaxError(f"{op}: {what} must be a tensor, got {si!r}", e)
    if ndim is not None and si.ndim not in (-1, ndim):
        raise RelaxError(f"{op}: {what} must be {ndim}-D, got {si!r}", e)
    return si


def simplify(e) -> PrimExpr:
    return Analyzer().simplify(e)


def check_positive(op: str, value: PrimExpr, what: str, detail: str = "") -> PrimExpr:
    if Analyzer().can_prove(value < 1):
        raise RelaxError(f"{op}: the output {what} would be {fmt_dim(value)}{detail}")
    return value


def pad_stage(data: te.Tensor, layout: str, spatial: str, begins: Sequence[int],
              extents: Sequence[PrimExpr], pad_value, name: str = "pad",
              avoid: Sequence[te.Tensor] = ()) -> te.Tensor:
    """``data`` padded along the ``spatial`` dims: the result's spatial dim ``i`` has extent
    ``extents[i]``, element ``y`` being ``data[y - begins[i]]`` inside the data and ``pad_value``
    outside. Returns ``data`` itself when nothing changes. The stage's name differs from those of
    ``data`` and the ``avoid`` tensors (kernel buffer names must be unique)."""
    ana = Analyzer()
    src_dims = [data.shape[layout.index(c)] for c in spatial]
    need = [b > 0 or not ana.can_prove(e - b <= d) for b, e, d in zip(begins, extents, src_dims)]
    if not any(need) and all(ana.can_prove_equal(e, d) for e, d in zip(extents, src_dims)):
        return data
    shape = list(data.shape)
    for c, e in zip(spatial, extents):
        shape[layout.index(c)] = simplify(e)

    def fcompute(*idx):
        src, conds = list(idx), []
        for c, b, e, d in zip(spatial, begins, extents, src_dims):
            ax = layout.index(c)
            y = idx[ax] - b if b else idx[ax]
            if b:
                conds.append(y >= 0)
            if not ana.can_prove(e - b <= d):
                conds.append(y < d)
            src[ax] = y
        val = data[tuple(src)]
        if not conds:
            return val
        pv = pad_value if isinstance(pad_value, PrimExpr) else te.const(pad_value, data.dtype)
        return te.if_then_else(te.all(*conds), val, pv)

    return te.compute(tuple(shape), fcompute, out_name(name, data, *avoid))


# ---------------------------------------------------------------------------------------------
# convolution


def _conv_attrs(op: str, n: int, attrs: dict, transpose: bool) -> dict:
    a = dict(attrs)
    a["strides"] = int_tuple(op, "strides", a.get("strides", 1), n, 1)
    a["padding"] = pad_tuple(op, a.get("padding", 0), n)
    a["dilation"] = int_tuple(op, "dilation", a.get("dilation", 1), n, 1)
    groups = a.get("groups", 1)
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
        raise RelaxError(f"{op}: groups must be a positive int, got {groups!r}")
    a["groups"] = int(groups)
    a["data_layout"] = check_layout(op, a.get("data_layout", "NC" + SPATIAL[n]), n, "NC",
                                    "data_layout")
    default_k = ("IO" if transpose else "OI") + SPATIAL[n]
    a["kernel_layout"] = check_layout(op, a.get("kernel_layout", default_k), n, "OI",
                                      "kernel_layout")
    a["out_layout"] = check_layout(op, a.get("out_layout") or a["data_layout"], n, "NC",
                                   "out_layout")
    if transpose:
        a["output_padding"] = int_tuple(op, "output_padding", a.get("output_padding", 0), n, 0)
        for p, s, d in zip(a["output_padding"], a["strides"], a["dilation"]):
            if p >= s and p >= d:
                raise RelaxError(f"{op}: output_padding {a['output_padding']} must be smaller "
                                 f"than the stride {a['strides']} or the dilation "
                                 f"{a['dilation']}")
    a["out_dtype"] = a.get("out_dtype") or ""
    return a


def _conv_shape(op: str, n: int, dshape, wshape, a: dict, transpose: bool,
                assume: list | None = None) -> tuple[PrimExpr, ...]:
    """The output shape (in ``out_layout``) of a convolution, checking the channels."""
    sp = SPATIAL[n]
    dl, kl, ol = a["data_layout"], a["kernel_layout"], a["out_layout"]
    g = a["groups"]
    ana = Analyzer()
    N, C = dshape[dl.index("N")], dshape[dl.index("C")]
    O, I = wshape[kl.index("O")], wshape[kl.index("I")]
    if isinstance(C, IntImm) and C.value % g:
        raise RelaxError(f"{op}: groups {g} does not divide the input channels {C.value}")
    if transpose:
        # weight (in_channels, out_channels / groups, k...): 'I' is all input channels
        check_equal_dims(op, ana, C, I, "the data channels and the weight's input channels "
                                        f"(kernel_layout {kl})", assume)
        out_c = simplify(O * g)
    else:
        if isinstance(O, IntImm) and O.value % g:
            raise RelaxError(f"{op}: groups {g} does not divide the output channels {O.value} "
                             f"(weight shape {fmt_shape(wshape)}, kernel_layout {kl})")
        ig = simplify(I * g)
        check_equal_dims(op, ana, C, ig, f"the data channels and the weight's input channels x "
                                         f"groups ({fmt_dim(I)} x {g}, weight shape "
                                         f"{fmt_shape(wshape)} in {kl})", assume)
        out_c = O
    out_sp = {}
    for i, c in enumerate(sp):
        H, k = dshape[dl.index(c)], wshape[kl.index(c)]
        s, d = a["strides"][i], a["dilation"][i]
        pb, pe = a["padding"][i], a["padding"][i + n]
        if transpose:
            o = simplify((H - 1) * s - pb - pe + d * (k - 1) + a["output_padding"][i] + 1)
            detail = (f" (input {DIM_NAMES[c]} {fmt_dim(H)}, kernel {fmt_dim(k)}, stride {s}, "
                      f"padding {pb}+{pe})")
        else:
            o = simplify(floordiv(H + (pb + pe - d * (k - 1) - 1), s) + 1)
            detail = (f" (input {DIM_NAMES[c]} {fmt_dim(H)} with padding {pb}+{pe} is smaller "
                      f"than the dilated kernel {fmt_dim(simplify(d * (k - 1) + 1))})")
        out_sp[c] = check_positive(op, o, DIM_NAMES[c], detail)
    dims = {"N": N, "C": out_c, **out_sp}
    return tuple(dims[c] for c in ol)


def _te_conv(data, weight, *, n, strides, padding, dilation, groups, data_layout, kernel_layout,
             out_layout, out_dtype, name):
    sp = SPATIAL[n]
    a = dict(strides=strides, padding=padding, dilation=dilation, groups=groups,
             data_layout=data_layout, kernel_layout=kernel_layout, out_layout=out_layout)
    out_shape = _conv_shape(name, n, data.shape, weight.shape, a, False)
    dl, kl, ol = data_layout, kernel_layout, out_layout
    H = [data.shape[dl.index(c)] for c in sp]
    K = [weight.shape[kl.index(c)] for c in sp]
    padded = pad_stage(data, dl, sp, padding[:n],
                       [simplify(h + (padding[i] + padding[i + n])) for i, h in enumerate(H)], 0,
                       avoid=[weight])
    I = weight.shape[kl.index("I")]
    ocpg = simplify(floordiv(weight.shape[kl.index("O")], groups))
    rc = te.reduce_axis((0, I), "rc")
    rk = [te.reduce_axis((0, k), "r" + c.lower()) for c, k in zip(sp, K)]

    def fcompute(*idx):
        oc = idx[ol.index("C")]
        chan = rc.var if groups == 1 else floordiv(oc, ocpg) * I + rc.var
        di = [None] * (n + 2)
        di[dl.index("N")] = idx[ol.index("N")]
        di[dl.index("C")] = chan
        wi = [None] * (n + 2)
        wi[kl.index("O")] = oc
        wi[kl.index("I")] = rc.var
        for i, c in enumerate(sp):
            y = idx[ol.index(c)]
            y = y * strides[i] if strides[i] != 1 else y
            r = rk[i].var * dilation[i] if dilation[i] != 1 else rk[i].var
            di[dl.index(c)] = y + r
            wi[kl.index(c)] = rk[i].var
        return te.sum(padded[tuple(di)].astype(out_dtype) * weight[tuple(wi)].astype(out_dtype),
                      axis=[rc] + rk)

    return te.compute(out_shape, fcompute, out_name(name.split(".")[-1], data, weight))


def _te_conv_transpose(data, weight, *, n, strides, padding, dilation, groups, output_padding,
                       data_layout, kernel_layout, out_layout, out_dtype, name):
    """Transposed convolution as a direct convolution of the stride-dilated, padded data with
    the flipped kernel: out[y] = sum_k P[y + k * d] * W[K - 1 - k], where P[t + off] is the data
    at t / stride (zero where t is not a multiple of the stride), off = d * (K - 1) - pad_begin.
    Without dilation and with static kernel sizes, a stride above 1 takes the phase form
    (``_te_conv_transpose_phased``), which skips the inserted zeros."""
    sp = SPATIAL[n]
    a = dict(strides=strides, padding=padding, dilation=dilation, groups=groups,
             output_padding=output_padding, data_layout=data_layout, kernel_layout=kernel_layout,
             out_layout=out_layout)
    out_shape = _conv_shape(name, n, data.shape, weight.shape, a, True)
    dl, kl, ol = data_layout, kernel_layout, out_layout
    H = [data.shape[dl.index(c)] for c in sp]
    K = [weight.shape[kl.index(c)] for c in sp]
    if any(st > 1 for st in strides) and all(d == 1 for d in dilation) and \
            all(isinstance(k, IntImm) for k in K):
        return _te_conv_transpose_phased(data, weight, n=n, strides=strides, padding=padding,
                                         groups=groups, data_layout=dl, kernel_layout=kl,
                                         out_layout=ol, out_dtype=out_dtype, name=name,
                                         out_shape=out_shape)
    out_sp = [out_shape[ol.index(c)] for c in sp]
    offs = [simplify(dilation[i] * (K[i] - 1) - padding[i]) for i in range(n)]
    ana = Analyzer()
    pshape = list(data.shape)
    for i, c in enumerate(sp):
        pshape[dl.index(c)] = simplify(out_sp[i] + dilation[i] * (K[i] - 1))

    def fpad(*idx):
        src, conds = list(idx), []
        for i, c in enumerate(sp):
            ax = dl.index(c)
            t = idx[ax] - offs[i]
            if not ana.can_prove(offs[i] <= 0):
                conds.append(t >= 0)
            if strides[i] != 1:
                conds.append(floormod(t, strides[i]) == 0)
                t = floordiv(t, strides[i])
            conds.append(t < H[i])
            src[ax] = t
        return te.if_then_else(te.all(*conds), data[tuple(src)], te.const(0, data.dtype))

    P = te.compute(tuple(pshape), fpad, out_name("dilate_pad", data, weight))
    channels = _TransposeChannels(data, weight, groups, n, dl, kl, ol)
    rc = channels.rc
    rk = [te.reduce_axis((0, k), "r" + c.lower()) for c, k in zip(sp, K)]

    def fcompute(*idx):
        di, wi = channels.indices(idx)
        for i, c in enumerate(sp):
            r = rk[i].var * dilation[i] if dilation[i] != 1 else rk[i].var
            di[dl.index(c)] = idx[ol.index(c)] + r
            wi[kl.index(c)] = K[i] - 1 - rk[i].var
        return te.sum(P[tuple(di)].astype(out_dtype) * weight[tuple(wi)].astype(out_dtype),
                      axis=[rc] + rk)

    return te.compute(out_shape, fcompute, out_name(name.split(".")[-1], data, weight))


class _TransposeChannels:
    """The channel reduction of a grouped transposed convolution (``IO...`` weight): the axis
    over a group's input channels, and for an output index the data and weight indices with
    the batch and channel entries filled in (the spatial ones are the caller's)."""

    def __init__(self, data, weight, groups, n, dl, kl, ol):
        self.icpg = simplify(floordiv(data.shape[dl.index("C")], groups))
        self.ocpg = weight.shape[kl.index("O")]
        self.rc = te.reduce_axis((0, self.icpg), "rc")
        self.groups, self.n, self.dl, self.kl, self.ol = groups, n, dl, kl, ol

    def indices(self, idx):
        dl, kl, ol = self.dl, self.kl, self.ol
        oc = idx[ol.index("C")]
        grouped = self.groups != 1
        chan = floordiv(oc, self.ocpg) * self.icpg + self.rc.var if grouped else self.rc.var
        di = [None] * (self.n + 2)
        di[dl.index("N")] = idx[ol.index("N")]
        di[dl.index("C")] = chan
        wi = [None] * (self.n + 2)
        wi[kl.index("I")] = chan
        wi[kl.index("O")] = floormod(oc, self.ocpg) if grouped else oc
        return di, wi


def _te_conv_transpose_phased(data, weight, *, n, strides, padding, groups, data_layout,
                              kernel_layout, out_layout, out_dtype, name, out_shape):
    """Transposed convolution by output phase, without the stride's inserted zeros.

    ``out[y] = sum_k x[(y + pb - k) / s] * W[k]`` over the taps ``k`` with ``y + pb - k`` a
    multiple of ``s``: with ``t = y + pb`` those are ``k = t % s + s * r`` for
    ``r < R = ceil(K / s)``, reading ``x[t // s - r]``. So every output sums ``R`` taps per
    dimension instead of ``K`` (``1 / s^2`` of the zero-dilated form's multiply-adds in 2-D:
    a 4x4 stride-2 kernel does 4 taps, not 16). Two small stages keep conditions out of the
    reduction: ``P`` is the data with ``R - 1`` zeros before and zeros after (``x[j]`` at
    ``j + R - 1``), and where ``s`` does not divide ``K`` the weight is zero-padded to
    ``R * s`` taps."""
    sp = SPATIAL[n]
    dl, kl, ol = data_layout, kernel_layout, out_layout
    H = [data.shape[dl.index(c)] for c in sp]
    K = [weight.shape[kl.index(c)].value for c in sp]
    R = [-(-k // st) for k, st in zip(K, strides)]
    out_sp = [out_shape[ol.index(c)] for c in sp]
    zero = te.const(0, data.dtype)

    pshape = list(data.shape)
    for i, c in enumerate(sp):
        pshape[dl.index(c)] = simplify(floordiv(out_sp[i] - 1 + padding[i], strides[i]) + R[i])

    def fpad(*idx):
        src, conds = list(idx), []
        for i, c in enumerate(sp):
            ax = dl.index(c)
            t = idx[ax] - (R[i] - 1)
            if R[i] > 1:
                conds.append(t >= 0)
            conds.append(t < H[i])
            src[ax] = t
        return te.if_then_else(te.all(*conds), data[tuple(src)], zero)

    P = te.compute(tuple(pshape), fpad, out_name("data_pad", data, weight))
    W = weight
    if any(k % st for k, st in zip(K, strides)):
        wshape = list(weight.shape)
        for i, c in enumerate(sp):
            wshape[kl.index(c)] = IntImm(R[i] * strides[i], "int64")

        def fwpad(*idx):
            conds = [idx[kl.index(c)] < K[i] for i, c in enumerate(sp) if K[i] % strides[i]]
            return te.if_then_else(te.all(*conds), weight[idx], te.const(0, weight.dtype))
        W = te.compute(tuple(wshape), fwpad, out_name("weight_pad", data, weight))
    channels = _TransposeChannels(data, weight, groups, n, dl, kl, ol)
    rc = channels.rc
    rk = [te.reduce_axis((0, r), "r" + c.lower()) for c, r in zip(sp, R)]

    def fcompute(*idx):
        di, wi = channels.indices(idx)
        for i, c in enumerate(sp):
            t = idx[ol.index(c)] + padding[i] if padding[i] else idx[ol.index(c)]
            st = strides[i]
            q, ph = (floordiv(t, st), floormod(t, st)) if st > 1 else (t, 0)
            di[dl.index(c)] = q - rk[i].var + (R[i] - 1)
            wi[kl.index(c)] = ph + rk[i].var * st if st > 1 else rk[i].var
        return te.sum(P[tuple(di)].astype(out_dtype) * W[tuple(wi)].astype(out_dtype),
                      axis=[rc] + rk)

    return te.compute(out_shape, fcompute, out_name(name.split(".")[-1], data, weight))


def _make_conv(n: int, transpose: bool):
    op = f"relax.nn.conv{n}d" + ("_transpose" if transpose else "")

    def infer(call_):
        a = _conv_attrs(op, n, call_.attr_dict, transpose)
        sd = tensor_shape(op, call_.args[0], "data", n + 2)
        sw = tensor_shape(op, call_.args[1], "weight", n + 2)
        dtype = result_dtype(op, [sd.dtype, sw.dtype], a["out_dtype"])
        if sd.shape is None or sw.shape is None:
            return TensorStructInfo(None, dtype, n + 2)
        return TensorStructInfo(_conv_shape(op, n, sd.shape, sw.shape, a, transpose), dtype)

    def legalize(bb, call_):
        a = _conv_attrs(op, n, call_.attr_dict, transpose)
        data, weight = call_.args
        assume: list = []
        _conv_shape(op, n, data.struct_info.shape, weight.struct_info.shape, a, transpose, assume)
        kw = {k: a[k] for k in ("strides", "padding", "dilation", "groups", "data_layout",
                                "kernel_layout", "out_layout")}
        if transpose:
            kw["output_padding"] = a["output_padding"]
        kw.update(n=n, out_dtype=call_.struct_info.dtype, name=op)
        return call_te(bb, _te_conv_transpose if transpose else _te_conv, data, weight,
                       checks=dim_checks(op, assume), primfunc_name_hint=op.split(".")[-1], **kw)

    register_op(op, infer, legalize, OpPattern.OUT_EWISE_FUSABLE,
                doc=f"{n}-D {'transposed ' if transpose else ''}convolution.")
    return op


def _conv_call(op, n, transpose, data, weight, attrs):
    a = _conv_attrs(op, n, attrs, transpose)
    return call(op, [as_expr(data), as_expr(weight)], a)


_CONV1D = _make_conv(1, False)
_CONV2D = _make_conv(2, False)
_CONV3D = _make_conv(3, False)
_CONV1D_T = _make_conv(1, True)
_CONV2D_T = _make_conv(2, True)


def conv2d(data, weight, strides=(1, 1), padding=(0, 0), dilation=(1, 1), groups: int = 1,
           data_layout: str = "NCHW", kernel_layout: str = "OIHW", out_layout: str | None = None,
           out_dtype: str | None = None) -> Expr:
    """2-D convolution (cross-correlation, as in every framework).

    Parameters
    ----------
    data : Expr
        ``(N, C, H, W)`` in ``data_layout`` (``NCHW`` or ``NHWC``, any permutation works).
    weight : Expr
        ``(O, C / groups, KH, KW)`` in ``kernel_layout`` (``OIHW``, ``HWIO``, ...).
    strides, dilation : int or (int, int)
    padding : int, (pad_h, pad_w) or (top, left, bottom, right)
    groups : int
        Channel groups; ``groups == C`` with ``C / groups == 1`` is a depthwise convolution.
    out_layout : str, optional
        Layout of the result (default ``data_layout``).
    out_dtype : str, optional
        Accumulation / result dtype (operands are cast to it); default the data dtype.

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo
    >>> x = Var("x", TensorStructInfo(("n", 224, 224, 3), "float32"))
    >>> w = Var("w", TensorStructInfo((7, 7, 3, 64), "float32"))
    >>> conv2d(x, w, strides=2, padding=3, data_layout="NHWC", kernel_layout="HWIO").struct_info
    Tensor((n, 112, 112, 64), 'float32')
    """
    return _conv_call(_CONV2D, 2, False, data, weight, dict(
        strides=strides, padding=padding, dilation=dilation, groups=groups,
        data_layout=data_layout, kernel_layout=kernel_layout, out_layout=out_layout,
        out_dtype=out_dtype))


def conv1d(data, weight, strides=1, padding=0, dilation=1, groups: int = 1,
           data_layout: str = "NCW", kernel_layout: str = "OIW", out_layout: str | None = None,
           out_dtype: str | None = None) -> Expr:
    """1-D convolution; ``data`` ``(N, C, W)`` (``NCW`` / ``NWC``), ``weight`` ``(O, C/groups,
    K)`` (``OIW`` / ``WIO``); padding an int, ``(p,)`` or ``(begin, end)``. See ``conv2d``.

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo
    >>> x = Var("x", TensorStructInfo(("n", 4, "l"), "float32"))
    >>> w = Var("w", TensorStructInfo((8, 4, 3), "float32"))
    >>> conv1d(x, w, padding=1).struct_info
    Tensor((n, 8, l), 'float32')
    """
    return _conv_call(_CONV1D, 1, False, data, weight, dict(
        strides=strides, padding=padding, dilation=dilation, groups=groups,
        data_layout=data_layout, kernel_layout=kernel_layout, out_layout=out_layout,
        out_dtype=out_dtype))


def conv3d(data, weight, strides=1, padding=0, dilation=1, groups: int = 1,
           data_layout: str = "NCDHW", kernel_layout: str = "OIDHW",
           out_layout: str | None = None, out_dtype: str | None = None) -> Expr:
    """3-D convolution (``NCDHW`` / ``NDHWC`` data, ``OIDHW`` / ``DHWIO`` kernels); padding an
    int, 3 ints or 6 (front, top, left, back, bottom, right). See ``conv2d``.

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo
    >>> x = Var("x", TensorStructInfo((1, 2, 5, 6, 7), "float32"))
    >>> w = Var("w", TensorStructInfo((4, 2, 3, 3, 3), "float32"))
    >>> conv3d(x, w).struct_info
    Tensor((1, 4, 3, 4, 5), 'float32')
    """
    return _conv_call(_CONV3D, 3, False, data, weight, dict(
        strides=strides, padding=padding, dilation=dilation, groups=groups,
        data_layout=data_layout, kernel_layout=kernel_layout, out_layout=out_layout,
        out_dtype=out_dtype))


def conv2d_transpose(data, weight, strides=(1, 1), padding=(0, 0), output_padding=(0, 0),
                     dilation=(1, 1), groups: int = 1, data_layout: str = "NCHW",
                     kernel_layout: str = "IOHW", out_layout: str | None = None,
                     out_dtype: str | None = None) -> Expr:
    """2-D transposed convolution (the gradient of ``conv2d``), as PyTorch ``ConvTranspose2d``
    and ONNX ``ConvTranspose``. With a stride and no dilation the kernel works by output phase:
    each output sums only the ``ceil(K / s)`` taps per dimension that meet an input pixel (a 4x4
    stride-2 kernel: 4 taps, not the 16 of a convolution over the zero-dilated input).

    ``weight`` is ``(C, O / groups, KH, KW)`` (``IOHW``); the output spatial size is
    ``(H - 1) * stride - pad_begin - pad_end + dilation * (K - 1) + output_padding + 1`` and the
    output has ``O`` = ``weight.shape[1] * groups`` channels.

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo
    >>> x = Var("x", TensorStructInfo(("n", 8, 5, 5), "float32"))
    >>> w = Var("w", TensorStructInfo((8, 4, 3, 3), "float32"))
    >>> conv2d_transpose(x, w, strides=2, padding=1, output_padding=1).struct_info
    Tensor((n, 4, 10, 10), 'float32')
    """
    return _conv_call(_CONV2D_T, 2, True, data, weight, dict(
        strides=strides, padding=padding, output_padding=output_padding, dilation=dilation,
        groups=groups, data_layout=data_layout, kernel_layout=kernel_layout,
        out_layout=out_layout, out_dtype=out_dtype))


def conv1d_transpose(data, weight, strides=1, padding=0, output_padding=0, dilation=1,
                     groups: int = 1, data_layout: str = "NCW", kernel_layout: str = "IOW",
                     out_layout: str | None = None, out_dtype: str | None = None) -> Expr:
    """1-D transposed convolution (``NCW`` data, ``IOW`` weight). See ``conv2d_transpose``.

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo
    >>> x = Var("x", TensorStructInfo((1, 4, "l"), "float32"))
    >>> w = Var("w", TensorStructInfo((4, 2, 3), "float32"))
    >>> conv1d_transpose(x, w, strides=2).struct_info
    Tensor((1, 2, l * 2 + 1), 'float32')
    """
    return _conv_call(_CONV1D_T, 1, True, data, weight, dict(
        strides=strides, padding=padding, output_padding=output_padding, dilation=dilation,
        groups=groups, data_layout=data_layout, kernel_layout=kernel_layout,
        out_layout=out_layout, out_dtype=out_dtype))
