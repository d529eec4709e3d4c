"""Kernels on pre-packed weights, in ``tensorir.te``: what ``AlterLayout`` puts in place of
``conv2d``, ``matmul`` and ``linear`` on CPU targets, and the packing kernels that put their
weights in the packed layouts (which ``FoldConstant`` runs at build time).

Each kernel marks its main blocks with the annotation ``"schedule_rule"`` (TVM's name for a
block-level schedule hint), which ``relax.default_schedules`` reads to give the block its
dedicated recipe:

- ``conv2d_nchw`` (``RULE_CONV_NCHW``), the *flat* direct convolution of
  ``benchmarks/schedules/conv2d.py`` generalised to strides, padding, dilation and groups. The
  zero-padded input is stored row after row per channel (``data_pad[n, c, q]``,
  ``q = row * Wq + col``), so each tap ``(ry, rx)`` of the output run ``p = oh * Wq + ow`` is
  the contiguous run ``data_pad[n, c, p + ry * Wq + rx]``: a tile of ``R`` output channels x
  ``V`` vectors of positions accumulates in registers while the reduction over
  ``(c, ry, rx)`` streams by, one vector load per tap and vector, one broadcast weight per tap
  and channel. A stride ``s`` splits the input into its ``s x s`` phase planes first
  (``data_pad[n, c, a, b, q]`` holds input rows ``s i + a`` and columns ``s j + b``), which makes
  every tap a stride-1 run again. Positions with ``ow >= OW`` (``Wq - OW`` junk columns per
  row) are computed and dropped by the copy to NCHW; when there are none (``1x1`` convolutions
  without padding) the kernel reads the input in place and writes NCHW directly, so the
  epilogue is applied to the accumulators. The weight is packed ``OIHW -> [O/R, I, KH, KW, R]``
  (``OIHW{R}o``): the ``R`` weights of one tap are adjacent, and the tile streams its weights.
- ``conv2d_nhwc`` (``RULE_CONV_NHWC``): a GEMM-like tile of output pixels x output channels;
  the weight packed ``[ceil(O/NR), KH, KW, I, NR]`` so that a tile's ``NR`` channels of one tap
  and input channel are one contiguous vector run.
- ``pool2d_nchw_phased``: strided NCHW max / average pooling on the stride phase planes of its
  padded input (the convolution's trick), so every window tap reads a contiguous run of
  output columns instead of every ``s``-th element.
- ``depthwise_conv2d_nchw_rows`` (``RULE_DW``): a depthwise convolution per output row from
  the window's ``KH`` zero-padded input rows, copied for that row into a small buffer, then
  ``KH x KW`` vector FMAs per vector of output columns (stride ``s``: every ``s``-th column of
  the buffer); no full-image padding or phase-plane copy.
- ``dense`` (``RULE_DENSE``): ``matmul(x, W)`` / ``linear`` with ``W`` packed into panels
  ``[ceil(N/NR), K, NR]`` (the ``[n // 16, k, 16]`` packing of the GEMM recipe,
  ``docs/gemm-tutorial.md``), zero-padded to whole panels.

Examples
--------
>>> from tilecraft.tensorir import te
>>> g = ConvGeometry(in_channels=64, height=56, width=56, out_channels=64, kernel=(3, 3),
...                  strides=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)
>>> plan = plan_conv2d_nchw(g, lanes=16, registers=32)
>>> (plan.oc_block, plan.vectors, plan.row_width, plan.direct_out)
(4, 4, 58, False)
"""
from __future__ import annotations

from dataclasses import dataclass

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import IntImm, PrimExpr

__all__ = ["SCHEDULE_RULE", "RULE_CONV_NCHW", "RULE_CONV_NHWC", "RULE_DENSE", "RULE_PAD",
           "RULE_CONV_NCHW_CVEC", "ConvGeometry", "NchwPlan", "plan_conv2d_nchw", "conv2d_nchw_packed",
           "ChannelVectorPlan", "plan_conv2d_nchw_cvec", "cvec_tiles_plan", "conv2d_nchw_cvec",
           "nchw_kernel_plan",
           "nchw_plan_candidates", "nhwc_kernel_plan", "nhwc_tile_fills", "plan_to_json",
           "plan_from_json",
           "pack_conv2d_nchw_weight", "NhwcPlan", "plan_conv2d_nhwc", "conv2d_nhwc_packed",
           "pack_conv2d_nhwc_weight", "dense_panel_width", "dense_packed", "pack_dense_weight",
           "pool2d_nchw_phased", "pool2d_nchw_separable", "RULE_POOL", "RULE_POOL_ROWS",
           "depthwise_conv2d_nchw_rows", "RULE_DW", "RULE_DW_ROWS"]

SCHEDULE_RULE = "schedule_rule"
RULE_CONV_NCHW = "tilecraft.conv2d_nchw_flat"
RULE_CONV_NHWC = "tilecraft.conv2d_nhwc_packed"
RULE_CONV_NCHW_CVEC = "tilecraft.conv2d_nchw_cvec"
RULE_DENSE = "tilecraft.dense_packed"
RULE_PAD = "tilecraft.conv2d_pad"     # a padding / phase-plane stage, kept (not inlined)
RULE_POOL = "tilecraft.pool2d_separable"        # the column stage of a separable pooling
RULE_POOL_ROWS = "tilecraft.pool2d_rows"        # its row stage, placed by RULE_POOL
RULE_DW = "tilecraft.depthwise_rows"             # a depthwise convolution over padded rows
RULE_DW_ROWS = "tilecraft.depthwise_pad_rows"    # its padded input rows, placed by RULE_DW


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ---------------------------------------------------------------------------------------------
# geometry


@dataclass(frozen=True)
class ConvGeometry:
    """The static attributes of one 2-D convolution (the batch may stay symbolic).

    ``padding`` is ``(top, left, bottom, right)``; ``kernel``, ``strides`` and ``dilation`` are
    ``(h, w)`` pairs.
    """

    in_channels: int
    height: int
    width: int
    out_channels: int
    kernel: tuple
    strides: tuple
    padding: tuple
    dilation: tuple
    groups: int

    @property
    def in_per_group(self) -> int:
        return self.in_channels // self.groups

    @property
    def out_per_group(self) -> int:
        return self.out_channels // self.groups

    @property
    def padded(self) -> tuple[int, int]:
        pt, pl, pb, pr = self.padding
        return self.height + pt + pb, self.width + pl + pr

    @property
    def out_h(self) -> int:
        return (self.padded[0] - self.dilation[0] * (self.kernel[0] - 1) - 1) // \
            self.strides[0] + 1

    @property
    def out_w(self) -> int:
        return (self.padded[1] - self.dilation[1] * (self.kernel[1] - 1) - 1) // \
            self.strides[1] + 1

    @property
    def is_depthwise(self) -> bool:
        return self.in_per_group == 1 and self.out_per_group == 1

    def macs(self) -> int:
        """Multiply-adds per image."""
        return (self.out_channels * self.out_h * self.out_w * self.in_per_group *
                self.kernel[0] * self.kernel[1])


# ---------------------------------------------------------------------------------------------
# NCHW: the flat direct convolution


@dataclass(frozen=True)
class NchwPlan:
    """How ``conv2d_nchw_packed`` lays one convolution out (see the module docstring).

    Attributes
    ----------
    oc_block, vectors, lanes : int
        The register tile: ``R`` output channels x ``V`` vectors of ``L`` positions.
    phased : bool
        A stride above 1: the input is split into its phase planes.
    row_width : int
        ``Wq``: the flat row stride of the (phase-plane) input and of the flat output.
    out_len : int
        Flat output positions per channel (``out_h * Wq`` rounded up to whole tiles), or
        ``out_h * out_w`` when ``direct_out``.
    plane_len : int
        Flat input length per channel and phase plane (whole rows, zero beyond the image).
    direct_in : bool
        The input is read in place (no padding stage).
    direct_out : bool
        No junk columns: the convolution writes NCHW itself (and the epilogue is applied to
        its accumulators).
    """

    geometry: ConvGeometry
    oc_block: int
    vectors: int
    lanes: int
    phased: bool
    row_width: int
    out_len: int
    plane_len: int
    direct_in: bool
    direct_out: bool

    def row_offset(self, ry: int) -> tuple[int, int]:
        """(phase, row offset) of the kernel row ``ry``."""
        g = self.geometry
        t = ry * g.dilation[0]
        return (t % g.strides[0], t // g.strides[0])

    def col_offset(self, rx: int) -> tuple[int, int]:
        g = self.geometry
        t = rx * g.dilation[1]
        return (t % g.strides[1], t // g.strides[1])


def _nchw_layout(g: ConvGeometry, tile: int, direct_out_ok: bool):
    """(phased, Wq, out_len, plane_len, direct_in, direct_out) for tiles of ``tile`` positions,
    or None when the direct output is asked for and does not fit."""
    sh, sw = g.strides
    phased = sh > 1 or sw > 1
    hp, wp = g.padded
    wq = _ceil_div(wp, sw) if phased else wp
    oh, ow = g.out_h, g.out_w
    max_off = ((g.kernel[0] - 1) * g.dilation[0] // sh) * wq + \
        (g.kernel[1] - 1) * g.dilation[1] // sw
    if direct_out_ok:
        # the output written in place: no junk columns, whole tiles, and each tile a rectangle
        # of the (oh, ow) plane (a multiple of rows, or a part of one row)
        if wq != ow or (oh * ow) % tile or (tile % ow and ow % tile):
            return None
        out_len = oh * ow
    else:
        out_len = _ceil_div(oh * wq, tile) * tile
    plane_len = _ceil_div(out_len + max_off, wq) * wq
    direct_in = (not phased and g.padding == (0, 0, 0, 0) and wq == g.width and
                 out_len + max_off <= g.height * g.width)
    if direct_in:
        plane_len = g.height * g.width
    return phased, wq, out_len, plane_len, direct_in, direct_out_ok


def plan_conv2d_nchw(g: ConvGeometry, lanes: int, registers: int,
                     oc_block: int | None = None, vectors: int | None = None) -> NchwPlan:
    """Choose the register tile and the flat layout of an NCHW convolution.

    The tile ``R x V`` (``R`` dividing the output channels, ``R * V`` accumulators, at most 24
    with 32 vector registers and 12 with 16) is scored by the work it does per useful output
    (junk columns, positions rounded up to whole tiles), how many accumulators it keeps busy
    (16 with 32 registers: fewer measured slower, 2 x 7 against 4 x 4 on a 3x3; all 12 with
    16: on AVX2 the 4 x 3 tile ran ResNet-50's convolutions up to 2.4x faster than the 8 x 1
    and 2 x 5 tiles that a target of 8 chose, the whole model 0.58x -> 0.68x onnxruntime)
    and its loads per FMA (``(R + V) / (R V)``); each copy stage (padding, the copy to NCHW) costs about two cycles
    per element against ``I * KH * KW / L`` cycles of FMAs. Ties go to the smaller tile.
    With 16 registers a 1x1 layer with fewer than 512 input channels takes the best tile
    that reads its input in place (no padded copy) when the best tile overall does not
    (4 x 2 over 4 x 3 at 56 x 56: measured, the copy costs more than the model says).

    Examples
    --------
    >>> g = ConvGeometry(64, 56, 56, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> p = plan_conv2d_nchw(g, 16, 32)      # a 1x1 convolution reads and writes NCHW in place
    >>> (p.oc_block, p.vectors, p.direct_in, p.direct_out)
    (2, 7, True, True)
    """
    budget = 24 if registers >= 32 else 12
    want = 16 if registers >= 32 else 12
    useful = g.out_h * g.out_w
    # a copy stage moves each element through memory once (and, for the output, applies the
    # epilogue with a masked row tail): about 2 cycles, against ``I * KH * KW / L`` cycles of
    # FMAs per output element (measured: a 1x1 64 -> 256 convolution ran 1.5x faster writing
    # NCHW itself than through the copy)
    copy_cost = 2.0 * lanes / (g.in_per_group * g.kernel[0] * g.kernel[1])
    best = in_place = None
    rs = [oc_block] if oc_block else [r for r in _divisors(g.out_channels) if r <= budget]
    for r in rs:
        vs = [vectors] if vectors else range(1, budget // r + 1)
        for v in vs:
            tile = v * lanes
            for direct in (True, False):
                lay = _nchw_layout(g, tile, direct)
                if lay is None:
                    continue
                phased, wq, out_len, plane_len, direct_in, direct_out = lay
                acc = r * v
                work = useful / out_len
                busy = min(acc, want) / want
                loads = acc / max(acc, r + v)
                copies = (0 if direct_in else 1) + (0 if direct_out else 1)
                score = work * busy * loads / (1 + copies * copy_cost)
                key = (round(score, 4), -acc, -abs(r - 4))
                plan = NchwPlan(g, r, v, lanes, phased, wq, out_len, plane_len, direct_in,
                                direct_out)
                if best is None or key > best[0]:
                    best = (key, plan)
                # With 16 registers, a tile that reads a 1x1 layer's input in place beat
                # the 4 x 3 tile that needs a padded copy of it (4 x 2, 8 accumulators,
                # is enough for two FMA pipes): 1.04-1.22x on ResNet-50's 56 x 56 and
                # 28 x 28 1x1 layers (Zen 3). Tiles with more broadcasts than twice their
                # vectors (8 x 1) are load-bound and stay out.
                if direct_in and registers < 32 and acc >= 8 and r <= 2 * v and \
                        (in_place is None or key > in_place[0]):
                    in_place = (key, plan)
    if best is None:
        raise ValueError(f"conv2d: no register tile fits {g}")
    if in_place is not None and not best[1].direct_in and g.in_per_group < 512:
        return in_place[1]
    return best[1]


def _phases_read(g: ConvGeometry) -> tuple[int, int]:
    """How many phase planes per axis the flat kernel reads: the taps' offsets ``t * d``
    modulo the stride are ``0 .. min(K, s) - 1`` with a dilation of 1 (a 1x1 layer with a
    stride reads only phase 0), any of them otherwise."""
    (kh, kw), (sh, sw), (dh, dw) = g.kernel, g.strides, g.dilation
    return (min(kh, sh) if dh == 1 else sh, min(kw, sw) if dw == 1 else sw)


def _image_at(data: te.Tensor, b, ch, row, col, pad_value):
    """``data[b, ch, row, col]`` of NCHW ``data`` where ``(row, col)`` is inside the image,
    ``pad_value`` outside it (the read is guarded, so it never leaves the image)."""
    h, w = _as_int(data.shape[2]), _as_int(data.shape[3])
    inside = te.all(row >= 0, row < h, col >= 0, col < w)
    return te.if_then_else(inside, data[b, ch, row, col], pad_value)


def _pad_image(data: te.Tensor, padding, rows: int, cols: int, pad_value) -> te.Tensor:
    """NCHW ``data`` padded by ``padding`` (top, left, ...) to ``rows x cols`` (the pad value
    beyond the image, also past the bottom / right padding); ``data`` itself when nothing
    changes."""
    n, c, h, w = data.shape
    h, w = _as_int(h), _as_int(w)
    pt, pl = padding[0], padding[1]
    if (pt, pl, rows, cols) == (0, 0, h, w):
        return data

    def f(b, ch, y, x):
        inside = te.all(y >= pt, y < pt + h, x >= pl, x < pl + w)
        return te.if_then_else(inside, data[b, ch, y - pt, x - pl], pad_value)
    return te.compute((n, c, rows, cols), f, "data_pad", attrs={SCHEDULE_RULE: RULE_PAD})


# Bytes between pixels of a padded NHWC image that a multiple of this is offset by one cache
# line: pixels 4 KiB apart fall in the same L1 set (32 KiB, 8 ways: 64 sets of 64 bytes).
PIXEL_PITCH_ALIAS = 1024


def _pad_nhwc(data: te.Tensor, g: ConvGeometry) -> te.Tensor:
    """NHWC ``data`` zero-padded by ``g.padding``; ``data`` itself without padding. When a
    pixel's channels are a multiple of 1 KiB, each pixel gets one more cache line of
    channels (never read): a strided 3x3 tile's taps read pixels 4 KiB apart, which all fell
    in one L1 set (ResNet-50's 512 -> 512 stride-2 layer on 16 x 16 x 512 padded pixels:
    0.64x the NCHW kernel, 1.0x with the line)."""
    if not any(g.padding):
        return data
    pt, pl = g.padding[0], g.padding[1]
    hp, wp = g.padded
    zero = te.const(0, data.dtype)
    channels, itemsize = g.in_channels, max(1, dt.bits(data.dtype) // 8)
    if (channels * itemsize) % PIXEL_PITCH_ALIAS == 0:
        channels += 64 // itemsize

    def pad_value(b, y, x, c):
        inside = te.all(y >= pt, y < pt + g.height, x >= pl, x < pl + g.width,
                        c < g.in_channels)
        return te.if_then_else(inside, data[b, y - pt, x - pl, te.min(c, g.in_channels - 1)],
                               zero)
    return te.compute((data.shape[0], hp, wp, channels), pad_value, "data_pad",
                      attrs={SCHEDULE_RULE: RULE_PAD})


def pack_conv2d_nchw_weight(weight: te.Tensor, kernel_layout: str, oc_block: int) -> te.Tensor:
    """``weight`` (any kernel layout of the letters ``OIHW``) as ``[O/R, I, KH, KW, R]``.

    Examples
    --------
    >>> w = te.placeholder((64, 32, 3, 3), "float32", "w")
    >>> [d.value for d in pack_conv2d_nchw_weight(w, "OIHW", 4).shape]
    [16, 32, 3, 3, 4]
    """
    dims = {c: weight.shape[kernel_layout.index(c)] for c in "OIHW"}
    o = _as_int(dims["O"])
    if o % oc_block:
        raise ValueError(f"pack_conv2d_nchw_weight: {oc_block} does not divide {o} channels")

    def f(ob, i, kh, kw, r):
        at = {"O": ob * oc_block + r, "I": i, "H": kh, "W": kw}
        return weight[tuple(at[c] for c in kernel_layout)]

    return te.compute((o // oc_block, dims["I"], dims["H"], dims["W"], oc_block), f,
                      "weight_packed")


def conv2d_nchw_packed(data: te.Tensor, weight: te.Tensor, plan: NchwPlan,
                       out_dtype: str) -> te.Tensor:
    """The NCHW convolution of ``data`` ``(N, C, H, W)`` with the packed weight
    ``[O/R, I, KH, KW, R]`` (``pack_conv2d_nchw_weight``), laid out by ``plan``. Blocks:
    ``data_pad`` (unless ``plan.direct_in``), ``conv2d_flat`` + ``conv2d_nchw`` (the copy) or,
    when ``plan.direct_out``, ``conv2d_nchw`` alone.

    Examples
    --------
    >>> g = ConvGeometry(8, 10, 10, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    >>> plan = plan_conv2d_nchw(g, 16, 32)
    >>> x = te.placeholder((te.var("n"), 8, 10, 10), "float32", "x")
    >>> w = te.placeholder((8 // plan.oc_block, 8, 3, 3, plan.oc_block), "float32", "w")
    >>> y = conv2d_nchw_packed(x, w, plan, "float32")
    >>> [str(d) for d in y.shape]
    ['n', '8', '5', '5']
    """
    g = plan.geometry
    n = data.shape[0]
    c_in, w = g.in_channels, g.width
    sh, sw = g.strides
    pt, pl = g.padding[0], g.padding[1]
    wq, r_blk = plan.row_width, plan.oc_block
    ipg, opg = g.in_per_group, g.out_per_group
    zero = te.const(0, data.dtype)

    if plan.direct_in:
        def src(b, ch, a, bb, q):
            return data[b, ch, q // w, q % w]
    elif plan.phased:
        pa, pb = _phases_read(g)
        if pa * pb == sh * sw:
            # two copies: the zero padding (unit stride, vectorized) then the phase split
            # (every s-th element, no condition); one copy doing both is a branch per element
            rows = plan.plane_len // wq
            padded = _pad_image(data, g.padding, rows * sh, wq * sw, zero)

            def phase(b, ch, a, bb, q):
                return padded[b, ch, (q // wq) * sh + a, (q % wq) * sw + bb]
        else:
            # only some phase planes are read (one for a 1x1 layer with a stride): they are
            # taken from the image with the border test per element, instead of padding all
            # of it first (four times what a 1x1 stride-2 layer reads)
            def phase(b, ch, a, bb, q):
                return _image_at(data, b, ch, (q // wq) * sh + a - pt,
                                 (q % wq) * sw + bb - pl, zero)
        data_pad = te.compute((n, c_in, pa, pb, plan.plane_len), phase, "data_phases",
                              attrs={SCHEDULE_RULE: RULE_PAD, "row_width": wq})

        def src(b, ch, a, bb, q):
            return data_pad[b, ch, a, bb, q]
    else:
        def pad_value(b, ch, q):
            return _image_at(data, b, ch, q // wq - pt, q % wq - pl, zero)
        data_pad = te.compute((n, c_in, plan.plane_len), pad_value, "data_pad",
                              attrs={SCHEDULE_RULE: RULE_PAD, "row_width": wq})

        def src(b, ch, a, bb, q):
            return data_pad[b, ch, q]

    rc = te.reduce_axis((0, ipg), "rc")
    ry = te.reduce_axis((0, g.kernel[0]), "ry")
    rx = te.reduce_axis((0, g.kernel[1]), "rx")
    dh, dw = g.dilation
    ty, tx = ry.var * dh, rx.var * dw
    a, roff = (ty % sh, ty // sh) if sh > 1 else (0, ty)
    b_, coff = (tx % sw, tx // sw) if sw > 1 else (0, tx)

    def chan(o):
        if g.groups == 1:
            return rc.var
        if opg == 1 and ipg == 1:
            return o
        return (o // opg) * ipg + rc.var

    def term(bi, o, p):
        x = src(bi, chan(o), a, b_, p + roff * wq + coff)
        wt = weight[o // r_blk, rc, ry, rx, o % r_blk]
        return x.astype(out_dtype) * wt.astype(out_dtype)

    attrs = {SCHEDULE_RULE: RULE_CONV_NCHW, "oc_block": r_blk, "vectors": plan.vectors,
             "lanes": plan.lanes}
    if plan.direct_out:
        ow = g.out_w
        return te.compute((n, g.out_channels, g.out_h, ow),
                          lambda bi, o, y, x: te.sum(term(bi, o, y * ow + x), axis=[rc, ry, rx]),
                          "conv2d_nchw", attrs=attrs)
    flat = te.compute((n, g.out_channels, plan.out_len),
                      lambda bi, o, p: te.sum(term(bi, o, p), axis=[rc, ry, rx]),
                      "conv2d_flat", attrs=attrs)
    return te.compute((n, g.out_channels, g.out_h, g.out_w),
                      lambda bi, o, y, x: flat[bi, o, y * wq + x], "conv2d_nchw")


# ---------------------------------------------------------------------------------------------
# NCHW with the output channels in the vector lanes


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
    if plan is not None and registers >= 32 and _narrow(plan, registers):
        plan = _cvec_tile(g, lanes, registers, 20) or plan
    return plan


def _narrow(plan: ChannelVectorPlan, registers: int) -> bool:
    """Whether the tile has too few accumulators to hide the loads: under 12 with 32
    registers, under 6 with 16 (where 7 x 8 on 7 x 7 planes still beat the flat kernel)."""
    return plan.rows * plan.vectors < (12 if registers >= 32 else 6)


# A channel block's weight slice that stays in L1 while the image streams through: half of a
# 32 KiB L1 data cache (x86 cores since Haswell / Zen, most ARM cores have 32-64 KiB).
L1_WEIGHT_BYTES = 16 * 1024


def _cvec_fits(g: ConvGeometry, rows: int, width: int, lanes: int, registers: int,
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
    kc = max(d for d in _divisors(g.in_per_group) if d <= cap)
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
        if _cvec_fits(g, rows, v * lanes, lanes, registers, across_rows=True):
            return ChannelVectorPlan(g, rows, v * lanes, lanes, True, _k_chunk(g, v * lanes))
    return None


def _cvec_widest_rows(g: ConvGeometry, lanes: int, registers: int,
                      budget: int) -> list[tuple[int, int]]:
    """For each width of one to four vectors that fits ``g``: ``(rows, width)`` with the
    most rows keeping ``rows * vectors <= budget`` accumulators."""
    out = []
    for v in range(1, 5):
        width = v * lanes
        rows = [m for m in _divisors(g.out_w)
                if m * v <= budget and _cvec_fits(g, m, width, lanes, registers)]
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
    for m, width in _cvec_widest_rows(g, lanes, registers, budget):
        v = width // lanes
        fits = g.kernel == (1, 1) and g.in_per_group * width * 4 <= L1_WEIGHT_BYTES
        key = (m * v, fits, v)
        if best is None or key > best[0]:
            best = (key, ChannelVectorPlan(g, m, width, lanes))
    return best[1] if best else None


def nchw_kernel_plan(g: ConvGeometry, lanes: int,
                     registers: int) -> "NchwPlan | ChannelVectorPlan":
    """The NCHW kernel for ``g``: the flat kernel's plan, or the channel-vector plan where the
    flat kernel would waste lanes (an output plane that whole vectors of positions cover
    badly) and the channel-vector tile applies. With 16 registers, a long reduction (512 or
    more multiply-adds per output) takes the tiles across rows (``cvec_tiles_plan``) and a
    strided KxK layer with a short one (a stem) the row tiles with 8 accumulators.

    Examples
    --------
    >>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> type(nchw_kernel_plan(g, 16, 32)).__name__
    'ChannelVectorPlan'
    """
    flat = plan_conv2d_nchw(g, lanes, registers)
    cvec = plan_conv2d_nchw_cvec(g, lanes, registers)
    if cvec is None:
        return flat
    # With 32 registers the flat kernel wins only on large stride-1 planes (ResNet-50's
    # 56 x 56 layers: equal or up to 10% faster); with a stride it copies the input into
    # phase planes, and on small planes it computes junk columns and half-empty vectors
    # (7 x 7: 49 of 64 lanes; 28 x 28: 30 columns for 28), where the channel-vector kernel
    # measured 1.1-1.6x faster (Zen 4). With 16 registers (AVX2) its tiles are too small
    # (12 accumulators less the weight vectors): it won only on the 7 x 7 planes (1.3x) and
    # lost 2-20% elsewhere.
    useful = g.out_h * g.out_w / flat.out_len
    if registers < 32 and g.in_per_group * g.kernel[0] * g.kernel[1] >= 512:
        # With 16 registers the row-dividing tiles are small (12 x 1 and 6 x 2 divide no
        # ResNet plane) and a long reduction streams each channel block's weights from L2
        # for every tile; the tiles across rows keep 12 accumulators and chunk the reduction.
        # Zen 3, ResNet-50's layers with 512 or more multiply-adds per output: 1.0-2.0x
        # faster than either kernel (the 7 x 7 1x1 layers 1.7-2x); with fewer, the flat
        # kernel stayed 5-10% ahead.
        tiles = cvec_tiles_plan(g, lanes, registers)
        if tiles is not None:
            return tiles
    if _narrow(cvec, registers):
        # a narrow tile (an output width with no fitting divisor: 17, 149) is load-bound:
        # Inception's 3x3 stride-2 layer at 1 x 64 ran at 0.42x onnxruntime, the phased flat
        # kernel at 0.83x (Zen 4)
        return flat
    if registers >= 32:
        return cvec if flat.phased or useful < 0.95 else flat
    if flat.phased and g.kernel != (1, 1):
        # a strided KxK layer (a stem): the flat kernel copies the input into phase planes;
        # the row tiles read it in place. ResNet-50's 7x7 stride-2 stem ran 1.25x faster as
        # 4 x 16 than the flat 4 x 3 (2 x 32, the same 8 accumulators with more weight
        # vectors in registers, ran no faster than flat; Zen 3)
        rows = [(m * (w // lanes), -abs(w // lanes - 2), m, w)
                for m, w in _cvec_widest_rows(g, lanes, registers, 12)]
        if rows and max(rows)[0] >= 8:
            _, _, m, w = max(rows)
            return ChannelVectorPlan(g, m, w, lanes)
    return cvec if useful < 0.8 else flat


def nchw_plan_candidates(g: ConvGeometry, lanes: int,
                         registers: int) -> list["NchwPlan | ChannelVectorPlan"]:
    """The NCHW kernels ``relax.tune_layouts`` measures for ``g``: ``nchw_kernel_plan``'s
    choice first, then the flat kernel's best tile for each channel block ``R`` of 2, 4, 8
    and 16 (``plan_conv2d_nchw(..., oc_block=R)``), then the channel-vector tile with the
    most accumulators for each width of one to four vectors; no plan twice.

    Examples
    --------
    >>> g = ConvGeometry(64, 56, 56, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> [plan_to_json(p)["kind"] for p in nchw_plan_candidates(g, 16, 32)][:3]
    ['flat', 'flat', 'flat']
    """
    plans = [nchw_kernel_plan(g, lanes, registers)]
    budget = 24 if registers >= 32 else 12
    for r in (2, 4, 8, 16):
        if r <= budget and g.out_channels % r == 0:
            try:
                plans.append(plan_conv2d_nchw(g, lanes, registers, oc_block=r))
            except ValueError:
                pass     # no tile of that block fits
    acc = 16 if registers >= 32 else 12
    for m, width in _cvec_widest_rows(g, lanes, registers, acc):
        if m * (width // lanes) * 2 >= acc:   # half the accumulators or more
            plans.append(ChannelVectorPlan(g, m, width, lanes))
    for v in (4, 2):
        tiles = cvec_tiles_plan(g, lanes, registers, vectors=v)
        if tiles is not None:
            plans.append(tiles)
    out, seen = [], set()
    for p in plans:
        key = tuple(sorted(plan_to_json(p).items()))
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def plan_to_json(plan: "NchwPlan | ChannelVectorPlan") -> dict:
    """The tile of an NCHW plan as a JSON object (what a layout decision stores):
    ``{"kind": "flat", "oc_block": R, "vectors": V}`` or
    ``{"kind": "cvec", "rows": M, "width": W}``.

    Examples
    --------
    >>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> plan_to_json(nchw_kernel_plan(g, 16, 32))
    {'kind': 'cvec', 'rows': 7, 'width': 32}
    """
    if isinstance(plan, ChannelVectorPlan):
        out = {"kind": "cvec", "rows": plan.rows, "width": plan.width}
        if plan.across_rows:
            out.update(across_rows=True, k_chunk=plan.k_chunk)
        return out
    return {"kind": "flat", "oc_block": plan.oc_block, "vectors": plan.vectors}


def plan_from_json(g: ConvGeometry, data: dict, lanes: int,
                   registers: int) -> "NchwPlan | ChannelVectorPlan":
    """The plan ``plan_to_json`` wrote, for ``g``; ``ValueError`` naming the problem when it
    does not fit ``g`` (a tile that does not divide the channels or the row, more
    accumulators than registers, an unknown kind).

    Examples
    --------
    >>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> plan_from_json(g, {"kind": "cvec", "rows": 7, "width": 16}, 16, 32).width
    16
    """
    def pos_int(name):
        v = data.get(name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"conv2d plan {data}: {name!r} must be a positive integer")
        return v
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "cvec":
        rows, width = pos_int("rows"), pos_int("width")
        across = data.get("across_rows", False)
        k_chunk = data.get("k_chunk", 0)
        if not isinstance(across, bool) or not isinstance(k_chunk, int) or \
                isinstance(k_chunk, bool) or k_chunk < 0 or \
                (k_chunk and (not across or g.in_per_group % k_chunk)):
            raise ValueError(f"conv2d plan {data}: 'across_rows' must be a boolean and "
                             f"'k_chunk' 0 or a divisor of the {g.in_per_group} input "
                             f"channels per group (with across_rows)")
        if not _cvec_fits(g, rows, width, lanes, registers, across_rows=across):
            raise ValueError(f"conv2d plan {data} does not fit {g} with {lanes} lanes and "
                             f"{registers} registers")
        return ChannelVectorPlan(g, rows, width, lanes, across, k_chunk)
    if kind == "flat":
        r, v = pos_int("oc_block"), pos_int("vectors")
        if g.out_channels % r or r * v > registers:
            raise ValueError(f"conv2d plan {data} does not fit {g} with {registers} registers")
        return plan_conv2d_nchw(g, lanes, registers, oc_block=r, vectors=v)
    raise ValueError(f"conv2d plan {data!r}: kind must be 'flat' or 'cvec'")


def _group_of(o, width: int, out_per_group: int):
    """The group of output channel ``o`` in a kernel whose tile holds ``width`` channels of
    one group: ``o // width * width // out_per_group``, which is constant over the tile's
    vector of channels (``o // out_per_group`` is the same value, but varies with ``o``'s
    lanes as far as the code generator can tell, so each lane's input was gathered: AlexNet's
    grouped 5x5 layer ran at 7.6 GFLOP/s)."""
    if out_per_group % width:
        return o // out_per_group
    return o // width * width // out_per_group


def conv2d_nchw_cvec(data: te.Tensor, weight: te.Tensor, plan: ChannelVectorPlan,
                     out_dtype: str, layout: str = "NCHW") -> te.Tensor:
    """The NCHW convolution of ``data`` ``(N, C, H, W)`` with the packed weight
    ``[O/R, I, KH, KW, R]`` (``pack_conv2d_nchw_weight`` with ``R = plan.width``), the output
    channels in the vector lanes: a tile of ``plan.rows`` output positions x ``R`` channels
    accumulates in registers; each step of the reduction broadcasts one input value per
    position and loads ``R`` contiguous weights. Unlike the flat kernel no lane is wasted
    on small images (``7 x 7``: the flat kernel's 16-position vectors run 49 of 64 lanes).
    Blocks: ``data_pad`` (when there is padding) and ``conv2d_nchw``; with
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
    if nhwc and not plan.across_rows:
        raise ValueError("conv2d_nchw_cvec: NHWC data takes the tiles across rows only")
    src = _pad_nhwc(data, g) if nhwc else \
        _pad_image(data, g.padding, hp, wp, te.const(0, data.dtype))
    ipg, opg, nr = g.in_per_group, g.out_per_group, plan.width
    rc = te.reduce_axis((0, ipg), "rc")
    ry = te.reduce_axis((0, g.kernel[0]), "ry")
    rx = te.reduce_axis((0, g.kernel[1]), "rx")
    (sh, sw), (dh, dw) = g.strides, g.dilation

    def chan(o):
        return rc.var if g.groups == 1 else _group_of(o, nr, opg) * ipg + rc.var

    def f(b, o, y, x):
        yy, xx = y * sh + ry * dh, x * sw + rx * dw
        v = src[b, yy, xx, chan(o)] if nhwc else src[b, chan(o), yy, xx]
        wt = weight[o // nr, rc, ry, rx, o % nr]
        return te.sum(v.astype(out_dtype) * wt.astype(out_dtype), axis=[rc, ry, rx])

    attrs = {SCHEDULE_RULE: RULE_CONV_NCHW_CVEC, "rows": plan.rows, "width": nr,
             "lanes": plan.lanes, "across_rows": int(plan.across_rows), "k_chunk": plan.k_chunk}
    if not plan.across_rows:
        return te.compute((n, g.out_channels, g.out_h, g.out_w), f, "conv2d_nchw",
                          attrs=attrs)
    # tiles of ``rows`` consecutive positions of the flattened output plane, the last one
    # padded: a padded position recomputes the plane's last position (its reads stay in
    # bounds) and is never copied out
    ow, last = g.out_w, g.out_h * g.out_w - 1
    tiles_len = _ceil_div(last + 1, plan.rows) * plan.rows

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


# ---------------------------------------------------------------------------------------------
# NHWC: pixels x channels


# with 16 vector registers, a row (or plane) of at least this many full NHWC tiles takes
# them with a ragged last tile rather than a smaller tile that divides it
RAGGED_MIN_TILES = 4


@dataclass(frozen=True)
class NhwcPlan:
    """The tile of ``conv2d_nhwc_packed``: ``rows`` output pixels of one image row x ``width``
    output channels (the packed panel width, a multiple of the lanes). With ``flat``, the
    pixels are consecutive ones of the whole output plane (a 1x1 unit-stride convolution
    without padding reads input pixel ``p`` for output pixel ``p``, so a tile may span rows)."""

    geometry: ConvGeometry
    rows: int
    width: int
    lanes: int
    flat: bool = False


def plan_conv2d_nhwc(g: ConvGeometry, lanes: int, registers: int) -> NhwcPlan | None:
    """The NHWC tile, or None when the channels of a tile would not share their input channel
    (a grouped convolution with fewer than ``lanes`` channels per group, other than
    depthwise).

    Examples
    --------
    >>> g = ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> p = plan_conv2d_nhwc(g, 16, 32)
    >>> (p.rows, p.width, p.flat)
    (8, 32, False)
    """
    if g.groups > 1 and not g.is_depthwise and g.out_per_group % lanes:
        return None
    vectors = 2 if g.out_channels >= 2 * lanes else 1
    if g.groups > 1 and not g.is_depthwise:
        vectors = 2 if g.out_per_group % (2 * lanes) == 0 else 1
    width = vectors * lanes
    budget = (24 if registers >= 32 else 12) // vectors
    ow = g.out_w
    fits = [m for m in range(min(budget, ow), 3, -1) if ow % m == 0]
    # 16 registers: a full tile with a ragged last one beats a smaller tile that divides
    # the row once the row holds RAGGED_MIN_TILES of them (Zen 3, one layer each: 6 pixels
    # against 4 on 56- and 28-wide rows ran 1.0-1.12x, the 3x3 layers most; on 14- and
    # 7-wide rows, 6 + 6 + 2 and 6 + 1, 0.75-0.9x the channel-vector tiles)
    ragged = registers < 32 and g.groups == 1
    if ragged and ow >= RAGGED_MIN_TILES * budget:
        return NhwcPlan(g, budget, width, lanes)
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


def nhwc_kernel_plan(g: ConvGeometry, lanes: int,
                     registers: int) -> "NhwcPlan | ChannelVectorPlan | None":
    """The NHWC kernel for ``g``: the pixels x channels tile (``plan_conv2d_nhwc``) when it
    fills the row (or the plane) with 8 or more accumulators (``nhwc_tile_fills``); else,
    with 16 registers and a long reduction (512 or more multiply-adds per output, as in
    ``nchw_kernel_plan``), the channel-vector tiles across rows (``cvec_tiles_plan``, run by
    ``conv2d_nchw_cvec(..., layout="NHWC")``): 3 pixels of the flattened plane, the reduction
    in chunks whose weights stay in L1. On Zen 3 they ran ResNet-50's strided 1x1 layers
    1.09-1.20x faster than the NCHW kernels, where the ragged pixel tile (6 + 1 on a 7-wide
    row) ran 0.73-0.84x; its 3x3 layers on 14- and 7-wide rows 1.1-1.3x faster than that
    tile. None for a grouped convolution whose tile would span groups.

    Examples
    --------
    >>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> type(nhwc_kernel_plan(g, 8, 16)).__name__
    'ChannelVectorPlan'
    >>> g = ConvGeometry(64, 56, 56, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> type(nhwc_kernel_plan(g, 8, 16)).__name__
    'NhwcPlan'
    """
    plan = plan_conv2d_nhwc(g, lanes, registers)
    if plan is None or nhwc_tile_fills(plan):
        return plan
    if registers < 32 and g.in_per_group * g.kernel[0] * g.kernel[1] >= 512 and \
            not g.is_depthwise:
        tiles = cvec_tiles_plan(g, lanes, registers)
        if tiles is not None:
            return tiles
    return plan


def nhwc_tile_fills(plan: NhwcPlan) -> bool:
    """Whether the NHWC tile fills its row (or, ``flat``, its plane) with 8 or more
    accumulators: its pixels divide the row, or the row holds ``RAGGED_MIN_TILES`` tiles or
    more, so that the ragged one at its end is a small part of the work."""
    g = plan.geometry
    pixels = g.out_h * g.out_w if plan.flat else g.out_w
    spread = pixels % plan.rows == 0 or pixels >= RAGGED_MIN_TILES * plan.rows
    return spread and plan.rows * (plan.width // plan.lanes) >= 8


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
    o = _as_int(dims["O"])
    zero = te.const(0, weight.dtype)

    def f(ob, kh, kw, i, r):
        oc = ob * width + r
        at = {"O": oc, "I": i, "H": kh, "W": kw}
        v = weight[tuple(at[c] for c in kernel_layout)]
        return v if o % width == 0 else te.if_then_else(oc < o, v, zero)

    return te.compute((_ceil_div(o, width), dims["H"], dims["W"], dims["I"], width), f,
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
    src = _pad_nhwc(data, g)
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
        return _group_of(o, nr, opg) * ipg + rc.var

    def f(b, y, x, o):
        v = src[b, y * sh + ry * dh, x * sw + rx * dw, chan(o)]
        wt = weight[o // nr, ry, rx, rc, o % nr]
        return te.sum(v.astype(out_dtype) * wt.astype(out_dtype), axis=[ry, rx, rc])

    attrs = {SCHEDULE_RULE: RULE_CONV_NHWC, "rows": plan.rows, "width": nr,
             "flat": int(plan.flat), "lanes": plan.lanes}
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


# ---------------------------------------------------------------------------------------------
# dense: x @ W with W in panels


def dense_panel_width(n: int, lanes: int, registers: int) -> int:
    """The panel width ``NR`` for ``N`` output columns: 4 vectors with 32 vector registers (the
    6 x 64 tile of the GEMM recipe), 2 with 16; narrower for small ``N``.

    Examples
    --------
    >>> dense_panel_width(768, 16, 32), dense_panel_width(10, 16, 32)
    (64, 16)
    """
    vectors = 4 if registers >= 32 else 2
    while vectors > 1 and n < vectors * lanes:
        vectors //= 2
    return vectors * lanes


def pack_dense_weight(weight: te.Tensor, width: int, transpose: bool = False) -> te.Tensor:
    """``weight`` ``[K, N]`` (``[N, K]`` with ``transpose``, as ``linear`` stores it) as panels
    ``[ceil(N/NR), K, NR]``, zero beyond ``N``.

    Examples
    --------
    >>> w = te.placeholder((768, 3072), "float32", "w")
    >>> [d.value for d in pack_dense_weight(w, 64).shape]
    [48, 768, 64]
    """
    k, n = (weight.shape[1], weight.shape[0]) if transpose else weight.shape
    n_int = _as_int(n)
    zero = te.const(0, weight.dtype)

    def f(jb, kk, r):
        j = jb * width + r
        v = weight[j, kk] if transpose else weight[kk, j]
        return v if n_int % width == 0 else te.if_then_else(j < n_int, v, zero)

    return te.compute((_ceil_div(n_int, width), k, width), f, "weight_packed")


def dense_packed(data: te.Tensor, weight: te.Tensor, out_features: int,
                 out_dtype: str) -> te.Tensor:
    """``data @ W`` for ``data`` ``(..., M, K)`` and ``W`` packed ``[ceil(N/NR), K, NR]``
    (``pack_dense_weight``): ``(..., M, N)``, block ``dense`` (``dense_panel`` and a copy when
    ``N`` is narrower than one panel).

    Examples
    --------
    >>> x = te.placeholder((te.var("n"), 768), "float32", "x")
    >>> w = te.placeholder((12, 768, 64), "float32", "w")
    >>> [str(d) for d in dense_packed(x, w, 768, "float32").shape]
    ['n', '768']
    """
    nr = _as_int(weight.shape[2])
    k = te.reduce_axis((0, data.shape[-1]), "k")
    lead = len(data.shape) - 1

    def f(*idx):
        j = idx[-1]
        v = data[tuple(idx[:lead]) + (k.var,)].astype(out_dtype)
        return te.sum(v * weight[j // nr, k, j % nr].astype(out_dtype), axis=k)

    attrs = {SCHEDULE_RULE: RULE_DENSE, "width": nr}
    if out_features >= nr:
        return te.compute(tuple(data.shape[:-1]) + (out_features,), f, "dense", attrs=attrs)
    # narrower than one panel (a classifier's 10 outputs): the tile computes the whole
    # (zero-padded) panel into an intermediate, so its accumulators are a dense rows x NR block
    # (a tile clipped to 10 of 16 lanes would overlap its rows and stay in memory)
    full = te.compute(tuple(data.shape[:-1]) + (nr,), f, "dense_panel", attrs=attrs)
    return te.compute(tuple(data.shape[:-1]) + (out_features,), lambda *i: full[i], "dense")


def _as_int(d) -> int:
    if isinstance(d, IntImm):
        return d.value
    if isinstance(d, int):
        return d
    raise ValueError(f"expected a static dimension, got {d!r}")


# ---------------------------------------------------------------------------------------------
# strided NCHW pooling on phase planes


def _pool_input(data: te.Tensor, kind: str):
    """``(n, c, h, w, pad value)`` of NCHW ``data`` pooled by ``kind``: ``-inf`` (the dtype's
    lowest) pads a max pooling, 0 an average."""
    from tilecraft.tensorir.expr import min_value
    n, c, h, w = data.shape
    pad_value = min_value(data.dtype) if kind == "max" else te.const(0, data.dtype)
    return n, c, _as_int(h), _as_int(w), pad_value


def pool2d_nchw_phased(data: te.Tensor, kind: str, pool_size, strides, padding, out_h: int,
                       out_w: int) -> te.Tensor:
    """Max (``kind="max"``) or average (``"avg"``, divisor ``KH * KW``) pooling of NCHW
    ``data`` with a stride above 1: ``data_phases[n, c, a, b, i, j]`` holds the padded input's
    rows ``s i + a`` and columns ``s j + b`` (the pad value outside the image: ``-inf`` for
    max, 0 for the average), and ``out[n, c, y, x]`` reduces ``data_phases[n, c, ry % s,
    rx % s, y + ry // s, x + rx // s]`` over the window. Blocks ``data_pad`` (when there is
    padding; ``RULE_PAD``), ``data_phases`` (``RULE_PAD``) and ``pool2d``.

    Examples
    --------
    >>> x = te.placeholder((te.var("n"), 8, 11, 11), "float32", "x")
    >>> y = pool2d_nchw_phased(x, "max", (3, 3), (2, 2), (1, 1, 1, 1), 6, 6)
    >>> [str(d) for d in y.shape]
    ['n', '8', '6', '6']
    """
    n, c, h, w, pad_value = _pool_input(data, kind)
    (kh, kw), (sh, sw) = pool_size, strides
    hq = _ceil_div((out_h - 1) * sh + kh, sh)
    wq = _ceil_div((out_w - 1) * sw + kw, sw)
    # the padding (unit stride, vectorized), then the phase split (strided, no condition)
    padded = _pad_image(data, padding, hq * sh, wq * sw, pad_value)
    dp = te.compute((n, c, sh, sw, hq, wq),
                    lambda b, ch, a, bb, i, j: padded[b, ch, i * sh + a, j * sw + bb],
                    "data_phases", attrs={SCHEDULE_RULE: RULE_PAD})
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")

    def tap(b, ch, y, x):
        return dp[b, ch, ry.var % sh, rx.var % sw, y + ry.var // sh, x + rx.var // sw]

    if kind == "max":
        return te.compute((n, c, out_h, out_w),
                          lambda b, ch, y, x: te.max(tap(b, ch, y, x), axis=[ry, rx]), "pool2d")
    total = te.compute((n, c, out_h, out_w),
                       lambda b, ch, y, x: te.sum(tap(b, ch, y, x), axis=[ry, rx]), "pool2d_sum")
    scale = te.const(1.0 / (kh * kw), data.dtype)
    return te.compute((n, c, out_h, out_w), lambda b, ch, y, x: total[b, ch, y, x] * scale,
                      "pool2d")


def pool2d_nchw_separable(data: te.Tensor, kind: str, pool_size, strides, padding, out_h: int,
                          out_w: int) -> te.Tensor:
    """Max (``kind="max"``) or average (``"avg"``, divisor ``KH * KW``) pooling of NCHW
    ``data`` as two passes: ``pool_rows[n, c, y, q]`` reduces the window's ``KH`` input rows
    of padded column ``q`` (every column of the padded row, unit stride), then
    ``pool2d[n, c, y, x]`` reduces ``pool_rows[n, c, y, x * sw + rx]`` over the window's
    ``KW`` columns. A window costs ``KH`` + ``KW`` operations instead of ``KH * KW``, and
    only the second pass reads with the stride, from a row the first pass just wrote. The
    pad value (``-inf`` for max, 0 for the average) is applied in the first pass, so the
    second has no condition. Blocks ``pool_rows`` (``RULE_POOL_ROWS``) and ``pool2d``
    (``RULE_POOL``: the default schedule computes one row of ``pool_rows`` per output row,
    see ``relax.default_schedules``).

    Examples
    --------
    >>> x = te.placeholder((te.var("n"), 8, 11, 11), "float32", "x")
    >>> y = pool2d_nchw_separable(x, "max", (3, 3), (2, 2), (1, 1, 1, 1), 6, 6)
    >>> [str(d) for d in y.shape]
    ['n', '8', '6', '6']
    """
    n, c, _, _, pad_value = _pool_input(data, kind)
    (kh, kw), (sh, sw) = pool_size, strides
    pt, pl = padding[0], padding[1]
    cols = (out_w - 1) * sw + kw          # the padded columns the windows read
    reduce = te.max if kind == "max" else te.sum
    ry = te.reduce_axis((0, kh), "ry")

    def rows(b, ch, y, q):
        return reduce(_image_at(data, b, ch, y * sh + ry.var - pt, q - pl, pad_value),
                      axis=[ry])
    pooled_rows = te.compute((n, c, out_h, cols), rows, "pool_rows",
                             attrs={SCHEDULE_RULE: RULE_POOL_ROWS})
    rx = te.reduce_axis((0, kw), "rx")
    if kind == "max":
        def out(b, ch, y, x):
            return te.max(pooled_rows[b, ch, y, x * sw + rx.var], axis=[rx])
    else:
        scale = te.const(1.0 / (kh * kw), data.dtype)

        def out(b, ch, y, x):   # each tap scaled: one block, no separate division pass
            return te.sum(pooled_rows[b, ch, y, x * sw + rx.var] * scale, axis=[rx])
    return te.compute((n, c, out_h, out_w), out, "pool2d", attrs={SCHEDULE_RULE: RULE_POOL})


# ---------------------------------------------------------------------------------------------
# Depthwise NCHW convolution over padded rows


def depthwise_conv2d_nchw_rows(data: te.Tensor, weight: te.Tensor, kernel_layout: str,
                               g: ConvGeometry, out_dtype: str) -> te.Tensor:
    """The depthwise NCHW convolution of ``data`` ``(N, C, H, W)`` with ``weight`` (letters
    ``OIHW`` in ``kernel_layout``, ``I = 1``) in two blocks: ``dw_rows[n, c, y, ry, q]``, the
    ``KH`` zero-padded input rows that output row ``y`` reads (``q`` over the padded columns
    its windows span), and ``conv2d_nchw[n, c, y, x] = sum(dw_rows[n, c, y, ry, x * sw + rx *
    dw] * w[c, ry, rx])``. The default schedule fills the rows of one output row just before
    computing it (they stay in L1), so the image is read once, with no padded copy of it and,
    for a stride, no phase planes; each vector of output columns costs ``KH x KW`` FMAs with a
    broadcast weight. Blocks ``dw_rows`` (``RULE_DW_ROWS``) and ``conv2d_nchw`` (``RULE_DW``).

    Examples
    --------
    >>> g = ConvGeometry(8, 11, 11, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 8)
    >>> x = te.placeholder((te.var("n"), 8, 11, 11), "float32", "x")
    >>> w = te.placeholder((8, 1, 3, 3), "float32", "w")
    >>> [str(d) for d in depthwise_conv2d_nchw_rows(x, w, "OIHW", g, "float32").shape]
    ['n', '8', '6', '6']
    """
    if not g.is_depthwise:
        raise ValueError(f"depthwise_conv2d_nchw_rows: {g.groups} groups of {g.in_channels} "
                         f"channels is not a depthwise convolution")
    n = data.shape[0]
    (kh, kw), (sh, sw), (dh, dw) = g.kernel, g.strides, g.dilation
    pt, pl = g.padding[0], g.padding[1]
    cols = (g.out_w - 1) * sw + (kw - 1) * dw + 1      # the padded columns the windows read
    zero = te.const(0, data.dtype)

    def pad_rows(b, ch, y, r, q):
        return _image_at(data, b, ch, y * sh + r * dh - pt, q - pl, zero)
    rows = te.compute((n, g.in_channels, g.out_h, kh, cols), pad_rows, "dw_rows",
                      attrs={SCHEDULE_RULE: RULE_DW_ROWS})
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")

    def wt(o):
        at = {"O": o, "I": 0, "H": ry.var, "W": rx.var}
        return weight[tuple(at[c] for c in kernel_layout)]

    def out(b, o, y, x):
        v = rows[b, o, y, ry, x * sw + rx * dw]
        return te.sum(v.astype(out_dtype) * wt(o).astype(out_dtype), axis=[ry, rx])
    return te.compute((n, g.out_channels, g.out_h, g.out_w), out, "conv2d_nchw",
                      attrs={SCHEDULE_RULE: RULE_DW})
