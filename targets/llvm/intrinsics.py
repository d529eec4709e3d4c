"""Math intrinsics of TensorIR (``exp``, ``tanh``, ``erf``, ...) in LLVM IR.

Most map to LLVM intrinsics (``llvm.sqrt.v8f32``, ``llvm.log.f32``), which LLVM turns into
instructions or libm calls; float32 ``exp`` and ``tanh`` are inline polynomials (Cephes, 1-2 ulp)
so that vectorized loops stay vector code; ``erf`` calls libm (one call per lane for vectors);
``sigmoid`` and ``rsqrt`` are expanded. float16 is computed in float32 (see ``fp16``); float64
uses LLVM intrinsics and libm throughout.
"""
from __future__ import annotations

import llvmlite.ir as ir

from .irutil import F32, F64, ModuleBuilder, const, element_type, is_vector, lanes_of, vec_type

# TIR op -> LLVM intrinsic base name
LLVM_INTRINSIC = {
    "exp": "exp", "log": "log", "sqrt": "sqrt", "fabs": "fabs", "floor": "floor", "ceil": "ceil",
    "round": "roundeven",  # numpy rounds half to even
    "sin": "sin", "cos": "cos", "exp2": "exp2", "log2": "log2", "trunc": "trunc", "pow": "pow",
}
# TIR op -> (float32 libm name, float64 libm name)
LIBM = {"tanh": ("tanhf", "tanh"), "erf": ("erff", "erf")}
# results that are exact for any float16 input (no re-rounding needed)
EXACT_F16 = {"fabs", "floor", "ceil", "round", "trunc"}


def emit_math(mb: ModuleBuilder, b: ir.IRBuilder, op: str, args: list):
    """Apply ``op`` to float (or float vector) values ``args`` of one type."""
    ty = args[0].type
    if isinstance(element_type(ty), ir.FloatType):
        # float32 exp and tanh are polynomials here: vector code, not one libm call per lane
        if op == "exp":
            return fast_exp_f32(b, args[0])
        if op == "tanh":
            return fast_tanh_f32(mb, b, args[0])
    if op in LLVM_INTRINSIC:
        fn = mb.intrinsic(LLVM_INTRINSIC[op], ty, [ty] * len(args))
        return b.call(fn, args)
    if op in LIBM:
        elem = element_type(ty)
        name = LIBM[op][0] if isinstance(elem, ir.FloatType) else LIBM[op][1]
        fn = mb.declare(name, elem, [elem])
        fn.attributes.add("nounwind")
        if not is_vector(args[0]):
            return b.call(fn, args)
        out = ir.Constant(ty, ir.Undefined)
        for lane in range(lanes_of(args[0])):
            x = b.extract_element(args[0], ir.IntType(32)(lane))
            out = b.insert_element(out, b.call(fn, [x]), ir.IntType(32)(lane))
        return out
    if op == "sigmoid":
        x = args[0]
        e = emit_math(mb, b, "exp", [b.fneg(x)])
        return b.fdiv(const(ty, 1.0), b.fadd(const(ty, 1.0), e))
    if op == "rsqrt":
        return b.fdiv(const(ty, 1.0), emit_math(mb, b, "sqrt", args))
    raise KeyError(op)


def compute_type(dtype_bits: int):
    """The register type a float of ``dtype_bits`` computes in (float16 -> float)."""
    return F64 if dtype_bits == 64 else F32


def _poly(b, x, coeffs):
    """Horner: coeffs[0] * x^(k-1) + ... + coeffs[-1]."""
    acc = const(x.type, coeffs[0])
    for c in coeffs[1:]:
        acc = b.fadd(b.fmul(acc, x), const(x.type, c))
    return acc


def fast_exp_f32(b: ir.IRBuilder, x):
    """expf for scalars or vectors: Cody-Waite range reduction and Cephes' degree-5 polynomial
    (about 1 ulp). exp(x) = 2^n * e^r with n = round(x / ln 2); the scale is applied as two
    powers of two so that subnormal results stay right. Overflow gives inf, underflow 0, NaN
    stays NaN."""
    ty = x.type
    n_ty = vec_type(ir.IntType(32), lanes_of(x))
    hi, lo = 88.72283935546875, -103.97208404541016
    xc = b.select(b.fcmp_ordered(">", x, const(ty, hi)), const(ty, hi), x)
    xc = b.select(b.fcmp_ordered("<", xc, const(ty, lo)), const(ty, lo), xc)
    fn = b.fadd(b.fmul(xc, const(ty, 1.4426950408889634)), const(ty, 0.5))
    fn = b.call(_floor(b, ty), [fn])
    r = b.fsub(xc, b.fmul(fn, const(ty, 0.693359375)))
    r = b.fsub(r, b.fmul(fn, const(ty, -2.12194440e-4)))
    z = b.fmul(r, r)
    p = _poly(b, r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                     1.6666665459e-1, 5.0000001201e-1])
    y = b.fadd(b.fadd(b.fmul(p, z), r), const(ty, 1.0))
    n = b.fptosi(fn, n_ty)
    n1 = b.ashr(n, const(n_ty, 1))
    n2 = b.sub(n, n1)

    def pow2(k):
        return b.bitcast(b.shl(b.add(k, const(n_ty, 127)), const(n_ty, 23)), ty)
    out = b.fmul(b.fmul(y, pow2(n1)), pow2(n2))
    out = b.select(b.fcmp_ordered(">", x, const(ty, hi)), const(ty, float("inf")), out)
    return b.select(b.fcmp_ordered("<", x, const(ty, lo)), const(ty, 0.0), out)


def fast_tanh_f32(mb: ModuleBuilder, b: ir.IRBuilder, x):
    """tanhf (Cephes, about 2 ulp): an odd polynomial for |x| < 0.625, else
    1 - 2 / (exp(2|x|) + 1) with the sign of x."""
    ty = x.type
    ax = b.call(mb.intrinsic("fabs", ty, [ty]), [x])
    e = fast_exp_f32(b, b.fadd(ax, ax))
    big = b.fsub(const(ty, 1.0), b.fdiv(const(ty, 2.0), b.fadd(e, const(ty, 1.0))))
    big = b.call(mb.intrinsic("copysign", ty, [ty, ty]), [big, x])
    s = b.fmul(x, x)
    p = _poly(b, s, [-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2,
                     1.33314422036e-1, -3.33332819422e-1])
    small = b.fadd(b.fmul(b.fmul(p, s), x), x)
    return b.select(b.fcmp_ordered("<", ax, const(ty, 0.625)), small, big)


def _floor(b, ty):
    fn_name = "llvm.floor." + ("v%df32" % ty.count if isinstance(ty, ir.VectorType) else "f32")
    module = b.function.module
    existing = module.globals.get(fn_name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ty, [ty]), fn_name)
