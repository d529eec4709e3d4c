"""The packed 8-bit dot product ``dot4_u8i8`` in LLVM IR: the int8 kernels' inner step.

``acc + dot4_u8i8(a, b)`` (TIR: ``Add(acc, Call("dot4_u8i8", [a, b]))``, int32 operands) adds
to each int32 lane of ``acc`` the dot product of the four bytes of ``a`` (unsigned) with the
four bytes of ``b`` (signed), byte 0 the least significant. The sum is exact (at most
4 * 255 * 128 in magnitude: no saturation on any path). How it is emitted:

=========================  ====================================================================
target                     instructions
=========================  ====================================================================
x86 with AVX-512 VNNI      ``vpdpbusd`` (``llvm.x86.avx512.vpdpbusd.{128,256,512}``): the
                           multiply, the pairwise sums and the accumulation in one instruction
aarch64 with ``+dotprod``  ``sdot`` (``llvm.aarch64.neon.sdot``): ``a`` is unsigned, so
                           ``a - 128`` (its top bit flipped) goes in, and two ``sdot`` of
                           ``b`` with 64 in every byte add back the ``128 * sum(b)``
elsewhere                  the bytes widened to 16 bits and multiplied, the products summed in
                           pairs to 32 bits (LLVM selects ``vpmaddwd`` on AVX2, ``smull`` /
                           ``saddlp`` on NEON), then the pairs of pairs
=========================  ====================================================================

``vpmaddubsw`` (AVX2's u8 x s8 instruction) is not used: it saturates its 16-bit pair sums
(``255 * -128 * 2`` does not fit), and the kernels promise exact int32 accumulation.

``dot_isa(arch, features, vector_width)`` picks the row of the table for a target.

Examples
--------
>>> dot_isa("x86_64", "+avx2,+avx512f,+avx512vnni", 512)
'avx512vnni'
>>> dot_isa("aarch64", "+neon,+dotprod", 128), dot_isa("x86_64", "+avx2", 256)
('dotprod', None)
"""
from __future__ import annotations

from . import llvmir as ir

from tilecraft.tensorir.expr import DOT4_U8I8
from .irutil import I32, ModuleBuilder, is_vector, lanes_of, splat

__all__ = ["DOT4_U8I8", "dot_isa", "emit_dot4"]

I8 = ir.IntType(8)
I16 = ir.IntType(16)


def dot_isa(arch: str, features: str, vector_width: int) -> str | None:
    """The dot-product instruction family of a target: ``"avx512vnni"`` (x86 with
    ``+avx512vnni`` and 512-bit vectors), ``"dotprod"`` (aarch64 with ``+dotprod``), or None
    (the portable widening sequence).

    Examples
    --------
    >>> dot_isa("x86_64", "+avx512f", 512) is None
    True
    """
    feats = set(f for f in features.split(",") if f)
    if arch in ("x86_64", "x86") and "+avx512vnni" in feats and vector_width >= 512:
        return "avx512vnni"
    if arch == "aarch64" and "+dotprod" in feats:
        return "dotprod"
    return None


def _chunks(b: ir.IRBuilder, v, width: int) -> list:
    """``v`` (``<n x i32>``) as consecutive ``<width x i32>`` pieces."""
    n = lanes_of(v)
    return [b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                             ir.Constant(ir.VectorType(I32, width), list(range(s, s + width))))
            for s in range(0, n, width)]


def _concat(b: ir.IRBuilder, parts: list):
    """The pieces (``<width x i32>`` each) as one vector, in order. Any count of pieces: 12
    lanes are three pieces of 4 (a tuned schedule may vectorize so), and a shuffle takes two
    operands of one type, so the pieces are first padded (undefined lanes) to a power of two,
    joined pairwise, and the padding cut off."""
    width, count = lanes_of(parts[0]), len(parts)
    ty = parts[0].type
    total = 1 << (count - 1).bit_length()
    parts = parts + [ir.Constant(ty, ir.Undefined)] * (total - count)
    while len(parts) > 1:
        nxt = []
        for x, y in zip(parts[0::2], parts[1::2]):
            n = lanes_of(x) + lanes_of(y)
            nxt.append(b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, n), list(range(n)))))
        parts = nxt
    whole = parts[0]
    if total == count:
        return whole
    n = width * count
    return b.shuffle_vector(whole, ir.Constant(whole.type, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, n), list(range(n))))


def _vnni(mb: ModuleBuilder, b: ir.IRBuilder, acc, x, y):
    n = lanes_of(acc)
    width = 16 if n % 16 == 0 else 8 if n % 8 == 0 else 4
    ty = ir.VectorType(I32, width)
    fn = mb.declare(f"llvm.x86.avx512.vpdpbusd.{width * 32}", ty, [ty, ty, ty])
    out = [b.call(fn, [c, p, q]) for c, p, q in zip(_chunks(b, acc, width), _chunks(b, x, width),
                                                   _chunks(b, y, width))]
    return _concat(b, out)


def _sdot(mb: ModuleBuilder, b: ir.IRBuilder, acc, x, y):
    n = lanes_of(acc)
    ty, bty = ir.VectorType(I32, 4), ir.VectorType(I8, 16)
    fn = mb.declare("llvm.aarch64.neon.sdot.v4i32.v16i8", ty, [ty, bty, bty])
    flip = ir.Constant(ty, [ir.Constant(I32, -0x7F7F7F80)] * 4)       # 0x80808080
    sixty_four = b.bitcast(ir.Constant(ty, [ir.Constant(I32, 0x40404040)] * 4), bty)
    out = []
    for c, p, q in zip(_chunks(b, acc, 4), _chunks(b, x, 4), _chunks(b, y, 4)):
        ps = b.bitcast(b.xor(p, flip), bty)          # a - 128, as signed bytes
        qs = b.bitcast(q, bty)
        c = b.call(fn, [c, ps, qs])
        c = b.call(fn, [c, sixty_four, qs])
        out.append(b.call(fn, [c, sixty_four, qs]))
    return _concat(b, out)


def _portable(b: ir.IRBuilder, acc, x, y):
    n = lanes_of(acc)
    bty = ir.VectorType(I8, 4 * n)
    wty = ir.VectorType(I32, 4 * n)
    xa = b.zext(b.bitcast(x, bty), ir.VectorType(I16, 4 * n))
    yb = b.sext(b.bitcast(y, bty), ir.VectorType(I16, 4 * n))
    # 16-bit operands, 32-bit products: the shape LLVM turns into pmaddwd / smull
    prod = b.mul(b.sext(xa, wty), b.sext(yb, wty))
    undef = ir.Constant(wty, ir.Undefined)

    def lanes(k):
        return b.shuffle_vector(prod, undef,
                                ir.Constant(ir.VectorType(I32, n), [4 * i + k for i in range(n)]))
    return b.add(acc, b.add(b.add(lanes(0), lanes(1)), b.add(lanes(2), lanes(3))))


def emit_dot4(mb: ModuleBuilder, b: ir.IRBuilder, isa: str | None, acc, x, y):
    """``acc + dot4_u8i8(x, y)`` for int32 values (scalars or vectors of one lane count; a
    scalar operand is broadcast), with the instructions of ``isa`` (``dot_isa``)."""
    n = max(lanes_of(acc), lanes_of(x), lanes_of(y))
    acc, x, y = (splat(b, v, n) for v in (acc, x, y))
    if isa == "avx512vnni" and n % 4 == 0:
        return _vnni(mb, b, acc, x, y)
    if isa == "dotprod" and n % 4 == 0:
        return _sdot(mb, b, acc, x, y)
    if not is_vector(acc):
        # one lane: widen through a one-lane vector
        v = [b.insert_element(ir.Constant(ir.VectorType(I32, 1), ir.Undefined), s, I32(0))
             for s in (acc, x, y)]
        return b.extract_element(_portable(b, *v), I32(0))
    return _portable(b, acc, x, y)

