"""``NDArray``: an array on a device. On the CPU it wraps a numpy array aligned to 64 bytes.

Examples
--------
>>> import numpy as np
>>> a = array(np.arange(6, dtype="float32").reshape(2, 3))
>>> a.shape, a.dtype, a.device
((2, 3), 'float32', cpu(0))
>>> float(a.numpy().sum())
15.0
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .device import Device, cpu, device_runtime

ALIGNMENT = 64
SUPPORTED_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                    "uint64", "float16", "float32", "float64")


def _dtype_name(dtype) -> str:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(SUPPORTED_DTYPES)}") \
            from None
    if name not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {name} is not supported by tilecraft arrays; expected one of "
                         f"{', '.join(SUPPORTED_DTYPES)}")
    return name


def aligned_empty(shape: Sequence[int], dtype, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialized C-contiguous numpy array whose data starts on an ``alignment`` boundary."""
    shape = tuple(int(s) for s in shape)
    for s in shape:
        if s < 0:
            raise ValueError(f"array shape {shape} has a negative dimension")
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset:offset + nbytes].view(dt).reshape(shape)


def aligned_copy(source: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``source`` starting on an ``ALIGNMENT`` boundary, as the VM's
    buffers do (numpy aligns its own to 16 bytes only)."""
    src = np.asarray(source)
    out = aligned_empty(src.shape, src.dtype)
    np.copyto(out, src)
    return out


class NDArray:
    """An n-dimensional array on a device.

    Make one with ``targets.array(np_array, device)`` or ``targets.empty(shape, dtype, device)``.
    Kernels write their outputs into NDArrays in place; ``.numpy()`` copies the data out.
    """

    __slots__ = ("_data", "_device", "_ptr")

    def __init__(self, data: np.ndarray, device: Device):
        if device.kind != "cpu":
            raise ValueError(f"this NDArray class holds CPU memory; {device} arrays come from that "
                             f"device's runtime")
        self._data = data
        self._device = device
        self._ptr = int(data.ctypes.data)  # the buffer never moves: kernel calls reuse this

    # -- properties -----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def dtype(self) -> str:
        return self._data.dtype.name

    @property
    def device(self) -> Device:
        return self._device

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return int(self._data.size)

    @property
    def nbytes(self) -> int:
        return int(self._data.nbytes)

    @property
    def data_ptr(self) -> int:
        """The address of the first element."""
        return self._ptr

    # -- data movement --------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A numpy copy of the contents."""
        return self._data.copy()

    asnumpy = numpy

    def copyfrom(self, source: "NDArray | np.ndarray") -> "NDArray":
        """Overwrite the contents with ``source`` (same shape; dtype must match)."""
        src = source._data if isinstance(source, NDArray) else np.asarray(source)
        if tuple(src.shape) != self.shape:
            raise ValueError(f"copyfrom: source shape {tuple(src.shape)} differs from the array's "
                             f"{self.shape}")
        if src.dtype != self._data.dtype:
            raise ValueError(f"copyfrom: source dtype {src.dtype.name} differs from the array's "
                             f"{self.dtype}; convert it first with .astype()")
        np.copyto(self._data, src)
        return self

    def copyto(self, target: "NDArray | Device") -> "NDArray":
        """Copy into another NDArray, or to a new array on ``target`` device."""
        if isinstance(target, NDArray):
            return target.copyfrom(self)
        return array(self._data, target)

    def __repr__(self):
        return f"<tilecraft.NDArray shape={self.shape}, {self.dtype}, {self._device}>\n{self._data!r}"

    def __array__(self, dtype=None, copy=None):
        out = self._data if dtype is None else self._data.astype(dtype)
        return out.copy() if copy else out


def array(source, device: Device | None = None) -> NDArray:
    """Copy a numpy array (or anything ``np.asarray`` takes) into a new NDArray on ``device``.

    Examples
    --------
    >>> x = array(np.ones((2, 2), "float16"))
    >>> x.dtype
    'float16'
    """
    device = device or cpu(0)
    if isinstance(source, NDArray):
        source = source._data if source.device.kind == "cpu" else source.numpy()
    src = np.asarray(source)
    _dtype_name(src.dtype)
    if device.kind != "cpu":
        return device_runtime(device.kind).array(src, device)
    return NDArray(aligned_copy(src), device)


def empty(shape: Sequence[int], dtype="float32", device: Device | None = None) -> NDArray:
    """An uninitialized NDArray: ``targets.empty((4, 4), "float32", targets.cpu(0))``."""
    device = device or cpu(0)
    if isinstance(shape, int):
        shape = (shape,)
    name = _dtype_name(dtype)
    if device.kind != "cpu":
        return device_runtime(device.kind).empty(shape, name, device)
    return NDArray(aligned_empty(shape, name), device)
