"""Structural equality and hashing of IR.

Two nodes are structurally equal when they have the same shape and fields, up to a consistent
renaming of the variables and buffers they *define* (loop variables, block iteration variables,
let variables, function parameters, allocated buffers). Free variables compare by identity.
"""
from __future__ import annotations

from .expr import Let, Node, Var, register_structural
from .function import PrimFunc
from .stmt import Allocate, Block, Buffer, For, IterVar, LetStmt


def _is_array(x) -> bool:
    return type(x).__module__ == "numpy" and type(x).__name__ == "ndarray"


def _definitions(node) -> list:
    """Vars and buffers that ``node`` defines, to be matched positionally."""
    if isinstance(node, For):
        return [node.loop_var]
    if isinstance(node, IterVar):
        return [node.var]
    if isinstance(node, (Let, LetStmt)):
        return [node.var]
    if isinstance(node, Block):
        return list(node.alloc_buffers)
    if isinstance(node, Allocate):
        return [node.buffer]
    if isinstance(node, PrimFunc):
        return list(node.params) + [b for _, b in node.buffer_map]
    defs = getattr(node, "_definitions", None)  # higher IRs (relax) declare their own
    return list(defs()) if defs is not None else []


def _is_leaf(x) -> bool:
    """Variables and buffers: compared through the definition map, not by fields."""
    return isinstance(x, (Var, Buffer)) or getattr(type(x), "_identity_leaf", False)


class _Equal:
    def __init__(self, map_free_vars: bool):
        self.map_free_vars = map_free_vars
        self.lhs_to_rhs: dict[int, object] = {}
        self.rhs_to_lhs: dict[int, object] = {}

    def define(self, a, b) -> bool:
        if type(a) is not type(b):
            return False
        if isinstance(a, Var) and a.dtype != b.dtype:
            return False
        if getattr(type(a), "_identity_leaf", False) and not self.eq(a.struct_info, b.struct_info):
            return False
        prev = self.lhs_to_rhs.get(id(a))
        if prev is not None:
            return prev is b
        self.lhs_to_rhs[id(a)] = b
        self.rhs_to_lhs[id(b)] = a
        if isinstance(a, Buffer):
            return self.buffer_fields(a, b)
        return True

    def buffer_fields(self, a: Buffer, b: Buffer) -> bool:
        # symbolic dims first seen in a defined buffer's shape are defined there too (as in TVM)
        saved, self.map_free_vars = self.map_free_vars, True
        try:
            return (a.dtype == b.dtype and a.scope == b.scope
                    and self.eq(a.shape, b.shape) and self.eq(a.strides, b.strides))
        finally:
            self.map_free_vars = saved

    def leaf(self, a, b) -> bool:
        """Vars and buffers: mapped if defined, else identical (or mapped if map_free_vars)."""
        mapped = self.lhs_to_rhs.get(id(a))
        if mapped is not None:
            return mapped is b
        if id(b) in self.rhs_to_lhs:
            return False
        if a is b:
            return True
        if self.map_free_vars:
            return self.define(a, b)
        return False

    def eq(self, a, b) -> bool:
        if a is b and not _is_leaf(a):
            return True
        if isinstance(a, (tuple, list)):
            return (isinstance(b, (tuple, list)) and len(a) == len(b)
                    and all(self.eq(x, y) for x, y in zip(a, b)))
        if isinstance(a, dict):
            return isinstance(b, dict) and self.eq(tuple(a.items()), tuple(b.items()))
        if _is_array(a) or _is_array(b):
            return (_is_array(a) and _is_array(b) and a.dtype == b.dtype and a.shape == b.shape
                    and bool((a == b).all() if a.dtype.kind != "f" else
                             ((a == b) | ((a != a) & (b != b))).all()))
        if not isinstance(a, Node):
            if isinstance(a, float) and isinstance(b, float) and a != a:
                return b != b  # NaN immediates are the same constant
            return type(a) is type(b) and a == b
        if type(a) is not type(b):
            return False
        if _is_leaf(a):
            return self.leaf(a, b)
        for da, db in zip(_definitions(a), _definitions(b)):
            if not self.define(da, db):
                return False
        if len(_definitions(a)) != len(_definitions(b)):
            return False
        return all(self.eq(getattr(a, f), getattr(b, f)) for f in a._fields)


def structural_equal(a, b, map_free_vars: bool = False) -> bool:
    """True if ``a`` and ``b`` are the same IR up to renaming of defined variables.

    Examples
    --------
    >>> from tilecraft.tensorir import var
    >>> i = var("i")
    >>> structural_equal(i + 1, i + 1)
    True
    >>> structural_equal(i + 1, var("i") + 1)
    False
    """
    return _Equal(map_free_vars).eq(a, b)


def assert_structural_equal(a, b, map_free_vars: bool = False) -> None:
    """Raise AssertionError showing both sides if they are not structurally equal."""
    if not structural_equal(a, b, map_free_vars):
        raise AssertionError(f"not structurally equal:\n--- lhs\n{_show(a)}\n--- rhs\n{_show(b)}")


def _show(x):
    try:
        return x.script()
    except Exception:
        return repr(x)


class _Hasher:
    def __init__(self):
        self.defined: dict[int, int] = {}

    def h(self, x) -> int:
        if isinstance(x, (tuple, list)):
            return hash(("seq",) + tuple(self.h(v) for v in x))
        if isinstance(x, dict):
            return self.h(tuple(x.items()))
        if _is_array(x):
            return hash(("ndarray", x.dtype.str, x.shape, x.tobytes()[:4096]))
        if not isinstance(x, Node):
            return hash((type(x).__name__, x))
        if _is_leaf(x):
            idx = self.defined.get(id(x))
            if idx is not None:
                return hash(("def", idx, type(x).__name__))
            if isinstance(x, Buffer):
                return hash(("buffer", x.name, x.dtype, self.h(x.shape)))
            return hash(("free", id(x)))
        for d in _definitions(x):
            self.defined.setdefault(id(d), len(self.defined))
            if isinstance(d, Buffer):
                for s in d.shape:
                    if isinstance(s, Var):
                        self.defined.setdefault(id(s), len(self.defined))
        return hash((type(x).__name__,) + tuple(self.h(getattr(x, f)) for f in x._fields))


def structural_hash(node) -> int:
    """A hash consistent with ``structural_equal`` (equal nodes hash alike)."""
    return _Hasher().h(node)


# hash(expr) and bool(a == b) of expressions go through these
register_structural(structural_equal, structural_hash)
