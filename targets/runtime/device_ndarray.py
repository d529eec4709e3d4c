"""What the GPU back ends' arrays share: an NDArray held in one device buffer.

``OpenCLNDArray`` and ``WebGPUNDArray`` keep their elements in a device buffer (no host
address) and differ only in how bytes move (OpenCL copies elements as they are; WebGPU widens
narrow dtypes to 32-bit words). The shape / dtype properties, the checks ``copyfrom`` makes on
its source, ``repr`` and ``__array__`` live here once. Nothing here imports a GPU library.

Examples
--------
>>> import numpy as np
>>> from tilecraft import targets
>>> a = targets.array(np.ones(4, "float32"), targets.opencl(0))   # doctest: +SKIP
>>> isinstance(a, DeviceNDArray)                                  # doctest: +SKIP
True
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .device import Device
from .ndarray import NDArray


class DeviceNDArray(NDArray):
    """An array in one buffer of a GPU device context (base of the OpenCL / WebGPU arrays).

    Subclasses set ``_API`` (the name used in messages, e.g. ``"OpenCL"``) and implement
    ``numpy``, ``_device_copy`` (a same-context copy from another array) and ``_host_write``
    (upload of a host array already checked for shape and dtype).
    """

    # __weakref__: the launch path remembers a VM call site's arrays without keeping them alive
    __slots__ = ("_ctx", "_buffer", "_shape", "_dtype", "_size", "__weakref__")
    _API = "device"

    def __init__(self, device: Device, ctx, buffer, shape: Sequence[int], dtype: str):
        self._data = None
        self._device = device
        self._ptr = 0
        self._ctx = ctx
        self._buffer = buffer
        self._shape = tuple(int(s) for s in shape)
        self._dtype = dtype
        size = 1
        for s in self._shape:      # (not np.prod: this runs for every view the VM makes)
            size *= s
        self._size = size

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> str:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self._dtype).itemsize

    @property
    def data_ptr(self) -> int:
        article = "an" if self._API[0] in "AEIOU" else "a"
        raise ValueError(f"{article} {self._API} array has no host address")

    def _device_copy(self, source: "DeviceNDArray") -> None:
        raise NotImplementedError

    def _host_write(self, src: np.ndarray) -> None:
        raise NotImplementedError

    def copyfrom(self, source) -> "DeviceNDArray":
        if isinstance(source, type(self)) and source._ctx is self._ctx:
            if source.shape != self._shape or source.dtype != self._dtype:
                raise ValueError(f"copyfrom: source {source.shape} {source.dtype} differs from "
                                 f"the array's {self._shape} {self._dtype}")
            self._device_copy(source)
            return self
        src = source.numpy() if isinstance(source, NDArray) else np.asarray(source)
        if tuple(src.shape) != self._shape:
            raise ValueError(f"copyfrom: source shape {tuple(src.shape)} differs from the array's "
                             f"{self._shape}")
        if src.dtype.name != self._dtype:
            raise ValueError(f"copyfrom: source dtype {src.dtype.name} differs from the array's "
                             f"{self._dtype}; convert it first with .astype()")
        self._host_write(src)
        return self

    def __repr__(self):
        return f"<tilecraft.NDArray shape={self._shape}, {self._dtype}, {self._device}>"

    def __array__(self, dtype=None, copy=None):
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)
