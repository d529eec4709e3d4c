"""The WGSL of the GEMM-family convolutions keeps every register tile in scalars (issue 32).

On the H100, ResNet-50's 56 x 56 1x1 convolutions (64 -> 256, with the residual add) and its
7x7 stem ran 7-10x slower on WebGPU than on OpenCL: the WGSL generator unrolled the k-step loop
(a serial loop around the barriers that only contained register accesses), spent its unroll
budget on the first steps, and emitted the rest as loops, so the 8 x 8 accumulator tile became
a dynamically indexed ``var l_..: array<f32, 64>`` (local memory on a GPU). Now only loops
whose variable indexes a register tile are unrolled, and the k-step stays a loop as in the
OpenCL C. Built (no GPU needed) for the H100's adapter limits, with a symbolic batch as
``benchmarks/gpu_models.py`` builds the models; the small version runs on lavapipe against
numpy.
"""
import re
import warnings

import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets, tensorir
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.vm import VirtualMachine
from tilecraft.targets.webgpu_backend import UnrollBudgetWarning, wgsl
from capabilities import webgpu_device

# what targets.webgpu(0).target() reads from the H100 through NVIDIA's Vulkan driver (48 KiB of
# workgroup storage); the spec's limits are the portable "webgpu"
H100_ADAPTER = ("webgpu -max-threads-per-block=1024 -max-shared-memory-per-block=49152 "
                "-max-storage-buffers=16 -max-storage-buffer-binding-size=2147483644 "
                "-max-buffer-size=2147483648")
REGISTER_ARRAY = re.compile(r"var (l_\w+): array<")


def _conv_block(w, b, image, stride=1, padding=0, residual=False):
    """``relu(conv2d(x, w) + b [+ r])`` over a symbolic batch ``n``."""
    bb = BlockBuilder()
    n, cin = tensorir.var("n"), w.shape[1]
    x = Var("x", TensorStructInfo((n, cin, image, image), "float32"))
    out = (image + 2 * padding - w.shape[2]) // stride + 1
    params = [x]
    if residual:
        r = Var("r", TensorStructInfo((n, w.shape[0], out, out), "float32"))
        params.append(r)
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w), strides=stride, padding=padding))
            y = bb.emit(op.add(y, const(b.reshape(1, -1, 1, 1))))
            if residual:
                y = bb.emit(op.add(y, r))
            gv = bb.emit_output(bb.emit(op.nn.relu(y)))
        bb.emit_func_output(gv)
    return bb.get()


def _conv_ref(x, w, b, stride, padding, r=None):
    xp = np.pad(x.astype("float64"), ((0, 0), (0, 0), (padding,) * 2, (padding,) * 2))
    kh, kw = w.shape[2:]
    oh = (xp.shape[2] - kh) // stride + 1
    ow = (xp.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for dy in range(kh):
        for dx in range(kw):
            win = xp[:, :, dy:dy + stride * oh:stride, dx:dx + stride * ow:stride]
            out += np.einsum("nchw,kc->nkhw", win, w[:, :, dy, dx])
    out += b.reshape(1, -1, 1, 1)
    if r is not None:
        out += r
    return np.maximum(out, 0).astype("float32")


def _build(mod, target):
    """``relax.build`` for a symbolic batch bounded by 16; an ``UnrollBudgetWarning`` fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnrollBudgetWarning)
        return relax.build(mod, targets.Target(target), upper_bounds={"n": 16})


def _kernels(exe) -> dict:
    return {k["name"]: k["wgsl"] for k in exe.kernel_module.kernels}


def _assert_registers_scalar(exe, fused: str):
    kernels = {n: s for n, s in _kernels(exe).items() if fused in n}
    assert kernels, sorted(_kernels(exe))
    for name, src in kernels.items():
        assert "workgroupBarrier();" in src, name      # the GEMM tile, shared memory staged
        arrays = REGISTER_ARRAY.findall(src)
        assert not arrays, f"{name}: register arrays not scalarized: {sorted(set(arrays))}"
        # the k-step loop stays a loop: a few barriers, not two per step
        assert src.count("workgroupBarrier();") <= 4, name


RNG = np.random.default_rng(32)


@pytest.mark.parametrize("target", [H100_ADAPTER, "webgpu-desktop", "webgpu"])
def test_resnet50_1x1_conv_with_residual_keeps_registers_scalar(target):
    """ResNet-50's ``fused_conv2d3_add2_add3_relu2``: 64 -> 256 channels at 56 x 56."""
    w = RNG.standard_normal((256, 64, 1, 1)).astype("float32")
    b = RNG.standard_normal(256).astype("float32")
    exe = _build(_conv_block(w, b, 56, residual=True), target)
    _assert_registers_scalar(exe, "conv2d")


@pytest.mark.parametrize("target", [H100_ADAPTER, "webgpu"])
def test_resnet50_stem_keeps_registers_scalar(target):
    """ResNet-50's stem ``fused_conv2d_add_relu``: 7x7 stride 2, 3 -> 64 channels at 224."""
    w = RNG.standard_normal((64, 3, 7, 7)).astype("float32")
    b = RNG.standard_normal(64).astype("float32")
    exe = _build(_conv_block(w, b, 224, stride=2, padding=3), target)
    _assert_registers_scalar(exe, "conv2d")


def test_a_register_tile_over_the_unroll_budget_warns(monkeypatch):
    """Where the loops over a register tile do not fit the unroll budget, the kernel still
    builds (its tile an array) and says so: an ``UnrollBudgetWarning`` naming the kernel, the
    loops and the arrays."""
    monkeypatch.setattr(wgsl, "UNROLL_BODY_LIMIT", 256)
    w = RNG.standard_normal((64, 32, 1, 1)).astype("float32")
    b = RNG.standard_normal(64).astype("float32")
    with pytest.warns(UnrollBudgetWarning, match=r"kernel \w*conv2d\w*: loops .* register "
                      r"arrays .*l_\w+_local"):
        exe = relax.build(_conv_block(w, b, 28), "webgpu", upper_bounds={"n": 16})
    assert any(REGISTER_ARRAY.search(s) for s in _kernels(exe).values())


@pytest.mark.slow   # lavapipe compiles the unrolled register tiles
def test_1x1_conv_with_residual_matches_numpy_on_webgpu():
    """The same kernel family (k-step loop kept, tiles scalar) computes the right values."""
    dev = webgpu_device()
    w = RNG.standard_normal((64, 32, 1, 1)).astype("float32")
    b = RNG.standard_normal(64).astype("float32")
    exe = _build(_conv_block(w, b, 28, residual=True), "webgpu")
    _assert_registers_scalar(exe, "conv2d")
    vm = VirtualMachine(exe, dev)
    for n in (1, 13):        # the batch-1 and the large-batch tile of the batch dispatch
        x = RNG.standard_normal((n, 32, 28, 28)).astype("float32")
        r = RNG.standard_normal((n, 64, 28, 28)).astype("float32")
        np.testing.assert_allclose(vm["main"](x, r).numpy(), _conv_ref(x, w, b, 1, 0, r),
                                   rtol=1e-4, atol=1e-4)
