"""int8 / int4 quantization: the packed dot product (dot4_u8i8) and the int8 / int4 kernels
against numpy integer references (bit-exact accumulators, extreme values, odd shapes); the
passes and relax.quantize on small models against the float32 result; calibration and its
errors."""
from __future__ import annotations

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.expr import Call
from tilecraft.relax.calibrate import (CalibrationError, EntropyObserver, MinMaxObserver,
                                       PercentileObserver, collect_ranges)
from tilecraft.relax.quantize import MODES
from tilecraft.relax.transform import (QuantizeInt4Weight, QuantizeInt8Dynamic,
                                       QuantizeInt8Static)
from tilecraft.relax.transform.quantize_int4 import dequantize_int4, quantize_weight_int4
from tilecraft.relax.transform.quantize_int8 import (_quantized_bound, activation_qparams,
                                                   quantize_weight_int8)
from tilecraft.relax.backend.cpu.dense_int8 import dot4_u8i8
from tilecraft.tensorir import interpret, te
from tilecraft.targets.llvm.dot4 import dot_isa

CPU = targets.cpu(0)
# the host (AMX tiles or AVX-512 VNNI where present), the host without AMX (VNNI where
# present; tests/relax/backend/cpu/test_dense_amx.py has the AMX kernel's own tests), and AVX2
# without VNNI: the portable widening sequence
HOST = "llvm"
HOST_NO_AMX = "llvm -mattr=-amx-int8"
PORTABLE = "llvm -mcpu=haswell"


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return flag in next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        return False


def dot4_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ua = a.view(np.uint8).reshape(a.shape + (4,)).astype(np.int64)
    sb = b.view(np.int8).reshape(b.shape + (4,)).astype(np.int64)
    return (ua * sb).sum(-1)


def words(rng, n: int) -> np.ndarray:
    w = rng.integers(-2 ** 31, 2 ** 31, n, dtype=np.int64).astype(np.int32)
    # the extremes: 255 / -128 in every byte, zeros, mixed
    extremes = np.array([0xFFFFFFFF, 0x80808080, 0, 0x7F80FF01], np.uint32).view(np.int32)
    w[:min(n, 4)] = extremes[:n]
    return w


# ---------------------------------------------------------------------------------------------
# the packed dot product


def test_dot_isa_per_target():
    assert dot_isa("x86_64", "+avx512f,+avx512vnni", 512) == "avx512vnni"
    assert dot_isa("x86_64", "+avx512vnni", 256) is None
    assert dot_isa("aarch64", "+neon,+dotprod", 128) == "dotprod"
    assert dot_isa("aarch64", "+neon", 128) is None


def _check_two_outputs(sch, func, target, a, b, want_c, want_d, dtype):
    """Build ``sch`` for ``target`` and run it and ``tensorir.interpret`` of ``func`` on the
    inputs ``a``, ``b``: both outputs exactly ``want_c`` / ``want_d``."""
    n = len(a)
    mod = targets.build(sch.mod[sch._func_name], target)
    for run in (mod["main"], lambda *args: interpret(func, *args)):
        c, d = np.zeros(n, dtype), np.zeros(n, dtype)
        run(a, b, c, d)
        np.testing.assert_array_equal(c, want_c)
        np.testing.assert_array_equal(d, want_d)


@pytest.mark.parametrize("target", [HOST, PORTABLE])
@pytest.mark.parametrize("n,lanes", [(1, 0), (7, 0), (64, 16), (48, 12), (40, 20)])
def test_dot4_is_exact(rng, target, n, lanes):
    """Scalar, and vectors of 16 lanes and of lanes that are not a power-of-two count of the
    instruction's width (12, 20: three and five ``vpdpbusd`` of 4 lanes), as a tuned schedule
    may vectorize."""
    A = te.placeholder((n,), "int32", "A")
    B = te.placeholder((n,), "int32", "B")
    C = te.compute((n,), lambda i: dot4_u8i8(A[i], B[i]) + A[i] * 0, "C")
    D = te.compute((n,), lambda i: dot4_u8i8(A[i], B[i]), "D")
    func = te.create_prim_func([A, B, C, D])
    from tilecraft.tensorir.schedule import Schedule
    sch = Schedule(func)
    if lanes:
        i, = sch.get_loops(sch.get_block("C"))
        sch.vectorize(sch.split(i, [None, lanes])[1])
    a, b = words(rng, n), words(np.random.default_rng(n + 1), n)
    want = dot4_reference(a, b)
    _check_two_outputs(sch, func, target, a, b, want, want, np.int32)


@pytest.mark.skipif(not _cpu_has("avx512_vnni"), reason="this CPU has no AVX-512 VNNI")
def test_int8_dense_uses_vpdpbusd():
    exe = relax.build(_int8_matmul_module(64, 32)[0], HOST_NO_AMX, strict=True)
    assert "dense_u8i8" in exe.kernel_names
    assert "vpdpbusd" in exe.kernel_module.get_source("asm")


# ---------------------------------------------------------------------------------------------
# the int8 dense kernel: uint8 x int8 -> int32, bit-exact


def _int8_matmul_module(k: int, n: int, w=None, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (k, n)).astype("int8") if w is None else w
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("m", k), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.matmul(x, const(w), out_dtype="int32")))
        bb.emit_func_output(gv)
    return bb.get(), w


@pytest.mark.parametrize("target", [HOST, HOST_NO_AMX, PORTABLE])
@pytest.mark.parametrize("k,n", [(1, 1), (5, 17), (70, 40), (256, 65)])
def test_int8_dense_kernel_is_bit_exact(rng, target, k, n):
    mod, w = _int8_matmul_module(k, n)
    w[0, :] = -128                       # extremes: the largest products
    w[-1, :] = 127
    mod, w = _int8_matmul_module(k, n, w)
    exe = relax.build(mod, target, strict=True)
    assert "dense_u8i8" in exe.kernel_names
    vm = relax.VirtualMachine(exe, CPU)
    for m in (1, 3, 8):
        x = rng.integers(0, 256, (m, k)).astype("uint8")
        x[0] = 255
        got = vm["main"](x).numpy()
        np.testing.assert_array_equal(got, x.astype(np.int64) @ w.astype(np.int64))


# ---------------------------------------------------------------------------------------------
# the int4 kernel: codes dequantized in registers


def _q4_module(k, n, group, scale_dtype="float32", symmetric=True, seed=0, batch=None):
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.5, (k, n)).astype("float32")
    codes, scale, offset = quantize_weight_int4(w, group, symmetric, scale_dtype)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch or "m", k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.dense_q4(x, const(codes), const(scale), const(offset), group))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get(), w, dequantize_int4(codes, scale, offset, k, group)


@pytest.mark.parametrize("k,n,group,scale_dtype,symmetric,batch", [
    (64, 16, 32, "float32", True, None), (67, 33, 32, "float32", False, None),
    (256, 40, 128, "float16", True, None), (130, 7, 128, "float16", False, None),
    # N of whole 64-column panels and more (AVX-512: the codes as pack_q4_words' words):
    # a ragged last panel, odd K, K not a multiple of the group, a static row count
    (256, 130, 128, "float32", True, None), (67, 64, 32, "float16", False, None),
    (200, 192, 128, "float32", False, None), (256, 96, 128, "float16", True, 5),
    (130, 128, 32, "float32", True, 1)])
def test_int4_dense_kernel_matches_the_dequantized_weight(rng, k, n, group, scale_dtype,
                                                         symmetric, batch):
    mod, w, wd = _q4_module(k, n, group, scale_dtype, symmetric, batch=batch)
    exe = relax.build(mod, HOST, strict=True)
    assert "dense_q4" in exe.kernel_names[-1]
    vm = relax.VirtualMachine(exe, CPU)
    for m in ((batch,) if batch else (1, 3, 5)):
        x = rng.normal(size=(m, k)).astype("float32")
        got = vm["main"](x).numpy()
        want = x.astype(np.float64) @ wd.astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        # and int4's own error against the float weight: a step is 1/7 (1/15) of a group's range
        rel = np.abs(want - x @ w).max() / np.abs(x @ w).max()
        assert rel < 0.25


@pytest.mark.skipif(not _cpu_has("avx512f"), reason="this CPU has no AVX-512")
def test_int4_gemv_unpacks_codes_with_vpermps():
    """On AVX-512 a panel row of codes is one load of words; each vector of 16 codes is a shift
    and a ``vpermps`` from the table 0..15 (no widening of bytes, no mask, no convert)."""
    exe = relax.build(_q4_module(256, 128, 128)[0], HOST, strict=True)
    asm = exe.kernel_module.get_source("asm")
    assert "vpermps" in asm or "vpermd" in asm
    assert "vpmovzxbd" not in asm and "vcvtdq2ps" not in asm


@pytest.mark.parametrize("target", [HOST, PORTABLE])
@pytest.mark.parametrize("n,lanes", [(7, 0), (64, 16), (40, 8)])
def test_nibble_f32_lowering(rng, target, n, lanes):
    """``nibble_f32(w, s)`` = ``float((w >> s) & 15)``: scalar, 16 lanes (``vpermps`` on
    AVX-512) and 8 lanes (mask and convert), every shift of a word's nibbles and negative
    words, against numpy and the interpreter."""
    from tilecraft.tensorir.expr import NIBBLE_F32, call
    from tilecraft.tensorir.schedule import Schedule
    W = te.placeholder((n,), "int32", "W")
    S = te.placeholder((n,), "int32", "S")
    Y = te.compute((n,), lambda i: call(NIBBLE_F32, W[i], S[i], dtype="float32"), "Y")
    Z = te.compute((n,), lambda i: call(NIBBLE_F32, W[i], te.const(28, "int32"),
                                        dtype="float32"), "Z")
    func = te.create_prim_func([W, S, Y, Z])
    sch = Schedule(func)
    if lanes:
        for name in ("Y", "Z"):
            i, = sch.get_loops(sch.get_block(name))
            sch.vectorize(sch.split(i, [None, lanes])[1])
    w = words(rng, n)
    s = (np.arange(n) % 8 * 4).astype(np.int32)
    want_y = ((w >> s) & 15).astype(np.float32)
    want_z = ((w >> 28) & 15).astype(np.float32)
    _check_two_outputs(sch, func, target, w, s, want_y, want_z, np.float32)


@pytest.mark.parametrize("n", [128, 100])
def test_pack_q4_words_layout(rng, n):
    """Byte ``c`` of word ``i`` of a panel row is the code byte of the panel's column
    ``c * NR/4 + i``; zero beyond ``N``."""
    from tilecraft.relax.backend.cpu.dense_int4 import pack_q4_words
    codes = rng.integers(0, 256, (6, n)).astype(np.uint8)
    codes[0] = 255
    Q = te.placeholder((6, n), "uint8", "Q")
    P = pack_q4_words(Q, 64)
    got = np.zeros([d.value for d in P.shape], np.int32)
    interpret(te.create_prim_func([Q, P]), codes, got)
    padded = np.zeros((6, 128), np.uint8)
    padded[:, :n] = codes
    want = padded.reshape(6, 2, 4, 16).transpose(1, 0, 3, 2).copy().view(np.int32)[..., 0]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        pack_q4_words(Q, 30)


def test_int4_weight_quantization_round_trip():
    w = np.random.default_rng(3).normal(size=(100, 9)).astype("float32")
    for sym in (True, False):
        codes, s, o = quantize_weight_int4(w, 32, sym)
        assert codes.shape == (50, 9) and s.shape == o.shape == (4, 9)
        err = np.abs(dequantize_int4(codes, s, o, 100, 32) - w)
        step = np.repeat(s, 32, axis=0)[:100]
        assert np.all(err <= step * 0.5 + 1e-6)


def test_dense_q4_operator_errors():
    x = Var("x", TensorStructInfo((1, 64), "float32"))
    q = Var("q", TensorStructInfo((32, 8), "uint8"))
    s = Var("s", TensorStructInfo((2, 8), "float32"))
    with pytest.raises(relax.RelaxError, match="group_size must be even"):
        BlockBuilder().normalize(op.dense_q4(x, q, s, s, 31))
    bad = Var("bad", TensorStructInfo((31, 8), "uint8"))
    with pytest.raises(relax.RelaxError, match="expected 32"):
        BlockBuilder().normalize(op.dense_q4(x, bad, s, s, 32))
    with pytest.raises(relax.RelaxError, match="scale must be"):
        BlockBuilder().normalize(op.dense_q4(x, q, s, s, 16))


# ---------------------------------------------------------------------------------------------
# the passes and relax.quantize on small models


def mlp(k=64, h=96, n=40, seed=0):
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.2, (k, h)).astype("float32")
    w2 = rng.normal(0, 0.2, (n, h)).astype("float32")
    b2 = rng.normal(0, 0.1, (n,)).astype("float32")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("m", k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            hid = bb.emit(op.nn.relu(bb.emit(op.matmul(x, const(w1)))))
            gv = bb.emit_output(bb.emit(op.linear(hid, const(w2), const(b2))))
        bb.emit_func_output(gv)

    def reference(xv):
        return np.maximum(xv @ w1, 0) @ w2.T + b2
    return bb.get(), reference


def convnet(seed=0):
    """conv 3x3 pad 1 -> relu -> conv 3x3 stride 2 groups 2 -> relu -> flatten -> dense."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.3, (8, 3, 3, 3)).astype("float32")
    w2 = rng.normal(0, 0.2, (8, 4, 3, 3)).astype("float32")
    w3 = rng.normal(0, 0.1, (8 * 4 * 4, 10)).astype("float32")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((2, 3, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(x, const(w1), padding=(1, 1, 1, 1)))))
            h = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(h, const(w2), strides=(2, 2),
                                                        padding=(1, 1, 1, 1), groups=2))))
            h = bb.emit(op.reshape(h, (2, 128)))
            gv = bb.emit_output(bb.emit(op.matmul(h, const(w3))))
        bb.emit_func_output(gv)
    return bb.get()


def run(mod, *inputs, target=HOST):
    out = relax.VirtualMachine(relax.build(mod, target, strict=True), CPU)["main"](*inputs)
    return out.numpy()


def rel_err(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_int8_dynamic_on_an_mlp(rng):
    mod, ref = mlp()
    qmod = QuantizeInt8Dynamic()(mod)
    assert qmod is not mod and "main" in mod          # the input module is unchanged
    for m in (1, 6):
        x = rng.normal(size=(m, 64)).astype("float32")
        # per-row 8-bit activations and per-channel 8-bit weights: within 2% of the range
        assert rel_err(run(qmod, x), ref(x)) < 0.02


def test_int8_static_on_a_convnet(rng):
    mod = convnet()
    cal = [(rng.normal(size=(2, 3, 8, 8)).astype("float32"),) for _ in range(6)]
    ranges = collect_ranges(mod, cal)
    assert len(ranges) == 3 and all(lo <= 0 <= hi for lo, hi in ranges)
    qmod = QuantizeInt8Static(ranges)(mod)
    x = rng.normal(size=(2, 3, 8, 8)).astype("float32")
    # inputs like the calibration set's: within 4% of the output range
    assert rel_err(run(qmod, x), run(mod, x)) < 0.04


@pytest.mark.parametrize("mode", ["int8-dynamic", "int8", "int4-g32", "int4-g128"])
def test_relax_quantize_modes(rng, mode):
    mod, ref = mlp(k=128)
    cal = [(rng.normal(size=(4, 128)).astype("float32"),) for _ in range(4)]
    qmod = relax.quantize(mod, mode, calibration=cal if mode == "int8" else None)
    x = rng.normal(size=(3, 128)).astype("float32")
    tol = {"int8-dynamic": 0.02, "int8": 0.04, "int4-g32": 0.2, "int4-g128": 0.25}[mode]
    assert rel_err(run(qmod, x), ref(x)) < tol


def test_int4_float16_scales():
    mod, ref = mlp(k=128)
    qmod = QuantizeInt4Weight(32, scale_dtype="float16")(mod)
    x = np.random.default_rng(1).normal(size=(2, 128)).astype("float32")
    assert rel_err(run(qmod, x), ref(x)) < 0.2


@pytest.mark.slow   # pocl compiles a dozen kernels: minutes on a loaded 2-core machine
def test_quantized_module_builds_for_opencl(rng):
    pytest.importorskip("pyopencl", reason="pyopencl is not installed")
    from tilecraft.targets.opencl_backend import list_devices
    if not list_devices():
        pytest.skip("no OpenCL device")
    mod, ref = mlp(k=64)
    x = rng.normal(size=(2, 64)).astype("float32")
    for mode in ("int8-dynamic", "int4-g32"):
        qmod = relax.quantize(mod, mode)
        out = relax.VirtualMachine(relax.build(qmod, "opencl"), targets.opencl(0))["main"](x)
        # the same integer arithmetic as on the CPU: matches the CPU build closely
        np.testing.assert_allclose(out.numpy(), run(qmod, x), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# modes, calibration and their errors


def test_modes_and_unknown_mode():
    assert list(MODES) == ["fp16", "int8-dynamic", "int8", "int4-g32", "int4-g128"]
    mod, _ = mlp()
    for bad in ("int3", "float16"):     # fp16 (ToMixedPrecision) is tested with its pass
        with pytest.raises(ValueError, match="available: fp16, int8-dynamic, int8, int4-g32"):
            relax.quantize(mod, bad)
    with pytest.raises(ValueError, match="needs calibration"):
        relax.quantize(mod, "int8")
    with pytest.raises(TypeError, match="IRModule"):
        relax.quantize(mod["main"], "int8-dynamic")


def test_calibration_errors(rng):
    mod, _ = mlp()
    with pytest.raises(CalibrationError, match=r"has shape \(2, 63\); main takes \('m', 64\)"):
        relax.quantize(mod, "int8", calibration=[(np.zeros((2, 63), "float32"),)])
    with pytest.raises(CalibrationError, match="2 inputs for the 1 parameters"):
        relax.quantize(mod, "int8", calibration=[(np.zeros((2, 64), "float32"),) * 2])
    with pytest.raises(CalibrationError, match="is float64; main takes float32"):
        relax.quantize(mod, "int8", calibration=[(np.zeros((2, 64)),)])
    with pytest.raises(CalibrationError, match="empty"):
        relax.quantize(mod, "int8", calibration=[])
    with pytest.raises(ValueError, match="unknown observer"):
        relax.quantize(mod, "int8", calibration=[(np.zeros((1, 64), "float32"),)],
                       observer="median")
    with pytest.raises(ValueError, match="1 calibrated ranges for 2"):
        QuantizeInt8Static([(0.0, 1.0)])(mod)


def test_observers(rng):
    x = rng.normal(size=100000).astype("float32")
    x[0] = 40.0                                       # one outlier
    mm, pc, en = MinMaxObserver(), PercentileObserver(99.9), EntropyObserver()
    for o in (mm, pc, en):
        o.update(x[:50000])
        o.update(x[50000:])
    assert mm.range()[1] == 40.0
    assert 2.5 < pc.range()[1] < 4.0 and -4.0 < pc.range()[0] < -2.5
    lo, hi = en.range()
    assert 1.5 < hi < 20.0 and lo < 0           # the outlier is clipped
    with pytest.raises(CalibrationError):
        MinMaxObserver().range()


# ---------------------------------------------------------------------------------------------
# a clamp before a quantized layer, moved past the quantization's rounding


def test_quantized_bound_moves_a_clamp_past_the_rounding(rng):
    """``clamp(round(clamp(v, lo, hi) * inv) + zp, 0, 255)`` equals ``clamp(round(v * inv) +
    zp, L, H)`` in float32, for random and extreme ``v`` (the bounds themselves, their
    neighbours, ties of the rounding, infinities) and bounds inside and outside the range."""
    for lo, hi, (a, b) in [(0.0, 6.0, (-1.0, 5.0)), (0.0, 6.0, (0.0, 6.0)),
                           (0.0, None, (-3.0, 2.0)), (-1.0, 1.0, (-8.0, 8.0)),
                           (0.5, 0.5, (0.0, 1.0)), (-50.0, 50.0, (-1.0, 1.0)),
                           (2.0, 3.0, (-1.0, 1.0))]:
        scale, zp = activation_qparams(a, b)
        inv = np.float32(1.0 / scale)
        v = rng.uniform(2 * min(a, -1), 2 * max(b, 1), 4000).astype(np.float32)
        ends = [x for x in (lo, hi) if x is not None]
        ties = (np.arange(-300, 300) + np.float32(0.5)) * np.float32(scale)
        v = np.concatenate([v, ties.astype(np.float32), np.float32(ends),
                            np.nextafter(np.float32(ends), np.float32(np.inf)),
                            np.nextafter(np.float32(ends), np.float32(-np.inf)),
                            np.float32([np.inf, -np.inf, 0.0, -0.0])])
        lo_, hi_ = (np.float32(-np.inf) if lo is None else np.float32(lo),
                    np.float32(np.inf) if hi is None else np.float32(hi))
        want = np.clip(np.rint(np.minimum(np.maximum(v, lo_), hi_) * inv) + np.float32(zp),
                       0, 255)
        got = np.minimum(np.maximum(np.rint(v * inv) + np.float32(zp),
                                    np.float32(_quantized_bound(lo, inv, zp, 0))),
                         np.float32(_quantized_bound(hi, inv, zp, 255)))
        np.testing.assert_array_equal(got, want, err_msg=f"{lo}, {hi}, ({a}, {b})")


@pytest.mark.parametrize("clamp", ["clip", "maximum_minimum", "relu"])
def test_static_int8_quantizes_a_clamped_input_exactly(rng, clamp):
    """relu6 / relu before a quantized convolution (``clip``, ``minimum(maximum(x, 0), 6)``,
    ``relu``): the quantization reads the unclamped value with the clamp moved into its
    saturation, and the result is the unfolded arithmetic's in numpy."""
    wf = rng.normal(0, 0.3, (8, 8, 1, 1)).astype(np.float32)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 8, 6, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if clamp == "clip":
                h = bb.emit(op.clip(x, 0.0, 6.0))
            elif clamp == "relu":
                h = bb.emit(op.nn.relu(x))
            else:
                h = bb.emit(op.minimum(bb.emit(op.maximum(x, const(np.float32(0)))),
                                       const(np.float32(6))))
            gv = bb.emit_output(bb.emit(op.nn.conv2d(h, const(wf))))
        bb.emit_func_output(gv)
    lo, hi = -1.0, 5.0
    qmod = QuantizeInt8Static([(lo, hi)])(bb.get())
    muls = [b.value for blk in qmod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, Call) and b.value.op.name == "relax.multiply"]
    assert muls[0].args[0] is qmod["main"].params[0], "the quantization reads the clamp"
    xv = rng.normal(size=(1, 8, 6, 10)).astype(np.float32) * 4
    xv[0, 0, 0, :6] = [0.0, 6.0, 5.0, -1.0, np.nextafter(np.float32(6), np.float32(7)), 1e6]
    got = run(qmod, xv)
    s, zp = activation_qparams(lo, hi)
    xc = np.maximum(xv, np.float32(0))
    xc = xc if clamp == "relu" else np.minimum(xc, np.float32(6))
    xq = np.clip(np.rint(xc * np.float32(1.0 / s)) + np.float32(zp), 0, 255).astype(np.int64)
    wq, ws = quantize_weight_int8(wf, axis=0)
    acc = np.einsum("nchw,oc->nohw", xq, wq[:, :, 0, 0].astype(np.int64))
    acc -= zp * wq.astype(np.int64).sum(axis=(1, 2, 3)).reshape(1, -1, 1, 1)
    mult = (np.float32(s) * ws).astype(np.float32).reshape(1, -1, 1, 1)
    np.testing.assert_allclose(got, acc.astype(np.float32) * mult, rtol=1e-6, atol=1e-6)


def _int8_dynamic_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """QuantizeInt8Dynamic's arithmetic in numpy, float32 as the kernels compute it: per-row
    uint8 activations, per-channel int8 weights, exact int32 accumulators."""
    f32 = np.float32
    wq, ws = quantize_weight_int8(w, axis=1)
    lo = np.minimum(x.min(-1, keepdims=True), f32(0))
    hi = np.maximum(x.max(-1, keepdims=True), f32(0))
    rng_ = hi - lo
    scale = np.where(rng_ > 0, rng_ / f32(255), f32(1)).astype(f32)
    zp = np.round(-lo / scale)
    q = np.clip(np.round(x * (f32(1) / scale)) + zp, 0, 255)
    acc = q.astype(np.int64) @ wq.astype(np.int64)
    acc = acc - zp.astype(np.int64) * wq.astype(np.int64).sum(0)
    return acc.astype(f32) * (scale * ws.astype(f32))


@pytest.mark.parametrize("target", [HOST, HOST_NO_AMX])
def test_layers_reading_one_input_share_its_quantization_and_words(rng, target):
    """BERT's q, k and v: three dense layers on one input quantize it once and pack it into
    words once (one fused quantize-and-pack kernel); each result is the numpy emulation of the
    layer's own int8 arithmetic (symbolic rows, an odd K)."""
    k = 70
    ws = [rng.normal(0, 0.2, (k, n)).astype("float32") for n in (48, 48, 33)]
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("m", k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            ys = [bb.emit(op.matmul(x, const(w))) for w in ws]
            gv = bb.emit_output(bb.emit(op.concat(ys, axis=-1)))
        bb.emit_func_output(gv)
    exe = relax.build(QuantizeInt8Dynamic()(bb.get()), target, strict=True)
    called = [ins[1] for ins in exe.program["functions"]["main"]["code"]
              if ins[0] == "call_kernel"]
    assert sum("u8_words" in str(c) for c in called) == 1, called
    vm = relax.VirtualMachine(exe, CPU)
    for m in (1, 19, 40):
        xv = rng.normal(size=(m, k)).astype("float32")
        xv[0, :3] = [0.0, -4.0, 3.0]
        want = np.concatenate([_int8_dynamic_reference(xv, w) for w in ws], axis=-1)
        np.testing.assert_allclose(vm["main"](xv).numpy(), want, rtol=1e-6, atol=1e-6)
