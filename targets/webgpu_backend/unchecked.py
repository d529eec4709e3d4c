"""Shader modules without naga's run-time checks: native only, never a default.

WebGPU makes every out-of-bounds access safe. wgpu's shader translator (naga) does it by
rewriting the WGSL's accesses — a clamp of each dynamic index into a workgroup or function
array, and of storage-buffer indices where the driver has no robust buffer access — and adds a
bounding counter to every loop. A browser always keeps these checks. wgpu-native (not the
WebGPU API) can create a module without them: ``wgpuDeviceCreateShaderModuleTrusted`` with
``WGPUShaderRuntimeChecks_None``. This module reaches it through wgpu-py's FFI. Two users: a
module built for ``Target("webgpu -trusted-shaders=1")`` (a native application that runs only
tilecraft's generated kernels; see docs/gpu-webgpu.md, "Trusted shaders"), and the
``bounds_checks`` switch of a device context, with which ``benchmarks/gpu_webgpu.py`` measures
what the checks cost a kernel on a given driver.

A kernel that would read out of bounds may then read any memory of the process (our kernels
index workgroup arrays in bounds by construction — ``VerifyMemoryAccess`` proves every access
at build time or checks it in the kernel; the ``select`` of an
``if_then_else`` reads a storage buffer at the unselected index too, which the driver's robust
buffer access — requested by wgpu on Vulkan where the device has it — still bounds). It uses
wgpu-py's private ``wgpu.backends.wgpu_native._api`` (tested with wgpu 0.32): another version
may lack it, which is a ``WebGPUError`` saying so, not a fallback to checked shaders.

Examples
--------
>>> ctx = runtime.context(0)                                    # doctest: +SKIP
>>> ctx.bounds_checks = False      # pipelines created from now on skip naga's checks
"""
from __future__ import annotations

from tilecraft.optional import import_optional

# wgpu.h: WGPUShaderRuntimeChecks_None (no bounds checks, no forced loop bounding)
RUNTIME_CHECKS_NONE = 0


def create_unchecked_shader_module(device, wgsl: str, label: str = ""):
    """A ``GPUShaderModule`` of ``wgsl`` on ``device`` (a wgpu-py ``GPUDevice`` of the
    wgpu-native back end) created without naga's run-time checks. Raises what wgpu raises for
    invalid WGSL (a ``GPUValidationError`` quoting naga's message), and ``RuntimeError`` naming
    the missing entry point where this wgpu-py lacks it."""
    api = import_optional("wgpu.backends.wgpu_native._api", "unchecked WebGPU shader modules")
    ffi, lib = api.ffi, api.lib
    if not hasattr(lib, "wgpuDeviceCreateShaderModuleTrusted"):
        raise RuntimeError("this wgpu-native has no wgpuDeviceCreateShaderModuleTrusted: shaders "
                           "without run-time checks are not available")
    source = api.new_struct_p("WGPUShaderSourceWGSL *", code=api.to_c_string_view(wgsl))
    source[0].chain.next = ffi.NULL
    source[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
    descriptor = api.new_struct_p(
        "WGPUShaderModuleDescriptor *", nextInChain=ffi.cast("WGPUChainedStruct *", source),
        label=api.to_c_string_view(label))
    module_id = api.libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, descriptor,
                                                            RUNTIME_CHECKS_NONE)
    if module_id == ffi.NULL:
        raise RuntimeError(f"wgpu-native did not create the shader module {label!r}")
    return api.GPUShaderModule(label, module_id, device)
