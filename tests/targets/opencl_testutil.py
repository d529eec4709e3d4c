"""Shared by the OpenCL tests: the device (skipping with the reason when there is none)."""
from __future__ import annotations

import pytest

from tilecraft import targets


def opencl_device():
    """``targets.opencl(0)``, or a skip naming why there is no OpenCL device."""
    try:
        from tilecraft.targets.opencl_backend import list_devices
        list_devices()
    except Exception as err:   # no pyopencl, no platform, no device
        pytest.skip(f"no OpenCL platform: {err}")
    return targets.opencl(0)


def opencl_device_and_target() -> tuple:
    """``(targets.opencl(0), target string)``: ``"opencl -device=cpu"`` when the device is a CPU
    (PoCL: the CPU variant of the GPU schedules), else ``"opencl"``; a skip when there is none."""
    from tilecraft.targets.opencl_backend import list_devices
    dev = opencl_device()
    return dev, ("opencl -device=cpu" if "CPU" in list_devices()[0]["type"].upper()
                 else "opencl")
