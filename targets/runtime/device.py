"""Devices: where an array lives and a kernel runs (``targets.cpu(0)``).

A ``Device`` is a kind (``"cpu"``, ``"opencl"``, ``"webgpu"``) and an index. Kinds map to DLPack
device-type codes so that the numbers in a ``DLTensor`` mean what they mean everywhere else.

Examples
--------
>>> dev = cpu(0)
>>> dev
cpu(0)
>>> dev.device_type
1
"""
from __future__ import annotations

from typing import Any

DEVICE_TYPES = {"cpu": 1, "opencl": 4, "vulkan": 7, "webgpu": 15}
DEVICE_NAMES = {v: k for k, v in DEVICE_TYPES.items()}


class Device:
    """A device of some kind, e.g. ``Device("cpu", 0)``.

    Parameters
    ----------
    kind : str
        ``"cpu"``, ``"opencl"``, ``"vulkan"`` or ``"webgpu"`` (or its DLPack code).
    index : int
        Which device of that kind.
    """

    __slots__ = ("kind", "index")

    def __init__(self, kind: "str | int", index: int = 0):
        if isinstance(kind, int):
            if kind not in DEVICE_NAMES:
                raise ValueError(f"unknown device type code {kind}; known: {DEVICE_NAMES}")
            kind = DEVICE_NAMES[kind]
        if kind not in DEVICE_TYPES:
            raise ValueError(f"unknown device kind {kind!r}; expected one of {sorted(DEVICE_TYPES)}")
        index = int(index)
        if index < 0:
            raise ValueError(f"device index must be >= 0, got {index}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "index", index)

    def __setattr__(self, name, value):
        raise AttributeError("Device is immutable")

    @property
    def device_type(self) -> int:
        """The DLPack device-type code (1 for the CPU)."""
        return DEVICE_TYPES[self.kind]

    @property
    def device_id(self) -> int:
        return self.index

    @property
    def exist(self) -> bool:
        """Whether this device is present (the CPU always is)."""
        if self.kind == "cpu":
            return self.index == 0
        runtime = _DEVICE_RUNTIMES.get(self.kind)
        return bool(runtime is not None and runtime.exist(self.index))

    def sync(self) -> None:
        """Wait for queued work on the device to finish (nothing to wait for on the CPU)."""
        if self.kind != "cpu":
            device_runtime(self.kind).sync(self.index)

    def target(self):
        """The ``Target`` that builds for this device's own limits (a WebGPU adapter's, not the
        spec's defaults: see ``targets.webgpu_backend.adapter_target``); ``ValueError`` for a
        kind whose runtime cannot describe its device.

        Examples
        --------
        >>> webgpu(0).target()                          # doctest: +SKIP
        Target('webgpu -max-threads-per-block=1024 -max-shared-memory-per-block=32768 ...')
        """
        if self.kind == "cpu":
            raise ValueError("cpu(0).target(): use Target('llvm') (the host's CPU)")
        runtime = device_runtime(self.kind)
        if not hasattr(runtime, "target"):
            raise ValueError(f"{self!r}.target(): the {self.kind} runtime does not describe its "
                             f"devices as a Target")
        return runtime.target(self.index)

    def __eq__(self, other):
        return isinstance(other, Device) and (self.kind, self.index) == (other.kind, other.index)

    def __hash__(self):
        return hash((self.kind, self.index))

    def __repr__(self):
        return f"{self.kind}({self.index})"


# Device back ends (targets.opencl_backend, targets.webgpu_backend) register a runtime for their
# kind when their package is imported; ``targets.array``/``targets.empty``, ``Device.exist`` and
# ``Device.sync`` dispatch to it. A runtime has ``array(np_array, device)``,
# ``empty(shape, dtype, device)``, ``exist(index) -> bool`` and ``sync(index)``; it loads its
# driver library (pyopencl, wgpu) only when one of these is first called.
_DEVICE_RUNTIMES: dict[str, Any] = {}


def register_device_runtime(kind: str, runtime: Any) -> None:
    """Make ``runtime`` serve arrays and synchronization for devices of ``kind``."""
    if kind not in DEVICE_TYPES or kind == "cpu":
        raise ValueError(f"cannot register a runtime for device kind {kind!r}")
    _DEVICE_RUNTIMES[kind] = runtime


def device_runtime(kind: str) -> Any:
    """The runtime registered for ``kind``; ValueError if there is none."""
    runtime = _DEVICE_RUNTIMES.get(kind)
    if runtime is None:
        raise ValueError(f"no runtime for {kind} devices is available in this process")
    return runtime


def cpu(index: int = 0) -> Device:
    """The host CPU: ``targets.cpu(0)``."""
    return Device("cpu", index)


def opencl(index: "int | str" = 0) -> Device:
    """An OpenCL device: ``targets.opencl(0)`` is the first GPU over all platforms, then the
    other devices (CPUs such as PoCL); a string picks the first device whose platform, vendor or
    device name contains it (``targets.opencl("NVIDIA")``)."""
    if isinstance(index, str):
        index = device_runtime("opencl").find(index)
    return Device("opencl", index)


def webgpu(index: "int | str" = 0) -> Device:
    """A WebGPU adapter: ``targets.webgpu(0)`` is the high-performance one, then the others in
    the order wgpu lists them; a string picks the first whose name contains it
    (``targets.webgpu("llvmpipe")``). The adapter is opened when first used."""
    if isinstance(index, str):
        index = device_runtime("webgpu").find(index)
    return Device("webgpu", index)


def device(kind: "str | int", index: int = 0) -> Device:
    """A device by kind name or DLPack code: ``device("cpu", 0)``."""
    return Device(kind, index)
