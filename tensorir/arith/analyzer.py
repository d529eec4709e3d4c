"""``Analyzer``: canonical simplification, constant bounds, symbolic interval sets and proofs.

Integer expressions are put in a canonical form (``linear.Sum``: constant + coefficients x atoms)
and rebuilt from it, so ``i*4 + j - i*4`` becomes ``j`` and every loop split / fuse index pattern
folds back: ``(i // 4) * 4 + i % 4 -> i``, ``(i*7 + j) // 7 -> i`` when ``0 <= j < 7``.
Comparisons, ``Min``, ``Max`` and ``Select`` are decided from bounds: the constant interval of
every atom (from ``bind``, ``update_bound``, ``with_constraint`` and the atom's own shape) and,
when that is not enough, linear *facts* such as ``n - 1 - i >= 0`` that a symbolic range
``i in [0, n)`` gives, and case splits of ``min`` / ``max`` / ``select`` terms: ``min(u, h - 1) <
h`` holds because its second operand is ``< h``, and the clamp check ``max(min(u, h - 1), 0) < h``
simplifies to ``0 < h``. The proof search is bounded (facts chained, cases split, nesting) and a
search that would re-enter itself gives up: the answer is then "not proven", never a wrong proof.

Everything is exact integer reasoning under the usual premise of index analysis: integer
arithmetic does not overflow (unsigned types included: ``x - 1`` of a ``uint`` is not assumed to
wrap). Folded constants do wrap to their dtype, like the machine operation. Float expressions
are only constant-folded (plus ``x * 1.0``, ``x + 0.0``), never reassociated.

    >>> from tilecraft.tensorir import var, Range
    >>> from tilecraft.tensorir.arith import Analyzer
    >>> i, j = var("i"), var("j")
    >>> ana = Analyzer()
    >>> ana.bind(j, Range(0, 8))
    >>> ana.simplify((i * 8 + j) // 8)
    i
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
from math import gcd
from typing import Iterable, Mapping

from .. import dtype as dt
from ..expr import (EQ, GE, GT, LE, LT, NE, Add, And, BinaryOp, BufferLoad, Call, Cast, Div,
                    FloatImm, FloorDiv, FloorMod, IntImm, Let, Max, Min, Mod, Mul, Not, Or,
                    PrimExpr, Select, Sub, TIRError, Var, convert)
from ..functor import substitute
from ..stmt import Range
from . import bound as ib
from .bound import EVERYTHING, NEG_INF, POS_INF, ConstIntBound
from .const_fold import fold_binary, fold_cast, fold_intrinsic, int_range, wrap_int
from .interval import IntervalSet
from .interval import NEG_INF as SET_NEG_INF
from .interval import POS_INF as SET_POS_INF
from .linear import (Split, Sum, SumBuilder, atom_expr, atom_key, expr_key, factors, monomial,
                     scale, sub)
from .linear import add as sum_add
from .linear import add_const

_MEMO_LIMIT = 1 << 16
_EXPAND_LIMIT = 16  # most pairwise products expanded when multiplying two sums
_PROOF_DEPTH = 2  # facts chained per proof
_CASE_SPLITS = 4  # min / max / select atoms split into cases per proof
# Proofs nest: a proof needs the bounds of an atom, the bounds need the atom's operands
# simplified, and simplifying them (a min, a division) starts proofs of its own. Past this many
# nested proof searches a proof falls back to constant bounds ("unknown", never a wrong "true").
_MAX_PROOF_NESTING = 12

_SCALAR_INT: dict[str, bool] = {}


def _is_scalar_int(dtype: str) -> bool:
    r = _SCALAR_INT.get(dtype)
    if r is None:
        c, _, lanes = dt.parse(dtype)
        r = _SCALAR_INT[dtype] = c in ("int", "uint") and lanes == 1
    return r


@contextlib.contextmanager
def _deep_recursion(limit: int = 20000):
    # The simplifier recurses over expression trees; lowering builds trees a few hundred nodes
    # deep, which would pass Python's default limit of 1000 frames.
    old = sys.getrecursionlimit()
    if old < limit:
        sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        if old < limit:
            sys.setrecursionlimit(old)


def _is_true(e) -> bool:
    return type(e) is IntImm and e.value != 0


def _bool(value: bool, dtype: str = "bool") -> IntImm:
    return IntImm(1 if value else 0, dtype)


_NEGATE_CMP = {LT: GE, LE: GT, GT: LE, GE: LT, EQ: NE, NE: EQ}
_CMP_TYPES = (EQ, NE, LT, LE, GT, GE)

# Facts every Analyzer made inside ``assume(...)`` starts from (a context variable: each thread
# and each asyncio task sees its own).
_ASSUMED: contextvars.ContextVar[tuple] = contextvars.ContextVar("tilecraft_arith_assumed",
                                                                 default=())


@contextlib.contextmanager
def assume(*conds):
    """A context in which every new ``Analyzer`` takes ``conds`` as known facts.

    A frontend that knows facts about its symbolic dims (``seq <= 64`` from a
    ``torch.export.Dim``, or a condition it checks at run time) imports a model inside this
    context, so the shape inference of every operator, which makes its own ``Analyzer``, proves
    what those facts imply: ``min(seq, 128)`` simplifies to ``seq``. Nested contexts add up.

    Examples
    --------
    >>> from tilecraft.tensorir import var
    >>> from tilecraft.tensorir.expr import min_
    >>> seq = var("seq")
    >>> with assume(seq <= 64, seq >= 0):
    ...     Analyzer().simplify(min_(seq, 128))
    seq
    >>> Analyzer().can_prove(seq <= 64)
    False
    """
    facts = []
    for c in conds:
        c = convert(c)
        if not dt.is_bool(c.dtype):
            raise TIRError(f"arith.assume needs bool conditions, got {c!r} of {c.dtype}", c)
        facts.append(c)
    token = _ASSUMED.set(_ASSUMED.get() + tuple(facts))
    try:
        yield
    finally:
        _ASSUMED.reset(token)


class Analyzer:
    """Integer analysis with a context of known facts about variables.

    Examples
    --------
    >>> from tilecraft.tensorir import var, Range
    >>> i, n = var("i"), var("n")
    >>> ana = Analyzer()
    >>> ana.bind(i, Range(0, n))
    >>> ana.can_prove(i < n)
    True
    >>> ana.simplify((i // 4) * 4 + i % 4)
    i
    >>> with ana.with_constraint(n <= 16):
    ...     ana.can_prove(i < 16)
    True
    """

    def __init__(self):
        self._subst: dict[Var, PrimExpr] = {}  # var == expr (bind with an expression)
        self._ranges: dict[Var, Range] = {}  # var in Range (bind with a Range)
        self._range_bound: dict[tuple, tuple[int, int]] = {}  # atom key -> bound from bind
        self._extra_bound: dict[tuple, tuple[int, int]] = {}  # update_bound and constraints
        self._range_facts: dict[Var, list[Sum]] = {}  # linear sums known to be >= 0
        self._facts: list[Sum] = []  # from with_constraint
        self._known: dict[tuple, bool] = {}  # truth of conditions assumed by with_constraint
        self._all_facts: list[Sum] | None = None
        self._canon_memo: dict[int, tuple] = {}
        self._simpl_memo: dict[int, tuple] = {}
        self._bound_memo: dict[tuple, tuple[int, int]] = {}
        self._prove_memo: dict[tuple, tuple[bool, int]] = {}
        self._vars_memo: dict[tuple, tuple] = {}
        self._generation = 0   # counts the changes of what is known (``_changed``)
        # Re-entrancy guards of the proof search (see _canon and _prove_nonneg): the ids of
        # expressions being canonicalized, the proofs in progress, how deeply proof searches
        # nest, and a count of the searches cut short (their failures are not memoized).
        self._canon_active: set[int] = set()
        self._proving: set[tuple] = set()
        self._proof_nesting = 0
        self._cutoffs = 0
        assumed = _ASSUMED.get()
        if assumed:
            self._assume_all(assumed)

    # =========================================================================================
    # knowledge

    def bind(self, var: Var, value, allow_override: bool = True) -> None:
        """Bind ``var`` to a ``Range`` (``min <= var < min + extent``) or to an expression
        (``var == value``; the simplifier substitutes it). A new binding replaces the old one.

        Examples
        --------
        >>> from tilecraft.tensorir import var, Range
        >>> i = var("i")
        >>> ana = Analyzer()
        >>> ana.bind(i, Range(0, 8))
        >>> ana.can_prove(i < 8)
        True
        """
        if not isinstance(var, Var):
            raise TIRError(f"Analyzer.bind: expected a Var, got {var!r}", var)
        if not allow_override and (var in self._ranges or var in self._subst):
            raise TIRError(f"Analyzer.bind: {var.name} is already bound", var)
        self._unbind(var)
        if isinstance(value, Range):
            if not _is_scalar_int(var.dtype):
                raise TIRError(f"Analyzer.bind: a Range needs an integer var, {var.name} is "
                               f"{var.dtype}", var)
            mn = self._as_dtype(value.min, var, "min")
            ext = self._as_dtype(value.extent, var, "extent")
            with _deep_recursion():
                mn_s, ext_s = self._canon(mn), self._canon(ext)
                if ext_s.is_const() and ext_s.const == 1:
                    self._subst[var] = mn_s.expr()
                else:
                    hi_s = add_const(sum_add(mn_s, ext_s), -1)
                    self._ranges[var] = Range(mn_s.expr(), ext_s.expr())
                    key = expr_key(var)
                    self._range_bound[key] = (self._bound_sum(mn_s)[0], self._bound_sum(hi_s)[1])
                    facts = []
                    v = Sum.of_atom(var, var.dtype)
                    if not mn_s.is_const():
                        facts.append(sub(v, mn_s))
                    if not hi_s.is_const():
                        facts.append(sub(hi_s, v))
                    if facts:
                        self._range_facts[var] = facts
        else:
            value = self._as_dtype(value, var, "value")
            with _deep_recursion():
                self._subst[var] = self._simpl(value)
        self._changed()

    def update_bound(self, var: Var, lo: int | None, hi: int | None) -> None:
        """Assume ``lo <= var <= hi`` (inclusive; None for no bound), on top of what is known.

        Examples
        --------
        >>> from tilecraft.tensorir import var
        >>> n = var("n")
        >>> ana = Analyzer()
        >>> ana.update_bound(n, 1, None)
        >>> ana.can_prove(n > 0)
        True
        """
        e = convert(var)
        if not _is_scalar_int(e.dtype):
            raise TIRError(f"Analyzer.update_bound: {e!r} is not a scalar integer", e)
        with _deep_recursion():
            s = self._canon(e)
        key = atom_key(s.single_atom()) if s.single_atom() is not None else None
        if key is None:
            raise TIRError(f"Analyzer.update_bound: {e!r} is not a variable", e)
        new = (NEG_INF if lo is None else int(lo), POS_INF if hi is None else int(hi))
        old = self._extra_bound.get(key)
        self._extra_bound[key] = new if old is None else ib.intersect(old, new)
        self._changed()

    @contextlib.contextmanager
    def with_constraint(self, cond):
        """A context in which ``cond`` is assumed true (``i < n``, ``a and b``, ``x == 4``, ...).

        Examples
        --------
        >>> from tilecraft.tensorir import var
        >>> i, n = var("i"), var("n")
        >>> ana = Analyzer()
        >>> with ana.with_constraint(i < n):
        ...     ana.can_prove(i < n + 1)
        True
        >>> ana.can_prove(i < n + 1)
        False
        """
        cond = convert(cond)
        if not dt.is_bool(cond.dtype):
            raise TIRError(f"with_constraint needs a bool condition, got {cond!r} of {cond.dtype}",
                           cond)
        saved = (dict(self._extra_bound), list(self._facts), dict(self._known))
        outer = (self._generation, self._canon_memo, self._simpl_memo, self._bound_memo,
                 self._prove_memo)
        # new tables before assuming: what assuming computes part-way (the facts of one side
        # of an ``and`` known, the other's not yet) must not land in the entry state's tables
        self._changed()
        self._assume_all([cond])
        inner = self._generation
        try:
            yield self
        finally:
            self._extra_bound, self._facts, self._known = saved
            if self._generation == inner:
                # nothing else changed inside (no bind, no bound, no constraint left in
                # place): what is known is again exactly what it was on entry, and so are the
                # memo tables of that state (``_changed`` made new ones for the inner state)
                (self._generation, self._canon_memo, self._simpl_memo, self._bound_memo,
                 self._prove_memo) = outer
                self._all_facts = None
            else:
                self._changed()

    def _assume_all(self, conds) -> None:
        with _deep_recursion():
            for cond in conds:
                simplified = self._simpl(cond)
                self._assume(simplified)
                if simplified is not cond:
                    # Simplifying may split a comparison of a min / max into its undecided case
                    # (``max(x, 0) < n`` into ``0 < n`` where ``x < n`` is known): keep the
                    # facts of the comparison as written too, they bound the whole min / max.
                    self._assume(cond)
                self._changed()

    def _as_dtype(self, e, var: Var, what: str) -> PrimExpr:
        e = convert(e, var)
        if e.dtype == var.dtype:
            return e
        if isinstance(e, IntImm) and _is_scalar_int(var.dtype):
            return IntImm(e.value, var.dtype)
        if not (_is_scalar_int(e.dtype) or dt.is_bool(e.dtype)) and _is_scalar_int(var.dtype):
            raise TIRError(f"Analyzer.bind: {what} {e!r} of {var.name} has dtype {e.dtype}", e)
        return Cast(var.dtype, e)

    def _unbind(self, var: Var) -> None:
        self._subst.pop(var, None)
        self._ranges.pop(var, None)
        self._range_bound.pop(expr_key(var), None)
        self._range_facts.pop(var, None)

    def _changed(self) -> None:
        # new tables rather than cleared ones: ``with_constraint`` keeps its entry state's
        # tables and takes them back on exit when nothing else changed inside
        self._canon_memo = {}
        self._simpl_memo = {}
        self._bound_memo = {}
        self._prove_memo = {}
        self._all_facts = None
        self._generation += 1

    def _assume(self, cond: PrimExpr) -> None:
        t = type(cond)
        if t is IntImm:
            return  # true adds nothing; false makes the context dead, nothing to learn soundly
        if t is And:
            self._assume(cond.a)
            self._assume(cond.b)
            return
        self._known[expr_key(cond)] = True
        if t is Not:
            inner = cond.a
            self._known[expr_key(inner)] = False
            if type(inner) in _NEGATE_CMP and _is_scalar_int(inner.a.dtype):
                self._assume(_NEGATE_CMP[type(inner)](inner.a, inner.b))
            return
        if t in _NEGATE_CMP and _is_scalar_int(cond.a.dtype):
            self._known[expr_key(_NEGATE_CMP[t](cond.a, cond.b))] = False
            a, b = self._canon(cond.a), self._canon(cond.b)
            d = sub(a, b)  # the condition compares d with 0
            facts = {LT: [add_const(scale(d, -1), -1)], LE: [scale(d, -1)],
                     GT: [add_const(d, -1)], GE: [d], EQ: [d, scale(d, -1)], NE: []}[t]
            for f in facts:
                self._add_fact(f)

    def _add_fact(self, f: Sum) -> None:
        """Record ``f >= 0``: as a bound if ``f`` has one atom, else as a linear fact."""
        if not f.terms:
            return
        if len(f.terms) == 1:
            (key, (atom, c)), = f.terms.items()
            k = f.const
            # c*a + k >= 0
            new = (-(k // c), POS_INF) if c > 0 else (NEG_INF, k // (-c))
            old = self._extra_bound.get(key)
            self._extra_bound[key] = new if old is None else ib.intersect(old, new)
            return
        if all(g.key != f.key for g in self._facts):
            self._facts.append(f)
        # Each atom's bound implied by the fact and the others' bounds, rounded to integers:
        # ``tx + 16*ty < 128`` with tx >= 0 gives ty <= 7, which the linear facts alone (over
        # the rationals: ty < 8) do not (a GPU tile fetch guarded by the thread's linear id).
        for key, (atom, c) in f.terms.items():
            rest = Sum({k: v for k, v in f.terms.items() if k != key}, f.const, f.dtype)
            rhi = self._bound_sum(rest)[1]
            if ib.is_inf(rhi):
                continue
            # c*a >= -rest >= -rhi
            new = (-(rhi // c), POS_INF) if c > 0 else (NEG_INF, rhi // (-c))
            old = self._extra_bound.get(key)
            self._extra_bound[key] = new if old is None else ib.intersect(old, new)

    def _facts_list(self) -> list[Sum]:
        if self._all_facts is None:
            fs = []
            for lst in self._range_facts.values():
                fs.extend(lst)
            fs.extend(self._facts)
            self._all_facts = fs
        return self._all_facts

    # =========================================================================================
    # public queries

    def simplify(self, expr) -> PrimExpr:
        """The canonical simplified form of ``expr`` (equal to it wherever the known facts hold).

        Examples
        --------
        >>> from tilecraft.tensorir import var
        >>> i, j = var("i"), var("j")
        >>> Analyzer().simplify(i * 4 + j - i * 4)
        j
        """
        e = self._check_expr(expr, "simplify")
        with _deep_recursion():
            return self._simpl(e)

    def const_int_bound(self, expr) -> ConstIntBound:
        """Constant bounds of an integer expression (bool: [0, 1]; anything else: everything).

        Examples
        --------
        >>> from tilecraft.tensorir import var, Range
        >>> i = var("i")
        >>> ana = Analyzer()
        >>> ana.bind(i, Range(0, 8))
        >>> ana.const_int_bound(i * 2 - 1)
        ConstIntBound[-1, 13]
        """
        e = self._check_expr(expr, "const_int_bound")
        with _deep_recursion():
            if _is_scalar_int(e.dtype):
                return ConstIntBound(*self._bound_sum(self._canon(e)))
            if dt.is_bool(e.dtype):
                s = self._simpl(e)
                if type(s) is IntImm:
                    return ConstIntBound(s.value, s.value)
                return ConstIntBound(0, 1)
        return ConstIntBound(NEG_INF, POS_INF)

    def can_prove(self, cond) -> bool:
        """True only if ``cond`` holds for every value the known facts allow.

        Examples
        --------
        >>> from tilecraft.tensorir import var, Range
        >>> i = var("i")
        >>> ana = Analyzer()
        >>> ana.bind(i, Range(0, 8))
        >>> ana.can_prove(i * 2 < 16), ana.can_prove(i * 2 < 14)
        (True, False)
        """
        e = self._check_expr(cond, "can_prove")
        if not dt.is_bool(e.dtype):
            raise TIRError(f"can_prove needs a bool condition, got {e!r} of {e.dtype}", e)
        with _deep_recursion():
            r = self._simpl(e)
        return _is_true(r)

    def can_prove_equal(self, a, b) -> bool:
        """True only if ``a == b`` for every value the known facts allow.

        Examples
        --------
        >>> from tilecraft.tensorir import var
        >>> i = var("i")
        >>> Analyzer().can_prove_equal((i // 4) * 4 + i % 4, i)
        True
        """
        a = self._check_expr(a, "can_prove_equal")
        b = convert(b, a)
        with _deep_recursion():
            if _is_scalar_int(a.dtype) and _is_scalar_int(b.dtype):
                d = self._normalize(sub(self._canon(a), self._canon(b)))
                return self._decide(EQ, d) is True
            return expr_key(self._simpl(a)) == expr_key(self._simpl(b))

    def int_set(self, expr, dom_map: Mapping[Var, Range] | None = None) -> IntervalSet:
        """Symbolic bounds of ``expr`` when each var of ``dom_map`` ranges over its Range (or
        IntervalSet). Other variables are points. ``dom_map=None`` uses the Ranges given to
        ``bind``. Exact for affine expressions.

        Examples
        --------
        >>> from tilecraft.tensorir import var, Range
        >>> i, j, n = var("i"), var("j"), var("n")
        >>> s = Analyzer().int_set(i * 4 + j, {i: Range(0, n), j: Range(0, 4)})
        >>> s.max_value
        n * 4 - 1
        """
        e = self._check_expr(expr, "int_set")
        if not _is_scalar_int(e.dtype):
            raise TIRError(f"int_set needs a scalar integer expression, got {e!r} of {e.dtype}", e)
        dom = self._ranges if dom_map is None else dom_map
        for v, r in dom.items():
            if not isinstance(v, Var) or not isinstance(r, (Range, IntervalSet)):
                raise TIRError(f"int_set: dom_map entries must be Var -> Range, got {v!r} -> {r!r}",
                               v)
        with _deep_recursion():
            lo, hi = self._eval_set(self._canon(e), dom, frozenset())
            return IntervalSet(SET_NEG_INF if lo is None else self._expr(lo),
                               SET_POS_INF if hi is None else self._expr(hi))

    def union(self, sets: Iterable[IntervalSet]) -> IntervalSet:
        """The smallest interval containing every set (bounds simplified)."""
        return self._combine(list(sets), Min, Max, "union")

    def intersect(self, sets: Iterable[IntervalSet]) -> IntervalSet:
        """The intersection of the intervals (bounds simplified)."""
        return self._combine(list(sets), Max, Min, "intersect")

    def to_range(self, s: IntervalSet) -> Range:
        """``Range(min, max - min + 1)`` of a bounded set, the extent simplified."""
        if not s.is_bounded():
            raise TIRError(f"cannot make a Range of the unbounded set {s!r}")
        return Range(s.min_value, self.simplify(s.max_value - s.min_value + 1))

    def _combine(self, sets, lo_op, hi_op, what) -> IntervalSet:
        if not sets:
            raise TIRError(f"{what} of no sets")
        union = what == "union"
        if any(s.is_empty() for s in sets):
            if not union:
                return IntervalSet.empty()
            sets = [s for s in sets if not s.is_empty()] or [IntervalSet.empty()]
        with _deep_recursion():
            lo, hi = sets[0].min_value, sets[0].max_value
            for s in sets[1:]:
                lo = self._combine_side(lo, s.min_value, lo_op, union, SET_NEG_INF)
                hi = self._combine_side(hi, s.max_value, hi_op, union, SET_POS_INF)
            return IntervalSet(lo, hi)

    def _combine_side(self, a, b, op, union, inf):
        if a is inf or b is inf:  # unbounded: union stays unbounded, intersect takes the other
            return inf if union else (b if a is inf else a)
        return self._simpl(op(a, b))

    def _check_expr(self, expr, what) -> PrimExpr:
        try:
            e = convert(expr)
        except TIRError as err:
            raise TIRError(f"Analyzer.{what}: expected an expression, got {expr!r}", expr) from err
        if not isinstance(e, PrimExpr):
            raise TIRError(f"Analyzer.{what}: expected an expression, got {expr!r}", expr)
        return e

    # =========================================================================================
    # simplification

    def _expr(self, s: Sum) -> PrimExpr:
        """``s`` as an expression; remembered so canonicalising it again is free."""
        e = s.expr()
        if id(e) not in self._canon_memo:
            self._memo(self._canon_memo, e, s)
        return e

    @staticmethod
    def _memo(table: dict, e, value) -> None:
        if len(table) >= _MEMO_LIMIT:
            table.clear()
        table[id(e)] = (e, value)

    def _simpl(self, e: PrimExpr) -> PrimExpr:
        hit = self._simpl_memo.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        if _is_scalar_int(e.dtype):
            r = self._expr(self._canon(e))
        else:
            r = self._simpl_other(e)
            if self._known and dt.is_bool(r.dtype) and type(r) is not IntImm:
                k = self._known.get(expr_key(r))
                if k is not None:
                    r = _bool(k, r.dtype)
        self._memo(self._simpl_memo, e, r)
        return r

    # ------------------------------------------------------------------ canonical int form

    def _canon(self, e: PrimExpr) -> Sum:
        if type(e) is IntImm:
            return Sum.of_const(e.value, e.dtype)
        eid = id(e)
        hit = self._canon_memo.get(eid)
        if hit is not None and hit[0] is e:
            return hit[1]
        active = self._canon_active
        if eid in active:
            # Re-entered while canonicalizing ``e`` itself: a proof about ``e`` (is this min's
            # left side <= its right?) used a fact whose atoms contain ``e``, and their bounds
            # need ``e`` simplified. Take ``e`` as it is, an opaque atom: equal to itself, so
            # sound, only less precise -- instead of recursing forever.
            self._cutoffs += 1
            return Sum.of_atom(e, e.dtype)
        active.add(eid)
        try:
            fn = _CANON.get(type(e))
            r = fn(self, e) if fn is not None else self._atom_of(self._simpl_children(e))
        finally:
            active.discard(eid)
        if not r.terms:  # a folded constant wraps like the machine operation would
            w = wrap_int(r.const, e.dtype)
            if w != r.const:
                r = Sum.of_const(w, e.dtype)
        self._memo(self._canon_memo, e, r)
        return r

    def _atom_of(self, atom) -> Sum:
        """The sum ``1 * atom``, or a constant if the atom's bounds pin it to one value."""
        lo, hi = self._atom_bound(atom)
        if lo == hi and not ib.is_inf(lo):
            return Sum.of_const(lo, atom.dtype)
        return Sum.of_atom(atom, atom.dtype)

    def _canon_imm(self, e: IntImm) -> Sum:
        return Sum.of_const(e.value, e.dtype)

    def _canon_var(self, e: Var) -> Sum:
        s = self._subst.get(e)
        if s is not None:
            return self._canon(s)
        return self._atom_of(e)

    def _canon_addsub(self, e) -> Sum:
        # flatten the chain without recursion: a sum of many terms is a deep left-leaning tree
        sb = SumBuilder(e.dtype)
        stack = [(e, 1)]
        memo = self._canon_memo
        while stack:
            x, k = stack.pop()
            tx = type(x)
            if (tx is Add or tx is Sub) and (x is e or id(x) not in memo):
                stack.append((x.a, k))
                stack.append((x.b, k if tx is Add else -k))
            else:
                sb.add(self._canon(x), k)
        return self._normalize(sb.finish())

    def _canon_mul(self, e: Mul) -> Sum:
        a, b = self._canon(e.a), self._canon(e.b)
        if a.is_const():
            return scale(b, a.const)
        if b.is_const():
            return scale(a, b.const)
        return self._mul_sums(a, b)

    def _mul_sums(self, a: Sum, b: Sum) -> Sum:
        na = len(a.terms) + (a.const != 0)
        nb = len(b.terms) + (b.const != 0)
        if na * nb > _EXPAND_LIMIT:
            return self._atom_of(monomial([self._expr(a), self._expr(b)]))
        sb = SumBuilder(a.dtype)
        sb.const = a.const * b.const
        for _, (x, cx) in a.terms.items():
            fx = factors(atom_expr(x))
            if b.const:
                sb.add_atom(x, cx * b.const)
            for _, (y, cy) in b.terms.items():
                m = self._atom_of(monomial(fx + factors(atom_expr(y))))
                sb.add(m, cx * cy)
        if a.const:
            for key, (y, cy) in b.terms.items():
                sb.add_atom(y, a.const * cy, key)
        return self._normalize(sb.finish())

    # division --------------------------------------------------------------------------------

    def _canon_div(self, e) -> Sum:
        t = type(e)
        a, b = self._canon(e.a), self._canon(e.b)
        if b.is_const():
            c = b.const
            if c == 0:  # undefined; keep it for the target to trap or not
                return self._atom_of(t(self._expr(a), self._expr(b)))
            if a.is_const():
                folded = fold_binary(t, IntImm(a.const, e.dtype), IntImm(c, e.dtype))
                return Sum.of_const(folded.value, e.dtype)
            if t is FloorDiv:
                return self._div_const(a, c) if c > 0 else self._div_const(scale(a, -1), -c)
            if t is FloorMod:
                if c > 0:
                    return self._mod_const(a, c)
                return scale(self._mod_const(scale(a, -1), -c), -1)  # x % -c == -((-x) % c)
            # truncating division: C semantics
            neg = c < 0
            c = abs(c)
            if t is Div:
                r = self._truncdiv_const(a, c)
                return scale(r, -1) if neg else r
            return self._truncmod_const(a, c)  # truncmod(x, -c) == truncmod(x, c)
        return self._div_symbolic(t, a, b)

    def _truncdiv_const(self, a: Sum, c: int) -> Sum:
        if c == 1:
            return a
        if self._prove_nonneg(a):
            return self._div_const(a, c)
        if self._prove_nonneg(scale(a, -1)):  # truncdiv(x, c) == -floordiv(-x, c) for x <= 0
            return scale(self._div_const(scale(a, -1), c), -1)
        return self._atom_of(Div(self._expr(a), IntImm(c, a.dtype)))

    def _truncmod_const(self, a: Sum, c: int) -> Sum:
        if c == 1:
            return Sum.of_const(0, a.dtype)
        if self._prove_nonneg(a):
            return self._mod_const(a, c)
        if self._prove_nonneg(scale(a, -1)):
            return scale(self._mod_const(scale(a, -1), c), -1)
        return self._atom_of(Mod(self._expr(a), IntImm(c, a.dtype)))

    def _div_const(self, s: Sum, c: int) -> Sum:
        """``floordiv(s, c)`` for a constant ``c > 0``."""
        if c == 1:
            return s
        d = s.dtype
        qc, rc = divmod(s.const, c)
        if not s.terms:
            return Sum.of_const(qc, d)
        q = SumBuilder(d)
        q.const = qc
        rterms = {}
        for key, (a, k) in s.terms.items():
            if k % c == 0:
                q.add_atom(a, k // c, key)
            else:
                rterms[key] = (a, k)
        # s == c*q + r: floordiv(s, c) == q + floordiv(r, c) exactly, for any r
        if not rterms:
            return q.finish()
        r = Sum(rterms, rc, d)
        lo, hi = self._bound_sum(r)
        if not ib.is_inf(lo) and not ib.is_inf(hi) and lo // c == hi // c:
            q.const += lo // c
            return self._normalize(q.finish())
        r, c = _divide_gcd(r, c)
        if c == 1:
            q.add(r)
        else:
            q.add(self._floordiv_atom(r, c))
        return self._normalize(q.finish())

    def _floordiv_atom(self, r: Sum, c: int) -> Sum:
        inner = r.single_atom()
        if type(inner) is Split and (inner.upper is None or inner.upper % c == 0):
            # ((x // a) % (b*c)) // c == (x // (a*c)) % b ; (x // a) // c == x // (a*c)
            up = None if inner.upper is None else inner.upper // c
            return self._make_split(inner.index, inner.lower * c, up)
        return self._make_split(r, c, None)

    def _mod_const(self, s: Sum, c: int) -> Sum:
        """``floormod(s, c)`` for a constant ``c > 0``."""
        d = s.dtype
        if c == 1:
            return Sum.of_const(0, d)
        rterms = {key: (a, k) for key, (a, k) in s.terms.items() if k % c != 0}
        r = Sum(rterms, s.const % c, d)
        if not rterms:
            return r
        lo, hi = self._bound_sum(r)
        if not ib.is_inf(lo) and not ib.is_inf(hi) and lo // c == hi // c:
            return add_const(r, -(lo // c) * c)
        g = gcd(c, r.const, *(k for _, k in rterms.values()))
        if g > 1:
            r, c = _divide_gcd(r, c)
            return scale(self._floormod_atom(r, c), g)
        return self._floormod_atom(r, c)

    def _floormod_atom(self, r: Sum, c: int) -> Sum:
        inner = r.single_atom()
        if type(inner) is Split and (inner.upper is None or inner.upper % c == 0):
            return self._make_split(inner.index, inner.lower, c)
        return self._make_split(r, 1, c)

    def _make_split(self, x: Sum, lower: int, upper: int | None) -> Sum:
        """``(x // lower) % upper`` as a sum, dropping a modulo that provably never wraps."""
        d = x.dtype
        if upper == 1:
            return Sum.of_const(0, d)
        if upper is not None:
            lo, hi = self._bound_sum(x)
            if not ib.is_inf(lo) and not ib.is_inf(hi):
                qlo, qhi = lo // lower, hi // lower
                if qlo // upper == qhi // upper:
                    return add_const(self._make_split(x, lower, None), -(qlo // upper) * upper)
        if lower == 1 and upper is None:
            return x
        return self._atom_of(Split(x, lower, upper))

    def _div_symbolic(self, t, a: Sum, b: Sum) -> Sum:
        d = a.dtype
        if a.is_const() and a.const == 0:
            return a
        is_div = t is FloorDiv or t is Div
        if a.key == b.key:  # x / x (x != 0, else undefined anyway)
            return Sum.of_const(1 if is_div else 0, d)
        if t is Div or t is Mod:
            if self._prove_nonneg(a) and self._prove_pos(b):
                t = FloorDiv if t is Div else FloorMod
            else:
                return self._atom_of(t(self._expr(a), self._expr(b)))
        q, r = a, None
        n_atom = b.single_atom()
        if n_atom is not None and type(n_atom) is not Split:
            q, r = self._extract_factor(a, n_atom)
        if r is None:  # no term had the factor
            q, r = Sum.of_const(0, d), a
        # a == b*q + r: floordiv(a, b) == q + floordiv(r, b); floormod(a, b) == floormod(r, b)
        if r.is_const() and r.const == 0:
            return q if is_div else r
        if self._prove_nonneg(r) and self._prove_nonneg(add_const(sub(b, r), -1)):
            return q if is_div else r
        atom = self._atom_of(t(self._expr(r), self._expr(b)))
        return self._normalize(sum_add(q, atom)) if is_div else atom

    def _extract_factor(self, a: Sum, n: PrimExpr):
        """Split ``a`` into ``n*q + r`` by the terms that have the factor ``n``; r None if none."""
        nkey = expr_key(n)
        q = SumBuilder(a.dtype)
        r = SumBuilder(a.dtype)
        r.const = a.const
        found = False
        for key, (atom, c) in a.terms.items():
            if key == nkey:
                q.const += c
                found = True
                continue
            fs = factors(atom_expr(atom)) if type(atom) is Mul else None
            if fs:
                for i, f in enumerate(fs):
                    if expr_key(f) == nkey:
                        rest = fs[:i] + fs[i + 1:]
                        q.add(self._atom_of(monomial(rest)), c)
                        found = True
                        break
                else:
                    r.add_atom(atom, c, key)
            else:
                r.add_atom(atom, c, key)
        if not found:
            return a, None
        return self._normalize(q.finish()), self._normalize(r.finish())

    # merging ---------------------------------------------------------------------------------

    def _normalize(self, s: Sum) -> Sum:
        """Merge the split atoms of ``s`` that are pieces of one index (split/fuse patterns)."""
        if len(s.terms) < 2:
            return s
        nsplit = nmul = 0
        for a, _ in s.terms.values():
            ta = type(a)
            if ta is Split:
                nsplit += 1
            elif ta is Mul:
                nmul += 1
        if nsplit:
            r = self._merge_splits(s)
            if r is not None:
                return self._normalize(r)
        if nmul:
            r = self._merge_symbolic(s)
            if r is not None:
                return self._normalize(r)
        return s

    def _merge_splits(self, s: Sum) -> Sum | None:
        groups: dict[tuple, list] = {}
        for key, (a, c) in s.terms.items():
            if type(a) is Split:
                groups.setdefault(a.index.key, []).append((key, a, c))
        for group in groups.values():
            for ka, A, ca in group:
                for kb, B, cb in group:
                    if kb == ka:
                        continue
                    merged = None
                    if A.upper is not None and B.lower == A.lower * A.upper and cb == ca * A.upper:
                        # (x//l % u) * c + (x//(l*u) % v) * c*u == (x//l % (u*v)) * c
                        merged = (A.lower, None if B.upper is None else A.upper * B.upper)
                    elif (A.upper is None and B.upper is None and B.lower % A.lower == 0
                          and cb == -ca * (B.lower // A.lower)):
                        # (x//l) * c - (x//(l*m)) * c*m == (x//l % m) * c
                        merged = (A.lower, B.lower // A.lower)
                    if merged is not None:
                        sb = SumBuilder(s.dtype)
                        sb.terms = dict(s.terms)
                        sb.const = s.const
                        del sb.terms[ka], sb.terms[kb]
                        sb.add(self._make_split(A.index, *merged), ca)
                        return sb.finish()
            # x * k - (x // l) * k*l == (x % l) * k, with x's own terms in the sum
            for ka, A, ca in group:
                if A.upper is not None or ca % A.lower:
                    continue
                k = -ca // A.lower
                x = A.index
                if all(s.coeff(key) == k * cx for key, (_, cx) in x.terms.items()):
                    sb = SumBuilder(s.dtype)
                    sb.terms = dict(s.terms)
                    sb.const = s.const
                    del sb.terms[ka]
                    sb.add(x, -k)
                    sb.add(self._make_split(x, 1, A.lower), k)
                    return sb.finish()
        return None

    def _merge_symbolic(self, s: Sum) -> Sum | None:
        # the same two patterns with a symbolic divisor n: (x // n) * n + x % n == x and
        # x - (x // n) * n == x % n
        for key, (a, c) in s.terms.items():
            if type(a) is not Mul:
                continue
            fs = factors(a)
            if len(fs) != 2:
                continue
            for fd, n in ((fs[0], fs[1]), (fs[1], fs[0])):
                if type(fd) is not FloorDiv or expr_key(fd.b) != expr_key(n):
                    continue
                fm = FloorMod(fd.a, fd.b)
                kmod = expr_key(fm)
                x = self._canon(fd.a)
                if s.coeff(kmod) == c:
                    sb = SumBuilder(s.dtype)
                    sb.terms = dict(s.terms)
                    sb.const = s.const
                    del sb.terms[key], sb.terms[kmod]
                    sb.add(x, c)
                    return sb.finish()
                if x.terms and all(s.coeff(k) == -c * cx for k, (_, cx) in x.terms.items()):
                    sb = SumBuilder(s.dtype)
                    sb.terms = dict(s.terms)
                    sb.const = s.const
                    del sb.terms[key]
                    sb.add(x, c)
                    sb.add(self._canon(fm), -c)
                    return sb.finish()
        return None

    # min / max / select / cast / others -----------------------------------------------------

    def _canon_minmax(self, e) -> Sum:
        t = type(e)
        a, b = self._canon(e.a), self._canon(e.b)
        if a.is_const() and b.is_const():
            return a if (a.const <= b.const) == (t is Min) else b
        d = self._normalize(sub(a, b))
        if self._prove_nonneg(scale(d, -1)):  # a <= b
            return a if t is Min else b
        if self._prove_nonneg(d):  # a >= b
            return b if t is Min else a
        # min(min(x, c1), c2) == min(x, min(c1, c2)); same for max
        for inner, other in ((a, b), (b, a)):
            ia = inner.single_atom()
            if other.is_const() and type(ia) is t and type(ia.b) is IntImm:
                pick = min if t is Min else max
                return self._canon(t(ia.a, IntImm(pick(ia.b.value, other.const), e.dtype)))
        ea, eb = self._expr(a), self._expr(b)
        if expr_key(eb) < expr_key(ea):  # commutative: a canonical operand order
            ea, eb = eb, ea
        node = e if (ea is e.a and eb is e.b) else t(ea, eb)
        return self._atom_of(node)

    def _canon_select(self, e: Select) -> Sum:
        cond = self._simpl(e.condition)
        if type(cond) is IntImm:
            return self._canon(e.true_value if cond.value else e.false_value)
        t, f = self._canon(e.true_value), self._canon(e.false_value)
        if t.key == f.key:
            return t
        return self._atom_of(_rebuild(e, condition=cond, true_value=self._expr(t),
                                      false_value=self._expr(f)))

    def _canon_cast(self, e: Cast) -> Sum:
        v = e.value
        if v.dtype == e.dtype:
            return self._canon(v)
        sv = self._simpl(v)
        folded = fold_cast(e.dtype, sv)
        if folded is not None:
            return Sum.of_const(folded.value, e.dtype)
        if type(sv) is Cast and sv.value.dtype == e.dtype and _is_scalar_int(sv.dtype):
            # T(S(x)) with x of type T is x when S holds every value x takes (widening and back)
            if _range_contains(sv.dtype, e.dtype) or self._fits(sv.value, sv.dtype):
                return self._canon(sv.value)
        return self._atom_of(_rebuild(e, value=sv))

    def _fits(self, e: PrimExpr, dtype: str) -> bool:
        lo, hi = self._bound_expr(e)
        tlo, thi = int_range(dtype)
        return tlo <= lo and hi <= thi

    def _canon_let(self, e: Let) -> Sum:
        value = self._simpl(e.value)
        if type(value) in (IntImm, Var):
            return self._canon(_substitute_var(e.body, e.var, value))
        return self._atom_of(_rebuild(e, value=value, body=self._simpl(e.body)))

    def _simpl_children(self, e: PrimExpr) -> PrimExpr:
        t = type(e)
        if t is Call:
            args = tuple(self._simpl(a) for a in e.args)
            if e.op == "if_then_else" and type(args[0]) is IntImm:
                return args[1] if args[0].value else args[2]
            folded = fold_intrinsic(e.op, e.dtype, args)
            if folded is not None:
                return folded
            return _rebuild(e, args=args)
        if t is BufferLoad:
            return _rebuild(e, indices=tuple(self._simpl(i) for i in e.indices))
        if isinstance(e, BinaryOp):  # vector / float / bool arithmetic
            return _rebuild(e, a=self._simpl(e.a), b=self._simpl(e.b))
        return e

    # ------------------------------------------------------------------ non-integer nodes

    def _simpl_other(self, e: PrimExpr) -> PrimExpr:
        t = type(e)
        if t in _CMP_SET:
            return self._simpl_cmp(e)
        if t is And or t is Or:
            return self._simpl_logic(e)
        if t is Not:
            return self._simpl_not(e)
        if t is Var:
            s = self._subst.get(e)
            return e if s is None else s
        if t is Select:
            cond = self._simpl(e.condition)
            if type(cond) is IntImm:
                return self._simpl(e.true_value if cond.value else e.false_value)
            tv, fv = self._simpl(e.true_value), self._simpl(e.false_value)
            if expr_key(tv) == expr_key(fv):
                return tv
            return _rebuild(e, condition=cond, true_value=tv, false_value=fv)
        if t is Cast:
            v = self._simpl(e.value)
            if v.dtype == e.dtype:
                return v
            folded = fold_cast(e.dtype, v)
            return folded if folded is not None else _rebuild(e, value=v)
        if t is Let:
            value = self._simpl(e.value)
            if type(value) in (IntImm, FloatImm, Var):
                return self._simpl(_substitute_var(e.body, e.var, value))
            return _rebuild(e, value=value, body=self._simpl(e.body))
        if isinstance(e, BinaryOp):
            a, b = self._simpl(e.a), self._simpl(e.b)
            folded = fold_binary(t, a, b)
            if folded is not None:
                return folded
            if dt.is_float(e.dtype):
                r = _float_identity(t, a, b)
                if r is not None:
                    return r
            return _rebuild(e, a=a, b=b)
        return self._simpl_children(e)

    def _simpl_cmp(self, e) -> PrimExpr:
        t = type(e)
        if not _is_scalar_int(e.a.dtype):
            a, b = self._simpl(e.a), self._simpl(e.b)
            folded = fold_binary(t, a, b)
            return folded if folded is not None else _rebuild(e, a=a, b=b)
        a, b = self._canon(e.a), self._canon(e.b)
        if t is GT:
            kind, d = LT, sub(b, a)
        elif t is GE:
            kind, d = LE, sub(b, a)
        else:
            kind, d = t, sub(a, b)
        return self._cmp_sum(kind, self._normalize(d), e.dtype, _CASE_SPLITS)

    def _cmp_sum(self, kind, d: Sum, dtype: str, splits: int) -> PrimExpr:
        """``d <kind> 0`` simplified: decided, split at a min / max, or as it is."""
        decided = self._decide(kind, d, splits)
        if decided is not None:
            return _bool(decided, dtype)
        if splits > 0 and (kind is LT or kind is LE):
            r = self._split_cmp(kind, d, dtype, splits)
            if r is not None:
                return r
        return self._cmp_expr(kind, d, dtype)

    def _split_cmp(self, kind, d: Sum, dtype: str, splits: int) -> PrimExpr | None:
        """``d <kind> 0`` with ``d == c * op(x, y) + r`` as the ``or`` / ``and`` of the cases
        ``c*x + r <kind> 0`` and ``c*y + r <kind> 0`` (``min(x, y) < z`` iff ``x < z or y <
        z``; ``max(x, y) < z`` iff ``x < z and y < z``), when a case is decided: the bounds
        check ``max(min(u, h - 1), 0) < h`` becomes ``0 < h``. None when no case is decided
        (the split would only make the condition longer)."""
        for key, (a, c) in d.terms.items():
            t = type(a)
            if t is not Min and t is not Max:
                continue
            is_or = (t is Min) == (c > 0)
            rest = Sum({k: v for k, v in d.terms.items() if k != key}, d.const, d.dtype)
            cases = [self._normalize(sum_add(rest, self._canon(x), c)) for x in (a.a, a.b)]
            for k in (0, 1):
                decided = self._decide(kind, cases[k], splits - 1)
                if decided is not None:
                    if decided == is_or:  # true or _, false and _
                        return _bool(is_or, dtype)
                    # false or other, true and other
                    return self._cmp_sum(kind, cases[1 - k], dtype, splits - 1)
            return None
        return None

    def _decide(self, kind, d: Sum, splits: int = _CASE_SPLITS) -> bool | None:
        """Truth of ``d <kind> 0`` if it can be proven either way, else None."""
        if d.is_const():
            return {LT: d.const < 0, LE: d.const <= 0, EQ: d.const == 0, NE: d.const != 0}[kind]
        if kind is NE:
            r = self._decide(EQ, d, splits)
            return None if r is None else not r
        lo, hi = self._bound_sum(d)
        if kind is LT:
            if hi < 0:
                return True
            if lo >= 0:
                return False
        elif kind is LE:
            if hi <= 0:
                return True
            if lo > 0:
                return False
        else:  # EQ
            if lo == hi == 0:
                return True
            if hi < 0 or lo > 0:
                return False
            g = 0
            for _, c in d.terms.values():
                g = gcd(g, c)
            if d.const % g:
                return False
        if not self._facts_list() and not any((type(a) is Split and a.upper is None)
                                              or type(a) in _CASE_ATOMS
                                              for a, _ in d.terms.values()):
            return None  # nothing beyond the constant bounds to reason with
        neg = scale(d, -1)

        def prove(x: Sum) -> bool:
            return self._prove_nonneg(x, _PROOF_DEPTH, splits)

        if kind is LT:
            if prove(add_const(neg, -1)):
                return True
            if prove(d):
                return False
        elif kind is LE:
            if prove(neg):
                return True
            if prove(add_const(d, -1)):
                return False
        else:
            if prove(add_const(d, -1)) or prove(add_const(neg, -1)):
                return False
            if prove(d) and prove(neg):
                return True
        return None

    def _cmp_expr(self, kind, d: Sum, dtype: str) -> PrimExpr:
        """``d <kind> 0`` written as ``positive terms <kind> negative terms - const``."""
        g = 0
        for _, c in d.terms.values():
            g = gcd(g, c)
        k = d.const
        if g > 1:
            if kind is LT:
                k = k // g  # g*L + K < 0  <=>  L + floor(K/g) < 0
            elif kind is LE:
                k = -((-k) // g)  # g*L + K <= 0  <=>  L + ceil(K/g) <= 0
            else:
                k = k // g  # K % g == 0 here, else _decide answered
            d = Sum({key: (a, c // g) for key, (a, c) in d.terms.items()}, k, d.dtype)
        if kind in (EQ, NE) and d.sorted_terms()[0][2] < 0:
            d = scale(d, -1)
        pos = {key: (a, c) for key, (a, c) in d.terms.items() if c > 0}
        neg = {key: (a, -c) for key, (a, c) in d.terms.items() if c < 0}
        if pos:
            lhs = self._expr(Sum(pos, 0, d.dtype))
            rhs = self._expr(Sum(neg, -d.const, d.dtype))
        else:
            lhs = IntImm(d.const, d.dtype)
            rhs = self._expr(Sum(neg, 0, d.dtype))
        return kind(lhs, rhs)

    def _simpl_logic(self, e) -> PrimExpr:
        is_and = type(e) is And
        a = self._simpl(e.a)
        if type(a) is IntImm and (a.value == 0) == is_and:
            return a  # false and _, true or _
        b = self._simpl(e.b)
        if type(b) is IntImm and (b.value == 0) == is_and:
            return b
        if type(a) is IntImm:
            return b
        if type(b) is IntImm:
            return a
        ka, kb = expr_key(a), expr_key(b)
        if ka == kb:
            return a
        if (type(a) is Not and expr_key(a.a) == kb) or (type(b) is Not and expr_key(b.a) == ka):
            return _bool(not is_and, e.dtype)  # x and not x, x or not x
        return _rebuild(e, a=a, b=b)

    def _simpl_not(self, e: Not) -> PrimExpr:
        a = self._simpl(e.a)
        ta = type(a)
        if ta is IntImm:
            return _bool(not a.value, e.dtype)
        if ta is Not:
            return a.a
        if ta in _NEGATE_CMP and _is_scalar_int(a.a.dtype):
            return self._simpl_cmp(_NEGATE_CMP[ta](a.a, a.b))
        return _rebuild(e, a=a)

    # =========================================================================================
    # bounds

    def _bound_sum(self, s: Sum) -> tuple[int, int]:
        lo = hi = s.const
        for a, c in s.terms.values():
            alo, ahi = self._atom_bound(a)
            if c > 0:
                lo = ib.add(lo, ib.mul(alo, c))
                hi = ib.add(hi, ib.mul(ahi, c), True)
            else:
                lo = ib.add(lo, ib.mul(ahi, c))
                hi = ib.add(hi, ib.mul(alo, c), True)
        return lo, hi

    def _bound_expr(self, e: PrimExpr) -> tuple[int, int]:
        if _is_scalar_int(e.dtype):
            return self._bound_sum(self._canon(e))
        if dt.is_bool(e.dtype):
            return (0, 1)
        return EVERYTHING

    def _atom_bound(self, a) -> tuple[int, int]:
        key = atom_key(a)
        b = self._bound_memo.get(key)
        if b is not None:
            return b
        b = self._compute_atom_bound(a)
        rb = self._range_bound.get(key)
        if rb is not None:
            b = ib.intersect(b, rb)
        eb = self._extra_bound.get(key)
        if eb is not None:
            b = ib.intersect(b, eb)
        if len(self._bound_memo) >= _MEMO_LIMIT:
            self._bound_memo.clear()
        self._bound_memo[key] = b
        return b

    def _compute_atom_bound(self, a) -> tuple[int, int]:
        t = type(a)
        if t is Split:
            lo, hi = self._bound_sum(a.index)
            qlo = lo if ib.is_inf(lo) else lo // a.lower
            qhi = hi if ib.is_inf(hi) else hi // a.lower
            if a.upper is None:
                return qlo, qhi
            if not ib.is_inf(qlo) and not ib.is_inf(qhi) and qlo // a.upper == qhi // a.upper:
                return qlo % a.upper, qhi % a.upper
            return 0, a.upper - 1
        if t is Mul:
            return ib.mul_interval(self._bound_expr(a.a), self._bound_expr(a.b))
        if t is FloorDiv or t is Div:
            return ib.div_interval(self._bound_expr(a.a), self._bound_expr(a.b), t is FloorDiv)
        if t is FloorMod:
            xlo, xhi = self._bound_expr(a.a)
            ylo, yhi = self._bound_expr(a.b)
            if ylo > 0:
                hi = ib.add(yhi, -1, True)
                return (0, min(hi, xhi)) if xlo >= 0 else (0, hi)
            if yhi < 0:
                return ib.add(ylo, 1), 0
            return _dtype_bound(a.dtype)
        if t is Mod:
            xlo, xhi = self._bound_expr(a.a)
            ylo, yhi = self._bound_expr(a.b)
            m = ib.add(max(ib.neg(ylo), yhi), -1, True)  # |remainder| < |divisor|
            if xlo >= 0:
                return 0, min(xhi, m)
            if xhi <= 0:
                return max(xlo, ib.neg(m)), 0
            return max(xlo, ib.neg(m)), min(xhi, m)
        if t is Min or t is Max:
            alo, ahi = self._bound_expr(a.a)
            blo, bhi = self._bound_expr(a.b)
            if t is Min:
                return min(alo, blo), min(ahi, bhi)
            return max(alo, blo), max(ahi, bhi)
        if t is Select:
            return ib.union(self._bound_expr(a.true_value), self._bound_expr(a.false_value))
        if t is Call and a.op == "if_then_else":
            return ib.union(self._bound_expr(a.args[1]), self._bound_expr(a.args[2]))
        if t is Cast:
            src = a.value.dtype
            if _is_scalar_int(src) or dt.is_bool(src):
                b = self._bound_expr(a.value)
                tlo, thi = _dtype_bound(a.dtype)
                if tlo <= b[0] and b[1] <= thi:  # no value wraps
                    return b
            return _dtype_bound(a.dtype)
        return _dtype_bound(a.dtype)

    def _prove_pos(self, s: Sum) -> bool:
        return self._prove_nonneg(add_const(s, -1))

    def _prove_nonneg(self, s: Sum, depth: int = _PROOF_DEPTH,
                      splits: int = _CASE_SPLITS) -> bool:
        """True only if ``s >= 0`` wherever the known bounds and facts hold.

        Beyond constant bounds, each step either (up to ``splits`` times) splits a ``min`` /
        ``max`` / ``select`` term into the cases of its operands, or (up to ``depth`` times)
        subtracts a known fact ``f >= 0`` scaled to cancel a term, or replaces a
        ``k * (x // c)`` term by its linear bound (``x - c + 1 <= c * (x // c) <= x``); every
        step keeps the proof sound. A search that would re-enter itself, or nest deeper than
        ``_MAX_PROOF_NESTING``, gives up (False: "not proven").
        """
        lo, hi = self._bound_sum(s)
        if lo >= 0:
            return True
        if hi < 0 or not s.terms:
            return False  # negative everywhere (or a constant): no search will prove it
        cases = splits > 0 and any(type(a) in _CASE_ATOMS for a, _ in s.terms.values())
        if depth == 0 and not cases:
            return False
        key = (s.key, depth)
        hit = self._prove_memo.get(key)
        # (result, splits it was searched with): a proof holds whatever the budget, a failure
        # stands for budgets up to the one it had
        if hit is not None and (hit[0] or hit[1] >= splits):
            return hit[0]
        key = (s.key, depth, splits)
        if key in self._proving or self._proof_nesting >= _MAX_PROOF_NESTING:
            self._cutoffs += 1
            return False
        cut_before = self._cutoffs
        self._proving.add(key)
        self._proof_nesting += 1
        try:
            result = ((cases and self._prove_by_cases(s, depth, splits))
                      or (depth > 0 and (self._prove_by_facts(s, depth, splits)
                                         or self._prove_by_relaxing(s, depth, splits))))
        finally:
            self._proof_nesting -= 1
            self._proving.discard(key)
        # a failure of a search cut short may succeed when asked again from elsewhere
        if result or self._cutoffs == cut_before:
            if len(self._prove_memo) >= _MEMO_LIMIT:
                self._prove_memo.clear()
            self._prove_memo[key[:2]] = (result, splits)
        return result

    def _prove_by_cases(self, s: Sum, depth: int, splits: int) -> bool:
        """Split the first ``min`` / ``max`` / ``select`` term of ``s`` into its operands.

        With ``s == c * op(x, y) + r``: ``c * min(x, y) + r >= 0`` iff both ``c*x + r >= 0``
        and ``c*y + r >= 0`` when ``c > 0`` (and ``c * max`` when ``c < 0``); ``c * max(x, y)
        + r >= 0`` follows from either (``c * min`` for ``c < 0``). A select needs both
        branches. So ``min(u, h - 1) < h`` holds by its second operand and ``max(min(u, h -
        1), 0) < h`` needs ``h >= 1``.
        """
        for key, (a, c) in s.terms.items():
            t = type(a)
            if t not in _CASE_ATOMS:
                continue
            if t is Select:
                both, x, y = True, a.true_value, a.false_value
            else:
                both, x, y = (t is Min) == (c > 0), a.a, a.b
            rest = Sum({k: v for k, v in s.terms.items() if k != key}, s.const, s.dtype)
            sx = self._normalize(sum_add(rest, self._canon(x), c))
            if self._prove_nonneg(sx, depth, splits - 1) != both:
                return not both  # either: one case proven; both: one case failed
            sy = self._normalize(sum_add(rest, self._canon(y), c))
            return self._prove_nonneg(sy, depth, splits - 1)
        return False

    def _prove_by_facts(self, s: Sum, depth: int, splits: int = _CASE_SPLITS) -> bool:
        for f in self._facts_list():
            for k, (_, c) in s.terms.items():
                fc = f.coeff(k)
                if fc == 0 or (fc > 0) != (c > 0):
                    continue
                # |fc|*s - |c|*f >= 0 and f >= 0 imply s >= 0; the shared term cancels
                if self._prove_nonneg(sub(scale(s, abs(fc)), scale(f, abs(c))), depth - 1,
                                      splits):
                    return True
                break
        return False

    def _prove_by_relaxing(self, s: Sum, depth: int, splits: int = _CASE_SPLITS) -> bool:
        for key, (a, k) in s.terms.items():
            if type(a) is not Split or a.upper is not None:
                continue
            c, x = a.lower, a.index
            # c*s >= 0 iff s >= 0; in c*s the term is k * (c * (x // c)), bounded by x's terms
            sb = SumBuilder(s.dtype)
            sb.terms = {kk: (aa, cc * c) for kk, (aa, cc) in s.terms.items() if kk != key}
            sb.const = s.const * c
            sb.add(x, k)
            if k > 0:
                sb.const -= k * (c - 1)
            # s is an integer, so c*s >= -(c - 1) already gives s >= 0: ``(u // 5) < 12``
            # follows from ``u < 60`` (u <= 59), not only from u <= 55
            sb.const += c - 1
            if self._prove_nonneg(self._normalize(sb.finish()), depth - 1, splits):
                return True
        return False

    # =========================================================================================
    # symbolic interval sets

    def _eval_set(self, s: Sum, dom, active: frozenset):
        """Symbolic ``(lo, hi)`` sums of ``s`` over ``dom``; None for an unbounded side."""
        lo = SumBuilder(s.dtype)
        hi = SumBuilder(s.dtype)
        lo.const = hi.const = s.const
        lo_inf = hi_inf = False
        for a, c in s.terms.values():
            alo, ahi = self._eval_atom_set(a, dom, active)
            if c < 0:
                alo, ahi = ahi, alo
            if alo is None:
                lo_inf = True
            elif not lo_inf:
                lo.add(alo, c)
            if ahi is None:
                hi_inf = True
            elif not hi_inf:
                hi.add(ahi, c)
        return (None if lo_inf else self._normalize(lo.finish()),
                None if hi_inf else self._normalize(hi.finish()))

    def _atom_vars(self, a) -> tuple:
        key = atom_key(a)
        vs = self._vars_memo.get(key)
        if vs is None:
            found: dict[int, Var] = {}
            stack = [a]
            while stack:
                x = stack.pop()
                tx = type(x)
                if tx is Split:
                    stack.extend(at for at, _ in x.index.terms.values())
                elif tx is Var:
                    found[id(x)] = x
                else:
                    for f in x._fields:
                        v = getattr(x, f)
                        if isinstance(v, PrimExpr):
                            stack.append(v)
                        elif isinstance(v, tuple):
                            stack.extend(i for i in v if isinstance(i, PrimExpr))
            vs = tuple(found.values())
            if len(self._vars_memo) >= _MEMO_LIMIT:
                self._vars_memo.clear()
            self._vars_memo[key] = vs
        return vs

    def _depends(self, a, dom, active) -> bool:
        return any(v in dom and v not in active for v in self._atom_vars(a))

    def _eval_atom_set(self, a, dom, active):
        d = a.dtype
        if not self._depends(a, dom, active):
            p = Sum.of_atom(a, d)
            return p, p
        t = type(a)
        if t is Var:
            r = dom[a]
            if isinstance(r, Range):
                lo = self._canon(self._as_dtype(r.min, a, "min"))
                hi = add_const(sum_add(lo, self._canon(self._as_dtype(r.extent, a, "extent"))), -1)
            else:
                lo = hi = None
                if r.has_lower_bound():
                    lo = self._canon(self._as_dtype(r.min_value, a, "min"))
                if r.has_upper_bound():
                    hi = self._canon(self._as_dtype(r.max_value, a, "max"))
            act = active | {a}
            if lo is not None:
                lo = self._eval_set(lo, dom, act)[0]
            if hi is not None:
                hi = self._eval_set(hi, dom, act)[1]
            return lo, hi
        if t is Split:
            ilo, ihi = self._eval_set(a.index, dom, active)
            qlo = None if ilo is None else self._div_const(ilo, a.lower)
            qhi = None if ihi is None else self._div_const(ihi, a.lower)
            if a.upper is None:
                return qlo, qhi
            if qlo is not None and qhi is not None:
                same = self._normalize(sub(self._div_const(qhi, a.upper),
                                           self._div_const(qlo, a.upper)))
                if (same.is_const() and same.const == 0) or \
                        self._split_stays_in_block(a, dom, active):
                    return self._mod_const(qlo, a.upper), self._mod_const(qhi, a.upper)
            return Sum.of_const(0, d), Sum.of_const(a.upper - 1, d)
        if t is Mul:
            r = self._eval_mul_set(a, dom, active)
            if r is not None:
                return r
        elif t is Min or t is Max:
            alo, ahi = self._eval_set(self._canon(a.a), dom, active)
            blo, bhi = self._eval_set(self._canon(a.b), dom, active)
            if t is Min:
                return (self._extreme(Min, alo, blo, True), self._extreme(Min, ahi, bhi, False))
            return self._extreme(Max, alo, blo, False), self._extreme(Max, ahi, bhi, True)
        elif t is Select:
            return self._union_sets(self._eval_set(self._canon(a.true_value), dom, active),
                                    self._eval_set(self._canon(a.false_value), dom, active))
        elif (t is FloorDiv or t is Div or t is FloorMod or t is Mod) and not self._depends_expr(
                a.b, dom, active):
            r = self._eval_div_set(a, dom, active)
            if r is not None:
                return r
        # anything else: its constant bounds
        lo, hi = self._atom_bound(a)
        return (None if ib.is_inf(lo) else Sum.of_const(lo, d),
                None if ib.is_inf(hi) else Sum.of_const(hi, d))

    def _split_stays_in_block(self, a: Split, dom, active) -> bool:
        """Whether ``(F + v) // lower % upper`` cannot wrap as ``v`` ranges: ``F`` the terms of
        the index that do not vary (each coefficient a multiple of ``g``, a divisor of
        ``lower * upper`` that ``lower`` divides), ``v`` the varying terms and the constant,
        within ``[0, g)``. Then ``F`` is a multiple of ``g`` and the index stays in one block
        of ``g``, which never straddles a multiple of ``lower * upper``: the low and high ends
        are in one period. (``(p * 8 + i) % 56`` with ``i < 8``: one run of 8, not the whole
        row; an over-wide region makes ``reverse_compute_at`` copy values not yet computed.)
        """
        n = a.lower * a.upper
        g = n
        var_terms = {}
        for key, (atom, c) in a.index.terms.items():
            if self._depends(atom, dom, active):
                var_terms[key] = (atom, c)
            else:
                g = gcd(g, c)
        if not var_terms or g % a.lower:
            return False
        vlo, vhi = self._eval_set(Sum(var_terms, a.index.const, a.index.dtype), dom, active)
        return (vlo is not None and vhi is not None and vlo.is_const() and vhi.is_const()
                and 0 <= vlo.const and vhi.const < g)

    def _depends_expr(self, e, dom, active) -> bool:
        s = self._canon(e)
        return any(self._depends(a, dom, active) for a, _ in s.terms.values())

    def _union_sets(self, x, y):
        (alo, ahi), (blo, bhi) = x, y
        return self._extreme(Min, alo, blo, True), self._extreme(Max, ahi, bhi, True)

    def _extreme(self, op, x, y, unbounded_wins: bool):
        """``op(x, y)`` of two interval ends, None being an unbounded end: ``min(x, -inf)`` is
        unbounded (``unbounded_wins``), ``min(x, +inf)`` is ``x``."""
        if x is None or y is None:
            return None if unbounded_wins else (y if x is None else x)
        return self._canon(op(self._expr(x), self._expr(y)))

    def _eval_mul_set(self, a: Mul, dom, active):
        fs = factors(a)
        dep = [f for f in fs if self._depends_expr(f, dom, active)]
        indep = [f for f in fs if not self._depends_expr(f, dom, active)]
        if len(dep) != 1:
            return None
        m = self._canon(monomial(indep)) if indep else Sum.of_const(1, a.dtype)
        flo, fhi = self._eval_set(self._canon(dep[0]), dom, active)
        mlo, mhi = self._bound_sum(m)
        if mlo >= 0:
            return (None if flo is None else self._mul_sums(flo, m),
                    None if fhi is None else self._mul_sums(fhi, m))
        if mhi <= 0:
            return (None if fhi is None else self._mul_sums(fhi, m),
                    None if flo is None else self._mul_sums(flo, m))
        return None

    def _eval_div_set(self, a, dom, active):
        t = type(a)
        d = a.dtype
        b = self._canon(a.b)
        xlo, xhi = self._eval_set(self._canon(a.a), dom, active)
        if t is FloorDiv or t is Div:
            if self._prove_pos(b):  # monotone in the dividend
                return (None if xlo is None else self._canon(t(self._expr(xlo), a.b)),
                        None if xhi is None else self._canon(t(self._expr(xhi), a.b)))
            return None
        if not self._prove_pos(b):
            return None
        top = add_const(b, -1)
        if xlo is not None and self._prove_nonneg(xlo):
            if xhi is not None and self._prove_nonneg(sub(top, xhi)):
                return xlo, xhi  # never wraps
            return Sum.of_const(0, d), top
        if t is FloorMod:
            return Sum.of_const(0, d), top
        return scale(top, -1), top


def _divide_gcd(r: Sum, c: int) -> tuple[Sum, int]:
    """Divide ``r`` and ``c`` by their common factor: floordiv(g*r', g*c') == floordiv(r', c')."""
    g = gcd(c, r.const)
    for _, k in r.terms.values():
        g = gcd(g, k)
    if g <= 1:
        return r, c
    return Sum({key: (a, k // g) for key, (a, k) in r.terms.items()}, r.const // g, r.dtype), c // g


def _dtype_bound(dtype: str) -> tuple[int, int]:
    if _is_scalar_int(dtype) or dt.is_bool(dtype):
        lo, hi = int_range(dtype)
        return ib.clamp(lo), ib.clamp(hi)
    return EVERYTHING


def _range_contains(outer: str, inner: str) -> bool:
    """Every value of dtype ``inner`` is a value of dtype ``outer``."""
    olo, ohi = int_range(outer)
    ilo, ihi = int_range(inner)
    return olo <= ilo and ihi <= ohi


def _rebuild(e, **fields):
    """``e`` with new field values, or ``e`` itself if every value is the same object."""
    def unchanged(old, new):
        if isinstance(new, tuple):
            return len(old) == len(new) and all(a is b for a, b in zip(old, new))
        return old is new
    if all(unchanged(getattr(e, k), v) for k, v in fields.items()):
        return e
    return e.replace(**fields)


def _float_identity(t, a, b):
    """``x * 1.0``, ``x / 1.0``, ``x + 0.0``, ``x - 0.0`` and friends: exact in IEEE arithmetic."""
    def is_val(x, v):
        return type(x) is FloatImm and x.value == v
    if t is Mul:
        if is_val(b, 1.0):
            return a
        if is_val(a, 1.0):
            return b
    elif t is Div:
        if is_val(b, 1.0):
            return a
    elif t is Add:
        if is_val(b, 0.0):
            return a
        if is_val(a, 0.0):
            return b
    elif t is Sub:
        if is_val(b, 0.0):
            return a
    return None


def _substitute_var(body: PrimExpr, var: Var, value: PrimExpr) -> PrimExpr:
    return substitute(body, {var: value})


_CMP_SET = frozenset(_CMP_TYPES)
# atoms a proof may split into the cases of their operands (_prove_by_cases)
_CASE_ATOMS = frozenset((Min, Max, Select))

_CANON = {
    IntImm: Analyzer._canon_imm,
    Var: Analyzer._canon_var,
    Add: Analyzer._canon_addsub,
    Sub: Analyzer._canon_addsub,
    Mul: Analyzer._canon_mul,
    FloorDiv: Analyzer._canon_div,
    FloorMod: Analyzer._canon_div,
    Div: Analyzer._canon_div,
    Mod: Analyzer._canon_div,
    Min: Analyzer._canon_minmax,
    Max: Analyzer._canon_minmax,
    Select: Analyzer._canon_select,
    Cast: Analyzer._canon_cast,
    Let: Analyzer._canon_let,
}


# =============================================================================================
# module-level helpers: a fresh Analyzer with the given bindings


def _analyzer(bindings) -> Analyzer:
    ana = Analyzer()
    if bindings:
        for v, r in bindings.items():
            ana.bind(v, r)
    return ana


def simplify(expr, bindings: Mapping[Var, Range | PrimExpr] | None = None) -> PrimExpr:
    """Simplify ``expr``; ``bindings`` maps vars to their Range (or to a value).

    Examples
    --------
    >>> from tilecraft.tensorir import var, Range
    >>> i, j = var("i"), var("j")
    >>> simplify((i * 8 + j) % 8, {j: Range(0, 8)})
    j
    """
    return _analyzer(bindings).simplify(expr)


def can_prove(cond, bindings: Mapping[Var, Range | PrimExpr] | None = None) -> bool:
    """True only if ``cond`` holds for all values of the bound vars.

    Examples
    --------
    >>> from tilecraft.tensorir import var, Range
    >>> i = var("i")
    >>> can_prove(i < 16, {i: Range(0, 8)})
    True
    """
    return _analyzer(bindings).can_prove(cond)


def const_int_bound(expr, bindings: Mapping[Var, Range | PrimExpr] | None = None) -> ConstIntBound:
    """Constant bounds of ``expr`` given the vars' Ranges.

    Examples
    --------
    >>> from tilecraft.tensorir import var, Range
    >>> i = var("i")
    >>> const_int_bound(i % 4 + 1, {i: Range(0, 100)})
    ConstIntBound[1, 4]
    """
    return _analyzer(bindings).const_int_bound(expr)


def int_set(expr, dom_map: Mapping[Var, Range]) -> IntervalSet:
    """Symbolic bounds of ``expr`` when each var of ``dom_map`` ranges over its Range.

    Examples
    --------
    >>> from tilecraft.tensorir import var, Range
    >>> i, j = var("i"), var("j")
    >>> s = int_set(i * 4 + j, {i: Range(0, 8), j: Range(0, 4)})
    >>> (s.min_value.value, s.max_value.value)
    (0, 31)
    """
    return Analyzer().int_set(expr, dom_map)
