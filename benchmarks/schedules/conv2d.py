"""A direct 2-D convolution (NCHW, stride 1) for CPUs, register-tiled, and its TE definition.

The layout trick: with stride 1, output row ``oh`` of a padded input of width ``Wp`` reads input
rows ``oh + kh`` at columns ``ow + kw``, so if the padded input is stored row after row
(``data_pad[n, c, q]``, ``q = row * Wp + col``) and the output is first computed in the same
flat form (``conv2d_flat[n, k, p]``, ``p = oh * Wp + ow``), every tap ``(kh, kw)`` is one
*contiguous* shifted run::

    conv2d_flat[n, k, p] = sum_{c, kh, kw} data_pad[n, c, p + kh * Wp + kw] * weight[k, c, kh, kw]

(for ``ow >= OW`` the sum is junk that the final copy drops: ``Wp - OW`` of every ``Wp``
columns, 3.4% at 56x56). So one vector load serves a whole run of output columns across row
boundaries, and the micro-kernel is GEMM-like: a tile of ``R`` output channels x ``V`` vectors
of ``L`` positions stays in ``R * V`` vector registers (4 x 6 x 16 lanes on AVX-512) while the
``C * KH * KW`` reduction streams through, one vector load per tap and column vector, one
broadcast weight per tap and channel, ``R * V`` FMAs.

Three stages, all inside the kernel (input and output are plain NCHW; the weight is used in its
OIHW layout, nothing is pre-packed):

1. ``data_pad``: the zero-padded input, flat per channel (a copy, 1/30 of the conv's time);
2. ``conv2d_flat``: the convolution, its tile accumulated in a ``local`` buffer (the code
   generator keeps it in registers) and written back once;
3. ``conv2d_nchw``: the valid columns copied to the NCHW output.

Examples
--------
>>> from tilecraft import targets
>>> from tilecraft.tensorir import Schedule
>>> from benchmarks.schedules import conv2d
>>> sch = Schedule(conv2d.conv2d_nchw_func(1, 64, 64, 56, 56))
>>> conv2d.schedule_conv2d_nchw(sch, targets.Target("llvm"))
>>> mod = targets.build(sch.mod, "llvm")                    # doctest: +SKIP
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from tilecraft.tensorir import te
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.schedule import Schedule, ScheduleError

from .elementwise import as_target, const_int, vector_lanes

DEFAULT_TILE = 96   # the flat output length is padded to a multiple of this (6 AVX-512 vectors)
ROW_WIDTH = "flat_row_width"   # data_pad's annotation: Wp
MAX_UNROLLED_FMAS = 256        # unroll the kernel rows too while the body has at most this many


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


# ----------------------------------------------------------------------------------------------
# TE definition


@dataclass(frozen=True)
class FlatConvGeometry:
    """Sizes of the flat formulation for one convolution (all ints)."""

    out_h: int
    out_w: int
    pad_w: int        # Wp: the padded row width, the flat row stride
    pad_len: int      # data_pad's flat length per channel (whole rows, zero beyond the input)
    out_len: int      # conv2d_flat's length per channel: out_h * Wp rounded up to ``tile``


def flat_geometry(height: int, width: int, kernel, padding, dilation,
                  tile: int = DEFAULT_TILE) -> FlatConvGeometry:
    """The flat formulation's sizes; see the module docstring.

    Examples
    --------
    >>> flat_geometry(56, 56, 3, 1, 1)
    FlatConvGeometry(out_h=56, out_w=56, pad_w=58, pad_len=3422, out_len=3264)
    """
    (kh, kw), (ph, pw), (dh, dw) = _pair(kernel), _pair(padding), _pair(dilation)
    out_h = height + 2 * ph - dh * (kh - 1)
    out_w = width + 2 * pw - dw * (kw - 1)
    if out_h <= 0 or out_w <= 0:
        raise ValueError(f"conv2d: a {kh}x{kw} kernel (dilation {dh}x{dw}) does not fit a "
                         f"{height}x{width} input padded by {ph}x{pw}")
    wp = width + 2 * pw
    out_len = -(-out_h * wp // tile) * tile
    last_read = out_len - 1 + (kh - 1) * dh * wp + (kw - 1) * dw
    rows = -(-(last_read + 1) // wp)
    return FlatConvGeometry(out_h, out_w, wp, rows * wp, out_len)


def conv2d_nchw(data: te.Tensor, weight: te.Tensor, padding=1, dilation=1,
                tile: int = DEFAULT_TILE) -> te.Tensor:
    """Stride-1 convolution of NCHW ``data`` (N, C, H, W) with OIHW ``weight`` (K, C, KH, KW),
    symmetric zero ``padding`` (int or (ph, pw)) and ``dilation``, in the flat formulation
    (blocks ``data_pad``, ``conv2d_flat``, ``conv2d_nchw``). Static shapes only.

    Examples
    --------
    >>> x = te.placeholder((1, 64, 56, 56), "float32", "x")
    >>> w = te.placeholder((64, 64, 3, 3), "float32", "w")
    >>> y = conv2d_nchw(x, w, padding=1)
    """
    shapes = [const_int(d) for d in tuple(data.shape) + tuple(weight.shape)]
    if None in shapes:
        raise ValueError("conv2d_nchw: the flat formulation needs static shapes, got data "
                         f"{tuple(data.shape)} and weight {tuple(weight.shape)}")
    n, c, h, w = shapes[:4]
    k, wc, kh, kw = shapes[4:]
    if wc != c:
        raise ValueError(f"conv2d_nchw: data has {c} channels but weight expects {wc}")
    (ph, pw), (dh, dw) = _pair(padding), _pair(dilation)
    g = flat_geometry(h, w, (kh, kw), (ph, pw), (dh, dw), tile)
    wp = g.pad_w
    zero = te.const(0.0, data.dtype)

    def pad_value(b, ch, q):
        row, col = q // wp, q % wp
        inside = te.all(row >= ph, row < ph + h, col >= pw, col < pw + w)
        return te.if_then_else(inside, data[b, ch, row - ph, col - pw], zero)

    # the row width rides along as an annotation, for the schedule to split rows by
    data_pad = te.compute((n, c, g.pad_len), pad_value, "data_pad", attrs={ROW_WIDTH: wp})
    rc = te.reduce_axis((0, c), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    flat = te.compute(
        (n, k, g.out_len),
        lambda b, o, p: te.sum(data_pad[b, rc, p + ry * (dh * wp) + rx * dw] * weight[o, rc, ry, rx],
                               axis=[rc, ry, rx]),
        "conv2d_flat")
    return te.compute((n, k, g.out_h, g.out_w),
                      lambda b, o, y, x: flat[b, o, y * wp + x], "conv2d_nchw")


def conv2d_nchw_func(batch: int, in_channels: int, out_channels: int, height: int, width: int,
                     kernel=3, padding=1, dilation=1, dtype: str = "float32",
                     tile: int = DEFAULT_TILE) -> PrimFunc:
    """``main(data, weight, out)`` for ``conv2d_nchw``.

    Examples
    --------
    >>> f = conv2d_nchw_func(1, 64, 64, 56, 56)
    """
    kh, kw = _pair(kernel)
    data = te.placeholder((batch, in_channels, height, width), dtype, "data")
    weight = te.placeholder((out_channels, in_channels, kh, kw), dtype, "weight")
    out = conv2d_nchw(data, weight, padding, dilation, tile)
    return te.create_prim_func([data, weight, out])


# ----------------------------------------------------------------------------------------------
# the schedule


def register_count(target) -> int:
    """Vector registers of the target's ISA (AVX-512 and AArch64 have 32, AVX2 and SSE 16)."""
    t = as_target(target)
    return 32 if t.vector_width >= 512 or t.arch == "aarch64" else 16


def choose_tile(out_channels: int, flat_len: int, lanes: int, registers: int,
                oc_block: int | None = None) -> tuple[int, int]:
    """``(R, V)``: ``R`` output channels x ``V`` vectors of accumulators, with ``R`` dividing
    ``out_channels``, ``V * lanes`` dividing ``flat_len``, and ``R * V`` as close as possible
    to (not above) ``registers - 8`` (the rest hold the loaded input vectors). Ties prefer
    ``R = 4``: 4 broadcasts per ``V`` loads keep the load ports below the FMA rate.

    Examples
    --------
    >>> choose_tile(64, 3264, 16, 32)
    (4, 6)
    """
    budget = max(1, registers - 8)
    best = None
    for r in ([oc_block] if oc_block else range(1, min(out_channels, budget) + 1)):
        if out_channels % r:
            continue
        for v in range(max(1, budget // r), 0, -1):
            if flat_len % (v * lanes) == 0:
                key = (r * v, -abs(r - 4))
                if best is None or key > best[0]:
                    best = (key, (r, v))
                break
    if best is None:
        raise ValueError(f"conv2d: no tile of {lanes}-lane vectors divides the flat length "
                         f"{flat_len}")
    return best[1]


def schedule_conv2d_nchw(sch: Schedule, target, *, oc_block: int | None = None,
                         vectors: int | None = None) -> None:
    """Schedule ``conv2d_nchw`` (blocks ``data_pad``, ``conv2d_flat``, ``conv2d_nchw``).

    ``conv2d_flat``: output channels split by ``R`` and flat positions by ``V`` vectors of
    ``L`` lanes (``choose_tile``); the (batch, position-tile) loops fused into one parallel loop
    (with the channel blocks too when there are fewer than 4 tiles per core); the tile
    accumulated in a ``local`` cache (``cache_write`` +
    ``reverse_compute_at``), its init split out (``decompose_reduction``); the taps, the ``R``
    channels and the ``V`` vectors unrolled and the lanes vectorized, so the reduction loop
    over input channels is ``KH * KW * R * V`` FMAs on registers. ``data_pad`` and
    ``conv2d_nchw`` are row copies, parallel over (batch, channel) and vectorized.

    Parameters
    ----------
    sch : Schedule
        A schedule of ``conv2d_nchw_func`` (or a function with the same three blocks).
    target : targets.Target or str
        Sets the lanes and the register budget.
    oc_block, vectors : int, optional
        Force ``R`` / ``V`` (``V * L`` must divide the flat length).

    Examples
    --------
    ``schedule_conv2d_nchw(sch, "llvm")`` on the 56x56, 64 -> 64 channel 3x3 conv (AVX-512)::

        for b_p_0_fused in T.parallel(34):
            for o_0 in range(16):
                for o_1_init, p_1_init in T.grid(4, 6):           # unrolled
                    for p_2_init in T.vectorized(16): ...          # acc = 0
                for rc in range(64):
                    for ry, rx, o_1, p_1 in T.grid(3, 3, 4, 6):   # unrolled: 216 FMAs
                        for p_2 in T.vectorized(16):
                            with T.block("conv2d_flat"): ...
                for ax0, ax1_0 in T.grid(4, 6):                    # write the tile back
                    for ax1_1 in T.vectorized(16): ...
    """
    prim = "schedule_conv2d_nchw"
    try:
        pad, conv, out = (sch.get_block(n) for n in ("data_pad", "conv2d_flat", "conv2d_nchw"))
    except ScheduleError as err:
        raise ScheduleError(prim, f"expected the blocks of conv2d_nchw: {err}") from None
    wp = _row_width(sch, pad)
    dtype = sch.get(out).writes[0].buffer.dtype
    lanes = vector_lanes(target, dtype)
    b, o, p, rc, ry, rx = sch.get_loops(conv)
    k_ext, p_ext = const_int(sch.get(o).extent), const_int(sch.get(p).extent)
    if vectors is not None:
        budget = max(1, register_count(target) - 8)
        r = oc_block or max([d for d in range(1, k_ext + 1)
                             if k_ext % d == 0 and d * vectors <= budget] or [1])
        v = vectors
        if p_ext % (v * lanes) or k_ext % r:
            raise ScheduleError(prim, f"a tile of {r} channels x {v} x {lanes} positions does "
                                f"not divide {k_ext} x {p_ext}")
    else:
        r, v = choose_tile(k_ext, p_ext, lanes, register_count(target), oc_block)

    o0, o1 = sch.split(o, [None, r])
    p0, p1, p2 = sch.split(p, [None, v, lanes])
    sch.reorder(b, p0, o0, rc, ry, rx, o1, p1, p2)
    # parallel over (batch, position tiles) when they give every core a few tiles (the
    # channel-block loop then stays serial inside, and indices free of div/mod); else over the
    # channel blocks as well
    n_tiles = const_int(sch.get(b).extent) * (p_ext // (v * lanes))
    if n_tiles >= 4 * _cores(target):
        sch.parallel(sch.fuse(b, p0))
        tile = o0
    else:
        tile = sch.fuse(b, p0, o0)
        sch.parallel(tile)
    acc = sch.cache_write(conv, 0, "local")
    sch.reverse_compute_at(acc, tile)
    init = sch.decompose_reduction(conv, rc)
    # the taps unrolled too while the body stays a few hundred FMAs (a 3x3 kernel: 9 R V)
    taps_y, taps_x = const_int(sch.get(ry).extent), const_int(sch.get(rx).extent)
    unrolled = [rx, o1, p1] + ([ry] if taps_y * taps_x * r * v <= MAX_UNROLLED_FMAS else [])
    for loop in unrolled:
        sch.unroll(loop)
    sch.vectorize(p2)
    *_, i_o, i_p, i_l = sch.get_loops(init)
    sch.unroll(i_o)
    sch.unroll(i_p)
    sch.vectorize(i_l)
    # the write-back in the same (R, V, L) shape as the accumulation, so the local tile's
    # accesses agree and it stays in registers
    *_, w_o, w_p = sch.get_loops(acc)
    w_p1, w_p2 = sch.split(w_p, [v, lanes])
    sch.unroll(w_o)
    sch.unroll(w_p1)
    sch.vectorize(w_p2)

    # the copies: one parallel (batch, channel) loop, rows vectorized
    pb, pc, pq = sch.get_loops(pad)
    _, pcol = sch.split(pq, [None, wp])
    sch.vectorize(pcol)
    sch.parallel(sch.fuse(pb, pc))
    ob, oc, _, ocol = sch.get_loops(out)
    sch.vectorize(ocol)
    sch.parallel(sch.fuse(ob, oc))


def _cores(target) -> int:
    return as_target(target).num_cores or os.cpu_count() or 1


def _row_width(sch: Schedule, pad_block) -> int:
    """Wp, the flat row stride (``data_pad``'s annotation)."""
    ann = dict(sch.get(pad_block).annotations or {})
    wp = ann.get(ROW_WIDTH)
    if wp is None:
        raise ScheduleError("schedule_conv2d_nchw", f"block {sch.get(pad_block).name} has no "
                            f"{ROW_WIDTH!r} annotation (make it with conv2d_nchw)")
    return int(getattr(wp, "value", wp))
