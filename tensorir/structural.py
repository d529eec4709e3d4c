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


# What the walks below need to know of a value depends on its type only, so they look it up once
# per type (a dict lookup per node) instead of running ``_is_leaf`` / ``_definitions``' chains of
# isinstance checks on every node: those were half of a structural hash or comparison.
_SEQ, _DICT, _ARRAY, _ATOM, _LEAF, _NODE = range(6)
_KIND: dict[type, int] = {}
_DEFS: dict[type, object] = {}     # node type -> its definitions (node -> list), or None


def _kind(t: type) -> int:
    """The category of values of type ``t`` (the order of the checks is ``_Equal.eq``'s)."""
    k = _KIND.get(t)
    if k is None:
        if issubclass(t, (tuple, list)):
            k = _SEQ
        elif issubclass(t, dict):
            k = _DICT
        elif t.__module__ == "numpy" and t.__name__ == "ndarray":
            k = _ARRAY
        elif not issubclass(t, Node):
            k = _ATOM
        elif issubclass(t, (Var, Buffer)) or getattr(t, "_identity_leaf", False):
            k = _LEAF
        else:
            k = _NODE
            _DEFS[t] = _definitions_of(t)
        _KIND[t] = k
    return k


def _definitions_of(t: type):
    """``_definitions`` for nodes of type ``t``, or None when they define nothing."""
    if issubclass(t, For):
        return lambda n: [n.loop_var]
    if issubclass(t, IterVar):
        return lambda n: [n.var]
    if issubclass(t, (Let, LetStmt)):
        return lambda n: [n.var]
    if issubclass(t, Block):
        return lambda n: list(n.alloc_buffers)
    if issubclass(t, Allocate):
        return lambda n: [n.buffer]
    if issubclass(t, PrimFunc):
        return lambda n: list(n.params) + [b for _, b in n.buffer_map]
    if getattr(t, "_definitions", None) is not None:
        return lambda n: list(n._definitions())
    return None


def _floats_equal(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a:
        return b != b  # NaN immediates are the same constant
    return type(a) is type(b) and a == b


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
        t = type(a)
        k = _KIND.get(t)
        if k is None:
            k = _kind(t)
        if a is b and k != _LEAF:
            return True
        if k == _SEQ:
            if not isinstance(b, (tuple, list)) or len(a) != len(b):
                return False
            eq = self.eq
            for x, y in zip(a, b):
                if not eq(x, y):
                    return False
            return True
        if k == _DICT:
            return isinstance(b, dict) and self.eq(tuple(a.items()), tuple(b.items()))
        if k == _ARRAY or _is_array(b):
            return (_is_array(a) and _is_array(b) and a.dtype == b.dtype and a.shape == b.shape
                    and bool((a == b).all() if a.dtype.kind != "f" else
                             ((a == b) | ((a != a) & (b != b))).all()))
        if k == _ATOM:
            return _floats_equal(a, b)
        if t is not type(b):
            return False
        if k == _LEAF:
            return self.leaf(a, b)
        defs = _DEFS[t]
        if defs is not None:
            da, db = defs(a), defs(b)
            for x, y in zip(da, db):
                if not self.define(x, y):
                    return False
            if len(da) != len(db):
                return False
        eq = self.eq
        for f in a._fields:
            if not eq(getattr(a, f), getattr(b, f)):
                return False
        return True


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
        t = type(x)
        k = _KIND.get(t)
        if k is None:
            k = _kind(t)
        if k == _NODE:
            defs = _DEFS[t]
            if defs is not None:
                defined = self.defined
                for d in defs(x):
                    defined.setdefault(id(d), len(defined))
                    if isinstance(d, Buffer):
                        for s in d.shape:
                            if isinstance(s, Var):
                                defined.setdefault(id(s), len(defined))
            h = self.h
            return hash((t.__name__,) + tuple([h(getattr(x, f)) for f in x._fields]))
        if k == _LEAF:
            idx = self.defined.get(id(x))
            if idx is not None:
                return hash(("def", idx, t.__name__))
            if isinstance(x, Buffer):
                return hash(("buffer", x.name, x.dtype, self.h(x.shape)))
            return hash(("free", id(x)))
        if k == _SEQ:
            h = self.h
            return hash(("seq",) + tuple([h(v) for v in x]))
        if k == _DICT:
            return self.h(tuple(x.items()))
        if k == _ARRAY:
            # the first 4096 bytes, without copying the whole array to bytes
            head = x.reshape(-1)[:max(1, 4096 // max(1, x.itemsize))]
            return hash(("ndarray", x.dtype.str, x.shape, head.tobytes()[:4096]))
        if t is float and x != x:
            return hash(("float", "nan"))   # hash(nan) is the object's id: equal NaNs, one hash
        return hash((t.__name__, x))


def structural_hash(node) -> int:
    """A hash consistent with ``structural_equal`` (equal nodes hash alike)."""
    return _Hasher().h(node)


# hash(expr) and bool(a == b) of expressions go through these
register_structural(structural_equal, structural_hash)
