"""The WebGPU runtime: adapters, arrays, limits, bad input, timing, export."""
import json

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets.webgpu_backend import (WebGPUError, WGSLCompileError, list_adapters, runtime,
                                    storage)
from tilecraft.tensorir import Schedule, te
from webgpu_testutil import bind_1d, webgpu_device


@pytest.fixture(scope="module")
def dev():
    return webgpu_device()


def _double(n=None, threads=64):
    n = te.var("n") if n is None else n
    A = te.placeholder((n, 4), "float32", "A")
    B = te.compute((n, 4), lambda i, j: A[i, j] * 2.0, "B")
    return bind_1d(te.create_prim_func([A, B]), "B", threads).mod


def test_adapters_and_arrays_round_trip_every_dtype(dev, rng):
    names = [a["name"] for a in list_adapters()]
    assert names and dev.exist
    assert targets.webgpu(names[0].split()[0]).index == 0
    for dtype in ("float32", "float16", "int32", "uint32", "int8", "uint8", "int16", "uint16",
                  "bool", "int64", "uint64"):
        x = (np.abs(rng.standard_normal((3, 5))) * 50).astype(dtype)
        a = targets.array(x, dev)
        assert (a.shape, a.dtype, a.device) == ((3, 5), dtype, dev)
        np.testing.assert_array_equal(a.numpy(), x)
        y = (np.abs(rng.standard_normal((3, 5))) * 50).astype(dtype)
        a.copyfrom(y)
        np.testing.assert_array_equal(a.numpy(), y)
    assert targets.empty((0, 3), "float32", dev).numpy().shape == (0, 3)
    assert storage.storage_dtype("int8") == "int32"


def test_bad_arrays(dev):
    with pytest.raises(ValueError, match="no 64-bit floats"):
        targets.array(np.zeros(3), dev)
    with pytest.raises(ValueError, match="outside"):
        targets.array(np.array([2 ** 40]), dev)
    with pytest.raises(WebGPUError, match=r"webgpu\(99\) does not exist"):
        targets.empty((2,), "float32", targets.Device("webgpu", 99))
    with pytest.raises(WebGPUError, match="no WebGPU adapter matches"):
        targets.webgpu("no-such-gpu")
    a = targets.array(np.zeros((2, 2), "float32"), dev)
    with pytest.raises(ValueError, match="shape"):
        a.copyfrom(np.zeros((3, 2), "float32"))


def test_call_checks(dev):
    mod = targets.build(_double(), "webgpu")
    a = targets.array(np.ones((5, 4), "float32"), dev)
    with pytest.raises(ValueError, match="takes 2 argument"):
        mod["main"](a)
    with pytest.raises(ValueError, match="numpy|ndarray|WebGPU device"):
        mod["main"](a, np.zeros((5, 4), "float32"))
    with pytest.raises(ValueError, match="dimension 0 is 6, expected n = 5"):
        mod["main"](a, targets.empty((6, 4), "float32", dev))
    with pytest.raises(ValueError, match="dtype int32"):
        mod["main"](a, targets.empty((5, 4), "int32", dev))
    with pytest.raises(ValueError, match="same array"):
        mod["main"](a, a)


def test_limits_are_build_time_errors():
    with pytest.raises(ValueError, match=r"512 threads per block .* 256"):
        targets.build(_double(threads=512), "webgpu")
    targets.build(_shared_tile(rows=32), "webgpu")            # 10 KiB of shared memory: fine
    with pytest.raises(ValueError, match=r"20480 bytes of shared memory exceed .* 16384"):
        targets.build(_shared_tile(rows=64), "webgpu")
    targets.build(_shared_tile(rows=64), "webgpu -max-shared-memory-per-block=32768")


def _shared_tile(rows: int):
    """A rows x 80 float tile in shared memory for one workgroup."""
    A = te.placeholder((rows, 80), "float32", "A")
    B = te.compute((rows, 80), lambda i, j: A[i, j] + 1.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    blk = sch.get_block("B")
    i, j = sch.get_loops(blk)
    bo, bi = sch.split(sch.fuse(i, j), [1, None])
    sch.bind(bo, "blockIdx.x")
    _, tx = sch.split(bi, [None, 64])
    sch.bind(tx, "threadIdx.x")
    sh = sch.cache_read(blk, 0, "shared")
    sch.compute_at(sh, bo)
    _, ftx = sch.split(sch.fuse(*sch.get_loops(sh)[1:]), [None, 64])
    sch.bind(ftx, "threadIdx.x")
    return sch.mod


def test_64_bit_extents_are_build_time_errors():
    A = te.placeholder((3, 2 ** 30), "float32", "A")
    B = te.compute((3, 2 ** 30), lambda i, j: A[i, j] + 1.0, "B")
    with pytest.raises(ValueError, match=r"3221225472 elements; .* 32-bit"):
        targets.build(bind_1d(te.create_prim_func([A, B]), "B").mod, "webgpu")


def test_no_adapter_and_missing_feature(dev, monkeypatch):
    ctx = runtime.context(dev.index)
    with pytest.raises(WebGPUError, match="needs the WebGPU feature 'no-such-feature'.* does "
                                          "not have"):
        ctx.check_requirements("module function main", {}, ["no-such-feature"])
    monkeypatch.setattr(runtime, "_ADAPTERS", [])
    monkeypatch.setattr(runtime, "_CONTEXTS", {})
    assert not targets.webgpu(0).exist
    with pytest.raises(WebGPUError, match="no WebGPU adapter found"):
        targets.empty((2,), "float32", targets.webgpu(0))


def test_too_many_unpackable_buffers_is_a_build_error():
    n = te.var("n")
    ins = [te.placeholder((n,), "float16", f"X{k}") for k in range(9)]
    Y = te.compute((n,), lambda i: sum((x[i] for x in ins[1:]), ins[0][i]), "Y")
    func = bind_1d(te.create_prim_func([*ins, Y]), "Y").mod
    # ten float16 buffers: 16-bit elements cannot share a packed 32-bit binding
    with pytest.raises(ValueError, match=r"10 storage buffers, over the target's limit of 8"):
        targets.build(func, "webgpu -supports-float16=1")
    targets.build(func, "webgpu -supports-float16=1 -max-storage-buffers=10")


def test_raised_limits_need_a_device_opened_after_the_build(dev, rng):
    if runtime.context(dev.index).adapter.limits["max-compute-invocations-per-workgroup"] < 512:
        pytest.skip("the adapter allows fewer than 512 invocations per workgroup")
    mod = targets.build(_double(threads=512), "webgpu -max-threads-per-block=512")
    a = targets.array(np.ones((300, 4), "float32"), dev)
    b = targets.empty((300, 4), "float32", dev)
    if runtime.context(dev.index).limits["max-compute-invocations-per-workgroup"] < 512:
        with pytest.raises(WebGPUError, match="was opened with 256"):
            mod["main"](a, b)
    runtime.close_device(dev.index)            # the new device asks for 512
    x = rng.standard_normal((300, 4)).astype("float32")
    a = targets.array(x, dev)
    b = targets.empty((300, 4), "float32", dev)
    mod["main"](a, b)
    np.testing.assert_allclose(b.numpy(), x * 2)


def test_in_kernel_check_reports_its_message(dev):
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n,), "float32", "A")
    idx = te.placeholder((m,), "int64", "idx")
    B = te.compute((m,), lambda i: A[idx[i]], "B")
    mod = targets.build(bind_1d(te.create_prim_func([A, idx, B]), "B").mod, "webgpu")
    a = targets.array(np.arange(10, dtype="float32"), dev)
    good = targets.array(np.array([3, 0, 9], "int64"), dev)
    out = targets.empty((3,), "float32", dev)
    mod["main"](a, good, out)
    np.testing.assert_array_equal(out.numpy(), [3, 0, 9])
    bad = targets.array(np.array([3, 10, 1], "int64"), dev)
    with pytest.raises(ValueError, match="out of bounds"):
        mod["main"](a, bad, out)


def test_time_evaluator_and_source(dev):
    mod = targets.build(_double(), "webgpu")
    src = mod.get_source()
    assert "@compute @workgroup_size(64, 1, 1)" in src and "var<uniform>" in src
    a = targets.array(np.ones((1000, 4), "float32"), dev)
    b = targets.empty((1000, 4), "float32", dev)
    r = mod.time_evaluator("main", dev, number=3, repeat=2)(a, b)
    assert len(r.results) == 2 and all(t > 0 for t in r.results)


def test_export_and_load_module(dev, tmp_path, rng):
    mod = targets.build(_double(), "webgpu")
    path = str(tmp_path / "double.wgpu.json")
    mod.export_library(path)
    data = json.loads(open(path).read())
    assert data["format"] == "tilecraft-webgpu" and data["functions"][0]["kernels"][0]["wgsl"]
    loaded = targets.load_module(path)
    x = rng.standard_normal((9, 4)).astype("float32")
    a, b = targets.array(x, dev), targets.empty((9, 4), "float32", dev)
    loaded["main"](a, b)
    np.testing.assert_allclose(b.numpy(), x * 2)


def test_rejected_wgsl_shows_the_line(dev, tmp_path):
    mod = targets.build(_double(), "webgpu")
    k = mod.metadata["functions"][0]["kernels"][0]
    k["wgsl"] = k["wgsl"].replace("* 2.0f", "* 2.0f +")
    path = str(tmp_path / "broken.json")
    mod.export_library(path)
    broken = targets.load_module(path)
    a = targets.array(np.ones((2, 4), "float32"), dev)
    with pytest.raises(WGSLCompileError, match=r"line \d+: .*2\.0f \+"):
        broken["main"](a, targets.empty((2, 4), "float32", dev))
