"""Schedule primitives: blockize, tensorize (the intrinsic registry is in ``intrinsics``).

``blockize`` turns the subtree under a loop into an outer block ``<name>_o`` whose iteration
variables are the *outer* parts of the inner block's bindings (TVM's subspace division): after
splitting ``i``, ``j`` by a micro-tile, blockize at the first tile loop gives ``vi_o, vj_o`` and
the inner block's bindings become ``vi_o * MR + vi_i``. A reduction's init moves to the outer
block, so ``decompose_reduction`` works on it.

``tensorize`` matches a block (blockized from a loop if a loop is given) against a tensor
intrinsic's description structurally and replaces the block's body by the intrinsic's
implementation, re-expressed on the matched regions of the real buffers (see ``intrinsics``).

Each primitive is a ``@traced`` method of ``TensorizePrimitives`` over a pure function of this
module; an illegal request raises ``ScheduleError`` before anything is installed.
"""
from __future__ import annotations

import itertools
from typing import Sequence

from tilecraft.errors import TilecraftError

from .. import arith
from ..expr import (Add, And, BufferLoad, EQ, IntImm, LT, Let, Max, Min, Mul, NE, Or,
                    PrimExpr, Sub, TIRError, Var, floordiv, floormod)
from ..function import PrimFunc
from ..functor import IRMutator, substitute
from ..stmt import (Block, BlockRealize, Buffer, BufferStore, Evaluate, For,
                    IfThenElse, IterVar, LetStmt, Range, SeqStmt, Stmt, is_true, seq)
from . import tree
from ._loop_utils import conjoin, conjuncts, is_one, is_zero, uses_any, uses_var, vars_in
from .error import ScheduleError
from .intrinsics import TensorIntrin, strip_root
from .primitives_memory import unique_name
from .regions import with_regions
from .rv import BlockRV, LoopRV, traced


# =============================================================================================
# helpers


def _plus(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    if is_zero(a):
        return b
    if is_zero(b):
        return a
    return a + b


def _minus(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    return a if is_zero(b) else a - b


def _and_all(conds: Sequence[PrimExpr]) -> PrimExpr | None:
    out = None
    for c in conds:
        out = c if out is None else conjoin(out, c)
    return out


def _split_binding(e: PrimExpr, inner: set[Var], loops: set[Var]
                   ) -> tuple[PrimExpr, PrimExpr] | None:
    """``(outer, inner_part)`` with ``e == outer + inner_part``, where ``inner_part`` uses no
    loop variable outside ``inner`` and ``outer`` none of ``inner``; None if ``e`` mixes the two
    groups of loops other than through sums and constant-factor products.

    Examples
    --------
    >>> from tilecraft.tensorir import var
    >>> i0, i1 = var("i_0"), var("i_1")
    >>> _split_binding(i0 * 16 + i1, {i1}, {i0, i1})
    (i_0 * 16, i_1)
    """
    zero = IntImm(0, e.dtype)
    used = vars_in(e)
    if not used & inner:
        return e, zero
    if not used & (loops - inner):
        return zero, e
    if isinstance(e, (Add, Sub)):
        a = _split_binding(e.a, inner, loops)
        b = _split_binding(e.b, inner, loops)
        if a is None or b is None:
            return None
        if isinstance(e, Add):
            return _plus(a[0], b[0]), _plus(a[1], b[1])
        return _minus(a[0], b[0]), _minus(a[1], b[1])
    if isinstance(e, Mul):
        for factor, other in ((e.a, e.b), (e.b, e.a)):
            if not vars_in(factor) & loops:
                parts = _split_binding(other, inner, loops)
                if parts is None:
                    return None
                return parts[0] * factor, parts[1] * factor
    return None


def _single_block_chain(loop: For, primitive: str) -> tuple[list[For], BlockRealize]:
    """The loops from ``loop`` down to the one block they hold (perfectly nested)."""
    chain: list[For] = []
    s: Stmt = loop
    while isinstance(s, For):
        chain.append(s)
        s = s.body
    if not isinstance(s, BlockRealize):
        names = [br.block.name for br, _ in ((x, p) for x, p in tree.walk(loop)
                                              if isinstance(x, BlockRealize))]
        raise ScheduleError(primitive, f"loop {loop.loop_var.name} must hold exactly one block "
                            f"through perfectly nested loops; the body of loop "
                            f"{chain[-1].loop_var.name} is a {type(s).__name__} (blocks below "
                            f"loop {loop.loop_var.name}: {names})", loop)
    return chain, s


# =============================================================================================
# blockize


def blockize_loop(func: PrimFunc, loop_var: Var, preserve_unit_iters: bool = True
                  ) -> tuple[PrimFunc, str]:
    """See ``Schedule.blockize`` (loop form); returns the new function and the outer block's
    name."""
    prim = "blockize"
    loop, ancestors = tree.find_loop(func, loop_var)
    inner_loops, br = _single_block_chain(loop, prim)
    block = br.block
    name = block.name
    outer_loops = tree.loops_between(ancestors)
    inner_vars = {f.loop_var for f in inner_loops}
    outer_vars = {f.loop_var for f in outer_loops}
    all_loops = inner_vars | outer_vars
    for f in inner_loops:
        if uses_any(f.min, all_loops) or uses_any(f.extent, all_loops):
            raise ScheduleError(prim, f"the range of loop {f.loop_var.name} depends on another "
                                f"loop; blockize at loop {loop_var.name} needs the loops from it "
                                f"down to block {name} to have fixed ranges", f)

    # unit loops: dropped from the bindings unless they are preserved (as in split and fuse)
    unit = {} if preserve_unit_iters else {f.loop_var: f.min for f in outer_loops + inner_loops
                                            if is_one(f.extent)}
    ana = arith.Analyzer()
    for f in outer_loops + inner_loops:
        if preserve_unit_iters and is_one(f.extent):
            continue  # keep ``u + i`` as it is
        ana.bind(f.loop_var, Range(f.min, f.extent))
    inner_dom = {f.loop_var: Range(f.min, f.extent) for f in inner_loops}

    # Step 1: divide every binding into an outer and an inner part
    outer_ivs: list[IterVar] = []
    outer_vals: list[PrimExpr] = []
    inner_ivs: list[IterVar] = []
    inner_vals: list[PrimExpr] = []
    vmap: dict[Var, PrimExpr] = {}
    for iv, value in zip(block.iter_vars, br.iter_values):
        value = ana.simplify(substitute(value, unit)) if unit or uses_any(value, all_loops) \
            else value
        if not uses_any(value, inner_vars):
            outer_ivs.append(iv)  # the iter var moves to the outer block as it is
            outer_vals.append(value)
            continue
        dtype = iv.var.dtype
        if not uses_any(value, outer_vars):
            # only the inner loops move it (TVM's trivial division): a unit outer iter var
            zero, one = IntImm(0, dtype), IntImm(1, dtype)
            o_iv = IterVar(Var(iv.var.name + "_o", dtype), Range(zero, one), iv.kind)
            i_iv = IterVar(Var(iv.var.name + "_i", dtype), iv.dom, iv.kind)
            outer_ivs.append(o_iv)
            outer_vals.append(zero)
            inner_ivs.append(i_iv)
            inner_vals.append(value)
            vmap[iv.var] = i_iv.var
            continue
        parts = _split_binding(value, inner_vars, all_loops)
        what = f"the binding {iv.var.name} = {value!r} of block {name}"
        if parts is None:
            raise ScheduleError(prim, f"{what} is not an affine sum of a part over the loops "
                                f"outside loop {loop_var.name} and a part over the loops from it "
                                f"on; blockize cannot divide it", block)
        outer_part, inner_part = parts
        rng = ana.int_set(inner_part, inner_dom)
        if not rng.is_bounded():
            raise ScheduleError(prim, f"{what}: its part over the loops from {loop_var.name} "
                                f"on ({inner_part!r}) has no bounded range", block)
        lo = ana.simplify(rng.min_value)
        extent = ana.simplify(rng.max_value - lo + 1)
        outer_part = ana.simplify(outer_part + lo)
        inner_part = ana.simplify(inner_part - lo)
        if uses_any(extent, all_loops):
            raise ScheduleError(prim, f"{what}: the extent {extent!r} of its inner part depends "
                                f"on a loop variable", block)
        if is_one(extent):
            outer_ivs.append(iv)  # the inner loops do not move it (unit loops)
            outer_vals.append(outer_part)
            continue
        rem = ana.simplify(floormod(outer_part, extent))
        if not is_zero(rem):
            raise ScheduleError(prim, f"{what} cannot be divided at loop {loop_var.name}: its "
                                f"outer part {outer_part!r} is not a multiple of the extent "
                                f"{extent!r} of its inner part {inner_part!r}", block)
        extent = extent.astype(dtype) if extent.dtype != dtype else extent
        omin = ana.simplify(floordiv(iv.dom.min, extent))
        oext = ana.simplify(floordiv(iv.dom.min + iv.dom.extent + extent - 1, extent) - omin)
        o_iv = IterVar(Var(iv.var.name + "_o", dtype), Range(omin, oext), iv.kind)
        i_iv = IterVar(Var(iv.var.name + "_i", dtype), Range(IntImm(0, dtype), extent), iv.kind)
        outer_ivs.append(o_iv)
        outer_vals.append(ana.simplify(floordiv(outer_part, extent)))
        inner_ivs.append(i_iv)
        inner_vals.append(inner_part)
        vmap[iv.var] = i_iv.var if is_zero(omin) and is_one(oext) else o_iv.var * extent + i_iv.var

    # Step 2: the predicate: conjuncts over the inner loops stay on the inner block, with the
    # outer loops they use expressed by the outer iter vars bound to them
    loop2iter: dict[Var, Var] = {}
    for iv, val in zip(outer_ivs, outer_vals):
        if isinstance(val, Var) and val in outer_vars and val not in loop2iter:
            loop2iter[val] = iv.var
    outer_pred, inner_pred = [], []
    for c in conjuncts(substitute(br.predicate, unit)):
        if is_true(c):
            continue
        if not uses_any(c, inner_vars):
            outer_pred.append(c)
            continue
        c2 = substitute(c, loop2iter)
        left = vars_in(c2) & outer_vars
        if left:
            raise ScheduleError(prim, f"the predicate {c!r} of block {name} uses loop "
                                f"{sorted(v.name for v in left)} outside loop {loop_var.name} "
                                f"and loops inside it; blockize cannot express it in the outer "
                                f"block's iteration variables", block)
        inner_pred.append(c2)

    # Step 3: the inner block, its init moved out when the outer block reduces
    inner = substitute(block.replace(iter_vars=(), annotations=dict(block.annotations)), vmap)
    outer_reduces = any(iv.kind == "reduce" for iv in outer_ivs)
    move_init = block.init is not None and outer_reduces
    reads = list(inner.reads)
    if move_init:
        # the inner block now accumulates into what the outer init wrote: it reads its output
        have = {id(r.buffer) for r in reads}
        reads = [w for w in inner.writes if id(w.buffer) not in have] + reads
    inner_block = Block(name, inner_ivs, reads, inner.writes, inner.body,
                        None if move_init else inner.init, inner.alloc_buffers,
                        dict(block.annotations))
    inner_realize = BlockRealize(inner_vals, _and_all(inner_pred), inner_block)
    body: Stmt = inner_realize
    for f in reversed(inner_loops):
        body = f.replace(body=body, annotations=dict(f.annotations))

    # Step 4: the outer block, with an init of its own (TVM's GenerateOuterInit)
    outer_name = unique_name(func, name + "_o")
    outer_init = None
    if block.init is not None:
        outer_init = _outer_init(func, block, inner, inner_ivs, inner_vals, inner_pred,
                                 inner_loops, outer_name)
    outer_block = with_regions(Block(outer_name, outer_ivs, [], [], body, outer_init))
    left = {v for v in vars_in(outer_block) if v in outer_vars}
    if left:
        raise ScheduleError(prim, f"block {name} uses loop {sorted(v.name for v in left)} "
                            f"(outside loop {loop_var.name}) other than through its bindings; "
                            f"cannot blockize", block)
    outer_realize = BlockRealize(outer_vals, _and_all(outer_pred), outer_block)
    return tree.replace(func, loop, outer_realize), outer_name


def _outer_init(func: PrimFunc, block: Block, inner: Block, inner_ivs: list[IterVar],
                inner_vals: list[PrimExpr], inner_pred: list[PrimExpr], inner_loops: list[For],
                outer_name: str) -> Stmt:
    """The init of the outer block: the original init in a block ``<name>_init`` over the inner
    spatial iter vars it uses, inside copies (``<loop>_init``) of the inner loops it needs."""
    init = inner.init
    # the init runs with the inner reduce iter vars at their minimum
    init = substitute(init, {iv.var: iv.dom.min for iv in inner_ivs if iv.kind == "reduce"})
    ivs, vals, ivmap = [], [], {}
    for iv, val in zip(inner_ivs, inner_vals):
        if iv.kind == "spatial" and uses_var(init, iv.var):
            nv = IterVar(Var(iv.var.name + "_init", iv.var.dtype), iv.dom, "spatial")
            ivmap[iv.var] = nv.var
            ivs.append(nv)
            vals.append(val)
    init = substitute(init, ivmap)
    init_name = unique_name(func, block.name + "_init", taken={outer_name})
    pred = _and_all([substitute(c, ivmap) for c in inner_pred])
    stmt: Stmt = BlockRealize(vals, pred, with_regions(Block(init_name, ivs, [], [], init)))
    used = vars_in(stmt)
    chosen = [f for f in inner_loops if f.loop_var in used]
    lmap = {f.loop_var: Var(f.loop_var.name + "_init", f.loop_var.dtype) for f in chosen}
    stmt = substitute(stmt, lmap)
    for f in reversed(chosen):
        stmt = For(lmap[f.loop_var], f.min, f.extent, f.kind, stmt, f.thread_tag,
                   dict(f.annotations))
    return stmt


def blockize_blocks(func: PrimFunc, names: Sequence[str], preserve_unit_iters: bool = True
                    ) -> tuple[PrimFunc, str]:
    """See ``Schedule.blockize`` (list form): wrap consecutive sibling blocks (with the loops
    between them and their common parent) in one outer block; returns the new function and the
    outer block's name."""
    prim = "blockize"
    if len(set(names)) != len(names):
        raise ScheduleError(prim, f"blocks {list(names)} are given more than once")
    found = [tree.find_block(func, n) for n in names]
    scopes = {id(tree.enclosing_block(anc)) for _, anc in found}
    if len(scopes) != 1:
        raise ScheduleError(prim, f"blocks {list(names)} are not in one scope (they have "
                            f"different enclosing blocks)")
    for br, anc in found:
        path = anc + (br,)
        if any(isinstance(a, Block) and a.init is b for a, b in zip(path, path[1:])):
            raise ScheduleError(prim, f"block {br.block.name} is inside the init of a block",
                                br.block)
    paths = [anc + (br,) for br, anc in found]
    depth = 0
    while all(len(p) > depth for p in paths) and all(p[depth] is paths[0][depth] for p in paths):
        depth += 1
    lca = paths[0][depth - 1]
    lca_anc = paths[0][:depth - 1]
    if len(found) == 1:
        region: list[Stmt] = [found[0][0]]
    else:
        if not isinstance(lca, SeqStmt):
            raise ScheduleError(prim, f"blocks {list(names)} do not share a sequence of "
                                f"statements (their common parent is a {type(lca).__name__})")
        idx = sorted({next(k for k, s in enumerate(lca.seq) if s is p[depth]) for p in paths})
        if idx != list(range(idx[0], idx[-1] + 1)):
            raise ScheduleError(prim, f"blocks {list(names)} are not consecutive: other "
                                f"statements lie between them")
        region = list(lca.seq[idx[0]:idx[-1] + 1])
    inside = [br.block.name for s in region for br in _top_blocks(s)]
    extra = [n for n in inside if n not in names]
    if extra:
        raise ScheduleError(prim, f"the statements holding blocks {list(names)} also hold "
                            f"blocks {extra}; give all of them")
    loops = tree.loops_between(lca_anc)
    body = seq(*region)
    used = vars_in(body)
    reduce_loops: set[Var] = set()
    for s in region:
        for br in _top_blocks(s):
            for iv, val in zip(br.block.iter_vars, br.iter_values):
                if iv.kind == "reduce":
                    reduce_loops |= vars_in(val)
    ivs, vals, lmap = [], [], {}
    for f in loops:
        if f.loop_var not in used:
            continue
        if not preserve_unit_iters and is_one(f.extent):
            lmap[f.loop_var] = f.min
            continue
        kind = "reduce" if f.loop_var in reduce_loops else "spatial"
        iv = IterVar(Var("v" + f.loop_var.name + "_o", f.loop_var.dtype), Range(f.min, f.extent), kind)
        lmap[f.loop_var] = iv.var
        ivs.append(iv)
        vals.append(f.loop_var)
    outer_name = unique_name(func, "_".join(names) + "_o")
    outer = with_regions(Block(outer_name, ivs, [], [], substitute(body, lmap)))
    realize = BlockRealize(vals, None, outer)
    if len(found) == 1:
        return tree.replace(func, found[0][0], realize), outer_name
    k0 = next(k for k, s in enumerate(lca.seq) if s is region[0])
    items = list(lca.seq[:k0]) + [realize] + list(lca.seq[k0 + len(region):])
    return tree.replace(func, lca, seq(*items)), outer_name


def _top_blocks(s: Stmt) -> list[BlockRealize]:
    if isinstance(s, BlockRealize):
        return [s]
    return tree.child_block_realizes(s)


# =============================================================================================
# tensorize: structural matching against the intrinsic's description


class _Mismatch(TilecraftError):
    pass


_COMMUTATIVE = (Add, Mul, Min, Max, And, Or, EQ, NE)


class _Matcher:
    """Compare an intrinsic's description (``d``) with a block's body (``r``).

    Phase 1 (``stmt`` / ``expr``) walks both trees together, mapping the description's loop and
    iter vars to the block's and its buffers to the block's, and records every buffer access
    pair; phase 2 (``buffer_bindings``) finds, for each description buffer, which dimensions of
    the real buffer it covers and at which base index (every access must be the description's
    access shifted by one fixed offset).
    """

    def __init__(self, partial: dict | None = None):
        self.vmap: dict[Var, Var] = {}
        self.bufs: dict[Buffer, Buffer] = {}
        self.accesses: dict[Buffer, list[tuple[tuple, tuple]]] = {}
        self.ana = arith.Analyzer()
        # the loops the intrinsic may cut short (TensorIntrin.partial), the block's loops
        # matched so far (outermost first: (real loop, extent)), and per partial loop the
        # bounds ``(base, bound)`` of its predicate: valid iterations ``i < bound - base``
        self.partial = dict(partial or {})
        self.loops: list[tuple[Var, PrimExpr]] = []
        self.bounds: dict[int, list[tuple[PrimExpr, PrimExpr]]] = {}
        self.realize: BlockRealize | None = None    # the matched (inner) block

    # -- state for the commutative retry
    def _save(self):
        return dict(self.vmap), dict(self.bufs), {k: list(v) for k, v in self.accesses.items()}

    def _restore(self, state):
        self.vmap, self.bufs, self.accesses = dict(state[0]), dict(state[1]), \
            {k: list(v) for k, v in state[2].items()}

    # -- statements
    def stmt(self, d: Stmt, r: Stmt) -> None:
        if type(d) is not type(r):
            raise _Mismatch(f"the intrinsic has {_describe(d)} where the block has "
                            f"{_describe(r)}")
        fn = getattr(self, "_s_" + type(d).__name__, None)
        if fn is None:
            raise _Mismatch(f"tensorize cannot compare a {type(d).__name__} statement")
        fn(d, r)

    def _s_SeqStmt(self, d: SeqStmt, r: SeqStmt):
        if len(d.seq) != len(r.seq):
            raise _Mismatch(f"the intrinsic has {len(d.seq)} statements in a sequence where the "
                            f"block has {len(r.seq)}")
        for a, b in zip(d.seq, r.seq):
            self.stmt(a, b)

    def _s_For(self, d: For, r: For):
        if not self.ana.can_prove_equal(d.extent, r.extent):
            raise _Mismatch(f"loop {r.loop_var.name} has extent {r.extent!r} where the "
                            f"intrinsic's loop {d.loop_var.name} has {d.extent!r} (the tile "
                            f"shape differs)")
        if not self._same_value(d.min, r.min):
            raise _Mismatch(f"loop {r.loop_var.name} starts at {r.min!r}, the intrinsic's loop "
                            f"{d.loop_var.name} at {d.min!r}")
        self.vmap[d.loop_var] = r.loop_var
        self.loops.append((r.loop_var, r.extent))
        self.stmt(d.body, r.body)

    def _partial_predicate(self, r: BlockRealize) -> bool:
        """Whether every conjunct of the block's predicate bounds one loop the intrinsic may
        cut short (``base + i < bound``, ``base`` and ``bound`` free of the tile's loops);
        records the bounds."""
        if not self.partial:
            return False
        inner = {v for v, _ in self.loops}
        found: dict[int, list] = {}
        for c in conjuncts(r.predicate):
            if is_true(c):
                continue
            if not isinstance(c, LT):
                return False
            for depth in self.partial:
                if depth >= len(self.loops):
                    continue
                v = self.loops[depth][0]
                base = self.ana.simplify(c.a - v)
                if not (vars_in(base) & inner) and not (vars_in(c.b) & inner):
                    found.setdefault(depth, []).append((base, c.b))
                    break
            else:
                return False
        self.bounds = found
        return True

    def _s_BlockRealize(self, d: BlockRealize, r: BlockRealize):
        db, rb = d.block, r.block
        if len(db.iter_vars) != len(rb.iter_vars):
            raise _Mismatch(f"block {rb.name} has {len(rb.iter_vars)} iter vars "
                            f"{[iv.var.name for iv in rb.iter_vars]}, the intrinsic's block "
                            f"{db.name} has {len(db.iter_vars)}")
        for div, riv, dval, rval in zip(db.iter_vars, rb.iter_vars, d.iter_values,
                                        r.iter_values):
            if div.kind != riv.kind:
                raise _Mismatch(f"iter var {riv.var.name} of block {rb.name} is {riv.kind}, the "
                                f"intrinsic's {div.var.name} is {div.kind}")
            if not (self.ana.can_prove_equal(div.dom.extent, riv.dom.extent)
                    and self.ana.can_prove_equal(div.dom.min, riv.dom.min)):
                raise _Mismatch(f"iter var {riv.var.name} of block {rb.name} ranges over "
                                f"[{riv.dom.min!r}, +{riv.dom.extent!r}), the intrinsic's "
                                f"{div.var.name} over [{div.dom.min!r}, +{div.dom.extent!r})")
            if not self._same_value(dval, rval):
                raise _Mismatch(f"iter var {riv.var.name} of block {rb.name} is bound to "
                                f"{rval!r}, the intrinsic's {div.var.name} to {dval!r}")
        if is_true(d.predicate) and not is_true(r.predicate) and self._partial_predicate(r):
            pass  # a partial tile along loops the intrinsic can cut short
        elif is_true(d.predicate) != is_true(r.predicate) or \
                (not is_true(d.predicate) and not self._same_value(d.predicate, r.predicate)):
            theirs = "none" if is_true(d.predicate) else repr(d.predicate)
            raise _Mismatch(f"block {rb.name} has the predicate {r.predicate!r}, the "
                            f"intrinsic's block has {theirs} (a partial tile cannot be "
                            f"tensorized)")
        self.realize = r
        for div, riv in zip(db.iter_vars, rb.iter_vars):
            self.vmap[div.var] = riv.var
            # the inner iter vars' ranges let accesses such as a packed operand's
            # B[(vj_o * 32 + vj_i) // 32, k, (vj_o * 32 + vj_i) % 32] simplify to base + vj_i
            self.ana.bind(riv.var, riv.dom)
        if (db.init is None) != (rb.init is None):
            has = "has" if rb.init is not None else "has no"
            raise _Mismatch(f"block {rb.name} {has} init, the intrinsic's block "
                            f"{'does not' if db.init is None else 'does'} (decompose_reduction "
                            f"separates the init)")
        if db.init is not None:
            self.stmt(db.init, rb.init)
        if rb.alloc_buffers or db.alloc_buffers:
            raise _Mismatch(f"block {rb.name} allocates buffers; tensorize matches blocks "
                            f"without allocations")
        self.stmt(db.body, rb.body)

    def _s_BufferStore(self, d: BufferStore, r: BufferStore):
        self._access(d.buffer, r.buffer, d.indices, r.indices)
        try:
            self.expr(d.value, r.value)
        except _Mismatch as err:
            raise _Mismatch(f"in the store to {r.buffer.name}: {err}") from None

    def _s_IfThenElse(self, d: IfThenElse, r: IfThenElse):
        self.expr(d.condition, r.condition)
        self.stmt(d.then_case, r.then_case)
        if (d.else_case is None) != (r.else_case is None):
            raise _Mismatch("an if has an else branch on one side only")
        if d.else_case is not None:
            self.stmt(d.else_case, r.else_case)

    def _s_LetStmt(self, d: LetStmt, r: LetStmt):
        self.expr(d.value, r.value)
        self.vmap[d.var] = r.var
        self.stmt(d.body, r.body)

    def _s_Evaluate(self, d: Evaluate, r: Evaluate):
        self.expr(d.value, r.value)

    # -- expressions
    def _same_value(self, d: PrimExpr, r: PrimExpr) -> bool:
        try:
            return self.ana.can_prove_equal(substitute(d, self.vmap), r)
        except TIRError:
            return False

    def expr(self, d: PrimExpr, r: PrimExpr) -> None:
        if isinstance(d, _COMMUTATIVE) and type(d) is type(r) and d.dtype == r.dtype:
            state = self._save()
            try:
                self.expr(d.a, r.a)
                self.expr(d.b, r.b)
                return
            except _Mismatch as first:
                self._restore(state)
                try:
                    self.expr(d.a, r.b)
                    self.expr(d.b, r.a)
                    return
                except _Mismatch:
                    self._restore(state)
                    raise first from None
        self._expr(d, r)

    def _expr(self, d: PrimExpr, r: PrimExpr) -> None:
        differ = _Mismatch(f"the intrinsic computes `{d!r}` where the block computes `{r!r}`")
        if type(d) is not type(r):
            raise differ
        if isinstance(d, BufferLoad):
            self._access(d.buffer, r.buffer, d.indices, r.indices)
            return
        if d.dtype != r.dtype:
            raise _Mismatch(f"dtype: the intrinsic computes `{d!r}` in {d.dtype} where the "
                            f"block computes `{r!r}` in {r.dtype}")
        if isinstance(d, Var):
            if self.vmap.get(d) is not r:
                raise differ
            return
        if isinstance(d, Let):
            self.expr(d.value, r.value)
            self.vmap[d.var] = r.var
            self.expr(d.body, r.body)
            return
        for f in d._fields:
            a, b = getattr(d, f), getattr(r, f)
            if isinstance(a, PrimExpr):
                self.expr(a, b)
            elif isinstance(a, tuple):
                if len(a) != len(b):
                    raise differ
                for x, y in zip(a, b):
                    if isinstance(x, PrimExpr):
                        self.expr(x, y)
                    elif x != y:
                        raise differ
            elif a != b:
                raise differ

    def _access(self, d: Buffer, r: Buffer, d_idx: tuple, r_idx: tuple) -> None:
        """Pair the buffers of one access and record it; an access that is no shift of the
        description's (whatever the dims) fails here already, so that the commutative retry
        of ``expr`` can pair ``A * B`` with ``B' * A'``."""
        self._buffer(d, r)
        inner = set(self.vmap.values())
        if len(d_idx) > len(r_idx) or not any(
                self._bases([(d_idx, r_idx)], dims, len(r_idx), inner) is not None
                for dims in itertools.combinations(range(len(r_idx)), len(d_idx))):
            raise _Mismatch(f"the block's access {r.name}{_show_idx(r_idx)} is not the "
                            f"intrinsic's {d.name}{_show_idx(d_idx)} shifted by a fixed offset")
        self.accesses.setdefault(d, []).append((d_idx, r_idx))

    def _buffer(self, d: Buffer, r: Buffer) -> None:
        if d.dtype != r.dtype:
            raise _Mismatch(f"dtype: the intrinsic's buffer {d.name} is {d.dtype}, the block's "
                            f"buffer {r.name} is {r.dtype}")
        prev = self.bufs.get(d)
        if prev is not None and prev is not r:
            raise _Mismatch(f"the intrinsic's buffer {d.name} stands for both {prev.name} and "
                            f"{r.name} in the block")
        self.bufs[d] = r

    # -- phase 2
    def buffer_bindings(self, params: Sequence[Buffer], block: Block
                        ) -> list[tuple[Buffer, tuple[int, ...], list[PrimExpr]]]:
        """For each description buffer: (real buffer, the real dims its dims cover, the base
        index of every real dim)."""
        inner = set(self.vmap.values())
        out = []
        for d in params:
            r = self.bufs.get(d)
            if r is None:
                raise _Mismatch(f"the intrinsic's buffer {d.name} is not accessed")
            nd, nr = len(d.shape), len(r.shape)
            if nd > nr:
                raise _Mismatch(f"the intrinsic's buffer {d.name} has {nd} dimensions, the "
                                f"block's {r.name} only {nr}")
            found = None
            for dims in itertools.combinations(range(nr), nd):
                base = self._bases(self.accesses[d], dims, nr, inner)
                if base is not None:
                    found = dims, base
                    break
            if found is None:
                dix, rix = self.accesses[d][0]
                raise _Mismatch(f"the block's accesses of {r.name} (e.g. {r.name}"
                                f"{_show_idx(rix)}) are not the intrinsic's accesses of {d.name} "
                                f"({d.name}{_show_idx(dix)}) shifted by one fixed offset")
            dims, base = found
            want = [IntImm(1, "int64")] * nr
            for k, q in enumerate(dims):
                want[q] = d.shape[k]
            for reg in list(block.writes) + list(block.reads):
                if reg.buffer is not r:
                    continue
                ext = [rng.extent for rng in reg.region]
                if not all(self.ana.can_prove_equal(e, w) for e, w in zip(ext, want)):
                    raise _Mismatch(f"the block's region of {r.name} has extents "
                                    f"{_show_idx(ext)}, the intrinsic's buffer {d.name} has "
                                    f"shape {_show_idx(d.shape)}")
            out.append((r, dims, base))
        return out

    def _bases(self, accesses, dims, nr: int, inner: set[Var]) -> list[PrimExpr] | None:
        base: list[PrimExpr] | None = None
        for dix, rix in accesses:
            cur = []
            for q in range(nr):
                if q in dims:
                    k = dims.index(q)
                    diff = self.ana.simplify(rix[q] - substitute(dix[k], self.vmap))
                else:
                    # (vj_o * 64 + vj_i) // 64 of a panel index is vj_o: no tile var left
                    diff = self.ana.simplify(rix[q]) if vars_in(rix[q]) & inner else rix[q]
                if vars_in(diff) & inner:
                    return None
                cur.append(diff)
            if base is None:
                base = cur
            elif not all(self.ana.can_prove_equal(a, b) for a, b in zip(base, cur)):
                return None
        return base


def _describe(s: Stmt) -> str:
    if isinstance(s, For):
        return f"a loop ({s.loop_var.name})"
    if isinstance(s, BlockRealize):
        return f"a block ({s.block.name})"
    if isinstance(s, BufferStore):
        return f"a store to {s.buffer.name}"
    return f"a {type(s).__name__}"


def _show_idx(idx) -> str:
    return "[" + ", ".join(str(i.value) if isinstance(i, IntImm) else repr(i) for i in idx) + "]"


class _Instantiate(IRMutator):
    """The impl body with its buffer accesses moved onto the real buffers at the matched
    bases, fresh loop (and let) variables, and its scratch buffers renamed."""

    def __init__(self, targets: dict[Buffer, tuple[Buffer, tuple[int, ...], list[PrimExpr]]],
                 scratch: dict[Buffer, Buffer]):
        super().__init__()
        self.targets = targets
        self.buffer_map.update(scratch)
        self.vars: dict[Var, Var] = {}

    def visit_Var(self, v: Var):
        return self.vars.get(v, v)

    def _fresh(self, v: Var) -> None:
        self.vars[v] = Var(v.name, v.dtype)

    def visit_For(self, s: For):
        self._fresh(s.loop_var)
        return self.generic_visit(s)

    def visit_LetStmt(self, s: LetStmt):
        self._fresh(s.var)
        return self.generic_visit(s)

    def visit_Let(self, e: Let):
        self._fresh(e.var)
        return self.generic_visit(e)

    def _indices(self, buf: Buffer, indices) -> tuple[Buffer, list[PrimExpr]]:
        real, dims, base = self.targets[buf]
        out = list(base)
        for k, q in enumerate(dims):
            out[q] = _plus(base[q], self.visit(indices[k]))
        return real, out

    def visit_BufferLoad(self, e: BufferLoad):
        if e.buffer not in self.targets:
            return self.generic_visit(e)
        real, idx = self._indices(e.buffer, e.indices)
        return BufferLoad(real, idx)

    def visit_BufferStore(self, s: BufferStore):
        if s.buffer not in self.targets:
            return self.generic_visit(s)
        real, idx = self._indices(s.buffer, s.indices)
        return BufferStore(real, self.visit(s.value), idx)


def tensorize_block(func: PrimFunc, block_name: str, intrin: TensorIntrin) -> PrimFunc:
    """See ``Schedule.tensorize``: ``func`` with the body of block ``block_name`` replaced by
    ``intrin``'s impl on the matched regions."""
    prim = "tensorize"
    br, _ = tree.find_block(func, block_name)
    block = br.block
    desc_body, _ = strip_root(intrin.desc)
    m = _Matcher(intrin.partial)
    for iv in block.iter_vars:
        # the tile's base (vj_o * 64) is then known to be >= 0 and a whole number of tiles
        m.ana.bind(iv.var, iv.dom)
    try:
        m.stmt(desc_body, block.body)
        bindings = m.buffer_bindings(intrin.desc.buffers, block)
    except _Mismatch as err:
        hint = ""
        if isinstance(desc_body, For) and not isinstance(block.body, For):
            hint = (" (tensorize needs a block whose body is the tile's loop nest: pass the "
                    "first tile loop, or blockize it first)")
        raise ScheduleError(prim, f"block {block_name!r} does not match the tensor intrinsic "
                            f"{intrin.name!r}: {err}{hint}", block) from None
    impl_body, impl_alloc = strip_root(intrin.impl)
    taken: set[str] = set()
    scratch = {}
    for b in impl_alloc:
        nm = unique_name(func, b.name, taken)
        taken.add(nm)
        scratch[b] = Buffer(nm, b.shape, b.dtype, b.strides, b.scope, b.align)
    targets = {ib: bind for ib, bind in zip(intrin.impl.buffers, bindings)}
    body = _Instantiate(targets, scratch).visit(impl_body)
    counts = _partial_counts(func, block_name, block, intrin, m)
    if counts:
        body = substitute(body, counts)
    new_block = block.replace(body=body, alloc_buffers=block.alloc_buffers + tuple(
        scratch[b] for b in impl_alloc), annotations=dict(block.annotations))
    return tree.replace(func, br, br.replace(block=new_block))


def _partial_counts(func: PrimFunc, block_name: str, block: Block, intrin: TensorIntrin,
                    m: _Matcher) -> dict[Var, PrimExpr]:
    """The values of the impl's count variables (``TensorIntrin.partial``) for the matched
    tile: ``min(extent, bound - base)`` over the predicate's bounds of that loop, else the
    extent. A loop the impl computes whole (no count variable) under a predicate is allowed
    only where the block writes no parameter buffer of ``func``."""
    out: dict[Var, PrimExpr] = {}
    params = {id(b) for b in func.buffers}
    for depth, var in intrin.partial.items():
        extent = m.loops[depth][1]
        bounds = m.bounds.get(depth, [])
        if var is None:
            if bounds:
                _check_whole_tile(func, block_name, block, intrin, m, depth, params)
            continue
        count: PrimExpr = extent
        for base, bound in bounds:
            count = Min(count, bound - base)
        count = m.ana.simplify(count)
        out[var] = count if count.dtype == var.dtype else count.astype(var.dtype)
    return out


def _check_whole_tile(func: PrimFunc, block_name: str, block: Block, intrin: TensorIntrin,
                      m: _Matcher, depth: int, params: set) -> None:
    """A tile the impl computes whole along loop ``depth`` although the predicate cuts it
    short: it must write no parameter buffer, and every access along that loop must stay in
    its buffer over the whole tile (padding, not another row)."""
    loop = m.loops[depth][0]
    written = [w.buffer.name for w in block.writes if id(w.buffer) in params]
    why = None
    if written:
        why = f"the block writes the parameter buffer(s) {written}"
    else:
        r = m.realize
        along = {iv.var for iv, val in zip(r.block.iter_vars, r.iter_values)
                 if loop in vars_in(val)}
        for d, accs in m.accesses.items():
            buf = m.bufs[d]
            for _, ridx in accs:
                for q, e in enumerate(ridx):
                    if vars_in(e) & along and not m.ana.can_prove(e < buf.shape[q]):
                        why = (f"its access {buf.name}{_show_idx(ridx)} may leave the buffer "
                               f"(dimension {q}) over the whole tile")
                        break
                if why:
                    break
            if why:
                break
    if why:
        raise ScheduleError("tensorize", f"block {block_name!r}: the tensor intrinsic "
                            f"{intrin.name!r} computes whole tiles along loop {loop.name}, "
                            f"which the block's predicate cuts short, and {why}: give it "
                            f"buffers padded to whole tiles (a scratch from cache_write with "
                            f"transform_layout, operands packed in panels)", block)


def _get_intrin(name, primitive: str) -> TensorIntrin:
    if not isinstance(name, str):
        raise ScheduleError(primitive, f"the tensor intrinsic must be given by name (a str), "
                            f"got {name!r}")
    try:
        return TensorIntrin.get(name)
    except TIRError as err:
        raise ScheduleError(primitive, str(err)) from None


# =============================================================================================
# the mixin


class TensorizePrimitives:
    """Mixin of ``Schedule``: blockize, tensorize."""

    @traced
    def blockize(self, target: "LoopRV | list[BlockRV]", preserve_unit_iters: bool = True
                 ) -> BlockRV:
        """Turn the subtree under a loop (or a list of consecutive sibling blocks) into one
        outer block.

        **Loop form.** ``target`` must hold exactly one block through perfectly nested loops.
        Each binding of that block is divided into a part over the loops outside ``target``
        and a part over the loops from ``target`` on: ``v = outer * E + inner`` with ``inner``
        in ``[0, E)``. The outer block ``<name>_o`` gets an iter var ``v_o`` (bound to
        ``outer``) and the inner block (which keeps its name) ``v_i`` (bound to ``inner``); a
        binding that does not depend on the inner loops moves to the outer block unchanged.
        The outer block's reads/writes are the inner ones widened over the inner loops; a
        reduction's init moves to the outer block (in a block ``<name>_init`` inside copies of
        the inner loops), so ``decompose_reduction`` applies to the outer block. Loops keep
        their variables (their LoopRVs stay valid).

        **List form.** The blocks must be consecutive statements of one sequence (or one
        block); they are wrapped, with the loops between them and that sequence, in a block
        ``<b1>_<b2>_..._o`` with one iter var ``v<loop>_o`` per enclosing loop they use (reduce
        if it feeds a reduce iter var of theirs), bound to that loop.

        Parameters
        ----------
        target : LoopRV | list[BlockRV]
            The root loop of the subtree, or the blocks.
        preserve_unit_iters : bool
            Keep loops of extent 1 in the bindings (else they are replaced by their min).

        Returns
        -------
        BlockRV
            The new outer block.

        Raises
        ------
        ScheduleError
            When the loop holds other than one block, or a binding cannot be divided (not
            affine, or its outer part not a multiple of its inner extent).

        Examples
        --------
        Before (a matmul split by a 4 x 16 micro-tile)::

            for i_0, j_0, k, i_1, j_1 in T.grid(16, 4, 64, 4, 16):
                with T.block("C"):
                    vi = T.axis.spatial(64, i_0 * 4 + i_1)
                    vj = T.axis.spatial(64, j_0 * 16 + j_1)
                    vk = T.axis.reduce(64, k)
                    with T.init():
                        C[vi, vj] = T.float32(0)
                    C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

        ``sch.blockize(i_1)``::

            for i_0, j_0, k in T.grid(16, 4, 64):
                with T.block("C_o"):
                    vi_o = T.axis.spatial(16, i_0)
                    vj_o = T.axis.spatial(4, j_0)
                    vk = T.axis.reduce(64, k)
                    T.reads(A[vi_o * 4:vi_o * 4 + 4, vk], B[vk, vj_o * 16:vj_o * 16 + 16])
                    T.writes(C[vi_o * 4:vi_o * 4 + 4, vj_o * 16:vj_o * 16 + 16])
                    with T.init():
                        for i_1_init, j_1_init in T.grid(4, 16):
                            with T.block("C_init"):
                                vi_i_init = T.axis.spatial(4, i_1_init)
                                vj_i_init = T.axis.spatial(16, j_1_init)
                                C[vi_o * 4 + vi_i_init, vj_o * 16 + vj_i_init] = T.float32(0)
                    for i_1, j_1 in T.grid(4, 16):
                        with T.block("C"):
                            vi_i = T.axis.spatial(4, i_1)
                            vj_i = T.axis.spatial(16, j_1)
                            C[vi_o * 4 + vi_i, vj_o * 16 + vj_i] = (
                                C[vi_o * 4 + vi_i, vj_o * 16 + vj_i]
                                + A[vi_o * 4 + vi_i, vk] * B[vk, vj_o * 16 + vj_i])
        """
        prim = "blockize"
        if not isinstance(preserve_unit_iters, bool):
            raise ScheduleError(prim, f"preserve_unit_iters must be a bool, got "
                                f"{preserve_unit_iters!r}")
        if isinstance(target, LoopRV):
            f, _ = self._loop(target, prim)
            func, name = blockize_loop(self.func, f.loop_var, preserve_unit_iters)
        elif isinstance(target, (list, tuple)) and target and \
                all(isinstance(b, BlockRV) for b in target):
            names = [self._block(b, prim)[0].block.name for b in target]
            func, name = blockize_blocks(self.func, names, preserve_unit_iters)
        else:
            raise ScheduleError(prim, f"target must be a LoopRV or a non-empty list of BlockRVs, "
                                f"got {target!r}")
        self._set_func(func)
        return self._block_rv(name)

    @traced
    def tensorize(self, block_or_loop: "BlockRV | LoopRV", tensor_intrin: str,
                  preserve_unit_iters: bool = True) -> None:
        """Replace a block's computation by a tensor intrinsic's implementation.

        A loop is first blockized (``blockize(loop, preserve_unit_iters)``). The block's body
        must match the intrinsic's description structurally: the same loop nest (extents:
        the tile shape), one block with iter vars of the same kinds, ranges and bindings, the
        same computation up to renaming (``a + b`` matches ``b + a``), the same dtypes, and
        every access of a buffer the description's access shifted by one fixed offset (the
        base of the matched region, whose extents must be the description buffer's shape).
        The body is then replaced by the intrinsic's impl, its accesses re-expressed on the
        real buffers at those bases; the block keeps its iter vars, regions and init. A block
        with a predicate (a partial tile at a ragged edge) matches only along loops the
        intrinsic declares partial (``TensorIntrin.partial``: the impl gets the count of valid
        iterations, or computes the whole tile into buffers padded for it).

        Parameters
        ----------
        block_or_loop : BlockRV | LoopRV
            A blockized block (e.g. from ``blockize``) or the loop to blockize.
        tensor_intrin : str
            A name registered with ``TensorIntrin.register`` or of a built-in family
            (``outer_product_f32_avx512_4x16``; see ``tensorir.schedule.intrinsics``).
        preserve_unit_iters : bool
            Passed to ``blockize`` when a loop is given.

        Raises
        ------
        ScheduleError
            When the block does not match, naming the block, the intrinsic and what differs.

        Examples
        --------
        Before (after ``blockize(i_1)`` of the example of ``blockize``): block ``C_o`` as
        shown there. ``sch.tensorize(c_o, "outer_product_f32_avx512_4x16")``::

            with T.block("C_o"):
                ...
                for i in T.unroll(4):
                    for jo in T.unroll(1):
                        for ji in T.vectorized(16):
                            C[vi_o * 4 + i, vj_o * 16 + (jo * 16 + ji)] = (
                                C[vi_o * 4 + i, vj_o * 16 + (jo * 16 + ji)]
                                + A[vi_o * 4 + i, vk] * B[vk, vj_o * 16 + (jo * 16 + ji)])

        The usual flow for a GEMM: split / reorder to the micro-tile, ``tensorize`` the
        first tile loop with ``outer_product_*``, ``decompose_reduction`` the outer block and
        ``tensorize`` the init block with ``fill_zero_*``.
        """
        prim = "tensorize"
        intrin = _get_intrin(tensor_intrin, prim)
        if not isinstance(preserve_unit_iters, bool):
            raise ScheduleError(prim, f"preserve_unit_iters must be a bool, got "
                                f"{preserve_unit_iters!r}")
        if isinstance(block_or_loop, LoopRV):
            f, _ = self._loop(block_or_loop, prim)
            func, name = blockize_loop(self.func, f.loop_var, preserve_unit_iters)
        elif isinstance(block_or_loop, BlockRV):
            func, name = self.func, self._block(block_or_loop, prim)[0].block.name
        else:
            raise ScheduleError(prim, f"expected a BlockRV or a LoopRV, got {block_or_loop!r}")
        self._set_func(tensorize_block(func, name, intrin))


__all__ = ["TensorizePrimitives", "blockize_loop", "blockize_blocks", "tensorize_block"]
