"""The NHWC convolution (rule ``RULE_CONV_NHWC``): a GEMM-like tile of ``rows`` output pixels x
``width`` output channels, the weight packed ``[ceil(O/NR), KH, KW, I, NR]`` so that a tile's
``NR`` channels of one tap and input channel are one contiguous vector run. A 1x1 unit-stride
layer without padding (output pixel ``p`` reads input pixel ``p``) may take tiles across rows
(``flat``).

- plan: ``plan_conv2d_nhwc`` (``NhwcPlan``) and ``nhwc_tile_fills``;
- weight packing: ``pack_conv2d_nhwc_weight``;
- compute: ``conv2d_nhwc_packed``;
- schedule: ``schedule_conv2d_nhwc``.

Examples
--------
>>> g = ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
>>> p = plan_conv2d_nhwc(g, 16, 32)
>>> (p.rows, p.width, p.flat)
(14, 32, False)
"""
from __future__ import annotations

from dataclasses import dataclass

from tilecraft.targets import Target
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import PrimExpr
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.stmt import ANN_NONTEMPORAL_STORE
from tilecraft.tensorir.transform import ANN_SOFTWARE_PREFETCH

from .geometry import ConvGeometry, as_int, ceil_div, group_of
from .padding import RULE_PAD, pad_nhwc, schedule_pad
from .params import NONTEMPORAL_MIN_BYTES, nontemporal_output, num_cores
from .registry import SCHEDULE_RULE, KernelFamily
from .schedule_utils import (MAX_UNROLLED_FMAS, ann_int, block_lanes, conv_tile_block,
                             core_balance, finish_tile_block, fuse_epilogue, loop_extent)

__all__ = ["RULE_CONV_NHWC", "RAGGED_MIN_TILES", "MAX_KXK_PIXELS", "NONTEMPORAL_MIN_BYTES", "NhwcPlan",
           "plan_conv2d_nhwc", "nhwc_tile_fills", "streams_output", "prefetch_weight_spec",
           "pack_conv2d_nhwc_weight",
           "conv2d_nhwc_packed", "schedule_conv2d_nhwc", "FAMILY"]

RULE_CONV_NHWC = "tilecraft.conv2d_nhwc_packed"


# the narrow 1x1 tile (one panel: every output channel in the tile) prefetches the input of the
# tile this many tiles ahead, a line every few reduction steps (``prefetch_spec``); 0: none
PREFETCH_TILES_AHEAD = 2
CACHE_LINE_FLOATS = 16

# a layer whose channel panels run outermost prefetches the next panel's weights, a line every
# this many reduction steps (``prefetch_weight_spec``); 0: none
PREFETCH_WEIGHT_EVERY = 1
# ... and that many lines a step in a KxK layer of unit stride (``prefetch_weight_spec``)
PREFETCH_WEIGHT_LINES = 2

# a layer whose packed weight is at least this and larger than one image's input runs its
# channel panels outermost (``panels_outer``): each panel's weights stay in L2 while every row
# of the plane uses them, where rows outermost stream the whole weight through L2 once per
# row (half of a Sapphire Rapids core's 2 MB L2, all of a Zen 4 core's)
PANELS_OUTER_MIN_BYTES = 1 << 20

# with 32 vector registers, a KxK layer's tile of two vectors of channels takes up to this
# many pixels (``plan_conv2d_nhwc``)
MAX_KXK_PIXELS = 14

# with 16 vector registers, a row (or plane) of at least this many full NHWC tiles takes
# them with a ragged last tile rather than a smaller tile that divides it
RAGGED_MIN_TILES = 4


@dataclass(frozen=True)
class NhwcPlan:
    """The tile of ``conv2d_nhwc_packed``: ``rows`` output pixels of one image row x ``width``
    output channels (the packed panel width, a multiple of the lanes). With ``flat``, the
    pixels are consecutive ones of the whole output plane (a 1x1 unit-stride convolution
    without padding reads input pixel ``p`` for output pixel ``p``, so a tile may span rows).
    With ``image_rows`` > 1 the tile is that many image rows of ``rows`` pixels each (a whole
    7-wide row twice: ``plan_conv2d_nhwc``)."""

    geometry: ConvGeometry
    rows: int
    width: int
    lanes: int
    flat: bool = False
    image_rows: int = 1


def plan_conv2d_nhwc(g: ConvGeometry, lanes: int, registers: int) -> NhwcPlan | None:
    """The NHWC tile, or None when the channels of a tile would not share their input channel
    (a grouped convolution with fewer than ``lanes`` channels per group, other than
    depthwise).

    Examples
    --------
    >>> g = ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> p = plan_conv2d_nhwc(g, 16, 32)
    >>> (p.rows, p.width, p.flat)
    (14, 32, False)
    """
    if g.groups > 1 and not g.is_depthwise and g.out_per_group % lanes:
        return None
    vectors = 2 if g.out_channels >= 2 * lanes else 1
    if g.groups > 1 and not g.is_depthwise:
        vectors = 2 if g.out_per_group % (2 * lanes) == 0 else 1
    if (g.groups == 1 or g.is_depthwise) and g.out_channels % (vectors * lanes):
        # no ragged last panel: its masked vectors on every step ran at half speed or worse.
        # One vector where two would leave one (MobileNet-V2's 144 channels, 56 x 56: the
        # depthwise layer in 172 us as 14 pixels x 16, 320 us as 7 x 32; the 1x1 24 -> 144
        # one in 251 us as 8 x 16, 318 us as 14 x 32); half a vector where one would (its
        # 96 -> 24 1x1 layer in 178-188 us as 14-28 pixels x 8 lanes, 327 us as 14 x 16 with
        # a half-empty second panel; Zen 4, one thread)
        vectors = 1
        if g.out_channels % lanes and lanes >= 16 and g.out_channels % (lanes // 2) == 0:
            lanes //= 2
            if registers >= 32 and g.groups == 1 and g.out_channels % (3 * lanes) == 0:
                # 24 channels: three half vectors, so that each broadcast input feeds three
                # FMAs, not one. MobileNet-V2's 144 -> 24 projection at 56 x 56, batch 8
                # (Zen 4, one thread, A/B twice): 4.3-4.4 ms as 14 pixels x 8 lanes, 3.5 ms
                # as 8 x 3 x 8; its 96 -> 24 one 2.3-3.1 against 2.2-2.3 ms. (144 channels
                # as 3 x 16 gained nothing on the 24 -> 144 layer: not taken.)
                vectors = 3
    width = vectors * lanes
    budget = (24 if registers >= 32 else 12) // vectors
    if registers >= 32 and lanes >= 16 and vectors == 2 and g.groups == 1 and \
            g.kernel != (1, 1):
        # a KxK layer's tile takes 14 pixels x 2 vectors: 28 accumulators, the two weight
        # vectors and the broadcast input (an operand of the FMA) fill the 32 registers, and
        # 14 divides the 56-, 28- and 14-wide rows, where 12 took 4 x 12 + 8 and 7 x 2.
        # intel-avx512, one thread, ResNet-18's layers at batch 1 (21 interleaved rounds,
        # load 3.3-3.4): 64 -> 64 at 56 x 56 1.46 -> 1.42 ms, 64 -> 128 stride 2 at 28 x 28
        # 0.98 -> 0.83 ms, 128 -> 256 stride 2 at 14 x 14 0.95 -> 0.73 ms (1x1 layers and
        # NEON unmeasured: not taken)
        budget = MAX_KXK_PIXELS
    ow = g.out_w
    fits = [m for m in range(min(budget, ow), 3, -1) if ow % m == 0]
    # a full tile with a ragged last one beats a smaller tile that divides the row once the
    # row holds RAGGED_MIN_TILES of them. 16 registers (Zen 3, one layer each: 6 pixels
    # against 4 on 56- and 28-wide rows ran 1.0-1.12x, the 3x3 layers most; on 14- and
    # 7-wide rows, 6 + 6 + 2 and 6 + 1, 0.75-0.9x the channel-vector tiles); AVX-512
    # (intel-avx512, one thread: 64 -> 64 3x3 at 56 x 56 as 4 x 12 + 8 pixels x 32 channels
    # 1.36-1.38 ms against 1.39-1.59 as 7 x 8; ResNet-18 at batch 8 181 against 187 ms,
    # MobileNet-V2 at batch 1 7.00 against 7.13 ms). NEON (4 lanes) is unmeasured: not taken.
    ragged = g.groups == 1 and (registers < 32 or lanes >= 16)
    if ragged and ow >= RAGGED_MIN_TILES * budget:
        return NhwcPlan(g, budget, width, lanes)
    if ragged and registers >= 32 and vectors == 2 and _pixel_aligned(g) and \
            g.out_h * ow >= RAGGED_MIN_TILES * budget:
        # a 1x1 layer on a plane of short rows: full tiles across rows and a ragged last one
        # (24 accumulators), not the 7 pixels that divide a 28-, 14- or 7-wide row (14).
        # intel-avx512, one thread, MobileNet-V2 at batch 1 (its 1x1 layers at 28 x 28 and
        # less): the 14 x 14 and 7 x 7 stages' 1x1 layers 3.11 -> 2.84 ms in all
        return NhwcPlan(g, budget, width, lanes, flat=True)
    if fits and budget == MAX_KXK_PIXELS and 2 * fits[0] <= budget and fits[0] == ow and \
            g.out_h > 1:
        # a whole row of at most half the tile's pixels (ResNet's 7-wide rows): the tile takes
        # two rows, so each weight vector loaded feeds twice the FMAs (a 7 x 7 plane: three
        # tiles of 14 pixels and one of 7). The panel's weights come from L2 for every tile;
        # with 7 pixels a tile, 28 bytes of them per FMA held the FMAs to ~56 GMAC/s (intel-
        # avx512, one thread, 128 -> 128 at 7 x 7 with its weights in L2; 7 pixels x 4
        # vectors, the same bytes per FMA, ran no faster)
        return NhwcPlan(g, fits[0], width, lanes, image_rows=budget // fits[0])
    if fits:
        return NhwcPlan(g, fits[0], width, lanes)
    if _pixel_aligned(g):
        # tiles across rows: the plane's pixels in one axis (a 14 x 14 plane takes 6 x 32
        # + 4 where 6 + 6 + 2 splits each row)
        plane = g.out_h * ow
        if ragged and plane >= RAGGED_MIN_TILES * budget:
            return NhwcPlan(g, budget, width, lanes, flat=True)
        flat = [m for m in range(min(budget, plane), 3, -1) if plane % m == 0]
        if flat:
            return NhwcPlan(g, flat[0], width, lanes, flat=True)
    rows = fits[0] if fits else min(budget, ow, 6)
    return NhwcPlan(g, rows, width, lanes)


def _pixel_aligned(g: ConvGeometry) -> bool:
    """Whether output pixel ``p`` of ``g`` reads input pixel ``p`` alone (1x1, unit stride,
    no padding, not grouped)."""
    return g.kernel == (1, 1) and g.strides == (1, 1) and not any(g.padding) and g.groups == 1


def nhwc_tile_fills(plan: NhwcPlan) -> bool:
    """Whether the NHWC tile fills its row (or, ``flat``, its plane) with 8 or more
    accumulators: its pixels divide the row, or the row holds ``RAGGED_MIN_TILES`` tiles or
    more, so that the ragged one at its end is a small part of the work."""
    g = plan.geometry
    pixels = g.out_h * g.out_w if plan.flat else g.out_w
    spread = pixels % plan.rows == 0 or pixels >= RAGGED_MIN_TILES * plan.rows
    return spread and plan.rows * (plan.width // plan.lanes) >= 8


def panels_outer(g: ConvGeometry, width: int, itemsize: int = 4) -> bool:
    """Whether the NHWC tile runs its channel panels outermost (above the image rows): when the
    packed weight (``width``-channel panels) is at least ``PANELS_OUTER_MIN_BYTES`` and larger
    than one image's input.

    With rows outermost, each row of tiles reads every panel, so a weight larger than L2 comes
    from L3 or memory once per row: ResNet-18's 256 -> 512 3x3 stride-2 layer (4.7 MB of
    weights, 7 output rows) read 33 MB an image. With panels outermost a panel (295 KB there)
    stays in L2 while every row uses it, and the input (200 KB an image) is what each panel
    reads again, from L2.

    Examples
    --------
    >>> panels_outer(ConvGeometry(256, 14, 14, 512, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1), 32)
    True
    >>> panels_outer(ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1), 32)
    False
    """
    panels = ceil_div(g.out_channels, width)
    weight = panels * width * g.kernel[0] * g.kernel[1] * g.in_per_group * itemsize
    image = g.height * g.width * g.in_channels * itemsize
    return weight >= PANELS_OUTER_MIN_BYTES and weight > image


def streams_output(g: ConvGeometry, batch: int | PrimExpr, itemsize: int = 4) -> bool:
    """Whether the NHWC tile writes its output (``batch`` images, an expression for a
    symbolic batch) with non-temporal stores: the rule of ``params.nontemporal_output`` (the
    whole output at least ``NONTEMPORAL_MIN_BYTES``, tested at run time for a symbolic
    batch), the write-back's vector loop annotated ``ANN_NONTEMPORAL_STORE``.

    A plain store reads each output line in before it writes it (a read for ownership): an
    output far larger than the caches is written once more than it is read. MobileNet-V2's
    16 -> 96 expansion at 112 x 112 (4.8 MB an image; Zen 4, one thread, batch 8, output
    preallocated, its ReLU6 as ``vmaxps`` / ``vminps``): 5.1 ms with plain stores, 3.2 ms
    with non-temporal ones. At batch 1 its output stays in the caches for the depthwise
    layer after it (on an Intel Xeon guest, the model 7.57 ms streaming it, 6.71 ms not).

    Examples
    --------
    >>> g = ConvGeometry(16, 112, 112, 96, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> streams_output(g, 1), streams_output(g, 8)
    (False, True)
    """
    return nontemporal_output(g.out_h * g.out_w * g.out_channels * itemsize, batch)


def prefetch_spec(g: ConvGeometry, rows: int, width: int, data: str | int,
                  ahead: int | None = None) -> list | None:
    """The ``software_prefetch`` annotation of the NHWC tile's reduction loop, or None.

    A 1x1 unit-stride layer without padding whose tile holds every output channel (one panel:
    MobileNet-V2's 144 -> 24 and 192 -> 32 projections) reads each input pixel's channels
    once, in a sequential stream: the tile ``ahead`` tiles on starts ``ahead * rows * C``
    floats later, and its ``rows * C / 16`` lines take one prefetch every ``16 / rows``
    reduction steps (C steps). Without it, every 16 steps all ``rows`` pixels need a new line
    at once and wait a memory latency, which the hardware prefetchers do not cover at
    batch 8.

    ``data`` stands for the input in the annotation (``conv2d_nhwc_packed`` gives its position
    among the block's reads, which the schedule turns into the buffer's name).

    Examples
    --------
    >>> g = ConvGeometry(144, 56, 56, 24, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> prefetch_spec(g, 8, 24, "x")
    ['x', 2304, 2]
    """
    ahead = PREFETCH_TILES_AHEAD if ahead is None else ahead
    if ahead <= 0 or not _pixel_aligned(g) or g.out_channels > width:
        return None
    every = max(1, CACHE_LINE_FLOATS // rows)
    return [data, ahead * rows * g.in_channels, every]


def prefetch_weight_spec(g: ConvGeometry, width: int, itemsize: int = 4) -> list | None:
    """``[ahead, every, lines]`` of the software prefetch of the next panel's weights along the
    NHWC tile's reduction loop, or None: a layer whose channel panels run outermost
    (``panels_outer``) prefetches, ``lines`` lines every ``every`` reduction steps, the weights
    one panel (``KH * KW * I * width`` elements) past those the step reads.

    Such a layer's weight (megabytes) comes from memory once an image, and each panel's first
    tile waits on it: ResNet-18's 512 -> 512 3x3 layer at 7 x 7 (9.4 MB, 7 tiles a panel)
    ran at half the speed of its 256 -> 256 one at 14 x 14 (the same work, 28 tiles a panel). Prefetched while the panel before
    it runs, the next panel is in the caches when its tiles start (each of the panel's tiles
    prefetches the same lines: those after the first are hits). Intel-avx512, one thread,
    8 copies of each layer in turn so that their weights come from memory as in the model:
    512 -> 512 at 7 x 7 2.71 -> 2.43 ms, 256 -> 512 stride 2 at 14 x 14 1.30 -> 1.18 ms,
    128 -> 256 stride 2 at 28 x 28 0.98 -> 0.93 ms.

    A step reads ``width`` floats (two lines at 32), so one line a step prefetched half of the
    next panel. A KxK layer with unit stride prefetches ``PREFETCH_WEIGHT_LINES`` lines a step
    (2: the whole panel). Since the 512 -> 512 layer's tile takes two rows
    (``NhwcPlan.image_rows``) that paid: three such layers 6.7-6.9 -> 5.9-6.3 ms at batch 1,
    ResNet-18 at batch 1 25.8 -> 24.9 ms (intel-avx512, one thread, interleaved, load 5-6).
    The strided layers ran 7-10% slower with it, alone, and keep one line; so do the 1x1
    layers (unmeasured).

    Examples
    --------
    >>> prefetch_weight_spec(ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1),
    ...                                   (1, 1), 1), 32)
    [147456, 1, 2]
    >>> prefetch_weight_spec(ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1),
    ...                                   (1, 1), 1), 32) is None
    True
    """
    if PREFETCH_WEIGHT_EVERY <= 0 or g.groups != 1 or not panels_outer(g, width, itemsize):
        return None
    kxk = g.strides == (1, 1) and g.kernel != (1, 1)
    lines = max(1, PREFETCH_WEIGHT_LINES) if kxk else 1
    return [g.kernel[0] * g.kernel[1] * g.in_channels * width, PREFETCH_WEIGHT_EVERY, lines]


def pack_conv2d_nhwc_weight(weight: te.Tensor, kernel_layout: str, width: int) -> te.Tensor:
    """``weight`` (letters ``OIHW`` in any order) as ``[ceil(O/NR), KH, KW, I, NR]``, zero
    beyond ``O``.

    Examples
    --------
    >>> w = te.placeholder((3, 3, 16, 40), "float32", "w")
    >>> [d.value for d in pack_conv2d_nhwc_weight(w, "HWIO", 32).shape]
    [2, 3, 3, 16, 32]
    """
    dims = {c: weight.shape[kernel_layout.index(c)] for c in "OIHW"}
    o = as_int(dims["O"])
    zero = te.const(0, weight.dtype)

    def f(ob, kh, kw, i, r):
        oc = ob * width + r
        at = {"O": oc, "I": i, "H": kh, "W": kw}
        v = weight[tuple(at[c] for c in kernel_layout)]
        return v if o % width == 0 else te.if_then_else(oc < o, v, zero)

    return te.compute((ceil_div(o, width), dims["H"], dims["W"], dims["I"], width), f,
                      "weight_packed")


def conv2d_nhwc_packed(data: te.Tensor, weight: te.Tensor, plan: NhwcPlan,
                       out_dtype: str) -> te.Tensor:
    """The NHWC convolution of ``data`` ``(N, H, W, C)`` with the packed weight
    ``[ceil(O/NR), KH, KW, I, NR]``. Blocks: ``data_pad`` (when there is padding) and
    ``conv2d_nhwc``.

    Examples
    --------
    >>> g = ConvGeometry(16, 8, 8, 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> plan = plan_conv2d_nhwc(g, 16, 32)
    >>> x = te.placeholder((1, 8, 8, 16), "float32", "x")
    >>> w = te.placeholder((1, 3, 3, 16, 32), "float32", "w")
    >>> [d.value for d in conv2d_nhwc_packed(x, w, plan, "float32").shape]
    [1, 8, 8, 32]
    """
    g = plan.geometry
    n = data.shape[0]
    src = pad_nhwc(data, g)
    ipg, opg = g.in_per_group, g.out_per_group
    rc = te.reduce_axis((0, ipg), "rc")
    ry = te.reduce_axis((0, g.kernel[0]), "ry")
    rx = te.reduce_axis((0, g.kernel[1]), "rx")
    (sh, sw), (dh, dw), nr = g.strides, g.dilation, plan.width

    def chan(o):
        if g.groups == 1:
            return rc.var
        if g.is_depthwise:
            return o
        return group_of(o, nr, opg) * ipg + rc.var

    def f(b, y, x, o):
        v = src[b, y * sh + ry * dh, x * sw + rx * dw, chan(o)]
        wt = weight[o // nr, ry, rx, rc, o % nr]
        return te.sum(v.astype(out_dtype) * wt.astype(out_dtype), axis=[ry, rx, rc])

    attrs = {SCHEDULE_RULE: RULE_CONV_NHWC, "rows": plan.rows, "width": nr,
             "flat": int(plan.flat), "lanes": plan.lanes}
    if plan.image_rows > 1:
        attrs["image_rows"] = plan.image_rows
    if streams_output(g, n, dt.itemsize(out_dtype)):
        attrs["nontemporal"] = 1
    if g.groups == 1 and panels_outer(g, nr, dt.itemsize(weight.dtype)):
        attrs["panels_outer"] = 1
    # the input as the block's first read, not by its name: convolutions of equal shapes on
    # inputs of other names are then equal kernels (``BlockBuilder.call_te`` reuses them)
    spec = prefetch_spec(g, plan.rows, nr, 0)
    if spec is not None:
        # read by the schedule, which sets it on the reduction loop (``schedule_conv2d_nhwc``)
        # with the buffer's name
        attrs.update(prefetch_from=spec[0], prefetch_ahead=spec[1], prefetch_every=spec[2])
    else:
        wspec = prefetch_weight_spec(g, nr, dt.itemsize(weight.dtype))
        if wspec is not None:
            # the weight, the block's second read (after the input)
            attrs.update(prefetch_from=1, prefetch_ahead=wspec[0], prefetch_every=wspec[1])
            if wspec[2] > 1:
                attrs["prefetch_lines"] = wspec[2]
    if not plan.flat:
        return te.compute((n, g.out_h, g.out_w, g.out_channels), f, "conv2d_nhwc", attrs=attrs)
    # the pixels of the whole plane in one axis (output pixel p reads input pixel p), so a
    # tile may span rows; the NHWC output is that plane reshaped, and the epilogue's read
    # ``flat[b, y * W + x, o]`` inverts (the schedule inlines it into the write-back)
    ow = g.out_w
    flat = te.compute((n, g.out_h * ow, g.out_channels),
                      lambda b, p, o: f(b, p // ow, p % ow, o), "conv2d_nhwc_flat",
                      attrs=attrs)
    return te.compute((n, g.out_h, ow, g.out_channels),
                      lambda b, y, x, o: flat[b, y * ow + x, o], "conv2d_nhwc")


def schedule_conv2d_nhwc(sch: Schedule, name: str, target: Target,
                         gemv_rows: PrimExpr | None = None) -> None:
    """The NHWC convolution: a tile of ``rows`` output pixels x ``width`` channels (one packed
    panel) accumulates in registers over ``(ry, rx, rc)``: per step ``rows`` broadcast inputs,
    ``width / lanes`` vector loads of the panel, ``rows * width / lanes`` FMAs. Image rows
    (with the batch) run in parallel; the epilogue is computed in the write-back."""
    # ``flat``: tiles of the whole plane's pixels (a 1x1 unit-stride layer: output pixel p
    # reads input pixel p), so a 14 x 14 plane takes 32 tiles of 6 and one of 4 where each
    # row would split 6 + 6 + 2
    flat = ann_int(sch.get(sch.get_block(name)), "flat", 0)
    # the buffer the tile prefetches from (``prefetch_spec``), named while the block's reads
    # are still the computation's (the annotation holds its position among them)
    fresh = sch.get(sch.get_block(name))
    prefetch_src = (fresh.reads[ann_int(fresh, "prefetch_from")].buffer.name
                    if "prefetch_from" in dict(fresh.annotations) else None)
    block, (rows, width), loops = conv_tile_block(sch, name, ("rows", "width"),
                                                   6 if flat else 7)
    if flat:
        (b, x, o, ry, rx, rc), rows_of = loops, []
    else:
        b, y, x, o, ry, rx, rc = loops
        rows_of = [y]
    image_rows = ann_int(sch.get(block), "image_rows", 1)
    pixels = loop_extent(sch.get(x))
    lanes = max(1, block_lanes(sch.get(block), target))
    plan_lanes = ann_int(sch.get(block), "lanes", lanes)      # 8 on a 24-channel panel
    vectors = width // plan_lanes
    o0, o1 = sch.split(o, [None, width])
    x0, x1 = sch.split(x, [None, rows])
    # a tile of ``image_rows`` rows: their loop inside the reduction beside the pixels'
    # (a ragged last tile of rows gets a loop of its own from LoopPartition)
    tile_rows = []
    if image_rows > 1 and rows_of:
        y0, y1 = sch.split(y, [None, image_rows])
        rows_of, tile_rows = [y0], [y1]
    # one parallel loop, not a fused one (see schedule_conv2d_nchw): the image rows, or the
    # first of the loops below them with enough iterations that split evenly over the cores
    # (a 7 x 7 plane's 9 tiles of 6 pixels on two cores, one of them a single pixel, kept a
    # core idle for a ninth of the time: its 16-channel panels split instead)
    cores = num_cores(target)
    candidates = rows_of + [x0, o0]

    def balance(rv) -> float:
        ragged = rv is x0 and pixels is not None and pixels % rows
        return core_balance(loop_extent(sch.get(rv)), cores,
                            (pixels % rows) / rows if ragged else 1.0)

    # a weight larger than L2 (``panels_outer``): each panel's weights used by every row of
    # the plane before the next panel's are read
    by_panel = bool(ann_int(sch.get(block), "panels_outer", 0))
    if by_panel:
        candidates = [o0] + rows_of + [x0]
    enough = [rv for rv in candidates if (loop_extent(sch.get(rv)) or 0) >= 2 * cores]
    par = next((rv for rv in enough if balance(rv) >= 0.95),
               enough[0] if enough else candidates[0])
    if by_panel:
        tiles = [o0, x0]
        sch.reorder(b, o0, *rows_of, x0, ry, rx, rc, *tile_rows, x1, o1)
    else:
        tiles = [o0, x0] if par is o0 else [x0, o0]
        sch.reorder(b, *rows_of, *tiles, ry, rx, rc, *tile_rows, x1, o1)
    outer = len(rows_of) + 3
    sch.parallel(par)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tiles[1])
    fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, ry)
    for rv in tile_rows:
        sch.unroll(rv)
    sch.unroll(x1)
    if (loop_extent(sch.get(rx)) or 1) * rows * image_rows * width // lanes <= \
            MAX_UNROLLED_FMAS:
        sch.unroll(rx)
    if vectors & (vectors - 1):
        # three vectors: one vector loop per lane group, unrolled (a 24-lane vector is no
        # machine width)
        for blk in (block, init, acc):
            *_, last = sch.get_loops(blk)
            group, inner = sch.split(last, [vectors, plan_lanes])
            if blk is not block:
                continue
            sch.unroll(group)
            sch.vectorize(inner)
    else:
        sch.vectorize(o1)
    finish_tile_block(sch, init, outer)
    finish_tile_block(sch, acc, outer)
    if ann_int(sch.get(block), "nontemporal", 0) and not vectors & (vectors - 1):
        # the output far larger than the caches: written without reading its lines in, from
        # NONTEMPORAL_MIN_BYTES of the whole output (``streams_output``)
        sch.annotate(sch.get_loops(acc)[-1], ANN_NONTEMPORAL_STORE, NONTEMPORAL_MIN_BYTES)
    if prefetch_src is not None:
        # the next tiles' input lines (``prefetch_spec``), or the next panel's weights
        # (``prefetch_weight_spec``), prefetched along the reduction
        sch.annotate(rc, ANN_SOFTWARE_PREFETCH, [prefetch_src,
                                                 ann_int(sch.get(block), "prefetch_ahead"),
                                                 ann_int(sch.get(block), "prefetch_every"),
                                                 ann_int(sch.get(block), "prefetch_lines", 1)])


FAMILY = KernelFamily(
    name="conv2d_nhwc", rule=RULE_CONV_NHWC, plan=plan_conv2d_nhwc, compute=conv2d_nhwc_packed,
    pack=pack_conv2d_nhwc_weight, schedule=schedule_conv2d_nhwc, tile=True,
    stages={RULE_PAD: schedule_pad})
