"""int4 weight-only dense layers (rule ``RULE_DENSE_Q4``): ``relax.dense_q4`` — float
activations times a weight of 4-bit codes in groups along the reduction dim, each group with
a scale and an offset (``w = q * scale + offset``, ``q`` in ``[0, 15]``; the symmetric form has
``offset = -8 * scale``, a zero point ``z`` gives ``offset = -z * scale``).

The codes stay packed in memory, two to a byte (the even ``k`` in the low nibble); the kernel
dequantizes them in registers, in the reduction step: per step of ``k/2`` it loads NR bytes of
one panel, splits the nibbles (``b % 16``, ``b // 16``: a mask and a shift), converts them and
applies the group's scale and offset (vector loads of the panel's row of scales), then
multiply-adds both into the accumulators. No dequantized weight is ever written.

Layout: codes as panels ``[ceil(N/NR), ceil(K/2), NR]`` uint8 (``pack_q4_panels``) or, where
a panel is 4 vectors of columns (AVX-512's 64, NEON's 16), as words
``[ceil(N/NR), ceil(K/2), NR/4]`` int32 whose byte ``c`` is column ``c * NR/4 + i``'s
(``pack_q4_words``): then a panel row is one vector load, and each of its 8 vectors of codes
(4 column vectors, 2 nibbles) is a shift of it and ``nibble_f32`` (one ``vpermps`` from the table
``0..15`` on AVX-512: it reads only the low 4 bits of each lane), with no widening, mask or
convert. Scales and offsets as ``[ceil(N/NR), ceil(K/G), NR]`` (float32 or float16; float16 is
widened in registers). All zero beyond ``N``; ``FoldConstant`` packs at build time. The tile and
schedule are the float dense kernel's (``dense.schedule_dense``): a ``1 x NR`` row vector for
the memory-bound GEMV of token-by-token decoding, an ``MR x NR`` tile for more rows.

- plan: ``dense.dense_panel_width``;
- packing: ``pack_q4_panels``, ``pack_q4_words``;
- compute: ``dense_q4_packed`` (the portable compute of the operator is ``dense_q4``);
- schedule: ``dense.schedule_dense``.

Examples
--------
>>> q = te.placeholder((384, 2304), "uint8", "q")
>>> [d.value for d in pack_q4_panels(q, 64).shape]
[36, 384, 64]
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import NIBBLE_F32, IntImm, PrimExpr
from tilecraft.tensorir.expr import call as tir_call
from tilecraft.tensorir.schedule import Schedule

from .dense import dense_panel_width
from .geometry import as_int, ceil_div
from .params import num_cores
from .registry import SCHEDULE_RULE, KernelFamily, block_rule
from .schedule_utils import (MIN_PARALLEL_WORK, SYMBOLIC_EXTENT, ann_int, finish_tile_block,
                             fuse_epilogue, loop_extent, loop_nodes, loop_work, tile_tail)

__all__ = ["RULE_DENSE_Q4", "RULE_DENSE_Q4_GROUP", "RULE_Q4_SUMS", "MR_Q4", "pack_q4_panels",
           "pack_q4_words",
           "dense_q4", "dense_q4_packed", "schedule_dense_q4", "FAMILY"]

RULE_DENSE_Q4 = "tilecraft.dense_q4"
RULE_DENSE_Q4_GROUP = "tilecraft.dense_q4_group"    # a group's partial sums sum(q * x)
RULE_Q4_SUMS = "tilecraft.q4_group_sums"            # sum(x) per group
MR_Q4 = 4   # rows of the register tile of partial sums (4 x 64 on AVX-512: 16 accumulators)


def _step(x, lead_idx, k2, in_features: int, lo, hi, scale, offset):
    """``x[2 k2] * (lo * s + o) + x[2 k2 + 1] * (hi * s + o)`` in float32 (the odd tap
    guarded when ``K`` is odd)."""
    s = scale.astype("float32")
    o = offset.astype("float32")
    x0 = x[lead_idx + (k2 * 2,)].astype("float32")
    x1 = x[lead_idx + (k2 * 2 + 1,)].astype("float32") if in_features % 2 == 0 else \
        te.if_then_else(k2 * 2 + 1 < in_features,
                        x[lead_idx + (te.min(k2 * 2 + 1, in_features - 1),)].astype("float32"),
                        te.const(0.0, "float32"))
    return x0 * (lo.astype("float32") * s + o) + x1 * (hi.astype("float32") * s + o)


def dense_q4(data: te.Tensor, codes: te.Tensor, scale: te.Tensor, offset: te.Tensor,
             group_size: int) -> te.Tensor:
    """The portable compute of ``relax.dense_q4``: ``data`` ``(..., K)`` float, ``codes``
    ``(ceil(K/2), N)`` uint8 (two codes a byte, the even ``k`` low), ``scale`` / ``offset``
    ``(ceil(K/G), N)``: ``(..., N)`` float32.

    Examples
    --------
    >>> x = te.placeholder((1, 64), "float32", "x")
    >>> q = te.placeholder((32, 8), "uint8", "q")
    >>> s = te.placeholder((2, 8), "float32", "s")
    >>> [d.value for d in dense_q4(x, q, s, s, 32).shape]
    [1, 8]
    """
    k = as_int(data.shape[-1])
    n = codes.shape[1]
    lead = len(data.shape) - 1
    k2 = te.reduce_axis((0, codes.shape[0]), "k2")
    half = group_size // 2

    def f(*idx):
        j = idx[-1]
        b = codes[k2.var, j]
        g = k2.var // half
        return te.sum(_step(data, tuple(idx[:lead]), k2.var, k, b % IntImm(16, b.dtype),
                            b // IntImm(16, b.dtype), scale[g, j], offset[g, j]), axis=k2)

    return te.compute(tuple(data.shape[:-1]) + (n,), f, "dense_q4")


def pack_q4_panels(t: te.Tensor, width: int) -> te.Tensor:
    """A ``(rows, N)`` tensor (codes, scales or offsets) as panels ``[ceil(N/NR), rows, NR]``,
    zero beyond ``N``.

    Examples
    --------
    >>> s = te.placeholder((24, 100), "float16", "s")
    >>> [d.value for d in pack_q4_panels(s, 32).shape]
    [4, 24, 32]
    """
    rows, n = t.shape
    n_int = as_int(n)
    zero = te.const(0, t.dtype)

    def f(jb, r, c):
        j = jb * width + c
        if n_int % width == 0:
            return t[r, j]
        return te.if_then_else(j < n_int, t[r, te.min(j, n_int - 1)], zero)

    return te.compute((ceil_div(n_int, width), rows, width), f, "q4_panels")


def pack_q4_words(codes: te.Tensor, width: int) -> te.Tensor:
    """The codes ``(ceil(K/2), N)`` uint8 as panels of int32 words
    ``[ceil(N/NR), ceil(K/2), NR/4]``: byte ``c`` of word ``i`` of a panel's row is the code
    byte of the panel's column ``c * NR/4 + i`` (zero beyond ``N``).

    So one vector load of ``NR/4`` words holds a row of the panel, and its code vector for the
    columns ``c * NR/4 ...`` and nibble ``p`` is the low 4 bits of each word shifted right by
    ``8 c + 4 p`` (``nibble_f32``): a shift and one ``vpermps`` per 16 codes on AVX-512, with no
    widening of bytes and no mask.

    Examples
    --------
    >>> q = te.placeholder((384, 768), "uint8", "q")
    >>> [d.value for d in pack_q4_words(q, 64).shape]
    [12, 384, 16]
    """
    if width % 4:
        raise ValueError(f"pack_q4_words: the panel width {width} is not a multiple of 4")
    rows, n = codes.shape
    n_int = as_int(n)
    words = width // 4

    def byte(jb, r, c, i):
        j = jb * width + c * words + i
        b = codes[r, j] if n_int % width == 0 else \
            te.if_then_else(j < n_int, codes[r, te.min(j, n_int - 1)], te.const(0, codes.dtype))
        # the top byte sign-extended: each term then fits in int32 and the sum is the word
        return b.astype("int8" if c == 3 else "int32").astype("int32") * (1 << (8 * c))

    return te.compute((ceil_div(n_int, width), rows, words),
                      lambda jb, r, i: byte(jb, r, 0, i) + byte(jb, r, 1, i) +
                      byte(jb, r, 2, i) + byte(jb, r, 3, i), "q4_words")


def dense_q4_packed(data: te.Tensor, codes: te.Tensor, scale: te.Tensor, offset: te.Tensor,
                    group_size: int, out_features: int) -> te.Tensor:
    """``relax.dense_q4`` on panels (``pack_q4_panels`` of its codes, scales and offsets):
    ``(..., N)`` float32.

    The group's scale and offset are factored out of its sum: with ``w = q * s + o``,
    ``sum_k x[k] w[k] = s * sum_k q[k] x[k] + o * sum_k x[k]`` over each group, so the
    reduction step is a convert and an FMA per code (``q * x`` into a partial sum of the group),
    and the scale and offset are applied once per group. Blocks: ``q4_group_sums``
    (``sum_k x[k]`` per row and group, ``RULE_Q4_SUMS``), ``dense_q4_group`` (the partial sums
    ``sum_k q[k] x[k]`` per row, group and column, ``RULE_DENSE_Q4_GROUP``) and ``dense_q4``
    (``sum_g s * part + o * xsum``; ``dense_q4_panel`` and a copy when ``N`` is narrower than
    one panel).

    Examples
    --------
    >>> x = te.placeholder((te.var("n"), 768), "float32", "x")
    >>> q = te.placeholder((36, 384, 64), "uint8", "q")
    >>> s = te.placeholder((36, 6, 64), "float32", "s")
    >>> [str(d) for d in dense_q4_packed(x, q, s, s, 128, 2304).shape]
    ['n', '2304']
    """
    k = as_int(data.shape[-1])
    k2_len = as_int(codes.shape[1])
    nr = as_int(scale.shape[2])
    words = codes.dtype == "int32"      # pack_q4_words' layout, else pack_q4_panels' bytes
    groups = as_int(scale.shape[1])
    lead = tuple(data.shape[:-1])
    nl = len(lead)
    half = group_size // 2
    width = out_features if out_features >= nr else nr
    zero = te.const(0.0, "float32")

    def x_at(idx, kk):
        """``x[..., kk]`` as float32, 0 beyond ``K`` (a group's tail)."""
        if k % group_size == 0:
            return data[idx + (kk,)].astype("float32")
        return te.if_then_else(kk < k, data[idx + (te.min(kk, k - 1),)].astype("float32"),
                               zero)

    kg = te.reduce_axis((0, group_size), "kg")
    xsum = te.compute(lead + (groups,),
                      lambda *i: te.sum(x_at(tuple(i[:nl]), i[nl] * group_size + kg.var),
                                        axis=kg),
                      "q4_group_sums", attrs={SCHEDULE_RULE: RULE_Q4_SUMS})
    # a step of the reduction is one code: byte k2 of the group, nibble ``par`` of it (the
    # update ``part += q * x`` is then one FMA; the two nibbles of a byte share its load)
    kh = te.reduce_axis((0, half), "kh")
    par = te.reduce_axis((0, 2), "par")

    def part_f(*i):
        idx, g, j = tuple(i[:nl]), i[nl], i[nl + 1]
        k2 = g * half + kh.var
        k2c = te.min(k2, k2_len - 1) if k2_len % half else k2
        if words:
            r = j % nr
            w = codes[j // nr, k2c, r % (nr // 4)]
            shift = (r // (nr // 4) * 8 + par.var * 4).astype("int32")
            q = tir_call(NIBBLE_F32, w, shift, dtype="float32")
            return te.sum(q * x_at(idx, k2 * 2 + par.var), axis=[kh, par])
        b = codes[j // nr, k2c, j % nr]
        # widened first: the nibbles are split in 32-bit lanes, so each vector of codes is
        # one zero-extending load (no extracts of a byte vector's quarters)
        w = b.astype("int32")
        q = te.if_then_else(par.var == 0, w % IntImm(16, "int32"), w // IntImm(16, "int32"))
        return te.sum(q.astype("float32") * x_at(idx, k2 * 2 + par.var), axis=[kh, par])

    part_attrs = {SCHEDULE_RULE: RULE_DENSE_Q4_GROUP}
    if words:
        part_attrs["words"] = nr // 4
    part = te.compute(lead + (groups, width), part_f, "dense_q4_group", attrs=part_attrs)
    g = te.reduce_axis((0, groups), "g")

    def f(*i):
        idx, j = tuple(i[:nl]), i[nl]
        jb, r = j // nr, j % nr
        return te.sum(scale[jb, g.var, r].astype("float32") * part[idx + (g.var, j)] +
                      offset[jb, g.var, r].astype("float32") * xsum[idx + (g.var,)], axis=g)

    attrs = {SCHEDULE_RULE: RULE_DENSE_Q4, "width": nr}
    if out_features >= nr:
        return te.compute(lead + (out_features,), f, "dense_q4", attrs=attrs)
    full = te.compute(lead + (nr,), f, "dense_q4_panel", attrs=attrs)
    return te.compute(lead + (out_features,), lambda *i: full[i], "dense_q4")


def schedule_dense_q4(sch: Schedule, name: str, target: Target,
                      gemv_rows: PrimExpr | None = None) -> bool:
    """``dense_q4_packed``: panels of ``NR`` columns outermost and parallel; per row tile
    (``MR_Q4`` rows, or one row for a GEMV: at most ``GEMV_MAX_ROWS`` static rows, or the
    symbolic ``gemv_rows`` of the small version) and group, the partial sums ``sum q * x``
    accumulate in an ``MR x NR`` register tile over the group's codes (each step: one load of
    ``NR`` code bytes, a mask and a shift for the two nibbles, converts, two FMAs per vector),
    then one multiply-add per group applies the scale and offset into the output tile, whose
    write-back computes the epilogue. Returns whether the block took the row-vector version
    for ``gemv_rows``."""
    block = sch.get_block(name)
    width = ann_int(sch.get(block), "width")
    *lead, i, j, g = sch.get_loops(block)
    ei = loop_extent(sch.get(i))
    gemv = gemv_rows is not None and ei is None and bool(sch.get(i).extent == gemv_rows)
    jo, ji = sch.split(j, [None, width])
    if gemv or (ei is not None and ei <= MR_Q4):
        io, ii = None, i
    else:
        io, ii = sch.split(i, [None, MR_Q4])
    rows = [io] if io is not None else []
    if gemv:
        sch.reorder(jo, *lead, ii, g, ji)
        tile_loop = ii
    else:
        sch.reorder(jo, *lead, *rows, g, ii, ji)
        tile_loop = io if io is not None else (lead[-1] if lead else jo)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tile_loop)
    fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, g)
    # the group's partial sums: computed per group into a register tile
    part = next(p for p in sch.get_producers(block)
                if block_rule(sch.get(p)) == RULE_DENSE_Q4_GROUP)
    sch.compute_at(part, g)
    sch.set_scope(part, 0, "local")
    # its own loops under g: the tile's rows (none for one row), columns, then the codes
    own = tile_tail(sch, part, len(sch.get_loops(init)) - (1 if gemv else 2) + 1)
    *prow, pj, pk, pp = own
    words = ann_int(sch.get(part), "words", 0)
    if words:
        # pack_q4_words: the panel's columns as 4 vectors of ``words`` lanes, each a shift of
        # one loaded vector of words
        pc, pi = sch.split(pj, [None, words])
        sch.reorder(pk, pp, *prow, pc, pi)
    else:
        sch.reorder(pk, pp, *prow, pj)
    part_init = sch.decompose_reduction(part, pk)
    sch.unroll(pp)
    for blk in (part, part_init):
        *rest, bj = tile_tail(sch, blk, len(sch.get_loops(blk)) - 1 - len(prow) -
                              (1 if words else 0))
        for rv in rest:
            sch.unroll(rv)
        sch.vectorize(bj)
    if not gemv:
        sch.unroll(ii)
    sch.vectorize(ji)
    outer = len(sch.get_loops(init)) - (1 if gemv else 2)
    finish_tile_block(sch, init, outer)
    finish_tile_block(sch, acc, outer)
    # parallel: the panels when there are enough of them, else the row tiles
    panels = loop_extent(sch.get(jo)) or 1
    rows_work = loop_work(loop_nodes(sch, lead + rows))
    if panels * rows_work * width * (loop_extent(sch.get(g)) or SYMBOLIC_EXTENT) < \
            MIN_PARALLEL_WORK:
        return gemv
    if panels >= 2 * num_cores(target) or not (rows or lead):
        sch.parallel(jo)
    elif rows:
        sch.parallel(io)
    else:
        sch.parallel(jo)
    return gemv


FAMILY = KernelFamily(
    name="dense_q4", rule=RULE_DENSE_Q4, plan=dense_panel_width, compute=dense_q4_packed,
    pack=pack_q4_panels, schedule=schedule_dense_q4, tile=True,
    stages={RULE_DENSE_Q4_GROUP: None, RULE_Q4_SUMS: None})
