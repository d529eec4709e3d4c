"""Buffer regions a block touches, derived from its body; widening regions over loop domains.

Primitives that change a block's body (inline, cache, rfactor, blockize ...) recompute its
``reads`` / ``writes`` with ``access_regions``; primitives that move a block (compute_at) use
``relax_region`` to find what part of a buffer a whole loop nest touches.
"""
from __future__ import annotations

from typing import Mapping

from .. import arith
from ..expr import BufferLoad, IntImm, PrimExpr, Var
from ..functor import post_order_visit, substitute
from ..stmt import (Block, BlockRealize, Buffer, BufferRegion, BufferStore, For, Range, Stmt)
from .tree import stmt_children


def _point_set(ana: arith.Analyzer, index: PrimExpr, dom: Mapping[Var, Range]):
    return ana.int_set(index, dom)


class _Collector:
    """Accesses below a block body, with the loop domains that enclose each one."""

    def __init__(self):
        self.reads: list[tuple[Buffer, list]] = []   # (buffer, [IntervalSet per dim])
        self.writes: list[tuple[Buffer, list]] = []
        self.ana = arith.Analyzer()

    def stmt(self, s: Stmt, dom: dict):
        if isinstance(s, For):
            inner = dict(dom)
            inner[s.loop_var] = Range(s.min, s.extent)
            self.expr_fields(s, dom, skip=("body",))
            self.stmt(s.body, inner)
            return
        if isinstance(s, BlockRealize):
            for v in s.iter_values:
                self.expr(v, dom)
            self.expr(s.predicate, dom)
            vmap = {iv.var: val for iv, val in zip(s.block.iter_vars, s.iter_values)}
            local = {id(b) for b in s.block.alloc_buffers}
            for regions, out in ((s.block.reads, self.reads), (s.block.writes, self.writes)):
                for r in regions:
                    if id(r.buffer) in local:
                        continue
                    sets = []
                    for rng in r.region:
                        lo = substitute(rng.min, vmap)
                        hi = substitute(rng.min + rng.extent - 1, vmap)
                        a, b = self.ana.int_set(lo, dom), self.ana.int_set(hi, dom)
                        sets.append(arith.IntervalSet(a.min_value, b.max_value))
                    out.append((r.buffer, sets))
            return
        if isinstance(s, BufferStore):
            self.writes.append((s.buffer, [_point_set(self.ana, i, dom) for i in s.indices]))
            self.expr(s.value, dom)
            for i in s.indices:
                self.expr(i, dom)
            return
        self.expr_fields(s, dom)
        for c in stmt_children(s):
            self.stmt(c, dom)

    def expr_fields(self, s, dom, skip=()):
        for f in s._fields:
            if f in skip:
                continue
            v = getattr(s, f)
            if isinstance(v, PrimExpr):
                self.expr(v, dom)

    def expr(self, e: PrimExpr, dom: dict):

        def visit(n):
            if isinstance(n, BufferLoad):
                self.reads.append((n.buffer, [_point_set(self.ana, i, dom) for i in n.indices]))

        post_order_visit(e, visit)


def _merge(ana: arith.Analyzer, accesses) -> list[BufferRegion]:
    order: list[Buffer] = []
    sets: dict[int, list] = {}
    for buf, dims in accesses:
        if id(buf) not in sets:
            order.append(buf)
            sets[id(buf)] = list(dims)
        else:
            sets[id(buf)] = [ana.union([a, b]) for a, b in zip(sets[id(buf)], dims)]
    out = []
    for buf in order:
        ranges = []
        for d, s in enumerate(sets[id(buf)]):
            if s.is_bounded():
                ranges.append(ana.to_range(s))
            else:  # unknown extent: the whole dimension
                ranges.append(Range(IntImm(0, buf.shape[d].dtype), buf.shape[d]))
        out.append(BufferRegion(buf, ranges))
    return out


def access_regions(block: Block) -> tuple[list[BufferRegion], list[BufferRegion]]:
    """``(reads, writes)`` of ``block`` computed from its body (and init), in terms of its iter
    vars; loops inside the block are relaxed over their ranges.

    A reduction block's read of its own output (``C[vi, vj] = C[vi, vj] + ...``) is left out, as in
    TVM; so are accesses to buffers the block allocates itself.

    Examples
    --------
    >>> reads, writes = access_regions(sch.get(sch.get_block("C")))   # doctest: +SKIP
    """
    c = _Collector()
    c.stmt(block.body, {})
    if block.init is not None:
        c.stmt(block.init, {})
    local = {id(b) for b in block.alloc_buffers}
    written = {id(b) for b, _ in c.writes}
    reads = [(b, d) for b, d in c.reads
             if id(b) not in local and not (block.init is not None and id(b) in written)]
    writes = [(b, d) for b, d in c.writes if id(b) not in local]
    return _merge(c.ana, reads), _merge(c.ana, writes)


def with_regions(block: Block) -> Block:
    """``block`` with its reads/writes recomputed from its body."""
    reads, writes = access_regions(block)
    return block.replace(reads=tuple(reads), writes=tuple(writes),
                         annotations=dict(block.annotations))


def relax_region(region: BufferRegion, dom_map: Mapping[Var, Range],
                 analyzer: arith.Analyzer | None = None) -> BufferRegion:
    """Widen ``region`` over the variables of ``dom_map`` (each ranging over its Range).

    Examples
    --------
    >>> # A[vi, 0:4] with vi = i*4 + ii, ii in [0, 4)  ->  A[i*4 : i*4+4, 0:4]     # doctest: +SKIP
    """
    ana = analyzer or arith.Analyzer()
    ranges = []
    for rng in region.region:
        lo = ana.int_set(rng.min, dom_map)
        hi = ana.int_set(rng.min + rng.extent - 1, dom_map)
        s = arith.IntervalSet(lo.min_value, hi.max_value)
        if s.is_bounded():
            ranges.append(ana.to_range(s))
        else:
            d = len(ranges)
            ranges.append(Range(IntImm(0, region.buffer.shape[d].dtype), region.buffer.shape[d]))
    return BufferRegion(region.buffer, ranges)


def substitute_region(region: BufferRegion, vmap) -> BufferRegion:
    """``region`` with variables replaced (e.g. block iter vars by their bindings)."""
    return BufferRegion(region.buffer, [Range(substitute(r.min, vmap), substitute(r.extent, vmap))
                                        for r in region.region])
