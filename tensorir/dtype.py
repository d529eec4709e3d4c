"""Data types as plain strings: ``"float32"``, ``"int64"``, ``"bool"``, ``"float32x8"`` (8 lanes).

Strings keep the IR JSON-friendly and readable; these helpers are the only place that parses them.
"""
from __future__ import annotations

import functools
import re

import numpy as np

from tilecraft.errors import TilecraftError

SCALAR_TYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64")
HANDLE = "handle"

_RE = re.compile(r"^(bool|int|uint|float)(\d*)(?:x(\d+))?$")


class DataTypeError(TilecraftError, TypeError):
    """A dtype string that names no supported type."""


@functools.lru_cache(maxsize=None)
def parse(dtype: str) -> tuple[str, int, int]:
    """Split a dtype into (code, bits, lanes); code is one of bool/int/uint/float."""
    if dtype == HANDLE:
        return ("handle", 64, 1)
    m = _RE.match(str(dtype))
    if not m:
        raise DataTypeError(f"unknown dtype {dtype!r}; expected one of {', '.join(SCALAR_TYPES)}")
    code, bits, lanes = m.group(1), m.group(2), m.group(3)
    bits_i = 1 if code == "bool" else int(bits or 0)
    if code == "bool" and bits:
        raise DataTypeError(f"unknown dtype {dtype!r}")
    scalar = "bool" if code == "bool" else f"{code}{bits_i}"
    if scalar not in SCALAR_TYPES:
        raise DataTypeError(f"unknown dtype {dtype!r}; expected one of {', '.join(SCALAR_TYPES)}")
    return code, bits_i, int(lanes or 1)


def check(dtype: str) -> str:
    """Return ``dtype`` if it is valid, else raise DataTypeError."""
    parse(dtype)
    return dtype


def code(dtype: str) -> str:
    return parse(dtype)[0]


def bits(dtype: str) -> int:
    return parse(dtype)[1]


def lanes(dtype: str) -> int:
    return parse(dtype)[2]


def element_of(dtype: str) -> str:
    """The scalar type of a vector type: ``float32x8 -> float32``."""
    return dtype.split("x")[0] if "x" in dtype else dtype


def with_lanes(dtype: str, n: int) -> str:
    base = element_of(dtype)
    return base if n == 1 else f"{base}x{n}"


def is_float(dtype: str) -> bool:
    return code(dtype) == "float"


def is_int(dtype: str) -> bool:
    return code(dtype) == "int"


def is_uint(dtype: str) -> bool:
    return code(dtype) == "uint"


def is_integer(dtype: str) -> bool:
    """Signed or unsigned integer (not bool)."""
    return code(dtype) in ("int", "uint")


def is_bool(dtype: str) -> bool:
    return code(dtype) == "bool"


def itemsize(dtype: str) -> int:
    """Bytes of one element in memory (bool is stored as one byte)."""
    c, b, n = parse(dtype)
    return max(1, b // 8) * n


def to_numpy(dtype: str) -> np.dtype:
    return np.dtype("bool" if dtype == "bool" else element_of(dtype))


def from_numpy(np_dtype) -> str:
    name = np.dtype(np_dtype).name
    return check(name)
