"""Shared by the OpenCL tests: the device (``capabilities.opencl_device``: a skip naming why there
is none, a failure under CI=true)."""
from __future__ import annotations

from capabilities import opencl_device as opencl_device_and_target


def opencl_device():
    """``targets.opencl(0)``, or ``requires`` fails naming why there is no OpenCL device."""
    return opencl_device_and_target()[0]


__all__ = ["opencl_device", "opencl_device_and_target"]
