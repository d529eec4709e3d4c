"""The CPU runtime: devices and NDArrays; importable without llvmlite."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets.runtime.elf import NotELFError, read_elf_header

from targets_testutil import run_sub


def test_devices():
    dev = targets.cpu(0)
    assert repr(dev) == "cpu(0)" and dev.device_type == 1 and dev.exist
    assert dev == targets.Device("cpu", 0) == targets.device(1, 0)
    assert hash(dev) == hash(targets.cpu())
    assert targets.cpu(0) != targets.Device("opencl", 0)
    with pytest.raises(ValueError, match="unknown device kind 'tpu'"):
        targets.Device("tpu")
    with pytest.raises(AttributeError):
        dev.index = 3


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "uint64", "bool"])
def test_array_roundtrip_and_alignment(dtype, rng):
    src = (rng.standard_normal((3, 5)) * 10).astype(dtype)
    a = targets.array(src)
    assert a.shape == (3, 5) and a.dtype == dtype and a.device == targets.cpu(0)
    assert a.data_ptr % 64 == 0
    out = a.numpy()
    np.testing.assert_array_equal(out, src)
    out[0, 0] = 0  # a copy: the array is unchanged
    np.testing.assert_array_equal(a.numpy(), src)
    assert f"shape=(3, 5), {dtype}, cpu(0)" in repr(a)


def test_empty_copyfrom_copyto(rng):
    e = targets.empty((4, 2), "int32")
    assert e.shape == (4, 2) and e.dtype == "int32" and e.data_ptr % 64 == 0
    src = rng.integers(0, 9, (4, 2)).astype("int32")
    e.copyfrom(src)
    np.testing.assert_array_equal(e.numpy(), src)
    other = targets.empty((4, 2), "int32")
    e.copyto(other)
    np.testing.assert_array_equal(other.numpy(), src)
    np.testing.assert_array_equal(e.copyto(targets.cpu(0)).numpy(), src)
    with pytest.raises(ValueError, match=r"copyfrom: source shape \(2, 4\) differs"):
        e.copyfrom(src.T)
    with pytest.raises(ValueError, match="copyfrom: source dtype float32 differs"):
        e.copyfrom(src.astype("float32"))
    with pytest.raises(ValueError, match="dtype complex64 is not supported"):
        targets.empty((2,), "complex64")
    assert targets.empty(0, "float32").shape == (0,)
    assert targets.empty((), "float32").shape == ()
    assert np.asarray(e).shape == (4, 2)


def test_elf_header_parser():
    with pytest.raises(NotELFError):
        read_elf_header(b"\x00" * 64)
    with open("/proc/self/exe", "rb") as f:
        header = read_elf_header(f.read(64))
    assert header.bits == 64 and header.little_endian


def test_runtime_imports_without_llvmlite():
    code = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] == 'llvmlite':
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import numpy as np
from tilecraft import targets
from tilecraft.targets.runtime import abi
a = targets.array(np.ones(3, 'float32'))
print(a.numpy().sum(), targets.Target('raspberry-pi/4b-aarch64').arch)
try:
    targets.build(None)
except TypeError as err:
    print('build:', err)
print(sorted(m for m in sys.modules if m.startswith('llvmlite')))
"""
    proc = run_sub(code)
    assert proc.returncode == 0, proc.stderr
    assert "3.0 aarch64" in proc.stdout
    assert proc.stdout.strip().endswith("[]")
