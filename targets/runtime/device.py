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
        return self.kind == "cpu" and self.index == 0

    def sync(self) -> None:
        """Wait for queued work on the device to finish (nothing to wait for on the CPU)."""

    def __eq__(self, other):
        return isinstance(other, Device) and (self.kind, self.index) == (other.kind, other.index)

    def __hash__(self):
        return hash((self.kind, self.index))

    def __repr__(self):
        return f"{self.kind}({self.index})"


def cpu(index: int = 0) -> Device:
    """The host CPU: ``targets.cpu(0)``."""
    return Device("cpu", index)


def device(kind: "str | int", index: int = 0) -> Device:
    """A device by kind name or DLPack code: ``device("cpu", 0)``."""
    return Device(kind, index)
