"""Image operators: ``relax.op.image.resize2d`` (nearest, linear, cubic), as ONNX ``Resize``,
PyTorch ``interpolate`` and TVM ``image.resize2d``.

The output size may be symbolic. Coordinates map from the output to the input with
``coordinate_transformation_mode``: ``half_pixel`` (``(x + 0.5) / scale - 0.5``),
``pytorch_half_pixel`` (the same, 0 when the output size is 1), ``align_corners``
(``x * (in - 1) / (out - 1)``), ``asymmetric`` (``x / scale``) or ``tf_half_pixel_for_nn``
(``(x + 0.5) / scale``), with ``scale = out / in`` unless ``scales`` are given (ONNX ``Resize``
with ``scales``: the given factors are used in the transform, not the rounded size ratio).
Computation is in float32 (float64 for float64 data), as onnxruntime does.

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo
>>> from tilecraft.relax.op import image
>>> x = Var("x", TensorStructInfo(("n", 3, 32, 32), "float32"))
>>> image.resize2d(x, (64, 48), method="linear").struct_info
Tensor((n, 3, 64, 48), 'float32')
"""
from __future__ import annotations

from typing import Sequence

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import FloatImm, IntImm, PrimExpr, Select, max_, min_

from ..expr import Expr, RelaxError, ShapeExpr
from ..struct_info import ShapeStructInfo, TensorStructInfo
from .base import OpPattern, as_expr, call, register_op
from .helpers import out_name
from .nn.conv import check_layout, tensor_shape

__all__ = ["resize2d"]

_OP = "relax.image.resize2d"
_METHODS = {"nearest": "nearest", "nearest_neighbor": "nearest", "linear": "linear",
            "bilinear": "linear", "cubic": "cubic", "bicubic": "cubic"}
_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
          "tf_half_pixel_for_nn")
_ROUNDING = ("round", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize_attrs(attrs: dict) -> dict:
    a = dict(attrs)
    method = a.get("method", "linear")
    if method not in _METHODS:
        raise RelaxError(f"{_OP}: unsupported method {method!r}; use one of "
                         f"{sorted(set(_METHODS))}")
    a["method"] = _METHODS[method]
    mode = a.get("coordinate_transformation_mode", "half_pixel")
    if mode not in _MODES:
        raise RelaxError(f"{_OP}: unsupported coordinate_transformation_mode {mode!r}; use one of "
                         f"{list(_MODES)} (tf_crop_and_resize is not supported)")
    rounding = a.get("rounding_method") or "round"
    if rounding not in _ROUNDING:
        raise RelaxError(f"{_OP}: unsupported rounding_method {rounding!r}; use one of "
                         f"{list(_ROUNDING)}")
    a["rounding_method"] = rounding
    a["layout"] = check_layout(_OP, a.get("layout", "NCHW"), 2, "NC", "layout")
    a["cubic_alpha"] = float(a.get("cubic_alpha", -0.75))
    a["cubic_exclude"] = int(bool(a.get("cubic_exclude", 0)))
    scales = a.get("scales")
    if scales is not None:
        scales = tuple(float(s) for s in scales)
        if len(scales) != 2 or any(s <= 0 for s in scales):
            raise RelaxError(f"{_OP}: scales must be two positive numbers (height, width), got "
                             f"{a.get('scales')!r}")
    a["scales"] = scales
    a["out_dtype"] = a.get("out_dtype") or ""
    return a


def _size_values(size_expr: Expr):
    si = size_expr.struct_info
    if isinstance(size_expr, ShapeExpr):
        return size_expr.values
    if isinstance(si, ShapeStructInfo):
        if si.ndim not in (-1, 2):
            raise RelaxError(f"{_OP}: size must have 2 values (height, width), got {si!r}")
        return si.values
    raise RelaxError(f"{_OP}: size must be a shape (height, width), got {si!r}")


def _infer_resize(call_):
    a = _resize_attrs(call_.attr_dict)
    si = tensor_shape(_OP, call_.args[0], "data", 4)
    size = _size_values(call_.args[1])
    if size is not None and len(size) != 2:
        raise RelaxError(f"{_OP}: size must have 2 values (height, width), got {len(size)}")
    dtype = a["out_dtype"] or si.dtype
    if si.shape is None or size is None:
        return TensorStructInfo(None, dtype, 4)
    lay = a["layout"]
    dims = {"N": si.shape[lay.index("N")], "C": si.shape[lay.index("C")], "H": size[0],
            "W": size[1]}
    return TensorStructInfo(tuple(dims[c] for c in lay), dtype)


def _in_coord(x: PrimExpr, in_size: PrimExpr, out_size: PrimExpr, mode: str, scale, f: str):
    """The input coordinate (float ``f``) that output index ``x`` samples; the arithmetic order
    follows onnxruntime so ties in nearest rounding come out the same."""
    xf = x.astype(f)
    inf, outf = in_size.astype(f), out_size.astype(f)
    if scale is None:
        sc = outf / inf
    else:   # a number, or a value the kernel reads (scales computed at run time)
        sc = scale.astype(f) if isinstance(scale, PrimExpr) else FloatImm(scale, f)
    half = FloatImm(0.5, f)
    if mode == "half_pixel":
        return (xf + half) / sc - half
    if mode == "pytorch_half_pixel":
        return Select(out_size > 1, (xf + half) / sc - half, FloatImm(0.0, f))
    if mode == "tf_half_pixel_for_nn":
        return (xf + half) / sc
    if mode == "asymmetric":
        return xf / sc
    # align_corners
    one = FloatImm(1.0, f)
    if scale is not None:
        outf = inf * sc   # ONNX Resize with scales: the unrounded resized length
    return Select(out_size > 1, xf * (inf - one) / max_(outf - one, one), FloatImm(0.0, f))


def _clamp(i: PrimExpr, n: PrimExpr) -> PrimExpr:
    return min_(max_(i, IntImm(0, "int64")), n - 1)


def _round(v: PrimExpr, method: str) -> PrimExpr:
    half = FloatImm(0.5, v.dtype)
    if method == "floor":
        r = te.floor(v)
    elif method == "ceil":
        r = te.ceil(v)
    elif method == "round_prefer_ceil":
        r = te.floor(v + half)
    elif method == "round_prefer_floor":
        r = te.ceil(v - half)
    else:  # "round": half away from zero (std::round), written out so every backend agrees
        r = Select(v >= FloatImm(0.0, v.dtype), te.floor(v + half), te.ceil(v - half))
    return r.astype("int64")


def _cubic_coeffs(s: PrimExpr, A: float, f: str) -> list[PrimExpr]:
    """Keys' cubic convolution weights of the taps at offsets -1, 0, 1, 2 (onnxruntime's form)."""
    c = lambda v: FloatImm(v, f)  # noqa: E731
    one, two = c(1.0), c(2.0)
    s1, s2, s3 = s + one, one - s, two - s
    return [((c(A) * s1 - c(5 * A)) * s1 + c(8 * A)) * s1 - c(4 * A),
            ((c(A + 2) * s - c(A + 3)) * s) * s + one,
            ((c(A + 2) * s2 - c(A + 3)) * s2) * s2 + one,
            ((c(A) * s3 - c(5 * A)) * s3 + c(8 * A)) * s3 - c(4 * A)]


def _te_resize(data, *, size, layout, method, coordinate_transformation_mode, rounding_method,
               cubic_alpha, cubic_exclude, scales, out_dtype):
    f = "float64" if data.dtype == "float64" else "float32"
    lay = layout
    ins = {c: data.shape[lay.index(c)] for c in "HW"}
    outs = {"H": size[0], "W": size[1]}
    scale = {"H": scales[0] if scales else None, "W": scales[1] if scales else None}
    out_shape = tuple({"N": data.shape[lay.index("N")], "C": data.shape[lay.index("C")],
                       **outs}[c] for c in lay)

    def load(idx, yi, xi):
        src = list(idx)
        src[lay.index("H")], src[lay.index("W")] = yi, xi
        return data[tuple(src)].astype(f)

    def coord(idx, c):
        return _in_coord(idx[lay.index(c)], ins[c], outs[c], coordinate_transformation_mode,
                         scale[c], f)

    def fnearest(*idx):
        yi = _clamp(_round(coord(idx, "H"), rounding_method), ins["H"])
        xi = _clamp(_round(coord(idx, "W"), rounding_method), ins["W"])
        src = list(idx)
        src[lay.index("H")], src[lay.index("W")] = yi, xi
        return data[tuple(src)].astype(out_dtype)

    def flinear(*idx):
        taps = {}
        for c in "HW":
            n = ins[c]
            v = max_(min_(coord(idx, c), (n - 1).astype(f)), FloatImm(0.0, f))
            i0 = _clamp(te.floor(v).astype("int64"), n)
            i1 = min_(i0 + 1, n - 1)
            w = v - i0.astype(f)
            taps[c] = [(i0, FloatImm(1.0, f) - w), (i1, w)]
        acc = None
        for yi, wy in taps["H"]:
            row = None
            for xi, wx in taps["W"]:
                t = load(idx, yi, xi) * wx
                row = t if row is None else row + t
            t = row * wy
            acc = t if acc is None else acc + t
        return acc.astype(out_dtype)

    def fcubic(*idx):
        taps = {}
        for c in "HW":
            n = ins[c]
            v = coord(idx, c)
            fl = te.floor(v)
            base = fl.astype("int64")
            ws = _cubic_coeffs(v - fl, cubic_alpha, f)
            ids = [base + k for k in (-1, 0, 1, 2)]
            if cubic_exclude:
                # weights of taps outside the input are dropped and the rest renormalized
                ws = [Select((i >= 0) & (i < n), w, FloatImm(0.0, f)) for i, w in zip(ids, ws)]
                total = ws[0] + ws[1] + ws[2] + ws[3]
                ws = [w / total for w in ws]
            taps[c] = [(_clamp(i, n), w) for i, w in zip(ids, ws)]
        acc = None
        for yi, wy in taps["H"]:
            row = None
            for xi, wx in taps["W"]:
                t = load(idx, yi, xi) * wx
                row = t if row is None else row + t
            t = row * wy
            acc = t if acc is None else acc + t
        return acc.astype(out_dtype)

    # Indices are clamped to [0, n - 1]. With static input sizes the bounds verifier proves every
    # load in range; with symbolic ones it adds run-time checks (it cannot bound a symbolic Min).
    fcompute = {"nearest": fnearest, "linear": flinear, "cubic": fcubic}[method]
    return te.compute(out_shape, fcompute, out_name("resize2d", data))


def _legalize_resize(bb, call_):
    a = _resize_attrs(call_.attr_dict)
    size = _size_values(call_.args[1])
    if size is None:
        raise RelaxError(f"{_OP}: the output size must be known to legalize (match_cast it)")
    return bb.call_te(_te_resize, call_.args[0], size=tuple(size), layout=a["layout"],
                      method=a["method"],
                      coordinate_transformation_mode=a["coordinate_transformation_mode"],
                      rounding_method=a["rounding_method"], cubic_alpha=a["cubic_alpha"],
                      cubic_exclude=a["cubic_exclude"], scales=a["scales"],
                      out_dtype=call_.struct_info.dtype, primfunc_name_hint="resize2d")


register_op(_OP, _infer_resize, _legalize_resize, OpPattern.INJECTIVE,
            doc="2-D image resize (nearest / linear / cubic).")


def resize2d(data, size, roi=None, layout: str = "NCHW", method: str = "linear",
             coordinate_transformation_mode: str = "half_pixel", rounding_method: str = "round",
             cubic_alpha: float = -0.75, cubic_exclude: int = 0, extrapolation_value: float = 0.0,
             out_dtype: str | None = None, scales: Sequence[float] | None = None) -> Expr:
    """Resize the spatial dims of ``data`` to ``size``.

    Parameters
    ----------
    data : Expr
        ``(N, C, H, W)`` (``layout`` ``NCHW``; ``NHWC`` works too).
    size : int, (height, width) or a shape Expr
        The output size; entries may be symbolic (``"h2"`` strings or PrimExprs).
    method : "nearest", "linear" ("bilinear") or "cubic" ("bicubic")
    coordinate_transformation_mode : str
        ``half_pixel`` (default), ``pytorch_half_pixel``, ``align_corners``, ``asymmetric``,
        ``tf_half_pixel_for_nn``.
    rounding_method : str
        For nearest: ``round`` (half away from zero), ``round_prefer_floor`` (ONNX's default),
        ``round_prefer_ceil``, ``floor``, ``ceil``.
    cubic_alpha, cubic_exclude : float, int
        Cubic kernel coefficient (-0.75 as PyTorch and ONNX) and ONNX ``exclude_outside``.
    scales : (float, float), optional
        The scale factors the coordinate transform uses instead of ``size / input size``.
    roi, extrapolation_value :
        Only for ``tf_crop_and_resize``, which is not supported (``roi`` must be None).

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo
    >>> x = Var("x", TensorStructInfo((1, 3, "h", "w"), "float32"))
    >>> resize2d(x, ("h2", "w2"), method="nearest").struct_info
    Tensor((1, 3, h2, w2), 'float32')
    """
    if roi is not None:
        raise RelaxError(f"{_OP}: roi (tf_crop_and_resize) is not supported")
    if isinstance(size, Expr):
        size_expr = size
    else:
        if isinstance(size, (int, str, PrimExpr)):
            size = (size, size)
        size_expr = ShapeExpr(tuple(size))
    attrs = _resize_attrs(dict(layout=layout, method=method,
                               coordinate_transformation_mode=coordinate_transformation_mode,
                               rounding_method=rounding_method, cubic_alpha=cubic_alpha,
                               cubic_exclude=cubic_exclude, scales=scales, out_dtype=out_dtype))
    del extrapolation_value  # only meaningful with roi
    return call(_OP, [as_expr(data), size_expr], attrs)
