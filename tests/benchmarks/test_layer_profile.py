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
