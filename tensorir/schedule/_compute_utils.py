"""Helpers shared by the compute-location primitives (``primitives_compute``).

Everything here is pure: functions take statements / PrimFuncs and return new ones. The names
follow TVM's ``src/tir/schedule/primitive/compute_at.cc`` and ``compute_inline.cc`` where a
counterpart exists.
"""
from __future__ import annotations

import itertools
import math
from typing import Iterator, Sequence

from .. import arith
from ..expr import And, BufferLoad, IntImm, PrimExpr, Var, true
from ..function import PrimFunc
from ..functor import IRMutator, free_vars, post_order_visit, substitute
from ..stmt import (Allocate, AssertStmt, Block, BlockRealize, Buffer, BufferStore, Evaluate, For,
                    IfThenElse, LetStmt, Range, SeqStmt, Stmt, is_true, seq)
from . import tree
from .error import ScheduleError
from .regions import with_regions


# ---------------------------------------------------------------------------------------------
# scopes, buffers and block order


def scope_of(br: BlockRealize, ancestors: tuple, primitive: str) -> Block:
    """The block whose body holds ``br`` (its scope); the root block has none."""
    scope = tree.enclosing_block(ancestors)
    if scope is None:
        raise ScheduleError(primitive, f"block {br.block.name!r} is the root block; it has no "
                            f"enclosing scope to move or inline it in", br.block)
    return scope


def is_param_buffer(func: PrimFunc, buf: Buffer) -> bool:
    return any(b is buf for b in func.buffers)


def buffer_ids(regions) -> set[int]:
    return {id(r.buffer) for r in regions}


def scope_blocks(func: PrimFunc, scope_name: str) -> list[BlockRealize]:
    """The blocks directly under the scope ``scope_name`` (by name), in execution order."""
    scope = tree.find_block(func, scope_name)[0]
    return tree.child_block_realizes(scope)


def realizes_with_loops(stmt: Stmt, loops: tuple = ()) -> Iterator[tuple[BlockRealize, tuple]]:
    """Blocks under ``stmt`` that are not nested in another block below it, each with the For
    loops between ``stmt`` (included when it is a loop) and the block, outermost first."""
    if isinstance(stmt, BlockRealize):
        yield stmt, loops
        return
    if isinstance(stmt, For):
        loops = loops + (stmt,)
    for c in tree.stmt_children(stmt):
        yield from realizes_with_loops(c, loops)


def contains_block(stmt: Stmt, name: str) -> bool:
    return any(br.block.name == name for br, _ in realizes_with_loops(stmt))


def loops_above(ancestors: tuple) -> list[For]:
    """Every For among ``ancestors`` (through enclosing blocks too), outermost first; the
    variables that are fixed while a statement below them runs."""
    return [a for a in ancestors if isinstance(a, For)]


def bind_loops(ana: arith.Analyzer, loops: Sequence[For]) -> None:
    for f in loops:
        ana.bind(f.loop_var, Range(f.min, f.extent))


def conflict(x: Block, m: Block) -> str | None:
    """Why ``x`` and ``m`` may not swap their order (a shared buffer one of them writes), or None."""
    xr, xw = buffer_ids(x.reads), buffer_ids(x.writes)
    mr, mw = buffer_ids(m.reads), buffer_ids(m.writes)
    names = {id(r.buffer): r.buffer.name for r in x.reads + x.writes}
    for a, b, what in ((xw, mr, f"{x.name!r} writes {{}} which {m.name!r} reads"),
                       (xr, mw, f"{x.name!r} reads {{}} which {m.name!r} writes"),
                       (xw, mw, f"both {x.name!r} and {m.name!r} write {{}}")):
        common = a & b
        if common:
            return what.format(names[next(iter(common))])
    return None


# ---------------------------------------------------------------------------------------------
# tree surgery


def removal_root(br: BlockRealize, ancestors: tuple) -> Stmt:
    """The statement to delete to remove ``br``: it and the loops (and other single-child
    wrappers) that would become empty without it."""
    cur: Stmt = br
    for parent in reversed(ancestors):
        if isinstance(parent, (For, LetStmt, Allocate)) and parent.body is cur:
            cur = parent
        elif isinstance(parent, IfThenElse) and parent.else_case is None and parent.then_case is cur:
            cur = parent
        elif isinstance(parent, SeqStmt) and len(parent.seq) == 1:
            cur = parent
        else:
            break
    return cur


def remove_block(func: PrimFunc, br: BlockRealize, ancestors: tuple, primitive: str) -> PrimFunc:
    """``func`` without the block ``br`` and the loops left empty by its removal."""
    top = removal_root(br, ancestors)
    idx = ancestors.index(top) if top is not br else len(ancestors)
    parent = ancestors[idx - 1] if idx > 0 else None
    if isinstance(parent, Block):
        # the block was all its scope held; a scope needs a body
        raise ScheduleError(primitive, f"removing block {br.block.name!r} would leave block "
                            f"{parent.name!r} with an empty body", br.block)
    if isinstance(parent, AssertStmt) and parent.body is top:
        # keep the run-time check (it may guard what follows it) with an empty body
        return tree.replace(func, top, Evaluate(IntImm(0, "int32")))
    return tree.replace(func, top, None)


def insert_into_loop(func: PrimFunc, loop_var: Var, new: Stmt, position: int) -> PrimFunc:
    """Put ``new`` at index ``position`` of the body of the loop of ``loop_var`` (its body seen as
    a sequence)."""
    loop, _ = tree.find_loop(func, loop_var)
    items = list(loop.body.seq) if isinstance(loop.body, SeqStmt) else [loop.body]
    items.insert(position, new)
    return tree.replace(func, loop, loop.replace(body=seq(*items),
                                                 annotations=dict(loop.annotations)))


def body_items(loop: For) -> list[Stmt]:
    return list(loop.body.seq) if isinstance(loop.body, SeqStmt) else [loop.body]


def buffer_is_used(node, buf: Buffer) -> bool:
    """Whether anything under ``node`` loads, stores or declares a region of ``buf``."""
    found = False

    def visit(n):
        nonlocal found
        if found:
            return
        if isinstance(n, (BufferLoad, BufferStore)) and n.buffer is buf:
            found = True
        elif isinstance(n, Block) and any(r.buffer is buf for r in n.reads + n.writes):
            found = True
        elif isinstance(n, Allocate) and n.buffer is buf:
            found = True

    post_order_visit(node, visit)
    return found


def drop_alloc_if_unused(func: PrimFunc, buf: Buffer) -> PrimFunc:
    """``func`` without ``buf`` in the ``alloc_buffers`` of the block that owns it, if nothing
    uses ``buf`` any more."""
    for s, _ in tree.walk(func.body):
        if isinstance(s, Block) and any(b is buf for b in s.alloc_buffers):
            if buffer_is_used(s.body, buf) or (s.init is not None and buffer_is_used(s.init, buf)):
                return func
            new = s.replace(alloc_buffers=tuple(b for b in s.alloc_buffers if b is not buf),
                            annotations=dict(s.annotations))
            return tree.replace(func, s, new)
    return func


class BlockRewriter(IRMutator):
    """A mutator that recomputes the read/write regions of every (non-root) block whose body it
    changed; subclasses rewrite expressions (``visit_BufferLoad`` ...)."""

    def __init__(self, root_name: str | None):
        super().__init__()
        self.root_name = root_name

    def visit_Buffer(self, buf):  # buffers never change here
        return buf

    def visit_Block(self, block: Block):
        new = self.generic_visit(block)
        if new is block:
            return block
        if block.name == self.root_name:
            return new
        return with_regions(new)


def simplify_indices(expr: PrimExpr, ana: arith.Analyzer | None = None) -> PrimExpr:
    """``expr`` with the indices of its buffer loads simplified (float arithmetic untouched)."""
    ana = ana or arith.Analyzer()

    class S(IRMutator):
        def visit_Buffer(self, buf):
            return buf

        def visit_BufferLoad(self, load: BufferLoad):
            idx = tuple(ana.simplify(self.visit(i)) for i in load.indices)
            if all(a is b for a, b in zip(idx, load.indices)):
                return load
            return BufferLoad(load.buffer, idx)

    return S().visit(expr)


# ---------------------------------------------------------------------------------------------
# regions and regenerated loop nests


def iter_domain_constraint(br: BlockRealize) -> PrimExpr:
    """``dom.min <= value < dom.min + dom.extent`` for every iter var of ``br``."""
    cond: PrimExpr = true()
    for iv, val in zip(br.block.iter_vars, br.iter_values):
        lo, ext = iv.dom.min, iv.dom.extent
        c = (val >= lo) & (val < lo + ext)
        cond = c if is_true(cond) else And(cond, c)
    return cond


def check_predicate_guards_domain(br: BlockRealize, ancestors: tuple, primitive: str) -> None:
    """A primitive that regenerates ``br``'s loops drops its predicate, which is only sound when
    the predicate says no more than "the iter values lie in their domains" (what ``split``
    with a tail adds)."""
    if is_true(br.predicate):
        return
    ana = arith.Analyzer()
    bind_loops(ana, loops_above(ancestors))
    with ana.with_constraint(iter_domain_constraint(br)):
        ok = ana.can_prove(br.predicate)
    if not ok:
        raise ScheduleError(primitive, f"block {br.block.name!r} has the predicate "
                            f"{br.predicate!r}, which does more than keep its iter values in "
                            f"their domains; {primitive} regenerates the block's loops and "
                            f"cannot keep it", br.block)


def predicate_over_iters(br: BlockRealize, ancestors: tuple, primitive: str) -> PrimExpr | None:
    """The predicate that ``compute_at`` / ``reverse_compute_at`` keep on ``br`` once they
    regenerate its loops, written over its iter vars: None where the predicate only keeps the
    iter values in their domains (``check_predicate_guards_domain``: the new loops do that);
    else the predicate with each loop var replaced by the iter var bound to exactly it.

    Why that is sound: whether the block runs at an iter point is then the same function of
    the point as before, so each point the regenerated loops visit runs (init and update
    alike) exactly when it ran in the original nest; the primitive only changes which points
    are visited (those the consumers need) and when. ``rfactor`` over a split with a tail
    leaves such predicates: ``vko * 16 + vki < n`` on the partial results, ``vki < n`` on the
    write-back. A predicate using a loop var that is not an iter var's whole binding (a fused
    or split binding) cannot be rewritten; that raises, as before.
    """
    try:
        check_predicate_guards_domain(br, ancestors, primitive)
        return None
    except ScheduleError:
        pass
    loop_vars = {id(f.loop_var) for f in tree.loops_between(ancestors)}
    to_iter: dict[Var, PrimExpr] = {}
    for iv, val in zip(br.block.iter_vars, br.iter_values):
        if isinstance(val, Var) and id(val) in loop_vars and val not in to_iter:
            to_iter[val] = iv.var
    # a loop var bound to two iter vars, or feeding another binding too, stays ambiguous
    for iv, val in zip(br.block.iter_vars, br.iter_values):
        if not isinstance(val, Var):
            for v in free_vars(val):
                to_iter.pop(v, None)
    pred = substitute(br.predicate, to_iter)
    left = [v.name for v in free_vars(pred) if id(v) in loop_vars]
    if left:
        raise ScheduleError(primitive, f"block {br.block.name!r} has the predicate "
                            f"{br.predicate!r}, which does more than keep its iter values in "
                            f"their domains and uses the loops {left}, not each the whole "
                            f"binding of an iter var; {primitive} regenerates the block's "
                            f"loops and cannot keep it", br.block)
    return pred


THREAD_RELAX = {
    # storage scope -> thread-tag prefixes whose loops share one buffer, hence are relaxed
    # (TVM's CanRelaxStorageUnderThread: rank(storage) <= rank(thread))
    "global": ("blockIdx", "threadIdx", "vthread"),
    "shared": ("threadIdx", "vthread"),
    "local": (),
}


def relaxed_thread_loops(loops: Sequence[For], buf: Buffer) -> dict[Var, Range]:
    prefixes = THREAD_RELAX.get(buf.scope, ())
    return {f.loop_var: Range(f.min, f.extent) for f in loops
            if f.kind == "thread_binding" and f.thread_tag
            and f.thread_tag.startswith(prefixes)}


def region_under_loop(loop: For, outer_loops: Sequence[For], buf: Buffer, blocks: set[str],
                      kind: str, ana: arith.Analyzer) -> list[arith.IntervalSet] | None:
    """The part of ``buf`` that the blocks named in ``blocks`` under ``loop`` read (``kind`` =
    "reads") or write ("writes") during one iteration of ``loop`` and the loops above it: their
    regions with the block bindings substituted, relaxed over the loops inside ``loop`` (and over
    thread-bound loops above whose threads share ``buf``). None if no such access.

    ``outer_loops`` are the loops above ``loop``; both are bound in ``ana`` by the caller.
    """
    relax_above = relaxed_thread_loops(list(outer_loops) + [loop], buf)
    sets: list[arith.IntervalSet] | None = None
    for br, inner in realizes_with_loops(loop.body):
        if br.block.name not in blocks:
            continue
        regions = br.block.reads if kind == "reads" else br.block.writes
        vmap = {iv.var: v for iv, v in zip(br.block.iter_vars, br.iter_values)}
        dom = dict(relax_above)
        dom.update({f.loop_var: Range(f.min, f.extent) for f in inner})
        for r in regions:
            if r.buffer is not buf:
                continue
            dims = []
            for d, rng in enumerate(r.region):
                lo = ana.int_set(substitute(rng.min, vmap), dom)
                hi = ana.int_set(substitute(rng.min + rng.extent - 1, vmap), dom)
                s = arith.IntervalSet(lo.min_value, hi.max_value)
                if not s.is_bounded():  # e.g. a data-dependent index: the whole dimension
                    s = arith.IntervalSet(IntImm(0, buf.shape[d].dtype), buf.shape[d] - 1)
                dims.append(s)
            sets = dims if sets is None else [ana.union([a, b]) for a, b in zip(sets, dims)]
    return sets


def trivial_pattern(regions, buf: Buffer, block: Block) -> list[Var] | None:
    """If every region of ``buf`` in ``regions`` is the single point ``buf[v0, v1, ...]`` of
    distinct iter vars of ``block`` (the same point in each region), those vars; else None."""
    ivars = {iv.var for iv in block.iter_vars}
    found = None
    for r in regions:
        if r.buffer is not buf:
            continue
        vs = []
        for rng in r.region:
            if not (isinstance(rng.min, Var) and rng.min in ivars and isinstance(rng.extent, IntImm)
                    and rng.extent.value == 1):
                return None
            vs.append(rng.min)
        if len(set(vs)) != len(vs):
            return None
        if found is not None and any(a is not b for a, b in zip(found, vs)):
            return None
        found = vs
    return found


def max_over_loops(e: PrimExpr, loops: Sequence[For], ana: arith.Analyzer,
                   limit: int = 512) -> int | None:
    """The largest value of ``e`` over the iterations of ``loops``: exact (by enumeration) when
    ``e`` depends only on a few constant-extent loops, else the analyzer's constant bound; None
    if unbounded."""
    used = {id(v) for v in free_vars(e)}
    deps = [f for f in loops if id(f.loop_var) in used]
    if len(deps) == len(used) and all(isinstance(f.min, IntImm) and isinstance(f.extent, IntImm)
                                      for f in deps):
        count = 1
        for f in deps:
            count *= max(f.extent.value, 1)
        if count <= limit:
            best = None
            for point in itertools.product(*[range(f.min.value, f.min.value + f.extent.value)
                                             for f in deps]):
                v = arith.simplify(substitute(e, {f.loop_var: IntImm(p, f.loop_var.dtype)
                                                  for f, p in zip(deps, point)}))
                if not isinstance(v, IntImm):
                    break
                best = v.value if best is None else max(best, v.value)
            else:
                return best
    hi = ana.const_int_bound(e).max_value
    return None if hi == arith.ConstIntBound.POS_INF else hi


def make_nest(block: Block, doms: dict[Var, tuple[PrimExpr, PrimExpr]], ana: arith.Analyzer,
              preserve_unit_loops: bool, outer: Sequence[For] = (),
              predicate: PrimExpr | None = None) -> Stmt:
    """A loop nest computing ``block`` over ``doms`` (iter var -> (min, extent); an iter var not
    in ``doms`` spans its whole domain): one new loop ``ax<k>`` per iter var in order (unit
    loops only when ``preserve_unit_loops``), iter value ``min + ax<k>``, and a predicate
    wherever the value could leave the iter var's domain. ``ana`` knows the enclosing loops
    ``outer``; an extent varying with them becomes its largest value plus a predicate.
    ``predicate`` (over the iter vars, ``predicate_over_iters``) is kept, on the new values."""
    loops: list[tuple[Var, PrimExpr]] = []
    values: list[PrimExpr] = []
    conds: list[PrimExpr] = []
    for iv in block.iter_vars:
        if iv.var in doms:
            lo, ext = doms[iv.var]
            clip = True
        else:
            lo, ext, clip = iv.dom.min, iv.dom.extent, False
        lo, ext = ana.simplify(lo), ana.simplify(ext)
        if ana.can_prove(ext == 1) and not preserve_unit_loops:
            value = lo
        else:
            # an extent that varies with the outer loops (a tile straddling rows of a fused
            # loop) becomes its constant upper bound plus a predicate: loops keep constant
            # extents for split / vectorize / unroll, as in TVM
            loop_ext = ext
            if not isinstance(ext, IntImm):
                hi = max_over_loops(ext, outer, ana)
                if hi is not None and hi >= 1:
                    loop_ext = IntImm(hi, ext.dtype)
            ax = Var(f"ax{len(loops)}", iv.var.dtype)
            ana.bind(ax, Range(0, loop_ext))
            loops.append((ax, loop_ext))
            # lo is already simple: keep "lo + ax" in this order, as TVM prints it
            value = ax if ana.can_prove(lo == 0) else lo + ax
            if loop_ext is not ext and not ana.can_prove(ax < ext):
                conds.append(ax < ext)
        values.append(value)
        if clip:
            dmin, dend = iv.dom.min, ana.simplify(iv.dom.min + iv.dom.extent)
            for c in (value >= dmin, value < dend):
                if not ana.can_prove(c):
                    conds.append(c)
    if predicate is not None:
        kept = substitute(predicate, {iv.var: v for iv, v in zip(block.iter_vars, values)})
        conds.append(ana.simplify(kept))
    pred: PrimExpr = true()
    for c in conds:
        pred = c if is_true(pred) else And(pred, c)
    body: Stmt = BlockRealize(values, pred, block)
    for ax, ext in reversed(loops):
        body = For(ax, 0, ext, "serial", body)
    return body


def points_written_under_loop(loop: For, outer_loops: Sequence[For], buf: Buffer,
                              blocks: set[str]) -> int | None:
    """An upper bound on how many distinct elements of ``buf`` the blocks named in ``blocks``
    under ``loop`` write during one iteration of ``loop`` (the thread loops above it whose
    threads share ``buf`` included, as in ``region_under_loop``): per block, its write
    region's volume times the extents of the loops inside ``loop`` that its spatial bindings
    use. None when an extent is not a constant.

    ``reverse_compute_at`` compares it with the volume of the region it will make its block
    cover: a region larger than the elements written is an over-approximation, and the moved
    consumer would copy elements no producer has computed yet.
    """
    def product(exprs) -> int | None:
        values = [e.value if isinstance(e, IntImm) else None for e in exprs]
        return None if None in values else math.prod(values)

    above = product(r.extent for r in relaxed_thread_loops(list(outer_loops) + [loop],
                                                           buf).values())
    counts = []
    for br, inner in realizes_with_loops(loop.body):
        if br.block.name not in blocks:
            continue
        used = {id(v) for iv, val in zip(br.block.iter_vars, br.iter_values)
                if iv.kind == "spatial" for v in free_vars(val)}
        loops = [f.extent for f in inner if id(f.loop_var) in used]
        counts += [product([rng.extent for rng in r.region] + loops)
                   for r in br.block.writes if r.buffer is buf]
    if above is None or None in counts:
        return None
    return sum(counts) * above
