"""int8 NCHW convolutions on packed 8-bit words (rule ``RULE_CONV_U8I8``): ``conv2d`` of uint8
data (quantized activations) and a constant int8 weight with int32 accumulation, what
``relax.quantize``'s static mode and QDQ ONNX models make of a convolution.

The kernel is the flat direct NCHW convolution (``conv2d_nchw``: output positions in vector
lanes, a register tile of ``R`` output channels x ``V`` vectors of positions, junk columns
dropped by the copy to NCHW) with four consecutive input channels in one int32 word (byte 0
the lowest channel), the operand shape of ``vpdpbusd`` / ``sdot``:

- the data as words ``[N, ceil(C/4), PA, PB, Q]`` (``pack_conv2d_u8_words``): the padded image
  row after row (``Wq`` a row), split into its stride phase planes ``PA x PB`` when strided,
  zero beyond the image and beyond ``C``; a kernel of its own, into which ``FuseOps`` fuses
  the quantization (and the zero-point padding) that produces the uint8 data, so the float
  activations are read once and a quarter of their bytes written;
- the weight as words ``[O/R, ceil(I/4), KH, KW, R]`` (``pack_conv2d_int8_weight``, zero
  beyond ``I``; ``FoldConstant`` packs it at build time).

The reduction step over ``(channel word, ry, rx)`` is ``acc + dot4_u8i8(x, w)``: ``x`` a
vector of ``L`` positions' words (one contiguous load per tap and vector), ``w`` one output
channel's word broadcast (``targets.llvm.dot4``: one ``vpdpbusd``, 4 x 16 multiply-adds, with
AVX-512 VNNI; three ``sdot`` with ``+dotprod``; the exact widening sequence elsewhere), exact
in int32. The dequantizing epilogue (``(acc - zp * sum(W[o])) * scale``, then bias, relu,
residual adds, the next layer's quantization: whatever ``FuseOps`` fuses) is computed in the
copy to NCHW, or in the tile's write-back when there are no junk columns.

- plan: ``plan_conv2d_u8i8`` (a ``conv2d_nchw.NchwPlan`` over channel words);
- packing: ``pack_conv2d_int8_weight`` (weight), ``pack_conv2d_u8_words`` (data, its stage
  scheduled by ``schedule_u8_words``: rows vectorized, phase planes too);
- compute: ``conv2d_nchw_u8i8``;
- schedule: ``schedule_conv2d_u8i8`` (``conv2d_nchw.schedule_conv2d_nchw``).

Examples
--------
>>> g = ConvGeometry(64, 58, 58, 64, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1)
>>> p = plan_conv2d_u8i8(g, 16, 32)
>>> (p.geometry.in_channels, p.row_width, p.phased)
(16, 58, False)
"""
from __future__ import annotations

from dataclasses import replace

from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import PrimExpr
from tilecraft.tensorir.schedule import Schedule

from .conv2d_nchw import NchwPlan, phases_read, plan_conv2d_nchw, schedule_conv2d_nchw
from .dense_int8 import dot4_u8i8, u8_word
from .geometry import ConvGeometry, as_int, ceil_div, divisors
from .padding import image_at
from .registry import SCHEDULE_RULE, KernelFamily
from .schedule_utils import (MIN_PARALLEL_WORK, ann_int, block_lanes, loop_extent, loop_nodes,
                             loop_work, parallel_outer)

__all__ = ["RULE_CONV_U8I8", "RULE_U8_WORDS", "plan_conv2d_u8i8", "pack_conv2d_int8_weight",
           "pack_conv2d_u8_words", "conv2d_nchw_u8i8", "schedule_conv2d_u8i8",
           "schedule_u8_words", "FAMILY"]

RULE_CONV_U8I8 = "tilecraft.conv2d_nchw_u8i8"
RULE_U8_WORDS = "tilecraft.conv2d_u8_words"


def plan_conv2d_u8i8(g: ConvGeometry, lanes: int, registers: int) -> NchwPlan | None:
    """The tile and flat layout of an int8 NCHW convolution ``g`` (``lanes`` int32 lanes):
    ``conv2d_nchw.plan_conv2d_nchw`` of the same convolution over channel *words*, so its
    geometry's ``in_channels`` is the word count (``ceil(C/4)``; ``C/4`` when grouped). None
    where a word would mix two groups' channels (grouped with input channels per group not a
    multiple of 4, depthwise): those stay on the generic int32 convolution. A tile that would
    write NCHW in place while covering only part of an output row is replaced by the best
    whole-row tile, or the best tile through the copy to NCHW (see the comment inside).

    Examples
    --------
    >>> g = ConvGeometry(3, 230, 230, 64, (7, 7), (2, 2), (0, 0, 0, 0), (1, 1), 1)
    >>> p = plan_conv2d_u8i8(g, 16, 32)
    >>> (p.geometry.in_channels, p.phased, p.row_width)
    (1, True, 115)
    >>> plan_conv2d_u8i8(ConvGeometry(8, 8, 8, 8, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 8),
    ...                  16, 32) is None
    True
    """
    if g.groups > 1 and g.in_per_group % 4:
        return None
    words = replace(g, in_channels=ceil_div(g.in_channels, 4) if g.groups == 1
                    else g.in_channels // 4)
    plan = plan_conv2d_nchw(words, lanes, registers)
    tile = plan.vectors * lanes
    if not plan.direct_out or tile % g.out_w == 0:
        return plan
    # A tile that is part of a row (16 positions of a 112-wide row): the write-back's region
    # is inferred as the whole row, so the accumulators are a (R, row) buffer in memory and
    # the epilogue runs masked over every row position for each tile. Take the tile of whole
    # rows (V L a multiple of the width) with the most accumulators instead, else (no such
    # tile in the register budget: 8 lanes) the best tile through the copy to NCHW.
    # MobileNet-V2's 1x1 32 -> 16 layer at 112 x 112 went from 16 x 1 vectors to 2 x 7:
    # 364 -> 69 us (1 x 21 through the copy: 95 us; the least of 8 profiles each, loaded
    # 2-core Zen 4 with AVX-512 VNNI).
    budget = 24 if registers >= 32 else 12
    best = best_key = None
    for v in range(1, budget + 1):
        for r in (r for r in divisors(g.out_channels) if r * v <= budget):
            alt = plan_conv2d_nchw(words, lanes, registers, oc_block=r, vectors=v)
            if alt.direct_out and (v * lanes) % g.out_w:
                continue
            key = (alt.direct_out, r * v, -abs(r - 4))
            if best_key is None or key > best_key:
                best, best_key = alt, key
    return plan if best is None else best


def pack_conv2d_int8_weight(weight: te.Tensor, kernel_layout: str, oc_block: int) -> te.Tensor:
    """int8 ``weight`` (letters ``OIHW`` in any order) as words ``[O/R, ceil(I/4), KH, KW, R]``:
    word ``[ob, cw, kh, kw, r]`` holds ``W[ob R + r, 4 cw + p, kh, kw]`` in byte ``p``, zero
    beyond ``I``.

    Examples
    --------
    >>> w = te.placeholder((64, 3, 7, 7), "int8", "w")
    >>> [d.value for d in pack_conv2d_int8_weight(w, "OIHW", 4).shape]
    [16, 1, 7, 7, 4]
    """
    dims = {c: as_int(weight.shape[kernel_layout.index(c)]) for c in "OIHW"}
    o, i = dims["O"], dims["I"]
    if o % oc_block:
        raise ValueError(f"pack_conv2d_int8_weight: {oc_block} does not divide {o} channels")

    def f(ob, cw, kh, kw, r):
        def get(ch):
            at = {"O": ob * oc_block + r, "I": te.min(ch, i - 1) if i % 4 else ch, "H": kh,
                  "W": kw}
            return weight[tuple(at[c] for c in kernel_layout)]
        return u8_word(get, i)(cw)

    return te.compute((o // oc_block, ceil_div(i, 4), dims["H"], dims["W"], oc_block), f,
                      "weight_packed_i8")


def pack_conv2d_u8_words(data: te.Tensor, plan: NchwPlan) -> te.Tensor:
    """uint8 NCHW ``data`` as the words ``[N, ceil(C/4), PA, PB, Q]`` ``conv2d_nchw_u8i8``
    reads: phase plane ``(a, b)`` (``(0, 0)`` alone without a stride) holds input rows
    ``sh * i + a`` and columns ``sw * j + b`` of the zero-padded image at ``q = i * Wq + j``;
    four channels a word, zero beyond the image and beyond ``C``. Block ``data_words``
    (``RULE_U8_WORDS``: ``schedule_u8_words``).

    Examples
    --------
    >>> g = ConvGeometry(6, 9, 9, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    >>> p = plan_conv2d_u8i8(g, 16, 32)
    >>> x = te.placeholder((te.var("n"), 6, 9, 9), "uint8", "x")
    >>> [str(d) for d in pack_conv2d_u8_words(x, p).shape]
    ['n', '2', '2', '2', '42']
    """
    g = plan.geometry
    n, c = data.shape[0], as_int(data.shape[1])
    h, w = as_int(data.shape[2]), as_int(data.shape[3])
    sh, sw = g.strides
    pt, pl = g.padding[0], g.padding[1]
    wq = plan.row_width
    pa, pb = phases_read(g) if plan.phased else (1, 1)
    zero = te.const(0, data.dtype)
    # the image read in place, row after row: no border test
    plain = not plan.phased and not any(g.padding) and wq == w and plan.plane_len <= h * w

    def f(b, cw, a, bb, q):
        # without phases, no ``* 1`` and no phase term: ``(q0 * wq + q1) // wq`` then
        # simplifies to ``q0`` once the rows are split off, and the rows vectorize
        row = ((q // wq) * sh + a if plan.phased else q // wq) - pt
        col = ((q % wq) * sw + bb if plan.phased else q % wq) - pl

        def get(ch):
            ch = te.min(ch, c - 1) if c % 4 else ch
            if plain:
                return data[b, ch, row, col]
            # a guarded read, not a clamped one: the column stays ``q + const`` and the
            # rows vectorize (``schedule_pad`` keeps a clamped index scalar, as a gather)
            return image_at(data, b, ch, row, col, zero)
        return u8_word(get, c)(cw)

    return te.compute((n, ceil_div(c, 4), pa, pb, plan.plane_len), f, "data_words",
                      attrs={SCHEDULE_RULE: RULE_U8_WORDS, "row_width": wq})


def conv2d_nchw_u8i8(words: te.Tensor, weight: te.Tensor, plan: NchwPlan,
                     out_channels: int) -> te.Tensor:
    """The int32 NCHW convolution of the data words ``[N, CW, PA, PB, Q]``
    (``pack_conv2d_u8_words``) with the weight words ``[O/R, CW/groups, KH, KW, R]``
    (``pack_conv2d_int8_weight``): ``(N, O, OH, OW)`` int32. Blocks ``conv2d_u8i8_flat`` and
    its copy ``conv2d_nchw_u8i8``, or, when ``plan.direct_out``, ``conv2d_nchw_u8i8`` alone.

    Examples
    --------
    >>> g = ConvGeometry(6, 9, 9, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    >>> p = plan_conv2d_u8i8(g, 16, 32)
    >>> x = te.placeholder((te.var("n"), 2, 2, 2, p.plane_len), "int32", "x")
    >>> w = te.placeholder((8 // p.oc_block, 2, 3, 3, p.oc_block), "int32", "w")
    >>> [str(d) for d in conv2d_nchw_u8i8(x, w, p, 8).shape]
    ['n', '8', '5', '5']
    """
    g = plan.geometry
    n = words.shape[0]
    sh, sw = g.strides
    wq, r_blk = plan.row_width, plan.oc_block
    ipg, opg = g.in_per_group, out_channels // g.groups
    rc = te.reduce_axis((0, ipg), "rc")
    ry = te.reduce_axis((0, g.kernel[0]), "ry")
    rx = te.reduce_axis((0, g.kernel[1]), "rx")
    ty, tx = ry.var * g.dilation[0], rx.var * g.dilation[1]
    a, roff = (ty % sh, ty // sh) if sh > 1 else (0, ty)
    b_, coff = (tx % sw, tx // sw) if sw > 1 else (0, tx)

    def chan(o):
        return rc.var if g.groups == 1 else (o // opg) * ipg + rc.var

    def term(bi, o, p):
        x = words[bi, chan(o), a, b_, p + roff * wq + coff]
        return dot4_u8i8(x, weight[o // r_blk, rc, ry, rx, o % r_blk])

    attrs = {SCHEDULE_RULE: RULE_CONV_U8I8, "oc_block": r_blk, "vectors": plan.vectors,
             "lanes": plan.lanes}
    if plan.direct_out:
        ow = g.out_w
        return te.compute((n, out_channels, g.out_h, ow),
                          lambda bi, o, y, x: te.sum(term(bi, o, y * ow + x), axis=[rc, ry, rx]),
                          "conv2d_nchw_u8i8", attrs=attrs)
    flat = te.compute((n, out_channels, plan.out_len),
                      lambda bi, o, p: te.sum(term(bi, o, p), axis=[rc, ry, rx]),
                      "conv2d_u8i8_flat", attrs=attrs)
    return te.compute((n, out_channels, g.out_h, g.out_w),
                      lambda bi, o, y, x: flat[bi, o, y * wq + x], "conv2d_nchw_u8i8")


def schedule_conv2d_u8i8(sch: Schedule, name: str, target: Target,
                         gemv_rows: PrimExpr | None = None) -> None:
    """The flat NCHW tile of ``conv2d_nchw.schedule_conv2d_nchw`` on int32 accumulators: ``R``
    channels x ``V`` vectors of positions in registers, one ``dot4_u8i8`` (``vpdpbusd``) per
    accumulator and step of ``(channel word, ry, rx)``, the taps unrolled, the position tiles
    (or channel blocks) parallel, the epilogue in the write-back."""
    schedule_conv2d_nchw(sch, name, target, gemv_rows)


def schedule_u8_words(sch: Schedule, name: str, target: Target,
                      gemv_rows: PrimExpr | None = None) -> None:
    """The data words' stage (``pack_conv2d_u8_words``, with the quantization ``FuseOps`` put
    in it): the flat plane split into its rows, each row vectorized, the loops above parallel.

    Unlike the float padding stage (``padding.schedule_pad``), the rows are vectorized when
    they read every ``s``-th column too (a strided layer's phase planes): a word is four
    quantized bytes (four scales, roundings, clamps and a pack), far more arithmetic than the
    shuffles that gather the strided columns cost. MobileNet-V2's stem (3 channels,
    224 x 224, stride 2: the float image quantized into 2 x 2 phase planes) ran its words
    stage in 94 us vectorized against 322 us scalar (the least of 8 profiles each, loaded
    2-core Zen 4 with AVX-512).
    """
    block = sch.get_block(name)
    blk = sch.get(block)
    *outer, q = sch.get_loops(block)
    _, row = sch.split(q, [None, ann_int(blk, "row_width")])
    width, lanes = loop_extent(sch.get(row)), block_lanes(blk, target)
    # a row under two vectors with a ragged end stays scalar (padding.schedule_pad's rule)
    if width is None or width % lanes == 0 or width >= 2 * lanes:
        sch.vectorize(row)
    if loop_work(loop_nodes(sch, sch.get_loops(block))) >= MIN_PARALLEL_WORK:
        sch.parallel(parallel_outer(sch, outer))


FAMILY = KernelFamily(
    name="conv2d_nchw_u8i8", rule=RULE_CONV_U8I8, plan=plan_conv2d_u8i8,
    compute=conv2d_nchw_u8i8, pack=pack_conv2d_int8_weight, schedule=schedule_conv2d_u8i8,
    tile=True, stages={RULE_U8_WORDS: schedule_u8_words})

