"""``RewriteParallelVectorizeUnroll``: turn the root block's ``meta_schedule.parallel`` /
``vectorize`` / ``unroll_explicit`` annotations (left by the ``ParallelVectorizeUnroll`` rule)
into loop kinds, now that the loop nests are final.

* **parallel** (CPU): in each top-level loop nest, the outermost perfectly nested loops that
  only feed spatial iter vars are fused until their extent reaches the annotated value
  (``max_jobs_per_core * cores``; ``MutateParallel`` changes it), and the fused loop runs on the
  thread pool.
* **vectorize** (CPU): each block's innermost non-unit loop, when it feeds only spatial iter
  vars, has a constant extent and holds nothing but this block, is vectorized -- split first
  when it is longer than the annotated limit.
* **unroll**: serial loops of constant extent whose body executes at most the annotated number
  of steps (a block is one step, a vectorized loop one step per iteration of its body) are
  unrolled, with everything inside (TVM's ``pragma_auto_unroll_max_step`` with
  ``unroll_explicit``, done here because lowering has no auto-unroll pass).

Symbolic extents count at their representative value (``shape_hints``); a loop whose extent
stays symbolic counts as large: it is parallelized, never vectorized or unrolled.
"""
from __future__ import annotations

from tilecraft.tensorir.schedule import Schedule, ScheduleError, tree
from tilecraft.tensorir.stmt import BlockRealize, For, SeqStmt

from ..schedule_rule import analysis as A
from ..schedule_rule.base import ANN_PARALLEL, ANN_UNROLL, ANN_VECTORIZE
from .base import Postproc

LARGE = 1 << 40


class RewriteParallelVectorizeUnroll(Postproc):
    """Apply the root block's parallel / vectorize / unroll annotations (TVM's postproc of
    the same name).

    Examples
    --------
    >>> RewriteParallelVectorizeUnroll().apply(sch)     # doctest: +SKIP
    True
    """

    def apply(self, sch: Schedule) -> bool:
        root = sch.func.body
        if not isinstance(root, BlockRealize):
            return True
        ann = dict(root.block.annotations)
        par, vec, unroll = ann.get(ANN_PARALLEL), ann.get(ANN_VECTORIZE), ann.get(ANN_UNROLL)
        try:
            if par:
                for nest in _top_level_loops(sch):
                    self._parallelize(sch, nest, int(par))
            if vec:
                for br in list(A.all_blocks(sch.func)):
                    self._vectorize(sch, br.block.name, int(vec))
            if unroll:
                for nest in _top_level_loops(sch):
                    self._unroll(sch, nest, int(unroll))
        except ScheduleError:
            return False
        return True

    # -- parallel -----------------------------------------------------------------------------
    def _parallelize(self, sch: Schedule, var, limit: int) -> None:
        loop, _ = tree.find_loop(sch.func, var)
        chain = []
        node = loop
        while isinstance(node, For):
            if node.kind != "serial" or node.annotations or not _feeds_spatial_only(node):
                break
            chain.append(node)
            node = node.body
        if not chain:
            return
        hints = self.shape_hints
        prod, take = 1, 0
        for f in chain:
            if prod >= limit:
                break
            e = A.extent_value(f, hints)
            prod *= LARGE if e is None else e
            take += 1
        if prod <= 1:
            return
        rvs = _loop_rvs(sch, chain[:take])
        fused = sch.fuse(*rvs) if len(rvs) > 1 else rvs[0]
        sch.parallel(fused)

    # -- vectorize ----------------------------------------------------------------------------
    def _vectorize(self, sch: Schedule, name: str, limit: int) -> None:
        info = A.find_block_info(sch.func, name)
        loops = info.loops
        if not loops:
            return
        p = len(loops) - 1
        while p >= 0 and A.const_extent(loops[p]) == 1:
            p -= 1
        if p < 0:
            return
        loop = loops[p]
        ext = A.const_extent(loop)
        if loop.kind != "serial" or loop.annotations or ext is None:
            return
        inner = tree.child_block_realizes(loop)
        if len(inner) != 1 or inner[0] is not info.realize:
            return
        if not _feeds_spatial_only(loop, [info.realize]):
            return
        block = sch.get_block(name)
        rv = sch.get_loops(block)[p]
        if ext > limit:
            width = _split_width(ext, limit)
            _, rv = sch.split(rv, [None, width])
        sch.vectorize(rv)

    # -- unroll -------------------------------------------------------------------------------
    def _unroll(self, sch: Schedule, var, limit: int) -> None:
        loop, _ = tree.find_loop(sch.func, var)
        todo: list[For] = []
        _collect_unroll(loop, limit, todo)
        # one get_loops per block below the loops (unroll keeps the loops, so the RVs stay)
        by_block: dict[str, list] = {}
        rvs = {}
        for f in todo:
            name = tree.child_block_realizes(f)[0].block.name
            if name not in by_block:
                by_block[name] = sch.get_loops(sch.get_block(name))
            for rv in by_block[name]:
                rvs.setdefault(id(sch.get(rv).loop_var), rv)
        for f in todo:
            sch.unroll(rvs[id(f.loop_var)])


def _split_width(extent: int, limit: int) -> int:
    """The vector width for a loop longer than ``limit``: the largest power of two <= limit
    dividing it, or ``limit`` (the tail is masked)."""
    w = 1
    while w * 2 <= limit:
        w *= 2
    d = w
    while d > 1 and extent % d:
        d //= 2
    return d if d >= 4 else w


def _top_level_loops(sch: Schedule) -> list:
    """Loop vars of the outermost loops of the root block's body."""
    body = sch.func.body.block.body
    items = list(body.seq) if isinstance(body, SeqStmt) else [body]
    out = []
    for s in items:
        while not isinstance(s, For) and s is not None:
            kids = tree.stmt_children(s)
            s = kids[0] if len(kids) == 1 and not isinstance(s, BlockRealize) else None
        if isinstance(s, For):
            out.append(s.loop_var)
    return out


def _feeds_spatial_only(loop: For, blocks=None) -> bool:
    """Every block in the loop's scope uses the loop variable only in spatial bindings."""
    blocks = tree.child_block_realizes(loop) if blocks is None else blocks
    for br in blocks:
        for iv, value in zip(br.block.iter_vars, br.iter_values):
            if iv.kind != "spatial" and A.uses_var(value, loop.loop_var):
                return False
    return bool(blocks)


def _loop_rvs(sch: Schedule, loops: list[For]):
    """LoopRVs for For nodes (through ``get_loops`` of a block below them)."""
    blocks = tree.child_block_realizes(loops[-1])
    if not blocks:
        raise ScheduleError("RewriteParallelVectorizeUnroll", "a loop holds no block")
    rvs = sch.get_loops(sch.get_block(blocks[0].block.name))
    by_var = {id(sch.get(rv).loop_var): rv for rv in rvs}
    return [by_var[id(f.loop_var)] for f in loops]


def _steps(s) -> int:
    """How many block executions (vector steps) a statement runs; LARGE for symbolic loops."""
    if isinstance(s, BlockRealize):
        return 1
    if isinstance(s, For):
        body = _steps(s.body)
        if s.kind == "vectorized":
            return body
        e = A.const_extent(s)
        return LARGE if e is None else min(LARGE, e * body)
    return min(LARGE, sum(_steps(c) for c in tree.stmt_children(s)))


def _collect_unroll(s, limit: int, out: list) -> None:
    if isinstance(s, BlockRealize):
        return
    if isinstance(s, For) and s.kind == "serial" and not s.annotations and \
            A.const_extent(s) is not None and A.const_extent(s) > 1 and _steps(s) <= limit:
        out.append(s)
    for c in tree.stmt_children(s):
        _collect_unroll(c, limit, out)
