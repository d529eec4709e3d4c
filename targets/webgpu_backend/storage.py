"""How each tilecraft dtype lives in WebGPU memory and in WGSL.

WGSL has 32-bit scalars (``i32``, ``u32``, ``f32``), ``f16`` with the ``shader-f16`` feature, and
``bool`` — which is not host-shareable, so it cannot sit in a buffer. There are no 8- or 16-bit
integers and no 64-bit types. The policy, shared by the code generator and the runtime:

============  ================  ==========================================================
dtype         in a buffer       note
============  ================  ==========================================================
float32       f32
float16       f16               kernels need ``shader-f16`` (the target's ``supports_float16``)
int32/uint32  i32/u32
int8, int16   i32 (widened)     one 32-bit word per element; stores wrap to the narrow range
uint8/16      u32 (widened)     likewise
bool          u32 (widened)     0 or 1
int64         i32 (narrowed)    values are checked to fit on upload; arithmetic is 32-bit
uint64        u32 (narrowed)    likewise
float64       —                 refused: WebGPU has no 64-bit floats
============  ================  ==========================================================

Widening 8/16-bit data costs memory and bandwidth (4x for int8) but keeps every element in its
own word, so neighbouring threads never race on a shared word; the runtime converts on upload and
download, so ``.numpy()`` gives the original dtype.

Every storage buffer is allocated with a size that is a multiple of 16 bytes (``buffer_bytes``):
a kernel may bind a float32 buffer as ``array<vec4<f32>>`` (``wgsl``: 16-byte loads and stores),
whose length is the binding's size / 16 rounded down, so a size of 4 (mod 16) would cut off the
last elements. The padding is at most 12 bytes per buffer.
"""
from __future__ import annotations

import numpy as np

from tilecraft.errors import TilecraftError

# dtype -> the dtype of one element in a device buffer
STORAGE_DTYPE = {
    "float32": "float32", "float16": "float16", "int32": "int32", "uint32": "uint32",
    "int8": "int32", "int16": "int32", "int64": "int32",
    "uint8": "uint32", "uint16": "uint32", "uint64": "uint32", "bool": "uint32",
}

# dtype of a value in WGSL code (registers): bool stays bool there
WGSL_SCALAR = {
    "float32": "f32", "float16": "f16", "int32": "i32", "uint32": "u32",
    "int8": "i32", "int16": "i32", "int64": "i32",
    "uint8": "u32", "uint16": "u32", "uint64": "u32", "bool": "bool",
}

WIDENED = {"int8", "int16", "uint8", "uint16", "bool"}
NARROWED = {"int64", "uint64"}


class UnsupportedDTypeError(TilecraftError, ValueError):
    """A dtype WebGPU cannot hold (float64)."""


def storage_dtype(dtype: str) -> str:
    """The dtype an element of ``dtype`` has in a device buffer (``int8 -> int32``)."""
    try:
        return STORAGE_DTYPE[dtype]
    except KeyError:
        raise UnsupportedDTypeError(
            f"WebGPU cannot hold {dtype} data: WGSL has no 64-bit floats; convert the array or "
            f"the model to float32") from None


def wgsl_scalar(dtype: str) -> str:
    """The WGSL type of a ``dtype`` value in registers."""
    try:
        return WGSL_SCALAR[dtype]
    except KeyError:
        raise UnsupportedDTypeError(f"WGSL has no type for {dtype} (no 64-bit floats)") from None


def wgsl_storage(dtype: str) -> str:
    """The WGSL element type of a buffer of ``dtype``."""
    return wgsl_scalar(storage_dtype(dtype))


def buffer_bytes(nbytes: int) -> int:
    """The size of the storage buffer allocated for ``nbytes`` bytes of elements: at least 16,
    rounded up to a multiple of 16 (so that an ``array<vec4<f32>>`` binding covers every
    element).

    Examples
    --------
    >>> buffer_bytes(20), buffer_bytes(0), buffer_bytes(64)
    (32, 16, 64)
    """
    return max(16, (int(nbytes) + 15) // 16 * 16)


def to_device_bytes(array: np.ndarray) -> np.ndarray:
    """The array converted to its storage dtype (a C-contiguous copy when it changes).

    int64/uint64 values must fit the 32-bit storage: a ValueError names the first that does not.
    """
    dtype = array.dtype.name
    target = np.dtype(storage_dtype(dtype))
    if array.dtype == target:
        return np.ascontiguousarray(array)
    if dtype in NARROWED and array.size:
        info = np.iinfo(target)
        lo, hi = array.min(), array.max()
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise ValueError(f"a {dtype} array on a WebGPU device is stored as {target.name} "
                             f"(WGSL has no 64-bit integers), but it holds {int(bad)}, outside "
                             f"[{info.min}, {info.max}]")
    return np.ascontiguousarray(array.astype(target))


def from_device_bytes(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Storage-dtype elements back to ``dtype`` (widened ints wrap into the narrow range)."""
    if raw.dtype.name == dtype:
        return raw
    if dtype == "bool":
        return raw != 0
    return raw.astype(np.dtype(dtype))
