"""The OpenCL runtime: devices, arrays, modules, timing and its errors (on PoCL in CI)."""
import subprocess
import sys

import numpy as np
import pytest

from tilecraft import targets
from opencl_testutil import opencl_device
from tilecraft.tensorir import Schedule, te


@pytest.fixture(scope="module")
def dev():
    return opencl_device()


def _scaled(n=None, factor=64):
    n = te.var("n") if n is None else n
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    i, = sch.get_loops(sch.get_block("B"))
    bx, tx = sch.split(i, [None, factor])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return sch.mod["main"]


@pytest.fixture(scope="module")
def scaled_mod():
    return targets.build(_scaled(), "opencl")


def test_device_selection(dev):
    from tilecraft.targets.opencl_backend import list_devices
    devs = list_devices()
    assert dev.exist and dev.kind == "opencl" and dev.index == 0
    assert not targets.opencl(len(devs)).exist
    # by name: the first device's platform name picks a device of that platform
    picked = targets.opencl(devs[0]["platform"].split()[0])
    assert picked.exist
    with pytest.raises(Exception, match="no OpenCL device matches 'no-such-device-xyz'"):
        targets.opencl("no-such-device-xyz")
    gpus_first = ["GPU" in d["type"].upper() for d in devs]
    assert gpus_first == sorted(gpus_first, reverse=True)


def test_arrays_roundtrip_every_dtype(dev):
    rng = np.random.default_rng(0)
    for dtype in ("float32", "float64", "int8", "uint8", "int32", "int64", "bool"):
        x = (rng.standard_normal((3, 5)) * 10).astype(dtype)
        a = targets.array(x, dev)
        assert a.shape == (3, 5) and a.dtype == dtype and a.device == dev
        np.testing.assert_array_equal(a.numpy(), x)
        np.testing.assert_array_equal(np.asarray(a), x)
        b = targets.empty((3, 5), dtype, dev)
        b.copyfrom(a)
        np.testing.assert_array_equal(b.numpy(), x)
        np.testing.assert_array_equal(targets.array(a, targets.cpu(0)).numpy(), x)
    z = targets.empty((0, 4), "float32", dev)
    assert z.numpy().shape == (0, 4)
    with pytest.raises(ValueError, match="differs"):
        targets.empty((2,), "float32", dev).copyfrom(np.zeros(3, "float32"))


def test_module_runs_symbolic_sizes_and_shows_source(dev, scaled_mod):
    src = scaled_mod.get_source()
    assert "__kernel" in src and "get_group_id(0)" in src and "int n" in src
    for n in (1, 63, 64, 1000):
        x = np.random.default_rng(n).standard_normal(n).astype("float32")
        a, b = targets.array(x, dev), targets.empty((n,), "float32", dev)
        scaled_mod["main"](a, b)
        np.testing.assert_allclose(b.numpy(), x * 2 + 1, rtol=1e-6)


def test_time_evaluator_uses_device_timestamps(dev, scaled_mod):
    a = targets.array(np.ones(4096, "float32"), dev)
    b = targets.empty((4096,), "float32", dev)
    res = scaled_mod.time_evaluator("main", dev, number=3, repeat=2)(a, b)
    assert len(res.results) == 2 and all(0 < r < 1 for r in res.results)


def test_argument_errors(dev, scaled_mod):
    f = scaled_mod["main"]
    a = targets.array(np.ones(8, "float32"), dev)
    with pytest.raises(ValueError, match="argument A is in host memory"):
        f(np.ones(8, "float32"), targets.empty((8,), "float32", dev))
    with pytest.raises(ValueError, match=r"argument B: dimension 0 is 9, expected n = 8"):
        f(a, targets.empty((9,), "float32", dev))
    with pytest.raises(ValueError, match="argument A has dtype int32, expected float32"):
        f(targets.array(np.ones(8, "int32"), dev), targets.empty((8,), "float32", dev))
    with pytest.raises(TypeError, match="takes 2 argument"):
        f(a)
    with pytest.raises(ValueError, match="are the same array"):
        f(a, a)


def test_export_and_load(dev, scaled_mod, tmp_path):
    path = str(tmp_path / "scaled.clmod")
    scaled_mod.export_library(path)
    loaded = targets.load_module(path)
    x = np.arange(10, dtype="float32")
    a, b = targets.array(x, dev), targets.empty((10,), "float32", dev)
    loaded["main"](a, b)
    np.testing.assert_allclose(b.numpy(), x * 2 + 1)


def test_driver_compile_error_quotes_the_source_line(dev):
    from tilecraft.targets.opencl_backend.runtime import OpenCLBuildError, context
    src = "__kernel void f(__global float* a) {\n  a[0] = undefined_thing + 1.0f;\n}\n"
    with pytest.raises(OpenCLBuildError, match=r"line 2: a\[0\] = undefined_thing \+ 1.0f;"):
        context(dev.index).program(src)


def test_half_arithmetic_needs_the_extension_float16_storage_does_not(dev):
    # Target("opencl"): float16 is a storage format (vload_half / vstore_half_rte, core OpenCL);
    # Target("opencl -supports-float16=1"): half arithmetic under cl_khr_fp16
    from tilecraft.targets.opencl_backend.runtime import OpenCLError, context
    A = te.placeholder((64,), "float16", "A")
    B = te.compute((64,), lambda i: A[i] * te.const(2.0, "float16"), "B")
    sch = Schedule(te.create_prim_func([A, B]))
    i, = sch.get_loops(sch.get_block("B"))
    sch.bind(i, "threadIdx.x")
    x = np.linspace(-2, 2, 64).astype("float16")
    a, b = targets.array(x, dev), targets.empty((64,), "float16", dev)
    storage = targets.build(sch.mod["main"], "opencl")
    assert "cl_khr_fp16" not in storage.get_source() and "vload_half(" in storage.get_source()
    storage["main"](a, b)
    np.testing.assert_array_equal(b.numpy(), x * np.float16(2))
    native = targets.build(sch.mod["main"], "opencl -supports-float16=1")
    assert "#pragma OPENCL EXTENSION cl_khr_fp16 : enable" in native.get_source()
    if "cl_khr_fp16" in context(dev.index).extensions:
        native["main"](a, b)
        np.testing.assert_array_equal(b.numpy(), x * np.float16(2))
    else:
        with pytest.raises(OpenCLError, match="float16 arithmetic, which needs the cl_khr_fp16 extension"):
            native["main"](a, b)


def test_over_limit_kernel_is_a_build_error():
    from tilecraft.tensorir.transform import DeviceLimitError
    with pytest.raises(DeviceLimitError, match="threads per block .* exceed the target's limit"):
        targets.build(_scaled(1024, 512), "opencl -max-threads-per-block=256")


def test_targets_import_without_pyopencl():
    code = ("import sys, importlib.abc\n"
            "class B(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'pyopencl':\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, B())\n"
            "from tilecraft import targets\n"
            "d = targets.opencl(0)\n"
            "assert not d.exist\n"
            "try:\n"
            "    targets.empty((2,), 'float32', d)\n"
            "except ImportError as e:\n"
            "    assert \"pip install 'tilecraft[opencl]'\" in str(e), e\n"
            "else:\n"
            "    raise AssertionError('no ImportError')\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
