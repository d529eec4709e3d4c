"""benchmarks.layer_profile.kernel_work: the multiply-adds a kernel is charged in the share
check of benchmarks.hf_models_cpu, a Winograd convolution's as the direct convolution's."""
import numpy as np

from benchmarks.layer_profile import kernel_work
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op

RNG = np.random.default_rng(3)


def _conv(c, hw, o, layout):
    """One 3x3 stride-1 convolution with padding 1 and a relu, batch 2."""
    w = RNG.standard_normal((o, c, 3, 3)).astype("float32")
    shape = (2, hw, hw, c) if layout == "NHWC" else (2, c, hw, hw)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w), padding=1, data_layout=layout))
            gv = bb.emit_output(bb.emit(op.nn.relu(y)))
        bb.emit_func_output(gv)
    return bb.get()


def test_winograd_kernel_is_charged_the_direct_convolutions_multiply_adds():
    # the NHWC layer runs as Winograd (its products reduce over 24 channels), the NCHW one on
    # the direct kernel (24 channels x 9 taps): both are charged 2 x 10 x 10 x 32 x 24 x 9
    macs = 2 * 10 * 10 * 32 * 24 * 9
    for layout in ("NHWC", "NCHW"):
        work = kernel_work(_conv(24, 10, 32, layout))
        convs = {k: v for k, v in work.items() if "conv2d" in k}
        assert list(convs.values()) == [macs], (layout, work)


def _depthwise(c, hw):
    """One 3x3 depthwise NHWC convolution with padding 1 and a relu, batch 2."""
    w = RNG.standard_normal((3, 3, 1, c)).astype("float32")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((2, hw, hw, c), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w), padding=1, groups=c, data_layout="NHWC",
                                     kernel_layout="HWIO"))
            gv = bb.emit_output(bb.emit(op.nn.relu(y)))
        bb.emit_func_output(gv)
    return bb.get()


def test_bytes_charge_a_depthwise_kernel_its_memory_side():
    # 9 multiply-adds per output; with byte_macs its input, packed weight (32 channels: one
    # panel of 3 x 3 x 32) and output, 4 bytes each, are charged byte_macs per byte
    c, hw = 32, 10
    macs = 2 * hw * hw * c * 9
    moved = 4 * (2 * hw * hw * c * 2 + 9 * c)
    work = {k: v for k, v in kernel_work(_depthwise(c, hw)).items() if "conv2d" in k}
    assert list(work.values()) == [macs]
    roof = {k: v for k, v in kernel_work(_depthwise(c, hw), 2.0).items() if "conv2d" in k}
    assert list(roof.values()) == [2 * moved]
    # a 24 -> 32 3x3 layer does 216 multiply-adds per output: its bytes charge it no more
    dense = {k: v for k, v in kernel_work(_conv(24, 10, 32, "NCHW"), 2.0).items()
             if "conv2d" in k}
    assert list(dense.values()) == [2 * 10 * 10 * 32 * 24 * 9]


def test_share_offenders_rate_is_of_the_multiply_adds():
    from types import SimpleNamespace
    from benchmarks.layer_profile import share_offenders
    report = SimpleNamespace(rows=[{"name": "dw", "total_ms": 5.0, "calls": 1},
                                   {"name": "gemm", "total_ms": 5.0, "calls": 1},
                                   {"name": "(vm)", "total_ms": 9.0, "calls": 1}])
    macs = {"dw": 1_000_000, "gemm": 99_000_000}
    # by multiply-adds the depthwise kernel takes 50% of the time for 1% of the work
    (o,) = share_offenders(report, macs)
    assert o["name"] == "dw" and abs(o["work_share"] - 0.01) < 1e-12
    # charged 40M for its bytes, 29% of the work: 50% is within twice that
    assert share_offenders(report, {"dw": 40_000_000, "gemm": 99_000_000}, macs=macs) == []
    (o,) = share_offenders(report, {"dw": 20_000_000, "gemm": 99_000_000}, macs=macs)
    assert abs(o["gmacs"] - 1_000_000 / 5.0 / 1e6) < 1e-12


def test_fused_expansion_is_charged_both_layers(monkeypatch):
    """A depthwise kernel with its 1x1 expansion fused in (relax.transform.FuseExpandDepthwise)
    is charged the expansion's multiply-adds beside its own."""
    from tilecraft.relax.backend.cpu import expand_depthwise
    monkeypatch.setattr(expand_depthwise, "FUSE_MIN_IMAGE_BYTES", 0)
    k, c, hw = 8, 32, 10
    w1 = RNG.standard_normal((c, k, 1, 1)).astype("float32")
    w2 = RNG.standard_normal((c, 1, 3, 3)).astype("float32")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((2, hw, hw, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w1), data_layout="NHWC"))
            y = bb.emit(op.nn.relu6(bb.emit(op.add(y, const(np.ones((1, 1, 1, c), "float32"))))))
            y = bb.emit(op.nn.conv2d(y, const(w2), strides=2, padding=(0, 0, 1, 1), groups=c,
                                     data_layout="NHWC"))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    work = {k_: v for k_, v in kernel_work(bb.get()).items() if "expand" in k_}
    assert list(work.values()) == [2 * hw * hw * c * k + 2 * 5 * 5 * c * 9]
