"""``CompactLocalAllocations``: allocate each ``local`` buffer of lowered (flat) code inside the
innermost loop holding all its accesses, shrunk to the elements one iteration of that loop
touches -- what keeps a register tile in registers.

It runs on flat code, after ``FlattenBuffers`` (``lower``'s CPU pipeline), and complements
``CompactBufferAllocation`` (which shrinks tiles on multi-dimensional loop form before
``LoopPartition``): it handles tiles clipped by their buffer's extent (a ``6 x 48``-lane tile of a
``(67, 45)`` output) and places every allocation in its loop. It moves a buffer only when the
move cannot be observed (see ``compact_local_allocations``). It was part of the LLVM code
generator; lowering now does it, for every code generator that consumes the lowered form.

Examples
--------
>>> # C_local = T.allocate((m * 45,), "float32", "local") at the top, used tile by tile as
>>> # C_local[i_0 * 270 + i_1 * 45 + j] under ``for i_0``
>>> # becomes  C_local = T.allocate((270,), ...) inside ``for i_0``, C_local[i_1 * 45 + j]
"""
from __future__ import annotations

import contextlib

from .. import dtype as dt
from ..arith import Analyzer
from ..expr import GE, GT, LE, LT, BufferLoad, Let, PrimExpr, Var, convert
from ..function import PrimFunc
from ..functor import IRMutator, children, free_vars
from ..stmt import (Allocate, AssertStmt, Buffer, BufferStore, For, IfThenElse, LetStmt, Range,
                    SeqStmt, Stmt)
from ._common import prim_func_pass
from .loop_partition import affine_terms

__all__ = ["CompactLocalAllocations", "compact_local_allocations", "STACK_ALLOCA_LIMIT"]

STACK_ALLOCA_LIMIT = 4096   # bytes: the LLVM code generator allocates up to this on the stack


@prim_func_pass
def CompactLocalAllocations(func: PrimFunc) -> PrimFunc:
    """``compact_local_allocations`` on the body of a lowered (flat) PrimFunc.

    Examples
    --------
    >>> f2 = CompactLocalAllocations(FlattenBuffers(f))   # doctest: +SKIP
    """
    body = compact_local_allocations(func.body)
    return func if body is func.body else func.replace(body=body)


def compact_local_allocations(body: Stmt, max_bytes: int = STACK_ALLOCA_LIMIT) -> Stmt:
    """Allocate each ``local`` intermediate inside the innermost loop holding all its accesses,
    shrunk to the elements one iteration of that loop touches (what TVM's buffer allocation at
    the accesses' lowest common ancestor and buffer compaction do, here on lowered code).

    ``cache_write(block, 0, "local")`` then ``reverse_compute_at(..., jo)`` leaves, after
    lowering, a root allocation as large as the output, indexed like
    ``C_local[i_0 * 12 * N + i_1 * N + j_0 * 32 + j_1]``. A register-blocked micro-kernel needs
    it to be the ``12 x 32`` tile of one ``(i_0, j_0)`` iteration: a small stack array accessed
    at constant offsets once its loops are unrolled and vectorized, which LLVM's SROA turns
    into registers. This pass makes that ``C_local[i_1 * 32 + j_1]`` inside the ``j_0`` loop.

    It only moves a buffer when the move cannot be observed:

    * every index is affine in the loop variables (constant positive coefficients) plus terms
      free of loop variables that are the same in every access (an access under an
      ``IfThenElse`` is read with its branch's condition known, so a tail copy in which
      lowering substituted ``i_0 = 170`` still has the term ``i_0 * 6144``);
    * each loop around the accesses down to the common one has a term in every index, the
      same in every access, and the loops' terms do not overlap in the mixed-radix sense (each
      coefficient is larger than the span of all smaller ones), so no two iterations of those
      loops share an element and no value flows from one iteration to the next;
    * the compacted buffer -- dense over the inner terms -- fits ``max_bytes`` (the LLVM code
      generator's stack allocation limit, so it costs nothing per iteration).

    The loop chosen is the innermost common one that is not ``vectorized`` (an allocation
    inside a vector body would make it scalar). Other buffers are left alone.
    """
    return _LocalCompactor(max_bytes).visit(body)


class _LocalCompactor:
    """Bottom-up over ``Allocate`` statements (inner allocations are compacted first)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes

    def visit(self, s: Stmt) -> Stmt:
        if isinstance(s, Allocate):
            body = self.visit(s.body)
            if s.buffer.scope == "local":
                moved = _compact_allocation(s.buffer, body, self.max_bytes)
                if moved is not None:
                    return moved
            return s if body is s.body else s.replace(body=body)
        if isinstance(s, For):
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
        if isinstance(s, (LetStmt, AssertStmt)):
            body = self.visit(s.body)
            return s if body is s.body else s.replace(body=body)
        return s


def _negation(c):
    """``not c`` for an integer comparison (to assume in an else branch), else None."""
    flip = {LT: GE, LE: GT, GT: LE, GE: LT}
    t = flip.get(type(c))
    return None if t is None else t(c.a, c.b)


def _compact_allocation(buf: Buffer, body: Stmt, max_bytes: int) -> Stmt | None:
    """``body`` with ``buf`` allocated (compacted) inside its accesses' common loop, or None."""

    # every access: (node, enclosing loops, index, conditions known to hold there)
    accesses: list[tuple] = []
    bound_inside: set[Var] = set()
    ok = [True]

    def rec(n, loops, conds):
        if isinstance(n, Buffer):
            return
        if isinstance(n, For):
            bound_inside.add(n.loop_var)
            rec(n.min, loops, conds)
            rec(n.extent, loops, conds)
            rec(n.body, loops + (n,), conds)
            return
        if isinstance(n, IfThenElse):
            rec(n.condition, loops, conds)
            rec(n.then_case, loops, conds + (n.condition,))
            if n.else_case is not None:
                neg = _negation(n.condition)
                rec(n.else_case, loops, conds + ((neg,) if neg is not None else ()))
            return
        if isinstance(n, (LetStmt, Let)):
            bound_inside.add(n.var)
        if isinstance(n, (BufferLoad, BufferStore)) and n.buffer is buf:
            if len(n.indices) != 1:
                ok[0] = False
            else:
                accesses.append((n, loops, n.indices[0], conds))
        if isinstance(n, Allocate) and n.buffer is buf:
            ok[0] = False
        for c in children(n):
            rec(c, loops, conds)

    rec(body, (), ())
    if not ok[0] or not accesses:
        return None
    prefix = list(accesses[0][1])
    for _, loops, _, _ in accesses[1:]:
        k = 0
        while k < min(len(prefix), len(loops)) and prefix[k] is loops[k]:
            k += 1
        del prefix[k:]
    while prefix and prefix[-1].kind == "vectorized":
        prefix.pop()
    if not prefix:
        return None
    home = prefix[-1]
    outer = {f.loop_var for f in prefix}
    loop_of: dict[Var, For] = {}
    for _, loops, _, _ in accesses:
        for f in loops:
            g = loop_of.setdefault(f.loop_var, f)
            if g is not f and not (bool(g.min == f.min) and bool(g.extent == f.extent)):
                return None  # one variable for two loops of different ranges
    loop_vars = set(loop_of)
    if any(v in bound_inside and v not in loop_vars
           for _, _, index, _ in accesses for v in free_vars(index)):
        return None  # an index uses a let-bound value of the body
    ana = Analyzer()
    for v, f in loop_of.items():
        ana.bind(v, Range(f.min, f.extent))

    # the outer loops' terms: from an access that has them all (the others must agree once
    # their branch conditions are known: a tail branch may hold ``i_0 = 170`` substituted)
    outer_terms = None
    for _, _, index, _ in accesses:
        r = affine_terms(index, loop_vars)
        if r is not None and all(r[0].get(v, 0) > 0 for v in outer):
            outer_terms = {v: r[0][v] for v in outer}
            break
    if outer_terms is None:
        return None  # a loop whose iterations all share the elements, or non-affine indices
    base = sum((v * c for v, c in outer_terms.items()), convert(0))
    outer_slots = {}
    for v, c in outer_terms.items():
        if c in outer_slots:
            return None
        outer_slots[c] = v

    # per access: the index relative to the outer terms, as inner slots (coefficient -> digit)
    decomposed = []   # (node, coefficient -> digit, its bounds)
    inv_sum0 = None
    for node, _, index, conds in accesses:
        with contextlib.ExitStack() as stack:
            for c in conds:
                stack.enter_context(ana.with_constraint(c))
            rel = ana.simplify(index - base)
            if any(v in outer for v in free_vars(rel)):
                return None
            r = affine_terms(rel, loop_vars)
            if r is None or any(c <= 0 for c in r[0].values()):
                return None
            coeffs, inv, const_ = r
            inv_sum = sum(inv, convert(0)) if inv else convert(0)
            if inv_sum0 is None:
                inv_sum0 = inv_sum
            elif not ana.can_prove_equal(inv_sum, inv_sum0):
                return None
            digits: dict[int, PrimExpr] = {}
            for v, c in coeffs.items():
                digits[c] = v if c not in digits else digits[c] + v
            if const_:
                digits[1] = convert(const_) if 1 not in digits else digits[1] + const_
            bounds = {}
            for c, d in digits.items():
                if c in outer_slots:
                    return None  # an inner loop shares a slot with an outer one: windows overlap
                b = ana.const_int_bound(d)
                lo, hi = int(b.min_value), int(b.max_value)
                if abs(lo) >= 1 << 62 or abs(hi) >= 1 << 62:
                    return None  # unbounded
                bounds[c] = (lo, hi)
        decomposed.append((node, digits, bounds))
    inner_slots = sorted({c for _, digits, _ in decomposed for c in digits}, reverse=True)
    ranges = {}
    for c in inner_slots:
        # an access without this slot has the digit 0 there
        los = [b[c][0] if c in b else 0 for _, _, b in decomposed]
        his = [b[c][1] if c in b else 0 for _, _, b in decomposed]
        ranges[c] = (min(los), max(his))
    # the mixed-radix check over every slot, outer loops included
    slots = [(c, ranges[c]) for c in inner_slots]
    for c, v in outer_slots.items():
        b = ana.const_int_bound(v)
        slots.append((c, (int(b.min_value), int(b.max_value))))
    slots.sort(key=lambda t: -t[0])
    span = 0  # the largest difference the slots below the current one can make
    for k in range(len(slots) - 1, -1, -1):
        c, (lo, hi) = slots[k]
        if c <= span:
            return None
        if k > 0:  # only the largest slot may be unbounded (a symbolic outer loop)
            if abs(lo) >= 1 << 62 or abs(hi) >= 1 << 62:
                return None
            span += c * (hi - lo)
    # the dense layout over the inner slots, largest coefficient outermost
    strides, size = {}, 1
    for c in reversed(inner_slots):
        strides[c] = size
        size *= ranges[c][1] - ranges[c][0] + 1
    if size * dt.itemsize(buf.dtype) > max_bytes:
        return None
    new_index: dict[int, PrimExpr] = {}
    for node, digits, _ in decomposed:
        e = convert(0)
        for c in inner_slots:
            e = e + (digits.get(c, convert(0)) - ranges[c][0]) * strides[c]
        e = ana.simplify(e)
        old = new_index.setdefault(id(node), e)
        if old is not e and not bool(old == e):
            return None  # one node object in two places that need different indices
    new_buf = Buffer(buf.name, (size,), buf.dtype, scope=buf.scope, align=buf.align)

    class Rewrite(IRMutator):
        def visit_BufferLoad(self, n: BufferLoad):
            index = new_index.get(id(n)) if n.buffer is buf else None
            n = self.generic_visit(n)
            return n if index is None else n.replace(indices=(index,))

        def visit_BufferStore(self, n: BufferStore):
            index = new_index.get(id(n)) if n.buffer is buf else None
            n = self.generic_visit(n)
            return n if index is None else n.replace(indices=(index,))

        def visit_For(self, n: For):
            new = self.generic_visit(n)
            if n is home:
                new = new.replace(body=Allocate(new_buf, new.body))
            return new

    rw = Rewrite()
    rw.buffer_map[buf] = new_buf
    return rw.visit(body)
