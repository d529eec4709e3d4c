"""Integer division and int64 <-> float conversion without compiler-runtime helpers.

On 32-bit targets LLVM lowers 64-bit division and int64/float conversion to calls such as
``__aeabi_ldivmod`` or ``__aeabi_l2f``, and on ARM cores without a divide instruction even 32-bit
division becomes ``__aeabi_uidiv``. Those helpers live in libgcc / compiler-rt, which a kernel
library cannot count on being loaded, so here they are written in LLVM IR and emitted into the
module (internal linkage) when a target needs them:

* ``udivrem32`` / ``udivrem64``: shift-and-subtract division; the 64-bit one takes a 32-bit
  (hardware) division when both operands fit in 32 bits, which is the common case for indices.
* signed division through the unsigned one (C truncation semantics);
* int64 <-> float through double arithmetic on the two 32-bit halves (an int64 -> float32 is
  rounded twice, through double).
"""
from __future__ import annotations

from . import llvmir as ir

from .irutil import F64, I32, I64, ModuleBuilder, const, is_vector, lanes_of, vec_type

_ARM_HWDIV_CPUS = {"cortex-a7", "cortex-a12", "cortex-a15", "cortex-a17", "cortex-a32",
                   "cortex-a35", "cortex-a53", "cortex-a55", "cortex-a57", "cortex-a72",
                   "cortex-a73", "cortex-a75", "cortex-a76", "cortex-a77", "cortex-a78",
                   "krait", "swift"}


def hardware_division(arch: str, cpu: str, features: str) -> dict[int, bool]:
    """Which integer widths the target divides in hardware: ``{32: bool, 64: bool}``."""
    feats = set(features.split(","))
    if arch in ("x86_64", "aarch64"):
        return {32: True, 64: True}
    if arch == "riscv64":
        m = "+m" in feats or cpu.startswith("sifive-u") or cpu in ("generic-rv64",)
        return {32: m, 64: m}
    if arch == "arm":
        hw = "+hwdiv-arm" in feats or cpu in _ARM_HWDIV_CPUS
        return {32: hw, 64: False}
    if arch == "riscv32":
        return {32: "+m" in feats, 64: False}
    return {32: True, 64: False}  # 32-bit x86


class SoftOps:
    def __init__(self, mb: ModuleBuilder, hw_div: dict[int, bool], pointer_bits: int):
        self.mb = mb
        self.hw_div = hw_div
        self.soft_int64_float = pointer_bits == 32
        self._fns: dict[str, ir.Function] = {}

    # -- decisions ------------------------------------------------------------------------------
    def division_is_soft(self, bits: int, divisor) -> bool:
        """Whether ``bits``-wide division by ``divisor`` (a constant or None) needs the routine."""
        const = divisor.constant if isinstance(divisor, ir.Constant) and \
            not isinstance(divisor.type, ir.VectorType) else None
        if const is not None and const > 0 and const & (const - 1) == 0:
            return False  # a power of two: shifts
        if bits > 32:
            return not self.hw_div[64]
        if self.hw_div[32]:
            return False
        return const is None  # LLVM divides by a constant with a multiplication

    # -- division -------------------------------------------------------------------------------
    def divrem(self, b: ir.IRBuilder, a, d, signed: bool, rem: bool):
        """Truncating ``a / d`` (or ``a % d``) of scalars or vectors, through the routines."""
        if is_vector(a):
            out = ir.Constant(a.type, ir.Undefined)
            for lane in range(lanes_of(a)):
                x = b.extract_element(a, I32(lane))
                y = b.extract_element(d, I32(lane))
                out = b.insert_element(out, self.divrem(b, x, y, signed, rem), I32(lane))
            return out
        bits = a.type.width
        wide = I64 if bits > 32 else I32
        ext = b.sext if signed else b.zext
        x = a if bits in (32, 64) else ext(a, wide)
        y = d if bits in (32, 64) else ext(d, wide)
        if signed:
            r = self._signed(b, x, y, rem)
        else:
            pair = b.call(self._udivrem(wide.width), [x, y])
            r = b.extract_value(pair, 1 if rem else 0)
        return r if r.type == a.type else b.trunc(r, a.type)

    def _signed(self, b, x, y, rem):
        zero = ir.Constant(x.type, 0)
        sx, sy = b.icmp_signed("<", x, zero), b.icmp_signed("<", y, zero)
        ux = b.select(sx, b.sub(zero, x), x)
        uy = b.select(sy, b.sub(zero, y), y)
        pair = b.call(self._udivrem(x.type.width), [ux, uy])
        if rem:
            r = b.extract_value(pair, 1)
            return b.select(sx, b.sub(zero, r), r)
        q = b.extract_value(pair, 0)
        return b.select(b.xor(sx, sy), b.sub(zero, q), q)

    def _udivrem(self, bits: int) -> ir.Function:
        name = f"tilecraft_rt.udivrem{bits}"
        if name in self._fns:
            return self._fns[name]
        ty = ir.IntType(bits)
        pair = ir.LiteralStructType([ty, ty])
        fn = ir.Function(self.mb.module, ir.FunctionType(pair, [ty, ty]), name)
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        self._fns[name] = fn
        n, d = fn.args
        entry = fn.append_basic_block("entry")
        b = ir.IRBuilder(entry)
        if bits == 64:
            # both halves fit in 32 bits: one 32-bit division
            small_bb, big_bb = fn.append_basic_block("small"), fn.append_basic_block("big")
            high = b.lshr(b.or_(n, d), I64(32))
            b.cbranch(b.icmp_unsigned("==", high, I64(0)), small_bb, big_bb)
            b.position_at_end(small_bb)
            n32, d32 = b.trunc(n, I32), b.trunc(d, I32)
            if self.hw_div[32]:
                q32, r32 = b.udiv(n32, d32), b.urem(n32, d32)
            else:
                p32 = b.call(self._udivrem(32), [n32, d32])
                q32, r32 = b.extract_value(p32, 0), b.extract_value(p32, 1)
            res = ir.Constant(pair, ir.Undefined)
            res = b.insert_value(res, b.zext(q32, I64), 0)
            b.ret(b.insert_value(res, b.zext(r32, I64), 1))
            b.position_at_end(big_bb)
        # shift-and-subtract, one quotient bit per step (d == 0 gives all ones, no trap)
        loop, body, done = (fn.append_basic_block("loop"), fn.append_basic_block("body"),
                            fn.append_basic_block("done"))
        pre = b.block
        b.branch(loop)
        b.position_at_end(loop)
        i = b.phi(ty, name="i")
        q = b.phi(ty, name="q")
        r = b.phi(ty, name="r")
        i.add_incoming(ir.Constant(ty, bits), pre)
        q.add_incoming(ir.Constant(ty, 0), pre)
        r.add_incoming(ir.Constant(ty, 0), pre)
        b.cbranch(b.icmp_unsigned(">", i, ir.Constant(ty, 0)), body, done)
        b.position_at_end(body)
        k = b.sub(i, ir.Constant(ty, 1))
        bit = b.and_(b.lshr(n, k), ir.Constant(ty, 1))
        r2 = b.or_(b.shl(r, ir.Constant(ty, 1)), bit)
        ge = b.icmp_unsigned(">=", r2, d)
        r3 = b.select(ge, b.sub(r2, d), r2)
        q2 = b.select(ge, b.or_(q, b.shl(ir.Constant(ty, 1), k)), q)
        i.add_incoming(k, body)
        q.add_incoming(q2, body)
        r.add_incoming(r3, body)
        b.branch(loop)
        b.position_at_end(done)
        res = ir.Constant(pair, ir.Undefined)
        res = b.insert_value(res, q, 0)
        b.ret(b.insert_value(res, r, 1))
        return fn

    # -- int64 <-> float ------------------------------------------------------------------------
    def int64_to_float(self, b: ir.IRBuilder, v, signed: bool, target):
        """int64 / uint64 (scalar or vector) -> float or double (``target`` type)."""
        n = lanes_of(v)
        f64 = vec_type(F64, n)
        i32 = vec_type(I32, n)
        hi = b.trunc(b.ashr(v, _c(v.type, 32)) if signed else b.lshr(v, _c(v.type, 32)), i32)
        lo = b.trunc(v, i32)
        hi_f = b.sitofp(hi, f64) if signed else b.uitofp(hi, f64)
        out = b.fadd(b.fmul(hi_f, _c(f64, 4294967296.0)), b.uitofp(lo, f64))
        return out if target == f64 else b.fptrunc(out, target)

    def float_to_int64(self, b: ir.IRBuilder, v, signed: bool, target):
        """float or double -> int64 / uint64, truncating (out of range is undefined, as in C)."""
        n = lanes_of(v)
        f64 = vec_type(F64, n)
        i32 = vec_type(I32, n)
        x = v if v.type == f64 else b.fpext(v, f64)
        t = b.call(self.mb.intrinsic("trunc", f64, [f64]), [x])
        hi_f = b.call(self.mb.intrinsic("floor", f64, [f64]),
                      [b.fmul(t, _c(f64, 1.0 / 4294967296.0))])
        lo_f = b.fsub(t, b.fmul(hi_f, _c(f64, 4294967296.0)))
        hi = b.fptosi(hi_f, i32) if signed else b.fptoui(hi_f, i32)
        lo = b.fptoui(lo_f, i32)
        hi64 = b.sext(hi, target) if signed else b.zext(hi, target)
        return b.or_(b.shl(hi64, _c(target, 32)), b.zext(lo, target))


def _c(ty, value):
    return const(ty, value)

