"""Helpers of the loop primitives: variable use, affine bindings, rewriting the blocks under a
loop after its variable is replaced (split, fuse)."""
from __future__ import annotations

from typing import Iterable, Mapping

from .. import arith
from .. import dtype as dt
from ..expr import (Add, And, Cast, CmpOp, FloorDiv, FloorMod, IntImm, Mul, PrimExpr, Sub, Var,
                    convert, true)
from ..function import PrimFunc
from ..functor import IRMutator, post_order_visit, substitute
from ..stmt import BlockRealize, For, IfThenElse, Range, SeqStmt, Stmt, is_true
from . import tree


def vars_in(node) -> set[Var]:
    """Every Var that occurs in ``node``."""
    out: set[Var] = set()

    def fn(n):
        if isinstance(n, Var):
            out.add(n)

    post_order_visit(node, fn)
    return out


def uses_var(node, var: Var) -> bool:
    return var in vars_in(node)


def uses_any(node, variables: Iterable[Var]) -> bool:
    vs = set(variables)
    return bool(vs) and not vs.isdisjoint(vars_in(node))


def is_quasi_affine(e: PrimExpr, loop_vars: set[Var]) -> bool:
    """Whether ``e`` is a quasi-affine function of ``loop_vars``: sums of loop variables times
    loop-invariant factors, floor-divided or floor-taken-modulo by loop-invariant divisors (the
    forms split and fuse produce). Other variables count as invariants.

    Examples
    --------
    >>> from tilecraft.tensorir import var
    >>> i, j = var("i"), var("j")
    >>> is_quasi_affine((i * 8 + j) // 4, {i, j}), is_quasi_affine(i * j, {i, j})
    (True, False)
    """
    if not uses_any(e, loop_vars):
        return True
    if isinstance(e, Var):
        return True
    if isinstance(e, (Add, Sub)):
        return is_quasi_affine(e.a, loop_vars) and is_quasi_affine(e.b, loop_vars)
    if isinstance(e, Mul):
        if not uses_any(e.a, loop_vars):
            return is_quasi_affine(e.b, loop_vars)
        if not uses_any(e.b, loop_vars):
            return is_quasi_affine(e.a, loop_vars)
        return False
    if isinstance(e, (FloorDiv, FloorMod)):
        return not uses_any(e.b, loop_vars) and is_quasi_affine(e.a, loop_vars)
    if isinstance(e, Cast):
        return dt.is_integer(e.dtype) and is_quasi_affine(e.value, loop_vars)
    return False


def block_scopes(loop: For, ancestors: tuple) -> list[tuple[BlockRealize, list[For]]]:
    """Every BlockRealize under ``loop`` (nested ones too), each with the loops of its own scope
    (from its enclosing block down to it), outermost first."""
    out = []
    for s, parents in tree.walk(loop, tuple(ancestors)):
        if isinstance(s, BlockRealize):
            out.append((s, tree.loops_between(parents)))
    return out


def loop_analyzer(func: PrimFunc, skip: Iterable[Var] = (), bind_unit: bool = True
                  ) -> arith.Analyzer:
    """An Analyzer that knows the range of every loop variable of ``func`` (but ``skip``).

    With ``bind_unit=False`` loops of extent 1 stay unknown, so that simplifying a binding does
    not fold them away (``u + i`` stays as it is, as ``preserve_unit_iters`` promises).
    """
    ana = arith.Analyzer()
    skip = set(skip)
    for s, _ in tree.walk(func.body):
        if isinstance(s, For) and s.loop_var not in skip:
            if bind_unit or not is_one(s.extent):
                ana.bind(s.loop_var, Range(s.min, s.extent))
    return ana


def conjoin(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """``a && b``, dropping a literal ``True``."""
    if is_true(a):
        return b
    if is_true(b):
        return a
    return And(a, b)


def conjuncts(e: PrimExpr) -> list[PrimExpr]:
    if isinstance(e, And):
        return conjuncts(e.a) + conjuncts(e.b)
    return [e]


def simplify_predicate(pred: PrimExpr, ana: arith.Analyzer) -> PrimExpr:
    """Simplify each conjunct of ``pred`` (the sides of a comparison separately, which keeps
    them readable: ``i_0 * 8 + i_1 < 10``), dropping those that are provably true."""
    out: PrimExpr = true()
    for c in conjuncts(pred):
        if ana.can_prove(c):
            continue
        if isinstance(c, CmpOp):
            c = type(c)(ana.simplify(c.a), ana.simplify(c.b))
        else:
            c = ana.simplify(c)
        out = conjoin(out, c)
    return out


def only_blocks_below(s: Stmt) -> bool:
    """True if, looking through loops and sequences, ``s`` holds only BlockRealizes: then a
    predicate can go on the blocks; otherwise it needs an IfThenElse around ``s``."""
    if isinstance(s, BlockRealize):
        return True
    if isinstance(s, For):
        return only_blocks_below(s.body)
    if isinstance(s, SeqStmt):
        return all(only_blocks_below(x) for x in s.seq)
    return False


class _ChildBlockRewriter(IRMutator):
    """Substitute loop variables in the child blocks' iter values (simplified) and conjoin a
    predicate to them; the blocks themselves are left as they are."""

    def __init__(self, vmap: Mapping[Var, PrimExpr], ana: arith.Analyzer,
                 predicate: PrimExpr | None):
        super().__init__()
        self.vmap, self.ana, self.predicate = vmap, ana, predicate

    def visit_BlockRealize(self, br: BlockRealize):
        keys = set(self.vmap)
        values = tuple(self.ana.simplify(substitute(v, self.vmap)) if uses_any(v, keys) else v
                       for v in br.iter_values)
        pred = br.predicate
        if uses_any(pred, keys):
            pred = simplify_predicate(substitute(pred, self.vmap), self.ana)
        if self.predicate is not None:
            pred = conjoin(pred, self.predicate)
        block = substitute(br.block, self.vmap)  # normally a no-op: blocks see loops via bindings
        if (block is br.block and pred is br.predicate
                and all(a is b for a, b in zip(values, br.iter_values))):
            return br
        return BlockRealize(values, pred, block)

    def visit_Var(self, v: Var):
        r = self.vmap.get(v)
        return v if r is None else r


def rewrite_loop_body(body: Stmt, vmap: Mapping[Var, PrimExpr], ana: arith.Analyzer,
                      predicate: PrimExpr | None = None) -> Stmt:
    """``body`` with loop variables replaced by ``vmap`` (iter values simplified with ``ana``)
    and, if given, ``predicate`` added to every child block (or an IfThenElse when the body has
    statements outside blocks)."""
    if predicate is not None and not only_blocks_below(body):
        return IfThenElse(predicate, rewrite_loop_body(body, vmap, ana))
    return _ChildBlockRewriter(vmap, ana, predicate).visit(body)


def product(values: Iterable[PrimExpr], dtype: str, ana: arith.Analyzer) -> PrimExpr:
    """The product of ``values`` (1 when empty): constants folded, symbolic factors kept in
    their order (``n * m``, not the simplifier's canonical ``m * n``)."""
    c, syms = 1, []
    for v in values:
        v = ana.simplify(v)
        if isinstance(v, IntImm):
            c *= v.value
        else:
            syms.append(v)
    out: PrimExpr | None = None
    for v in syms:
        out = v if out is None else out * v
    if out is None:
        return IntImm(c, dtype)
    return out if c == 1 else out * IntImm(c, dtype)


def is_one(e) -> bool:
    return isinstance(e, IntImm) and e.value == 1


def is_zero(e) -> bool:
    return isinstance(e, IntImm) and e.value == 0


def mul(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """``a * b`` without multiplying by one."""
    if is_one(b):
        return a
    if is_one(a):
        return b
    return a * b


def add(a: PrimExpr | None, b: PrimExpr) -> PrimExpr:
    """``a + b`` where ``a`` may be None (nothing yet) or zero."""
    if a is None or is_zero(a):
        return b
    if is_zero(b):
        return a
    return a + b


def const(value: int, like: Var) -> IntImm:
    return convert(int(value), like)


__all__ = ["vars_in", "uses_var", "uses_any", "is_quasi_affine", "block_scopes", "loop_analyzer",
           "conjoin", "rewrite_loop_body", "product", "mul", "add", "const", "is_zero", "is_one"]
