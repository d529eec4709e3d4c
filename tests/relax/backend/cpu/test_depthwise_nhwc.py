"""The NHWC depthwise kernel over padded rows (relax.backend.cpu.depthwise_nhwc,
``depthwise_conv2d_nhwc_rows``): against numpy on odd shapes, strides, dilation, asymmetric
padding and channel counts no panel divides, batches 1 and 3 of a symbolic batch, with the
bias and ReLU6 (MobileNet-V2's epilogue) fused into its one kernel; the padding read in place
(no copy of the padded rows); outputs of 1 MB an image and more stored non-temporally
from NONTEMPORAL_MIN_BYTES of the whole output on (a run-time test on the symbolic batch)."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.backend.cpu import ConvGeometry, depthwise_nhwc
from tilecraft.relax.backend.cpu.conv2d_nhwc import NhwcPlan
from tilecraft.relax.backend.cpu.params import NONTEMPORAL_MIN_BYTES
from tilecraft.relax.build import default_pipeline, schedule_kernels
from tilecraft.relax.transform import AlterLayout
from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import Allocate
from tilecraft.tensorir.transform.pipeline import lower

RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def depthwise_ref(x, w, strides, padding, dilation):
    """numpy NHWC depthwise convolution (weight ``(KH, KW, 1, C)``), float64."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    kh, kw = w.shape[:2]
    oh = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((x.shape[0], oh, ow, x.shape[3]))
    for a in range(kh):
        for b in range(kw):
            out += xp[:, a * dh:a * dh + sh * (oh - 1) + 1:sh,
                      b * dw:b * dw + sw * (ow - 1) + 1:sw, :] * w[a, b, 0]
    return out


# (C, H, W, kernel, strides, padding (top, left, bottom, right), dilation)
CASES = [
    (32, 15, 15, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),      # MobileNet's 3x3, odd plane
    (48, 17, 13, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),      # stride 2, 3 vectors of 16
    (24, 9, 11, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1)),       # TF "same" pads, 24 channels
    (40, 12, 19, (5, 5), (1, 2), (2, 1, 2, 3), (1, 1)),      # 5x5, asymmetric everything
    (16, 14, 14, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),      # dilated
    (8, 7, 7, (1, 7), (1, 1), (0, 3, 0, 3), (1, 1)),         # 1x7 on 8 channels: a half vector
    (144, 7, 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),       # 144 = 4.5 panels of 32
    # large strided images (once filled in whole pixels)
    (96, 57, 59, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1)),      # TF "same" pads, 3 panels
    (72, 61, 61, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),      # 9 half-vector panels
    # outputs over NONTEMPORAL_MIN_IMAGE_BYTES an image: written with non-temporal stores
    # from NONTEMPORAL_MIN_BYTES of the whole output (full 16-lane vectors: a half-vector
    # panel's 32-byte stores stay plain ones)
    (48, 81, 83, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),      # 1.29 MB, 3 panels of 16
    (96, 129, 121, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1)),    # 1.52 MB, whole pixels too
]


def _module(c, h, w_, k, s, p, d):
    w = rand(*k, 1, c)
    b = rand(c)
    x = Var("x", TensorStructInfo(("n", h, w_, c), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w), strides=s, padding=p, dilation=d, groups=c,
                                     data_layout="NHWC", kernel_layout="HWIO"))
            y = bb.emit(op.clip(bb.emit(op.add(y, const(b))), 0.0, 6.0))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get(), w, b


@pytest.mark.parametrize("case", CASES, ids=[str(c[:5]) for c in CASES])
def test_depthwise_nhwc_rows_matches_numpy(case):
    c, h, w_, k, s, p, d = case
    mod, w, b = _module(*case)
    altered = AlterLayout("llvm")(mod)
    kernels = [f.script() for _, f in altered.functions.items() if isinstance(f, PrimFunc)]
    assert sum('T.block("dw_pad_nhwc")' in src for src in kernels) == 1
    exe = relax.build(mod, "llvm")
    assert exe.stats()["main"]["kernel_calls"] == 1      # conv + bias + clip: one kernel
    g = ConvGeometry(c, h, w_, c, k, s, p, d, c)
    assert ("!nontemporal" in exe.kernel_module.get_source("ll-raw")) == \
        depthwise_nhwc.depthwise_streams_output(g, te.var("n"))
    vm = relax.VirtualMachine(exe)
    for n in (1, 3):
        x = rand(n, h, w_, c) * 2
        want = np.clip(depthwise_ref(x, w, s, p, d) + b, 0, 6)
        np.testing.assert_allclose(vm["main"](x).numpy(), want, rtol=1e-4, atol=1e-4)


def test_rows_kernel_takes_the_padded_depthwise_layers():
    padded = ConvGeometry(96, 112, 112, 96, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 96)
    unpadded = ConvGeometry(96, 112, 112, 96, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 96)
    dense = ConvGeometry(96, 112, 112, 96, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    assert depthwise_nhwc.depthwise_nhwc_applies(NhwcPlan(padded, 8, 32, 16))
    assert not depthwise_nhwc.depthwise_nhwc_applies(NhwcPlan(unpadded, 8, 32, 16))
    assert not depthwise_nhwc.depthwise_nhwc_applies(NhwcPlan(dense, 8, 32, 16))


@pytest.mark.parametrize("c, h, w_, s, p", [
    (96, 57, 59, 2, (0, 0, 1, 1)),     # TF "same" pads
    (32, 15, 15, 1, (1, 1, 1, 1)),
])
def test_padding_read_in_place(c, h, w_, s, p):
    """No padded copy: the kernel allocates no ``dw_pad_nhwc`` buffer and reads ``x`` under
    a test of the tap's row and column."""
    target = Target("llvm -num-cores=2")
    mod, _, _ = _module(c, h, w_, (3, 3), (s, s), p, (1, 1))
    kernels = schedule_kernels(default_pipeline(target)(mod), target)
    (conv,) = [f for name, f in kernels.items() if "conv" in name]
    allocs = []
    post_order_visit(lower(conv).body, lambda n: allocs.append(n.buffer.name)
                     if isinstance(n, Allocate) else None)
    assert "dw_pad_nhwc" not in allocs
    assert "if_then_else" in conv.script()


def test_nontemporal_output_from_the_whole_output():
    def geometry(c, hw, stride):
        return ConvGeometry(c, hw, hw, c, (3, 3), (stride,) * 2, (1, 1, 1, 1), (1, 1), c)
    n = te.var("n")
    # a symbolic batch: MobileNet-V2's 32 x 112 x 112, 96 x 112 x 112 stride-2 and 144 x 56 x
    # 56 layers carry the run-time test; not its 192 x 28 x 28 or 576 x 14 x 14 ones (32
    # images of theirs stay under NONTEMPORAL_MIN_BYTES)
    assert depthwise_nhwc.depthwise_streams_output(geometry(32, 112, 1), n)
    assert depthwise_nhwc.depthwise_streams_output(geometry(96, 112, 2), n)
    assert depthwise_nhwc.depthwise_streams_output(geometry(144, 56, 1), n)
    assert not depthwise_nhwc.depthwise_streams_output(geometry(192, 28, 1), n)
    assert not depthwise_nhwc.depthwise_streams_output(geometry(576, 14, 1), n)
    # a static batch: the whole output against NONTEMPORAL_MIN_BYTES (1.8 MB an image)
    assert not depthwise_nhwc.depthwise_streams_output(geometry(144, 56, 1), 1)
    assert not depthwise_nhwc.depthwise_streams_output(geometry(144, 56, 1), 18)
    assert depthwise_nhwc.depthwise_streams_output(geometry(144, 56, 1), 19)


def test_streamed_batch_matches_numpy():
    """A batch whose whole output passes NONTEMPORAL_MIN_BYTES (the non-temporal stores taken
    at run time) beside one under it, one executable."""
    case = (48, 81, 83, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1))    # 1.29 MB an image
    mod, w, b = _module(*case)
    vm = relax.VirtualMachine(relax.build(mod, "llvm"))
    image = 81 * 83 * 48 * 4
    for n in (2, -(-NONTEMPORAL_MIN_BYTES // image)):
        x = rand(n, 81, 83, 48) * 2
        want = np.clip(depthwise_ref(x, w, *case[4:]) + b, 0, 6)
        np.testing.assert_allclose(vm["main"](x).numpy(), want, rtol=1e-4, atol=1e-4)


def test_rows_kernel_rejects_a_dense_convolution():
    g = ConvGeometry(16, 8, 8, 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    x = te.placeholder((1, 8, 8, 16), "float32", "x")
    wt = te.placeholder((1, 3, 3, 16, 16), "float32", "w")
    with pytest.raises(ValueError, match="not a depthwise convolution"):
        depthwise_nhwc.depthwise_conv2d_nhwc_rows(x, wt, NhwcPlan(g, 8, 16, 16), "float32")


@pytest.mark.parametrize("c, hw, k, s, d, rows, width", [
    (96, 112, 3, 2, 1, 8, 16),      # MobileNet-V2's 16 -> 96 expansion's depthwise layer
    (144, 56, 3, 1, 1, 14, 16),
    (64, 30, 5, 1, 2, 6, 32),       # two vectors a panel, dilated 5x5
])
def test_prefetch_spec_covers_the_tile_ahead_in_the_last_window_row(c, hw, k, s, d, rows, width):
    """The lines the panels of a tile prefetch are the input pixels the tile
    PREFETCH_TILES_AHEAD on reads in its window's last row: every channel of ``rows x
    stride`` pixels, starting ``(K - 1) x dilation`` rows down from the tile's first tap."""
    g = ConvGeometry(c, hw, hw, c, (k, k), (s, s), (1, 1, 1, 1), (d, d), c)
    ahead, lines = depthwise_nhwc.depthwise_prefetch_spec(g, rows, width)
    tiles = depthwise_nhwc.PREFETCH_TILES_AHEAD
    row, rest = divmod(ahead, hw * c)
    assert row == (k - 1) * d and rest == tiles * rows * s * c
    panels = -(-c // width)
    assert panels * lines * 16 == rows * s * c        # 16 floats a line


def test_kernel_prefetches_its_input():
    """The scheduled kernel carries the prefetches (``llvm.prefetch``), and numbers match
    numpy with them on a batch past one tile row (covered above too)."""
    mod, w, b = _module(96, 57, 59, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1))
    exe = relax.build(mod, "llvm")
    assert "llvm.prefetch" in exe.kernel_module.get_source("ll-raw")
    x = rand(2, 57, 59, 96)
    want = np.clip(depthwise_ref(x, w, (2, 2), (0, 0, 1, 1), (1, 1)) + b, 0, 6)
    np.testing.assert_allclose(relax.VirtualMachine(exe)["main"](x).numpy(), want,
                               rtol=1e-4, atol=1e-4)
