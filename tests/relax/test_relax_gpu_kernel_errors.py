"""The GPU VM's launch path on OpenCL and WebGPU: a chain of kernels with an in-kernel check
(a gather) in the middle runs without waiting per kernel, matches numpy, reads its error words
once per VM call, and a failed check is raised at the end of the call naming the function,
kernel and check. WebGPU submits one command buffer per VM call."""
import os
import sys

import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var
from tilecraft.targets.runtime.host_program import DeviceKernelError
from tilecraft.tensorir import te

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "targets"))
from opencl_testutil import opencl_device_and_target  # noqa: E402
from webgpu_testutil import webgpu_device  # noqa: E402

RNG = np.random.default_rng(23)


def _opencl():
    return opencl_device_and_target()


def _webgpu():
    return webgpu_device(), "webgpu"


@pytest.fixture(scope="module", params=["opencl", "webgpu"])
def setup(request):
    dev, target = _opencl() if request.param == "opencl" else _webgpu()
    # no graph passes: every emit_te stays its own kernel (FuseOps would make them one)
    exe = relax.build(_chain(), target, pipeline=[])
    return dev, relax.VirtualMachine(exe, dev)


def _chain():
    def scale(a, k):
        return te.compute(a.shape, lambda i, j: a[i, j] * k, "scale")

    def gather(a, ind):
        return te.compute((ind.shape[0], a.shape[1]), lambda i, j: a[ind[i], j], "gather")

    bb = BlockBuilder()
    n, m = te.var("n"), te.var("m")
    x = Var("x", TensorStructInfo((n, 16), "float32"))
    idx = Var("idx", TensorStructInfo((m,), "int64"))
    with bb.function("main", [x, idx]):
        with bb.dataflow():
            h = bb.emit_te(scale, x, 2.0)
            h = bb.emit_te(scale, h, 3.0)
            h = bb.emit_te(gather, h, idx)
            h = bb.emit_te(scale, h, 0.5)
            h = bb.emit_te(scale, h, -1.0)
            gv = bb.emit_output(h)
        bb.emit_func_output(gv)
    return bb.get()


def _want(x, ind):
    return -(x * 6.0)[ind] * 0.5


def test_chain_matches_numpy_at_two_sizes(setup):
    dev, vm = setup
    for n, m in ((9, 5), (40, 33)):
        x = RNG.standard_normal((n, 16)).astype("float32")
        ind = RNG.integers(0, n, m)
        out = vm["main"](x, ind)
        np.testing.assert_allclose(out.numpy(), _want(x, ind), rtol=1e-6)


def test_failed_check_in_the_middle_is_raised_at_the_end_of_the_call(setup):
    dev, vm = setup
    x = RNG.standard_normal((6, 16)).astype("float32")
    with pytest.raises(DeviceKernelError,
                       match=r"^main: gather: kernel gather_kernel0: .*out of bounds"):
        vm["main"](x, np.array([0, 6, 1], "int64"))
    ind = np.array([5, 0, 3], "int64")                  # the next call is clean
    np.testing.assert_allclose(vm["main"](x, ind).numpy(), _want(x, ind), rtol=1e-6)


def test_one_error_read_per_vm_call(setup, monkeypatch):
    dev, vm = setup
    ctx = _ctx(dev)
    reads = []
    real = ctx.errors._read
    monkeypatch.setattr(ctx.errors, "_read", lambda words: reads.append(len(words)) or
                        real(words))
    x = RNG.standard_normal((8, 16)).astype("float32")
    ind = np.array([7, 1], "int64")
    vm["main"](x, ind)
    vm["main"](x, ind)
    # every kernel's word (the lowering keeps a bounds check in each of these symbolic
    # kernels), all read in one round trip per call
    assert len(reads) == 2 and reads[0] == reads[1] >= 1


def test_webgpu_submits_once_per_vm_call(setup, monkeypatch):
    dev, vm = setup
    if dev.kind != "webgpu":
        pytest.skip("WebGPU's command batching")
    ctx = _ctx(dev)
    x = targets.array(RNG.standard_normal((8, 16)).astype("float32"), dev)
    ind = targets.array(np.array([7, 1, 2], "int64"), dev)
    vm["main"](x, ind)            # warm: pipelines, bind groups

    class Counting:
        def __init__(self, queue):
            self.queue, self.submits = queue, 0

        def submit(self, bufs):
            self.submits += 1
            return self.queue.submit(bufs)

        def __getattr__(self, name):
            return getattr(self.queue, name)

    counting = Counting(ctx.queue)
    monkeypatch.setattr(ctx, "queue", counting)
    out = vm["main"](x, ind)
    # the five kernels in one command buffer, then the error word's copy to be read
    assert counting.submits == 2
    assert not ctx.batch
    np.testing.assert_allclose(out.numpy(), _want(x.numpy(), [7, 1, 2]), rtol=1e-6)


def _ctx(dev):
    if dev.kind == "opencl":
        from tilecraft.targets.opencl_backend.runtime import context
    else:
        from tilecraft.targets.webgpu_backend.runtime import context
    return context(dev.index)
