"""A 3x3 convolution on WebGPU (16 KiB of workgroup storage): its weight tile, fetched by
all threads with a guard, is compacted to the tile instead of the whole weight, so the default
GPU schedule keeps both inputs in shared memory (it used to fall back to registers only).
Checked on the device against numpy where there is one."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.build import default_pipeline
from tilecraft.relax import gpu_schedules
from tilecraft.relax.vm import VirtualMachine
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import Allocate
from tilecraft.tensorir.transform import lower_device
from capabilities import webgpu_device


def _conv_module(w):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", w.shape[1], 32, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.nn.conv2d(x, const(w), padding=1)))
        bb.emit_func_output(gv)
    return bb.get()


def _conv_ref(x, w):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2], x.shape[3]
    out = np.zeros((x.shape[0], w.shape[0], h, wd), "float64")
    for dy in range(3):
        for dx in range(3):
            out += np.einsum("nchw,kc->nkhw", xp[:, :, dy:dy + h, dx:dx + wd], w[:, :, dy, dx])
    return out.astype("float32")


def test_conv_weight_tile_fits_webgpu_shared_memory():
    w = np.random.default_rng(0).standard_normal((32, 16, 3, 3)).astype("float32")
    target = targets.Target("webgpu")
    mod = default_pipeline(target)(_conv_module(w))
    (name,) = [n for n, f in mod.functions.items() if hasattr(f, "buffers") and "conv" in n]
    sched = gpu_schedules.apply(mod[name], target)
    split = lower_device(sched, target)
    # one kernel per tile of the batch dispatch (backend.gpu.batch_dispatch), each checked
    for k in split.kernels:
        shared = []
        post_order_visit(k.func.body, lambda n: shared.append(n.buffer) if isinstance(n, Allocate)
                         and n.buffer.scope == "shared" else None)
        # both the image and the weight tiles staged (the weight: 32 x 1 x 3 x 3, not 32 x 16 x
        # 3 x 3)
        assert len(shared) == 2, [b.name for b in shared]
        sizes = sorted(int(np.prod([s.value for s in b.shape])) for b in shared)
        assert sizes[0] <= 32 * 9 and sum(sizes) * 4 <= 16384, sizes


@pytest.mark.slow   # ~20 s: lavapipe compiles the unrolled GEMM tile (CI: the ResNet kernels test)
def test_conv_on_webgpu_matches_numpy():
    webgpu_device()
    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 16, 3, 3)).astype("float32")
    vm = VirtualMachine(relax.build(_conv_module(w), "webgpu"), targets.webgpu(0))
    for n in (1, 2):
        x = rng.standard_normal((n, 16, 32, 32)).astype("float32")
        np.testing.assert_allclose(vm["main"](x).numpy(), _conv_ref(x, w), rtol=1e-3, atol=1e-3)
