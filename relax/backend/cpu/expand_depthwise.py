"""An inverted-residual block's expansion fused into its depthwise layer (NHWC): the 1x1
convolution, its bias and its clip (ReLU6) computed band by band of rows under the depthwise
kernel of ``depthwise_nhwc`` (rule ``RULE_DW_NHWC``), so the expanded tensor is never written
to memory.

MobileNet-V2's 16 -> 96 expansion at 112 x 112 writes 4.8 MB an image (38 MB at batch 8, past
the caches) that the stride-2 depthwise layer after it reads once and reduces to a quarter;
both kernels then run at the memory's speed. Fused, the depthwise kernel's block of
``row_block`` output rows first computes the expanded rows its windows read (``(row_block - 1)
x stride + KH`` rows of every column and channel: 731 KB for that layer, in L2) from the
block's input rows, then runs its tiles over them. The pair alone (an Intel Xeon guest, one
thread, batch 8 / batch 1): 7.50 -> 4.35 / 0.75 -> 0.64 ms; MobileNet-V2's 24 -> 144 pairs at
56 x 56, stride 1 5.58 -> 5.08 / 0.51 -> 0.50, stride 2 4.43 -> 2.72 / 0.35 -> 0.28.

- plan: ``expand_depthwise_applies`` (which pairs fuse), ``plan_expand`` (the expansion's
  tile) and ``conv2d_strategy.nhwc_kernel_plan`` (the depthwise one's);
- weight packing: ``conv2d_nhwc.pack_conv2d_nhwc_weight`` for both weights;
- compute: ``expand_nhwc``, blocks ``expand_nhwc`` (``RULE_EXPAND``) and ``expand_act``
  (``RULE_EXPAND_ACT``), under ``depthwise_nhwc.expand_depthwise_nhwc`` (which adds
  ``depthwise_conv2d_nhwc_rows``'s two blocks);
- schedule: ``schedule_expand_band``, called by ``depthwise_nhwc.schedule_depthwise_nhwc_rows``
  on the depthwise block's row-block loop.

Examples
--------
>>> e = ConvGeometry(16, 112, 112, 96, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
>>> d = ConvGeometry(96, 112, 112, 96, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1), 96)
>>> expand_depthwise_applies(e, d)
True
"""
from __future__ import annotations

from dataclasses import replace

from tilecraft.tensorir import te
from tilecraft.tensorir.schedule import Schedule

from .conv2d_nhwc import NhwcPlan, plan_conv2d_nhwc
from .geometry import ConvGeometry
from .registry import SCHEDULE_RULE, block_rule
from .schedule_utils import ann_int, finish_tile_block

__all__ = ["RULE_EXPAND", "RULE_EXPAND_ACT", "FUSE_MIN_IMAGE_BYTES", "expand_depthwise_applies",
           "plan_expand", "expand_nhwc", "schedule_expand_band"]

RULE_EXPAND = "tilecraft.expand_nhwc"          # the expansion 1x1, placed by the depthwise
RULE_EXPAND_ACT = "tilecraft.expand_nhwc_act"  # its bias and clip, in its write-back

# the pairs whose expanded image is at least this many bytes fuse (``expand_depthwise_applies``):
# MobileNet-V2's 32 -> 192 pairs at 28 x 28 (602 KB) gained at stride 2 (batch 8 1.11 -> 0.86
# ms) and lost at stride 1 (1.85 -> 1.96), the tensor in L2 / L3 between the two kernels
FUSE_MIN_IMAGE_BYTES = 1 << 20


def expand_depthwise_applies(expand: ConvGeometry, dw: ConvGeometry, itemsize: int = 4) -> bool:
    """Whether the 1x1 convolution ``expand`` followed by the depthwise convolution ``dw``
    (on its output) runs as ``expand_depthwise_nhwc``: ``expand`` a 1x1 unit-stride one
    without padding or groups, ``dw`` depthwise with padding (``depthwise_nhwc``'s kernel) on
    ``expand``'s channels, and the expanded image at least ``FUSE_MIN_IMAGE_BYTES``
    (smaller ones stay in the caches between the two kernels).

    Examples
    --------
    >>> e = ConvGeometry(64, 14, 14, 384, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> d = ConvGeometry(384, 14, 14, 384, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 384)
    >>> expand_depthwise_applies(e, d)     # 301 KB an image
    False
    """
    return (expand.kernel == (1, 1) and expand.strides == (1, 1) and expand.groups == 1 and
            not any(expand.padding) and expand.dilation == (1, 1) and dw.is_depthwise and
            any(dw.padding) and dw.in_channels == expand.out_channels and
            (dw.height, dw.width) == (expand.height, expand.width) and
            expand.out_h * expand.out_w * expand.out_channels * itemsize >= FUSE_MIN_IMAGE_BYTES)


def plan_expand(g: ConvGeometry, lanes: int, registers: int) -> NhwcPlan:
    """The expansion's tile in the band: ``conv2d_nhwc.plan_conv2d_nhwc``'s width, and as
    many pixels of one row as divide the row within its register budget (24 accumulators
    with 32 registers, 12 with 16): the band is whole rows, so the 1x1 kernel's tiles across
    rows (``flat``) do not apply, and a ragged tile would test each pixel.

    Examples
    --------
    >>> g = ConvGeometry(16, 112, 112, 96, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> p = plan_expand(g, 16, 32)
    >>> (p.rows, p.width, p.flat)
    (8, 32, False)
    """
    plan = plan_conv2d_nhwc(g, lanes, registers)
    vectors = max(1, plan.width // plan.lanes)
    budget = (24 if registers >= 32 else 12) // vectors
    rows = max(m for m in range(1, min(budget, g.out_w) + 1) if g.out_w % m == 0)
    return replace(plan, rows=rows, flat=False, image_rows=1)


def expand_nhwc(data: te.Tensor, weight: te.Tensor, bias: te.Tensor, plan: NhwcPlan,
                lo: float | None, hi: float | None, out_dtype: str) -> te.Tensor:
    """The expansion ``clip(conv1x1(data, weight) + bias, lo, hi)`` of ``data`` ``(N, H, W,
    K)`` as the fused kernel's first two blocks: ``expand_nhwc`` (the sum over ``K``,
    ``RULE_EXPAND``, with ``plan``'s tile ``rows`` x ``width``) and ``expand_act`` (bias and
    clip, ``RULE_EXPAND_ACT``). ``weight`` is packed by ``conv2d_nhwc.pack_conv2d_nhwc_weight``
    for ``plan.width`` (``[ceil(C/NR), 1, 1, K, NR]``), ``bias`` is ``(C,)``; ``lo`` / ``hi``
    None: no bound that side. ``depthwise_nhwc.expand_depthwise_nhwc`` runs the depthwise
    layer over the result.

    Examples
    --------
    >>> e = ConvGeometry(8, 10, 10, 32, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> x = te.placeholder((te.var("n"), 10, 10, 8), "float32", "x")
    >>> w = te.placeholder((1, 1, 1, 8, 32), "float32", "w")
    >>> b = te.placeholder((32,), "float32", "b")
    >>> out = expand_nhwc(x, w, b, NhwcPlan(e, 5, 32, 16), 0.0, 6.0, "float32")
    >>> [str(d) for d in out.shape]
    ['n', '10', '10', '32']
    """
    e = plan.geometry
    n = data.shape[0]
    nr = plan.width
    rk = te.reduce_axis((0, e.in_channels), "rk")
    acc = te.compute(
        (n, e.height, e.width, e.out_channels),
        lambda b, y, x, c: te.sum(data[b, y, x, rk].astype(out_dtype) *
                                  weight[c // nr, 0, 0, rk, c % nr].astype(out_dtype), axis=rk),
        "expand_nhwc", attrs={SCHEDULE_RULE: RULE_EXPAND, "rows": plan.rows, "width": nr})

    def act(b, y, x, c):
        v = acc[b, y, x, c] + bias[c].astype(out_dtype)
        if lo is not None:
            v = te.max(v, te.const(lo, out_dtype))
        if hi is not None:
            v = te.min(v, te.const(hi, out_dtype))
        return v
    return te.compute(acc.shape, act, "expand_act", attrs={SCHEDULE_RULE: RULE_EXPAND_ACT})


def schedule_expand_band(sch: Schedule, consumer, loop) -> bool:
    """Place the expansion that ``consumer`` (the depthwise block, its padding inlined) reads
    under ``loop`` (its block of output rows), band by band: per iteration the expanded rows
    the block's windows read, every column and channel (rows past the image's edges left
    out by a predicate), in tiles of ``rows`` pixels x ``width`` channels accumulating over
    the input channels in registers, the bias and clip in the tile's write-back. False (and
    nothing changed) when ``consumer`` reads no ``expand_act`` block.

    The expanded buffer then spans one band (``CompactBufferAllocation``), private to each
    iteration of ``loop`` (a parallel one: each thread its own)."""
    act = next((p for p in sch.get_producers(consumer)
                if block_rule(sch.get(p)) == RULE_EXPAND_ACT), None)
    if act is None:
        return False
    expand = next(p for p in sch.get_producers(act)
                  if block_rule(sch.get(p)) == RULE_EXPAND)
    blk = sch.get(expand)
    rows, width = ann_int(blk, "rows"), ann_int(blk, "width")
    wb = sch.cache_write(expand, 0, "local")
    # the band first, then the bias and clip into the write-back: inlined at the root, a
    # batch of one would index the result at a constant, which compute_at refuses
    sch.compute_at(act, loop)
    # a local buffer, which lowering shrinks to the band and allocates inside the loop (a
    # large one keeps its heap block between calls: winograd's V and M do the same)
    sch.set_scope(act, 0, "local")
    sch.compute_at(wb, loop)
    sch.reverse_compute_inline(act)
    *_, r, q, c = sch.get_loops(wb)
    q0, q1 = sch.split(q, [None, rows])
    c0, c1 = sch.split(c, [None, width])
    sch.reorder(r, q0, c0, q1, c1)
    sch.compute_at(expand, c0)
    *_, eq, ec, ek = sch.get_loops(expand)
    sch.reorder(ek, eq, ec)
    init = sch.decompose_reduction(expand, ek)
    sch.unroll(eq)
    sch.vectorize(ec)
    outer = len(sch.get_loops(wb)) - 2
    finish_tile_block(sch, init, outer)
    finish_tile_block(sch, wb, outer)
    return True
