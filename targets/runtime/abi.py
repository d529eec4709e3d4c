"""The binary interface between compiled kernels and their callers (see ``docs/abi.md``).

Everything here is plain ctypes and JSON, so a board that only has Python and numpy can call a
kernel library; the LLVM code generator imports the same constants so both sides agree.

A kernel entry has the C signature::

    int32_t tilecraft_fn_<name>(TCValue *args, int32_t *type_codes, int32_t num_args);

``args[i]`` is a ``DLTensor*`` (type code ``TYPE_DLTENSOR``), an ``int64_t`` (``TYPE_INT``) or a
``double`` (``TYPE_FLOAT``). It returns 0 on success; otherwise ``tilecraft_get_last_error()``
gives the message.
"""
from __future__ import annotations

import ctypes
import re

ABI_VERSION = 1

# Packed-argument type codes (the values of DLPack's / TVM's codes, so the numbers look familiar).
TYPE_INT = 0        # args[i].v_int64
TYPE_FLOAT = 2      # args[i].v_float64
TYPE_DLTENSOR = 7   # args[i].v_handle is a DLTensor*
TYPE_CODE_NAMES = {TYPE_INT: "int", TYPE_FLOAT: "float", TYPE_DLTENSOR: "tensor"}

# DLPack data type codes.
DL_INT, DL_UINT, DL_FLOAT, DL_BOOL = 0, 1, 2, 6
DL_CPU = 1

# Exported symbols of every kernel library.
SYMBOL_PREFIX = "tilecraft_fn_"
METADATA_SYMBOL = "tilecraft_metadata"
LAST_ERROR_SYMBOL = "tilecraft_get_last_error"
NUM_THREADS_SYMBOL = "tilecraft_num_threads"
ABI_VERSION_SYMBOL = "tilecraft_abi_version"
# int32_t tilecraft_call_sequence(intptr_t *records, int32_t n, int32_t *failed): n kernel calls,
# records[4i..4i+3] = entry, args, type codes, count; on a failure *failed = i, returns its code
# (in libraries built since the VM's batched calls; older ones lack it)
CALL_SEQUENCE_SYMBOL = "tilecraft_call_sequence"
ERROR_BUFFER_BYTES = 1024


def entry_symbol(name: str) -> str:
    """The C symbol of the kernel called ``name``: ``main -> tilecraft_fn_main``.

    Characters that cannot appear in a C identifier become ``_``.
    """
    return SYMBOL_PREFIX + re.sub(r"[^0-9A-Za-z_]", "_", name)


def dl_dtype(dtype: str) -> tuple[int, int, int]:
    """(code, bits, lanes) of a tilecraft dtype as DLPack writes it; bool is 8 bits wide."""
    m = re.match(r"^(bool|int|uint|float)(\d*)$", dtype)
    if not m:
        raise ValueError(f"dtype {dtype!r} cannot cross the kernel ABI (scalar dtypes only)")
    kind, bits = m.group(1), m.group(2)
    if kind == "bool":
        return DL_BOOL, 8, 1
    code = {"int": DL_INT, "uint": DL_UINT, "float": DL_FLOAT}[kind]
    return code, int(bits), 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    """DLPack's ``DLTensor``: strides (in elements) may be NULL for a compact row-major array."""

    _fields_ = [("data", ctypes.c_void_p),
                ("device", DLDevice),
                ("ndim", ctypes.c_int32),
                ("dtype", DLDataType),
                ("shape", ctypes.c_void_p),     # int64_t*
                ("strides", ctypes.c_void_p),   # int64_t*, or NULL
                ("byte_offset", ctypes.c_uint64)]


class TCValue(ctypes.Union):
    """One packed argument (8 bytes)."""

    _fields_ = [("v_int64", ctypes.c_int64), ("v_float64", ctypes.c_double),
                ("v_handle", ctypes.c_void_p)]


# int32_t entry(TCValue *args, int32_t *type_codes, int32_t num_args)
ENTRY_FUNCTYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
CALL_SEQUENCE_FUNCTYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32,
                                          ctypes.c_void_p)
LAST_ERROR_FUNCTYPE = ctypes.CFUNCTYPE(ctypes.c_char_p)

# Byte offsets of DLTensor's fields: the code generator reads them with these numbers, so the
# structure above and the generated code cannot drift apart.
DLTENSOR_OFFSETS_64 = {"data": 0, "device_type": 8, "device_id": 12, "ndim": 16, "dtype_code": 20,
                       "dtype_bits": 21, "dtype_lanes": 22, "shape": 24, "strides": 32,
                       "byte_offset": 40}
DLTENSOR_OFFSETS_32 = {"data": 0, "device_type": 4, "device_id": 8, "ndim": 12, "dtype_code": 16,
                       "dtype_bits": 17, "dtype_lanes": 18, "shape": 20, "strides": 24,
                       "byte_offset": 32}


def dltensor_offsets(pointer_bits: int) -> dict[str, int]:
    return DLTENSOR_OFFSETS_64 if pointer_bits == 64 else DLTENSOR_OFFSETS_32


def _check_offsets():
    if ctypes.sizeof(ctypes.c_void_p) == 8:
        want = DLTENSOR_OFFSETS_64
    else:
        want = DLTENSOR_OFFSETS_32
    got = {"data": DLTensor.data.offset, "ndim": DLTensor.ndim.offset,
           "shape": DLTensor.shape.offset, "strides": DLTensor.strides.offset,
           "byte_offset": DLTensor.byte_offset.offset}
    for k, v in got.items():
        assert want[k] == v, f"DLTensor layout mismatch at {k}: {v} != {want[k]}"


_check_offsets()
