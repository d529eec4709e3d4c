"""Math intrinsics of TensorIR (``exp``, ``tanh``, ``erf``, ...) in LLVM IR.

Most map to LLVM intrinsics (``llvm.sqrt.v8f32``, ``llvm.floor.f32``), which LLVM turns into
instructions or libm calls. float32 ``exp``, ``log``, ``tanh`` and ``erf`` are inline polynomials
written here, so that vectorized loops stay vector code (a libm call per lane costs 10-50x more):

======  =============================================================  ===========
op      method                                                         max error
======  =============================================================  ===========
exp     Cody-Waite reduction by ln 2, degree-6 minimax polynomial;      1 ulp
        the scale 2^n by ``vscalefps`` on AVX-512, else exponent bits
log     x = m 2^e with m in [sqrt(1/2), sqrt(2)); log1p(m - 1) by a     1 ulp
        degree-10 minimax polynomial; e ln 2 in two parts
tanh    odd polynomial for |x| < 0.625, else 1 - 2 / (exp(2|x|) + 1)    2 ulp
erf     |x| < 0.921875: x + x P(x^2); else 1 - exp(|x| Q(|x|))          2 ulp
======  =============================================================  ===========

``exp`` computes its lanes below -104 (whose result is 0) from 0, so that a vector of
masked scores (float32's lowest value) makes no subnormal intermediates, which x86 cores
handle by a microcode assist each unless the thread flushes them to zero.

Every one handles the special values as libm does: NaN gives NaN, infinities and overflow give
the limits (``exp(inf) = inf``, ``log(0) = -inf``, ``log(-1) = NaN``, ``erf(-inf) = -1``),
signed zeros keep their sign where libm's do, subnormal inputs and results are exact.
``sigmoid`` and ``rsqrt`` are expanded; ``sin``, ``cos``, ``pow`` and the rest stay LLVM
intrinsics / libm. float16 is computed in float32 (see ``fp16``); float64 uses LLVM intrinsics
and libm throughout.

The polynomial coefficients are discrete minimax fits (a linear program over a dense grid,
weighted for relative error of the final result), rounded to float32; ``tests/targets/
test_fast_math.py`` checks the compiled functions against float64 references in ulps.
Multiply-adds are ``llvm.fmuladd``: one fused instruction where the target has FMA.
"""
from __future__ import annotations

from . import llvmir as ir

from .irutil import F32, F64, I32, ModuleBuilder, const, element_type, is_vector, lanes_of, \
    vec_type

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


def configure(mb: ModuleBuilder, *, triple: str, vector_width: int) -> None:
    """Tell the math emitters of module ``mb`` what the target offers.

    An x86 target whose vector registers are 512 bits has AVX-512F, whose ``vscalefps``
    applies ``2^n`` to a vector in one instruction (with IEEE overflow, underflow and subnormal
    rounding); elsewhere the scale is done on the exponent bits.

    Examples
    --------
    >>> configure(mb, triple="x86_64-unknown-linux-gnu", vector_width=512)   # doctest: +SKIP
    """
    arch = triple.split("-", 1)[0]
    mb.math_avx512 = arch in ("x86_64", "amd64") and vector_width >= 512


def emit_math(mb: ModuleBuilder, b: ir.IRBuilder, op: str, args: list):
    """Apply ``op`` to float (or float vector) values ``args`` of one type."""
    ty = args[0].type
    if isinstance(element_type(ty), ir.FloatType):
        fast = FAST_F32.get(op)
        if fast is not None:
            return fast(mb, b, args[0])
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


# ----------------------------------------------------------------------------------------------
# building blocks


def _fma(mb, b, a, x, c):
    """a * x + c, fused where the target has FMA (``llvm.fmuladd``)."""
    ty = a.type
    return b.call(mb.intrinsic("fmuladd", ty, [ty, ty, ty]), [a, x, c])


def _poly(mb, b, x, coeffs):
    """Horner: coeffs[0] * x^(k-1) + ... + coeffs[-1]."""
    acc = const(x.type, coeffs[0])
    for c in coeffs[1:]:
        acc = _fma(mb, b, acc, x, const(x.type, c))
    return acc


def _int_type(x):
    return vec_type(I32, lanes_of(x))


def _bits(b, x):
    return b.bitcast(x, _int_type(x))


def _float(b, i):
    return b.bitcast(i, vec_type(F32, lanes_of(i)))


def _min_keep_nan(b, x, hi):
    """min(x, hi) that returns x when x is NaN (x86 ``minps`` operand order)."""
    return b.select(b.fcmp_ordered(">", x, hi), hi, x)


def _max_keep_nan(b, x, lo):
    return b.select(b.fcmp_ordered("<", x, lo), lo, x)


def _fabs(mb, b, x):
    return b.call(mb.intrinsic("fabs", x.type, [x.type]), [x])


def _copysign(mb, b, mag, sign):
    return b.call(mb.intrinsic("copysign", mag.type, [mag.type, mag.type]), [mag, sign])


# ----------------------------------------------------------------------------------------------
# exp

_LOG2E = 1.44269502162933349609375
_LN2_HI = 0.693145751953125           # 15 significant bits: n * _LN2_HI is exact for |n| < 2^9
_LN2_LO = 1.428606765330187045e-06    # ln 2 - _LN2_HI
_ROUND_MAGIC = 12582912.0             # 1.5 * 2^23: adding it rounds to an integer in the low bits
# e^r = 1 + r + r^2 P(r) on |r| <= ln(2)/2, relative error 3e-9 (before float32 rounding)
_EXP_P = [1.381459878757596e-3, 8.368716575205326e-3, 4.166838899254799e-2,
          1.666652113199234e-1, 4.999999403953552e-1]
_EXP_HI = 88.72283172607422           # largest float32 x with a finite exp(x) (0x42b17217)
_EXP_LO = -104.0                      # exp(x) rounds to 0 below this


def _exp_reduce(mb, b, xc):
    """x = n ln 2 + r, |r| <= ln(2) / 2. Returns (t, n as float, e^r): the low mantissa bits of
    ``t`` hold n as an integer."""
    ty = xc.type
    t = _fma(mb, b, xc, const(ty, _LOG2E), const(ty, _ROUND_MAGIC))
    n = b.fsub(t, const(ty, _ROUND_MAGIC))
    r = _fma(mb, b, n, const(ty, -_LN2_HI), xc)
    r = _fma(mb, b, n, const(ty, -_LN2_LO), r)
    p = _poly(mb, b, r, _EXP_P)
    p = _fma(mb, b, p, r, const(ty, 1.0))
    p = _fma(mb, b, p, r, const(ty, 1.0))
    return t, n, p


def fast_exp_f32(mb: ModuleBuilder, b: ir.IRBuilder, x):
    """expf for float32 scalars or vectors (1 ulp): exp(x) = 2^n e^r, n = round(x / ln 2).

    Overflow gives inf, underflow 0 (through correctly rounded subnormals), NaN stays NaN."""
    ty = x.type
    # below _EXP_LO the result is 0: those lanes are computed from 0 instead and replaced by
    # 0 at the end, so that they make no subnormal intermediate (x86 cores take a microcode
    # assist per subnormal result without flush-to-zero: a causal mask's -3.4e38 entries ran
    # softmax 2.5x slower on an Intel AVX-512 core)
    zero = b.fcmp_ordered("<", x, const(ty, _EXP_LO))
    x = b.select(zero, const(ty, 0.0), x)
    if getattr(mb, "math_avx512", False) and lanes_of(x) == 16:
        # clamped so that n fits and the reduction stays exact; vscalefps then overflows to inf
        # and underflows through subnormals to 0 exactly as the true result would
        xc = _max_keep_nan(b, _min_keep_nan(b, x, const(ty, 89.0)), const(ty, _EXP_LO))
        _, n, p = _exp_reduce(mb, b, xc)
        fn = mb.declare("llvm.x86.avx512.mask.scalef.ps.512", ty,
                        [ty, ty, ty, ir.IntType(16), I32])
        y = b.call(fn, [p, n, ir.Constant(ty, ir.Undefined), ir.IntType(16)(-1), I32(4)])
        return b.select(zero, const(ty, 0.0), y)
    xc = _max_keep_nan(b, _min_keep_nan(b, x, const(ty, _EXP_HI)), const(ty, _EXP_LO))
    t, _, p = _exp_reduce(mb, b, xc)
    ity = _int_type(x)
    # n << 23 straight from t's bits: the magic constant's own bits shift out of the word
    yi = b.add(_bits(b, p), b.shl(_bits(b, t), const(ity, 23)))
    normal = _float(b, yi)
    # n <= -124 would leave the exponent field: scale by 2^(n+25), then by 2^-25 (one rounding,
    # so subnormal results are correctly rounded)
    tiny = _float(b, b.add(yi, const(ity, 25 << 23)))
    tiny = b.fmul(tiny, const(ty, 2.0 ** -25))
    out = b.select(b.fcmp_ordered("<", xc, const(ty, -86.0)), tiny, normal)
    # x > _EXP_HI overflows; a NaN x gives NaN (x + inf) instead of the bits computed from it
    out = b.select(b.fcmp_unordered(">", x, const(ty, _EXP_HI)),
                   b.fadd(x, const(ty, float("inf"))), out)
    return b.select(zero, const(ty, 0.0), out)


def _exp_in_range_f32(mb: ModuleBuilder, b: ir.IRBuilder, y):
    """exp(y) for y in [-86, 88] (1 ulp), without the range handling of ``fast_exp_f32``.

    For a caller whose argument is bounded and whose NaN lanes a final select discards:
    ``erf``'s tail, exp of ``t Q(t)`` in [-18.1, -0.85]. Without the clamps and the zero,
    overflow and subnormal selects it is about 10 vector instructions instead of 18; a GELU
    fused into a dense layer's write-back is mostly erf, and its cost halved (``docs/zoo.md``)."""
    ty = y.type
    t, n, p = _exp_reduce(mb, b, y)
    if getattr(mb, "math_avx512", False) and lanes_of(y) == 16:
        fn = mb.declare("llvm.x86.avx512.mask.scalef.ps.512", ty,
                        [ty, ty, ty, ir.IntType(16), I32])
        return b.call(fn, [p, n, ir.Constant(ty, ir.Undefined), ir.IntType(16)(-1), I32(4)])
    # 2^n on the exponent bits: n >= -125 keeps the result normal
    ity = _int_type(y)
    return _float(b, b.add(_bits(b, p), b.shl(_bits(b, t), const(ity, 23))))


# ----------------------------------------------------------------------------------------------
# log

_SQRT_HALF_BITS = 0x3F3504F3          # bits of sqrt(1/2)
# log1p(f) = f + f^2 Q(f) on sqrt(1/2) - 1 <= f < sqrt(2) - 1, relative error 4e-9
_LOG_Q = [-7.621777057647705e-2, 1.290443241596222e-1, -1.324298828840256e-1,
          1.418182551860809e-1, -1.660908311605453e-1, 2.000197321176529e-1,
          -2.500158250331879e-1, 3.333332538604736e-1, -4.999998807907105e-1]


def fast_log_f32(mb: ModuleBuilder, b: ir.IRBuilder, x):
    """logf for float32 scalars or vectors (1 ulp).

    x = m 2^e with m in [sqrt(1/2), sqrt(2)) straight from the bits (subnormals are scaled by
    2^23 first); log x = e ln 2 + log1p(m - 1). log(0) = -inf, log(x < 0) = NaN,
    log(inf) = inf, NaN stays NaN."""
    ty = x.type
    ity = _int_type(x)
    sub = b.fcmp_ordered("<", x, const(ty, 2.0 ** -126))
    xs = b.select(sub, b.fmul(x, const(ty, 2.0 ** 23)), x)
    # subtracting sqrt(1/2)'s bits makes the exponent field e (arithmetic shift) and the
    # mantissa the offset of m from sqrt(1/2)
    ix = b.sub(_bits(b, xs), const(ity, _SQRT_HALF_BITS))
    e = b.ashr(ix, const(ity, 23))
    m = _float(b, b.add(b.and_(ix, const(ity, 0x7FFFFF)), const(ity, _SQRT_HALF_BITS)))
    f = b.fsub(m, const(ty, 1.0))
    ef = b.sitofp(e, ty)
    ef = b.select(sub, b.fsub(ef, const(ty, 23.0)), ef)
    q = _poly(mb, b, f, _LOG_Q)
    y = _fma(mb, b, b.fmul(f, f), q, f)
    y = _fma(mb, b, ef, const(ty, _LN2_LO), y)
    y = _fma(mb, b, ef, const(ty, _LN2_HI), y)
    # special inputs: 0 (either sign) -> -inf; < 0 or NaN -> NaN; +inf -> +inf
    y = b.select(b.fcmp_ordered("==", x, const(ty, float("inf"))), x, y)
    y = b.select(b.fcmp_unordered("<", x, const(ty, 0.0)), const(ty, float("nan")), y)
    return b.select(b.fcmp_ordered("==", x, const(ty, 0.0)), const(ty, float("-inf")), y)


# ----------------------------------------------------------------------------------------------
# tanh

_TANH_P = [-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
           -3.33332819422e-1]


def fast_tanh_f32(mb: ModuleBuilder, b: ir.IRBuilder, x):
    """tanhf (about 2 ulp): an odd polynomial (Cephes) for |x| < 0.625, else
    1 - 2 / (exp(2|x|) + 1) with the sign of x."""
    ty = x.type
    ax = _fabs(mb, b, x)
    e = fast_exp_f32(mb, b, b.fadd(ax, ax))
    big = b.fsub(const(ty, 1.0), b.fdiv(const(ty, 2.0), b.fadd(e, const(ty, 1.0))))
    big = _copysign(mb, b, big, x)
    s = b.fmul(x, x)
    p = _poly(mb, b, s, _TANH_P)
    small = _fma(mb, b, b.fmul(p, s), x, x)
    small = _copysign(mb, b, small, x)  # tanh(-0) = -0 (the fma gives +0)
    return b.select(b.fcmp_ordered("<", ax, const(ty, 0.625)), small, big)


# ----------------------------------------------------------------------------------------------
# erf

_ERF_SPLIT = 0.921875
# erf(x) = x + x P(x^2) on |x| <= 0.921875, relative error 1.6e-8
_ERF_P = [-5.990853533148766e-4, 4.993180278688669e-3, -2.6766616851091385e-2,
          1.128181591629982e-1, -3.7612494826316833e-1, 1.2837915122509003e-1]
# log(erfc(t)) = t Q(t) on 0.921875 <= t <= 4, relative error of erf 7e-10
_ERF_Q = [-1.130361488321796e-5, 3.2352731795981526e-4, -3.6453993525356054e-3,
          2.376827783882618e-2, -1.0624408721923828e-1, -6.35146975517273e-1,
          -1.1286495923995972]


def fast_erf_f32(mb: ModuleBuilder, b: ir.IRBuilder, x):
    """erff for float32 scalars or vectors (2 ulp).

    |x| < 0.921875: x + x P(x^2); else sign(x) (1 - exp(t Q(t))) with t = min(|x|, 4) (erf
    rounds to 1 beyond 3.92). Both sides are computed and one selected, so vector lanes need
    no branches. erf(+-inf) = +-1, erf(-0) = -0, NaN stays NaN."""
    ty = x.type
    s = b.fmul(x, x)
    p = _poly(mb, b, s, _ERF_P)
    small = _fma(mb, b, p, x, x)
    ax = _fabs(mb, b, x)
    t = _min_keep_nan(b, ax, const(ty, 4.0))
    q = _poly(mb, b, t, _ERF_Q)
    big = b.fsub(const(ty, 1.0), _exp_in_range_f32(mb, b, b.fmul(q, t)))
    big = _copysign(mb, b, big, x)
    return b.select(b.fcmp_unordered("<", ax, const(ty, _ERF_SPLIT)), small, big)


FAST_F32 = {"exp": fast_exp_f32, "log": fast_log_f32, "tanh": fast_tanh_f32,
            "erf": fast_erf_f32}


# ----------------------------------------------------------------------------------------------
# nibble_f32: the float32 of the low 4 bits of an int32 (the int4 kernels' unpacking)


def emit_nibble_f32(mb: ModuleBuilder, b: ir.IRBuilder, w, s):
    """``float((w >> s) & 15)`` for an int32 scalar or vector ``w`` and shift ``s`` (of
    ``w``'s type).

    On AVX-512 a 16-lane vector is one ``vpermps`` from the table ``0.0 .. 15.0``: the
    instruction reads only the low 4 bits of each index lane, so neither the mask nor the
    convert is needed (the int4 kernel's step: a shift and this per 16 codes). Elsewhere a mask
    and a convert."""
    w = b.ashr(w, s)
    if getattr(mb, "math_avx512", False) and is_vector(w) and lanes_of(w) == 16:
        fty = ir.VectorType(F32, 16)
        fn = mb.declare("llvm.x86.avx512.permvar.sf.512", fty, [fty, w.type])
        table = ir.Constant(fty, [ir.Constant(F32, float(i)) for i in range(16)])
        return b.call(fn, [table, w])
    masked = b.and_(w, const(w.type, 15))
    fty = ir.VectorType(F32, lanes_of(w)) if is_vector(w) else F32
    return b.sitofp(masked, fty)
