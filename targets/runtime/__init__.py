"""The tilecraft runtime: devices, arrays and loaded kernel modules.

It imports with numpy and ctypes alone (no LLVM), so the board side of ``rpc`` can use it.
"""
from .device import Device, cpu, device, opencl, webgpu
from .ndarray import NDArray, array, empty
from .module import BenchmarkResult, Function, LibraryModule, Module, load_module
from . import abi

__all__ = ["Device", "cpu", "device", "opencl", "webgpu", "NDArray", "array", "empty", "BenchmarkResult",
           "Function", "LibraryModule", "Module", "load_module", "abi"]
