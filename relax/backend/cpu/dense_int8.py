"""int8 dense layers on packed 8-bit words (rule ``RULE_DENSE_U8I8``): ``matmul(x, W)`` with
``x`` uint8 (quantized activations), ``W`` a constant int8 weight and int32 accumulation.

Four consecutive values along the reduction dim travel as one int32 word (byte 0 the least
significant), the operand shape of ``vpdpbusd`` / ``sdot``: the activations as words
``(..., M, ceil(K/4))`` (``pack_u8_words``, fused into the quantization that produces them),
the weight as panels of words ``[ceil(N/NR), ceil(K/4), NR]`` (``pack_dense_int8_weight``,
zero-padded; ``FoldConstant`` packs it at build time). The kernel's reduction step is
``acc + dot4_u8i8(a, w)`` (``targets.llvm.dot4``: one ``vpdpbusd`` per vector of NR/lanes with
AVX-512 VNNI, three ``sdot`` with ``+dotprod``, a widening multiply and pair sums elsewhere),
exact in int32. The tile and its schedule are the float dense kernel's (``dense``): an
``MR x NR`` register tile of int32 accumulators (NR int32 lanes per vector), or a ``1 x NR``
row vector for few rows; the dequantizing epilogue (``(acc - zp * colsum) * scale``) is
computed in the write-back.

- plan: ``dense.dense_panel_width`` (in int32 lanes);
- weight packing: ``pack_dense_int8_weight``; activation packing: ``pack_u8_words``;
- compute: ``dense_u8i8``;
- schedule: ``dense.schedule_dense``.

Examples
--------
>>> w = te.placeholder((768, 3072), "int8", "w")
>>> [d.value for d in pack_dense_int8_weight(w, 64).shape]
[48, 192, 64]
"""
from __future__ import annotations

from tilecraft.tensorir.expr import DOT4_U8I8
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import Cast, IntImm, call as tir_call

from .dense import dense_panel_width, schedule_dense
from .dense_amx import AMX_MIN_ROWS, amx_applies, schedule_dense_amx
from .geometry import as_int, ceil_div
from .registry import SCHEDULE_RULE, KernelFamily
from .schedule_utils import ann_int, loop_extent

__all__ = ["RULE_DENSE_U8I8", "pack_dense_int8_weight", "pack_u8_words", "dense_u8i8",
           "dot4_u8i8", "u8_word", "FAMILY"]

RULE_DENSE_U8I8 = "tilecraft.dense_u8i8"


def dot4_u8i8(a, b):
    """TIR ``dot4_u8i8(a, b)``: the four unsigned bytes of the int32 ``a`` times the four signed
    bytes of ``b``, summed in int32 (the interpreter and every back end compute it exactly).

    Examples
    --------
    >>> from tilecraft.tensorir.expr import IntImm
    >>> dot4_u8i8(IntImm(1, "int32"), IntImm(2, "int32")).op
    'dot4_u8i8'
    """
    return tir_call(DOT4_U8I8, a, b, dtype="int32")


def _byte(v, pos: int):
    """``v`` (an 8-bit value) as its unsigned byte, shifted to byte ``pos`` of a uint32."""
    if v.dtype == "int8":
        v = Cast("uint8", v)            # the two's complement byte: -1 -> 255
    return Cast("uint32", v) * IntImm(1 << (8 * pos), "uint32")


def u8_word(get, k: int, padded: bool = False):
    """``f(kw)``: the int32 word of the bytes ``get(4 * kw + p)`` (``p`` = 0..3, byte 0 the
    least significant; uint8 or int8 values, zero beyond ``k``; ``padded``: words may lie
    wholly beyond ``k``). The bytes are assembled in uint32 (no sign bit to overflow into),
    then reinterpreted as int32.

    Examples
    --------
    >>> x = te.placeholder((8,), "uint8", "x")
    >>> u8_word(lambda i: x[i], 8)(IntImm(1, "int32")).dtype
    'int32'
    """
    def f(kw):
        total = None
        for p in range(4):
            idx = kw * 4 + p
            v = _byte(get(idx), p)
            if k % 4 or padded:
                v = te.if_then_else(idx < k, v, IntImm(0, "uint32"))
            total = v if total is None else total + v
        return Cast("int32", total)
    return f


def pack_u8_words(data: te.Tensor, words: int | None = None) -> te.Tensor:
    """uint8 ``data`` ``(..., K)`` as int32 words ``(..., ceil(K/4))`` (``words`` of them when
    given: the AMX kernel's whole tiles), four consecutive bytes a word (byte 0 the least
    significant), zero beyond ``K``.

    Examples
    --------
    >>> x = te.placeholder((te.var("n"), 30), "uint8", "x")
    >>> [str(d) for d in pack_u8_words(x).shape]
    ['n', '8']
    """
    k = as_int(data.shape[-1])
    lead = len(data.shape) - 1
    words = words or ceil_div(k, 4)
    padded = words > ceil_div(k, 4)

    def get(idx, kk):
        # clamped: a padding word's bytes are read in bounds, then masked to zero
        return data[tuple(idx[:lead]) + (te.min(kk, k - 1) if padded else kk,)]

    def f(*idx):
        return u8_word(lambda kk: get(idx, kk), k, padded)(idx[-1])

    return te.compute(tuple(data.shape[:-1]) + (words,), f, "u8_words")


def pack_dense_int8_weight(weight: te.Tensor, width: int, transpose: bool = False,
                           words: int | None = None) -> te.Tensor:
    """int8 ``weight`` ``[K, N]`` (``[N, K]`` with ``transpose``) as panels of words
    ``[ceil(N/NR), ceil(K/4), NR]`` (``words`` instead of ``ceil(K/4)`` when given): word
    ``[jb, kw, r]`` holds ``W[4 kw + p, jb NR + r]`` in byte ``p``; zero beyond ``K`` and ``N``.

    Examples
    --------
    >>> w = te.placeholder((64, 100), "int8", "w")
    >>> [d.value for d in pack_dense_int8_weight(w, 16, transpose=True).shape]
    [4, 25, 16]
    """
    k, n = (weight.shape[1], weight.shape[0]) if transpose else weight.shape
    k_int, n_int = as_int(k), as_int(n)
    words = words or ceil_div(k_int, 4)
    padded = words > ceil_div(k_int, 4)

    def f(jb, kw, r):
        j = jb * width + r

        def get(kk):
            kk_c = te.min(kk, k_int - 1) if k_int % 4 or padded else kk
            j_c = te.min(j, n_int - 1) if n_int % width else j
            return weight[j_c, kk_c] if transpose else weight[kk_c, j_c]
        word = u8_word(get, k_int, padded)(kw)
        if n_int % width:
            word = te.if_then_else(j < n_int, word, IntImm(0, "int32"))
        return word

    return te.compute((ceil_div(n_int, width), words, width), f, "weight_packed_i8")


def dense_u8i8(data: te.Tensor, weight: te.Tensor, out_features: int) -> te.Tensor:
    """int32 ``x @ W`` of uint8 activations as words ``(..., M, K/4)`` (``pack_u8_words``) and
    int8 weight panels of words ``[ceil(N/NR), K/4, NR]`` (``pack_dense_int8_weight``):
    ``(..., M, N)``, block ``dense_u8i8`` (``dense_u8i8_panel`` and a copy when ``N`` is
    narrower than one panel).

    Examples
    --------
    >>> x = te.placeholder((te.var("n"), 192), "int32", "x")
    >>> w = te.placeholder((48, 192, 64), "int32", "w")
    >>> [str(d) for d in dense_u8i8(x, w, 3072).shape]
    ['n', '3072']
    """
    nr = as_int(weight.shape[2])
    k = te.reduce_axis((0, data.shape[-1]), "k")
    lead = len(data.shape) - 1

    def f(*idx):
        j = idx[-1]
        return te.sum(dot4_u8i8(data[tuple(idx[:lead]) + (k.var,)], weight[j // nr, k, j % nr]),
                      axis=k)

    attrs = {SCHEDULE_RULE: RULE_DENSE_U8I8, "width": nr}
    if out_features >= nr:
        return te.compute(tuple(data.shape[:-1]) + (out_features,), f, "dense_u8i8",
                          attrs=attrs)
    full = te.compute(tuple(data.shape[:-1]) + (nr,), f, "dense_u8i8_panel", attrs=attrs)
    return te.compute(tuple(data.shape[:-1]) + (out_features,), lambda *i: full[i],
                      "dense_u8i8")


def _schedule(sch, name, target, gemv_rows=None):
    """``dense_amx.schedule_dense_amx`` where the target has AMX and the operands are padded
    to whole tiles (``AlterOpImpl`` does so for such a target), except for the symbolic
    small version (``gemv_rows``) and fewer than ``AMX_MIN_ROWS`` constant rows; else
    ``dense.schedule_dense`` on the int32 accumulators."""
    blk = sch.get(sch.get_block(name))
    width = ann_int(blk, "width")
    *_, i, _, k = sch.get_loops(sch.get_block(name))
    rows = loop_extent(sch.get(i))
    # few rows: the row-vector / register-tile kernel (a tile instruction costs the same for
    # 1 row as for 16)
    small = (gemv_rows is not None and bool(sch.get(i).extent == gemv_rows)) or \
        (rows is not None and rows < AMX_MIN_ROWS)
    if amx_applies(target, width) and not small and loop_extent(sch.get(k)) is not None \
            and loop_extent(sch.get(k)) % 16 == 0:
        schedule_dense_amx(sch, name, target)
        return False
    return schedule_dense(sch, name, target, gemv_rows)


FAMILY = KernelFamily(
    name="dense_u8i8", rule=RULE_DENSE_U8I8, plan=dense_panel_width, compute=dense_u8i8,
    pack=pack_dense_int8_weight, schedule=_schedule, tile=True)
