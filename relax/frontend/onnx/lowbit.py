"""ONNX element types without a tilecraft dtype, carried in a storage dtype.

* bfloat16 travels as its bit pattern in uint16; the float8 types (E4M3FN, E4M3FNUZ, E5M2,
  E5M2FNUZ, E8M0) and FLOAT4E2M1 as their bit patterns in uint8 (FLOAT4E2M1 in the low 4
  bits);
* INT4 / INT2 as their values in int8, UINT4 / UINT2 as their values in uint8.

So a model with a bfloat16 input takes ``x.view(np.uint16)`` of an ``ml_dtypes.bfloat16``
array, and a float8 output comes back as uint8 bits (``out.view(ml_dtypes.float8_e4m3fn)``).

Inside the graph the importer keeps the logical type beside the value (``Value.logical``).
``Cast`` / ``CastLike`` / ``QuantizeLinear`` / ``DequantizeLinear`` convert exactly to and from
these types (round to nearest even; saturation as the ``saturate`` attribute says, with the
conventions of ONNX's reference implementation); other operators on them compute in float32:
the inputs are decoded, the operator runs, float results are rounded back to the input's type.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import Cast, FloatImm, IntImm, Select, call as tir_call

from ... import op as _op
from ...expr import Expr, const


@dataclass(frozen=True)
class FloatFormat:
    """A small float format: ``nbits`` in all (sign, ``ebits`` exponent, ``mbits`` mantissa),
    exponent ``bias``; ``kind``: ``"ieee"`` (the top exponent is inf / NaN), ``"fn"`` (no
    infinity; all-ones magnitude is NaN), ``"fnuz"`` (no infinity, no negative zero; the code
    with only the sign bit set is NaN) or ``"finite"`` (no infinity, no NaN)."""
    name: str
    ml_name: str
    storage: str
    nbits: int
    ebits: int
    mbits: int
    bias: int
    kind: str
    max_mag: int      # largest finite magnitude code
    nan_mag: int      # magnitude code written for NaN ("fnuz": the whole code 0x80)


@dataclass(frozen=True)
class IntFormat:
    name: str
    ml_name: str
    storage: str
    lo: int
    hi: int


T = onnx.TensorProto
FLOAT_FORMATS = {
    T.BFLOAT16: FloatFormat("bfloat16", "bfloat16", "uint16", 16, 8, 7, 127, "ieee", 0x7F7F,
                            0x7FC0),
    T.FLOAT8E4M3FN: FloatFormat("float8e4m3fn", "float8_e4m3fn", "uint8", 8, 4, 3, 7, "fn",
                                0x7E, 0x7F),
    T.FLOAT8E4M3FNUZ: FloatFormat("float8e4m3fnuz", "float8_e4m3fnuz", "uint8", 8, 4, 3, 8,
                                  "fnuz", 0x7F, 0x80),
    T.FLOAT8E5M2: FloatFormat("float8e5m2", "float8_e5m2", "uint8", 8, 5, 2, 15, "ieee", 0x7B,
                              0x7E),
    T.FLOAT8E5M2FNUZ: FloatFormat("float8e5m2fnuz", "float8_e5m2fnuz", "uint8", 8, 5, 2, 16,
                                  "fnuz", 0x7F, 0x80),
    T.FLOAT4E2M1: FloatFormat("float4e2m1", "float4_e2m1fn", "uint8", 4, 2, 1, 1, "finite",
                              0x7, 0),
    # an unsigned power of two (a scale format): 2 ** (code - 127), 0xFF is NaN
    T.FLOAT8E8M0: FloatFormat("float8e8m0", "float8_e8m0fnu", "uint8", 8, 8, 0, 127, "e8m0",
                              0xFE, 0xFF),
}
# the native float types, as bit patterns (for BitCast)
NATIVE_FLOATS = {
    "float16": FloatFormat("float16", "float16", "uint16", 16, 5, 10, 15, "ieee", 0x7BFF,
                           0x7E00),
    "float32": FloatFormat("float32", "float32", "uint32", 32, 8, 23, 127, "ieee",
                           0x7F7FFFFF, 0x7FC00000),
    "float64": FloatFormat("float64", "float64", "uint64", 64, 11, 52, 1023, "ieee",
                           0x7FEFFFFFFFFFFFFF, 0x7FF8000000000000),
}
INT_FORMATS = {
    T.INT4: IntFormat("int4", "int4", "int8", -8, 7),
    T.UINT4: IntFormat("uint4", "uint4", "uint8", 0, 15),
    T.INT2: IntFormat("int2", "int2", "int8", -2, 1),
    T.UINT2: IntFormat("uint2", "uint2", "uint8", 0, 3),
}
BY_NAME = {f.name: f for f in list(FLOAT_FORMATS.values()) + list(INT_FORMATS.values())}
ONNX_OF = {f.name: k for k, f in list(FLOAT_FORMATS.items()) + list(INT_FORMATS.items())}


def format_of(elem_type: int):
    return FLOAT_FORMATS.get(elem_type) or INT_FORMATS.get(elem_type)


def is_float_format(name: str | None) -> bool:
    return name is not None and isinstance(BY_NAME.get(name), FloatFormat)


def to_storage(arr: np.ndarray, fmt) -> np.ndarray:
    """An ``ml_dtypes`` array (as ``onnx.numpy_helper`` gives it) in its storage dtype."""
    if isinstance(fmt, IntFormat):
        return np.asarray(arr).astype(fmt.storage)
    out = np.asarray(arr).view(fmt.storage)
    if fmt.nbits < 8:
        out = out & np.uint8((1 << fmt.nbits) - 1)
    return np.require(out, requirements="C")


# ---------------------------------------------------------------------------------------------
# decoding: storage -> float32


def _decode_table(fmt: FloatFormat) -> np.ndarray:
    import ml_dtypes
    codes = np.arange(1 << fmt.nbits, dtype=np.uint8)
    return codes.view(getattr(ml_dtypes, fmt.ml_name)).astype(np.float32)


def decode(ctx, x: Expr, fmt: FloatFormat, dtype: str = "float32") -> Expr:
    """The float values of bit patterns ``x`` (a storage-dtype tensor)."""
    if fmt.nbits <= 8:
        table = const(_decode_table(fmt).astype(dtype))
        idx = ctx.emit(_op.astype(x, "int32"))
        return ctx.emit(_op.take(table, idx, 0), "decoded")
    shape = ctx.shape(x)
    e_all = (1 << fmt.ebits) - 1
    u64 = "uint64"

    def kernel(bits):
        def f(*i):
            src = bits[i]
            c = Cast(u64, Cast("int64", src)) if src.dtype.startswith("int") else Cast(u64, src)
            if fmt.nbits < 64:   # a sign-extended signed code: keep its own bits
                c = c % IntImm(1 << fmt.nbits, u64)
            top = IntImm(1 << (fmt.nbits - 1), u64)
            sign = c // top
            mag = c % top
            e = Cast("int64", mag // IntImm(1 << fmt.mbits, u64))
            m = Cast("int64", mag % IntImm(1 << fmt.mbits, u64))
            mf = Cast("float64", m)
            normal = (mf + FloatImm(float(1 << fmt.mbits), "float64")) * tir_call(
                "exp2", Cast("float64", e - (fmt.bias + fmt.mbits)))
            sub = mf * tir_call("exp2", FloatImm(float(1 - fmt.bias - fmt.mbits), "float64"))
            v = Select(e == IntImm(0, "int64"), sub, normal)
            inf = FloatImm(float("inf"), "float64")
            nan = FloatImm(float("nan"), "float64")
            v = Select(e == IntImm(e_all, "int64"),
                       Select(m == IntImm(0, "int64"), inf, nan), v)
            v = Select(sign == IntImm(1, u64), -v, v)
            return Cast(dtype, v)
        return te.compute(shape, f, "T_decode_" + fmt.name)
    from .ops.common import mark_opaque
    from ...op.manipulate import _call_te
    call = _call_te(ctx.bb, kernel, x, name="decode_" + fmt.name)
    mark_opaque(ctx, call)
    return ctx.emit(call, "decoded")


# ---------------------------------------------------------------------------------------------
# encoding: float -> storage (round to nearest even)


def _encode_fn(fmt: FloatFormat, saturate: bool):
    f64 = "float64"
    c = lambda v: FloatImm(float(v), f64)  # noqa: E731
    emin = 1 - fmt.bias
    emax_code = (1 << fmt.ebits) - 1     # exponent field values go up to this
    # the sign bit as an int64 (for 64-bit codes: the two's complement of 2 ** 63)
    sign_bit = 1 << (fmt.nbits - 1) if fmt.nbits < 64 else -(1 << 63)

    def f(v):
        x = Cast(f64, v)
        isnan = x != x
        neg = Select(x == c(0), (c(1) / x) < c(0), x < c(0))
        a = te.abs(x)
        isinf = a == c(float("inf"))
        # the exponent: floor(log2(a)), corrected once each way, never below emin
        safe = Select((a > c(0)) & (a < c(float("inf"))), a, c(1))
        lg = te.floor(tir_call("log2", safe))
        lg = te.max(te.min(lg, c(emin + emax_code + 2)), c(emin))
        scaled = safe * tir_call("exp2", -lg)
        lg = Select(scaled >= c(2), lg + c(1), Select((scaled < c(1)) & (lg > c(emin)),
                                                       lg - c(1), lg))
        # the mantissa with its leading bit, scaled in two steps (2 ** -lg, then 2 ** mbits)
        # so that no factor overflows even for float64's exponents
        q = (safe * tir_call("exp2", -lg)) * c(1 << fmt.mbits)
        r = Cast("int64", te.round(q))   # half to even
        mag = Cast("int64", lg - c(emin)) * IntImm(1 << fmt.mbits, "int64") + r
        mag = Select(a == c(0), IntImm(0, "int64"), mag)
        overflow = isinf | (mag > IntImm(fmt.max_mag, "int64"))
        if fmt.kind == "ieee":
            over = fmt.max_mag if saturate else (emax_code << fmt.mbits)
        elif fmt.kind == "fn":
            over = fmt.max_mag if saturate else fmt.nan_mag
        elif fmt.kind == "finite":
            over = fmt.max_mag
        else:   # fnuz: overflow without saturation is NaN
            over = fmt.max_mag if saturate else -1
        mag_i = Select(overflow, IntImm(over, "int64"), mag)
        sign_i = Select(neg, IntImm(sign_bit, "int64"), IntImm(0, "int64"))
        code = sign_i + mag_i
        if fmt.kind == "fnuz":
            code = Select(mag_i == IntImm(0, "int64"), IntImm(0, "int64"), code)   # no -0
            code = Select(mag_i < IntImm(0, "int64"), IntImm(fmt.nan_mag, "int64"), code)
            code = Select(isnan, IntImm(fmt.nan_mag, "int64"), code)
        elif fmt.kind == "finite":
            # no NaN encoding: ml_dtypes writes NaN as a zero of the opposite sign
            code = Select(isnan, Select(neg, IntImm(0, "int64"), IntImm(sign_bit, "int64")),
                          code)
        else:
            code = Select(isnan, sign_i + IntImm(fmt.nan_mag, "int64"), code)
        return Cast(fmt.storage, code)
    return f


def _encode_e8m0(saturate: bool, round_mode: str):
    """ONNX's ``to_float8e8m0``: the float32 exponent field, rounded by the mantissa
    (``up``, ``down`` or ``nearest``); NaN and infinity give 0xFF."""
    from tilecraft.tensorir.expr import FloorDiv, FloorMod
    f32 = _encode_fn(NATIVE_FLOATS["float32"], False)
    i64 = "int64"

    def f(v):
        bits = Cast(i64, f32(Cast("float32", v)))
        exp = FloorMod(FloorDiv(bits, IntImm(1 << 23, i64)), IntImm(256, i64))
        frac = FloorMod(bits, IntImm(1 << 23, i64))
        special = exp == IntImm(0xFF, i64)
        if round_mode == "up":
            up = frac > IntImm(0, i64)
        elif round_mode == "down":
            up = frac < IntImm(0, i64)   # never
        else:
            g = FloorMod(FloorDiv(frac, IntImm(1 << 22, i64)), IntImm(2, i64)) == IntImm(1, i64)
            r = FloorMod(FloorDiv(frac, IntImm(1 << 21, i64)), IntImm(2, i64)) == IntImm(1, i64)
            st = FloorMod(frac, IntImm(1 << 21, i64)) > IntImm(0, i64)
            up = g & (r | st | (exp > IntImm(0, i64)))
        if saturate:
            up = up & (exp != IntImm(0xFE, i64))
        e = exp + Select(up, IntImm(1, i64), IntImm(0, i64))
        e = Select(special, IntImm(0xFF, i64), FloorMod(e, IntImm(256, i64)))
        return Cast("uint8", e)
    return f


def encode(ctx, x: Expr, fmt: FloatFormat, saturate: bool = False,
           round_mode: str = "up") -> Expr:
    """Bit patterns of ``fmt`` for the float tensor ``x``, rounded to nearest even.
    ``saturate``: out-of-range values (and infinities) become the largest finite value, as
    ONNX's reference ``saturate_cast``; else infinity (``"ieee"`` formats) or NaN."""
    from .ops.common import emit_map
    fn = _encode_e8m0(saturate, round_mode) if fmt.kind == "e8m0" else \
        _encode_fn(fmt, saturate)
    return emit_map(ctx, fn, x, dtype=fmt.storage, name="encode_" + fmt.name, opaque=True)


def encode_int(ctx, x: Expr, fmt: IntFormat) -> Expr:
    """``x`` converted to a 4- or 2-bit integer as ``ml_dtypes`` does (the value truncated
    towards zero; out of range, NaN or infinite gives 0), in its storage dtype."""
    from tilecraft.tensorir import dtype as dt
    from .ops.common import emit_map
    src = ctx.dtype(x)

    def f(v):
        if dt.is_float(src):
            w = Cast("float64", v)
            t = tir_call("trunc", w)
            ok = (t >= FloatImm(fmt.lo, "float64")) & (t <= FloatImm(fmt.hi, "float64"))
            return Cast(fmt.storage, Select(ok, t, FloatImm(0.0, "float64")))
        w = Cast("int64", v)
        ok = (w >= IntImm(fmt.lo, "int64")) & (w <= IntImm(fmt.hi, "int64"))
        return Cast(fmt.storage, Select(ok, w, IntImm(0, "int64")))
    return emit_map(ctx, f, x, dtype=fmt.storage, name="encode_" + fmt.name)


# ---------------------------------------------------------------------------------------------
# writing onnxruntime's 4-bit MatMul (com.microsoft.MatMulNBits)


def matmul_nbits_model(model: onnx.ModelProto, block_size: int = 128,
                       symmetric: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` whose float32 ``MatMul`` nodes with a 2-D initializer weight (``K``
    a multiple of 2) are onnxruntime ``com.microsoft.MatMulNBits`` nodes (4 bits, blocks of
    ``block_size`` along ``K``): the format its ``MatMulNBitsQuantizer`` writes, made here
    with numpy alone. Symmetric blocks have ``scale = max|w| / 7`` and the default zero
    point 8; otherwise ``[min, max]`` (widened to 0) in 15 steps with packed uint8 zero points.

    Examples
    --------
    >>> q = matmul_nbits_model(model, block_size=32)          # doctest: +SKIP
    """
    from onnx import helper, numpy_helper
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    nodes, drop = [], set()
    for node in g.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 \
            else None
        arr = numpy_helper.to_array(w) if w is not None else None
        if arr is None or arr.dtype != np.float32 or arr.ndim != 2 or arr.shape[0] % 2:
            nodes.append(node)
            continue
        k, n = arr.shape
        blocks = -(-k // block_size)
        wt = np.zeros((n, blocks * block_size), np.float32)
        wt[:, :k] = arr.T
        g3 = wt.reshape(n, blocks, block_size)
        if symmetric:
            scale = np.abs(g3).max(axis=2) / 7.0
            scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
            zp = np.full((n, blocks), 8.0, np.float32)
        else:
            lo, hi = np.minimum(g3.min(axis=2), 0), np.maximum(g3.max(axis=2), 0)
            scale = np.where(hi > lo, (hi - lo) / 15.0, 1.0).astype(np.float32)
            zp = np.clip(np.rint(-lo / scale), 0, 15).astype(np.float32)
        q = np.clip(np.rint(g3 / scale[..., None]) + zp[..., None], 0, 15).astype(np.uint8)
        blob = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
        base = node.input[1]
        new_inits = [numpy_helper.from_array(blob, base + "_Q4"),
                     numpy_helper.from_array(scale.reshape(-1), base + "_scales")]
        inputs = [node.input[0], base + "_Q4", base + "_scales"]
        if not symmetric:
            zq = zp.astype(np.uint8)
            if zq.shape[1] % 2:
                zq = np.concatenate([zq, np.zeros((n, 1), np.uint8)], axis=1)
            new_inits.append(numpy_helper.from_array(
                (zq[:, 0::2] | (zq[:, 1::2] << 4)).reshape(-1).astype(np.uint8),
                base + "_zero_points"))
            inputs.append(base + "_zero_points")
        g.initializer.extend(new_inits)
        drop.add(base)
        nodes.append(helper.make_node("MatMulNBits", inputs, list(node.output),
                                      name=(node.name or base) + "_Q4", domain="com.microsoft",
                                      K=k, N=n, bits=4, block_size=block_size))
    del g.node[:]
    g.node.extend(nodes)
    still = {i for nd in g.node for i in nd.input}
    keep = [t for t in g.initializer if t.name not in drop or t.name in still]
    del g.initializer[:]
    g.initializer.extend(keep)
    if not any(o.domain == "com.microsoft" for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return m
