"""The flat direct NCHW convolution (rule ``RULE_CONV_NCHW``): ``benchmarks/schedules/conv2d.py``'s
recipe generalised to strides, padding, dilation and groups.

The zero-padded input is stored row after row per channel (``data_pad[n, c, q]``,
``q = row * Wq + col``), so each tap ``(ry, rx)`` of the output run ``p = oh * Wq + ow`` is the
contiguous run ``data_pad[n, c, p + ry * Wq + rx]``: a tile of ``R`` output channels x ``V``
vectors of positions accumulates in registers while the reduction over ``(c, ry, rx)`` streams
by, one vector load per tap and vector, one broadcast weight per tap and channel. A stride
``s`` splits the input into its ``s x s`` phase planes first (``data_pad[n, c, a, b, q]`` holds
input rows ``s i + a`` and columns ``s j + b``), which makes every tap a stride-1 run again.
Positions with ``ow >= OW`` (``Wq - OW`` junk columns per row) are computed and dropped by the
copy to NCHW; when there are none (``1x1`` convolutions without padding) the kernel reads the
input in place and writes NCHW directly, so the epilogue is applied to the accumulators. The
weight is packed ``OIHW -> [O/R, I, KH, KW, R]`` (``OIHW{R}o``): the ``R`` weights of one tap
are adjacent, and the tile streams its weights.

- plan: ``plan_conv2d_nchw`` (``NchwPlan``);
- weight packing: ``pack_conv2d_nchw_weight`` (shared with the channel-vector family);
- compute: ``conv2d_nchw_packed``;
- schedule: ``schedule_conv2d_nchw``.

Examples
--------
>>> g = ConvGeometry(in_channels=64, height=56, width=56, out_channels=64, kernel=(3, 3),
...                  strides=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)
>>> plan = plan_conv2d_nchw(g, lanes=16, registers=32)
>>> (plan.oc_block, plan.vectors, plan.row_width, plan.direct_out)
(4, 4, 58, False)
"""
from __future__ import annotations

from dataclasses import dataclass

from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import PrimExpr
from tilecraft.tensorir.schedule import Schedule, ScheduleError

from .geometry import ConvGeometry, as_int, ceil_div, divisors
from .padding import RULE_PAD, image_at, pad_image, schedule_pad
from .params import cpu_tile_params, num_cores
from .registry import SCHEDULE_RULE, KernelFamily
from .schedule_utils import (MAX_UNROLLED_FMAS, ann_int, core_balance, finish_tile_block,
                             fuse_epilogue, loop_extent, tile_tail)

__all__ = ["RULE_CONV_NCHW", "NchwPlan", "plan_conv2d_nchw", "pack_conv2d_nchw_weight",
           "conv2d_nchw_packed", "schedule_conv2d_nchw", "FAMILY"]

RULE_CONV_NCHW = "tilecraft.conv2d_nchw_flat"


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
    wq = ceil_div(wp, sw) if phased else wp
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
        out_len = ceil_div(oh * wq, tile) * tile
    plane_len = ceil_div(out_len + max_off, wq) * wq
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
    and its loads per FMA (``(R + V) / (R V)``); each copy stage (padding, the copy to NCHW)
    costs about two cycles per element against ``I * KH * KW / L`` cycles of FMAs. Ties go to
    the smaller tile.
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
    rs = [oc_block] if oc_block else [r for r in divisors(g.out_channels) if r <= budget]
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


def pack_conv2d_nchw_weight(weight: te.Tensor, kernel_layout: str, oc_block: int) -> te.Tensor:
    """``weight`` (any kernel layout of the letters ``OIHW``) as ``[O/R, I, KH, KW, R]``.

    Examples
    --------
    >>> w = te.placeholder((64, 32, 3, 3), "float32", "w")
    >>> [d.value for d in pack_conv2d_nchw_weight(w, "OIHW", 4).shape]
    [16, 32, 3, 3, 4]
    """
    dims = {c: weight.shape[kernel_layout.index(c)] for c in "OIHW"}
    o = as_int(dims["O"])
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
            padded = pad_image(data, g.padding, rows * sh, wq * sw, zero)

            def phase(b, ch, a, bb, q):
                return padded[b, ch, (q // wq) * sh + a, (q % wq) * sw + bb]
        else:
            # only some phase planes are read (one for a 1x1 layer with a stride): they are
            # taken from the image with the border test per element, instead of padding all
            # of it first (four times what a 1x1 stride-2 layer reads)
            def phase(b, ch, a, bb, q):
                return image_at(data, b, ch, (q // wq) * sh + a - pt,
                                 (q % wq) * sw + bb - pl, zero)
        data_pad = te.compute((n, c_in, pa, pb, plan.plane_len), phase, "data_phases",
                              attrs={SCHEDULE_RULE: RULE_PAD, "row_width": wq})

        def src(b, ch, a, bb, q):
            return data_pad[b, ch, a, bb, q]
    else:
        def pad_value(b, ch, q):
            return image_at(data, b, ch, q // wq - pt, q % wq - pl, zero)
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


def schedule_conv2d_nchw(sch: Schedule, name: str, target: Target,
                         gemv_rows: PrimExpr | None = None) -> None:
    """The flat direct NCHW convolution (``benchmarks/schedules/conv2d.py``'s recipe):

    ``R`` output channels x ``V`` vectors of ``L`` flat positions accumulate in a ``local``
    tile (registers) over the reduction ``(rc, ry, rx)``, the taps, channels and vectors
    unrolled and the lanes vectorized, so the inner loop over input channels is
    ``KH * KW * R * V`` FMAs on registers; the (batch, position-tile) loops run in parallel
    (with the channel blocks too when there are few position tiles). When the block writes
    NCHW itself (no junk columns), its elementwise epilogue is computed in the write-back.
    """
    block = sch.get_block(name)
    blk = sch.get(block)
    r, v, lanes = (ann_int(blk, k) for k in ("oc_block", "vectors", "lanes"))
    loops = sch.get_loops(block)
    direct = len(loops) == 7
    if direct:
        b, o, y, x, rc, ry, rx = loops
        p = sch.fuse(y, x)
    elif len(loops) == 6:
        b, o, p, rc, ry, rx = loops
    else:
        raise ScheduleError("conv2d_nchw", f"block {name}: unexpected loop nest", blk)
    o0, o1 = sch.split(o, [None, r])
    p0, p1, p2 = sch.split(p, [None, v, lanes])
    # Parallel over the position tiles when there are enough (each tile's input run is then
    # reused by all channel blocks in one core's cache), else over the channel blocks. Loops
    # are not fused: a fused index (f // P0) is not affine, which would keep the code
    # generator from shrinking the accumulators to one tile (registers).
    cores = num_cores(target)
    tiles, blocks = loop_extent(sch.get(p0)), loop_extent(sch.get(o0))
    if tiles >= 4 * cores or tiles >= blocks:
        chunk = _position_chunk(tiles, v * lanes, target)
        if chunk > 1:
            # runs of ~256 positions: a channel block's output and residual rows are read
            # and written as runs of whole lines, not one line per channel and tile (a
            # 1x1 layer's fused residual read at 16 positions per channel and tile ran
            # 1.3x slower than through a separate copy; Zen 3)
            p00, p01 = sch.split(p0, [None, chunk])
            pos = [p00, o0, p01]
        else:
            pos = [p0, o0]
        if core_balance(loop_extent(sch.get(pos[0])), cores) < 0.95 and blocks % cores == 0:
            # the position chunks split badly over the cores (7 on 2 cores: 7/8 of the time
            # in use): each core takes its share of the channel blocks instead, over all
            # positions (its copy of the input read once more; ResNet-50's 1x1 128 -> 512
            # layers at 28 x 28 and 256 -> 1024 at 14 x 14 ran 1.08-1.12x faster on two
            # cores, alone and in the model; Zen 3)
            oc, o0 = sch.split(o0, [cores, None])
            pos = [oc, pos[0], o0] + pos[2:]
        sch.reorder(b, *pos, rc, ry, rx, o1, p1, p2)
        sch.parallel(pos[0])
        tile = pos[-1]
        outer = 1 + len(pos)
    else:
        sch.reorder(b, o0, p0, rc, ry, rx, o1, p1, p2)
        sch.parallel(o0)
        tile = p0
        outer = 3
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tile)
    # the flat result without junk columns is the NCHW output reshaped: the epilogue's read
    # ``flat[o, y * W + x]`` inverts (``reverse_compute_inline``) and it fuses too
    fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, rc)
    taps = (loop_extent(sch.get(ry)) or 1) * (loop_extent(sch.get(rx)) or 1)
    for loop in [rx, o1, p1] + ([ry] if taps * r * v <= MAX_UNROLLED_FMAS else []):
        sch.unroll(loop)
    sch.vectorize(p2)
    finish_tile_block(sch, init, outer)
    # the write-back in the accumulation's (R, V, L) shape, so the tile stays in registers
    own = tile_tail(sch, acc, outer)
    rows = [rv for rv in own if loop_extent(sch.get(rv)) != 1]
    if len(rows) > 2:
        rows = [rows[0], sch.fuse(*rows[1:])]
    if len(rows) == 2 and loop_extent(sch.get(rows[1])) == v * lanes:
        _, wl = sch.split(rows[1], [v, lanes])
        for rv in tile_tail(sch, acc, outer)[:-1]:
            sch.unroll(rv)
        sch.vectorize(wl)
    else:
        finish_tile_block(sch, acc, outer)


def _position_chunk(tiles: int, tile_len: int, target: Target) -> int:
    """Position tiles per parallel chunk of the flat convolution on a 16-register target:
    the most that divides ``tiles``, covers at most 256 positions and leaves two chunks per
    core; 1 (no chunks) on targets with 32 registers, whose tiles are wider."""
    if target.kind != "llvm" or cpu_tile_params(target)[1] >= 32:
        return 1
    fits = [d for d in range(1, tiles + 1) if tiles % d == 0 and d * tile_len <= 256 and
            tiles // d >= 2 * num_cores(target)]
    return max(fits, default=1)


FAMILY = KernelFamily(
    name="conv2d_nchw_flat", rule=RULE_CONV_NCHW, plan=plan_conv2d_nchw,
    compute=conv2d_nchw_packed, pack=pack_conv2d_nchw_weight, schedule=schedule_conv2d_nchw,
    tile=True, stages={RULE_PAD: schedule_pad})
