"""The WebGPU target of an adapter's own limits (``targets.webgpu(0).target()``), the limits a
target may declare beyond the spec's defaults, and shaders without naga's run-time checks."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets import Target, TargetError
from tilecraft.targets.webgpu_backend import WebGPUError, WGSLCompileError, runtime
from tilecraft.targets.webgpu_backend.runtime import adapter_target, target_limits
from tilecraft.tensorir import Schedule, te
from webgpu_testutil import bind_1d, webgpu_device


@pytest.fixture(scope="module")
def dev():
    return webgpu_device()


def _reopened_for(target: Target, dev) -> None:
    """Open ``dev`` again, asking for what ``target`` needs (an earlier test may have opened
    it with the spec's limits)."""
    runtime.note_target(target)
    runtime.close_device(dev.index)


def test_declared_limits_round_trip_and_raise_the_device_request():
    t = Target("webgpu -max-threads-per-block=1024 -max-shared-memory-per-block=32768 "
               "-max-storage-buffers=10 -max-storage-buffer-binding-size=2147483644 "
               "-max-buffer-size=2147483648")
    assert Target(str(t)) == t and Target(t.export()) == t
    assert (t.max_storage_buffer_binding_size, t.max_buffer_size) == (2147483644, 2 ** 31)
    lim = t.limits
    assert lim["max_compute_invocations_per_workgroup"] == 1024
    assert lim["max_compute_workgroup_size_x"] == 1024
    assert lim["max_compute_workgroup_storage_size"] == 32768
    need = target_limits(t)
    assert need["max-storage-buffer-binding-size"] == 2147483644
    assert need["max-buffer-size"] == 2 ** 31
    assert need["max-compute-invocations-per-workgroup"] == 1024
    # the portable default is the spec's
    p = Target("webgpu")
    assert (p.max_threads_per_block, p.max_shared_memory_per_block,
            p.max_storage_buffer_binding_size, p.max_buffer_size) == (256, 16384, 2 ** 27, 2 ** 28)
    assert target_limits(p) == runtime.SPEC_LIMITS
    assert Target("webgpu-desktop").max_shared_memory_per_block == 32768
    assert Target("opencl").max_storage_buffer_binding_size is None
    with pytest.raises(TargetError, match="max_storage_buffer_binding_size must be positive"):
        Target("webgpu -max-storage-buffer-binding-size=0")
    with pytest.raises(TargetError, match="max_buffer_size must be an integer"):
        Target("webgpu -max-buffer-size=lots")


def test_adapter_target_reads_the_adapter(dev):
    t = dev.target()
    assert t == adapter_target(dev.index) and t.kind == "webgpu"
    have = runtime.list_adapters()[dev.index]["limits"]
    assert 256 <= t.max_threads_per_block <= min(1024, have["max-compute-invocations-per-workgroup"])
    assert t.max_shared_memory_per_block == max(16384, have["max-compute-workgroup-storage-size"])
    assert t.max_storage_buffers == max(8, have["max-storage-buffers-per-shader-stage"])
    assert 2 ** 27 <= t.max_storage_buffer_binding_size <= 2 ** 31 - 4
    assert t.max_storage_buffer_binding_size % 4 == 0
    assert Target(str(t)) == t         # written down, rebuilt without the GPU
    with pytest.raises(WebGPUError, match=r"webgpu\(99\) does not exist"):
        adapter_target(99)
    with pytest.raises(ValueError, match="Target\\('llvm'\\)"):
        targets.cpu(0).target()


def _shared_rows(rows: int, threads: int):
    """rows x 80 floats staged in shared memory by one workgroup of ``threads``."""
    A = te.placeholder((rows, 80), "float32", "A")
    B = te.compute((rows, 80), lambda i, j: A[i, j] * 3.0 + 1.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    blk = sch.get_block("B")
    i, j = sch.get_loops(blk)
    bo, bi = sch.split(sch.fuse(i, j), [1, None])
    sch.bind(bo, "blockIdx.x")
    _, tx = sch.split(bi, [None, threads])
    sch.bind(tx, "threadIdx.x")
    sh = sch.cache_read(blk, 0, "shared")
    sch.compute_at(sh, bo)
    _, ftx = sch.split(sch.fuse(*sch.get_loops(sh)[1:]), [None, threads])
    sch.bind(ftx, "threadIdx.x")
    return sch.mod


def test_a_kernel_over_the_spec_limits_runs_with_the_adapter_target(dev, rng):
    t = dev.target()
    if t.max_threads_per_block < 1024 or t.max_shared_memory_per_block < 32768:
        pytest.skip(f"the adapter has fewer than 1024 invocations or 32 KiB ({t})")
    mod = _shared_rows(96, 1024)          # 30 KiB of workgroup storage, 1024 invocations
    with pytest.raises(ValueError, match="exceed"):
        targets.build(mod, "webgpu")
    built = targets.build(mod, t)
    _reopened_for(t, dev)
    x = rng.standard_normal((96, 80)).astype("float32")
    a, b = targets.array(x, dev), targets.empty((96, 80), "float32", dev)
    built["main"](a, b)
    np.testing.assert_allclose(b.numpy(), x * 3 + 1, rtol=1e-6)
    assert "@workgroup_size(1024, 1, 1)" in built.get_source()


def test_a_binding_over_the_adapter_is_a_clear_first_call_error(dev):
    have = runtime.list_adapters()[dev.index]["limits"]["max-storage-buffer-binding-size"]
    if have >= 2 ** 31 - 4:
        pytest.skip("the adapter binds 2 GiB")
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] + 1.0, "B")
    big = Target(f"webgpu -max-storage-buffer-binding-size={have + 4}")
    built = targets.build(bind_1d(te.create_prim_func([A, B]), "B").mod, big)
    _reopened_for(big, dev)
    a = targets.array(np.ones(4, "float32"), dev)
    with pytest.raises(WebGPUError, match=rf"max-storage-buffer-binding-size = {have + 4}, "
                                          rf"but adapter .* supports at most {have}"):
        built["main"](a, targets.empty((4,), "float32", dev))


def test_shaders_without_naga_checks_compute_the_same(dev, rng):
    n = te.var("n")
    A = te.placeholder((n, 4), "float32", "A")
    B = te.compute((n, 4), lambda i, j: te.exp(A[i, j]) * 2.0, "B")
    func = bind_1d(te.create_prim_func([A, B]), "B").mod
    x = rng.standard_normal((37, 4)).astype("float32")
    ctx = runtime.context(dev.index)
    ctx.bounds_checks = False
    try:
        mod = targets.build(func, "webgpu")
        a, b = targets.array(x, dev), targets.empty((37, 4), "float32", dev)
        mod["main"](a, b)
        np.testing.assert_allclose(b.numpy(), np.exp(x) * 2, rtol=1e-5)
        with pytest.raises(WGSLCompileError, match="expected"):
            ctx.pipeline("@compute @workgroup_size(1) fn main( {", (), "broken")
    finally:
        ctx.bounds_checks = True
