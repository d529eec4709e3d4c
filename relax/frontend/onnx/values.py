"""What the ONNX importer knows about a value (``Value``), and what a converter may return
besides a Relax expression: an import-time result (``Known``) or several tensors (``Tensors``).

The importer, the import-time folding rules (``known.py``) and the converters (``ops/``) share
these.
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.expr import IntImm

from ...expr import Expr
from ...struct_info import TensorStructInfo

__all__ = ["Value", "Known", "Tensors"]


class Value:
    """What the importer knows about one ONNX value: a Relax expression, an import-time value
    (numpy; an object array of ints and PrimExprs for symbolic integers), or both."""

    __slots__ = ("expr", "known", "dtype", "logical", "dq")

    def __init__(self, expr: Expr | None = None, known: np.ndarray | None = None,
                 dtype: str | None = None, logical: str | None = None, dq=None):
        self.expr = expr
        self.known = known
        # the output of a DequantizeLinear: its integer source (ops/quant.py ``Dequantized``),
        # which consumers (MatMul, Gemm, Conv) may compute on directly as int8 kernels
        self.dq = dq
        # a type without a tilecraft dtype ("bfloat16", "float8e4m3fn", "int4"...): the value
        # holds its storage (lowbit.py)
        self.logical = logical
        if dtype is None:
            if known is not None and known.dtype != object:
                dtype = str(known.dtype)
            elif expr is not None and isinstance(expr.struct_info, TensorStructInfo):
                dtype = expr.struct_info.dtype
        self.dtype = dtype

    @property
    def shape(self):
        if self.expr is not None and isinstance(self.expr.struct_info, TensorStructInfo):
            return self.expr.struct_info.shape
        if self.known is not None:
            return tuple(IntImm(d, "int64") for d in self.known.shape)
        return None

    def __repr__(self):
        return f"Value(expr={self.expr!r}, known={self.known!r}, dtype={self.dtype})"


class Known:
    """A converter result computed at import time: ``Known(array)`` or ``Known(obj_array,
    "int64")`` for symbolic integers."""

    __slots__ = ("array", "dtype")

    def __init__(self, array, dtype: str | None = None):
        self.array = np.asarray(array) if not isinstance(array, np.ndarray) else array
        self.dtype = dtype or str(self.array.dtype)


class Tensors:
    """A converter result standing for several tensors that the importer keeps as a Relax tuple
    (ONNX sequences)."""

    __slots__ = ("items",)

    def __init__(self, items):
        self.items = list(items)
