"""``OpenCLModule``: a GPU module whose kernels are one OpenCL C program."""
from __future__ import annotations

import json
import os

from ..runtime.device import Device
from ..runtime.device_module import DeviceModule
from ..fileio import atomic_write
from .runtime import LoadedProgram, OpenCLError, context

FORMAT = "tilecraft-opencl-module"


def is_opencl_module_file(head: bytes) -> bool:
    """Whether a file starting with ``head`` is an ``OpenCLModule.export_library`` file."""
    return head.startswith(b'{"format": "' + FORMAT.encode())


class OpenCLModule(DeviceModule):
    """Functions of ``targets.build(..., "opencl")``: ``mod["main"](*arrays)`` with arrays on
    an OpenCL device; ``mod.get_source()`` is the OpenCL C program; the program is compiled
    for a device the first time a function runs there (cached by source and device)."""

    device_kind = "opencl"

    def __init__(self, metadata: dict, programs: dict, source: str, extensions=(),
                 kernel_names=()):
        super().__init__(metadata, programs, source)
        self.extensions = tuple(extensions)
        self.kernel_names = tuple(kernel_names)
        self._by_device: dict[int, LoadedProgram] = {}

    def _loaded(self, device: Device) -> LoadedProgram:
        lp = self._by_device.get(device.index)
        if lp is None:
            ctx = context(device.index)
            blocks = {k: m["block"] for p in self.programs.values()
                      for k, m in p["kernels"].items()}
            lp = self._by_device[device.index] = LoadedProgram(ctx, self.source, self.extensions,
                                                               self.kernel_names, blocks)
        return lp

    def export_library(self, path: str) -> str:
        """Write the module (source, host programs, metadata) as one JSON file."""
        data = {"format": FORMAT, "version": 1, "metadata": self.metadata,
                "programs": self.programs, "source": self.source,
                "extensions": list(self.extensions), "kernel_names": list(self.kernel_names)}
        atomic_write(path, json.dumps(data))
        return os.fspath(path)

    @staticmethod
    def load(path: str) -> "OpenCLModule":
        """Read a file written by ``export_library`` (``targets.load_module`` calls this)."""
        with open(path, "rb") as f:
            data = json.loads(f.read().decode())
        if data.get("format") != FORMAT:
            raise OpenCLError(f"{path} is not an OpenCL module written by export_library")
        return OpenCLModule(data["metadata"], data["programs"], data["source"],
                            data["extensions"], data["kernel_names"])


__all__ = ["OpenCLModule", "FORMAT", "is_opencl_module_file"]
