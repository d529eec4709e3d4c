"""The int8 NCHW convolution family (``backend.cpu.conv2d_int8``): uint8 x int8 -> int32
bit-exact against a numpy int64 reference on random data with extreme values and odd shapes
(channels not a multiple of 4, strides, padding, dilation, groups, odd output channels,
batches), on the host (AVX-512 VNNI where present) and the portable widening path; its
packings against numpy; a statically quantized convolution with its fused dequantizing
epilogue against the same arithmetic in numpy."""
from __future__ import annotations

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.backend.cpu import conv2d_int8
from tilecraft.relax.backend.cpu.geometry import ConvGeometry
from tilecraft.relax.transform import QuantizeInt8Static
from tilecraft.relax.transform.quantize_int8 import activation_qparams, quantize_weight_int8
from tilecraft.tensorir import interpret, te

CPU = targets.cpu(0)
HOST = "llvm"
PORTABLE = "llvm -mcpu=haswell"      # AVX2 without VNNI: 8 lanes, 16 registers, widening


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return flag in next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        return False


def conv_reference(x, w, stride, pad, dil, groups):
    """int64 NCHW convolution (zero padding): the oracle."""
    x = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    w = w.astype(np.int64)
    n, _, h, wd = x.shape
    o, ipg, kh, kw = w.shape
    oh = (h - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    opg = o // groups
    for oc in range(o):
        c0 = oc // opg * ipg
        for i in range(kh):
            for j in range(kw):
                patch = x[:, c0:c0 + ipg, i * dil[0]:i * dil[0] + stride[0] * (oh - 1) + 1:stride[0],
                          j * dil[1]:j * dil[1] + stride[1] * (ow - 1) + 1:stride[1]]
                out[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, i, j])
    return out


def int8_conv_module(w, shape, stride=(1, 1), pad=(0, 0, 0, 0), dil=(1, 1), groups=1):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(shape, "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w), strides=stride, padding=pad, dilation=dil,
                                     groups=groups, out_dtype="int32"))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get()


CASES = [
    # (C, H, W, O, K, stride, padding, dilation, groups, batch)
    (8, 10, 10, 16, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, 1),      # 3x3, padded
    (3, 17, 17, 8, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1, 1),       # a stem: 3 channels, stride 2
    (5, 9, 11, 7, 3, (2, 1), (1, 0, 1, 2), (1, 1), 1, 2),        # odd everything, 2 images
    (16, 8, 8, 32, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, 1),       # 1x1: NCHW written in place
    (12, 9, 9, 24, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1, 1),       # 1x1 stride 2: one phase
    (8, 12, 12, 8, 3, (1, 1), (2, 2, 2, 2), (2, 2), 2, 1),       # dilated, 2 groups of 4
    # a stem whose phase-plane rows (36 words) are vectorized, with a ragged tail
    (3, 41, 70, 8, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1, 2),
    # 1x1 to 16 channels on 32-wide rows: the whole-row tile, not 16 x 1 vectors
    (32, 5, 32, 16, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, 1),
]


@pytest.mark.parametrize("target", [HOST, PORTABLE])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])))
def test_int8_conv_kernel_is_bit_exact(target, case):
    c, h, wd, o, k, stride, pad, dil, groups, batch = case
    rng = np.random.default_rng(sum(case[:5]))
    w = rng.integers(-128, 128, (o, c // groups, k, k)).astype(np.int8)
    w[0] = -128                                          # the largest products
    w[-1, :, 0] = 127
    mod = int8_conv_module(w, (batch, c, h, wd), stride, pad, dil, groups)
    exe = relax.build(mod, target, strict=True)
    assert "conv2d_nchw_u8i8" in exe.kernel_names and "conv2d_u8_words" in exe.kernel_names
    x = rng.integers(0, 256, (batch, c, h, wd)).astype(np.uint8)
    x[0, :, 0] = 255
    x[-1, :, -1] = 0
    got = relax.VirtualMachine(exe, CPU)["main"](x).numpy()
    np.testing.assert_array_equal(got, conv_reference(x, w, stride, pad, dil, groups))


def test_int8_conv_symbolic_batch():
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (8, 6, 3, 3)).astype(np.int8)
    exe = relax.build(int8_conv_module(w, ("n", 6, 7, 7), pad=(1, 1, 1, 1)), HOST, strict=True)
    vm = relax.VirtualMachine(exe, CPU)
    for n in (1, 3):
        x = rng.integers(0, 256, (n, 6, 7, 7)).astype(np.uint8)
        np.testing.assert_array_equal(vm["main"](x).numpy(),
                                      conv_reference(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1))


@pytest.mark.skipif(not _cpu_has("avx512_vnni"), reason="this CPU has no AVX-512 VNNI")
def test_int8_conv_uses_vpdpbusd():
    w = np.ones((16, 8, 3, 3), np.int8)
    exe = relax.build(int8_conv_module(w, (1, 8, 10, 10)), HOST)
    assert "vpdpbusd" in exe.kernel_module.get_source("asm")


def test_grouped_without_whole_words_stays_generic():
    # 2 input channels per group: a word would mix two groups' channels
    g = ConvGeometry(8, 8, 8, 8, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 4)
    assert conv2d_int8.plan_conv2d_u8i8(g, 16, 32) is None
    rng = np.random.default_rng(2)
    w = rng.integers(-128, 128, (8, 2, 3, 3)).astype(np.int8)
    exe = relax.build(int8_conv_module(w, (1, 8, 8, 8), groups=4), HOST, strict=True)
    assert "conv2d_nchw_u8i8" not in exe.kernel_names
    x = rng.integers(0, 256, (1, 8, 8, 8)).astype(np.uint8)
    np.testing.assert_array_equal(relax.VirtualMachine(exe, CPU)["main"](x).numpy(),
                                  conv_reference(x, w, (1, 1), (0, 0, 0, 0), (1, 1), 4))


def test_packings_match_numpy():
    rng = np.random.default_rng(3)
    g = ConvGeometry(6, 7, 9, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    plan = conv2d_int8.plan_conv2d_u8i8(g, 16, 32)
    # the data words: phase plane (a, b) of the zero-padded image, 4 channels a word
    x = te.placeholder((1, 6, 7, 9), "uint8", "x")
    words = conv2d_int8.pack_conv2d_u8_words(x, plan)
    xv = rng.integers(0, 256, (1, 6, 7, 9)).astype(np.uint8)
    out = np.zeros([d.value for d in words.shape], np.int32)
    interpret(te.create_prim_func([x, words]), xv, out)
    padded = np.zeros((1, 8, 9 + 2, 9 + 2 + 1), np.uint8)      # channels to 8, one more column
    padded[:, :6, 1:8, 1:10] = xv
    wq = plan.row_width
    for a in range(2):
        for b in range(2):
            plane = padded[:, :, a::2, b::2][:, :, :, :wq]
            rows = plane.shape[2]
            flat = np.zeros((1, 8, plan.plane_len), np.uint8)
            flat[:, :, :rows * wq] = plane.reshape(1, 8, -1)[:, :, :plan.plane_len]
            want = flat.reshape(1, 2, 4, -1).transpose(0, 1, 3, 2).copy().view(np.int32)[..., 0]
            np.testing.assert_array_equal(out[:, :, a, b], want)
    # the weight words [O/R, ceil(I/4), KH, KW, R]
    w = te.placeholder((8, 6, 3, 3), "int8", "w")
    packed = conv2d_int8.pack_conv2d_int8_weight(w, "OIHW", plan.oc_block)
    wv = rng.integers(-128, 128, (8, 6, 3, 3)).astype(np.int8)
    pout = np.zeros([d.value for d in packed.shape], np.int32)
    interpret(te.create_prim_func([w, packed]), wv, pout)
    r = plan.oc_block
    w8 = np.zeros((8, 8, 3, 3), np.int8)
    w8[:, :6] = wv
    want = w8.reshape(8 // r, r, 2, 4, 3, 3).transpose(0, 2, 4, 5, 1, 3).copy()
    np.testing.assert_array_equal(pout, want.view(np.int32)[..., 0])


def test_static_int8_conv_epilogue_matches_numpy():
    """conv (3x3, pad 1) + bias + relu, statically quantized: the int8 kernel with the
    dequantization, bias and relu fused into its copy to NCHW, against the same arithmetic in
    numpy (float32 throughout, as the graph computes it)."""
    rng = np.random.default_rng(4)
    wf = rng.normal(0, 0.3, (16, 8, 3, 3)).astype(np.float32)
    bias = rng.normal(0, 0.1, (1, 16, 1, 1)).astype(np.float32)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 8, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(wf), padding=(1, 1, 1, 1)))
            gv = bb.emit_output(bb.emit(op.nn.relu(bb.emit(op.add(y, const(bias))))))
        bb.emit_func_output(gv)
    lo, hi = -2.5, 3.0
    qmod = QuantizeInt8Static([(lo, hi)])(bb.get())
    exe = relax.build(qmod, HOST, strict=True)
    assert any("conv2d_nchw_u8i8" in n for n in exe.kernel_names)
    xv = rng.normal(size=(1, 8, 10, 10)).astype(np.float32) * 1.5
    got = relax.VirtualMachine(exe, CPU)["main"](xv).numpy()
    s, zp = activation_qparams(lo, hi)
    xq = np.clip(np.rint(xv * np.float32(1.0 / s)) + np.float32(zp), 0, 255).astype(np.uint8)
    wq, ws = quantize_weight_int8(wf, axis=0)
    xp = np.pad(xq, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=zp)
    acc = conv_reference(xp, wq, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    acc -= zp * wq.astype(np.int64).sum(axis=(1, 2, 3)).reshape(1, -1, 1, 1)
    mult = (np.float32(s) * ws).astype(np.float32).reshape(1, -1, 1, 1)
    want = np.maximum(acc.astype(np.float32) * mult + bias, 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("lanes,registers", [(16, 32), (8, 16)])
def test_no_tile_is_part_of_a_row(lanes, registers):
    """A 1x1 layer writing NCHW in place takes a tile of whole rows, or (none in the register
    budget) goes through the copy to NCHW: the write-back of a tile that is part of a row
    would be inferred as the whole row (an accumulator buffer in memory and the epilogue
    masked over the row for each tile); MobileNet-V2's 32 -> 16 at 112 x 112 alone would take
    16 x 1 vectors of 16 positions."""
    for c, hw, o in [(32, 112, 16), (16, 112, 96), (24, 56, 144), (32, 32, 16), (8, 224, 8)]:
        g = ConvGeometry(c, hw, hw, o, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
        p = conv2d_int8.plan_conv2d_u8i8(g, lanes, registers)
        tile = p.vectors * p.lanes
        assert not p.direct_out or tile % hw == 0, (g, p)
        if lanes == 16:
            assert p.direct_out, (g, p)
        assert o % p.oc_block == 0 and p.oc_block * p.vectors <= (24 if registers >= 32 else 12)


def test_static_int8_stem_matches_numpy():
    """A stem (3 float channels, 3x3 stride 2, pad 1, relu) statically quantized: the
    quantization and the zero-point padding fused into the vectorized phase-plane words
    stage, against the same arithmetic in numpy."""
    rng = np.random.default_rng(5)
    wf = rng.normal(0, 0.3, (16, 3, 3, 3)).astype(np.float32)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 3, 66, 90), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(wf), strides=(2, 2), padding=(1, 1, 1, 1)))
            gv = bb.emit_output(bb.emit(op.nn.relu(y)))
        bb.emit_func_output(gv)
    lo, hi = -2.0, 2.5
    exe = relax.build(QuantizeInt8Static([(lo, hi)])(bb.get()), HOST, strict=True)
    assert any("conv2d_nchw_u8i8" in n for n in exe.kernel_names)
    xv = rng.normal(size=(1, 3, 66, 90)).astype(np.float32) * 1.5
    xv[0, 0, 0, :8] = [-1e3, 1e3, lo, hi, 0, -0.0, 7.0, -7.0]     # clamped both ways
    got = relax.VirtualMachine(exe, CPU)["main"](xv).numpy()
    s, zp = activation_qparams(lo, hi)
    xq = np.clip(np.rint(xv * np.float32(1.0 / s)) + np.float32(zp), 0, 255).astype(np.uint8)
    wq, ws = quantize_weight_int8(wf, axis=0)
    xp = np.pad(xq, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=zp)
    acc = conv_reference(xp, wq, (2, 2), (0, 0, 0, 0), (1, 1), 1)
    acc -= zp * wq.astype(np.int64).sum(axis=(1, 2, 3)).reshape(1, -1, 1, 1)
    mult = (np.float32(s) * ws).astype(np.float32).reshape(1, -1, 1, 1)
    want = np.maximum(acc.astype(np.float32) * mult, 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
