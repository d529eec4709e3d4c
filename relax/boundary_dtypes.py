"""Element types a function takes and returns that tilecraft computes in a storage dtype.

tilecraft has no bfloat16, float8, float4, int4 or int2 dtype: an ONNX model that uses them
computes on their storage (``frontend/onnx/lowbit.py``: bfloat16 bits in uint16, float8 and
float4 bits in uint8, int4 / int2 values in int8 / uint8). Its users hold the ``ml_dtypes``
arrays numpy gives them (``onnx.numpy_helper.to_array`` makes them too), so the VM converts at
the boundary: a function whose attribute ``"boundary_dtypes"`` names such types takes the
``ml_dtypes`` arrays for those parameters and returns them for those results.

The attribute is ``{"params": (name or "", ...), "ret": name or "" or (..., ...)}`` with
``ml_dtypes`` names (``"bfloat16"``, ``"float8_e4m3fn"``, ``"int4"``...); ``"ret"`` follows
the shape of the result (a tuple for a tuple result). ``relax.build`` copies it into the
program; ``relax.VirtualMachine`` calls ``args_to_storage`` and ``result_from_storage``.

An argument already in the storage dtype (``x.view(np.uint16)`` of a bfloat16 array) is
taken as it is. Results on a GPU device stay in the storage dtype (a device array has no
``ml_dtypes`` view); ``.numpy()`` of them gives the storage.

Examples
--------
>>> import ml_dtypes, numpy as np
>>> x = np.array([1.5, -2.0], ml_dtypes.bfloat16)
>>> to_storage(x, "bfloat16", "f", "x").dtype
dtype('uint16')
>>> from_storage(np.array([16320], np.uint16), "bfloat16")
array([1.5], dtype=bfloat16)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tilecraft.targets.runtime.ndarray import NDArray

try:   # a dependency of onnx; needed only by functions that declare these types
    import ml_dtypes
except ImportError:    # pragma: no cover - onnx installs it
    ml_dtypes = None

__all__ = ["ATTR", "STORAGE", "args_to_storage", "from_storage", "result_from_storage",
           "to_storage"]

ATTR = "boundary_dtypes"

# ml_dtypes name -> (storage dtype, how the storage holds a value: "bits" or "value")
STORAGE = {
    "bfloat16": ("uint16", "bits"),
    "float8_e4m3fn": ("uint8", "bits"), "float8_e4m3fnuz": ("uint8", "bits"),
    "float8_e5m2": ("uint8", "bits"), "float8_e5m2fnuz": ("uint8", "bits"),
    "float8_e8m0fnu": ("uint8", "bits"), "float4_e2m1fn": ("uint8", "bits"),
    "int4": ("int8", "value"), "uint4": ("uint8", "value"),
    "int2": ("int8", "value"), "uint2": ("uint8", "value"),
}


def _ml_dtype(name: str) -> np.dtype:
    if ml_dtypes is None:
        raise RuntimeError(f"this function takes or returns {name} values, which need the "
                           f"ml_dtypes package (pip install ml_dtypes)")
    return np.dtype(getattr(ml_dtypes, name))


def to_storage(x, name: str, fname: str, what: str, error: type = TypeError):
    """Argument ``x`` of logical type ``name`` in its storage dtype (arrays in the storage
    dtype and values of other kinds pass unchanged: the VM's own checks name them); an array
    of another dtype raises ``error``."""
    storage, how = STORAGE[name]
    arr = x._data if type(x) is NDArray else x
    if not isinstance(arr, np.ndarray) or arr.dtype == np.dtype(storage):
        return x
    if arr.dtype != _ml_dtype(name):
        raise error(f"{fname}: {what} must be a {name} array (ml_dtypes.{name}) or its "
                        f"storage ({storage}), got dtype {arr.dtype.name}")
    if how == "value":
        return np.require(arr.astype(storage), requirements="C")
    return np.require(arr, requirements="C").view(storage)


def from_storage(arr: np.ndarray, name: str) -> np.ndarray:
    """A storage-dtype array as the ``ml_dtypes`` type ``name``."""
    storage, how = STORAGE[name]
    dtype = _ml_dtype(name)
    if how == "value":
        return arr.astype(dtype)
    return np.require(arr, requirements="C").view(dtype)


def args_to_storage(args, names, fname: str, params, error: type = TypeError) -> tuple:
    """The arguments of a call with those of a logical type in their storage dtype."""
    out = list(args)
    for k, name in enumerate(names or ()):
        if name and k < len(out):
            out[k] = to_storage(out[k], name, fname, f"argument {params[k]}", error)
    return tuple(out)


def result_from_storage(value: Any, spec) -> Any:
    """A function's result with the tensors of a logical type as ``ml_dtypes`` NDArrays (host
    tensors only)."""
    if not spec:
        return value
    if isinstance(spec, (list, tuple)):
        if not isinstance(value, tuple):
            return value
        return tuple(result_from_storage(v, s) for v, s in zip(value, spec)) + \
            value[len(spec):]
    if type(value) is NDArray and value.device.kind == "cpu":
        return NDArray(from_storage(value._data, spec), value.device)
    if isinstance(value, np.ndarray):
        return from_storage(value, spec)
    return value
