"""Schedule primitives on loops: split, fuse, reorder, parallel, vectorize, unroll, bind,
annotate, unannotate, add_unit_loop.

Loop primitives never change block bodies, so the blocks' read/write regions (written in terms
of their iteration variables) stay valid; they change loops, the blocks' iter values (bindings)
and predicates. Each primitive is a ``@traced`` method of ``LoopPrimitives`` over a pure function
``(PrimFunc, ...) -> PrimFunc`` of this module, so an illegal request leaves the schedule as it
was. Loops that a primitive keeps keep their loop ``Var`` (their LoopRVs stay valid); loops it
replaces (split, fuse) get new Vars named as in TVM (``i_0, i_1``; ``i_j_fused``) and their
old LoopRVs become invalid.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import dtype as dt
from ..expr import FloatImm, IntImm, PrimExpr, StringImm, Var, floordiv, floormod
from ..function import PrimFunc
from ..stmt import BlockRealize, For, Range, SeqStmt
from . import tree
from ._loop_utils import (add, block_scopes, const, is_one, is_quasi_affine, is_zero, loop_analyzer,
                          mul, product, rewrite_loop_body, uses_any, uses_var)
from .error import ScheduleError
from .rv import BlockRV, ExprRV, LoopRV, traced

THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y",
               "threadIdx.z", "vthread", "vthread.x", "vthread.y", "vthread.z")

_KIND_WORDS = {"serial": "serial", "parallel": "parallel", "vectorized": "vectorized",
               "unrolled": "unrolled", "thread_binding": "thread-bound"}
_PRIMITIVES = {"parallel": "parallel", "vectorized": "vectorize", "thread_binding": "bind",
               "unrolled": "unroll"}
_VERBS = {"parallel": "parallelize", "vectorized": "vectorize", "thread_binding": "bind",
          "unrolled": "unroll"}


def _loop_desc(loop: For) -> str:
    if loop.kind == "thread_binding":
        return f"bound to {loop.thread_tag}"
    return _KIND_WORDS[loop.kind]


def _show_factors(factors) -> str:
    return "[" + ", ".join("None" if f is None else str(f) for f in factors) + "]"


# =============================================================================================
# pure transformations: (PrimFunc, ...) -> PrimFunc


def split_loop(func: PrimFunc, loop_var: Var, factors: Sequence[int | PrimExpr | None],
               preserve_unit_iters: bool = True) -> tuple[PrimFunc, list[Var]]:
    """Split the loop of ``loop_var`` into ``len(factors)`` nested loops; see ``Schedule.split``.

    Returns the new function and the new loop variables, outermost first.
    """
    prim = "split"
    loop, _ = tree.find_loop(func, loop_var)
    name, dtype = loop_var.name, loop_var.dtype
    factors = list(factors)
    if not factors:
        raise ScheduleError(prim, f"loop {name}: needs at least one factor", loop)
    nones = [k for k, f in enumerate(factors) if f is None]
    if len(nones) > 1:
        raise ScheduleError(prim, f"loop {name}: at most one factor may be None (to be inferred), "
                            f"got {_show_factors(factors)}", loop)
    ana = loop_analyzer(func, skip=[loop_var])
    exprs: list[PrimExpr | None] = []
    for f in factors:
        if f is None:
            exprs.append(None)
        elif isinstance(f, (bool, np.bool_)) or not isinstance(f, (int, np.integer, PrimExpr)):
            raise ScheduleError(prim, f"loop {name}: a factor must be a positive int, an ExprRV "
                                f"or None, got {f!r}", loop)
        elif isinstance(f, PrimExpr):
            if not dt.is_integer(f.dtype) or not ana.can_prove(f > 0):
                raise ScheduleError(prim, f"loop {name}: factor {f!r} must be a positive integer",
                                    loop)
            exprs.append(f.astype(dtype))
        else:
            if int(f) <= 0:
                raise ScheduleError(prim, f"loop {name}: factors must be positive, got "
                                    f"{_show_factors(factors)}", loop)
            exprs.append(const(int(f), loop_var))
    extent = loop.extent
    known = product([e for e in exprs if e is not None], dtype, ana)
    if nones:
        # ceildiv: a tail that does not fill the last tile is masked by the predicate below
        exprs[nones[0]] = ana.simplify(floordiv(extent + known - 1, known))
    elif not ana.can_prove_equal(known, extent):
        raise ScheduleError(prim, f"loop {name} (extent {extent!r}) got factors "
                            f"{_show_factors(factors)} whose product is wrong: {known!r} != "
                            f"{extent!r}; give one factor as None to infer it", loop)

    new_vars = [Var(f"{name}_{k}", dtype) for k in range(len(exprs))]
    # ``prover`` knows every range (for the predicate); ``ana`` simplifies the bindings and,
    # when unit iterators are preserved, must not know that they are 0
    prover = loop_analyzer(func, skip=[loop_var])
    ana = loop_analyzer(func, skip=[loop_var], bind_unit=not preserve_unit_iters)
    for v, e in zip(new_vars, exprs):
        prover.bind(v, Range(const(0, loop_var), e))
        if not (preserve_unit_iters and is_one(e)):
            ana.bind(v, Range(const(0, loop_var), e))
    # the index the old loop ran over: i - min = i_0 * (f1 * f2) + i_1 * f2 + i_2
    fused = None
    for k, (v, e) in enumerate(zip(new_vars, exprs)):
        if not preserve_unit_iters and is_one(e):
            continue  # a unit iterator contributes 0; TVM drops it from the bindings
        fused = add(fused, mul(v, product(exprs[k + 1:], dtype, ana)))
    if fused is None:
        fused = const(0, loop_var)
    value = fused if is_zero(loop.min) else loop.min + fused
    predicate = None
    if not prover.can_prove(fused < extent):
        predicate = fused < extent
    body = rewrite_loop_body(loop.body, {loop_var: value}, ana, predicate)
    for v, e in reversed(list(zip(new_vars, exprs))):
        body = For(v, const(0, loop_var), e, "serial", body)
    return tree.replace(func, loop, body), new_vars


def fuse_loops(func: PrimFunc, loop_vars: Sequence[Var],
               preserve_unit_iters: bool = True) -> tuple[PrimFunc, Var]:
    """Fuse perfectly nested consecutive loops (outermost first) into one; see ``Schedule.fuse``.

    Returns the new function and the fused loop variable.
    """
    prim = "fuse"
    if not loop_vars:
        raise ScheduleError(prim, "needs at least one loop")
    _check_distinct(prim, loop_vars)
    loops = [tree.find_loop(func, v)[0] for v in loop_vars]
    for outer, inner in zip(loops, loops[1:]):
        if outer.body is not inner:
            raise ScheduleError(prim, f"fusing non-adjacent loops {outer.loop_var.name} and "
                                f"{inner.loop_var.name}: loop {inner.loop_var.name} must be the "
                                f"only statement in the body of loop {outer.loop_var.name} "
                                f"(give consecutive, perfectly nested loops, outermost first)",
                                inner)
    for lp in loops:
        if lp.kind != "serial" or lp.annotations:
            what = _loop_desc(lp) if lp.kind != "serial" else f"annotated {lp.annotation_dict}"
            raise ScheduleError(prim, f"loop {lp.loop_var.name} is {what}; only serial loops "
                                f"without annotations can be fused", lp)
    for k, lp in enumerate(loops):
        outer_vars = [o.loop_var for o in loops[:k]]
        if uses_any(lp.min, outer_vars) or uses_any(lp.extent, outer_vars):
            raise ScheduleError(prim, f"the range of loop {lp.loop_var.name} depends on an outer "
                                f"loop being fused; the loops must form a rectangular nest", lp)
    dtype = loop_vars[0].dtype
    for lp in loops:
        if lp.loop_var.dtype != dtype:
            raise ScheduleError(prim, f"loop {lp.loop_var.name} is {lp.loop_var.dtype}, loop "
                                f"{loop_vars[0].name} is {dtype}; fused loops need one dtype", lp)
    ana = loop_analyzer(func, skip=loop_vars, bind_unit=False)
    kept = [lp for lp in loops if preserve_unit_iters or not is_one(lp.extent)]
    extent = product([lp.extent for lp in kept], dtype, ana)
    fused = Var("_".join(v.name for v in loop_vars) + "_fused", dtype)
    ana.bind(fused, Range(const(0, fused), extent))
    vmap = {}
    for lp in loops:
        if lp not in kept:
            vmap[lp.loop_var] = lp.min
            continue
        k = kept.index(lp)
        stride = product([o.extent for o in kept[k + 1:]], dtype, ana)
        # i = f // (ej * ek), j = f // ek % ej, k = f % ek
        val = fused if is_one(stride) else floordiv(fused, stride)
        if k > 0:
            val = floormod(val, lp.extent)
        val = ana.simplify(val)
        vmap[lp.loop_var] = val if is_zero(lp.min) else lp.min + val
    body = rewrite_loop_body(loops[-1].body, vmap, ana)
    new_loop = For(fused, const(0, fused), extent, "serial", body)
    return tree.replace(func, loops[0], new_loop), fused


def reorder_loops(func: PrimFunc, loop_vars: Sequence[Var]) -> PrimFunc:
    """Reorder loops of one chain of perfectly nested loops; see ``Schedule.reorder``."""
    prim = "reorder"
    if not loop_vars:
        raise ScheduleError(prim, "needs at least one loop")
    _check_distinct(prim, loop_vars)
    found = [tree.find_loop(func, v) for v in loop_vars]
    # the innermost given loop has every other given loop among its ancestors
    inner, inner_anc = max(found, key=lambda t: len(t[1]))
    path = list(inner_anc) + [inner]
    positions = []
    for lp, _ in found:
        idx = next((k for k, s in enumerate(path) if s is lp), None)
        if idx is None:
            raise ScheduleError(prim, f"loops {lp.loop_var.name} and {inner.loop_var.name} are "
                                f"not in the same loop nest (neither encloses the other)", lp)
        positions.append(idx)
    top = min(positions)
    chain = path[top:]
    for k, s in enumerate(chain):
        if not isinstance(s, For):
            what = (f"block {s.block.name}" if isinstance(s, BlockRealize)
                    else "a sequence of statements" if isinstance(s, SeqStmt)
                    else f"a {type(s).__name__}")
            raise ScheduleError(prim, f"loops {chain[0].loop_var.name} and "
                                f"{inner.loop_var.name} are not in one chain of perfectly nested "
                                f"loops: {what} lies between them", s)
        if k + 1 < len(chain) and s.body is not chain[k + 1]:
            raise ScheduleError(prim, f"loop {chain[k + 1].loop_var.name} is not the only "
                                f"statement in the body of loop {s.loop_var.name}; reorder needs "
                                f"perfectly nested loops", s)
    rel = sorted(p - top for p in positions)
    given = [lp for lp, _ in found]
    new_chain = list(chain)
    for p, lp in zip(rel, given):
        new_chain[p] = lp
    for k, lp in enumerate(new_chain):
        inner_vars = [o.loop_var for o in new_chain[k + 1:]]
        if uses_any(lp.min, inner_vars) or uses_any(lp.extent, inner_vars):
            raise ScheduleError(prim, f"the range of loop {lp.loop_var.name} depends on a loop "
                                f"that would be inside it after reordering", lp)
    chain_vars = {lp.loop_var for lp in chain}
    for br, scope in block_scopes(chain[-1], tuple(path[:-1])):
        scope_vars = {lp.loop_var for lp in scope}
        for iv, value in zip(br.block.iter_vars, br.iter_values):
            if uses_any(value, chain_vars) and not is_quasi_affine(value, scope_vars):
                raise ScheduleError(prim, f"block {br.block.name}: the binding {iv.var.name} = "
                                    f"{value!r} is not affine in its loops, so reordering them "
                                    f"is not known to be legal", br)
    body = chain[-1].body
    for lp in reversed(new_chain):
        body = lp.replace(body=body)
    return tree.replace(func, chain[0], body)


def set_loop_kind(func: PrimFunc, loop_var: Var, kind: str,
                  thread_tag: str | None = None, primitive: str | None = None) -> PrimFunc:
    """Make the loop of ``loop_var`` ``kind`` (parallel / vectorized / unrolled /
    thread_binding with ``thread_tag``), checking TVM's rules; see ``Schedule.parallel``."""
    prim = primitive or _PRIMITIVES[kind]
    loop, ancestors = tree.find_loop(func, loop_var)
    name = loop_var.name
    if kind == "unrolled":
        if loop.kind == "thread_binding":
            raise ScheduleError(prim, f"loop {name} is bound to {loop.thread_tag}; unrolling it "
                                f"would drop the thread binding", loop)
        return tree.replace(func, loop, loop.replace(kind="unrolled", thread_tag=None))
    if kind == "thread_binding" and thread_tag not in THREAD_TAGS:
        raise ScheduleError(prim, f"loop {name}: unknown thread axis {thread_tag!r}; expected one "
                            f"of {list(THREAD_TAGS)}", loop)
    if loop.kind != "serial":
        raise ScheduleError(prim, f"cannot {_VERBS[kind]} loop {name}: it is already "
                            f"{_loop_desc(loop)}; only a serial loop can be made "
                            f"{_target(kind, thread_tag)}", loop)
    for br, scope in block_scopes(loop, ancestors):
        scope_vars = {lp.loop_var for lp in scope}
        for iv, value in zip(br.block.iter_vars, br.iter_values):
            if not uses_var(value, loop_var):
                continue
            if iv.kind != "spatial":
                if kind == "thread_binding" and thread_tag.startswith("threadIdx"):
                    continue   # a cross-thread reduction (transform.LowerCrossThreadReduction)
                raise ScheduleError(prim, f"cannot {_VERBS[kind]} loop {name}: it is bound to the "
                                    f"reduction iter var {iv.var.name} of block {br.block.name}; "
                                    f"only loops bound to spatial iter vars can be made "
                                    f"{_target(kind, thread_tag)} (a reduction loop can be bound "
                                    f"to threadIdx: a cross-thread reduction)", loop)
            if not is_quasi_affine(value, scope_vars):
                raise ScheduleError(prim, f"cannot {_VERBS[kind]} loop {name}: block "
                                    f"{br.block.name} binds {iv.var.name} = {value!r}, which is "
                                    f"not affine in its loops", loop)
    if kind == "thread_binding":
        # A loop nested in another loop of the same threadIdx axis stands for the same thread
        # (TVM's cooperative fetch: a shared-memory copy under the compute's threadIdx loop
        # spread over the threads again). Block indices cannot repeat.
        cooperative = thread_tag.startswith("threadIdx")
        for s, _ in list(tree.walk(loop.body)) + [(a, None) for a in ancestors]:
            if isinstance(s, For) and s.kind == "thread_binding" and s.thread_tag == thread_tag \
                    and not cooperative:
                raise ScheduleError(prim, f"cannot bind loop {name} to {thread_tag}: loop "
                                    f"{s.loop_var.name} of the same nest is already bound to it",
                                    loop)
    return tree.replace(func, loop, loop.replace(kind=kind, thread_tag=thread_tag))


def _target(kind: str, thread_tag: str | None) -> str:
    return f"bound to {thread_tag}" if kind == "thread_binding" else _KIND_WORDS[kind]


def annotate_stmt(func: PrimFunc, target: str | Var, key: str, value,
                  remove: bool = False) -> PrimFunc:
    """Set (or with ``remove`` delete) the annotation ``key`` of the block named ``target`` or the
    loop of the Var ``target``; see ``Schedule.annotate``."""
    prim = "unannotate" if remove else "annotate"
    if not isinstance(key, str) or not key:
        raise ScheduleError(prim, f"the annotation key must be a non-empty string, got {key!r}")
    if isinstance(target, Var):
        node, _ = tree.find_loop(func, target)
        what = f"loop {target.name}"
        anns = node.annotation_dict
    else:
        node, _ = tree.find_block(func, target)
        what = f"block {target}"
        anns = dict(node.block.annotations)
    if remove:
        if key not in anns:
            raise ScheduleError(prim, f"{what} has no annotation {key!r} (it has "
                                f"{sorted(anns)})", node)
        del anns[key]
    else:
        anns[key] = _check_ann_value(prim, what, key, value)
    if isinstance(target, Var):
        new = node.replace(annotations=anns)
    else:
        new = node.replace(block=node.block.replace(annotations=anns))
    return tree.replace(func, node, new)


def _check_ann_value(prim: str, what: str, key: str, value):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (IntImm, FloatImm, StringImm)):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_check_ann_value(prim, what, key, v) for v in value]
    raise ScheduleError(prim, f"{what}: the value of annotation {key!r} must be an int, float, "
                        f"string or a list of them, got {value!r}")


def add_unit_loop_above(func: PrimFunc, target: str | Var) -> tuple[PrimFunc, Var]:
    """Wrap the block named ``target`` (or the loop of the Var ``target``) in a loop of extent 1;
    see ``Schedule.add_unit_loop``."""
    prim = "add_unit_loop"
    if isinstance(target, Var):
        node, _ = tree.find_loop(func, target)
        dtype = target.dtype
    else:
        node, ancestors = tree.find_block(func, target)
        if not ancestors:
            raise ScheduleError(prim, f"block {target} is the root block of the function; a loop "
                                f"cannot go above it", node)
        dtype = "int64"
    u = Var("u", dtype)
    return tree.replace(func, node, For(u, IntImm(0, dtype), IntImm(1, dtype), "serial", node)), u


def _check_distinct(prim: str, loop_vars: Sequence[Var]) -> None:
    seen: set[Var] = set()
    for v in loop_vars:
        if v in seen:
            raise ScheduleError(prim, f"loop {v.name} is given more than once")
        seen.add(v)


# =============================================================================================
# the Schedule mixin


def _traced_as(name: str):
    """``traced``, recording the call under ``name``.

    ``fuse`` and ``reorder`` take their loops variadically (TVM's API), but a trace records and
    replays arguments positionally; so the public method gathers the loops into one list and
    calls a traced method taking that list, recorded under the public name. Replay then calls
    the public method with the list, which records the same instruction again.
    """
    def deco(fn):
        fn.__name__ = name
        return traced(fn)
    return deco


def _flatten_loop_args(prim: str, items, preserve_unit_iters: bool):
    """The loops of ``fuse(l0, l1)``, ``fuse([l0, l1])`` and of the replayed form
    ``fuse([l0, l1], True)``."""
    loops = []
    for x in items:
        if isinstance(x, (list, tuple)):
            loops.extend(x)
        elif isinstance(x, bool) and prim == "fuse":
            preserve_unit_iters = x
        else:
            loops.append(x)
    for x in loops:
        if not isinstance(x, LoopRV):
            raise ScheduleError(prim, f"expected loops, got {x!r}")
    return loops, preserve_unit_iters


class LoopPrimitives:
    """Mixin of ``Schedule``: split, fuse, reorder, parallel, vectorize, unroll, bind, annotate,
    unannotate, add_unit_loop."""

    @traced
    def split(self, loop: LoopRV, factors: Sequence[int | ExprRV | None],
              preserve_unit_iters: bool = True) -> list[LoopRV]:
        """Split a loop into ``len(factors)`` nested loops, outermost first.

        Parameters
        ----------
        loop : LoopRV
            The loop to split. The new loops are serial and unannotated (as in TVM); a loop with
            a non-zero min becomes ``i = min + i_0 * (f1 * f2) + ...``.
        factors : list of int, ExprRV or None
            Positive factors; at most one may be None and is inferred as
            ``ceildiv(extent, product of the others)``. When every factor is given their product
            must equal the extent. When the extent is symbolic or not divisible, the blocks under
            the loop get the predicate ``i_0 * (f1 * f2) + i_1 * f2 + i_2 < extent``.
        preserve_unit_iters : bool
            If False, new loops of extent 1 do not appear in the blocks' bindings.

        Returns
        -------
        list of LoopRV
            The new loops ``i_0, i_1, ...``; the LoopRV of ``loop`` is no longer valid.

        Raises
        ------
        ScheduleError
            Two Nones, a factor <= 0, or factors whose product is wrong.

        Examples
        --------
        Before::

            for i in range(10):
                with T.block("B"):
                    vi = T.axis.spatial(10, i)
                    B[vi] = A[vi] * 2.0

        >>> i, = sch.get_loops(sch.get_block("B"))        # doctest: +SKIP
        >>> i0, i1 = sch.split(i, [None, 4])                        # doctest: +SKIP

        After::

            for i_0, i_1 in T.grid(3, 4):
                with T.block("B"):
                    vi = T.axis.spatial(10, i_0 * 4 + i_1)
                    T.where(i_0 * 4 + i_1 < 10)
                    B[vi] = A[vi] * 2.0
        """
        prim = "split"
        for_node, _ = self._loop(loop, prim)
        if not isinstance(factors, (list, tuple)):
            raise ScheduleError(prim, f"loop {for_node.loop_var.name}: factors must be a list, got "
                                f"{factors!r}", for_node)
        values = [None if f is None else self._int(f, prim) for f in factors]
        func, new_vars = split_loop(self.func, for_node.loop_var, values, preserve_unit_iters)
        self._set_func(func)
        return [self._loop_rv(v) for v in new_vars]

    def fuse(self, *loops: LoopRV, preserve_unit_iters: bool = True) -> LoopRV:
        """Fuse consecutive, perfectly nested loops into one loop.

        Parameters
        ----------
        *loops : LoopRV
            Serial, unannotated loops, outermost first, each the only statement in the body of
            the previous one (a single list of loops works too).
        preserve_unit_iters : bool
            If False, loops of extent 1 do not appear in the blocks' bindings.

        Returns
        -------
        LoopRV
            The fused loop ``i_j_fused`` of extent ``ei * ej``; ``i`` becomes ``f // ej`` and
            ``j`` becomes ``f % ej`` in the blocks' bindings. The given LoopRVs become invalid.

        Raises
        ------
        ScheduleError
            Fusing non-adjacent loops, non-serial or annotated loops, or a loop given twice.

        Examples
        --------
        Before::

            for i, j in T.grid(16, 8):
                with T.block("B"):
                    vi = T.axis.spatial(16, i)
                    vj = T.axis.spatial(8, j)
                    B[vi, vj] = A[vi, vj] * 2.0

        >>> i, j = sch.get_loops(sch.get_block("B"))      # doctest: +SKIP
        >>> f = sch.fuse(i, j)                                      # doctest: +SKIP

        After::

            for i_j_fused in range(128):
                with T.block("B"):
                    vi = T.axis.spatial(16, i_j_fused // 8)
                    vj = T.axis.spatial(8, i_j_fused % 8)
                    B[vi, vj] = A[vi, vj] * 2.0
        """
        rvs, preserve_unit_iters = _flatten_loop_args("fuse", loops, preserve_unit_iters)
        return self._fuse(rvs, preserve_unit_iters)

    fuse.traced = True  # replay calls fuse([loops], preserve), which records the same "fuse"

    @_traced_as("fuse")
    def _fuse(self, loops: list, preserve_unit_iters: bool = True) -> LoopRV:
        prim = "fuse"
        loop_vars = [self._loop(rv, prim)[0].loop_var for rv in loops]
        func, fused = fuse_loops(self.func, loop_vars, preserve_unit_iters)
        self._set_func(func)
        return self._loop_rv(fused)

    def reorder(self, *ordered_loops: LoopRV) -> None:
        """Reorder loops of one chain of perfectly nested loops.

        The given loops need not be consecutive: they must all lie on one chain in which every
        loop between the outermost and the innermost of them is the only statement in its
        parent loop (no blocks, branches or sequences in between). Their positions in the
        chain are filled by them in the order given; loops not named keep their positions.
        Loops keep their kinds, annotations and LoopRVs.

        Parameters
        ----------
        *ordered_loops : LoopRV
            The loops in their new order, outermost first (a single list works too).

        Raises
        ------
        ScheduleError
            Loops of different nests, a block or branch between them, a loop given twice, a
            loop range that would depend on a loop inside it, or a non-affine block binding.

        Examples
        --------
        Before::

            for i, j, k in T.grid(16, 8, 12):
                with T.block("C"):
                    ...

        >>> i, j, k = sch.get_loops(sch.get_block("C"))   # doctest: +SKIP
        >>> sch.reorder(k, i)                                       # doctest: +SKIP

        After::

            for k, j, i in T.grid(12, 8, 16):
                with T.block("C"):
                    ...
        """
        rvs, _ = _flatten_loop_args("reorder", ordered_loops, True)
        self._reorder(rvs)

    reorder.traced = True  # replay calls reorder([loops]), which records the same "reorder"

    @_traced_as("reorder")
    def _reorder(self, ordered_loops: list) -> None:
        prim = "reorder"
        loop_vars = [self._loop(rv, prim)[0].loop_var for rv in ordered_loops]
        self._set_func(reorder_loops(self.func, loop_vars))

    @traced
    def parallel(self, loop: LoopRV) -> None:
        """Run a loop's iterations in parallel on CPU cores.

        The loop must be serial, and every block under it may use the loop only in the bindings
        of *spatial* iter vars, in an affine way (TVM's rule: iterations of spatial iter vars
        are independent; reduction iterations are not).

        Raises
        ------
        ScheduleError
            The loop is bound to a reduction iter var, a binding is not affine, or the loop is
            not serial.

        Examples
        --------
        Before::

            for i, j in T.grid(16, 8):
                with T.block("B"):
                    ...

        >>> i, j = sch.get_loops(sch.get_block("B"))      # doctest: +SKIP
        >>> sch.parallel(i)                                         # doctest: +SKIP

        After::

            for i in T.parallel(16):
                for j in range(8):
                    with T.block("B"):
                        ...
        """
        for_node, _ = self._loop(loop, "parallel")
        self._set_func(set_loop_kind(self.func, for_node.loop_var, "parallel"))

    @traced
    def vectorize(self, loop: LoopRV) -> None:
        """Vectorize a loop (SIMD lanes); the legality rules are those of ``parallel``.

        A symbolic extent is allowed (as in TVM): code generation then falls back to a scalar
        loop, or a vector body with a tail, since the lane count is not known at compile time.

        Examples
        --------
        Before::

            for i, j in T.grid(16, 8):
                with T.block("B"):
                    ...

        >>> i, j = sch.get_loops(sch.get_block("B"))      # doctest: +SKIP
        >>> sch.vectorize(j)                                        # doctest: +SKIP

        After::

            for i in range(16):
                for j in T.vectorized(8):
                    with T.block("B"):
                        ...
        """
        for_node, _ = self._loop(loop, "vectorize")
        self._set_func(set_loop_kind(self.func, for_node.loop_var, "vectorized"))

    @traced
    def unroll(self, loop: LoopRV) -> None:
        """Unroll a loop. Any loop may be unrolled (reduction loops too), except a thread-bound one
        (that would silently drop its binding).

        Examples
        --------
        Before::

            for i, k in T.grid(16, 4):
                with T.block("S"):
                    ...

        >>> i, k = sch.get_loops(sch.get_block("S"))      # doctest: +SKIP
        >>> sch.unroll(k)                                           # doctest: +SKIP

        After::

            for i in range(16):
                for k in T.unroll(4):
                    with T.block("S"):
                        ...
        """
        for_node, _ = self._loop(loop, "unroll")
        self._set_func(set_loop_kind(self.func, for_node.loop_var, "unrolled"))

    @traced
    def bind(self, loop: LoopRV, thread_axis: str) -> None:
        """Bind a loop to a GPU thread axis.

        Parameters
        ----------
        loop : LoopRV
            A serial loop; the rules of ``parallel`` apply. Binding a reduction loop to
            ``threadIdx`` makes a cross-thread reduction (the threads share the reduction;
            ``transform.LowerCrossThreadReduction`` lowers it for GPU targets).
        thread_axis : str
            One of ``blockIdx.x/y/z``, ``threadIdx.x/y/z``, ``vthread`` (``vthread.x/y/z``).
            A nest may bind each thread axis once.

        Examples
        --------
        Before::

            for i, j in T.grid(128, 64):
                with T.block("B"):
                    ...

        >>> i, j = sch.get_loops(sch.get_block("B"))      # doctest: +SKIP
        >>> sch.bind(i, "blockIdx.x")                               # doctest: +SKIP
        >>> sch.bind(j, "threadIdx.x")                              # doctest: +SKIP

        After::

            for i in T.thread_binding(128, thread="blockIdx.x"):
                for j in T.thread_binding(64, thread="threadIdx.x"):
                    with T.block("B"):
                        ...
        """
        prim = "bind"
        for_node, _ = self._loop(loop, prim)
        if not isinstance(thread_axis, str):
            raise ScheduleError(prim, f"loop {for_node.loop_var.name}: thread_axis must be a "
                                f"string such as 'threadIdx.x', got {thread_axis!r}", for_node)
        self._set_func(set_loop_kind(self.func, for_node.loop_var, "thread_binding", thread_axis))

    def _ann_target(self, block_or_loop, prim: str):
        if isinstance(block_or_loop, BlockRV):
            return self._block(block_or_loop, prim)[0].block.name
        if isinstance(block_or_loop, LoopRV):
            return self._loop(block_or_loop, prim)[0].loop_var
        raise ScheduleError(prim, f"expected a block or a loop, got {block_or_loop!r}")

    def _ann_value(self, value, prim: str):
        if isinstance(value, ExprRV):
            return self._int(value, prim)
        if isinstance(value, (list, tuple)):
            return [self._ann_value(v, prim) for v in value]
        return value

    @traced
    def annotate(self, block_or_loop: BlockRV | LoopRV, ann_key: str, ann_val) -> None:
        """Set an annotation of a block or loop (replacing one of the same key).

        Parameters
        ----------
        block_or_loop : BlockRV | LoopRV
        ann_key : str
            E.g. ``"pragma_auto_unroll_max_step"``, ``"meta_schedule.parallel"``.
        ann_val : int, float, str, ExprRV or a list of them
            An ExprRV (a sampled value) is stored as its int.

        Examples
        --------
        >>> b = sch.get_block("B")                                  # doctest: +SKIP
        >>> sch.annotate(b, "meta_schedule.unroll_explicit", 16)    # doctest: +SKIP

        After::

            with T.block("B"):
                ...
                T.block_attr({"meta_schedule.unroll_explicit": 16})
        """
        prim = "annotate"
        target = self._ann_target(block_or_loop, prim)
        value = self._ann_value(ann_val, prim)
        self._set_func(annotate_stmt(self.func, target, ann_key, value))

    @traced
    def unannotate(self, block_or_loop: BlockRV | LoopRV, ann_key: str) -> None:
        """Remove the annotation ``ann_key`` of a block or loop (an error if it has none).

        Examples
        --------
        >>> sch.annotate(i, "pragma_auto_unroll_max_step", 64)     # doctest: +SKIP
        >>> sch.unannotate(i, "pragma_auto_unroll_max_step")        # doctest: +SKIP
        """
        prim = "unannotate"
        target = self._ann_target(block_or_loop, prim)
        self._set_func(annotate_stmt(self.func, target, ann_key, None, remove=True))

    @traced
    def add_unit_loop(self, block_or_loop: BlockRV | LoopRV) -> LoopRV:
        """Wrap a block (not the root) or a loop in a new serial loop ``u`` of extent 1 (useful
        before ``blockize`` / ``tensorize``, which need a loop to work on).

        Examples
        --------
        Before::

            with T.block("root"):
                with T.block("S"):
                    S[()] = A[0]

        >>> u = sch.add_unit_loop(sch.get_block("S"))               # doctest: +SKIP

        After::

            with T.block("root"):
                for u in range(1):
                    with T.block("S"):
                        S[()] = A[0]
        """
        prim = "add_unit_loop"
        target = self._ann_target(block_or_loop, prim)
        func, u = add_unit_loop_above(self.func, target)
        self._set_func(func)
        return self._loop_rv(u)
