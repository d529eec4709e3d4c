"""The depthwise NHWC convolution over blocks of padded rows (rule ``RULE_DW_NHWC``), channels
in the vector lanes: per block of output rows and panel of channels, the padded input rows the
block reads are copied into a small local buffer (``RULE_DW_NHWC_ROWS``, placed by the
schedule), then tiles of ``rows`` pixels x ``width`` channels accumulate ``KH x KW`` vector
FMAs each (one weight vector per tap, shared by the tile's pixels). No padded copy of the whole
image goes to memory, and no lane is wasted on a small plane (the NCHW kernels keep positions
in the lanes: a 7-wide row fills 7 of 16). A large strided layer (``whole_pixels``) fills a
block's rows for all its panels at once, so that each input row is read as one contiguous
run.

- plan: ``conv2d_nhwc.plan_conv2d_nhwc`` (the tile) and ``depthwise_nhwc_applies``;
- weight packing: ``conv2d_nhwc.pack_conv2d_nhwc_weight`` (``[ceil(C/NR), KH, KW, 1, NR]``);
- compute: ``depthwise_conv2d_nhwc_rows``;
- schedule: ``schedule_depthwise_nhwc_rows``.

Measured on Zen 4 (one thread), MobileNet-V2's layers against the packed NHWC kernel (which
pads the whole image first): 96 x 112 x 112 stride 2 in 290 against 323 us, 144 x 56 x 56
stride 2 in 94 against 337 us, 32 x 112 x 112 in 151 against 179 us.

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

from .conv2d_nhwc import NhwcPlan, pack_conv2d_nhwc_weight
from .geometry import ConvGeometry
from .registry import SCHEDULE_RULE, KernelFamily, block_rule
from .params import NONTEMPORAL_MIN_BYTES, nontemporal_output, num_cores
from .schedule_utils import (MIN_PARALLEL_WORK, ann_int, core_balance, finish_tile_block,
                             fuse_epilogue, loop_extent, loop_nodes, loop_work, parallel_outer)

__all__ = ["RULE_DW_NHWC", "RULE_DW_NHWC_ROWS", "NHWC_ROW_BLOCK", "WHOLE_PIXELS_MIN_BYTES",
           "depthwise_nhwc_applies", "whole_pixels",
           "whole_pixels_row_block", "depthwise_streams_output",
           "depthwise_conv2d_nhwc_rows", "schedule_depthwise_nhwc_rows", "FAMILY"]

RULE_DW_NHWC = "tilecraft.depthwise_nhwc_rows"             # the convolution, channels in lanes
RULE_DW_NHWC_ROWS = "tilecraft.depthwise_nhwc_pad_rows"    # its padded rows, placed by it
NHWC_ROW_BLOCK = 8     # output rows per block (at most)
# a strided layer one of whose input images is larger than this (the 1 MB L2 of a Zen 4 core)
# fills a row block's padded rows for every channel panel at once (``whole_pixels``)
WHOLE_PIXELS_MIN_BYTES = 1 << 20


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


def whole_pixels(plan: NhwcPlan, itemsize: int = 4) -> bool:
    """Whether ``depthwise_conv2d_nhwc_rows`` fills a row block's padded rows for all its
    channel panels at once (whole pixels: each input row one contiguous run) rather than
    panel by panel (``width`` channels of each pixel, a strided run): for a strided layer
    with more than one panel one of whose input images is over ``WHOLE_PIXELS_MIN_BYTES``.

    Such a layer's input comes from memory at batch 8, and panel by panel each pass over the
    block's rows reads one or two lines of every pixel's channels. MobileNet-V2's 96 x 112 x
    112 stride-2 layer at batch 8 (Zen 4, one thread, nine interleaved rounds, the caches
    flushed before each call): 5.1 ms panel by panel, 4.1 ms in whole pixels; with its input
    in the caches 4.3-5.5 against 3.4-3.9 ms; its 144 x 56 x 56 stride-2 layer 1.84 against
    1.67 ms. In the model (the HF export at batch 8, concrete builds without and with it and
    onnxruntime interleaved in one process, one thread, 15 rounds, thread CPU time, load
    7.8-7.9, twice): 77.8 -> 73.6 and 74.0 -> 71.2 ms, onnxruntime 70.1 and 71.1 ms; at batch
    1 8.08 / 8.20 and 7.81 / 7.65 ms; symbolic builds at load 3.5: batch 8 67.1 -> 64.3 ms
    (onnxruntime 66.0), batch 1 7.30 -> 7.40 ms (about 1% on the ONNX export, none on
    ``torch.export``: see docs/zoo.md). Not taken on unit stride (its 144 x 56 x 56 layer: 3.05 against 3.41 ms, the
    tiles then read the block from L2, not L1) nor on small planes (in the caches at batch 1
    MobileNet-V2's 14 x 14 layers ran 10-38% slower in whole pixels).

    Examples
    --------
    >>> g = ConvGeometry(96, 112, 112, 96, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1), 96)
    >>> whole_pixels(NhwcPlan(g, 8, 32, 16))
    True
    >>> g = ConvGeometry(144, 56, 56, 144, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 144)
    >>> whole_pixels(NhwcPlan(g, 14, 16, 16))
    False
    """
    g = plan.geometry
    image = g.height * g.width * g.in_channels * itemsize
    return max(g.strides) > 1 and g.in_channels > plan.width and \
        image > WHOLE_PIXELS_MIN_BYTES


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


def _row_block(out_h: int) -> int:
    """The output rows a block of ``depthwise_conv2d_nhwc_rows`` takes: the largest divisor
    of ``out_h`` up to ``NHWC_ROW_BLOCK``, so that the block's padded input rows are copied
    ``(R - 1) * s + KH`` for ``R`` rows (a block of one row would copy each input row ``KH /
    s`` times)."""
    return max(r for r in range(1, min(out_h, NHWC_ROW_BLOCK) + 1) if out_h % r == 0)


def whole_pixels_row_block(out_h: int, images: int | None, cores: int) -> int:
    """The output rows a block of a ``whole_pixels`` layer takes: the largest divisor of
    ``out_h`` up to ``NHWC_ROW_BLOCK`` whose blocks (times the ``images`` when the batch is
    constant) split evenly over ``cores`` (``core_balance`` at least 0.95), else the largest.
    Its parallel loop runs over the blocks alone (the panels run inside them): MobileNet-V2's
    56 output rows as 7 blocks of 8 would keep one of two cores idle an eighth of the time,
    8 blocks of 7 do not.

    Examples
    --------
    >>> whole_pixels_row_block(56, None, 2), whole_pixels_row_block(56, 8, 2)
    (7, 8)
    >>> whole_pixels_row_block(56, None, 1)
    8
    """
    fits = [r for r in range(min(out_h, NHWC_ROW_BLOCK), 0, -1) if out_h % r == 0]
    return next((r for r in fits if core_balance((images or 1) * out_h // r, cores) >= 0.95),
                fits[0])


def depthwise_conv2d_nhwc_rows(data: te.Tensor, weight: te.Tensor, plan: NhwcPlan,
                               out_dtype: str) -> te.Tensor:
    """The depthwise NHWC convolution of ``data`` ``(N, H, W, C)`` with the weight packed by
    ``conv2d_nhwc.pack_conv2d_nhwc_weight`` (``[ceil(C/NR), KH, KW, 1, NR]``), in two
    blocks: ``dw_pad_nhwc[n, py, q, c]``, the zero-padded image (rows and columns the windows
    read), and ``conv2d_nhwc[n, y, x, c] = sum(dw_pad_nhwc[n, y * sh + ry * dh, x * sw + rx
    * dw, c] * w[c, ry, rx])``. The schedule fills the padded rows of one block of output
    rows and one channel panel into a small local buffer just before computing them, so the
    padded image is never written to memory (the packed NHWC kernel's ``data_pad`` of
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
             "row_block": _row_block(g.out_h),
             "whole_pixels": int(whole_pixels(plan, dt.itemsize(data.dtype)))}
    if depthwise_streams_output(g, n, dt.itemsize(out_dtype)):
        attrs["nontemporal"] = 1
    return te.compute((n, g.out_h, g.out_w, g.out_channels), out, "conv2d_nhwc", attrs=attrs)


def schedule_depthwise_nhwc_rows(sch: Schedule, name: str, target: Target,
                                 gemv_rows: PrimExpr | None = None) -> None:
    """``depthwise_conv2d_nhwc_rows``: blocks of ``row_block`` output rows x channel panels
    (``width`` channels) in parallel; per block, the padded input rows it reads are filled
    (vectorized over the channels) into a local buffer and read from L1 / L2 by tiles of
    ``rows`` pixels x ``width`` channels that accumulate in registers over the unrolled ``KH
    x KW`` taps (one weight vector and ``rows`` input vectors per tap); the epilogue (bias,
    activation) is applied in the write-back."""
    block = sch.get_block(name)
    blk = sch.get(block)
    rows, width = ann_int(blk, "rows"), ann_int(blk, "width")
    row_block = ann_int(blk, "row_block")
    b, y, x, o, ry, rx = sch.get_loops(block)
    if ann_int(blk, "whole_pixels", 0):
        row_block = whole_pixels_row_block(loop_extent(sch.get(y)), loop_extent(sch.get(b)),
                                           num_cores(target))
    o0, o1 = sch.split(o, [None, width])
    y0, y1 = sch.split(y, [None, row_block])
    x0, x1 = sch.split(x, [None, rows])
    sch.reorder(b, y0, o0, y1, x0, ry, rx, x1, o1)
    producer = next(p for p in sch.get_producers(block)
                    if block_rule(sch.get(p)) == RULE_DW_NHWC_ROWS)
    # the padded rows are filled per row block and panel, or with ``whole_pixels`` per row
    # block for all the panels (the panels' loop then runs inside the fill's)
    par = parallel_outer(sch, [b, y0] if ann_int(blk, "whole_pixels", 0) else [b, y0, o0])
    if loop_work(loop_nodes(sch, sch.get_loops(block))) >= MIN_PARALLEL_WORK:
        sch.parallel(par)
    sch.compute_at(producer, par)
    # local: compacted to the block's rows of one panel ((8 + 2) x 58 x 32 floats, 74 KiB,
    # at 56 x 56 stride 1), or of every panel, instead of a padded copy of the image
    sch.set_scope(producer, 0, "local")
    sch.vectorize(sch.get_loops(producer)[-1])
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, x0)
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


FAMILY = KernelFamily(
    name="depthwise_nhwc_rows", rule=RULE_DW_NHWC, plan=depthwise_nhwc_applies,
    compute=depthwise_conv2d_nhwc_rows, pack=pack_conv2d_nhwc_weight,
    schedule=schedule_depthwise_nhwc_rows, tile=True, stages={RULE_DW_NHWC_ROWS: None})
