"""Builtins of the Relax VM: functions it runs in Python on run-time values.

A VM value is a ``targets.NDArray`` (tensors), a tuple of ints (shapes), a Python int / float /
bool (scalars) or a tuple of values. A builtin takes values (and keyword attributes, plain JSON
data from the program) and returns one.

The VM program calls a builtin by name, ``vm.builtin.shape_of`` for instance. A Relax operator
whose legalization is None runs as the builtin registered under the operator's own name
(``relax.shape_of`` -> ``shape_of``); ``relax.build`` refuses an operator that has neither.

This module needs only numpy and the ``targets`` runtime: it runs on the board.

Examples
--------
>>> import numpy as np
>>> from tilecraft import targets
>>> BUILTINS["vm.builtin.shape_of"](targets.array(np.zeros((2, 3), "float32")))
(2, 3)
"""
from __future__ import annotations

import ctypes
from typing import Callable

import numpy as np

from tilecraft.errors import TilecraftError
from tilecraft.targets.runtime.ndarray import NDArray
from tilecraft.targets.runtime.device import cpu

_CPU = cpu(0)
_C0 = ctypes.c_char * 0
_addressof = ctypes.addressof
_new = object.__new__
ALIGNMENT = 64


def address_of(arr: np.ndarray) -> int:
    """The data address of a C-contiguous array, without ``arr.ctypes`` (which costs
    microseconds: this is on the VM's hot path)."""
    if arr.flags.writeable:
        return _addressof(_C0.from_buffer(arr))
    return arr.__array_interface__["data"][0]


def as_ndarray(arr: np.ndarray, ptr: int | None = None) -> NDArray:
    """A CPU NDArray around the C-contiguous ``arr`` (no copy), made without NDArray's
    constructor, which reads the address through the slow ``arr.ctypes``."""
    nd = _new(NDArray)
    nd._data = arr
    nd._device = _CPU
    nd._ptr = address_of(arr) if ptr is None else ptr
    return nd


def aligned_bytes(nbytes: int) -> tuple[np.ndarray, int]:
    """``nbytes`` of uninitialized memory aligned to 64 bytes, and its address."""
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    addr = _addressof(_C0.from_buffer(raw))
    off = -addr % ALIGNMENT
    return raw[off:off + nbytes], addr + off


SMALL_ARRAY_BYTES = 16384


def empty(shape: tuple, dtype: np.dtype) -> NDArray:
    """An uninitialized NDArray: 64-byte aligned, except small ones, which take numpy's
    allocation as it is (element-aligned is all kernels need; aligning costs microseconds, more
    than a small kernel runs)."""
    n = dtype.itemsize
    for d in shape:
        n *= d
    if n < SMALL_ARRAY_BYTES:
        arr = np.empty(shape, dtype)
        return as_ndarray(arr, _addressof(_C0.from_buffer(arr)))
    buf, addr = aligned_bytes(n)
    return as_ndarray(buf.view(dtype).reshape(shape), addr)

BUILTINS: dict[str, Callable] = {}
# Relax operator name -> builtin name, for operators the VM runs itself
OP_BUILTINS: dict[str, str] = {}


def register_builtin(name: str, *op_names: str):
    """Decorator: register ``fn`` as the builtin ``name`` (and for the Relax ops ``op_names``)."""
    def wrap(fn):
        BUILTINS[name] = fn
        for op in op_names:
            OP_BUILTINS[op] = name
        return fn
    return wrap


def _ndarray(x, what: str) -> NDArray:
    if isinstance(x, NDArray):
        return x
    if isinstance(x, np.ndarray):
        return as_ndarray(np.require(x, requirements="C"))
    raise ValueError(f"{what}: expected a tensor, got {type(x).__name__}")


def wrap_array(arr: np.ndarray) -> NDArray:
    """A numpy result as an NDArray (copied to aligned memory unless already contiguous)."""
    if not arr.flags.c_contiguous:
        arr = np.require(arr, requirements="C")
    return as_ndarray(arr)


@register_builtin("vm.builtin.shape_of", "relax.shape_of")
def shape_of(x) -> tuple:
    """The shape of a tensor, as a tuple of ints."""
    return tuple(_ndarray(x, "shape_of").shape)


@register_builtin("vm.builtin.reshape", "relax.reshape")
def reshape(x, shape) -> NDArray:
    """A view of ``x`` with another shape of the same number of elements (no copy)."""
    arr = _ndarray(x, "reshape")._data
    shape = tuple(int(s) for s in shape)
    if int(np.prod(shape, dtype=np.int64)) != arr.size:
        raise ValueError(f"reshape: the element count of the input {arr.shape} ({arr.size}) "
                         f"differs from that of the output {shape}")
    return as_ndarray(arr.reshape(shape))


@register_builtin("vm.builtin.copy")
def copy(x) -> NDArray:
    src = _ndarray(x, "copy")._data
    out = empty(src.shape, src.dtype)
    np.copyto(out._data, src)
    return out


@register_builtin("vm.builtin.make_tuple")
def make_tuple(*fields) -> tuple:
    return tuple(fields)


@register_builtin("vm.builtin.tuple_getitem")
def tuple_getitem(t, index: int):
    if not isinstance(t, tuple):
        raise ValueError(f"TupleGetItem of a non-tuple {type(t).__name__}")
    return t[index]


@register_builtin("vm.builtin.shape_to_tensor", "relax.shape_to_tensor")
def shape_to_tensor(shape) -> NDArray:
    """A shape as a 1-d int64 tensor."""
    return wrap_array(np.asarray(tuple(int(s) for s in shape), dtype=np.int64))


@register_builtin("vm.builtin.tensor_to_shape", "relax.tensor_to_shape")
def tensor_to_shape(x) -> tuple:
    """A 1-d integer tensor as a shape."""
    arr = _ndarray(x, "tensor_to_shape")._data
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"tensor_to_shape: expected a 1-d integer tensor, got {arr.dtype} of "
                         f"shape {arr.shape}")
    return tuple(int(v) for v in arr)


@register_builtin("vm.builtin.null_value", "relax.null_value")
def null_value():
    return None


@register_builtin("vm.builtin.print", "relax.print")
def print_value(*values, format: str = ""):
    texts = [v.numpy() if isinstance(v, NDArray) else v for v in values]
    if format:
        print(format.format(*texts))
    else:
        print(*texts)
    return None


class RuntimeCheckError(TilecraftError, RuntimeError):
    """A run-time check of the program failed (``relax.op.assert_op``): the inputs break a
    condition the model needs, such as a sequence longer than its position table."""


@register_builtin("vm.builtin.assert_op", "relax.assert_op")
def assert_op(condition, *format_args, format: str = ""):
    """Raise ``RuntimeCheckError`` with ``format.format(*format_args)`` unless ``condition``.

    Not a ValueError on purpose: the VM re-raises those as its own ValueError with the builtin's
    name in front, and this message is for the model's user as it is.
    """
    if not bool(condition):
        raise RuntimeCheckError(format.format(*format_args) if format else
                                "a run-time check of the model failed")
    return None


def read_condition(value) -> bool:
    """The truth of an ``If`` condition: a scalar (bool / integer tensor of one element, or a
    Python number)."""
    if isinstance(value, NDArray):
        arr = value._data
        if arr.size != 1:
            raise ValueError(f"If: the condition must be a scalar tensor, got shape {arr.shape}")
        return bool(arr.reshape(()))
    if isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)):
        return bool(value)
    raise ValueError(f"If: the condition must be a scalar, got {type(value).__name__}")


__all__ = ["BUILTINS", "OP_BUILTINS", "RuntimeCheckError", "register_builtin", "read_condition",
           "wrap_array", "as_ndarray", "empty", "aligned_bytes", "address_of"]
