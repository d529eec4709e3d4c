"""The depthwise NCHW convolution over padded rows (rule ``RULE_DW``): per output row, the window's
``KH`` zero-padded input rows are copied into a small buffer (``RULE_DW_ROWS``, placed by the
schedule right before the row is computed), then ``KH x KW`` vector FMAs per vector of output
columns (stride ``s``: every ``s``-th column of the buffer); no full-image padding or
phase-plane copy. The weight is read as it is (one broadcast scalar per channel and tap).

- plan: ``depthwise_rows_applies`` (strided depthwise layers on x86);
- compute: ``depthwise_conv2d_nchw_rows``; no weight packing;
- schedule: ``schedule_depthwise_rows``.

Examples
--------
>>> from tilecraft.targets import Target
>>> g = ConvGeometry(8, 11, 11, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 8)
>>> depthwise_rows_applies(g, Target("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"))
True
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import PrimExpr
from tilecraft.tensorir.schedule import Schedule

from .geometry import ConvGeometry
from .padding import image_at
from .registry import SCHEDULE_RULE, KernelFamily
from .schedule_utils import block_lanes, fuse_epilogue, loop_extent, rows_per_output_row

__all__ = ["RULE_DW", "RULE_DW_ROWS", "depthwise_rows_applies", "depthwise_conv2d_nchw_rows",
           "schedule_depthwise_rows", "FAMILY"]

RULE_DW = "tilecraft.depthwise_rows"             # a depthwise convolution over padded rows
RULE_DW_ROWS = "tilecraft.depthwise_pad_rows"    # its padded input rows, placed by RULE_DW


def depthwise_rows_applies(g: ConvGeometry, target: Target) -> bool:
    """Whether the NCHW convolution ``g`` runs as ``depthwise_conv2d_nchw_rows`` on ``target``:
    a strided depthwise one on x86. Its strided row reads are a wide load and a shuffle there
    (elsewhere they are emulated lane by lane and the flat kernel's phase planes win), and it
    skips the flat kernel's two copies of the image (padding, phase planes): MobileNet-V2's
    3x3 stride-2 layer on 96 x 112 x 112 ran 1.5x faster (Zen 4). At stride 1 the flat
    kernel's single padded copy is cheaper than the row kernel's three copies of each row:
    0.14 against 0.19 ms at 144 x 56 x 56, even at 32 x 112 x 112.

    Examples
    --------
    >>> g = ConvGeometry(8, 11, 11, 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 8)
    >>> depthwise_rows_applies(g, Target("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"))
    False
    """
    return g.is_depthwise and g.strides != (1, 1) and target.arch == "x86_64"


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
        return image_at(data, b, ch, y * sh + r * dh - pt, q - pl, zero)
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


def _row_vector(width: int | None, lanes: int) -> int:
    """The vector length for a row of ``width`` outputs: the row itself when it fits in
    ``lanes``, else its largest divisor from ``lanes / 2`` to ``lanes`` (56 -> 14), else
    ``lanes``. A tail would be a predicated vector, and a masked accumulator goes through
    the stack on every tap (a store-forwarding stall each: 3x slower at 56 x 56)."""
    if width is None:
        return lanes
    if width <= lanes:
        return width
    fits = [d for d in range(lanes, lanes // 2 - 1, -1) if width % d == 0]
    return fits[0] if fits else lanes


def schedule_depthwise_rows(sch: Schedule, name: str, target: Target,
                            gemv_rows: PrimExpr | None = None) -> None:
    """``depthwise_conv2d_nchw_rows``: output rows ``(n, c, y)`` in parallel; per output row
    the ``KH`` padded input rows are filled (vectorized) right before the row is computed, so
    they are read from L1. A vector of output columns accumulates in a register over the
    unrolled ``KH x KW`` taps (one broadcast weight and one load each: unit stride, or every
    ``s``-th element of the row buffer), and the epilogue (bias, activation) is applied to it
    before the single store."""
    block = sch.get_block(name)
    b, o, y, x, ry, rx = sch.get_loops(block)
    lanes = block_lanes(sch.get(block), target)
    producer = rows_per_output_row(sch, block, RULE_DW_ROWS, [b, o, y])
    *_, q = sch.get_loops(producer)
    _, q1 = sch.split(q, [None, lanes])
    sch.vectorize(q1)
    x0, x1 = sch.split(x, [None, _row_vector(loop_extent(sch.get(x)), lanes)])
    sch.reorder(x0, ry, rx, x1)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, x0)
    fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, ry)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.unroll(ry)
    sch.unroll(rx)
    sch.vectorize(x1)
    sch.vectorize(sch.get_loops(acc)[-1])


FAMILY = KernelFamily(
    name="depthwise_rows", rule=RULE_DW, plan=depthwise_rows_applies,
    compute=depthwise_conv2d_nchw_rows, pack=None, schedule=schedule_depthwise_rows,
    stages={RULE_DW_ROWS: None})
