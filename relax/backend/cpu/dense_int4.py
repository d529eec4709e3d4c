"""int4 weight-only dense layers (rule ``RULE_DENSE_Q4``): ``relax.dense_q4`` — float
activations times a weight of 4-bit codes in groups along the reduction dim, each group with
a scale and an offset (``w = q * scale + offset``, ``q`` in ``[0, 15]``; the symmetric form has
``offset = -8 * scale``, a zero point ``z`` gives ``offset = -z * scale``).

The codes stay packed in memory, two to a byte (the even ``k`` in the low nibble); the kernel
dequantizes them in registers, in the reduction step: per step of ``k/2`` it loads NR bytes of
one panel, splits the nibbles (``b % 16``, ``b // 16``: a mask and a shift), converts them and
applies the group's scale and offset (vector loads of the panel's row of scales), then
multiply-adds both into the accumulators. No dequantized weight is ever written.

Layout: codes as panels ``[ceil(N/NR), ceil(K/2), NR]`` uint8, scales and offsets as
``[ceil(N/NR), ceil(K/G), NR]`` (float32 or float16; float16 is widened in registers), all
zero beyond ``N`` (``pack_q4_panels``; ``FoldConstant`` runs it at build time). The tile and
schedule are the float dense kernel's (``dense.schedule_dense``): a ``1 x NR`` row vector for
the memory-bound GEMV of token-by-token decoding, an ``MR x NR`` tile for more rows.

- plan: ``dense.dense_panel_width``;
- packing: ``pack_q4_panels``;
- compute: ``dense_q4_packed`` (the portable compute of the operator is ``dense_q4``);
- schedule: ``dense.schedule_dense``.

Examples
--------
>>> q = te.placeholder((384, 2304), "uint8", "q")
>>> [d.value for d in pack_q4_panels(q, 64).shape]
[36, 384, 64]
"""
from __future__ import annotations

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import IntImm

from .dense import dense_panel_width, schedule_dense
from .geometry import as_int, ceil_div
from .registry import SCHEDULE_RULE, KernelFamily

__all__ = ["RULE_DENSE_Q4", "pack_q4_panels", "dense_q4", "dense_q4_packed", "FAMILY"]

RULE_DENSE_Q4 = "tilecraft.dense_q4"


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


def dense_q4_packed(data: te.Tensor, codes: te.Tensor, scale: te.Tensor, offset: te.Tensor,
                    group_size: int, out_features: int) -> te.Tensor:
    """``relax.dense_q4`` on panels (``pack_q4_panels`` of its codes, scales and offsets):
    ``(..., N)`` float32, block ``dense_q4`` (``dense_q4_panel`` and a copy when ``N`` is
    narrower than one panel).

    Examples
    --------
    >>> x = te.placeholder((te.var("n"), 768), "float32", "x")
    >>> q = te.placeholder((36, 384, 64), "uint8", "q")
    >>> s = te.placeholder((36, 6, 64), "float32", "s")
    >>> [str(d) for d in dense_q4_packed(x, q, s, s, 128, 2304).shape]
    ['n', '2304']
    """
    k = as_int(data.shape[-1])
    nr = as_int(codes.shape[2])
    lead = len(data.shape) - 1
    k2 = te.reduce_axis((0, codes.shape[1]), "k2")
    half = group_size // 2

    def f(*idx):
        j = idx[-1]
        jb, r = j // nr, j % nr
        b = codes[jb, k2.var, r]
        g = k2.var // half
        return te.sum(_step(data, tuple(idx[:lead]), k2.var, k, b % IntImm(16, b.dtype),
                            b // IntImm(16, b.dtype), scale[jb, g, r], offset[jb, g, r]),
                      axis=k2)

    attrs = {SCHEDULE_RULE: RULE_DENSE_Q4, "width": nr}
    if out_features >= nr:
        return te.compute(tuple(data.shape[:-1]) + (out_features,), f, "dense_q4",
                          attrs=attrs)
    full = te.compute(tuple(data.shape[:-1]) + (nr,), f, "dense_q4_panel", attrs=attrs)
    return te.compute(tuple(data.shape[:-1]) + (out_features,), lambda *i: full[i], "dense_q4")


def _schedule(sch, name, target, gemv_rows=None):
    """``dense.schedule_dense`` with the dequantization in the reduction step."""
    return schedule_dense(sch, name, target, gemv_rows)


FAMILY = KernelFamily(
    name="dense_q4", rule=RULE_DENSE_Q4, plan=dense_panel_width, compute=dense_q4_packed,
    pack=pack_q4_panels, schedule=_schedule, tile=True)
