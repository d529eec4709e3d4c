"""The NCHW convolution with the output channels in the vector lanes (rule
``RULE_CONV_NCHW_CVEC``): a tile of ``rows`` output positions x ``width`` output channels
accumulates in registers; each step of the reduction broadcasts one input value per position
and loads ``width`` contiguous weights of the packed weight ``[O/R, I, KH, KW, R]`` (the flat
family's ``pack_conv2d_nchw_weight`` with ``R = width``). Unlike the flat kernel no lane is
wasted on small images. With ``across_rows`` the tiles run over the flattened output plane
(the last one padded) and a copy stage writes NCHW (or NHWC: the same tiles run NHWC data).

- plan: ``plan_conv2d_nchw_cvec`` (tiles of one row) and ``cvec_tiles_plan`` (tiles across
  rows), both ``ChannelVectorPlan``;
- weight packing: ``conv2d_nchw.pack_conv2d_nchw_weight``;
- compute: ``conv2d_nchw_cvec``;
- schedule: ``schedule_conv2d_nchw_cvec``.

Examples
--------
>>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
>>> p = plan_conv2d_nchw_cvec(g, 16, 32)
>>> (p.rows, p.width)
(7, 32)
"""
from __future__ import annotations

from dataclasses import dataclass

from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import PrimExpr
from tilecraft.tensorir.schedule import Schedule, ScheduleError

from .conv2d_nchw import pack_conv2d_nchw_weight
from .geometry import ConvGeometry, ceil_div, divisors, group_of
from .padding import RULE_PAD, image_at, pad_image, pad_nhwc, schedule_pad
from .params import num_cores
from .registry import SCHEDULE_RULE, KernelFamily, block_rule
from .schedule_utils import (MAX_UNROLLED_FMAS, ann_int, conv_tile_block, finish_tile_block,
                             fuse_epilogue, loop_extent, tile_tail)

__all__ = ["RULE_CONV_NCHW_CVEC", "RULE_CVEC_ROWS", "SMALL_CIN", "ChannelVectorPlan",
           "plan_conv2d_nchw_cvec", "cvec_tiles_plan", "cvec_fits", "cvec_widest_rows",
           "is_narrow", "reads_input_rows", "conv2d_nchw_cvec", "schedule_conv2d_nchw_cvec",
           "FAMILY"]

RULE_CONV_NCHW_CVEC = "tilecraft.conv2d_nchw_cvec"
# the padded input rows of one output row (a small-Cin layer's stage), placed by the main block
RULE_CVEC_ROWS = "tilecraft.conv2d_cvec_rows"

# Input channels up to which a padded convolution of one-row tiles may read a buffer of each
# output row's padded input rows (``reads_input_rows``) instead of a padded copy of the image.
SMALL_CIN = 4


@dataclass(frozen=True)
class ChannelVectorPlan:
    """The tile of ``conv2d_nchw_cvec``: ``rows`` output positions of one image row x
    ``width`` output channels (a multiple of the lanes; the packed weight's ``R``).

    Attributes
    ----------
    rows : int
        Output columns per tile (a divisor of the output width: no tail, nothing masked), or,
        with ``across_rows``, consecutive positions of the flattened output plane (any count).
    width : int
        Output channels per tile, ``vectors * lanes``; divides the output channels.
    across_rows : bool
        Tiles of the flattened plane (``y * W + x``), the last one padded, written to a tile
        buffer that a copy stage (with the epilogue) turns into NCHW: the tile need not divide
        the row, so it can be the register file's size on any image.
    k_chunk : int
        With ``across_rows``: input channels per chunk of the reduction (0: no chunks). The
        channel block's tiles all accumulate one chunk before the next, so the chunk's weight
        slice stays in L1 while the tiles stream by (the accumulators wait in the tile
        buffer between chunks).
    """

    geometry: ConvGeometry
    rows: int
    width: int
    lanes: int
    across_rows: bool = False
    k_chunk: int = 0

    @property
    def vectors(self) -> int:
        return self.width // self.lanes


def plan_conv2d_nchw_cvec(g: ConvGeometry, lanes: int,
                          registers: int) -> ChannelVectorPlan | None:
    """The channel-vector tile of an NCHW convolution, or None when it does not apply (a
    depthwise or grouped convolution whose tile would span groups, or output channels that no
    multiple of the lanes divides).

    The tile keeps ``rows x vectors`` accumulators, as many as fit up to 16 with 32 vector
    registers (12 with 16; the weight vectors and a broadcast need registers too), ``rows``
    a divisor of the output width (no tail); ties go to more channel vectors (fewer
    broadcasts per FMA). Measured on ResNet-50's layers (Zen 4, AVX-512): 4 x 64 beat
    14 x 16 and 7 x 32 at 28 x 28, and tiles of 24 or more accumulators ran up to 3x slower
    (the unrolled taps' broadcasts spill); on the 7 x 7 stride-2 stem 16 x 16 ran 1.6x slower
    than 4 x 64.

    A width whose divisors leave fewer than 12 accumulators under that cap (Inception-v3's
    17 x 17 planes: 1 x 64, four accumulators and four weight loads per four FMAs) may take
    up to 20 with 32 registers: 17 x 16 ran Inception's 3x3 stride-2 288->384 layer 2.5x
    faster than 1 x 64 (0.42x -> 1.0x onnxruntime) and its 1x7 layer 1.5x faster. What is
    still narrow is left to ``nchw_kernel_plan``.

    Examples
    --------
    >>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> p = plan_conv2d_nchw_cvec(g, 16, 32)
    >>> (p.rows, p.width)
    (7, 32)
    >>> g17 = ConvGeometry(288, 35, 35, 384, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1)
    >>> p = plan_conv2d_nchw_cvec(g17, 16, 32)
    >>> (p.rows, p.width)
    (17, 16)
    """
    if g.is_depthwise:
        return None     # each lane would read another input channel: a gather per step
    budget = 16 if registers >= 32 else 12
    plan = _cvec_tile(g, lanes, registers, budget)
    if plan is not None and registers >= 32 and is_narrow(plan, registers):
        plan = _cvec_tile(g, lanes, registers, 20) or plan
    return plan


def is_narrow(plan: ChannelVectorPlan, registers: int) -> bool:
    """Whether the tile has too few accumulators to hide the loads: under 12 with 32
    registers, under 6 with 16 (where 7 x 8 on 7 x 7 planes still beat the flat kernel)."""
    return plan.rows * plan.vectors < (12 if registers >= 32 else 6)


# A channel block's weight slice that stays in L1 while the image streams through: half of a
# 32 KiB L1 data cache (x86 cores since Haswell / Zen, most ARM cores have 32-64 KiB).
L1_WEIGHT_BYTES = 16 * 1024


def cvec_fits(g: ConvGeometry, rows: int, width: int, lanes: int, registers: int,
               across_rows: bool = False) -> bool:
    """Whether ``rows`` x ``width`` is a channel-vector tile of ``g``: whole vectors dividing
    the (per-group) output channels, ``rows`` dividing the output width, the accumulators,
    the weight vectors and a broadcast within the registers. Tiles ``across_rows`` need not
    divide the row, and keep the fewer of their broadcasts or weight vectors in registers
    (the other is loaded for its FMAs and dropped)."""
    v = width // lanes
    live = min(rows, v) if across_rows else v
    return (not g.is_depthwise and width % lanes == 0 and g.out_channels % width == 0 and
            (g.groups == 1 or g.out_per_group % width == 0) and
            (across_rows or g.out_w % rows == 0) and rows * v + live + 1 <= registers)


# A chunk of the reduction whose weight slice (chunk x taps x width floats) is at most this
# stays in L1 beside the input rows the tiles read (measured on Zen 3: 8 KB chunks ran the
# 7 x 7 and 14 x 14 1x1 layers 1.3-2x faster than one pass over all input channels; 16 KB
# chunks lost a third of that).
K_CHUNK_BYTES = 8 * 1024


def _k_chunk(g: ConvGeometry, width: int) -> int:
    """Input channels per reduction chunk of a tiles plan: the most (a divisor of the
    channels per group, so no chunk is partial) whose 1x1 weight slice fits
    ``K_CHUNK_BYTES``; 0 when that is all of them."""
    cap = max(1, K_CHUNK_BYTES // (width * 4))
    kc = max(d for d in divisors(g.in_per_group) if d <= cap)
    return 0 if kc == g.in_per_group else kc


def cvec_tiles_plan(g: ConvGeometry, lanes: int, registers: int,
                    vectors: int | None = None) -> ChannelVectorPlan | None:
    """The channel-vector plan over tiles of the flattened plane (``across_rows``) with the
    register file's worth of accumulators: 12 with 16 vector registers (3 positions x 4
    vectors, else 6 x 2, else 12 x 1: the first whose width divides the channels), 16 with
    32 (4 x 4, 8 x 2, 16 x 1); ``vectors`` picks the width. The reduction is chunked by
    ``_k_chunk``. None for depthwise convolutions and channels no width divides.

    Examples
    --------
    >>> g = ConvGeometry(2048, 7, 7, 512, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> p = cvec_tiles_plan(g, 8, 16)
    >>> (p.rows, p.width, p.across_rows, p.k_chunk)
    (3, 32, True, 64)
    """
    acc = 16 if registers >= 32 else 12
    for v in ([vectors] if vectors else (4, 2, 1)):
        rows = acc // v
        if cvec_fits(g, rows, v * lanes, lanes, registers, across_rows=True):
            return ChannelVectorPlan(g, rows, v * lanes, lanes, True, _k_chunk(g, v * lanes))
    return None


def cvec_widest_rows(g: ConvGeometry, lanes: int, registers: int,
                      budget: int) -> list[tuple[int, int]]:
    """For each width of one to four vectors that fits ``g``: ``(rows, width)`` with the
    most rows keeping ``rows * vectors <= budget`` accumulators."""
    out = []
    for v in range(1, 5):
        width = v * lanes
        rows = [m for m in divisors(g.out_w)
                if m * v <= budget and cvec_fits(g, m, width, lanes, registers)]
        if rows:
            out.append((rows[-1], width))
    return out


def _cvec_tile(g: ConvGeometry, lanes: int, registers: int,
               budget: int) -> ChannelVectorPlan | None:
    """The channel-vector tile with the most accumulators up to ``budget``, or None when no
    multiple of the lanes divides the output channels. Ties go, for a 1x1 convolution, to the
    tile whose channel block's weight slice (``I * width`` floats) fits ``L1_WEIGHT_BYTES``,
    then to more vectors (fewer broadcasts per FMA). A 1x1 layer reads each input once per
    channel block, so the weight slice is what must stay in L1: ResNet-50's 1x1 256 -> 1024
    layers at 14 x 14 ran 7% faster in the model as 14 x 16 (a 16 KiB slice) than as 7 x 32
    (32 KiB, all of L1, evicted by the input rows streaming through; Zen 4). A KxK layer
    re-reads its input rows from L1 for each tap, and there the wider tile stayed ahead
    (the 7x7 stem: 4 x 64 ran 1.6x faster than 16 x 16)."""
    best = None
    for m, width in cvec_widest_rows(g, lanes, registers, budget):
        v = width // lanes
        fits = g.kernel == (1, 1) and g.in_per_group * width * 4 <= L1_WEIGHT_BYTES
        key = (m * v, fits, v)
        if best is None or key > best[0]:
            best = (key, ChannelVectorPlan(g, m, width, lanes))
    return best[1] if best else None


def reads_input_rows(plan: ChannelVectorPlan, layout: str = "NCHW") -> bool:
    """Whether ``conv2d_nchw_cvec`` reads, per output row, a buffer of its padded input rows
    (``RULE_CVEC_ROWS``) instead of a zero-padded copy of the whole image: NCHW data, tiles of
    one row, padding, one group, at most ``SMALL_CIN`` input channels (a stem on an image's
    few channels), and the buffer together with the channel block's packed weights within
    ``L1_WEIGHT_BYTES``, so both stay in L1 while the row's tiles run.

    Measured on the Intel AVX-512 guest (one thread, the kernel alone, thread CPU time, the
    two builds interleaved in one process, load 3-4 on 2 cores): MobileNet-V2's 3 -> 32 3x3
    stride-2 stem (9 KiB of rows, 3.4 KiB of weights) ran 1.05-1.09x faster at batch 8 and
    1.07-1.08x at batch 1 (1.8 against 1.9 ms at batch 8); ResNet's 3 -> 64 7x7 stride-2
    stem (20 KiB of rows, each input row copied 3.5 times, beside 37 KiB of weights) ran on
    par (0.95-1.19x over seven such runs, mostly 0.96-0.99x at batch 1 and 1.02-1.05x at
    batch 8) and keeps the padded image.

    Examples
    --------
    >>> g = ConvGeometry(3, 224, 224, 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    >>> reads_input_rows(ChannelVectorPlan(g, 8, 32, 16))
    True
    >>> g = ConvGeometry(3, 224, 224, 64, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1)
    >>> reads_input_rows(ChannelVectorPlan(g, 4, 64, 16))
    False
    """
    g = plan.geometry
    if layout != "NCHW" or plan.across_rows or g.groups != 1 or not any(g.padding) or \
            g.in_channels > SMALL_CIN:
        return False
    kh, kw = g.kernel
    rows = g.in_channels * kh * _row_columns(g, plan.lanes)
    weights = g.in_channels * kh * kw * plan.width
    return (rows + weights) * 4 <= L1_WEIGHT_BYTES


def _row_columns(g: ConvGeometry, lanes: int) -> int:
    """The padded columns an output row's tiles reach, rounded up to whole vectors of
    ``lanes`` (each buffered row starts on a vector boundary and fills without a tail)."""
    return ceil_div((g.out_w - 1) * g.strides[1] + (g.kernel[1] - 1) * g.dilation[1] + 1,
                    lanes) * lanes


def _input_rows(data: te.Tensor, g: ConvGeometry, lanes: int) -> te.Tensor:
    """``(N, C, OH, KH, cols)``: for output row ``y``, the ``KH`` zero-padded input rows its
    taps read (``cols``: ``_row_columns``)."""
    kh = g.kernel[0]
    sh, dh = g.strides[0], g.dilation[0]
    pt, pl = g.padding[0], g.padding[1]
    cols = _row_columns(g, lanes)
    zero = te.const(0, data.dtype)

    def f(b, ch, y, r, q):
        return image_at(data, b, ch, y * sh + r * dh - pt, q - pl, zero)
    return te.compute((data.shape[0], g.in_channels, g.out_h, kh, cols), f, "conv2d_rows",
                      attrs={SCHEDULE_RULE: RULE_CVEC_ROWS})


def conv2d_nchw_cvec(data: te.Tensor, weight: te.Tensor, plan: ChannelVectorPlan,
                     out_dtype: str, layout: str = "NCHW",
                     out_layout: str | None = None) -> te.Tensor:
    """The NCHW convolution of ``data`` ``(N, C, H, W)`` with the packed weight
    ``[O/R, I, KH, KW, R]`` (``pack_conv2d_nchw_weight`` with ``R = plan.width``), the output
    channels in the vector lanes: a tile of ``plan.rows`` output positions x ``R`` channels
    accumulates in registers; each step of the reduction broadcasts one input value per
    position and loads ``R`` contiguous weights. Unlike the flat kernel no lane is wasted
    on small images (``7 x 7``: the flat kernel's 16-position vectors run 49 of 64 lanes).
    Blocks: ``data_pad`` (when there is padding) and ``conv2d_nchw``, or for a small-Cin
    layer (``reads_input_rows``) ``conv2d_rows`` (each output row's padded input rows); with
    ``plan.across_rows``, ``conv2d_tiles`` (the tiles of the flattened plane, the last one
    padded) and the copy ``conv2d_nchw``.

    Examples
    --------
    >>> g = ConvGeometry(32, 7, 7, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> plan = plan_conv2d_nchw_cvec(g, 16, 32)
    >>> x = te.placeholder((te.var("n"), 32, 7, 7), "float32", "x")
    >>> w = te.placeholder((64 // plan.width, 32, 3, 3, plan.width), "float32", "w")
    >>> [str(d) for d in conv2d_nchw_cvec(x, w, plan, "float32").shape]
    ['n', '64', '7', '7']
    """
    g = plan.geometry
    n = data.shape[0]
    hp, wp = g.padded
    nhwc = layout == "NHWC"
    out_layout = out_layout or layout
    if nhwc and not plan.across_rows:
        raise ValueError("conv2d_nchw_cvec: NHWC data takes the tiles across rows only")
    if out_layout not in ("NCHW", "NHWC") or \
            (out_layout != layout and (nhwc or plan.across_rows)):
        raise ValueError(f"conv2d_nchw_cvec: {layout} data with a {out_layout} output: only "
                         f"NCHW data may write NHWC, and with the tiles of one row")
    in_rows = reads_input_rows(plan, layout)
    if in_rows:
        src = _input_rows(data, g, plan.lanes)
    elif nhwc:
        src = pad_nhwc(data, g)
    else:
        src = pad_image(data, g.padding, hp, wp, te.const(0, data.dtype))
    ipg, opg, nr = g.in_per_group, g.out_per_group, plan.width
    rc = te.reduce_axis((0, ipg), "rc")
    ry = te.reduce_axis((0, g.kernel[0]), "ry")
    rx = te.reduce_axis((0, g.kernel[1]), "rx")
    (sh, sw), (dh, dw) = g.strides, g.dilation

    def chan(o):
        return rc.var if g.groups == 1 else group_of(o, nr, opg) * ipg + rc.var

    def f(b, o, y, x):
        yy, xx = y * sh + ry * dh, x * sw + rx * dw
        if in_rows:
            v = src[b, chan(o), y, ry, xx]
        else:
            v = src[b, yy, xx, chan(o)] if nhwc else src[b, chan(o), yy, xx]
        wt = weight[o // nr, rc, ry, rx, o % nr]
        return te.sum(v.astype(out_dtype) * wt.astype(out_dtype), axis=[rc, ry, rx])

    attrs = {SCHEDULE_RULE: RULE_CONV_NCHW_CVEC, "rows": plan.rows, "width": nr,
             "lanes": plan.lanes, "across_rows": int(plan.across_rows), "k_chunk": plan.k_chunk}
    if out_layout == "NHWC" and not nhwc:
        return te.compute((n, g.out_h, g.out_w, g.out_channels),
                          lambda b, y, x, o: f(b, o, y, x), "conv2d_nhwc",
                          attrs={**attrs, "out_nhwc": 1})
    if not plan.across_rows:
        return te.compute((n, g.out_channels, g.out_h, g.out_w), f, "conv2d_nchw",
                          attrs=attrs)
    # tiles of ``rows`` consecutive positions of the flattened output plane, the last one
    # padded: a padded position recomputes the plane's last position (its reads stay in
    # bounds) and is never copied out
    ow, last = g.out_w, g.out_h * g.out_w - 1
    tiles_len = ceil_div(last + 1, plan.rows) * plan.rows

    def f_flat(b, o, p):
        q = te.min(p, last)
        return f(b, o, q // ow, q % ow)
    flat = te.compute((n, g.out_channels, tiles_len), f_flat, "conv2d_tiles", attrs=attrs)
    if nhwc:
        # the tile buffer is channel-minor once scheduled, so this copy reads and writes a
        # pixel's channels as contiguous runs (NCHW's copy reads them across)
        return te.compute((n, g.out_h, g.out_w, g.out_channels),
                          lambda b, y, x, o: flat[b, o, y * ow + x], "conv2d_nhwc")
    return te.compute((n, g.out_channels, g.out_h, g.out_w),
                      lambda b, o, y, x: flat[b, o, y * ow + x], "conv2d_nchw")


def schedule_conv2d_nchw_cvec(sch: Schedule, name: str, target: Target,
                              gemv_rows: PrimExpr | None = None) -> None:
    """The NCHW convolution with the output channels in the lanes (``conv2d_nchw_cvec``): a
    tile of ``rows`` output positions of one row x ``width`` channels accumulates in
    registers over ``(rc, ry, rx)`` -- per step ``rows`` broadcast inputs, ``width / lanes``
    vector loads of the packed weight, ``rows * width / lanes`` FMAs. The channel blocks run
    outermost and in parallel, so a block's weights stay in its core's cache while the tiles
    of the image stream by. The write-back (with the fused epilogue) runs per channel on a
    vector of the tile's positions, a run of one NCHW row: the accumulators (a vector of
    channels per position) are read across, which the code generator turns into a transpose
    in registers (``_lane_loads``). Storing each position's channels one by one instead (a
    few hundred scalar epilogues per tile) ran ResNet-50's channel-vector layers 5-7% slower
    on their own and the model's kernels 1.4% slower in all (one thread, Zen 4)."""
    if ann_int(sch.get(sch.get_block(name)), "across_rows", 0):
        _schedule_conv_cvec_tiles(sch, name, target)
        return
    block, (rows, width, lanes), loops = conv_tile_block(sch, name, ("rows", "width", "lanes"))
    out_nhwc = ann_int(sch.get(block), "out_nhwc", 0)
    if out_nhwc:
        b, y, x, o, rc, ry, rx = loops
    else:
        b, o, y, x, rc, ry, rx = loops
    o0, o1 = sch.split(o, [None, width])
    x0, x1 = sch.split(x, [None, rows])
    sch.reorder(b, o0, y, x0, rc, ry, rx, x1, o1)
    par = o0 if (loop_extent(sch.get(o0)) or 0) >= 2 * num_cores(target) else y
    sch.parallel(par)
    _place_input_rows(sch, block, y, lanes)
    outer = 4
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, x0)
    fuse_epilogue(sch, acc)
    if not out_nhwc:
        # the accumulators channel-minor, so a vector of channels is one contiguous run (one
        # register); in the output's NCHW order its lanes would be a plane apart (a gather)
        sch.transform_layout(block, 0, lambda b_, o_, y_, x_: (b_, y_, x_, o_))
    init = sch.decompose_reduction(block, rc)
    _cvec_inner(sch, rc, ry, rx, x1, o1, rows, width, lanes)
    finish_tile_block(sch, init, outer)
    if out_nhwc:
        # NHWC output: each position's channel vectors go out as they are, no transpose
        finish_tile_block(sch, acc, outer)
    else:
        _cvec_write_back(sch, acc, outer, rows)


def _place_input_rows(sch: Schedule, block, y, lanes: int) -> None:
    """A small-Cin layer's padded input rows (``RULE_CVEC_ROWS``), filled for each output
    row right before its tiles read them (from L1), the columns vectorized."""
    rows = [p for p in sch.get_producers(block) if block_rule(sch.get(p)) == RULE_CVEC_ROWS]
    if not rows:
        return
    sch.compute_at(rows[0], y)
    # local: the buffer shrinks to one output row's rows, each thread's own (a global one
    # keeps the whole (N, C, OH, KH, cols) shape, as large as the image)
    sch.set_scope(rows[0], 0, "local")
    *_, q = sch.get_loops(rows[0])
    _, q1 = sch.split(q, [None, lanes])
    sch.vectorize(q1)


def _cvec_write_back(sch: Schedule, acc, outer: int, rows: int) -> None:
    """The channel-vector tile's write-back: per channel (unrolled), a vector of the tile's
    positions -- a run of one NCHW row (or of the flattened plane), so the epilogue's loads
    (residual) and the store are vector accesses; the accumulators are read across (a
    transpose, lane extracts and shuffles in registers)."""
    *chans, positions = tile_tail(sch, acc, outer)
    for rv in chans:
        sch.unroll(rv)
    if rows > 1:
        sch.vectorize(positions)
    else:
        sch.unroll(positions)


def _cvec_inner(sch: Schedule, rc, ry, rx, x1, o1, rows: int, width: int, lanes: int,
                broadcasts_live: bool = False) -> None:
    """The channel-vector tile's inner loops: positions and channel vectors unrolled, the
    lanes vectorized, the taps unrolled (the kernel rows too when the FMAs stay few).
    ``broadcasts_live``: with fewer positions than weight vectors, the weight vectors go
    outside the positions, so the broadcasts stay in registers and each weight vector is
    loaded for its FMAs and dropped (``rows + 1`` registers besides the accumulators instead
    of ``vectors + 1``: 3 x 32 on AVX2 fits 16 registers only so)."""
    ov, ol = sch.split(o1, [None, lanes])
    if broadcasts_live and rows < width // lanes:
        sch.reorder(ov, x1)
    sch.unroll(x1)
    sch.unroll(ov)
    sch.vectorize(ol)
    taps = (loop_extent(sch.get(ry)) or 1) * (loop_extent(sch.get(rx)) or 1)
    sch.unroll(rx)
    if taps * rows * (width // lanes) <= MAX_UNROLLED_FMAS:
        sch.unroll(ry)


def _schedule_conv_cvec_tiles(sch: Schedule, name: str, target: Target) -> None:
    """The channel-vector convolution over tiles of the flattened output plane
    (``conv2d_nchw_cvec`` with ``across_rows``): ``rows`` consecutive positions (any count:
    the last tile is padded) x ``width`` channels accumulate in registers, as in
    ``schedule_conv2d_nchw_cvec``, into the padded plane of tiles; the copy from there to
    NCHW (with the fused epilogue) is a stage of its own.

    With ``k_chunk``, the reduction runs in chunks of that many input channels and each
    channel block's tiles all accumulate one chunk before the next: the chunk's weights
    stay in L1 while the tiles stream by, and each tile's accumulators are loaded from the
    tile buffer (channel-minor there, one vector per position and channel vector) before
    the chunk and stored after it. Without chunks, a long reduction reads its channel
    block's whole weight slice from L2 for every tile (Zen 3: the 7 x 7 1x1 layers of
    ResNet-50 ran 1.3-1.5x faster chunked). Chunks need channel blocks to run in parallel
    (two per core); with fewer, the tiles run in parallel unchunked."""
    block = sch.get_block(name)
    blk = sch.get(block)
    rows, width, lanes, k_chunk = (ann_int(blk, k) for k in
                                   ("rows", "width", "lanes", "k_chunk"))
    loops = sch.get_loops(block)
    if len(loops) != 6:
        raise ScheduleError("conv2d", f"block {name}: unexpected loop nest", blk)
    b, o, p, rc, ry, rx = loops
    o0, o1 = sch.split(o, [None, width])
    x0, x1 = sch.split(p, [None, rows])
    blocks = loop_extent(sch.get(o0)) or 0
    if 0 < k_chunk < (loop_extent(sch.get(rc)) or 0) and blocks >= 2 * num_cores(target):
        rc0, rc1 = sch.split(rc, [None, k_chunk])
        sch.reorder(b, o0, rc0, x0, rc1, ry, rx, x1, o1)
        sch.parallel(o0)
        # the tile buffer is the accumulator: LLVM keeps a tile's vectors in registers over
        # the chunk (their addresses do not change in it)
        sch.transform_layout(block, 0, lambda b_, o_, p_: (b_, o_ // width, p_, o_ % width))
        init = sch.decompose_reduction(block, rc0)
        _cvec_inner(sch, rc1, ry, rx, x1, o1, rows, width, lanes, broadcasts_live=True)
        sch.vectorize(sch.get_loops(init)[-1])
        return
    sch.reorder(b, o0, x0, rc, ry, rx, x1, o1)
    sch.parallel(o0 if blocks >= 2 * num_cores(target) else x0)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, x0)
    sch.transform_layout(block, 0, lambda b_, o_, p_: (b_, p_, o_))
    init = sch.decompose_reduction(block, rc)
    _cvec_inner(sch, rc, ry, rx, x1, o1, rows, width, lanes, broadcasts_live=True)
    finish_tile_block(sch, init, 3)
    _cvec_write_back(sch, acc, 3, rows)


FAMILY = KernelFamily(
    name="conv2d_nchw_cvec", rule=RULE_CONV_NCHW_CVEC, plan=plan_conv2d_nchw_cvec,
    compute=conv2d_nchw_cvec, pack=pack_conv2d_nchw_weight,
    schedule=schedule_conv2d_nchw_cvec, tile=True,
    stages={RULE_PAD: schedule_pad, RULE_CVEC_ROWS: None})
