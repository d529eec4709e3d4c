"""Schedule primitives that change *where* a block is computed: ``compute_inline``,
``reverse_compute_inline``, ``compute_at``, ``reverse_compute_at`` and the sampler
``sample_compute_location``.

Each primitive is a traced method of ``ComputeLocationPrimitives`` that resolves its random
variables and calls the pure function of the same name in this module,
``(PrimFunc, block name, ...) -> PrimFunc``; the schedule installs the result only when the whole
request was legal, so an illegal one leaves the schedule as it was.

Legality follows TVM (``src/tir/schedule/primitive/compute_inline.cc``, ``compute_at.cc``):

- inlining needs a block whose body is a single ``BufferStore`` at its own iter vars, writing an
  intermediate (not a parameter) buffer that no other block writes;
- moving a block under a loop keeps every dependence: the blocks it passes (whose order relative
  to it changes) and the blocks it now shares a loop with must not write what it reads, read what
  it writes, or write what it writes -- except its consumers (compute_at) / producers
  (reverse_compute_at) under the loop, which is the point of the move.
"""
from __future__ import annotations

import math

from .. import arith
from ..expr import BufferLoad, FloorDiv, FloorMod, IntImm, PrimExpr, Var
from ..function import PrimFunc
from ..functor import IRMutator, free_vars, post_order_visit, substitute
from ..stmt import Block, BlockRealize, BufferStore, For, LetStmt
from ..transform._common import affine_coeffs
from ..structural import structural_equal
from . import tree
from ._compute_utils import (BlockRewriter, bind_loops, body_items, buffer_ids, buffer_is_used,
                             check_predicate_guards_domain, conflict, contains_block,
                             predicate_over_iters,
                             drop_alloc_if_unused, insert_into_loop, is_param_buffer, loops_above,
                             make_nest, points_written_under_loop, realizes_with_loops,
                             region_under_loop,
                             relaxed_thread_loops, remove_block, scope_blocks, scope_of,
                             simplify_indices, trivial_pattern)
from .error import ScheduleError
from .regions import with_regions
from .rv import BlockRV, LoopRV, traced


# =============================================================================================
# shared checks


def _find_block(func: PrimFunc, name: str, primitive: str):
    try:
        return tree.find_block(func, name)
    except KeyError:
        raise ScheduleError(primitive, f"no block named {name!r}") from None


def _find_loop(func: PrimFunc, loop_var: Var, primitive: str):
    try:
        return tree.find_loop(func, loop_var)
    except KeyError:
        raise ScheduleError(primitive, f"loop {loop_var.name} no longer exists") from None


def _bound_vars(func: PrimFunc) -> set[int]:
    """ids of the variables that some statement of ``func`` defines (loops, iter vars, lets)."""
    out: set[int] = set()
    for s, _ in tree.walk(func.body):
        if isinstance(s, For):
            out.add(id(s.loop_var))
        elif isinstance(s, Block):
            out.update(id(iv.var) for iv in s.iter_vars)
        elif isinstance(s, LetStmt):
            out.add(id(s.var))
    return out


def _check_closed(func: PrimFunc, exprs, block: Block, primitive: str, what: str) -> None:
    """``exprs`` may use only ``block``'s iter vars and the function's free (shape / scalar)
    variables: moving them elsewhere must not capture a loop variable."""
    own = {id(iv.var) for iv in block.iter_vars}
    bound = _bound_vars(func)
    for e in exprs:
        for v in free_vars(e):
            if id(v) in bound and id(v) not in own:
                raise ScheduleError(primitive, f"the {what} of block {block.name!r} uses {v.name}, "
                                    f"which is not one of its iter vars", block)


def _stores_to(node, buf) -> int:
    n = 0

    def visit(x):
        nonlocal n
        if isinstance(x, BufferStore) and x.buffer is buf:
            n += 1

    post_order_visit(node, visit)
    return n


def _loads_of(node, buf) -> list[BufferLoad]:
    out = []

    def visit(x):
        if isinstance(x, BufferLoad) and x.buffer is buf:
            out.append(x)

    post_order_visit(node, visit)
    return out


def _is_reduction(block: Block) -> bool:
    return block.init is not None or any(iv.kind == "reduce" for iv in block.iter_vars)


def _as_permutation(indices, block: Block) -> list[int] | None:
    """If ``indices`` are all of ``block``'s iter vars, each once, the iter var position of
    each index; else None. A constant index stands for an iter var of extent one starting at
    it that no other index uses: simplification folds such a unit iter var (a batch of one)
    to its value, ``buf[0, c, h, w]``, and the access is still a permutation."""
    fused = _as_fused_indices(indices, block)
    if fused is None or any(len(d) != 1 for d in fused):
        return None
    return [d[0][0] for d in fused]


def _as_fused_indices(indices, block: Block) -> list[list[tuple[int, int]]] | None:
    """If each index is one of ``block``'s iter vars, or a fuse of several (``y * W + x``
    with ``x`` in ``[0, W)``: mixed radix, every iter var from zero), and every iter var is
    used once: per index, its ``(iter var position, stride)`` pairs from the outermost
    (``stride`` 1 last); else None. A reshape read (``flat[c, y * W + x]``) is such an
    access, and its inverse (``y = p // W``, ``x = p % W``) maps the producer's points back
    to the consumer's. A constant index is an iter var of extent one (``_as_permutation``)."""
    ivs = block.iter_vars
    pos = {id(iv.var): k for k, iv in enumerate(ivs)}
    out: list = []
    for i in indices:
        if isinstance(i, Var) and id(i) in pos:
            out.append([(pos[id(i)], 1)])
            continue
        if isinstance(i, IntImm):
            out.append(None)    # a unit iter var folded to its value: matched below
            continue
        found = affine_coeffs(i, [iv.var for iv in ivs])
        if found is None or not (isinstance(found[1], IntImm) and found[1].value == 0) or \
                any(c <= 0 for c in found[0].values()):
            return None
        dims = sorted(((pos[id(v)], c) for v, c in found[0].items()), key=lambda kc: -kc[1])
        if not all(isinstance(ivs[k].dom.min, IntImm) and ivs[k].dom.min.value == 0 and
                   isinstance(ivs[k].dom.extent, IntImm) for k, _ in dims):
            return None
        # mixed radix: the innermost stride 1, each stride the next one times its extent
        radix = [(c, ivs[k].dom.extent.value) for k, c in dims]
        if radix[-1][0] != 1 or any(radix[n][0] != radix[n + 1][0] * radix[n + 1][1]
                                    for n in range(len(radix) - 1)):
            return None
        out.append(dims)
    used = {k for d in out if d is not None for k, _ in d}
    unit = [k for k, iv in enumerate(ivs) if k not in used and isinstance(iv.dom.min, IntImm)
            and isinstance(iv.dom.extent, IntImm) and iv.dom.extent.value == 1]
    for j, i in enumerate(indices):
        if out[j] is None:
            k = next((k for k in unit if ivs[k].dom.min.value == i.value), None)
            if k is None:
                return None
            unit.remove(k)
            out[j] = [(k, 1)]
    flat = [k for d in out for k, _ in d]
    if len(flat) != len(ivs) or len(set(flat)) != len(flat):
        return None
    return out


def _root_name(func: PrimFunc) -> str | None:
    return func.body.block.name if isinstance(func.body, BlockRealize) else None


def _check_order(old: PrimFunc, new: PrimFunc, scope_name: str, moved: str, loop_var: Var,
                 primitive: str, producer_side: bool) -> None:
    """Dependences across a move of block ``moved`` under loop ``loop_var``.

    A block whose order relative to the moved one changed must share no written buffer with it.
    A block that now shares the loop with it runs, in the next iteration, on the other side of it:
    after a moved producer (``producer_side``) it must not write what the producer reads or
    writes; before a moved consumer it must not read or write what the consumer writes.
    """
    old_order = [br.block for br in scope_blocks(old, scope_name)]
    new_order = [br.block for br in scope_blocks(new, scope_name)]
    old_pos = {b.name: i for i, b in enumerate(old_order)}
    new_pos = {b.name: i for i, b in enumerate(new_order)}
    m = new_order[new_pos[moved]]
    for x in new_order:
        if x.name == moved:
            continue
        if (old_pos[x.name] < old_pos[moved]) != (new_pos[x.name] < new_pos[moved]):
            why = conflict(x, m)
            if why is not None:
                raise ScheduleError(primitive, f"moving block {moved!r} under loop "
                                    f"{loop_var.name} would reorder it with block {x.name!r}: "
                                    f"{why}", m)
    loop, _ = tree.find_loop(new, loop_var)
    sharing = {br.block.name for br, _ in realizes_with_loops(loop)}
    for x in new_order:
        if x.name == moved or x.name not in sharing:
            continue
        if producer_side and new_pos[x.name] > new_pos[moved]:
            bad = buffer_ids(x.writes) & (buffer_ids(m.reads) | buffer_ids(m.writes))
        elif not producer_side and new_pos[x.name] < new_pos[moved]:
            bad = (buffer_ids(x.reads) | buffer_ids(x.writes)) & buffer_ids(m.writes)
        else:
            continue
        if bad:
            buf = next(r.buffer.name for r in x.reads + x.writes if id(r.buffer) in bad)
            raise ScheduleError(primitive, f"block {moved!r} would share loop {loop_var.name} "
                                f"with block {x.name!r}, and both access {buf} (one writing it) "
                                f"in an order that changes across iterations", m)


# =============================================================================================
# compute_inline


def compute_inline(func: PrimFunc, name: str) -> PrimFunc:
    """``func`` with block ``name`` inlined into its consumers (see ``Schedule.compute_inline``)."""
    prim = "compute_inline"
    br, anc = _find_block(func, name, prim)
    scope_of(br, anc, prim)
    block = br.block
    if _is_reduction(block):
        raise ScheduleError(prim, f"cannot inline a reduction block {name!r}", block)
    store = block.body
    if not isinstance(store, BufferStore):
        raise ScheduleError(prim, f"the body of block {name!r} is a {type(store).__name__}, not "
                            f"a single BufferStore", block)
    buf = store.buffer
    if block.alloc_buffers:
        raise ScheduleError(prim, f"block {name!r} allocates buffers; it cannot be inlined", block)
    if is_param_buffer(func, buf):
        raise ScheduleError(prim, f"block {name!r} writes the output buffer {buf.name}; only a "
                            f"block writing an intermediate buffer can be inlined", block)
    perm = _as_permutation(store.indices, block)
    if perm is None:
        raise ScheduleError(prim, f"block {name!r} stores to {buf.name}{list(store.indices)}; "
                            f"inlining needs the indices to be its iter vars, each once", block)
    if _loads_of(store.value, buf):
        raise ScheduleError(prim, f"block {name!r} reads the buffer {buf.name} it writes", block)
    _check_closed(func, [store.value], block, prim, "value")
    if _stores_to(func.body, buf) != 1:
        raise ScheduleError(prim, f"buffer {buf.name} is written by other blocks besides "
                            f"{name!r}; it cannot be inlined", block)
    if not _loads_of(func.body, buf):
        raise ScheduleError(prim, f"block {name!r} has no consumer: nothing reads {buf.name}",
                            block)

    ivars = [iv.var for iv in block.iter_vars]
    where = {k: j for j, k in enumerate(perm)}  # iter var position -> index position

    class Inliner(BlockRewriter):
        def visit_BufferLoad(self, load: BufferLoad):
            idx = tuple(self.visit(i) for i in load.indices)
            if load.buffer is not buf:
                if all(a is b for a, b in zip(idx, load.indices)):
                    return load
                return BufferLoad(load.buffer, idx)
            vmap = {v: idx[where[k]] for k, v in enumerate(ivars)}
            return simplify_indices(substitute(store.value, vmap))

    new = remove_block(func, br, anc, prim)
    new = new.replace(body=Inliner(_root_name(new)).visit(new.body))
    if buffer_is_used(new.body, buf):
        raise ScheduleError(prim, f"buffer {buf.name} of block {name!r} is still used (by an "
                            f"access that is not a load) after inlining", block)
    return drop_alloc_if_unused(new, buf)


# =============================================================================================
# reverse_compute_inline


def reverse_compute_inline(func: PrimFunc, name: str) -> PrimFunc:
    """``func`` with block ``name`` inlined into its producer (see
    ``Schedule.reverse_compute_inline``)."""
    prim = "reverse_compute_inline"
    br, anc = _find_block(func, name, prim)
    scope = scope_of(br, anc, prim)
    block = br.block
    if _is_reduction(block):
        raise ScheduleError(prim, f"cannot reverse-inline a reduction block {name!r}", block)
    store = block.body
    if not isinstance(store, BufferStore):
        raise ScheduleError(prim, f"the body of block {name!r} is a {type(store).__name__}, not "
                            f"a single BufferStore", block)
    out = store.buffer
    siblings = tree.child_block_realizes(scope)
    idx = next(i for i, s in enumerate(siblings) if s is br)
    reads = buffer_ids(block.reads)
    producers = [s for s in siblings[:idx] if buffer_ids(s.block.writes) & reads]
    if len(producers) != 1:
        raise ScheduleError(prim, f"block {name!r} has {len(producers)} producer blocks "
                            f"({[p.block.name for p in producers]}); reverse_compute_inline needs "
                            f"exactly one", block)
    pbr = producers[0]
    pblock = pbr.block
    if _is_reduction(pblock):
        raise ScheduleError(prim, f"the producer {pblock.name!r} of block {name!r} is a reduction "
                            f"block (it has an init); cannot reverse-inline into it", block)
    pstore = pblock.body
    if not isinstance(pstore, BufferStore) or len(pblock.writes) != 1:
        raise ScheduleError(prim, f"the producer {pblock.name!r} of block {name!r} must be a "
                            f"single BufferStore", block)
    buf = pstore.buffer
    if is_param_buffer(func, buf):
        raise ScheduleError(prim, f"the producer {pblock.name!r} of block {name!r} writes the "
                            f"output buffer {buf.name}; it must stay", block)
    loads = _loads_of(store.value, buf) + [l for i in store.indices for l in _loads_of(i, buf)]
    # several reads at the same point (GELU: x * erf(x)) all become the producer's value
    if not loads or any(not structural_equal(list(l.indices), list(loads[0].indices))
                        for l in loads[1:]):
        raise ScheduleError(prim, f"block {name!r} reads {buf.name} {len(loads)} times at "
                            f"different points; reverse_compute_inline needs one point", block)
    fused = _as_fused_indices(loads[0].indices, block)
    if fused is None:
        raise ScheduleError(prim, f"block {name!r} reads {buf.name}{list(loads[0].indices)}; "
                            f"the indices must be its iter vars, each once (or fuses of them)",
                            block)
    if _loads_of(store.value, out):
        raise ScheduleError(prim, f"block {name!r} reads the buffer {out.name} it writes", block)
    _check_closed(func, [store.value, *store.indices], block, prim, "store")
    if _stores_to(func.body, buf) != 1:
        raise ScheduleError(prim, f"buffer {buf.name} is written by other blocks besides "
                            f"{pblock.name!r}", block)
    # blocks enclosing the consumer summarise its reads; they are not other readers
    enclosing = {a.name for a in anc if isinstance(a, Block)} | {name}
    readers = [b.block.name for b in tree.all_blocks(func)
               if b.block.name not in enclosing and id(buf) in buffer_ids(b.block.reads)]
    if readers or len(_loads_of(func.body, buf)) != len(loads):
        raise ScheduleError(prim, f"buffer {buf.name} is read by other blocks besides {name!r} "
                            f"({readers}); it cannot be removed", block)
    check_predicate_guards_domain(br, anc, prim)
    # the producer writes buf[p]; the consumer must iterate over each such point
    ana = arith.Analyzer()
    for iv in pblock.iter_vars:
        ana.bind(iv.var, iv.dom)
    vmap = {}
    for j, dims in enumerate(fused):
        p = pstore.indices[j]
        if len(dims) == 1:
            dom = block.iter_vars[dims[0][0]].dom
            lo, hi = dom.min, dom.min + dom.extent
            vmap[block.iter_vars[dims[0][0]].var] = p
        else:   # a fused index: each iter var's digit of p in the mixed radix
            outer_k, outer_stride = dims[0]
            lo = IntImm(0, p.dtype)
            hi = IntImm(outer_stride * block.iter_vars[outer_k].dom.extent.value, p.dtype)
            for n, (k, stride) in enumerate(dims):
                v = p if stride == 1 else FloorDiv(p, IntImm(stride, p.dtype))
                extent = block.iter_vars[k].dom.extent
                vmap[block.iter_vars[k].var] = v if n == 0 else FloorMod(v, extent)
        if not (ana.can_prove(p >= lo) and ana.can_prove(p < hi)):
            raise ScheduleError(prim, f"the producer {pblock.name!r} writes {buf.name} at "
                                f"{p!r}, outside the points block {name!r} reads", block)
    for x in siblings[siblings.index(pbr) + 1: idx]:
        why = conflict(x.block, block)
        if why is not None:
            raise ScheduleError(prim, f"block {name!r} would move before block "
                                f"{x.block.name!r}: {why}", block)

    class Replace(IRMutator):
        def visit_Buffer(self, b):
            return b

        def visit_BufferLoad(self, load):
            if load.buffer is buf:
                return pstore.value
            return self.generic_visit(load)

    value = simplify_indices(Replace().visit(substitute(store.value, vmap)), ana)
    indices = [ana.simplify(substitute(i, vmap)) for i in store.indices]
    new_pblock = with_regions(pblock.replace(body=BufferStore(out, value, indices),
                                             annotations=dict(pblock.annotations)))
    new = remove_block(func, br, anc, prim)
    new = tree.replace(new, pblock, new_pblock)
    return drop_alloc_if_unused(new, buf)


# =============================================================================================
# compute_at / reverse_compute_at


def _check_loop_scope(func, loop_var, scope: Block, name: str, primitive: str):
    loop, lanc = _find_loop(func, loop_var, primitive)
    if tree.enclosing_block(lanc) is not scope:
        raise ScheduleError(primitive, f"loop {loop_var.name} is not in the scope of block "
                            f"{name!r} (the block {scope.name!r}); a block moves only within its "
                            f"scope", loop)
    return loop, lanc


def compute_at(func: PrimFunc, name: str, loop_var: Var, preserve_unit_loops: bool = False
               ) -> PrimFunc:
    """``func`` with producer block ``name`` moved under the loop of ``loop_var`` (see
    ``Schedule.compute_at``)."""
    prim = "compute_at"
    br, anc = _find_block(func, name, prim)
    scope = scope_of(br, anc, prim)
    loop, lanc = _check_loop_scope(func, loop_var, scope, name, prim)
    block = br.block
    if len(block.writes) != 1:
        raise ScheduleError(prim, f"block {name!r} writes {len(block.writes)} buffers; "
                            f"compute_at needs a block writing one", block)
    buf = block.writes[0].buffer
    if is_param_buffer(func, buf):
        raise ScheduleError(prim, f"block {name!r} writes the output buffer {buf.name}; "
                            f"computing only the part its consumers read would leave the rest "
                            f"unwritten", block)
    pattern = trivial_pattern(block.writes, buf, block)
    spatial = {id(iv.var) for iv in block.iter_vars if iv.kind == "spatial"}
    if pattern is None or any(id(v) not in spatial for v in pattern):
        raise ScheduleError(prim, f"block {name!r} writes {buf.name} at "
                            f"{[r.min for r in block.writes[0].region]}; compute_at needs the "
                            f"indices to be distinct spatial iter vars", block)
    siblings = tree.child_block_realizes(scope)
    idx = next(i for i, s in enumerate(siblings) if s is br)
    others = [s.block.name for s in siblings if s is not br and id(buf) in buffer_ids(s.block.writes)]
    if others:
        raise ScheduleError(prim, f"buffer {buf.name} of block {name!r} is also written by "
                            f"{others}", block)
    # (a block reading buf before this one is not a consumer; the dependence check at the end
    # covers it)
    consumers = [s for s in siblings[idx + 1:] if id(buf) in buffer_ids(s.block.reads)]
    if not consumers:
        raise ScheduleError(prim, f"block {name!r} has no consumer: no block of its scope reads "
                            f"{buf.name}", block)
    under = {b.block.name for b, _ in realizes_with_loops(loop)}
    inside = [c for c in consumers if c.block.name in under]
    if not inside:
        raise ScheduleError(prim, f"compute_at outside the consumer's loop nest: loop "
                            f"{loop_var.name} is not an ancestor of any consumer of block "
                            f"{name!r} ({[c.block.name for c in consumers]})", loop)
    outside = [c.block.name for c in consumers if c.block.name not in under]
    if outside:
        raise ScheduleError(prim, f"not every consumer of block {name!r} is under loop "
                            f"{loop_var.name}: {outside} read {buf.name} outside it", loop)
    kept = predicate_over_iters(br, anc, prim)

    new = remove_block(func, br, anc, prim)
    loop, lanc = tree.find_loop(new, loop_var)
    outer = loops_above(lanc)
    relaxed = relaxed_thread_loops(outer + [loop], buf)
    ana = arith.Analyzer()
    bind_loops(ana, [f for f in outer + [loop] if f.loop_var not in relaxed])
    names = {c.block.name for c in inside}
    sets = region_under_loop(loop, outer, buf, names, "reads", ana)
    doms = {v: (s.min_value, s.max_value - s.min_value + 1) for v, s in zip(pattern, sets)}
    nest = make_nest(block, doms, ana, preserve_unit_loops, outer + [loop], kept)
    items = body_items(loop)
    pos = next(i for i, s in enumerate(items) if any(contains_block(s, n) for n in names))
    new = insert_into_loop(new, loop_var, nest, pos)
    _check_order(func, new, scope.name, name, loop_var, prim, producer_side=True)
    return new


def reverse_compute_at(func: PrimFunc, name: str, loop_var: Var, preserve_unit_loops: bool = False
                       ) -> PrimFunc:
    """``func`` with consumer block ``name`` moved under the loop of ``loop_var`` (see
    ``Schedule.reverse_compute_at``)."""
    prim = "reverse_compute_at"
    br, anc = _find_block(func, name, prim)
    scope = scope_of(br, anc, prim)
    loop, lanc = _check_loop_scope(func, loop_var, scope, name, prim)
    block = br.block
    siblings = tree.child_block_realizes(scope)
    idx = next(i for i, s in enumerate(siblings) if s is br)
    reads = buffer_ids(block.reads)
    producers = [s for s in siblings[:idx] if buffer_ids(s.block.writes) & reads]
    if not producers:
        raise ScheduleError(prim, f"block {name!r} has no producer: no earlier block of its "
                            f"scope writes what it reads", block)
    under = {b.block.name for b, _ in realizes_with_loops(loop)}
    inside = [p for p in producers if p.block.name in under]
    if not inside:
        raise ScheduleError(prim, f"reverse_compute_at outside the producer's loop nest: loop "
                            f"{loop_var.name} is not an ancestor of any producer of block "
                            f"{name!r} ({[p.block.name for p in producers]})", loop)
    kept = predicate_over_iters(br, anc, prim)
    # the consumer may not read partial results: the loop and those above must not be
    # reduction loops of a producer under it
    fixed = {id(f.loop_var) for f in loops_above(lanc) + [loop]}
    for p, _ in realizes_with_loops(loop):
        if p.block.name not in {q.block.name for q in inside}:
            continue
        for iv, val in zip(p.block.iter_vars, p.iter_values):
            if iv.kind == "reduce" and any(id(v) in fixed for v in free_vars(val)):
                raise ScheduleError(prim, f"loop {loop_var.name} is at or inside a reduction "
                                    f"loop of block {p.block.name!r}; block {name!r} would read "
                                    f"its partial results", loop)

    new = remove_block(func, br, anc, prim)
    loop, lanc = tree.find_loop(new, loop_var)
    outer = loops_above(lanc)
    names = {p.block.name for p in inside}
    written = []
    for p in inside:
        for r in p.block.writes:
            if id(r.buffer) in reads and all(w is not r.buffer for w in written):
                written.append(r.buffer)
    relaxed: dict = {}
    for b in written:
        relaxed.update(relaxed_thread_loops(outer + [loop], b))
    ana = arith.Analyzer()
    bind_loops(ana, [f for f in outer + [loop] if f.loop_var not in relaxed])
    spatial = {id(iv.var) for iv in block.iter_vars if iv.kind == "spatial"}
    doms: dict[Var, tuple[PrimExpr, PrimExpr]] = {}
    for b in written:
        pattern = trivial_pattern(block.reads, b, block)
        if pattern is None or any(id(v) not in spatial for v in pattern):
            raise ScheduleError(prim, f"block {name!r} reads {b.name} at indices that are not "
                                f"distinct spatial iter vars; reverse_compute_at needs "
                                f"{b.name}[v0, v1, ...]", block)
        sets = region_under_loop(loop, outer, b, names, "writes", ana)
        exts = [ana.simplify(s.max_value - s.min_value + 1) for s in sets]
        written_points = points_written_under_loop(loop, outer, b, names)
        # a lower bound of the region's volume: a dimension of symbolic extent counts 1
        volume = math.prod(e.value if isinstance(e, IntImm) else 1 for e in exts)
        if written_points is not None and volume > written_points:
            # the region analysis over-approximated (a non-affine tile of a fused loop): the
            # moved block would also copy elements not computed in this iteration
            raise ScheduleError(prim, f"the producers under loop {loop_var.name} write at most "
                                f"{written_points} elements of {b.name} per iteration, but "
                                f"their region is not exact (at least {volume} elements); "
                                f"block {name!r} would read values not yet computed", block)
        for v, s, ext in zip(pattern, sets, exts):
            lo = s.min_value
            if v in doms:
                lo0, ext0 = doms[v]
                if not (ana.can_prove_equal(lo, lo0) and ana.can_prove_equal(ext, ext0)):
                    raise ScheduleError(prim, f"the producers under loop {loop_var.name} write "
                                        f"different ranges of what block {name!r} reads at "
                                        f"{v.name}", block)
            doms[v] = (lo, ext)
    nest = make_nest(block, doms, ana, preserve_unit_loops, outer + [loop], kept)
    items = body_items(loop)
    pos = max(i for i, s in enumerate(items) if any(contains_block(s, n) for n in names)) + 1
    new = insert_into_loop(new, loop_var, nest, pos)
    _check_order(func, new, scope.name, name, loop_var, prim, producer_side=False)
    return new


# =============================================================================================
# sample_compute_location


def compute_location_candidates(func: PrimFunc, name: str) -> list[tuple[int, Var | None]]:
    """Where block ``name`` may be computed, as ``(decision, loop var or None)``: ``-2`` inline
    (if ``compute_inline`` is legal), ``-1`` root (where it is), and ``i`` for the ``i``-th loop
    (outermost first) above its consumers at which ``compute_at`` is legal."""
    prim = "sample_compute_location"
    br, anc = _find_block(func, name, prim)
    scope = scope_of(br, anc, prim)
    out: list[tuple[int, Var | None]] = []
    try:
        compute_inline(func, name)
        out.append((-2, None))
    except ScheduleError:
        pass
    out.append((-1, None))
    siblings = tree.child_block_realizes(scope)
    idx = next(i for i, s in enumerate(siblings) if s is br)
    written = buffer_ids(br.block.writes)
    consumers = [s for s in siblings[idx + 1:] if buffer_ids(s.block.reads) & written]
    if not consumers:
        return out
    common = None
    for c in consumers:
        _, canc = tree.find_block(func, c.block.name)
        loops = [f.loop_var for f in tree.loops_between(canc)]
        if common is None:
            common = loops
        else:
            n = 0
            while n < min(len(common), len(loops)) and common[n] is loops[n]:
                n += 1
            common = common[:n]
    for i, v in enumerate(common):
        try:
            compute_at(func, name, v)
        except ScheduleError:
            continue
        out.append((i, v))
    return out


# =============================================================================================
# the mixin


class ComputeLocationPrimitives:
    """Mixin of ``Schedule``: compute_at, reverse_compute_at, compute_inline,
    reverse_compute_inline, sample_compute_location."""

    @traced
    def compute_inline(self, block: BlockRV) -> None:
        """Inline a block into its consumers: every load of the buffer it writes becomes the
        block's value at the loaded indices, and the block (with its loops) disappears.

        The block's body must be a single ``BufferStore`` ``B[v0, v1, ...] = expr`` at its own
        (spatial) iter vars, each once; ``B`` must be an intermediate buffer, written by no
        other block, read by at least one. ``B`` leaves the root's ``alloc_buffers`` and the
        consumers' read regions are recomputed.

        Parameters
        ----------
        block : BlockRV
            The block to inline.

        Raises
        ------
        ScheduleError
            For a reduction block, a block writing an output (parameter) buffer, a block
            without consumers, a body that is not one store at the iter vars, the root block.

        Examples
        --------
        Before::

            for i, j in T.grid(128, 128):
                with T.block("B"):
                    vi = T.axis.spatial(128, i)
                    vj = T.axis.spatial(128, j)
                    B[vi, vj] = A[vi, vj] * 2.0
            for i, j in T.grid(128, 128):
                with T.block("C"):
                    vi = T.axis.spatial(128, i)
                    vj = T.axis.spatial(128, j)
                    C[vi, vj] = B[vi, vj] + 1.0

        >>> sch.compute_inline(sch.get_block("B"))      # doctest: +SKIP

        After::

            for i, j in T.grid(128, 128):
                with T.block("C"):
                    vi = T.axis.spatial(128, i)
                    vj = T.axis.spatial(128, j)
                    T.reads(A[vi, vj])
                    C[vi, vj] = A[vi, vj] * 2.0 + 1.0
        """
        br, _ = self._block(block, "compute_inline")
        self._set_func(compute_inline(self.func, br.block.name))

    @traced
    def reverse_compute_inline(self, block: BlockRV) -> None:
        """Inline a consumer block into its (single) producer: the producer's store becomes the
        consumer's store, with the consumer's read of the produced buffer replaced by the
        producer's value; the consumer block (with its loops) disappears.

        The block's body must be a single ``BufferStore`` ``C[f(v)] = g(B[v0, v1, ...])`` that
        reads the producer's buffer ``B`` exactly once, at its own iter vars; the producer must
        be a single ``BufferStore`` that is not a reduction (TVM rejects a producer with an
        init too), and ``B`` an intermediate buffer nobody else reads.

        Parameters
        ----------
        block : BlockRV
            The consumer block to inline.

        Raises
        ------
        ScheduleError
            For a reduction consumer or producer, two or more reads of ``B``, a non-trivial
            index, ``B`` an output buffer, several producers.

        Examples
        --------
        Before::

            for i, j in T.grid(128, 128):
                with T.block("B"):
                    B[vi, vj] = A[vi, vj] * 2.0
            for i, j in T.grid(128, 128):
                with T.block("C"):
                    C[vi, vj] = T.max(B[vi, vj] + bias[vj], 0.0)

        >>> sch.reverse_compute_inline(sch.get_block("C"))      # doctest: +SKIP

        After::

            for i, j in T.grid(128, 128):
                with T.block("B"):
                    T.reads(A[vi, vj], bias[vj])
                    T.writes(C[vi, vj])
                    C[vi, vj] = T.max(A[vi, vj] * 2.0 + bias[vj], 0.0)
        """
        br, _ = self._block(block, "reverse_compute_inline")
        self._set_func(reverse_compute_inline(self.func, br.block.name))

    @traced
    def compute_at(self, block: BlockRV, loop: LoopRV, preserve_unit_loops: bool = False) -> None:
        """Move a producer block under a loop of its consumers, computing per iteration of the
        loop only the part of its buffer that the consumers under the loop read.

        The region is the consumers' read region with their bindings substituted, relaxed over
        the loops inside ``loop`` (and over thread-bound loops above whose threads share the
        buffer: blockIdx/threadIdx/vthread for global, threadIdx/vthread for shared). The
        block's loops are regenerated: a new loop ``ax<k>`` over the region's extent for each
        iter var written (iter value ``region.min + ax<k>``), the whole domain for its other
        iter vars (reduction loops stay whole, so its init stays valid), and a predicate
        (``T.where``) where the region may exceed the iter var's domain. The nest goes into
        ``loop``'s body right before the first statement holding a consumer. Unit loops are
        dropped unless ``preserve_unit_loops``.

        Parameters
        ----------
        block : BlockRV
            The producer block to move; it writes one intermediate buffer at its spatial iter
            vars (``B[v0, v1, ...]``).
        loop : LoopRV
            A loop of the same scope above (every one of) its consumers.
        preserve_unit_loops : bool
            Keep loops of extent 1.

        Raises
        ------
        ScheduleError
            If the loop is not above a consumer ("compute_at outside the consumer's loop
            nest"), some consumer is not under it or reads before the block, the block has no
            consumer or writes an output buffer, or the move would break a dependence.

        Examples
        --------
        Before::

            for i, j in T.grid(128, 128):
                with T.block("B"):
                    B[vi, vj] = A[vi, vj] * 2.0
            for i_0, i_1, j in T.grid(8, 16, 128):
                with T.block("C"):
                    vi = T.axis.spatial(128, i_0 * 16 + i_1)
                    vj = T.axis.spatial(128, j)
                    C[vi, vj] = B[vi, vj] + 1.0

        >>> sch.compute_at(sch.get_block("B"), i_0)       # doctest: +SKIP

        After::

            for i_0 in range(8):
                for ax0, ax1 in T.grid(16, 128):
                    with T.block("B"):
                        vi = T.axis.spatial(128, i_0 * 16 + ax0)
                        vj = T.axis.spatial(128, ax1)
                        B[vi, vj] = A[vi, vj] * 2.0
                for i_1, j in T.grid(16, 128):
                    with T.block("C"):
                        ...
        """
        br, _ = self._block(block, "compute_at")
        special = self._special_location(loop, "compute_at")
        if special == "root":
            return  # a sampled location meaning "stay where it is"
        if special == "inline":
            self._set_func(compute_inline(self.func, br.block.name))
            return
        for_node, _ = self._loop(loop, "compute_at")
        self._set_func(compute_at(self.func, br.block.name, for_node.loop_var,
                                  bool(preserve_unit_loops)))

    @traced
    def reverse_compute_at(self, block: BlockRV, loop: LoopRV,
                           preserve_unit_loops: bool = False) -> None:
        """Move a consumer block under a loop of its producers, computing per iteration of the
        loop the part of its iteration space that the producers under the loop have just
        written.

        The consumer must read each buffer produced under the loop at its spatial iter vars
        (``B[v0, v1, ...]``); each such iter var ranges over the producers' write region
        (relaxed over the loops inside ``loop``), its other iter vars over their whole domain.
        The nest goes into ``loop``'s body right after the last statement holding a producer.
        The loop must not be (inside) a reduction loop of a producer: the consumer would see
        partial sums.

        Parameters
        ----------
        block : BlockRV
            The consumer block to move.
        loop : LoopRV
            A loop of the same scope above one or more of its producers.
        preserve_unit_loops : bool
            Keep loops of extent 1.

        Raises
        ------
        ScheduleError
            If the loop is above no producer, is a reduction loop of one, the consumer reads a
            produced buffer at non-trivial indices, or the move breaks a dependence.

        Examples
        --------
        Before::

            for i, j, k in T.grid(128, 128, 128):
                with T.block("C"):
                    ...  # C[vi, vj] += A[vi, vk] * B[vk, vj]
            for i, j in T.grid(128, 128):
                with T.block("D"):
                    D[vi, vj] = T.max(C[vi, vj], 0.0)

        >>> sch.reverse_compute_at(sch.get_block("D"), i)       # doctest: +SKIP

        After::

            for i in range(128):
                for j, k in T.grid(128, 128):
                    with T.block("C"):
                        ...
                for ax0 in range(128):
                    with T.block("D"):
                        vi = T.axis.spatial(128, i)
                        vj = T.axis.spatial(128, ax0)
                        D[vi, vj] = T.max(C[vi, vj], 0.0)
        """
        br, _ = self._block(block, "reverse_compute_at")
        special = self._special_location(loop, "reverse_compute_at")
        if special == "root":
            return
        if special == "inline":
            self._set_func(reverse_compute_inline(self.func, br.block.name))
            return
        for_node, _ = self._loop(loop, "reverse_compute_at")
        self._set_func(reverse_compute_at(self.func, br.block.name, for_node.loop_var,
                                          bool(preserve_unit_loops)))

    @traced
    def sample_compute_location(self, block: BlockRV, decision: int | None = None
                                ) -> LoopRV:
        """Draw, uniformly, a place to compute ``block``: one of the loops above its consumers
        where ``compute_at`` is legal, its current place (the root), or inlined into its
        consumers (only if ``compute_inline`` is legal).

        The decision is the index of the loop among the loops above the consumers (outermost =
        0, as ``get_loops`` of the consumer lists them), ``-1`` for the root, ``-2`` for inline.
        It always returns a LoopRV and never changes the schedule: for the root and inline
        choices a *location* RV that ``compute_at`` understands (as in TVM: ``compute_at`` at the
        root location does nothing, at the inline location inlines the block). So the tuner's
        ``RandomComputeLocation`` rule is always::

            loop = sch.sample_compute_location(block)
            sch.compute_at(block, loop)

        and a mutator may switch a decision between loops, root and inline: the trace replays
        either way.

        Parameters
        ----------
        block : BlockRV
            A producer block.
        decision : int, optional
            Replay this choice instead of drawing (must be a legal candidate).

        Examples
        --------
        >>> loop = sch.sample_compute_location(sch.get_block("B"))       # doctest: +SKIP
        >>> sch.compute_at(sch.get_block("B"), loop)
        """
        prim = "sample_compute_location"
        br, _ = self._block(block, prim)
        name = br.block.name
        candidates = compute_location_candidates(self.func, name)
        if decision is None:
            pick = candidates[int(self._rng.integers(0, len(candidates)))]
        else:
            matching = [c for c in candidates if c[0] == int(decision)]
            if not matching:
                raise ScheduleError(prim, f"decision {decision} is not a legal location of block "
                                    f"{name!r}; the candidates are {[c[0] for c in candidates]}",
                                    br.block)
            pick = matching[0]
        self._decision = pick[0]
        if pick[0] == -2:
            return self._location_rv("inline")
        if pick[1] is None:
            return self._location_rv("root")
        return self._loop_rv(pick[1])
