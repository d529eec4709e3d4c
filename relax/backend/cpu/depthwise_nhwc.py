"""The depthwise NHWC convolution over blocks of rows (rule ``RULE_DW_NHWC``), channels in the
vector lanes: per block of output rows and panel of channels, tiles of ``rows`` pixels x
``width`` channels accumulate ``KH x KW`` vector FMAs each (one weight vector per tap, shared
by the tile's pixels), reading the input in place: the zero padding (block ``dw_pad_nhwc``,
``RULE_DW_NHWC_ROWS``) is inlined by the schedule into a test on each tap's row and column. No
padded copy of the image or of its rows is written, and no lane is wasted on a small plane
(the NCHW kernels keep positions in the lanes: a 7-wide row fills 7 of 16).

- plan: ``conv2d_nhwc.plan_conv2d_nhwc`` (the tile) and ``depthwise_nhwc_applies``;
- weight packing: ``conv2d_nhwc.pack_conv2d_nhwc_weight`` (``[ceil(C/NR), KH, KW, 1, NR]``);
- compute: ``depthwise_conv2d_nhwc_rows``;
- schedule: ``schedule_depthwise_nhwc_rows``.

Measured on Zen 4 (one thread), MobileNet-V2's layers, with the block's padded rows then
copied into a local buffer, against the packed NHWC kernel (which pads the whole image first):
96 x 112 x 112 stride 2 in 290 against 323 us, 144 x 56 x 56 stride 2 in 94 against 337 us,
32 x 112 x 112 in 151 against 179 us. Reading the input in place instead of that copy, on an
Intel Xeon guest (intel-avx512, one thread, batch 1, the input in the caches): 96 x 112 x 112
stride 2 0.39-0.42 -> 0.31 ms, 144 x 56 x 56 stride 2 0.20 -> 0.13 ms, 144 x 56 x 56
0.26-0.30 -> 0.23-0.26 ms, the 14 x 14 and 7 x 7 layers 25-45% faster.

Examples
--------
>>> g = ConvGeometry(96, 112, 112, 96, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 96)
>>> depthwise_nhwc_applies(NhwcPlan(g, 8, 32, 16))
True
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import PrimExpr
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.stmt import ANN_NONTEMPORAL_STORE
from tilecraft.tensorir.transform import ANN_SOFTWARE_PREFETCH

from .conv2d_nhwc import NhwcPlan, pack_conv2d_nhwc_weight
from .expand_depthwise import RULE_EXPAND, RULE_EXPAND_ACT, expand_nhwc, schedule_expand_band
from .geometry import ConvGeometry
from .registry import SCHEDULE_RULE, KernelFamily, block_rule
from .params import NONTEMPORAL_MIN_BYTES, nontemporal_output
from .schedule_utils import (MIN_PARALLEL_WORK, ann_int, finish_tile_block, fuse_epilogue,
                             loop_nodes, loop_work, parallel_outer)

__all__ = ["RULE_DW_NHWC", "RULE_DW_NHWC_ROWS", "NHWC_ROW_BLOCK",
           "PREFETCH_TILES_AHEAD", "depthwise_nhwc_applies", "depthwise_streams_output",
           "depthwise_prefetch_spec", "expand_depthwise_nhwc",
           "depthwise_conv2d_nhwc_rows", "schedule_depthwise_nhwc_rows", "FAMILY"]

RULE_DW_NHWC = "tilecraft.depthwise_nhwc_rows"             # the convolution, channels in lanes
RULE_DW_NHWC_ROWS = "tilecraft.depthwise_nhwc_pad_rows"    # its padding, inlined by it
NHWC_ROW_BLOCK = 8     # output rows per block (at most)
# each tile prefetches the input its window's last row will need this many tiles on
# (``depthwise_prefetch_spec``); 0: none
PREFETCH_TILES_AHEAD = 2


def depthwise_nhwc_applies(plan: NhwcPlan) -> bool:
    """Whether the NHWC tile ``plan`` of a depthwise convolution runs as
    ``depthwise_conv2d_nhwc_rows`` (every depthwise one with padding: without it the packed
    NHWC kernel reads the image in place already).

    Examples
    --------
    >>> g = ConvGeometry(96, 112, 112, 96, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 96)
    >>> depthwise_nhwc_applies(NhwcPlan(g, 8, 32, 16))
    True
    """
    return plan.geometry.is_depthwise and any(plan.geometry.padding)


def depthwise_streams_output(g: ConvGeometry, batch: int | PrimExpr, itemsize: int = 4) -> bool:
    """Whether ``depthwise_conv2d_nhwc_rows`` writes its output (``batch`` images, an
    expression for a symbolic batch) with non-temporal stores: the rule of
    ``params.nontemporal_output`` (the whole output at least ``NONTEMPORAL_MIN_BYTES``,
    tested at run time for a symbolic batch), its write-back's vector loop annotated
    ``ANN_NONTEMPORAL_STORE``. (The LLVM back end stores whole cache lines only
    non-temporally: a panel of 8 lanes keeps its plain stores.)

    A plain store reads each line in first: the layer then moves its output's bytes three
    times (read, written back, read by the next layer), a non-temporal store twice, and the
    next layer reads them from memory. Its next layer in an inverted-residual block is the
    1x1 projection, which reads its input from memory at about its speed from the caches
    (the narrow ones prefetch it: ``conv2d_nhwc.prefetch_spec``). MobileNet-V2's 144 x 56 x
    56 layer at batch 8 alone (Zen 4, one thread, inputs rotating): 2.77-2.82 -> 2.15-2.16
    ms; at batch 1 on an Intel Xeon guest its 1 MB-an-image outputs streamed cost the
    model time.

    Examples
    --------
    >>> g = ConvGeometry(144, 56, 56, 144, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 144)
    >>> depthwise_streams_output(g, 1), depthwise_streams_output(g, 32)
    (False, True)
    """
    return nontemporal_output(g.out_h * g.out_w * g.out_channels * itemsize, batch)


def depthwise_prefetch_spec(g: ConvGeometry, rows: int, width: int,
                            itemsize: int = 4) -> tuple[int, int] | None:
    """``(ahead, lines)`` of the software prefetch along the channel-panel loop of
    ``depthwise_conv2d_nhwc_rows``'s tile, or None (``PREFETCH_TILES_AHEAD`` 0): each of the
    tile's panels prefetches ``lines`` lines (its part of the pixels), ``ahead`` elements past
    the tile's first tap, which is the input the window's last row reads
    ``PREFETCH_TILES_AHEAD`` tiles on. That row is the one the tile reads first from memory
    (the rows above it were read by the output row before); at batch 8 a layer's input is
    past the caches (MobileNet-V2's 16 -> 96 expansion writes 38 MB) and the hardware
    prefetchers left the tile waiting on each new row's lines.

    Measured on the Intel Xeon guest of docs/zoo.md (one thread, batch 8, the layer alone,
    three inputs in turn, thread CPU time, load 1.1-2.2), with the panels inside the tile:
    144 x 56 x 56 4.6 -> 2.5-2.7 ms, 192 x 28 x 28 0.65 -> 0.50-0.55 ms, 144 x 56 x 56
    stride 2 1.46 -> 1.20-1.28 ms, 96 x 112 x 112 stride 2 4.9 -> 4.3-4.4 ms (at the
    machine's copy bandwidth: its second new row is left to the hardware).

    Examples
    --------
    >>> g = ConvGeometry(96, 112, 112, 96, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1), 96)
    >>> depthwise_prefetch_spec(g, 8, 16)     # 2 rows down, 2 tiles of 16 pixels on
    (24576, 16)
    """
    if PREFETCH_TILES_AHEAD <= 0:
        return None
    (kh, _), (_, sw), (dh, _) = g.kernel, g.strides, g.dilation
    c = g.in_channels
    ahead = (kh - 1) * dh * g.width * c + PREFETCH_TILES_AHEAD * rows * sw * c
    lines = max(1, rows * sw * width * itemsize // 64)
    return ahead, lines


def _row_block(out_h: int) -> int:
    """The output rows a block of ``depthwise_conv2d_nhwc_rows`` takes (a unit of parallel
    work with one channel panel): the largest divisor of ``out_h`` up to
    ``NHWC_ROW_BLOCK``."""
    return max(r for r in range(1, min(out_h, NHWC_ROW_BLOCK) + 1) if out_h % r == 0)


def depthwise_conv2d_nhwc_rows(data: te.Tensor, weight: te.Tensor, plan: NhwcPlan,
                               out_dtype: str) -> te.Tensor:
    """The depthwise NHWC convolution of ``data`` ``(N, H, W, C)`` with the weight packed by
    ``conv2d_nhwc.pack_conv2d_nhwc_weight`` (``[ceil(C/NR), KH, KW, 1, NR]``), in two
    blocks: ``dw_pad_nhwc[n, py, q, c]``, the zero-padded image (rows and columns the windows
    read), and ``conv2d_nhwc[n, y, x, c] = sum(dw_pad_nhwc[n, y * sh + ry * dh, x * sw + rx
    * dw, c] * w[c, ry, rx])``. The schedule inlines the padding, so each tap reads the input
    in place under a test of its row and column (the packed NHWC kernel's ``data_pad`` of
    MobileNet-V2's 96 x 112 x 112 layer is 4.9 MB written and read again). Blocks
    ``dw_pad_nhwc`` (``RULE_DW_NHWC_ROWS``) and ``conv2d_nhwc`` (``RULE_DW_NHWC``, annotated
    with the tile ``rows`` x ``width`` and the row block ``row_block``).

    Examples
    --------
    >>> g = ConvGeometry(32, 11, 11, 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 32)
    >>> x = te.placeholder((te.var("n"), 11, 11, 32), "float32", "x")
    >>> w = te.placeholder((1, 3, 3, 1, 32), "float32", "w")
    >>> out = depthwise_conv2d_nhwc_rows(x, w, NhwcPlan(g, 6, 32, 16), "float32")
    >>> [str(d) for d in out.shape]
    ['n', '6', '6', '32']
    """
    g = plan.geometry
    if not g.is_depthwise:
        raise ValueError(f"depthwise_conv2d_nhwc_rows: {g.groups} groups of {g.in_channels} "
                         f"channels is not a depthwise convolution")
    n = data.shape[0]
    (kh, kw), (sh, sw), (dh, dw) = g.kernel, g.strides, g.dilation
    pt, pl = g.padding[0], g.padding[1]
    prows = (g.out_h - 1) * sh + (kh - 1) * dh + 1      # the padded rows the windows read
    cols = (g.out_w - 1) * sw + (kw - 1) * dw + 1       # ... and columns
    zero = te.const(0, data.dtype)
    nr = plan.width

    def pad(b, py, q, ch):
        row, col = py - pt, q - pl
        inside = te.all(row >= 0, row < g.height, col >= 0, col < g.width)
        return te.if_then_else(inside, data[b, row, col, ch], zero)
    padded = te.compute((n, prows, cols, g.in_channels), pad, "dw_pad_nhwc",
                        attrs={SCHEDULE_RULE: RULE_DW_NHWC_ROWS})
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")

    def out(b, y, x, o):
        v = padded[b, y * sh + ry * dh, x * sw + rx * dw, o]
        wt = weight[o // nr, ry, rx, 0, o % nr]
        return te.sum(v.astype(out_dtype) * wt.astype(out_dtype), axis=[ry, rx])
    attrs = {SCHEDULE_RULE: RULE_DW_NHWC, "rows": plan.rows, "width": nr,
             "row_block": _row_block(g.out_h)}
    spec = depthwise_prefetch_spec(g, plan.rows, nr, dt.itemsize(data.dtype))
    if spec is not None:
        attrs["prefetch_ahead"], attrs["prefetch_lines"] = spec
    if depthwise_streams_output(g, n, dt.itemsize(out_dtype)):
        attrs["nontemporal"] = 1
    return te.compute((n, g.out_h, g.out_w, g.out_channels), out, "conv2d_nhwc", attrs=attrs)


def expand_depthwise_nhwc(data: te.Tensor, weight1: te.Tensor, bias1: te.Tensor,
                          weight2: te.Tensor, plan1: NhwcPlan, plan2: NhwcPlan,
                          lo: float | None, hi: float | None, out_dtype: str) -> te.Tensor:
    """``depthwise(clip(conv1x1(data, weight1) + bias1, lo, hi), weight2)`` in NHWC, one
    kernel (``expand_depthwise``): ``expand_depthwise.expand_nhwc``'s blocks (``plan1``:
    the expansion's tile; ``weight1`` packed for its width) under
    ``depthwise_conv2d_nhwc_rows``'s (``plan2``; ``weight2`` packed for its width), whose
    schedule computes the expansion band by band of rows (``schedule_expand_band``).

    Examples
    --------
    >>> e = ConvGeometry(8, 10, 10, 32, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> d = ConvGeometry(32, 10, 10, 32, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1), 32)
    >>> x = te.placeholder((te.var("n"), 10, 10, 8), "float32", "x")
    >>> w1 = te.placeholder((1, 1, 1, 8, 32), "float32", "w1")
    >>> b1 = te.placeholder((32,), "float32", "b1")
    >>> w2 = te.placeholder((2, 3, 3, 1, 16), "float32", "w2")
    >>> out = expand_depthwise_nhwc(x, w1, b1, w2, NhwcPlan(e, 5, 32, 16),
    ...                             NhwcPlan(d, 5, 16, 16), 0.0, 6.0, "float32")
    >>> [str(d) for d in out.shape]
    ['n', '5', '5', '32']
    """
    expanded = expand_nhwc(data, weight1, bias1, plan1, lo, hi, out_dtype)
    return depthwise_conv2d_nhwc_rows(expanded, weight2, plan2, out_dtype)


def schedule_depthwise_nhwc_rows(sch: Schedule, name: str, target: Target,
                                 gemv_rows: PrimExpr | None = None) -> None:
    """``depthwise_conv2d_nhwc_rows``: blocks of ``row_block`` output rows x channel panels
    (``width`` channels) in parallel; per block, tiles of ``rows`` pixels x ``width``
    channels accumulate in registers over the unrolled ``KH x KW`` taps (one weight vector and
    ``rows`` input vectors per tap), reading the input in place (the padding inlined: a test
    of each tap's row and column, a branch around its load); the epilogue (bias, activation)
    is applied in the write-back.

    The padding was a copy of each block's padded rows into a local buffer (of one panel, or
    of every panel on a large strided layer), read by the tiles from L1 / L2; on the Intel
    Xeon guest of docs/zoo.md that copy cost more than it saved on every MobileNet-V2 layer
    (the layer alone, input in the caches: 144 x 56 x 56 stride 2 0.20 -> 0.13 ms, 96 x 112
    x 112 stride 2 0.39-0.42 -> 0.31; the model at batch 1 6.29-6.43 -> 5.39-5.64 ms,
    onnxruntime 5.86; at batch 8 53.3-54.9 -> 50.4-50.7 ms, onnxruntime 51.6)."""
    block = sch.get_block(name)
    blk = sch.get(block)
    rows, width = ann_int(blk, "rows"), ann_int(blk, "width")
    row_block = ann_int(blk, "row_block")
    producer = next(p for p in sch.get_producers(block)
                    if block_rule(sch.get(p)) == RULE_DW_NHWC_ROWS)
    sch.compute_inline(producer)
    out_buf = sch.get(block).writes[0].buffer
    data = next(r.buffer for r in sch.get(block).reads
                if len(r.buffer.shape) == 4 and r.buffer is not out_buf)
    b, y, x, o, ry, rx = sch.get_loops(block)
    o0, o1 = sch.split(o, [None, width])
    y0, y1 = sch.split(y, [None, row_block])
    x0, x1 = sch.split(x, [None, rows])
    # the channel panels inside the tile: a tile's input pixels are read whole (every line
    # of each), row by row in address order, where panels outside them read one line of
    # every pixel (of 6 for 96 channels) and come back for the next one
    sch.reorder(b, y0, y1, x0, o0, ry, rx, x1, o1)
    par = parallel_outer(sch, [b, y0])
    if loop_work(loop_nodes(sch, sch.get_loops(block))) >= MIN_PARALLEL_WORK:
        sch.parallel(par)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, o0)
    fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, ry)
    sch.unroll(ry)
    sch.unroll(rx)
    sch.unroll(x1)
    sch.vectorize(o1)
    outer = len(sch.get_loops(acc)) - 2
    finish_tile_block(sch, init, outer)
    finish_tile_block(sch, acc, outer)
    if ann_int(blk, "nontemporal", 0):
        # a large output written without reading its lines in, from NONTEMPORAL_MIN_BYTES of
        # the whole output (``depthwise_streams_output``)
        sch.annotate(sch.get_loops(acc)[-1], ANN_NONTEMPORAL_STORE, NONTEMPORAL_MIN_BYTES)
    if schedule_expand_band(sch, block, par):
        return      # its input is the band of expanded rows, in the caches
    if ann_int(blk, "prefetch_lines", 0):
        # the input of the tile PREFETCH_TILES_AHEAD on in its window's last row, a part
        # each panel (``depthwise_prefetch_spec``)
        sch.annotate(o0, ANN_SOFTWARE_PREFETCH, [data.name, ann_int(blk, "prefetch_ahead"), 1,
                                                 ann_int(blk, "prefetch_lines")])


FAMILY = KernelFamily(
    name="depthwise_nhwc_rows", rule=RULE_DW_NHWC, plan=depthwise_nhwc_applies,
    compute=depthwise_conv2d_nhwc_rows, pack=pack_conv2d_nhwc_weight,
    schedule=schedule_depthwise_nhwc_rows, tile=True,
    stages={RULE_DW_NHWC_ROWS: None, RULE_EXPAND: None, RULE_EXPAND_ACT: None})
