"""Padding stages shared by the kernel families: the zero-padded (or ``-inf``-padded) copy of an
NCHW or NHWC image that a convolution or pooling reads (``pad_image``, ``pad_nhwc``), the guarded
read of one pixel (``image_at``), and the schedule of such a stage (``schedule_pad``). The
stages carry the rule ``RULE_PAD``: kept as their own loop nest, not inlined into the tile that
reads them.

Examples
--------
>>> from tilecraft.tensorir import te
>>> x = te.placeholder((1, 8, 10, 10), "float32", "x")
>>> [d.value for d in pad_image(x, (1, 1, 1, 1), 12, 12, te.const(0, "float32")).shape]
[1, 8, 12, 12]
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import PrimExpr
from tilecraft.tensorir.schedule import Schedule

from .geometry import ConvGeometry, as_int
from .registry import SCHEDULE_RULE
from .schedule_utils import (MIN_PARALLEL_WORK, ann_int, block_lanes, loop_extent, loop_nodes,
                             loop_work, parallel_outer, strided_reads)

__all__ = ["RULE_PAD", "PIXEL_PITCH_ALIAS", "image_at", "pad_image", "pad_nhwc",
           "schedule_pad"]

RULE_PAD = "tilecraft.conv2d_pad"     # a padding / phase-plane stage, kept (not inlined)


def image_at(data: te.Tensor, b, ch, row, col, pad_value):
    """``data[b, ch, row, col]`` of NCHW ``data`` where ``(row, col)`` is inside the image,
    ``pad_value`` outside it (the read is guarded, so it never leaves the image)."""
    h, w = as_int(data.shape[2]), as_int(data.shape[3])
    inside = te.all(row >= 0, row < h, col >= 0, col < w)
    return te.if_then_else(inside, data[b, ch, row, col], pad_value)


def pad_image(data: te.Tensor, padding, rows: int, cols: int, pad_value) -> te.Tensor:
    """NCHW ``data`` padded by ``padding`` (top, left, ...) to ``rows x cols`` (the pad value
    beyond the image, also past the bottom / right padding); ``data`` itself when nothing
    changes."""
    n, c, h, w = data.shape
    h, w = as_int(h), as_int(w)
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


def pad_nhwc(data: te.Tensor, g: ConvGeometry) -> te.Tensor:
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
        # the channel read as ``c`` itself (the guard keeps it inside), so that the channel
        # loop vectorizes: a clamped index ``min(c, C - 1)`` is no unit stride, and
        # ``schedule_pad`` kept that loop scalar (ResNet-18's 64 -> 128 stride-2 layer: its
        # padding of 56 x 56 x 64 took ~0.2 ms of 0.9)
        inside = te.all(y >= pt, y < pt + g.height, x >= pl, x < pl + g.width)
        if channels > g.in_channels:
            inside = te.all(inside, c < g.in_channels)
        return te.if_then_else(inside, data[b, y - pt, x - pl, c], zero)
    return te.compute((data.shape[0], hp, wp, channels), pad_value, "data_pad",
                      attrs={SCHEDULE_RULE: RULE_PAD})


def schedule_pad(sch: Schedule, name: str, target: Target,
                 gemv_rows: PrimExpr | None = None) -> None:
    """A padding / phase-plane copy: rows vectorized, the loops above them parallel."""
    block = sch.get_block(name)
    blk = sch.get(block)
    loops = sch.get_loops(block)
    ann = dict(blk.annotations or {})
    *outer, last = loops
    if "row_width" in ann:           # flat planes (n, c, [a, b,] q): split q into rows
        _, last = sch.split(last, [None, ann_int(blk, "row_width")])
    width, lanes = loop_extent(sch.get(last)), block_lanes(blk, target)
    # a row under two vectors with a ragged end (9 wide: a 7 x 7 plane padded by one) stays
    # scalar: LLVM's masked 9-lane vector of its border test ran ResNet-50's 3x3 512 -> 512
    # layer's padding at ~100 cycles a row, 40% of the layer (Zen 3); scalar, the layer ran
    # 1.16x faster (512 -> 128: 1.75x). Rows of whole vectors or two and more keep theirs.
    ragged = width is not None and width % lanes != 0 and width < 2 * lanes
    if not ragged and not strided_reads(sch, block, last):   # phase planes: every s-th column
        sch.vectorize(last)
    if loop_work(loop_nodes(sch, sch.get_loops(block))) >= MIN_PARALLEL_WORK:
        sch.parallel(parallel_outer(sch, outer))
