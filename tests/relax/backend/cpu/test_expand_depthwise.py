"""An inverted-residual block's 1x1 expansion (bias, clip) fused into the depthwise NHWC
convolution reading it (relax.transform.FuseExpandDepthwise, relax.backend.cpu.expand_depthwise,
depthwise_nhwc.expand_depthwise_nhwc): against numpy on odd planes, strides 1 and 2, TF-style
and symmetric padding, channel counts no panel divides, a symbolic batch (1 and 3) and a
concrete batch of one, the three ways the imports write ReLU6; one kernel, whose expanded
buffer is one band of rows, not the image; chains the pass must leave alone."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.backend.cpu import ConvGeometry, expand_depthwise
from tilecraft.relax.build import default_pipeline, schedule_kernels
from tilecraft.relax.transform import FuseExpandDepthwise
from tilecraft.targets import Target
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import Allocate
from tilecraft.tensorir.transform.pipeline import lower

RNG = np.random.default_rng(12)


@pytest.fixture
def fuse_every_size(monkeypatch):
    """Every expansion fuses, whatever its size (small planes keep the tests quick)."""
    monkeypatch.setattr(expand_depthwise, "FUSE_MIN_IMAGE_BYTES", 0)


def _reference(x, w1, b1, w2, b2, stride, pad):
    """numpy (float64): relu6(depthwise(relu6(x @ w1 + b1), w2) + b2), NHWC."""
    e = np.clip(np.einsum("nhwk,ck->nhwc", x.astype(np.float64), w1[:, :, 0, 0]) + b1, 0, 6)
    pt, pl, pb, pr = pad
    ep = np.pad(e, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    oh = (ep.shape[1] - 3) // stride + 1
    ow = (ep.shape[2] - 3) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, e.shape[3]))
    for a in range(3):
        for b in range(3):
            out += ep[:, a:a + stride * (oh - 1) + 1:stride,
                      b:b + stride * (ow - 1) + 1:stride] * w2[:, 0, a, b]
    return np.clip(out + b2, 0, 6)


def _block(k, c, h, w, stride, pad, act="relu6", batch="n", reuse=False):
    """The expansion, ReLU6 (``act``: ``relu6``, ``clip`` or ``minmax``), the depthwise layer
    and its bias and ReLU6; with ``reuse`` the expanded tensor is an output too."""
    w1 = (RNG.standard_normal((c, k, 1, 1)) * 0.5).astype("float32")
    b1 = RNG.standard_normal(c).astype("float32")
    w2 = RNG.standard_normal((c, 1, 3, 3)).astype("float32")
    b2 = RNG.standard_normal(c).astype("float32")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, h, w, k), "float32"))

    def relu6(y):
        if act == "relu6":
            return bb.emit(op.nn.relu6(y))
        if act == "clip":
            return bb.emit(op.clip(y, 0.0, 6.0))
        lo = bb.emit(op.maximum(y, const(np.float32(0))))
        return bb.emit(op.minimum(lo, const(np.float32(6))))

    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w1), data_layout="NHWC", kernel_layout="OIHW"))
            e = relu6(bb.emit(op.add(y, const(b1.reshape(1, 1, 1, c)))))
            y = bb.emit(op.nn.conv2d(e, const(w2), strides=stride, padding=pad, groups=c,
                                     data_layout="NHWC", kernel_layout="OIHW"))
            y = relu6(bb.emit(op.add(y, const(b2.reshape(1, 1, 1, c)))))
            gv = bb.emit_output(relax.Tuple([y, e]) if reuse else y)
        bb.emit_func_output(gv)
    return bb.get(), (w1, b1, w2, b2)


def _fused_kernels(mod) -> list[str]:
    mod = FuseExpandDepthwise("llvm")(mod)
    return [str(gv) for gv, f in mod.functions.items() if "expand" in str(gv)]


# (K in, C expanded, H, W, stride, padding (top, left, bottom, right), activation)
CASES = [
    (16, 96, 17, 17, 2, (0, 0, 1, 1), "minmax"),   # MobileNet-V2's first block, ONNX's clip
    (24, 144, 9, 9, 1, (1, 1, 1, 1), "relu6"),     # 144 channels: 4.5 panels of 32
    (8, 32, 11, 13, 2, (0, 0, 1, 1), "clip"),      # odd plane: a ragged expansion tile
    (5, 40, 10, 7, 1, (1, 1, 1, 1), "relu6"),      # 5 inputs, 40 channels: a ragged panel
    (8, 24, 12, 12, 2, (1, 1, 1, 1), "relu6"),     # 24 channels: half vectors, stride 2 pad 1
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_fused_block_matches_numpy(case, fuse_every_size):
    k, c, h, w, s, p, act = case
    mod, (w1, b1, w2, b2) = _block(k, c, h, w, s, p, act)
    assert len(_fused_kernels(mod)) == 1
    exe = relax.build(mod, "llvm")
    assert exe.stats()["main"]["kernel_calls"] == 1     # expansion, depthwise, epilogues
    vm = relax.VirtualMachine(exe)
    for n in (1, 3):
        x = RNG.standard_normal((n, h, w, k)).astype("float32")
        np.testing.assert_allclose(vm["main"](x).numpy(), _reference(x, w1, b1, w2, b2, s, p),
                                   rtol=1e-4, atol=1e-4)


def test_batch_of_one_built_for_it(fuse_every_size):
    """A concrete batch of 1 (its batch index a constant once the bias and clip are inlined
    into the expansion's write-back: the band is placed first)."""
    mod, (w1, b1, w2, b2) = _block(16, 96, 15, 15, 2, (0, 0, 1, 1), batch=1)
    exe = relax.build(mod, "llvm")
    assert exe.stats()["main"]["kernel_calls"] == 1
    x = RNG.standard_normal((1, 15, 15, 16)).astype("float32")
    np.testing.assert_allclose(relax.VirtualMachine(exe)["main"](x).numpy(),
                               _reference(x, w1, b1, w2, b2, 2, (0, 0, 1, 1)),
                               rtol=1e-4, atol=1e-4)


def test_expanded_buffer_is_one_band(fuse_every_size):
    """The kernel allocates the expanded rows of one block of output rows (17 rows for 8
    stride-2 output rows), never the expanded image, and no other buffer of its size."""
    target = Target("llvm -num-cores=2")
    mod, _ = _block(16, 96, 40, 40, 2, (0, 0, 1, 1), batch=2)
    kernels = schedule_kernels(default_pipeline(target)(mod), target)
    (fused,) = [f for name, f in kernels.items() if "expand" in name]
    sizes = {}
    post_order_visit(lower(fused).body, lambda n: sizes.__setitem__(n.buffer.name, int(
        n.buffer.shape[0].value)) if isinstance(n, Allocate) else None)
    band = 17 * 40 * 96       # (8 - 1) * 2 + 3 rows x every column and channel
    assert sizes["expand_act"] <= band
    assert max(sizes.values()) <= band


def test_left_alone():
    """Not fused: an expanded image under FUSE_MIN_IMAGE_BYTES (the default), an expanded
    tensor that something else reads too, a 3x3 first layer, a depthwise layer without
    padding."""
    small, _ = _block(16, 96, 17, 17, 2, (0, 0, 1, 1))
    assert _fused_kernels(small) == []
    expand_depthwise.FUSE_MIN_IMAGE_BYTES, saved = 0, expand_depthwise.FUSE_MIN_IMAGE_BYTES
    try:
        reused, _ = _block(16, 96, 17, 17, 2, (0, 0, 1, 1), reuse=True)
        assert _fused_kernels(reused) == []
        unpadded, _ = _block(16, 96, 17, 17, 2, (0, 0, 0, 0))
        assert _fused_kernels(unpadded) == []
    finally:
        expand_depthwise.FUSE_MIN_IMAGE_BYTES = saved
    e = ConvGeometry(16, 56, 56, 96, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    d = ConvGeometry(96, 56, 56, 96, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1), 96)
    assert not expand_depthwise.expand_depthwise_applies(e, d)
