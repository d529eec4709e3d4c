"""float16 support: values live in registers as float32 and are rounded to half precision after
every operation, so results match numpy's float16 arithmetic op for op.

Conversions use LLVM's ``half`` (``fpext``/``fptrunc``) where the target converts natively (x86
with F16C, AArch64, ARM with VFPv4/fp16, RISC-V with Zfhmin). Elsewhere they are integer bit
manipulation emitted inline, so no compiler-rt helper (``__extendhfsf2``) is needed at load time.
"""
from __future__ import annotations

from . import llvmir as ir

from .irutil import F16, F32, I16, I32, const, lanes_of, vec_type


def _c(v, ty_like, value):
    return const(vec_type(ty_like, lanes_of(v)), value)


def half_bits_to_float(b: ir.IRBuilder, h):
    """i16 (or <N x i16>) half-precision bits -> float (or <N x float>), exactly."""
    n = lanes_of(h)
    i32t, f32t = vec_type(I32, n), vec_type(F32, n)
    h32 = b.zext(h, i32t)
    em = b.and_(h32, _c(h, I32, 0x7FFF))
    sign = b.shl(b.and_(h32, _c(h, I32, 0x8000)), _c(h, I32, 16))
    u = b.shl(em, _c(h, I32, 13))
    # exponent rebias by multiplying by 2^112: exact for normal and subnormal halves
    scaled = b.fmul(b.bitcast(u, f32t), const(f32t, 2.0 ** 112))
    bits = b.bitcast(scaled, i32t)
    inf_nan = b.icmp_unsigned(">=", em, _c(h, I32, 0x7C00))
    bits = b.select(inf_nan, b.or_(u, _c(h, I32, 0x7F800000)), bits)
    return b.bitcast(b.or_(bits, sign), f32t)


def float_to_half_bits(b: ir.IRBuilder, f):
    """float (or vector) -> i16 half bits, rounding to nearest even (F. Giesen's method)."""
    n = lanes_of(f)
    i32t, f32t = vec_type(I32, n), vec_type(F32, n)
    c = lambda v: _c(f, I32, v)  # noqa: E731
    fb = b.bitcast(f, i32t)
    sign = b.and_(fb, c(0x80000000))
    a = b.xor(fb, sign)
    # too large for half: inf, or a quiet NaN
    big = b.icmp_unsigned(">=", a, c(0x47800000))
    r_big = b.select(b.icmp_unsigned(">", a, c(0x7F800000)), c(0x7E00), c(0x7C00))
    # result is subnormal: let the FPU round by adding a magic number
    small = b.icmp_unsigned("<", a, c(0x38800000))
    magic = const(f32t, 0.5)  # bits 0x3F000000 = ((127 - 15) + (23 - 10) + 1) << 23
    r_small = b.sub(b.bitcast(b.fadd(b.bitcast(a, f32t), magic), i32t), c(0x3F000000))
    # normal: rebias the exponent and round the mantissa to nearest even
    odd = b.and_(b.lshr(a, c(13)), c(1))
    r_norm = b.lshr(b.add(b.add(a, c(0xC8000FFF)), odd), c(13))
    r = b.select(big, r_big, b.select(small, r_small, r_norm))
    r = b.or_(r, b.lshr(sign, c(16)))
    return b.trunc(r, vec_type(I16, n))


class Float16:
    """float16 conversions for one target: native ``half`` or the integer routines above."""

    def __init__(self, native: bool):
        self.native = native
        self.mem = F16 if native else I16   # how a float16 sits in memory

    def load_to_float(self, b: ir.IRBuilder, v):
        """Memory representation (half or i16) -> float32 register value."""
        if self.native:
            return b.fpext(v, vec_type(F32, lanes_of(v)))
        return half_bits_to_float(b, v)

    def float_to_mem(self, b: ir.IRBuilder, v):
        """float32 (or float64: narrowed to float32 first) -> memory representation."""
        n = lanes_of(v)
        if not isinstance(v.type if n == 1 else v.type.element, ir.FloatType):
            v = b.fptrunc(v, vec_type(F32, n))
        if self.native:
            return b.fptrunc(v, vec_type(F16, n))
        return float_to_half_bits(b, v)

    def round(self, b: ir.IRBuilder, v):
        """Round a float32 value to the nearest float16 (kept as float32)."""
        return self.load_to_float(b, self.float_to_mem(b, v))
