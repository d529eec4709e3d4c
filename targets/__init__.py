"""targets: code generation and runtime for CPUs (LLVM), OpenCL and WebGPU.

* ``Target`` — what to compile for (``Target("llvm -mtriple=aarch64-linux-gnu")``, tags).
* ``build(func_or_mod, target)`` — lower and compile; returns a ``Module`` (LLVM targets:
  kernel by kernel, in parallel processes, through the persistent ``kernel_cache``).
* Runtime: ``cpu(0)``, ``Device``, ``array``, ``empty``, ``NDArray``, ``Module``,
  ``load_module`` — importable without llvmlite (the board side uses them).

Examples
--------
>>> import numpy as np
>>> from tilecraft import targets
>>> from tilecraft.tensorir import te
>>> n = te.var("n")
>>> A = te.placeholder((n,), "float32", "A")
>>> B = te.compute((n,), lambda i: te.exp(A[i]), "B")
>>> mod = targets.build(te.create_prim_func([A, B]), "llvm")
>>> a = targets.array(np.zeros(5, "float32"))
>>> b = targets.empty((5,), "float32")
>>> mod["main"](a, b)
>>> b.numpy()
array([1., 1., 1., 1., 1.], dtype=float32)
"""
from .target import ELF_MACHINE, TAGS, Target, TargetError, host_triple
from .toolchain import ToolchainError, find_lld
from .runtime import (BenchmarkResult, Device, Function, LibraryModule, Module, NDArray, array,
                      cpu, device, empty, load_module, opencl, webgpu)
from . import webgpu_backend  # registers the webgpu device runtime (wgpu loads on first use)
from . import opencl_backend  # registers the opencl device runtime (pyopencl loads on first use)
from .build_module import KernelSpec, build, build_kernels
from .build_stats import BuildStats
from . import kernel_cache

__all__ = ["Target", "TargetError", "TAGS", "ELF_MACHINE", "host_triple", "ToolchainError",
           "find_lld", "BenchmarkResult", "Device", "Function", "LibraryModule", "Module",
           "NDArray", "array", "cpu", "device", "empty", "load_module", "opencl", "webgpu", "build",
           "build_kernels", "KernelSpec", "BuildStats", "kernel_cache"]
