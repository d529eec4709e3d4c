"""Resize (opsets 10 to 19) and Upsample, through ``relax.op.image.resize2d``.

The resized axes are the last two of a 4-D input (NCHW); output sizes come from ``sizes`` or
``floor(in * scales)``, with ``axes`` and ``keep_aspect_ratio_policy``. With ``scales`` the
coordinate transform uses the given factors, as ONNX says. ``scales`` and ``sizes`` may be
computed at run time: the output dims are then fresh symbolic dims, and the factors the
transform uses (the scales, or the ratio ``keep_aspect_ratio_policy`` picks) are read by the
kernel from a small float64 tensor.
"""
from __future__ import annotations

import math

import numpy as np

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import Cast, FloatImm, FloorMod, IntImm, Select

from .... import op as _op
from ....expr import const
from ....op.image import _te_resize
from ..emit import emit_kernel
from ..registry import ConversionError, converter
from .common import cast, int_vector, norm_axes, runtime_ints, static_int, static_length

_MODES = {"nearest", "linear", "cubic"}
_COORD = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
          "tf_half_pixel_for_nn"}
_NEAREST = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}


def _resize_check(node):
    out = []
    if node.op_type == "Upsample":
        if node.attr("mode", "nearest") not in ("nearest", "linear", "bilinear"):
            out.append(f"mode {node.attr('mode')!r} is not supported")
        return out
    mode = node.attr("mode", "nearest")
    if mode not in _MODES:
        out.append(f"mode {mode!r} is not supported")
    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    if node.version >= 11 and coord not in _COORD:
        out.append(f"coordinate_transformation_mode {coord!r} is not supported")
    if node.attr("nearest_mode", "round_prefer_floor") not in _NEAREST:
        out.append(f"nearest_mode {node.attr('nearest_mode')!r} is not supported")
    if node.attr("antialias", 0):
        out.append("antialias=1 is not supported")
    return out


def _resize(ctx, node, x, scales, sizes, mode, coord, nearest, cubic_a, exclude):
    xs = ctx.shape(x)
    rank = len(xs)
    if rank != 4:
        raise ConversionError(f"Resize of a rank-{rank} tensor (only 4-D NCHW)")
    axes = node.attr("axes")
    axes = norm_axes(axes, rank) if axes is not None else list(range(rank))
    full_scales = [1.0] * rank
    out = list(xs)
    use_scales = None
    if sizes is not None:
        if len(sizes) != len(axes):
            raise ConversionError(f"Resize: {len(sizes)} sizes for {len(axes)} axes")
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            ins = [static_int(xs[a]) for a in axes]
            if any(i is None for i in ins) or any(not isinstance(s, int) for s in sizes):
                raise ConversionError("keep_aspect_ratio_policy needs static sizes")
            ratios = [s / i for s, i in zip(sizes, ins)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [int(math.floor(i * r + 0.5)) for i in ins]
            for a, s, i in zip(axes, sizes, ins):
                full_scales[a] = r
            use_scales = None
        for a, s in zip(axes, sizes):
            out[a] = s
    else:
        if len(scales) != len(axes):
            raise ConversionError(f"Resize: {len(scales)} scales for {len(axes)} axes")
        for a, s in zip(axes, scales):
            full_scales[a] = float(s)
            d = static_int(xs[a])
            if d is None:
                out[a] = Cast("int64", Cast("float64", xs[a]) * FloatImm(float(s), "float64"))
            else:
                out[a] = int(math.floor(d * float(s)))
        use_scales = (full_scales[2], full_scales[3])
    for a in (0, 1):
        if static_int(out[a]) != static_int(xs[a]) or full_scales[a] != 1.0:
            if not (static_int(out[a]) is None and static_int(xs[a]) is None):
                raise ConversionError("Resize of the batch or channel dims is not supported")
    method = {"nearest": "nearest", "linear": "linear", "cubic": "cubic"}[mode]
    return _op.image.resize2d(x, (out[2], out[3]), method=method,
                              coordinate_transformation_mode=coord, rounding_method=nearest,
                              cubic_alpha=cubic_a, cubic_exclude=exclude, scales=use_scales)


def _floats(ctx, node, i, what):
    """Input ``i`` as floats when known at import time, else None."""
    v = ctx.known(node, i)
    if v is None or v.dtype == object:
        return None
    return [float(s) for s in np.asarray(v).reshape(-1)]


def _runtime_resize(ctx, node, x, scales, sizes, mode, coord, nearest, cubic_a, exclude):
    """Resize with ``scales`` or ``sizes`` (keep_aspect_ratio_policy) computed at run time
    (int64 / float tensors with one entry per axis): the output dims as fresh dims, the
    factors of the coordinate transform read by the kernel."""
    xs = ctx.shape(x)
    rank = len(xs)
    if rank != 4:
        raise ConversionError(f"Resize of a rank-{rank} tensor (only 4-D NCHW)")
    axes = node.attr("axes")
    axes = norm_axes(axes, rank) if axes is not None else list(range(rank))
    e = ctx.emit
    f64 = "float64"
    given = scales if scales is not None else sizes
    if static_length(ctx, given, "scales" if scales is not None else "sizes") != len(axes):
        raise ConversionError(f"Resize: {static_length(ctx, given, 'scales')} entries for "
                              f"{len(axes)} axes")
    # the entries per dim of the input (1.0 for dims not in axes)
    where = const(np.array([axes.index(k) if k in axes else len(axes) for k in range(rank)],
                           np.int64))
    dims = cast(ctx, int_vector(ctx, list(xs)), f64)
    if scales is not None:
        sc = e(_op.concat([cast(ctx, scales, f64), const(np.ones(1))], 0))
        full = e(_op.take(sc, where, 0))
        out = e(_op.floor(e(_op.multiply(dims, full))))
    else:
        in_axes = cast(ctx, int_vector(ctx, [xs[a] for a in axes]), f64)
        ratio = e(_op.divide(cast(ctx, sizes, f64), in_axes))
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        r = e((_op.min if policy == "not_larger" else _op.max)(ratio, keepdims=True))
        in_axes_mask = const(np.array([k in axes for k in range(rank)]))
        full = e(_op.where(in_axes_mask, r, const(np.ones(1))))
        out = e(_op.floor(e(_op.add(e(_op.multiply(dims, full)), const(np.array(0.5))))))
    # the batch and channel dims must stay (checked when the model runs)
    out_dims = ctx.runtime_dims(cast(ctx, out, "int64"), "size", [xs[0], xs[1], None, None])
    oh, ow = out_dims[2], out_dims[3]
    out_dtype = ctx.dtype(x)

    def kernel(data, s):
        return _te_resize(data, size=(oh, ow), layout="NCHW", method=mode,
                          coordinate_transformation_mode=coord, rounding_method=nearest,
                          cubic_alpha=cubic_a, cubic_exclude=exclude, scales=(s[2], s[3]),
                          out_dtype=out_dtype)
    return emit_kernel(ctx, kernel, x, full, name="resize2d", scalars=[oh, ow])


@converter("Resize", family="image", check=_resize_check,
           doc="resize the spatial dims (nearest, linear, cubic; scales or sizes)")
def _resize_conv(ctx, node):
    x = ctx.input(node, 0)
    mode = node.attr("mode", "nearest")
    if node.version < 11:
        scales = _floats(ctx, node, 1, "scales")
        if scales is None:
            return _runtime_resize(ctx, node, x, ctx.input(node, 1), None, mode, "asymmetric",
                                   "floor", -0.75, 0)
        return _resize(ctx, node, x, scales, None, mode, "asymmetric", "floor", -0.75, 0)
    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    nearest = node.attr("nearest_mode", "round_prefer_floor")
    cubic_a = node.attr("cubic_coeff_a", -0.75)
    exclude = node.attr("exclude_outside", 0)
    sizes = None
    scales = None
    if node.has_input(3):
        sizes = ctx.maybe_ints(node, 3)
        if sizes is not None and node.attr("keep_aspect_ratio_policy", "stretch") != \
                "stretch" and not all(isinstance(v, int) for v in sizes):
            sizes = None
        if sizes is None:
            if node.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
                return _runtime_resize(ctx, node, x, None, runtime_ints(ctx, node, 3, "sizes"),
                                       mode, coord, nearest, cubic_a, exclude)
            xs = ctx.shape(x)
            axes = node.attr("axes")
            axes = norm_axes(axes, len(xs)) if axes is not None else list(range(len(xs)))
            # the resized axes get fresh dims; any other entry must equal the input's dim
            expected = [None if a >= 2 else xs[a] for a in axes]
            sizes = list(ctx.runtime_dims(runtime_ints(ctx, node, 3, "sizes"), "size",
                                          expected))
    if sizes is None and node.has_input(2):
        scales = _floats(ctx, node, 2, "scales")
        if scales is None:
            t = ctx.input(node, 2)
            if static_int(ctx.shape(t)[0]) != 0:
                return _runtime_resize(ctx, node, x, t, None, mode, coord, nearest, cubic_a,
                                       exclude)
        if not scales:
            scales = None
    if sizes is None and scales is None:
        raise ConversionError("Resize needs scales or sizes")
    return _resize(ctx, node, x, scales, sizes, mode, coord, nearest, cubic_a, exclude)


@converter("Upsample", family="image", check=_resize_check,
           doc="nearest / linear upsampling by scales (asymmetric)")
def _upsample(ctx, node):
    x = ctx.input(node, 0)
    scales = node.attr("scales") if node.version < 9 else _floats(ctx, node, 1, "scales")
    mode = node.attr("mode", "nearest")
    mode = "linear" if mode in ("linear", "bilinear") else "nearest"
    if scales is None:
        return _runtime_resize(ctx, node, x, ctx.input(node, 1), None, mode, "asymmetric",
                               "floor", -0.75, 0)
    return _resize(ctx, node, x, scales, None, mode, "asymmetric", "floor", -0.75, 0)


# ---------------------------------------------------------------------------------------------
# GridSample


def _grid_check(node):
    out = []
    mode = node.attr("mode", "linear" if node.version >= 20 else "bilinear")
    if mode not in ("linear", "bilinear", "nearest", "cubic", "bicubic"):
        out.append(f"mode {mode!r} is not supported")
    if node.attr("padding_mode", "zeros") not in ("zeros", "border", "reflection"):
        out.append(f"padding_mode {node.attr('padding_mode')!r} is not supported")
    return out


@converter("GridSample", family="image", check=_grid_check,
           doc="sample at grid coordinates (nearest, linear, cubic; zeros, border, reflection "
               "padding; 2-D and 3-D)")
def _grid_sample(ctx, node):
    import itertools
    x, grid = ctx.input(node, 0), ctx.input(node, 1)
    xs, gs = ctx.shape(x), ctx.shape(grid)
    r = len(xs) - 2
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(
        node.attr("mode", "linear" if node.version >= 20 else "bilinear"),
        node.attr("mode", "linear" if node.version >= 20 else "bilinear"))
    pad = node.attr("padding_mode", "zeros")
    align = bool(node.attr("align_corners", 0))
    if static_int(gs[-1]) != r:
        raise ConversionError(f"GridSample: the grid's last dim must be {r}")
    out_shape = (xs[0], xs[1]) + tuple(gs[1:-1])
    d = ctx.dtype(x)
    f32 = "float32" if d != "float64" else "float64"

    def c(v):
        return FloatImm(float(v), f32)

    def reflect(v, lo, hi):
        rng = hi - lo
        below = v < lo
        dx = Select(below, lo - v, v - hi)
        n = Cast("int64", dx / Select(rng == c(0), c(1), rng))
        rem = dx - Cast(f32, n) * rng
        even = FloorMod(n, IntImm(2, "int64")) == IntImm(0, "int64")
        from_low = Select(even, lo + rem, hi - rem)
        from_high = Select(even, hi - rem, lo + rem)
        return Select(below, from_low, Select(v > hi, from_high, v))

    def kernel(data, g):
        def f(*o):
            n, ch, pos = o[0], o[1], o[2:]
            coords = []
            for i in range(r):
                size = Cast(f32, data.shape[2 + i])
                gv = Cast(f32, g[(n,) + tuple(pos) + (IntImm(r - 1 - i, "int64"),)])
                if align:
                    xv = (gv + c(1)) / c(2) * (size - c(1))
                    lo, hi = c(0), size - c(1)
                else:
                    xv = ((gv + c(1)) * size - c(1)) / c(2)
                    lo, hi = c(-0.5), size - c(0.5)
                if mode == "nearest":
                    xv = te.round(xv)
                if pad == "border":
                    xv = Select((xv < lo) | (xv > hi),
                                te.min(te.max(xv, c(0)), size - c(1)), xv)
                elif pad == "reflection":
                    xv = reflect(xv, lo, hi)
                coords.append((xv, size, lo, hi))

            def pixel(idx):
                """data at integer taps with the padding rule; (value, in-range)"""
                src, inside = [], []
                for i, ((_, size, lo, hi), t) in enumerate(zip(coords, idx)):
                    n_i = data.shape[2 + i]
                    if pad == "zeros":
                        inside += [t >= IntImm(0, "int64"), t < n_i]
                        src.append(te.min(te.max(t, IntImm(0, "int64")), n_i - 1))
                    elif pad == "border":
                        src.append(te.min(te.max(t, IntImm(0, "int64")), n_i - 1))
                    else:
                        rt = Cast("int64", reflect(Cast(f32, t), lo, hi))
                        src.append(te.min(te.max(rt, IntImm(0, "int64")), n_i - 1))
                v = Cast(f32, data[(n, ch) + tuple(src)])
                return Select(te.all(*inside), v, c(0)) if inside else v

            if mode == "nearest":
                return Cast(d, pixel([Cast("int64", xv) for xv, _, _, _ in coords]))
            taps_per_dim = []
            for xv, _, _, _ in coords:
                x0 = te.floor(xv)
                t = xv - x0
                base = Cast("int64", x0)
                if mode == "linear":
                    taps_per_dim.append([(base, c(1) - t), (base + 1, t)])
                else:
                    A = -0.75
                    s1, s2, s3 = t + c(1), c(1) - t, c(2) - t
                    w = [((c(A) * s1 - c(5 * A)) * s1 + c(8 * A)) * s1 - c(4 * A),
                         ((c(A + 2) * t - c(A + 3)) * t) * t + c(1),
                         ((c(A + 2) * s2 - c(A + 3)) * s2) * s2 + c(1),
                         ((c(A) * s3 - c(5 * A)) * s3 + c(8 * A)) * s3 - c(4 * A)]
                    taps_per_dim.append([(base + k - 1, w[k]) for k in range(4)])
            total = None
            for combo in itertools.product(*taps_per_dim):
                weight = None
                for _, wk in combo:
                    weight = wk if weight is None else weight * wk
                term = weight * pixel([t for t, _ in combo])
                total = term if total is None else total + term
            return Cast(d, total)
        return te.compute(out_shape, f, "T_grid_sample")
    return emit_kernel(ctx, kernel, x, grid, name="grid_sample")
