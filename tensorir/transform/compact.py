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

Every access ``buf[i, j]`` becomes ``buf'[i - min_i, j - min_j]``. A buffer whose region cannot
be bounded (non-affine indices) or whose extent stays symbolic keeps its allocation unchanged.
Global intermediates are never touched (they are device temporaries with their full shape).

It runs on multi-dimensional loop form: after ``ConvertBlocksToLoops`` and before
``FlattenBuffers``.
"""
from __future__ import annotations

from .. import arith
from ..expr import BufferLoad, IntImm, Max, Min, PrimExpr
from ..function import PrimFunc
from ..functor import IRMutator, IRVisitor
from ..stmt import Allocate, Buffer, BufferStore, For, Range, Stmt
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
    mins, maxs = None, None
    for indices, loops in acc.found:
        dom = {}
        for f in loops:
            inner = id(f) not in outer
            shared_thread = f.kind == "thread_binding" and f.thread_tag and \
                f.thread_tag.startswith(relaxed_tags)
            if inner or shared_thread:
                dom[f.loop_var] = Range(f.min, f.extent)
        sets = [analyzer.int_set(i, dom) for i in indices]
        if not all(s.is_bounded() for s in sets):
            return body
        lo = [s.min_value for s in sets]
        hi = [s.max_value for s in sets]
        if mins is None:
            mins, maxs = lo, hi
        else:
            mins = [analyzer.simplify(Min(a, b)) for a, b in zip(mins, lo)]
            maxs = [analyzer.simplify(Max(a, b)) for a, b in zip(maxs, hi)]
    extents = [analyzer.simplify(hi - lo + 1) for lo, hi in zip(mins, maxs)]
    if not all(isinstance(e, IntImm) for e in extents):
        return body
    # the tile never exceeds the declared buffer (a predicate may clip it below the extent)
    old_shape = [s.value if isinstance(s, IntImm) else None for s in buf.shape]
    shape = []
    for e, o in zip(extents, old_shape):
        shape.append(min(e.value, o) if o is not None else e.value)
    if any(o is not None and e.value > o for e, o in zip(extents, old_shape)):
        return body
    shape = [max(s, 1) for s in shape]
    if all(o is not None and s == o for s, o in zip(shape, old_shape)) and \
            all(isinstance(m, IntImm) and m.value == 0 for m in mins):
        return body   # already compact: nothing to gain
    new_buf = Buffer(buf.name, [IntImm(s, "int64") for s in shape], buf.dtype, scope=buf.scope,
                     align=buf.align)
    return _Rewrite(alloc, new_buf, mins, point).visit(body)


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

