"""The canonical form of integer expressions: linear sums of atoms.

A ``Sum`` is ``const + sum(coeff * atom)``. An atom is either

- a ``Split`` ``(index // lower) % upper`` of a ``Sum`` by positive constants (``upper`` None means
  no modulo) -- the shape every loop split and fuse produces, which lets ``(i // 4) * 4 + i % 4``
  merge back into ``i`` -- or
- any other (already simplified) integer ``PrimExpr``: a ``Var``, a product of non-constant
  factors (a monomial, factors sorted), ``Min``, ``Max``, ``Select``, a ``BufferLoad``, ...

Atoms are identified by a structural *key* (a tuple; variables by identity), and terms are
ordered by key, which puts variables first, sorted by name. This module is pure algebra; the
rules that need bounds (division, merging splits) are in ``analyzer``.
"""
from __future__ import annotations

from .const_fold import wrap_int
from ..expr import (Add, BinaryOp, BufferLoad, Call, Cast, FloatImm, FloorDiv, FloorMod, IntImm,
                    Let, Mul, Not, PrimExpr, Select, StringImm, Sub, Var)

# ---------------------------------------------------------------------------------------------
# structural keys

_KEYS: dict[int, tuple] = {}  # id(node) -> (node, key); holding the node keeps its id unique
_KEYS_LIMIT = 1 << 17

# rank, the first element of every key, orders terms: variables, then splits, then the rest
_RANK_VAR, _RANK_SPLIT, _RANK_NODE, _RANK_IMM = 0, 1, 2, 9


def expr_key(e: PrimExpr) -> tuple:
    """A hashable, orderable key: equal keys iff structurally equal (free vars by identity)."""
    hit = _KEYS.get(id(e))
    if hit is not None and hit[0] is e:
        return hit[1]
    k = _compute_key(e)
    if len(_KEYS) >= _KEYS_LIMIT:
        _KEYS.clear()
    _KEYS[id(e)] = (e, k)
    return k


def _compute_key(e) -> tuple:
    t = type(e)
    if t is Var:
        return (_RANK_VAR, "Var", e.name, e.dtype, id(e))
    if t is IntImm:
        return (_RANK_IMM, "IntImm", e.dtype, e.value)
    if t is FloatImm:
        return (_RANK_IMM, "FloatImm", e.dtype, repr(e.value))
    if isinstance(e, BinaryOp):
        return (_RANK_NODE, t.__name__, e.dtype, expr_key(e.a), expr_key(e.b))
    if t is Not:
        return (_RANK_NODE, "Not", e.dtype, expr_key(e.a))
    if t is Select:
        return (_RANK_NODE, "Select", e.dtype, expr_key(e.condition), expr_key(e.true_value),
                expr_key(e.false_value))
    if t is Cast:
        return (_RANK_NODE, "Cast", e.dtype, expr_key(e.value))
    if t is Call:
        return (_RANK_NODE, "Call", e.dtype, e.op, tuple(expr_key(a) for a in e.args))
    if t is BufferLoad:
        return (_RANK_NODE, "BufferLoad", e.dtype, e.buffer.name, id(e.buffer),
                tuple(expr_key(i) for i in e.indices))
    if t is Let:
        return (_RANK_NODE, "Let", e.dtype, expr_key(e.var), expr_key(e.value), expr_key(e.body))
    if t is StringImm:
        return (_RANK_IMM, "StringImm", "handle", e.value)
    # anything else (Reduce, user subclasses) is only equal to itself
    return (_RANK_NODE, "~" + t.__name__, e.dtype, id(e))


# ---------------------------------------------------------------------------------------------
# sums and splits


class Split:
    """The atom ``(index // lower) % upper`` (``upper`` None: no modulo), ``lower >= 1``."""

    __slots__ = ("index", "lower", "upper", "key", "_expr")

    def __init__(self, index: "Sum", lower: int, upper: int | None):
        self.index = index
        self.lower = lower
        self.upper = upper
        self.key = (_RANK_SPLIT, "Split", index.key, lower, upper or 0)
        self._expr = None

    @property
    def dtype(self) -> str:
        return self.index.dtype

    def expr(self) -> PrimExpr:
        if self._expr is None:
            e = self.index.expr()
            d = self.index.dtype
            if self.lower != 1:
                e = FloorDiv(e, IntImm(self.lower, d))
            if self.upper is not None:
                e = FloorMod(e, IntImm(self.upper, d))
            self._expr = e
        return self._expr


def atom_key(atom) -> tuple:
    return atom.key if type(atom) is Split else expr_key(atom)


def atom_expr(atom) -> PrimExpr:
    return atom.expr() if type(atom) is Split else atom


class Sum:
    """``const + sum(coeff * atom)``; treat as immutable once built.

    ``terms`` maps an atom key to ``(atom, coeff)`` with ``coeff != 0``.
    """

    __slots__ = ("terms", "const", "dtype", "_key", "_expr", "_sorted")

    def __init__(self, terms: dict, const: int, dtype: str):
        self.terms = terms
        self.const = const
        self.dtype = dtype
        self._key = None
        self._expr = None
        self._sorted = None

    @staticmethod
    def of_const(value: int, dtype: str) -> "Sum":
        return Sum({}, value, dtype)

    @staticmethod
    def of_atom(atom, dtype: str, coeff: int = 1) -> "Sum":
        return Sum({atom_key(atom): (atom, coeff)}, 0, dtype)

    def is_const(self) -> bool:
        return not self.terms

    def sorted_terms(self) -> list:
        """``[(key, atom, coeff)]`` in key order."""
        if self._sorted is None:
            # the keys are distinct, so the triples compare by their keys alone (no key
            # function to call); most sums have one term, nothing to sort
            items = [(k, a, c) for k, (a, c) in self.terms.items()]
            if len(items) > 1:
                items.sort()
            self._sorted = items
        return self._sorted

    @property
    def key(self) -> tuple:
        if self._key is None:
            self._key = (self.dtype, tuple((k, c) for k, _, c in self.sorted_terms()), self.const)
        return self._key

    def single_atom(self):
        """``atom`` if this sum is exactly ``1 * atom``, else None."""
        if self.const == 0 and len(self.terms) == 1:
            (atom, c), = self.terms.values()
            if c == 1:
                return atom
        return None

    def coeff(self, key) -> int:
        t = self.terms.get(key)
        return 0 if t is None else t[1]

    def expr(self) -> PrimExpr:
        """The canonical ``PrimExpr``: positive terms, then subtracted ones, then the constant."""
        if self._expr is None:
            self._expr = _build_expr(self)
        return self._expr

    def __repr__(self):
        return f"Sum({self.expr()!r})"


_IMMS: dict[tuple, IntImm] = {}


def _imm(v: int, dtype: str) -> IntImm:
    # immediates are immutable, so the small ones are shared (building one parses its dtype)
    key = (v, dtype)
    e = _IMMS.get(key)
    if e is None:
        e = IntImm(wrap_int(v, dtype), dtype)
        if -1024 <= v <= 1024 and len(_IMMS) < 8192:
            _IMMS[key] = e
    return e


def _term(atom, c: int, dtype: str) -> PrimExpr:
    e = atom_expr(atom)
    return e if c == 1 else Mul(e, _imm(c, dtype))


def _build_expr(s: Sum) -> PrimExpr:
    d = s.dtype
    terms = s.sorted_terms()
    res = None
    const = s.const
    for _, a, c in terms:
        if c > 0:
            t = _term(a, c, d)
            res = t if res is None else Add(res, t)
    if res is None and (const != 0 or terms):
        res, const = _imm(const, d), 0
    for _, a, c in terms:
        if c < 0:
            res = Sub(res, _term(a, -c, d))
    if res is None:
        return _imm(0, d)
    if const > 0:
        res = Add(res, _imm(const, d))
    elif const < 0:
        res = Sub(res, _imm(-const, d))
    return res


# ---------------------------------------------------------------------------------------------
# algebra


class SumBuilder:
    """Accumulates ``sign * sum`` pieces in place (a long chain of adds costs linear time)."""

    __slots__ = ("terms", "const", "dtype")

    def __init__(self, dtype: str):
        self.terms: dict = {}
        self.const = 0
        self.dtype = dtype

    def add(self, s: Sum, k: int = 1) -> None:
        self.const += k * s.const
        terms = self.terms
        for key, (a, c) in s.terms.items():
            old = terms.get(key)
            if old is None:
                terms[key] = (a, k * c)
            else:
                nc = old[1] + k * c
                if nc == 0:
                    del terms[key]
                else:
                    terms[key] = (old[0], nc)

    def add_atom(self, atom, c: int, key=None) -> None:
        if c == 0:
            return
        key = atom_key(atom) if key is None else key
        old = self.terms.get(key)
        if old is None:
            self.terms[key] = (atom, c)
        elif old[1] + c == 0:
            del self.terms[key]
        else:
            self.terms[key] = (old[0], old[1] + c)

    def finish(self) -> Sum:
        return Sum(self.terms, self.const, self.dtype)


def add(a: Sum, b: Sum, k: int = 1) -> Sum:
    """``a + k * b``."""
    if not b.terms:
        if b.const == 0:
            return a
        return Sum(a.terms, a.const + k * b.const, a.dtype)
    sb = SumBuilder(a.dtype)
    sb.terms = dict(a.terms)
    sb.const = a.const
    sb.add(b, k)
    return sb.finish()


def sub(a: Sum, b: Sum) -> Sum:
    return add(a, b, -1)


def add_const(a: Sum, c: int) -> Sum:
    return a if c == 0 else Sum(a.terms, a.const + c, a.dtype)


def scale(a: Sum, k: int) -> Sum:
    if k == 1:
        return a
    if k == 0:
        return Sum({}, 0, a.dtype)
    return Sum({key: (at, c * k) for key, (at, c) in a.terms.items()}, a.const * k, a.dtype)


def factors(e: PrimExpr) -> list:
    """The factors of a monomial atom (a ``Mul`` chain of non-constant atoms)."""
    if type(e) is Mul and type(e.a) is not IntImm and type(e.b) is not IntImm:
        return factors(e.a) + factors(e.b)
    return [e]


def monomial(fs: list) -> PrimExpr:
    """The canonical product of non-constant factors: sorted by key, left-associated."""
    fs = sorted(fs, key=expr_key)
    e = fs[0]
    for f in fs[1:]:
        e = Mul(e, f)
    return e
