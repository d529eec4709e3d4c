"""``LoopPartition``: give a loop whose body tests an upper bound on its variable a main part,
where the tests are provably true and removed, and a tail part that keeps them (TVM's
LoopPartition, for the tails of splits).

Splitting ``i`` by a tile that does not divide ``n`` (or a symbolic ``n``) leaves
``if i_0 * 6 + i_1 < n:`` around every row of a matmul micro-kernel, inside its reduction loop:
a branch per accumulator update that keeps the accumulators out of registers. The loop ``i_0``
(or a fused loop ``f`` with ``i_0 = f // 3``) runs, for all but its last iterations, rows that
are all below ``n``; those iterations get a copy of the body without the test.
"""
from __future__ import annotations

from .. import dtype as dt
from ..arith import Analyzer
from ..expr import (GE, GT, LE, LT, Add, And, FloorDiv, IntImm, Min, Mul, PrimExpr, Sub,
                    Var)
from ..function import PrimFunc
from ..functor import IRMutator, children, free_vars
from ..stmt import (Allocate, AssertStmt, Buffer, For, IfThenElse, LetStmt, Range, SeqStmt,
                    Stmt)
from ._common import prim_func_pass

# Each partition doubles the code of a loop nest: at most this many copies of a function's body.
MAX_COPIES = 4


def _conjuncts(e) -> list:
    if isinstance(e, And):
        return _conjuncts(e.a) + _conjuncts(e.b)
    return [e]


def _as_negative(c):
    """``e`` with ``c <=> e < 0`` for an integer comparison ``c``, else None."""
    if not isinstance(c, (LT, LE, GT, GE)) or not dt.is_integer(c.a.dtype) or \
            not dt.is_integer(c.b.dtype):
        return None
    if isinstance(c, LT):
        return c.a - c.b
    if isinstance(c, LE):
        return c.a - c.b - 1
    if isinstance(c, GT):
        return c.b - c.a
    return c.b - c.a - 1


def affine_terms(e: PrimExpr, loop_vars) -> tuple[dict, list, int] | None:
    """``e`` as ``(coefficients of loop_vars, invariant terms, constant)``, or None when it is
    not affine in ``loop_vars`` (shared with the LLVM code generator's loop partitioning)."""
    if isinstance(e, IntImm):
        return {}, [], e.value
    if isinstance(e, Var):
        return ({e: 1}, [], 0) if e in loop_vars else ({}, [e], 0)
    if isinstance(e, (Add, Sub)):
        a, b = affine_terms(e.a, loop_vars), affine_terms(e.b, loop_vars)
        if a is None or b is None:
            return None
        sign = 1 if isinstance(e, Add) else -1
        coeffs = dict(a[0])
        for v, c in b[0].items():
            coeffs[v] = coeffs.get(v, 0) + sign * c
        inv = a[1] + (b[1] if sign == 1 else [Mul(IntImm(-1, t.dtype), t) for t in b[1]])
        return {v: c for v, c in coeffs.items() if c}, inv, a[2] + sign * b[2]
    if isinstance(e, Mul):
        for k, other in ((e.a, e.b), (e.b, e.a)):
            if isinstance(k, IntImm):
                r = affine_terms(other, loop_vars)
                if r is None:
                    return None
                return ({v: c * k.value for v, c in r[0].items() if c * k.value},
                        [Mul(k, t) for t in r[1]], r[2] * k.value)
    if any(v in loop_vars for v in free_vars(e)):
        return None
    return {}, [e], 0


class _DivAtoms(IRMutator):
    """Replace ``floordiv(v, d)`` (constant ``d > 0``) by a fresh variable, recording ``d``."""

    def __init__(self, v: Var):
        super().__init__()
        self.v = v
        self.atoms: dict[Var, int] = {}

    def visit_FloorDiv(self, e: FloorDiv):
        if e.a is self.v and isinstance(e.b, IntImm) and e.b.value > 0:
            for w, d in self.atoms.items():
                if d == e.b.value:
                    return w
            w = Var(f"{self.v.name}_div{e.b.value}", self.v.dtype)
            self.atoms[w] = e.b.value
            return w
        return self.generic_visit(e)


class _Partitioner:
    def __init__(self):
        self.copies = 1

    def visit(self, s: Stmt) -> Stmt:
        if isinstance(s, For):
            out = self._partition(s)
            if out is not None:
                return out
            body = self.visit(s.body)
            return s if body is s.body else s.replace(body=body)
        if isinstance(s, SeqStmt):
            seq_ = tuple(self.visit(x) for x in s.seq)
            return s if all(a is b for a, b in zip(seq_, s.seq)) else s.replace(seq=seq_)
        if isinstance(s, IfThenElse):
            t = self.visit(s.then_case)
            e = None if s.else_case is None else self.visit(s.else_case)
            if t is s.then_case and e is s.else_case:
                return s
            return s.replace(then_case=t, else_case=e)
        if isinstance(s, (LetStmt, AssertStmt, Allocate)):
            body = self.visit(s.body)
            return s if body is s.body else s.replace(body=body)
        return s

    def _bound(self, c, v: Var, inner: dict, lets: set, ana: Analyzer):
        """An expression ``t`` (free of ``v`` and the inner loops) such that ``c`` holds for
        every inner iteration when ``v < t``, or None."""
        e = _as_negative(c)
        if e is None:
            return None
        fv = free_vars(e)
        if v not in fv or any(x in lets for x in fv):
            return None
        divs = _DivAtoms(v)
        e = divs.visit(e)
        r = affine_terms(e, {v, *divs.atoms})
        if r is None:
            return None
        used = [x for x in (v, *divs.atoms) if r[0].get(x, 0) != 0]
        if len(used) != 1 or r[0][used[0]] <= 0:
            return None  # not monotone increasing in one atom of v
        atom = used[0]
        a = r[0][atom]
        rest = sum(r[1], IntImm(r[2], e.dtype))
        rmax = ana.int_set(rest, inner).max_value
        if not isinstance(rmax, PrimExpr) or any(x in inner or x in lets or x is v
                                                 for x in free_vars(rmax)):
            return None  # unbounded, or bounded only in terms of the inner loops
        # a * atom + rest < 0 for every inner value  <=  a * atom < -rmax
        #                                            <=> atom < floordiv(a - 1 - rmax, a)
        t = FloorDiv(IntImm(a - 1, rmax.dtype) - rmax, IntImm(a, rmax.dtype))
        if atom is not v:      # v // d < t  <=>  v < t * d
            t = t * IntImm(divs.atoms[atom], rmax.dtype)
        return ana.simplify(t)

    def _partition(self, loop: For) -> Stmt | None:
        if loop.kind not in ("serial", "parallel") or self.copies >= MAX_COPIES:
            return None
        v = loop.loop_var
        inner: dict[Var, Range] = {}
        lets: set[Var] = set()
        conds: list = []

        def rec(n):
            if isinstance(n, (Buffer, PrimExpr)):
                return
            if isinstance(n, For):
                old = inner.setdefault(n.loop_var, Range(n.min, n.extent))
                if n.loop_var is v or not (bool(old.min == n.min) and
                                           bool(old.extent == n.extent)):
                    lets.add(n.loop_var)  # rebound, or two loops of one var: unknown range
            elif isinstance(n, LetStmt):
                lets.add(n.var)
            elif isinstance(n, IfThenElse):
                conds.extend(_conjuncts(n.condition))
            for ch in children(n):
                rec(ch)

        rec(loop.body)
        if not conds:
            return None
        inner = {x: r for x, r in inner.items() if x not in lets}
        ana = Analyzer()
        for x, r in inner.items():
            ana.bind(x, r)
        used, bound = [], None
        for c in conds:
            t = self._bound(c, v, inner, lets, ana)
            if t is None or ana.can_prove(t <= loop.min):
                continue  # not a bound test, or true for no iteration: nothing to gain
            used.append(c)
            bound = t if bound is None else Min(bound, t)
        if bound is None:
            return None

        def is_used(c) -> bool:
            return any(bool(c == u) for u in used)

        class DropTests(IRMutator):
            def visit_IfThenElse(self, s: IfThenElse):
                s = self.generic_visit(s)
                conj = _conjuncts(s.condition)
                keep = [c for c in conj if not is_used(c)]
                if len(keep) == len(conj):
                    return s
                if not keep:
                    return s.then_case
                cond = keep[0]
                for c in keep[1:]:
                    cond = cond & c
                return s.replace(condition=cond)

        end = loop.min + loop.extent
        split = ana.simplify(Min(bound, end))
        self.copies *= 2
        main = self.visit(DropTests().visit(loop.body))
        if ana.can_prove(split >= end):
            return loop.replace(body=main)
        # One loop with the choice per iteration (outside every inner loop, so it costs one
        # branch per tile) rather than two loops: a local buffer allocated around the loop
        # (an accumulator tile) keeps one loop holding all its accesses, which is what lets the
        # code generator shrink it to one iteration's tile, in registers.
        tail = self.visit(loop.body)
        return loop.replace(body=IfThenElse(v < split, main, tail))


@prim_func_pass
def LoopPartition(func: PrimFunc) -> PrimFunc:
    """Partition serial and parallel loops on the upper-bound tests of their bodies.

    A test is a conjunct of an ``IfThenElse`` condition, an integer ``<``, ``<=``, ``>`` or
    ``>=`` that reads ``a * x + r < 0`` with ``x`` the loop variable ``v`` or ``floordiv(v, d)``
    (a fused loop; constant ``d > 0``), ``a > 0``, and ``r`` affine in loop-invariant values
    and in the variables of constant-range loops inside ``v``. Over those inner ranges it holds
    whenever ``x < floordiv(a - 1 - max(r), a)``; with ``t`` the smallest such bound (times
    ``d``), the body becomes ``if v < t: <body without those tests> else: <body>``. The branch
    is taken once per iteration of the loop, outside its inner loops, and the loop stays one
    loop (so a local tile allocated around it can still be shrunk to one iteration's part by the
    code generator, which splits such a loop into two itself). Other conditions and loops are
    left as they are. Run it on lowered loops (after ``ConvertBlocksToLoops``).

    Examples
    --------
    >>> from tilecraft.tensorir import te, Schedule, transform
    >>> n = te.var("n")
    >>> A = te.placeholder((n,), "float32", "A")
    >>> B = te.compute((n,), lambda i: A[i] + 1.0, "B")
    >>> sch = Schedule(te.create_prim_func([A, B]))
    >>> _ = sch.split(sch.get_loops(sch.get_block("B"))[0], [None, 8])
    >>> f = LoopPartition(transform.ConvertBlocksToLoops(sch.func))
    >>> # for i_0 in range((n + 7) // 8):
    >>> #     if i_0 < n // 8: for i_1 in range(8): B[...] = ...          (no test)
    >>> #     else: for i_1 in range(8): if i_0 * 8 + i_1 < n: B[...] = ...
    """
    body = _Partitioner().visit(func.body)
    return func if body is func.body else func.replace(body=body)


__all__ = ["LoopPartition"]
