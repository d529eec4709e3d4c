"""The device a target's kernels run on, opened with a clear error when it is not there.

``llvm`` targets run on the CPU, ``opencl`` ones on an OpenCL device (pyopencl, the
``[opencl]`` extra), ``webgpu`` ones on a WebGPU adapter (wgpu, the ``[webgpu]`` extra).
"""
from __future__ import annotations

from tilecraft import targets
from tilecraft.targets.opencl_backend import OpenCLError, list_devices
from tilecraft.targets.webgpu_backend import WebGPUError, list_adapters

from .errors import CLIError, require


def device_kind(target: str) -> str:
    """``"cpu"``, ``"opencl"`` or ``"webgpu"``: where kernels built for ``target`` run.

    Examples
    --------
    >>> device_kind("llvm -mtriple=aarch64-linux-gnu"), device_kind("opencl -device=cpu")
    ('cpu', 'opencl')
    """
    kind = (str(target).split() or ["llvm"])[0]
    return "cpu" if kind == "llvm" else kind


def open_device(target: str, index: int = 0) -> tuple[targets.Device, str]:
    """The device of ``target`` numbered ``index``, and a description of it for messages.

    Raises ``CLIError`` when the driver package, the driver or the device is missing.

    Examples
    --------
    >>> open_device("llvm")
    (cpu(0), 'the CPU')
    """
    kind = device_kind(target)
    if index < 0:
        raise CLIError(f"--device {index}: a device number is >= 0")
    if kind == "cpu":
        if index != 0:
            raise CLIError(f"--device {index}: kernels built for {target} run on the CPU "
                           f"(device 0)")
        return targets.cpu(0), "the CPU"
    if kind == "opencl":
        require("pyopencl", "running OpenCL kernels")
        try:
            found = list_devices()
        except OpenCLError as err:
            raise CLIError(str(err)) from None
        names = [f"{d['name']} ({d['platform']})" for d in found]
    elif kind == "webgpu":
        require("wgpu", "running WebGPU kernels")
        try:
            found = list_adapters()
        except WebGPUError as err:
            raise CLIError(str(err)) from None
        names = [a["name"] for a in found]
    else:
        raise CLIError(f"no runtime for {kind} kernels (targets: llvm, opencl, webgpu)")
    if not names:
        raise CLIError(f"no {kind} device found (install a driver: PoCL for OpenCL, "
                       f"mesa-vulkan-drivers for WebGPU; see docs/gpu.md)")
    if index >= len(names):
        listed = "; ".join(f"{i}: {n}" for i, n in enumerate(names))
        raise CLIError(f"--device {index}: there are {len(names)} {kind} device(s): {listed}")
    return targets.device(kind, index), f"{kind}({index}) {names[index]}"
