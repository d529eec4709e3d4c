"""The WebGPU back end: TIR -> WGSL code generation and a runtime on ``wgpu``.

* ``build_module(mod, target)`` — what ``targets.build(..., "webgpu")`` calls: device lowering,
  one WGSL compute shader per kernel (``wgsl``), the host program as JSON (``build``).
* ``WebGPUModule`` — call, time (``time_evaluator`` with timestamp queries), ``get_source()``
  (WGSL), ``export_library(path)`` (JSON; ``targets.load_module`` reads it back).
* The runtime (``runtime``): adapters (``targets.webgpu(i)``, ``list_adapters()``), devices
  opened with the WebGPU spec's default limits (raised where a target built or noted with
  ``note_target`` declares more), arrays, a pipeline cache; ``adapter_target(i)`` (also
  ``targets.webgpu(i).target()``): a target of the adapter's own limits.

Importing this package does not import ``wgpu``; the runtime loads it when an adapter is first
needed. See ``docs/gpu.md`` (WebGPU) for adapters, limits and the WGSL it emits.
"""
from . import storage
from .runtime import (SPEC_LIMITS, DeviceContext, WebGPUError, WebGPUNDArray, WGSLCompileError,
                      adapter_target, context, find_adapter, list_adapters, note_target,
                      num_adapters)
from .wgsl import UnrollBudgetWarning, WebGPUBuildError, WebGPULimitError
from .build import build_module
from .module import WebGPUFunction, WebGPUModule, load_webgpu_module

__all__ = ["storage", "SPEC_LIMITS", "DeviceContext", "WebGPUError", "WebGPUNDArray",
           "WGSLCompileError", "WebGPUBuildError", "WebGPULimitError", "UnrollBudgetWarning",
           "build_module",
           "WebGPUFunction", "WebGPUModule", "load_webgpu_module", "context", "find_adapter",
           "list_adapters", "num_adapters", "adapter_target", "note_target"]

from ..runtime.module import register_module_loader as _register_module_loader
from .module import is_webgpu_module_file as _is_webgpu_module_file

_register_module_loader(_is_webgpu_module_file, load_webgpu_module)
