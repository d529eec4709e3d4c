"""Winograd F(2x2, 3x3): an NHWC 3x3 stride-1 convolution with 2.25x fewer multiply-adds.

Lavin and Gray's minimal filtering (*Fast Algorithms for Convolutional Neural Networks*, 2016):
each 2 x 2 tile of output pixels is ``A^T [(G g G^T) * (B^T d B)] A`` for the 4 x 4 input patch
``d`` at twice the tile's position and the 3 x 3 filter ``g``. Summed over the input channels,
the elementwise product becomes 16 independent matrix products, one per position of the 4 x 4
transformed patch: ``M[ab] = V[ab] @ U[ab]``, ``V[ab]`` being (tiles x input channels) and
``U[ab]`` (input channels x output channels). These take 16 * C * O multiply-adds per tile,
against 36 * C * O for the direct convolution of its four pixels.

Stages (``conv2d_nhwc_winograd``), run image by image (the batch loop outermost, so one
image's ``V`` and ``M`` stay in the caches from one stage to the next):

1. ``winograd_input``: ``V[ab, n, t, c] = (B^T d B)[a, b]`` for tile ``t`` of image ``n`` (the
   tiles of an image padded up to a multiple of the GEMM's row tile; a padded tile repeats the
   last one). The padding is read as guarded zeros (no padded copy of the image). The channels
   are contiguous, so each term is a vector over channels.
2. ``winograd_gemm``: the 16 products on packed weight panels ``[16, O/NR, C, NR]``
   (``pack_winograd_weight``, computed once at build time by ``FoldConstant``); scheduled
   like the NHWC 1x1 kernel (a tile of ``rows`` tiles x ``NR`` channels in registers).
3. ``conv2d_nhwc``: ``Y = A^T M A``, each output pixel a sum of 16 ``M`` vectors with
   coefficients of its position in the tile; the elementwise epilogue (bias, residual,
   activation) is inlined into it.

The family (rule ``RULE_WINOGRAD_GEMM``, on the GEMM block; the transforms carry
``RULE_WINOGRAD_INPUT`` and ``RULE_WINOGRAD_OUTPUT`` and are placed by its schedule): plan
``winograd_applies`` / ``winograd_pays`` and ``gemm_tile``; weight packing
``pack_winograd_weight``; compute ``conv2d_nhwc_winograd``; schedule
``schedule_winograd_gemm``.

F(2x2, 3x3) is exact in real arithmetic and its transforms have coefficients 0, 1/2 and 1,
so float32 results differ from the direct convolution by rounding only (about 1e-6 relative on
ResNet-50's layers). Larger tiles (F(4x4, 3x3): 4x fewer multiply-adds) need coefficients up
to 8 and lose about three decimal digits; they are not used.

Examples
--------
>>> g = ConvGeometry(256, 14, 14, 256, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
>>> winograd_applies(g)
True
>>> winograd_tiles(g)
(7, 7)
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import PrimExpr
from tilecraft.tensorir.schedule import Schedule, ScheduleError

from .dense import dense_panel_width
from .geometry import ConvGeometry, as_int, ceil_div
from .registry import SCHEDULE_RULE, KernelFamily, block_rule
from .schedule_utils import (MIN_PARALLEL_WORK, ann_int, block_lanes, finish_tile_block,
                             fuse_epilogue, loop_extent, loop_nodes, loop_work,
                             parallel_outer)

__all__ = ["RULE_WINOGRAD_GEMM", "RULE_WINOGRAD_INPUT", "RULE_WINOGRAD_OUTPUT",
           "MAX_WEIGHT_BYTES", "MIN_TILES_LARGE_WEIGHT",
           "winograd_applies", "winograd_pays", "gemm_tile", "winograd_tiles",
           "pack_winograd_weight", "conv2d_nhwc_winograd", "schedule_winograd_gemm", "FAMILY"]

RULE_WINOGRAD_GEMM = "tilecraft.winograd_gemm"
RULE_WINOGRAD_INPUT = "tilecraft.winograd_input"     # V = B^T d B, placed by the GEMM's schedule
RULE_WINOGRAD_OUTPUT = "tilecraft.winograd_output"   # Y = A^T M A, placed by the GEMM's schedule


# F(2, 3): B^T (4 x 4), G (4 x 3), A^T (2 x 4)
B_T = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
G = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))
A_T = ((1, 1, 1, 0), (0, 1, -1, -1))
ALPHA = 4      # the transformed patch is ALPHA x ALPHA
TILE = 2       # output pixels per tile side


# the fewest input and output channels that take it: the multiply-adds per tile scale with
# C * O, the transforms' memory traffic with C + O. Zen 3 (AVX2), one thread, against the
# direct NHWC kernel: 16 -> 64 channels at 56 x 56 1.12x, 32 -> 32 1.24x, 128 -> 32 at 28 x 28
# 1.39x, ResNet-50's 64 -> 64 at 56 x 56 1.57x ... 256 -> 256 at 14 x 14 1.93x
MIN_CHANNELS = 16
# With 32 vector registers, a layer whose transformed weight (16 x C x O floats, 16/9 the
# direct kernel's) is at least MAX_WEIGHT_BYTES and which has fewer than MIN_TILES_LARGE_WEIGHT
# output tiles an image takes the direct kernel: the GEMM reads that weight once an image and
# does only ``tiles / 4`` multiply-adds a byte of it (the direct kernel ``pixels / 4``, 12 on a
# 7 x 7 plane), so it waits on memory. ResNet-18's 512 -> 512 at 7 x 7 (16.8 MB, 16 tiles;
# intel-avx512, one thread, 8 copies of the layer in turn so that their weights come from
# memory as in the model): 2.60 ms as Winograd, 2.43 ms direct (with the weight prefetch of
# ``conv2d_nhwc.prefetch_weight_spec``); 256 -> 256 at 14 x 14 (4.2 MB, 49 tiles) keeps
# Winograd (1.3x the direct kernel)
MAX_WEIGHT_BYTES = 1 << 20
MIN_TILES_LARGE_WEIGHT = 32
# the most bytes of V and M (together) one band of tile rows takes (``band_rows``): a
# quarter of a 2 MB L2, the weight (up to MAX_WEIGHT_BYTES) beside them; 0 turns bands off
BAND_BYTES = 512 << 10
GEMM_ROWS = 6      # tiles per register tile of the GEMM: 6 x 16 channels on AVX2 (12 vectors)


def winograd_applies(g: ConvGeometry) -> bool:
    """Whether ``g`` is a convolution F(2x2, 3x3) computes, and one it pays for: 3x3, stride
    1, no dilation, one group, at least ``MIN_CHANNELS`` input and output channels.

    Examples
    --------
    >>> winograd_applies(ConvGeometry(64, 56, 56, 64, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1))
    False
    """
    return (g.kernel == (3, 3) and g.strides == (1, 1) and g.dilation == (1, 1) and
            g.groups == 1 and g.in_channels >= MIN_CHANNELS and
            g.out_channels >= MIN_CHANNELS)


def winograd_pays(g: ConvGeometry, lanes: int, registers: int) -> bool:
    """Whether ``g`` runs faster as Winograd F(2x2, 3x3) than on the direct kernels of a
    target with ``lanes`` float32 lanes and ``registers`` vector registers: any layer
    ``winograd_applies`` to, except, on AVX-512 (16 lanes, 32 registers), one whose
    transformed weight is ``MAX_WEIGHT_BYTES`` or more for fewer than
    ``MIN_TILES_LARGE_WEIGHT`` tiles an image (memory-bound: ResNet's 512 -> 512 layer at
    7 x 7). Intel AVX-512, one thread, ResNet-18's 64 -> 64 at 56 x 56 (with its 3.2 MB
    transformed input kept between calls, see ``targets.llvm.codegen.WORKSPACE_CACHE_MIN``)
    1.4x the direct kernel at batch 1, 1.55x at batch 8; 128 -> 128 at 28 x 28 1.6x,
    256 -> 256 at 14 x 14 1.4x. (AVX2: 1.1-1.9x the direct kernels on every layer, see
    ``MIN_CHANNELS``; NEON is unmeasured.)

    Examples
    --------
    >>> g = ConvGeometry(128, 28, 28, 128, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> winograd_pays(g, 16, 32)
    True
    >>> g = ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> winograd_pays(g, 16, 32), winograd_pays(g, 8, 16)
    (True, True)
    >>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> winograd_pays(g, 16, 32), winograd_pays(g, 8, 16)
    (False, True)
    """
    if not winograd_applies(g):
        return False
    if lanes < 16 or registers < 32:
        return True
    th, tw = winograd_tiles(g)
    weight = ALPHA * ALPHA * g.in_channels * g.out_channels * 4
    return weight < MAX_WEIGHT_BYTES or th * tw >= MIN_TILES_LARGE_WEIGHT


def gemm_tile(g: ConvGeometry, lanes: int, registers: int) -> tuple[int, int]:
    """``(rows, NR)``: the GEMM's register tile, ``rows`` Winograd tiles x ``NR`` output
    channels (``dense.dense_panel_width``: two vectors with 16 registers, four with
    32).

    Examples
    --------
    >>> gemm_tile(ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1), 8, 16)
    (6, 16)
    """
    return GEMM_ROWS, dense_panel_width(g.out_channels, lanes, registers)


def band_rows(g: ConvGeometry) -> int:
    """Rows of tiles per band (0: the whole image in one): the three stages run band by band
    when one image's ``V`` and ``M`` are more than ``BAND_BYTES`` together and the weight is at
    most ``MAX_WEIGHT_BYTES``, each band the most rows of tiles that divide the image's and
    whose ``V`` and ``M`` fit ``BAND_BYTES``, so that they stay in L2 from stage to stage with
    the weight beside them (``schedule_winograd_gemm``). Intel AVX-512, one thread, one layer
    with a residual: 64 -> 64 at 56 x 56 1.07 -> 0.79 ms (bands of two rows of tiles: 56
    tiles), 128 -> 128 at 28 x 28 0.86 -> 0.71 ms (two rows of 14).

    Examples
    --------
    >>> band_rows(ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1))
    2
    >>> band_rows(ConvGeometry(256, 14, 14, 256, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1))
    0
    """
    th, tw = winograd_tiles(g)
    row = ALPHA * ALPHA * tw * (g.in_channels + g.out_channels) * 4
    weight = ALPHA * ALPHA * g.in_channels * g.out_channels * 4
    if BAND_BYTES <= 0 or th * row <= BAND_BYTES or weight > MAX_WEIGHT_BYTES:
        # the GEMM reads the whole weight once a band: more than L2 holds beside a band, it
        # would come from memory each time (256 -> 256 at 14 x 14, 4.2 MB, in bands of one
        # row of tiles: 1.03 -> 1.55 ms)
        return 0
    fits = [r for r in range(1, th) if th % r == 0 and r * row <= BAND_BYTES]
    return fits[-1] if fits else 0


def winograd_tiles(g: ConvGeometry) -> tuple[int, int]:
    """Output tiles of ``g`` per image, vertically and horizontally (an odd output size
    takes a last tile half outside, whose outside pixels are computed and not written)."""
    return ceil_div(g.out_h, TILE), ceil_div(g.out_w, TILE)


def _pick(i, values, dtype: str | None = None):
    """``values[i]`` for an index expression ``i``: a chain of selects (folded where ``i`` is a
    constant; elsewhere uniform over the vector of channels)."""
    dtype = dtype or i.dtype
    expr = te.const(values[-1], dtype)
    for k in range(len(values) - 2, -1, -1):
        expr = te.if_then_else(i == k, te.const(values[k], dtype), expr)
    return expr


def pack_winograd_weight(weight: te.Tensor, kernel_layout: str, width: int) -> te.Tensor:
    """The transformed filter ``U = G g G^T`` of ``weight`` (letters ``OIHW`` in any order,
    3 x 3) as panels ``[16, ceil(O/NR), I, NR]``: ``U[a * 4 + b, o // NR, i, o % NR]``, zero
    beyond ``O``.

    Examples
    --------
    >>> w = te.placeholder((64, 32, 3, 3), "float32", "w")
    >>> [d.value for d in pack_winograd_weight(w, "OIHW", 16).shape]
    [16, 4, 32, 16]
    """
    dims = {c: weight.shape[kernel_layout.index(c)] for c in "OIHW"}
    o = as_int(dims["O"])
    dtype = weight.dtype
    zero = te.const(0, dtype)

    def f(ab, ob, i, r):
        oc = ob * width + r
        a, b = ab // ALPHA, ab % ALPHA
        total = zero
        for kh in range(3):
            for kw in range(3):
                at = {"O": te.min(oc, o - 1), "I": i, "H": kh, "W": kw}
                coef = _pick(a, [G[k][kh] for k in range(ALPHA)], dtype) * \
                    _pick(b, [G[k][kw] for k in range(ALPHA)], dtype)
                total = total + coef * weight[tuple(at[c] for c in kernel_layout)]
        return total if o % width == 0 else te.if_then_else(oc < o, total, zero)

    return te.compute((ALPHA * ALPHA, ceil_div(o, width), dims["I"], width), f,
                      "winograd_weight")


def conv2d_nhwc_winograd(data: te.Tensor, weight: te.Tensor, g: ConvGeometry, rows: int,
                         out_dtype: str) -> te.Tensor:
    """The NHWC convolution ``g`` of ``data`` ``(N, H, W, C)`` by Winograd F(2x2, 3x3), with
    the weight transformed and packed by ``pack_winograd_weight`` (``[16, O/NR, C, NR]``).
    ``rows`` is the GEMM's row tile (tiles per register tile); an image's tiles are padded to
    a multiple of it. Blocks: ``winograd_input`` (the padding is read as guarded zeros),
    ``winograd_gemm``, ``conv2d_nhwc`` (see the module docstring).

    Examples
    --------
    >>> g = ConvGeometry(64, 8, 8, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> x = te.placeholder((te.var("n"), 8, 8, 64), "float32", "x")
    >>> w = te.placeholder((16, 4, 64, 16), "float32", "w")
    >>> [str(d) for d in conv2d_nhwc_winograd(x, w, g, 6, "float32").shape]
    ['n', '8', '8', '64']
    """
    if not winograd_applies(g):
        raise ValueError(f"conv2d_nhwc_winograd: F(2x2, 3x3) does not compute {g}")
    n = data.shape[0]
    nr = as_int(weight.shape[3])
    pt, pl = g.padding[0], g.padding[1]
    th, tw = winograd_tiles(g)
    tiles = th * tw
    tiles_pad = ceil_div(tiles, rows) * rows

    # 1. V = B^T d B: each row of B^T has two nonzero entries (+1 and +-1)
    nonzero = [[k for k, v in enumerate(row) if v] for row in B_T]
    taps = [[r[0] for r in nonzero], [r[1] for r in nonzero]]
    signs = [[float(B_T[a][taps[u][a]]) for a in range(ALPHA)] for u in range(2)]
    dtype = data.dtype
    zero = te.const(0, dtype)

    def v_at(ab, b_, t, c):
        a, b = ab // ALPHA, ab % ALPHA
        t = te.min(t, tiles - 1)          # a padded tile repeats the last one
        y0, x0 = (t // tw) * TILE - pt, (t % tw) * TILE - pl
        total = zero
        for u in range(2):
            ia, sa = _pick(a, taps[u]), _pick(a, signs[u], dtype)
            for v in range(2):
                ib, sb = _pick(b, taps[v]), _pick(b, signs[v], dtype)
                # the padding, and the part of the last tile of an odd size past it, read as
                # zeros (the pixels that part writes are not stored); the read is guarded, so
                # it never leaves the image, and no padded copy of the image is made
                yy, xx = y0 + ia, x0 + ib
                inside = te.all(yy >= 0, yy < g.height, xx >= 0, xx < g.width)
                total = total + sa * sb * te.if_then_else(
                    inside, data[b_, yy, xx, c], zero).astype(dtype)
        return total

    v = te.compute((ALPHA * ALPHA, n, tiles_pad, g.in_channels), v_at, "winograd_input",
                   attrs={SCHEDULE_RULE: RULE_WINOGRAD_INPUT})

    # 2. M[ab] = V[ab] @ U[ab] on packed panels
    k = te.reduce_axis((0, g.in_channels), "rc")

    def m_at(ab, b_, t, o):
        return te.sum(v[ab, b_, t, k].astype(out_dtype) *
                      weight[ab, o // nr, k, o % nr].astype(out_dtype), axis=k)

    m = te.compute((ALPHA * ALPHA, n, tiles_pad, ceil_div(g.out_channels, nr) * nr), m_at,
                   "winograd_gemm",
                   attrs={SCHEDULE_RULE: RULE_WINOGRAD_GEMM, "rows": rows, "width": nr,
                          "band_rows": band_rows(g)})

    # 3. Y = A^T M A: an output pixel at (ry, rx) in its tile sums M[a, b] with coefficient
    # A^T[ry, a] * A^T[rx, b], each 0 or +-1: a sum of the 9 nonzero terms for each of the four
    # positions, chosen by (ry, rx). The schedule unrolls ry and rx (``_unroll_tiles``), so the
    # choice folds away and a pixel loads 9 vectors of M, where a sum over all 16 positions
    # with selected coefficients loaded 16 and multiplied each
    def tile_sum(ry: int, rx: int, b_, t, o):
        total = None
        for a in range(ALPHA):
            for b in range(ALPHA):
                coef = A_T[ry][a] * A_T[rx][b]
                if not coef:
                    continue
                term = m[a * ALPHA + b, b_, t, o]
                if total is None:
                    total = term if coef > 0 else -term
                else:
                    total = total + term if coef > 0 else total - term
        return total

    def y_at(b_, y, x, o):
        t = (y // TILE) * tw + x // TILE
        ry, rx = y % TILE, x % TILE
        rows = [te.if_then_else(rx == 0, tile_sum(r, 0, b_, t, o), tile_sum(r, 1, b_, t, o))
                for r in range(TILE)]
        return te.if_then_else(ry == 0, rows[0], rows[1])

    return te.compute((n, g.out_h, g.out_w, g.out_channels), y_at, "conv2d_nhwc",
                      attrs={SCHEDULE_RULE: RULE_WINOGRAD_OUTPUT})


def _only(blocks: list, sch: Schedule, rule: str, what: str, blk):
    found = [b for b in blocks if block_rule(sch.get(b)) == rule]
    if len(found) != 1:
        raise ScheduleError("winograd", f"block {blk.name}: expected one {what} block", blk)
    return found[0]


def _unroll_tiles(sch: Schedule, block, above: int, split: list[int], unrolled: int,
                  target: Target) -> None:
    """A transform ``block`` below its first ``above`` loops (the batch's, a band's), the last
    loop its channels: the loops of
    ``split`` split by the tile (``TILE``), the channels into vectors, and the order (outer
    parts, channel vectors, the first ``unrolled`` loops or the split inner parts unrolled,
    channel lanes). Unrolled, a tile's positions are constants: the input transform's 16
    positions (``unrolled``: its first loop) read one 4 x 4 patch, the output transform's 2 x 2
    pixels (``split``: its rows and columns) one tile of ``M``, and their choices of taps and
    terms fold away. The outer loops run in parallel when the work pays."""
    loops = sch.get_loops(block)[above:]
    lanes = block_lanes(sch.get(block), target)
    *spatial, channels = loops
    outer, inner = [], []
    for k, lp in enumerate(spatial):
        if k in split:
            o, i = sch.split(lp, [None, TILE])
            outer.append(o)
            inner.append(i)
        elif k < unrolled:
            inner.append(lp)
        else:
            outer.append(lp)
    extent = loop_extent(sch.get(channels))
    if extent is not None and extent % lanes == 0 and extent > lanes:
        c0, c1 = sch.split(channels, [None, lanes])
        outer.append(c0)
    else:
        c1 = channels
    sch.reorder(*outer, *inner, c1)
    for lp in inner:
        sch.unroll(lp)
    sch.vectorize(c1)
    if loop_work(loop_nodes(sch, outer + inner + [c1])) >= MIN_PARALLEL_WORK:
        sch.parallel(parallel_outer(sch, outer))


def schedule_winograd_gemm(sch: Schedule, name: str, target: Target,
                           gemv_rows: PrimExpr | None = None) -> None:
    """A Winograd convolution (``conv2d_nhwc_winograd``), from its GEMM block ``name``, image
    by image (and, with ``band_rows``, band by band of rows of tiles): the batch loop (the
    output transform's) is the outermost, and the input transform, the GEMM and the output
    transform run inside it (inside the band loop) on one image's (band's) ``V`` and
    ``M`` (ResNet-18's 28 x 28 and 14 x 14 layers at batch 8 ran 1.1-1.2x faster than with
    each stage over the batch, whose ``V`` and ``M`` left the caches between the stages; at
    batch 1 the same, Zen 4). The 16 products ``M[ab, t, o] = sum_c V[ab, t, c] * U[ab, o //
    NR, c, o % NR]`` run as a tile of ``rows`` tiles x ``NR`` channels (one packed panel)
    that accumulates in registers over the input channels, as in the NHWC 1x1 kernel; the
    (position, panel) pairs are fused and run in parallel (a core's run of them keeps one
    position's ``V`` in its L2 while the panels, each read once, stream by). The transforms
    are vectorized over the channels; the elementwise epilogue is inlined into the output
    transform."""
    block = sch.get_block(name)
    blk = sch.get(block)
    rows, width = ann_int(blk, "rows"), ann_int(blk, "width")
    transform = _only(sch.get_producers(block), sch, RULE_WINOGRAD_INPUT, "input transform",
                      blk)
    output = _only(sch.get_consumers(block), sch, RULE_WINOGRAD_OUTPUT, "output transform",
                   blk)
    fuse_epilogue(sch, output)
    band = ann_int(blk, "band_rows", 0)
    anchor = sch.get_loops(output)[0]          # the batch
    if band:
        # a band of ``band`` rows of tiles: the output rows split, and the other two stages
        # computed inside the band loop for the band's tiles alone
        anchor, _ = sch.split(sch.get_loops(output)[1], [None, band * TILE])
    # the image's (or band's) tiles, not the multiple of ``rows`` the buffers have: the last
    # register tile is ragged (LoopPartition gives it a loop of its own)
    sch.compute_at(block, anchor)
    sch.compute_at(transform, anchor)
    # one image's (band's) V and M: local buffers, which lowering allocates inside the loop
    # with its shape (CompactBufferAllocation leaves global ones whole)
    sch.set_scope(transform, 0, "local")
    sch.set_scope(block, 0, "local")
    above = 2 if band else 1
    loops = sch.get_loops(block)
    if len(loops) != above + 4:
        raise ScheduleError("winograd", f"block {name}: unexpected loop nest", blk)
    ab, t, o, k = loops[above:]
    o0, o1 = sch.split(o, [None, width])
    t0, t1 = sch.split(t, [None, rows])
    sch.reorder(ab, o0, t0, k, t1, o1)
    sch.parallel(sch.fuse(ab, o0))
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, t0)
    init = sch.decompose_reduction(block, k)
    sch.unroll(t1)
    sch.vectorize(o1)
    finish_tile_block(sch, init, above + 2)
    finish_tile_block(sch, acc, above + 2)
    _unroll_tiles(sch, transform, above, [], 1, target)
    _unroll_tiles(sch, output, above, [0, 1], 0, target)


FAMILY = KernelFamily(
    name="winograd", rule=RULE_WINOGRAD_GEMM, plan=gemm_tile, compute=conv2d_nhwc_winograd,
    pack=pack_winograd_weight, schedule=schedule_winograd_gemm, tile=True,
    stages={RULE_WINOGRAD_INPUT: None, RULE_WINOGRAD_OUTPUT: None})
