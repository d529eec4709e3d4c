"""int8 depthwise NCHW convolutions (``backend.cpu.depthwise_int8``): relax.build turns a
depthwise ``conv2d`` of uint8 data and a constant int8 weight with int32 results into the flat
NCHW kernel on bytes, bit-exact against a numpy integer reference (random bytes with the
extremes, strides 1 and 2, padding, odd sizes, a symbolic batch); a static-quantized
depthwise-separable block runs int8 kernels for every convolution."""
import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.calibrate import collect_ranges
from tilecraft.relax.transform import QuantizeInt8Static

CPU = targets.cpu(0)


def depthwise_ref(x, w, stride, pad):
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    xp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad), np.int64)
    xp[:, :, pad:pad + h, pad:pad + wd] = x
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, c, oh, ow), np.int64)
    for ry in range(kh):
        for rx in range(kw):
            patch = xp[:, :, ry:ry + stride * oh:stride, rx:rx + stride * ow:stride]
            out += patch * w[None, :, 0, ry, rx, None, None].astype(np.int64)
    return out


def module(c, h, w, weight, stride, pad):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", c, h, w), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = op.nn.conv2d(x, const(weight), strides=(stride, stride),
                             padding=(pad, pad, pad, pad), groups=c, out_dtype="int32")
            gv = bb.emit_output(bb.emit(y))
        bb.emit_func_output(gv)
    return bb.get()


@pytest.mark.parametrize("target", ["llvm", "llvm -mcpu=haswell"])
@pytest.mark.parametrize("c,h,w,k,stride,pad", [(16, 12, 12, 3, 1, 1), (24, 15, 13, 3, 2, 1),
                                                (8, 9, 7, 5, 1, 2), (5, 8, 8, 3, 2, 0)])
def test_depthwise_int8_bit_exact(target, c, h, w, k, stride, pad):
    rng = np.random.default_rng(c + h)
    weight = rng.integers(-128, 128, (c, 1, k, k)).astype(np.int8)
    weight[0] = -128
    weight[-1] = 127
    exe = relax.build(module(c, h, w, weight, stride, pad), target, strict=True)
    assert "depthwise_conv2d_nchw_u8i8" in exe.kernel_names, exe.kernel_names
    vm = relax.VirtualMachine(exe, CPU)
    for n in (1, 2):
        x = rng.integers(0, 256, (n, c, h, w)).astype(np.uint8)
        x[0, 0] = 255
        x[-1, -1, 0] = 0
        got = vm["main"](x).numpy()
        np.testing.assert_array_equal(got, depthwise_ref(x, weight, stride, pad))


def test_static_int8_depthwise_separable_block():
    """conv 1x1 -> relu6 -> depthwise 3x3 -> relu6 -> conv 1x1 (MobileNet-V2's block)
    quantized statically: every convolution is an int8 kernel, within 10% of float32."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (32, 8, 1, 1)).astype("float32")
    wd = rng.normal(0, 0.3, (32, 1, 3, 3)).astype("float32")
    w2 = rng.normal(0, 0.2, (8, 32, 1, 1)).astype("float32")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 8, 14, 14), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.clip(bb.emit(op.nn.conv2d(x, const(w1))), 0.0, 6.0))
            h = bb.emit(op.clip(bb.emit(op.nn.conv2d(h, const(wd), padding=(1, 1, 1, 1),
                                                     groups=32)), 0.0, 6.0))
            gv = bb.emit_output(bb.emit(op.nn.conv2d(h, const(w2))))
        bb.emit_func_output(gv)
    mod = bb.get()
    cal = [(rng.normal(size=(1, 8, 14, 14)).astype("float32"),) for _ in range(6)]
    qmod = QuantizeInt8Static(collect_ranges(mod, cal))(mod)
    exe = relax.build(qmod, "llvm", strict=True)
    names = " ".join(exe.kernel_names)
    assert names.count("conv2d_nchw_u8i8") == 3 and "depthwise_conv2d_nchw_u8i8" in names
    xv = rng.normal(size=(1, 8, 14, 14)).astype("float32")
    got = relax.VirtualMachine(exe, CPU)["main"](xv).numpy()
    want = relax.VirtualMachine(relax.build(mod, "llvm", strict=True), CPU)["main"](xv).numpy()
    # three layers of 8-bit activations (per-tensor ranges from 6 samples): within 10%
    assert np.abs(got - want).max() / np.abs(want).max() < 0.1
