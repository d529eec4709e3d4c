"""Schedule primitives on reductions: decompose_reduction, rfactor.

A reduction block (``init`` plus ``C[s] = C[s] op f(...)`` over reduce iter vars) runs its init
when every reduce iter var is at its minimum. ``decompose_reduction`` moves that init into a block
of its own before a loop; ``rfactor`` turns one reduce loop into a spatial dimension of a
partial-result buffer, so the partial reductions can run in parallel.

Each primitive is a ``@traced`` method of ``ReductionPrimitives`` over a pure function
``(PrimFunc, ...) -> (PrimFunc, ...)`` of this module: an illegal request raises
``ScheduleError`` before anything is installed.
"""
from __future__ import annotations

from .. import arith
from .. import dtype as dt
from ..expr import (Add, And, BufferLoad, FloatImm, IntImm, Max, Min, Mul, PrimExpr, Var,
                    max_value, min_value)
from ..function import PrimFunc
from ..functor import free_vars, post_order_visit, substitute
from ..stmt import (Block, BlockRealize, Buffer, BufferStore, For, IterVar, Range, Stmt, seq)
from ..structural import structural_equal
from . import tree
from .error import ScheduleError
from .primitives_memory import unique_name
from .regions import with_regions
from .rv import BlockRV, LoopRV, traced


# =============================================================================================
# helpers


def _uses(e: PrimExpr, vars_: set[int]) -> bool:
    return any(id(v) in vars_ for v in free_vars(e))


def _conjuncts(pred: PrimExpr) -> list[PrimExpr]:
    if isinstance(pred, And):
        return _conjuncts(pred.a) + _conjuncts(pred.b)
    if isinstance(pred, IntImm) and pred.value == 1:
        return []
    return [pred]


def _and_all(conds: list[PrimExpr]) -> PrimExpr | None:
    if not conds:
        return None
    out = conds[0]
    for c in conds[1:]:
        out = And(out, c)
    return out


def _copy_loop(loop: For, new_var: Var, body: Stmt) -> For:
    return For(new_var, loop.min, loop.extent, loop.kind, body, loop.thread_tag,
               dict(loop.annotations))


def _check_reduction(block: Block, primitive: str) -> None:
    if block.init is None:
        raise ScheduleError(primitive, f"block {block.name} is not a reduction block: it has no "
                            f"init", block)
    if not any(iv.kind == "reduce" for iv in block.iter_vars):
        raise ScheduleError(primitive, f"block {block.name} is not a reduction block: it has no "
                            f"reduce iter var", block)


# the combiners rfactor knows: kind -> (node class, identity of a dtype)
_COMBINERS = {
    "sum": (Add, lambda d: FloatImm(0.0, d) if dt.is_float(d) else IntImm(0, d)),
    "prod": (Mul, lambda d: FloatImm(1.0, d) if dt.is_float(d) else IntImm(1, d)),
    "max": (Max, min_value),
    "min": (Min, max_value),
}


def match_reduction(block: Block, primitive: str):
    """``(kind, store, rhs, self_first)`` of a block ``C[idx] = C[idx] op rhs`` whose init is a
    store to the same element; ScheduleError naming the block otherwise."""
    _check_reduction(block, primitive)
    form = (f"block {block.name} is not a reduction of a supported form: rfactor needs "
            f"'C[idx] = C[idx] op f(...)' with op one of +, *, max, min, and an init storing to "
            f"C[idx]")
    body, init = block.body, block.init
    if not isinstance(body, BufferStore) or not isinstance(init, BufferStore):
        raise ScheduleError(primitive, form, block)
    buf = body.buffer
    if init.buffer is not buf or not structural_equal(tuple(init.indices), tuple(body.indices)):
        raise ScheduleError(primitive, form, block)
    reduce_vars = {id(iv.var) for iv in block.iter_vars if iv.kind == "reduce"}
    if any(_uses(i, reduce_vars) for i in body.indices):
        raise ScheduleError(primitive, f"block {block.name}: the reduction's output index "
                            f"depends on a reduce iter var", block)
    value = body.value
    for kind, (cls, _) in _COMBINERS.items():
        if type(value) is not cls:
            continue
        for self_first, (lhs, rhs) in ((True, (value.a, value.b)), (False, (value.b, value.a))):
            if isinstance(lhs, BufferLoad) and lhs.buffer is buf and \
                    structural_equal(tuple(lhs.indices), tuple(body.indices)):
                loads = []
                post_order_visit(rhs, lambda n: loads.append(n)
                                 if isinstance(n, BufferLoad) and n.buffer is buf else None)
                if loads:
                    raise ScheduleError(primitive, f"block {block.name}: the reduced value reads "
                                        f"{buf.name}, the reduction's own output", block)
                return kind, body, rhs, self_first
    raise ScheduleError(primitive, form, block)


def _combine(kind: str, acc: PrimExpr, rhs: PrimExpr, self_first: bool) -> PrimExpr:
    cls = _COMBINERS[kind][0]
    return cls(acc, rhs) if self_first else cls(rhs, acc)


# =============================================================================================
# pure transformations


def decompose_reduction(func: PrimFunc, block_name: str, loop_var: Var) -> tuple[PrimFunc, str]:
    """See ``Schedule.decompose_reduction``; returns the new function and the init block's name."""
    prim = "decompose_reduction"
    br, ancestors = tree.find_block(func, block_name)
    block = br.block
    _check_reduction(block, prim)
    loops = tree.loops_between(ancestors)
    pos = next((k for k, f in enumerate(loops) if f.loop_var is loop_var), None)
    if pos is None:
        raise ScheduleError(prim, f"loop {loop_var.name} is not an ancestor of block "
                            f"{block_name} (within its scope)", block)
    # the init must run before every reduce iteration: the loop must enclose the reduce loops
    for iv, val in zip(block.iter_vars, br.iter_values):
        if iv.kind != "reduce":
            continue
        for k, f in enumerate(loops[:pos]):
            if any(v is f.loop_var for v in free_vars(val)):
                raise ScheduleError(prim, f"loop {loop_var.name} is below loop "
                                    f"{f.loop_var.name}, which the reduce iter var {iv.var.name} "
                                    f"of block {block_name} depends on; decompose at "
                                    f"{f.loop_var.name} or above", block)
    # a loop from `loop` down that no binding uses repeats the whole reduction (a compute_at
    # location): the init must run in every repetition, so it cannot go above that loop
    for f in loops[pos:]:
        if not (isinstance(f.extent, IntImm) and f.extent.value == 1) and not any(
                any(v is f.loop_var for v in free_vars(val)) for val in br.iter_values):
            raise ScheduleError(prim, f"block {block_name} is computed again in every iteration "
                                f"of loop {f.loop_var.name} (none of its iter vars depends on "
                                f"it), so its init must run in each; decompose below "
                                f"{f.loop_var.name}", block)
    # Step 1: the init block, over the spatial iter vars only
    var_map: dict[Var, Var] = {}
    init_ivs, init_vals = [], []
    for iv, val in zip(block.iter_vars, br.iter_values):
        if iv.kind != "spatial":
            continue
        nv = Var(iv.var.name + "_init", iv.var.dtype)
        var_map[iv.var] = nv
        init_ivs.append(IterVar(nv, iv.dom, "spatial"))
        init_vals.append(val)
    init_name = unique_name(func, block_name + "_init")
    init_block = with_regions(Block(init_name, init_ivs, [], [], substitute(block.init, var_map),
                                    None, (), dict(block.annotations)))
    # Step 2: the loops from `loop` down that the init's bindings use get copies
    chosen = [f for f in loops[pos:] if any(_uses(v, {id(f.loop_var)}) for v in init_vals)]
    discarded = {id(f.loop_var) for f in loops[pos:] if f not in chosen}
    loop_map = {f.loop_var: Var(f.loop_var.name + "_init", f.loop_var.dtype) for f in chosen}
    pred = _and_all([c for c in _conjuncts(br.predicate) if not _uses(c, discarded)])
    stmt: Stmt = BlockRealize([substitute(v, loop_map) for v in init_vals],
                              None if pred is None else substitute(pred, loop_map), init_block)
    for f in reversed(chosen):
        stmt = _copy_loop(f, loop_map[f.loop_var], stmt)
    # Step 3: the reduction block loses its init (and now reads its output)
    new_br = br.replace(block=with_regions(block.replace(init=None)))
    out = tree.replace(func, br, new_br)
    loop, _ = tree.find_loop(out, loop_var)
    return tree.replace(out, loop, seq(stmt, loop)), init_name


def rfactor(func: PrimFunc, loop_var: Var, factor_axis: int) -> tuple[PrimFunc, str]:
    """See ``Schedule.rfactor``; returns the new function and the rfactor block's name."""
    prim = "rfactor"
    loop, _ = tree.find_loop(func, loop_var)
    blocks = [s for s, _ in tree.walk(loop) if isinstance(s, BlockRealize)]
    if len(blocks) != 1:
        names = [b.block.name for b in blocks]
        raise ScheduleError(prim, f"loop {loop_var.name} must hold exactly one block, the "
                            f"reduction; it holds {names}", loop)
    br, ancestors = tree.find_block(func, blocks[0].block.name)
    block = br.block
    name = block.name
    kind, store, rhs, self_first = match_reduction(block, prim)
    buf = store.buffer
    loops = tree.loops_between(ancestors)
    loop_ids = {id(f.loop_var): f for f in loops}
    spatial_loops: set[int] = set()
    for iv, val in zip(block.iter_vars, br.iter_values):
        if iv.kind == "spatial":
            spatial_loops.update(id(v) for v in free_vars(val) if id(v) in loop_ids)
    if id(loop_var) in spatial_loops:
        raise ScheduleError(prim, f"loop {loop_var.name} is not a reduction loop of block "
                            f"{name}: a spatial iter var of the block depends on it", block)
    touching = [iv for iv, val in zip(block.iter_vars, br.iter_values)
                if iv.kind == "reduce" and _uses(val, {id(loop_var)})]
    if not touching:
        raise ScheduleError(prim, f"loop {loop_var.name} is not a reduction loop of block "
                            f"{name}: no reduce iter var of the block depends on it", block)
    ndim = buf.ndim
    if isinstance(factor_axis, bool) or not isinstance(factor_axis, int) \
            or not -(ndim + 1) <= factor_axis <= ndim:
        raise ScheduleError(prim, f"block {name}: factor_axis {factor_axis!r} is out of range "
                            f"[{-(ndim + 1)}, {ndim}] for the {ndim}-d buffer {buf.name}", block)
    if factor_axis < 0:
        factor_axis += ndim + 1
    outer = loops[0]
    others = [b.block.name for b, _ in ((s, p) for s, p in tree.walk(outer)
                                        if isinstance(s, BlockRealize)) if b is not br]
    if others:
        raise ScheduleError(prim, f"block {name}: its outermost loop {outer.loop_var.name} also "
                            f"holds blocks {others}; rfactor needs the loop nest to itself", block)
    ana = arith.Analyzer()

    # Step 1: the rfactor block, in the original loops: the rfactor loop becomes a spatial iter
    rf_iv = IterVar(Var("v" + loop_var.name, loop_var.dtype), Range(loop.min, loop.extent),
                    "spatial")
    loop2iter: dict[Var, Var] = {loop_var: rf_iv.var}
    rf_ivs, rf_vals = [rf_iv], [loop_var]
    var_map: dict[Var, PrimExpr] = {}
    for iv, val in zip(block.iter_vars, br.iter_values):
        if iv.kind == "spatial" or not any(iv is t for t in touching):
            nv = Var(iv.var.name, iv.var.dtype)
            rf_ivs.append(IterVar(nv, iv.dom, iv.kind))
            rf_vals.append(val)
            var_map[iv.var] = nv
            continue
        for f in loops:
            if f.loop_var in loop2iter or not _uses(val, {id(f.loop_var)}):
                continue
            if id(f.loop_var) in spatial_loops:
                raise ScheduleError(prim, f"block {name}: loop {f.loop_var.name} feeds both a "
                                    f"spatial iter var and the reduce iter var {iv.var.name}; "
                                    f"cannot rfactor", block)
            nv = IterVar(Var("v" + f.loop_var.name, f.loop_var.dtype), Range(f.min, f.extent),
                         "reduce")
            loop2iter[f.loop_var] = nv.var
            rf_ivs.append(nv)
            rf_vals.append(f.loop_var)
        var_map[iv.var] = ana.simplify(substitute(val, loop2iter))
    rf_name = unique_name(func, name + "_rf")
    rf_shape = list(buf.shape)
    rf_shape.insert(factor_axis, loop.extent)
    rf_buf = Buffer(unique_name(func, buf.name + "_rf"), rf_shape, buf.dtype,
                    scope=buf.scope, align=buf.align)
    rf_pos = ana.simplify(rf_iv.var - loop.min)

    def rf_index(indices, vmap, pos):
        out = [substitute(i, vmap) for i in indices]
        out.insert(factor_axis, pos)
        return out

    idx = rf_index(store.indices, var_map, rf_pos)
    identity = _COMBINERS[kind][1](buf.dtype)
    rf_body = BufferStore(rf_buf, _combine(kind, BufferLoad(rf_buf, idx),
                                           substitute(rhs, var_map), self_first), idx)
    rf_block = with_regions(Block(rf_name, rf_ivs, [], [], rf_body,
                                  BufferStore(rf_buf, identity, idx), (), dict(block.annotations)))
    rf_realize = BlockRealize(rf_vals, br.predicate, rf_block)

    # Step 2: the write-back block (keeps the name) reduces the partial results over a copy of
    # the rfactor loop, inside copies of the loops its spatial iter vars use
    wb_loops = [f for f in loops if id(f.loop_var) in spatial_loops or f is loop]
    wb_loop_map = {f.loop_var: Var(f.loop_var.name, f.loop_var.dtype) for f in wb_loops}
    wb_ids = {id(f.loop_var) for f in wb_loops}
    wb_ivs, wb_vals = [], []
    wb_map: dict[Var, Var] = {}
    for iv, val in zip(block.iter_vars, br.iter_values):
        if iv.kind == "spatial":
            nv = Var(iv.var.name, iv.var.dtype)
            wb_map[iv.var] = nv
            wb_ivs.append(IterVar(nv, iv.dom, "spatial"))
            wb_vals.append(substitute(val, wb_loop_map))
    wb_rf = IterVar(Var("v" + loop_var.name, loop_var.dtype), Range(loop.min, loop.extent),
                    "reduce")
    wb_ivs.append(wb_rf)
    wb_vals.append(wb_loop_map[loop_var])
    out_idx = [substitute(i, wb_map) for i in store.indices]
    part = BufferLoad(rf_buf, rf_index(store.indices, wb_map, ana.simplify(wb_rf.var - loop.min)))
    wb_body = BufferStore(buf, _combine(kind, BufferLoad(buf, out_idx), part, self_first), out_idx)
    wb_block = with_regions(Block(name, wb_ivs, [], [], wb_body, substitute(block.init, wb_map),
                                  (), dict(block.annotations)))
    # A partial result exists for a write-back point if the rfactor block ran there with its
    # other reduce loops at their minimum (that is when its init ran); keep what that needs.
    wb_ana = arith.Analyzer()
    for f in wb_loops:
        wb_ana.bind(f.loop_var, Range(f.min, f.extent))
    at_min = {f.loop_var: f.min for f in loops if id(f.loop_var) not in wb_ids}
    kept = []
    for c in _conjuncts(br.predicate):
        c = wb_ana.simplify(substitute(c, at_min))
        if not (isinstance(c, IntImm) and c.value == 1):
            kept.append(substitute(c, wb_loop_map))
    pred = _and_all(kept)
    wb: Stmt = BlockRealize(wb_vals, pred, wb_block)
    for f in reversed(wb_loops):
        wb = _copy_loop(f, wb_loop_map[f.loop_var], wb)

    # Step 3: install: the rfactor nest, then the write-back nest, and allocate the rf buffer
    out = tree.replace(func, br, rf_realize)
    outer_now, _ = tree.find_loop(out, outer.loop_var)
    out = tree.replace(out, outer_now, seq(outer_now, wb))
    _, anc = tree.find_block(out, rf_name)
    scope = tree.enclosing_block(anc)
    if scope is None:
        raise ScheduleError(prim, f"block {name} has no enclosing (root) block to allocate "
                            f"{rf_buf.name} in", block)
    out = tree.replace(out, scope, scope.replace(alloc_buffers=scope.alloc_buffers + (rf_buf,)))
    return out, rf_name


# =============================================================================================
# the mixin


class ReductionPrimitives:
    """Mixin of ``Schedule``: decompose_reduction, rfactor."""

    @traced
    def decompose_reduction(self, block: BlockRV, loop: LoopRV) -> BlockRV:
        """Split a reduction block's init out into a block ``<name>_init`` placed right before
        ``loop``.

        ``loop`` must be an ancestor of the block, at or above every loop its reduce iter vars
        depend on (so the init runs before all of the reduction). The init block gets copies
        (named ``<loop>_init``) of the loops from ``loop`` down that its spatial iter vars use;
        the reduction block loses its init.

        Parameters
        ----------
        block : BlockRV
            The reduction block.
        loop : LoopRV
            The loop before which the init goes.

        Returns
        -------
        BlockRV
            The init block.

        Examples
        --------
        Before::

            for i, j, k in T.grid(128, 128, 128):
                with T.block("C"):
                    with T.init():
                        C[vi, vj] = 0.0
                    C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

        ``sch.decompose_reduction(sch.get_block("C"), i)``::

            for i_init, j_init in T.grid(128, 128):
                with T.block("C_init"):
                    C[vi_init, vj_init] = 0.0
            for i, j, k in T.grid(128, 128, 128):
                with T.block("C"):
                    C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
        """
        prim = "decompose_reduction"
        br, _ = self._block(block, prim)
        f, _ = self._loop(loop, prim)
        func, name = decompose_reduction(self.func, br.block.name, f.loop_var)
        self._set_func(func)
        return self._block_rv(name)

    @traced
    def rfactor(self, loop: LoopRV, factor_axis: int) -> BlockRV:
        """Factorize the reduction over ``loop``: a block ``<name>_rf`` computes partial results
        into a new buffer ``<buf>_rf`` with an extra dimension (at ``factor_axis``) indexed by
        ``loop``, in the original loops (whose LoopRVs stay valid); the original block (which
        keeps its name and BlockRV) then reduces ``<buf>_rf`` over that dimension, in copies of
        the loops its spatial iter vars use and of ``loop``.

        The block must be a reduction ``C[idx] = C[idx] op f(...)`` with op one of ``+``,
        ``*``, ``max``, ``min``; the partial results start from the op's identity and the
        original init applies once, in the write-back. ``loop`` must hold only this block and
        feed only reduce iter vars.

        Parameters
        ----------
        loop : LoopRV
            A reduce loop of the block.
        factor_axis : int
            Where the new dimension goes in ``<buf>_rf`` (negative counts from the end, as in
            numpy's ``insert``: ``-1`` appends).

        Returns
        -------
        BlockRV
            The rfactor block.

        Examples
        --------
        Before (a row sum, its reduce loop split)::

            for i, k_0, k_1 in T.grid(128, 32, 4):
                with T.block("B"):
                    vi = T.axis.spatial(128, i)
                    vk = T.axis.reduce(128, k_0 * 4 + k_1)
                    with T.init():
                        B[vi] = 0.0
                    B[vi] = B[vi] + A[vi, vk]

        ``sch.rfactor(k_1, 0)``::

            B_rf = T.alloc_buffer((4, 128), "float32")
            for i, k_0, k_1 in T.grid(128, 32, 4):
                with T.block("B_rf"):
                    vk_1 = T.axis.spatial(4, k_1)
                    vi = T.axis.spatial(128, i)
                    vk_0 = T.axis.reduce(32, k_0)
                    with T.init():
                        B_rf[vk_1, vi] = 0.0
                    B_rf[vk_1, vi] = B_rf[vk_1, vi] + A[vi, vk_0 * 4 + vk_1]
            for i, k_1 in T.grid(128, 4):
                with T.block("B"):
                    vi = T.axis.spatial(128, i)
                    vk_1 = T.axis.reduce(4, k_1)
                    with T.init():
                        B[vi] = 0.0
                    B[vi] = B[vi] + B_rf[vk_1, vi]
        """
        prim = "rfactor"
        f, _ = self._loop(loop, prim)
        func, name = rfactor(self.func, f.loop_var, factor_axis)
        self._set_func(func)
        return self._block_rv(name)
