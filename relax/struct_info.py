"""Struct info: what a Relax value is — a tensor of some (symbolic) shape and dtype, a shape, a
tuple, a scalar, a function.

Shapes are tuples of ``tensorir`` int64 expressions, so ``TensorStructInfo(("n", 768), "float32")``
(strings become symbolic variables, the same variable for the same name within one call) flows
through every op's shape inference.

Examples
--------
>>> from tilecraft.relax import TensorStructInfo
>>> s = TensorStructInfo(("n", 768), "float32")
>>> s.ndim, s.dtype
(2, 'float32')
"""
from __future__ import annotations

from typing import Sequence

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import IntImm, Node, PrimExpr, TIRError, Var, convert
from tilecraft.tensorir.structural import structural_equal, structural_hash


def make_shape(shape, var_table: dict | None = None) -> tuple[PrimExpr, ...]:
    """Normalize a shape: ints -> IntImm(int64), str -> a symbolic Var (shared per name through
    ``var_table``), PrimExprs kept (cast to int64)."""
    table = {} if var_table is None else var_table
    out = []
    for d in shape:
        if isinstance(d, str):
            if d not in table:
                table[d] = Var(d, "int64")
            d = table[d]
        elif isinstance(d, bool):
            raise TIRError(f"a shape dimension cannot be a bool: {shape!r}")
        elif isinstance(d, int):
            if d < 0:
                raise TIRError(f"negative dimension {d} in shape {tuple(shape)!r}")
            d = IntImm(d, "int64")
        else:
            d = convert(d)
            if not dt.is_integer(d.dtype):
                raise TIRError(f"shape dimension {d!r} must be an integer expression", d)
            if d.dtype != "int64":
                d = d.astype("int64")
        out.append(d)
    return tuple(out)


class StructInfo(Node):
    """Base of all struct infos."""
    __slots__ = ()

    def __eq__(self, other):
        return isinstance(other, StructInfo) and structural_equal(self, other)

    def __hash__(self):
        return structural_hash(self)


class ObjectStructInfo(StructInfo):
    """Anything (no static information)."""
    _fields = ()
    __slots__ = ()

    def __init__(self):
        pass


class PrimStructInfo(StructInfo):
    """A scalar of ``dtype``, optionally with a known ``value`` (a PrimExpr)."""
    _fields = ("dtype", "value")
    __slots__ = ("dtype", "value")

    def __init__(self, dtype: str = "int64", value=None):
        self._init(dtype=dt.check(dtype), value=None if value is None else convert(value))


class ShapeStructInfo(StructInfo):
    """A shape value: ``values`` (tuple of int64 exprs) when known, else only ``ndim`` (-1: any)."""
    _fields = ("values", "ndim")
    __slots__ = ("values", "ndim")

    def __init__(self, values: Sequence | None = None, ndim: int = -1):
        if values is not None:
            values = make_shape(values)
            ndim = len(values)
        self._init(values=values, ndim=int(ndim))


class TensorStructInfo(StructInfo):
    """A tensor: ``shape`` (tuple of int64 exprs, or None when unknown), ``dtype``, ``ndim``
    (-1 when even the rank is unknown)."""
    _fields = ("shape", "dtype", "ndim")
    __slots__ = ("shape", "dtype", "ndim")

    def __init__(self, shape: Sequence | None = None, dtype: str = "float32", ndim: int = -1):
        if shape is not None:
            shape = make_shape(shape)
            if ndim not in (-1, len(shape)):
                raise TIRError(f"TensorStructInfo: ndim {ndim} differs from the shape's rank "
                               f"{len(shape)}")
            ndim = len(shape)
        self._init(shape=shape, dtype=dt.check(dtype), ndim=int(ndim))

    @property
    def is_static(self) -> bool:
        """Every dimension is a constant."""
        return self.shape is not None and all(isinstance(d, IntImm) for d in self.shape)

    def static_shape(self) -> tuple[int, ...] | None:
        if not self.is_static:
            return None
        return tuple(d.value for d in self.shape)

    def __repr__(self):
        if self.shape is None:
            return f"Tensor(ndim={self.ndim}, dtype={self.dtype!r})"
        dims = ", ".join(str(d.value) if isinstance(d, IntImm) else repr(d) for d in self.shape)
        return f"Tensor(({dims}), {self.dtype!r})"


class TupleStructInfo(StructInfo):
    _fields = ("fields",)
    __slots__ = ("fields",)

    def __init__(self, fields: Sequence[StructInfo]):
        self._init(fields=tuple(fields))

    def __repr__(self):
        return "Tuple(" + ", ".join(repr(f) for f in self.fields) + ")"


class FuncStructInfo(StructInfo):
    """A function's parameter and return struct infos (``params`` None: opaque)."""
    _fields = ("params", "ret")
    __slots__ = ("params", "ret")

    def __init__(self, params: Sequence[StructInfo] | None, ret: StructInfo):
        self._init(params=None if params is None else tuple(params), ret=ret)


def shape_of_sinfo(sinfo: StructInfo, what: str = "value") -> tuple[PrimExpr, ...]:
    """The shape of a tensor struct info; raises naming ``what`` if unknown."""
    if not isinstance(sinfo, TensorStructInfo):
        raise TIRError(f"{what} must be a tensor, got {sinfo!r}")
    if sinfo.shape is None:
        raise TIRError(f"{what} has an unknown shape ({sinfo!r}); use match_cast to give it one")
    return sinfo.shape
