"""``CompactBufferAllocation``: shrink shared and local intermediates to the region they touch.

``cache_read(block, i, "shared")`` followed by ``compute_at(..., ko)`` leaves the cache buffer
with the whole tensor's shape; the kernel only ever touches one tile of it at a time. This pass
(TVM's ``CompactBufferAllocation`` + ``PlanAndUpdateBufferAllocationLocation``, on loop form)
moves each ``shared`` / ``local`` ``Allocate`` to the lowest loop body that contains every
access to it and gives it the shape of the region accessed below that point:

* the loops inside the new allocation point range over their whole extent;
* thread-bound loops whose threads share the storage range too, wherever they are: for
  ``shared`` the ``threadIdx`` and ``vthread`` loops, for ``local`` the ``vthread`` loops (TVM's
  storage-rank rule);
* loops outside the point are fixed: the region's start may depend on them (``i_0 * 4``), its
  extent must not — a tile of constant size is what GPU shared memory and registers need.

Every access ``buf[i, j]`` becomes ``buf'[i - min_i, j - min_j]``. Per dimension, an extent
that depends on the outer loops takes its constant upper bound (a clamped index); a region with
no constant bound, or larger than the buffer's constant dimension (interval bounds ignore the
guards of a cooperative fetch), keeps that dimension whole. A buffer with a dimension that is
symbolic and unbounded keeps its allocation unchanged.
Global intermediates are never touched (they are device temporaries with their full shape).

It runs on multi-dimensional loop form: after ``ConvertBlocksToLoops`` and before
``FlattenBuffers``.
"""
from __future__ import annotations

from .. import arith
from ..expr import (INTRINSIC_ELEMENTS, Add, BufferLoad, Call, FloorDiv, IntImm, Max, Min, Mul,
                    PrimExpr, Sub, Var)
from ..function import PrimFunc
from ..functor import IRMutator, IRVisitor, children
from ..stmt import Allocate, Buffer, BufferStore, For, Range, Stmt
from ..structural import structural_equal
from ._common import prim_func_pass

# scope -> thread-tag prefixes whose loops share one buffer of that scope
_RELAXED = {"shared": ("threadIdx", "vthread"), "local": ("vthread",)}


class _Accesses(IRVisitor):
    """Every access to ``buf`` below a statement, with the chain of loops around it."""

    def __init__(self, buf: Buffer):
        super().__init__()
        self.buf = buf
        self.chain: list[For] = []
        self.found: list[tuple[tuple, tuple[For, ...]]] = []   # (indices, loops)

    def visit_For(self, f: For):
        self.chain.append(f)
        self.visit(f.min)
        self.visit(f.extent)
        self.visit(f.body)
        self.chain.pop()

    def visit_BufferLoad(self, e: BufferLoad):
        if e.buffer is self.buf:
            self.found.append((e.indices, tuple(self.chain)))
        for i in e.indices:
            self.visit(i)

    def visit_BufferStore(self, s: BufferStore):
        if s.buffer is self.buf:
            self.found.append((s.indices, tuple(self.chain)))
        self.visit(s.value)
        for i in s.indices:
            self.visit(i)

    def visit_Call(self, e: Call):
        # an intrinsic naming the first of ``n`` consecutive elements (INTRINSIC_ELEMENTS)
        # touches the last of them too
        counts = INTRINSIC_ELEMENTS.get(e.op, ())
        for a, n in zip(e.args, counts):
            if isinstance(a, BufferLoad) and a.buffer is self.buf and n > 1 and a.indices:
                last = a.indices[:-1] + (Add(a.indices[-1], IntImm(n - 1, a.indices[-1].dtype)),)
                self.found.append((last, tuple(self.chain)))
        for a in e.args:
            self.visit(a)


def _common_prefix(chains) -> list[For]:
    out: list[For] = []
    for loops in zip(*chains):
        if all(f is loops[0] for f in loops):
            out.append(loops[0])
        else:
            break
    return out


class _Rewrite(IRMutator):
    """Remove the old allocation, re-index the accesses, allocate at the new point."""

    def __init__(self, old_alloc: Allocate, new_buf: Buffer, mins, point: For | None):
        super().__init__()
        self.old_alloc, self.old, self.new, self.mins, self.point = \
            old_alloc, old_alloc.buffer, new_buf, mins, point

    def visit_Buffer(self, buf):
        return buf

    def _index(self, indices):
        return tuple(arith.simplify(i - m) if not (isinstance(m, IntImm) and m.value == 0)
                     else i for i, m in zip(indices, self.mins))

    def visit_BufferLoad(self, e):
        e = self.generic_visit(e)
        if e.buffer is self.old:
            return BufferLoad(self.new, self._index(e.indices))
        return e

    def visit_BufferStore(self, s):
        s = self.generic_visit(s)
        if s.buffer is self.old:
            return BufferStore(self.new, s.value, self._index(s.indices))
        return s

    def visit_Allocate(self, a: Allocate):
        if a is self.old_alloc:
            body = self.visit(a.body)
            return Allocate(self.new, body) if self.point is None else body
        return self.generic_visit(a)

    def visit_For(self, f: For):
        out = self.generic_visit(f)
        if f is self.point:
            out = out.replace(body=Allocate(self.new, out.body))
        return out


def _tile_extent(analyzer, lo: PrimExpr, hi: PrimExpr) -> int | None:
    """``hi - lo + 1`` if constant, else its constant upper bound (None if it has none)."""
    extent = analyzer.simplify(hi - lo + 1)
    if isinstance(extent, IntImm):
        return extent.value
    return _upper_bound(analyzer, extent, _CASE_DEPTH, [_CASE_BUDGET])


# How deep ``_upper_bound`` nests its case splits, and how many cases it looks at in all.
_CASE_DEPTH = 6
_CASE_BUDGET = 256


def _upper_bound(analyzer, e: PrimExpr, depth: int, budget: list) -> int | None:
    """A constant upper bound of ``e`` (None if none is found), by cases on its min / max
    nodes: interval bounds lose the link between ``max(i * 4 + 3, min(i * 4 + 4, n - 1))``
    and the ``- i * 4`` next to it, while each case (``i * 4 + 3 - i * 4 + 1``) simplifies to
    a constant. ``f(max(x, y))`` is ``f(x)`` or ``f(y)`` at every point, so it is at most the
    larger bound; with ``f`` non-decreasing, ``f(min(x, y))`` is at most the smaller
    (mirrored for non-increasing ``f``). Every min / max term of the sum is tried (which one
    to split first matters: ``max(a, b) - min(a, b)`` needs the ``min``), and a pair of like
    clamps is cancelled (``_pair_clamps``); the smallest bound wins."""
    b = analyzer.const_int_bound(e)
    best = None if b.max_value >= b.POS_INF else int(b.max_value)

    def offer(ub):
        nonlocal best
        if ub is not None:
            best = ub if best is None else min(best, ub)

    if depth <= 0 or budget[0] <= 0:
        return best
    paired = _pair_clamps(e)
    if paired is not None:
        budget[0] -= 1
        offer(_upper_bound(analyzer, analyzer.simplify(paired), depth - 1, budget))
    terms: list = []
    _linear_terms(e, 1, terms)
    cands = [(t, 1 if c > 0 else -1) for c, t in terms if isinstance(t, (Min, Max))]
    nested = _case_node(e, 1)
    if nested is not None and all(nested[0] is not t for t, _ in cands):
        cands.append(nested)
    for node, sign in cands:
        if budget[0] <= 0:
            break
        budget[0] -= 2
        bounds = [_upper_bound(analyzer, analyzer.simplify(_replace_node(e, node, side)),
                               depth - 1, budget) for side in (node.a, node.b)]
        monotone = _occurrences(e, node) == 1
        if monotone and (isinstance(node, Min) == (sign > 0)):
            known = [x for x in bounds if x is not None]
            offer(min(known) if known else None)
        else:
            offer(None if None in bounds else max(bounds))
    return best


def _linear_terms(e: PrimExpr, coef: int, out: list) -> None:
    """``e`` as ``sum(coef * term)`` over + - and multiplications by constants."""
    if isinstance(e, Add):
        _linear_terms(e.a, coef, out)
        _linear_terms(e.b, coef, out)
    elif isinstance(e, Sub):
        _linear_terms(e.a, coef, out)
        _linear_terms(e.b, -coef, out)
    elif isinstance(e, Mul) and isinstance(e.b, IntImm):
        _linear_terms(e.a, coef * e.b.value, out)
    elif isinstance(e, Mul) and isinstance(e.a, IntImm):
        _linear_terms(e.b, coef * e.a.value, out)
    else:
        out.append((coef, e))


def _pair_clamps(e: PrimExpr) -> PrimExpr | None:
    """An expression at least ``e`` everywhere, with one pair of like clamps cancelled: a
    clamp does not widen a difference, ``min(x, c) - min(y, c) <= max(x - y, 0)`` (and so
    for ``max``). That is the extent of a clamped window, ``max(min(j * 4 + 5, m - 1), 0) -
    max(min(j * 4 + 2, m - 1), 0) + 1 <= 4``, which splitting the cases one by one misses
    (they are not independent). None if ``e`` has no such pair."""
    terms: list = []
    _linear_terms(e, 1, terms)
    for p, (cp, a) in enumerate(terms):
        if cp <= 0 or not isinstance(a, (Min, Max)):
            continue
        for q, (cq, b) in enumerate(terms):
            if cq != -cp or type(b) is not type(a):
                continue
            for x, c in ((a.a, a.b), (a.b, a.a)):
                for y, d in ((b.a, b.b), (b.b, b.a)):
                    if structural_equal(c, d):
                        rest = [t * k for k, t in (terms[r] for r in range(len(terms))
                                                   if r not in (p, q))]
                        out = Max(x - y, IntImm(0, x.dtype)) * cp
                        for t in rest:
                            out = out + t
                        return out
    return None


def _case_node(e: PrimExpr, sign: int):
    """The first min / max of ``e`` reached through + - and multiplications / floor divisions
    by constants, with the sign of ``e``'s dependence on it; None if there is none."""
    if isinstance(e, (Min, Max)):
        return e, sign
    if isinstance(e, Add):
        return _case_node(e.a, sign) or _case_node(e.b, sign)
    if isinstance(e, Sub):
        return _case_node(e.a, sign) or _case_node(e.b, -sign)
    if isinstance(e, Mul):
        for x, c in ((e.a, e.b), (e.b, e.a)):
            if isinstance(c, IntImm) and c.value != 0:
                return _case_node(x, sign if c.value > 0 else -sign)
        return None
    if isinstance(e, FloorDiv) and isinstance(e.b, IntImm) and e.b.value > 0:
        return _case_node(e.a, sign)
    return None


def _replace_node(e: PrimExpr, node: PrimExpr, new: PrimExpr) -> PrimExpr:
    if e is node:
        return new
    if isinstance(e, (Add, Sub, Mul, FloorDiv)):
        return type(e)(_replace_node(e.a, node, new), _replace_node(e.b, node, new))
    return e


def _occurrences(e: PrimExpr, node: PrimExpr) -> int:
    n = 0
    stack = [e]
    while stack:
        x = stack.pop()
        if x is node:
            n += 1
        elif not isinstance(x, (Var, IntImm)):
            stack.extend(children(x))
    return n


def _compact_one(body: Stmt, alloc: Allocate) -> Stmt:
    buf = alloc.buffer
    acc = _Accesses(buf)
    acc.visit(alloc.body)
    if not acc.found:
        return body
    chains = [loops for _, loops in acc.found]
    common = _common_prefix(chains)
    point = common[-1] if common else None
    relaxed_tags = _RELAXED[buf.scope]
    outer = set(id(f) for f in common)
    analyzer = arith.Analyzer()
    for f in common:
        analyzer.bind(f.loop_var, Range(f.min, f.extent))
    # per dimension, the union of the intervals the accesses touch (None: some is unbounded)
    ndim = len(buf.shape)
    mins: list = [None] * ndim
    maxs: list = [None] * ndim
    bounded = [True] * ndim
    for indices, loops in acc.found:
        dom = {}
        for f in loops:
            inner = id(f) not in outer
            shared_thread = f.kind == "thread_binding" and f.thread_tag and \
                f.thread_tag.startswith(relaxed_tags)
            if inner or shared_thread:
                dom[f.loop_var] = Range(f.min, f.extent)
        for k, index in enumerate(indices):
            if not bounded[k]:
                continue
            s = analyzer.int_set(index, dom)
            if not s.is_bounded():
                bounded[k] = False
            elif mins[k] is None:
                mins[k], maxs[k] = s.min_value, s.max_value
            else:
                mins[k] = analyzer.simplify(Min(mins[k], s.min_value))
                maxs[k] = analyzer.simplify(Max(maxs[k], s.max_value))
    # Each dimension gets the tile's extent, or its upper bound where the extent depends on
    # the outer loops (a clamped index: min(i_0 * 4 + 3, n - 1) - i_0 * 4 + 1 <= 4). Where
    # that is unknown or more than the buffer's (constant) extent — the region ignores the
    # guards that clip it, as a cooperative fetch's ``fused // 9`` under ``fused < 288`` — the
    # dimension stays whole: VerifyMemoryAccess has put every access inside the buffer.
    old_shape = [s.value if isinstance(s, IntImm) else None for s in buf.shape]
    shape = []
    for k in range(ndim):
        tile = _tile_extent(analyzer, mins[k], maxs[k]) if bounded[k] else None
        if tile is not None and (old_shape[k] is None or tile <= old_shape[k]):
            shape.append(max(tile, 1))
        elif old_shape[k] is not None:
            mins[k] = IntImm(0, "int64")
            shape.append(old_shape[k])
        else:
            return body
    if all(o is not None and s == o for s, o in zip(shape, old_shape)) and \
            all(isinstance(m, IntImm) and m.value == 0 for m in mins):
        return body   # already compact: nothing to gain
    new_buf = Buffer(buf.name, [IntImm(s, "int64") for s in shape], buf.dtype,
                     _compact_strides(buf, shape), scope=buf.scope, align=buf.align)
    return _Rewrite(alloc, new_buf, mins, point).visit(body)


# the residue (mod this many elements) of a padded stride that compaction keeps
ALIGN_MODULUS = 32


def _compact_strides(buf: Buffer, shape: list[int]):
    """Strides for the compacted tile of ``buf``: None for a compact buffer; for one padded by
    ``storage_align`` (explicit strides), each padded axis keeps its stride's residue modulo
    ``ALIGN_MODULUS`` (what avoids bank conflicts: alignments with a factor dividing 32, as
    ``storage_align(..., factor=32, offset=4)``), the smallest such stride over the tile."""
    if buf.strides is None or not all(isinstance(s, IntImm) for s in buf.strides):
        return None
    old_shape = [s.value if isinstance(s, IntImm) else None for s in buf.shape]
    old = [s.value for s in buf.strides]
    out = [1] * len(shape)
    dense_old = 1
    for k in range(len(shape) - 1, -1, -1):
        nxt = out[k + 1] * shape[k + 1] if k + 1 < len(shape) else 1
        padded = old[k] != dense_old
        if padded:
            r = old[k] % ALIGN_MODULUS
            nxt += (r - nxt) % ALIGN_MODULUS
        out[k] = nxt
        if k == 0:
            break          # the outermost extent sizes no stride (it may be symbolic)
        if old_shape[k] is None:
            return None
        dense_old = old[k] * old_shape[k]
    return [IntImm(x, "int64") for x in out]


class _FindAllocs(IRVisitor):
    def __init__(self):
        super().__init__()
        self.allocs: list[Allocate] = []

    def visit_Allocate(self, a: Allocate):
        if a.buffer.scope in _RELAXED:
            self.allocs.append(a)
        self.visit(a.body)


@prim_func_pass
def CompactBufferAllocation(func: PrimFunc) -> PrimFunc:
    """Shrink every shared / local ``Allocate`` to the tile it touches, allocated at the lowest
    loop containing all its accesses (see the module docstring).

    Examples
    --------
    >>> # A_shared: (n, 64) allocated at the top, used under k_0 as A_shared[i_0*4+ax0, k_0*8+ax1]
    >>> # becomes A_shared: (4, 8) allocated in the k_0 loop, A_shared[ax0, ax1]
    """
    body = func.body
    names = _FindAllocs()
    names.visit(body)
    for alloc in names.allocs:
        # the Allocate objects survive rewrites of other buffers (the mutators rebuild only
        # what changes), but find it again in case an earlier rewrite rebuilt it
        finder = _FindAllocs()
        finder.visit(body)
        current = next((a for a in finder.allocs if a.buffer is alloc.buffer), None)
        if current is None:
            continue
        body = _compact_one(body, current)
    if body is func.body:
        return func
    return func.replace(body=body)


__all__ = ["CompactBufferAllocation"]

