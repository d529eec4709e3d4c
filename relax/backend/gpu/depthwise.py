"""Depthwise convolutions on GPU targets: a tile of one channel's output image per work-group,
the input window of the tile in shared memory, a row of outputs per thread in registers, the
epilogue in the register write-back.

A depthwise convolution (MobileNet-V2's 3x3 layers: each output channel reads one input
channel) is not GEMM-like — no input misses a loop the other reads — so before this family it
ran one thread per output, each reading its 9 window elements from global memory, and its
bias and activation as a second kernel over the output. Here a work-group computes a
``th x (tw * rw)`` tile of one image's channel: its threads first copy the tile's input window
(``(th - 1) * s + kh`` rows of ``(tw * rw - 1) * s + kw`` columns, with the convolution's padding
inlined as bounds-checked loads, as the GEMM family does) into shared memory, then each thread
accumulates ``rw`` neighbouring outputs of one row in registers over the window, reading the
shared tile, and writes them through the fused epilogue (bias, ReLU6, residual).

- which blocks: ``is_depthwise`` (a reduction over a short window, two inputs: the window read
  at computed indices, the weight at plain ones; 4-D output whose two innermost loops are the
  image);
- tile: ``depthwise_tile(H, W)``;
- schedule: ``schedule_depthwise(sch, block)``.

Examples
--------
>>> depthwise_tile(56, 56)
(16, 14, 4)
>>> depthwise_tile(7, 7)
(7, 7, 1)
"""
from __future__ import annotations

from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.stmt import Block

from .gemm import compact_read, is_gemm_like, reduce_inputs
from .schedule_utils import SYMBOLIC, is_reduction, loop_extent, node_of, spatial_loops

__all__ = ["DEPTHWISE_THREADS", "DEPTHWISE_MAX_WINDOW", "is_depthwise", "depthwise_tile",
           "schedule_depthwise"]

DEPTHWISE_THREADS = 256     # at most this many threads per work-group
DEPTHWISE_MAX_WINDOW = 49   # the longest window (kh * kw) taken: 7 x 7
DEPTHWISE_MAX_COLUMNS = 32  # threads across a row of the tile


def is_depthwise(block: Block) -> bool:
    """Whether ``block`` is a depthwise-like convolution: a reduction (not GEMM-like) over at
    most ``DEPTHWISE_MAX_WINDOW`` window positions with two reduced inputs, one read at
    computed indices (the sliding window) and one at plain indices (the weight), and a 4-D
    output."""
    if not is_reduction(block) or is_gemm_like(block):
        return False
    inputs = reduce_inputs(block)
    if len(inputs) != 2:
        return False
    compact = [compact_read(block, i) for i in inputs]
    if sorted(compact) != [False, True]:
        return False
    window = 1
    for iv in block.iter_vars:
        if iv.kind == "reduce":
            ext = iv.dom.extent
            if not hasattr(ext, "value"):
                return False
            window *= ext.value
    spatial = [iv for iv in block.iter_vars if iv.kind == "spatial"]
    return window <= DEPTHWISE_MAX_WINDOW and len(spatial) == 4


def depthwise_tile(H: int, W: int) -> tuple[int, int, int]:
    """``(th, tw, rw)``: ``th`` rows of ``tw`` threads per work-group, each thread ``rw``
    neighbouring outputs of a row in registers. ``rw`` is 4, 2 or 1, whichever divides ``W``
    first (no tail along a row); ``tw`` covers the row (at most ``DEPTHWISE_MAX_COLUMNS``
    threads); ``th`` the largest power of two (or ``H``) that keeps the work-group within
    ``DEPTHWISE_THREADS``."""
    rw = 4 if W % 4 == 0 else 2 if W % 2 == 0 else 1
    tw = min(-(-W // rw), DEPTHWISE_MAX_COLUMNS)
    th = 1
    while th * 2 * tw <= DEPTHWISE_THREADS and th * 2 <= H:
        th *= 2
    if H * tw <= DEPTHWISE_THREADS:
        th = H
    return th, tw, rw


def schedule_depthwise(sch: Schedule, block) -> set:
    """The depthwise tile on ``block`` (see the module docstring); the names of the blocks it
    scheduled. ``ScheduleError`` where it does not apply (a symbolic image)."""
    node = node_of(sch, block)
    spatial, reduce = spatial_loops(sch, block)
    if len(spatial) != 4 or not reduce:
        raise ScheduleError("depthwise GPU schedule", "not a 4-D windowed reduction", node)
    n, c, h, w = spatial
    H, W = loop_extent(node_of(sch, h)), loop_extent(node_of(sch, w))
    if SYMBOLIC in (H, W):
        raise ScheduleError("depthwise GPU schedule", "a symbolic image size", node)
    window = [i for i in reduce_inputs(node) if not compact_read(node, i)][0]
    th, tw, rw = depthwise_tile(H, W)
    h0, h1 = sch.split(h, [None, th])
    w0, w1, w2 = sch.split(w, [None, tw, rw])
    sch.reorder(n, c, h0, w0, h1, w1, *reduce, w2)
    bx = sch.fuse(n, c, h0, w0)
    sch.bind(bx, "blockIdx.x")
    sch.bind(h1, "threadIdx.y")
    sch.bind(w1, "threadIdx.x")
    names = {node.name}
    consumers = sch.get_consumers(block)
    local = sch.cache_write(block, 0, "local")
    names.add(node_of(sch, local).name)
    sch.reverse_compute_at(local, w1)
    for cons in consumers:        # bias / activation / residual into the register write-back
        try:
            sch.reverse_compute_inline(cons)
        except ScheduleError:
            pass
    # the tile's input window in shared memory, copied by all the work-group's threads
    sh = sch.cache_read(block, window, "shared")
    names.add(node_of(sch, sh).name)
    sch.compute_at(sh, bx)
    inner = [lp for lp in sch.get_loops(sh) if node_of(sch, lp).kind == "serial"]
    f = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    _, fy, fx = sch.split(f, [None, th, tw])
    sch.bind(fy, "threadIdx.y")
    sch.bind(fx, "threadIdx.x")
    init = sch.decompose_reduction(block, reduce[0])
    names.add(node_of(sch, init).name)
    for lp in (*reduce, w2):
        sch.unroll(lp)
    for b in (init, local):
        loops = sch.get_loops(b)
        if loops and node_of(sch, loops[-1]).kind == "serial":
            sch.unroll(loops[-1])
    return names
