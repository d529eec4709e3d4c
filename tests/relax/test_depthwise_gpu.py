"""Depthwise convolutions on GPU targets (``relax.backend.gpu.depthwise``): one kernel per
layer (the input window of a tile in shared memory with the padding inlined into its fetch,
rows of outputs per thread, the bias / ReLU6 / residual epilogue in the register write-back),
against numpy on OpenCL (PoCL in CI) and WebGPU (lavapipe in CI): strides 1 and 2, 3x3 and 5x5
windows, odd image sizes and tiles with tails, a symbolic batch at two values."""
import numpy as np
import pytest

import gpu_testutil as gpu
from tilecraft.relax import const, gpu_schedules as gs, op
from tilecraft.relax.backend.gpu import depthwise
from tilecraft.relax.build import _run_pipeline, legalize
from tilecraft.relax.op import nn
from tilecraft.targets import Target
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.transform import lower_device
from capabilities import gpu_device

RNG = np.random.default_rng(33)


@pytest.fixture(scope="module", params=["opencl", "webgpu"])
def gpu_dev(request):
    return gpu_device(request.param)


def _depthwise_ref(x, w, stride, pad):
    n, c, h, wd = x.shape
    k = w.shape[2]
    p = np.pad(x.astype("float64"), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    out = np.zeros((n, c, oh, ow))
    for dy in range(k):
        for dx in range(k):
            win = p[:, :, dy:dy + stride * oh:stride, dx:dx + stride * ow:stride]
            out += win * w[None, :, 0, dy, dx, None, None]
    return out


def _model(C, H, W, k, stride, residual):
    pad = k // 2
    oh, ow = (H + 2 * pad - k) // stride + 1, (W + 2 * pad - k) // stride + 1
    w = (RNG.standard_normal((C, 1, k, k)) * 0.5).astype("float32")
    b = RNG.standard_normal((1, C, 1, 1)).astype("float32")
    params = [("x", ("n", C, H, W), "float32")]
    if residual:
        params.append(("r", ("n", C, oh, ow), "float32"))

    def body(x, *r):
        y = op.add(nn.conv2d(x, const(w), strides=(stride, stride), padding=(pad, pad),
                             groups=C), const(b))
        if residual:
            y = op.add(y, r[0])
        return [op.clip(y, 0.0, 6.0)]

    def ref(x, *r):
        y = _depthwise_ref(x, w, stride, pad) + b
        if residual:
            y = y + r[0]
        return [np.clip(y, 0.0, 6.0)]

    def inputs(n):
        out = [RNG.standard_normal((n, C, H, W)).astype("float32")]
        if residual:
            out.append(RNG.standard_normal((n, C, oh, ow)).astype("float32"))
        return out
    return gpu.module(params, body), inputs, ref


def test_tile_rule():
    assert depthwise.depthwise_tile(112, 112) == (8, 28, 4)
    assert depthwise.depthwise_tile(14, 14) == (14, 7, 2)
    assert depthwise.depthwise_tile(7, 7) == (7, 7, 1)
    th, tw, rw = depthwise.depthwise_tile(30, 200)
    assert tw <= depthwise.DEPTHWISE_MAX_COLUMNS and th * tw <= depthwise.DEPTHWISE_THREADS


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_one_kernel_with_the_window_in_shared_memory(kind):
    """The convolution, its padding, bias and ReLU6 are one kernel: the padded window tile in
    shared memory, the accumulators in registers."""
    mod, _, _ = _model(32, 56, 56, 3, 2, residual=False)
    lowered = legalize(_run_pipeline(mod, None, Target(kind)))
    (func,) = [f for f in lowered.functions.values() if isinstance(f, PrimFunc)]
    g = gs.apply(func, Target(kind))
    text = g.script()
    assert "pad_shared" in text and "_local" in text
    assert len(lower_device(g, Target(kind)).kernels) == 1


@pytest.mark.parametrize("case", [(8, 14, 14, 3, 1, True), (6, 13, 11, 3, 2, False),
                                  (4, 30, 30, 3, 1, False), (4, 9, 10, 5, 1, True),
                                  (3, 17, 66, 3, 2, False)])
def test_depthwise_matches_numpy(gpu_dev, case):
    """Strides 1 and 2, 3x3 and 5x5, odd sizes, a 30 x 30 image whose row tiles have a tail,
    a 66-wide one (two column tiles, the second partial), with and without a residual add;
    batch 1 and 3 on one build."""
    dev, target = gpu_dev
    C, H, W, k, stride, residual = case
    mod, inputs, ref = _model(C, H, W, k, stride, residual)
    gpu.check(dev, target, mod, inputs, ref, sizes=(1, 3), rtol=1e-4, atol=1e-4)
