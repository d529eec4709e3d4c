"""The WebGPU back end: TIR -> WGSL code generation and a runtime on ``wgpu``.

Importing this package does not import ``wgpu``; the runtime loads it when an adapter is first
needed. See ``docs/gpu.md`` (WebGPU) for adapters, limits and the WGSL it emits.
"""
from . import storage
from .runtime import (SPEC_LIMITS, DeviceContext, WebGPUError, WebGPUNDArray, WGSLCompileError,
                      context, find_adapter, list_adapters, num_adapters)

__all__ = ["storage", "SPEC_LIMITS", "DeviceContext", "WebGPUError", "WebGPUNDArray",
           "WGSLCompileError", "context", "find_adapter", "list_adapters", "num_adapters"]
