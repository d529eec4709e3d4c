"""``RewriteCooperativeFetch`` (GPU): spread the copy into a shared-memory cache over the
thread block.

``MultiLevelTiling`` fuses the loops of each shared cache block and annotates the fused loop
with ``meta_schedule.cooperative_fetch = v`` (a sampled vector length). Once the thread count
is final, that loop is split into ``[rest, threads, v]``: the middle bound to ``threadIdx.x``
(the same extent as the compute's threads), the inner ``v`` lanes vectorized.

A cache block annotated ``meta_schedule.shared_layout`` (an index into ``SHARED_LAYOUTS``)
first gets that layout: ``transposed`` (``transform_layout``: ``X_shared[c, r]``, so the
register rows of ``A`` a thread reads at one ``k`` are consecutive words, vector loads),
``*_padded`` (``storage_align``: rows padded by 4 words, so a column-wise walk of the tile does
not hit one bank).
"""
from __future__ import annotations

from tensorir.schedule import Schedule, ScheduleError, tree
from tensorir.stmt import For

from ..schedule_rule import analysis as A
from ..schedule_rule.base import ANN_COOPERATIVE_FETCH, ANN_SHARED_LAYOUT, SHARED_LAYOUTS
from .base import Postproc


class RewriteCooperativeFetch(Postproc):
    """Bind cooperative-fetch loops to the thread block (TVM's postproc of the same name).

    Examples
    --------
    >>> RewriteCooperativeFetch().apply(sch)            # doctest: +SKIP
    True
    """

    def apply(self, sch: Schedule) -> bool:
        try:
            _apply_layouts(sch)
        except ScheduleError:
            return False
        while True:
            hit = _next_annotated(sch)
            if hit is None:
                return True
            loop, ancestors = hit
            try:
                self._rewrite(sch, loop, ancestors)
            except ScheduleError:
                return False

    def _rewrite(self, sch: Schedule, loop: For, ancestors: tuple) -> None:
        v = int(dict(loop.annotations)[ANN_COOPERATIVE_FETCH])
        threads = _kernel_threads(ancestors)
        blocks = tree.child_block_realizes(loop)
        block = sch.get_block(blocks[0].block.name)
        rvs = sch.get_loops(block)
        rv = next(r for r in rvs if sch.get(r).loop_var is loop.loop_var)
        sch.unannotate(rv, ANN_COOPERATIVE_FETCH)
        if threads is None:
            return
        if v > 1:
            _, tx, vec = sch.split(rv, [None, threads, v])
            sch.bind(tx, "threadIdx.x")
            sch.vectorize(vec)
        else:
            _, tx = sch.split(rv, [None, threads])
            sch.bind(tx, "threadIdx.x")


PAD_FACTOR, PAD_OFFSET = 32, 4


def _apply_layouts(sch: Schedule) -> None:
    """Give each annotated shared cache its sampled layout (and drop the annotation)."""
    names = [br.block.name for br in A.all_blocks(sch.func)
             if ANN_SHARED_LAYOUT in dict(br.block.annotations)]
    for name in names:
        block = sch.get_block(name)
        node = sch.get(block)
        layout = SHARED_LAYOUTS[int(dict(node.annotations)[ANN_SHARED_LAYOUT])]
        sch.unannotate(block, ANN_SHARED_LAYOUT)
        if len(node.writes) != 1 or len(node.writes[0].buffer.shape) != 2:
            continue
        if layout.startswith("transposed"):
            sch.transform_layout(block, 0, lambda r, c: (c, r), "write")
        if layout.endswith("_padded"):
            sch.storage_align(block, 0, 0, PAD_FACTOR, PAD_OFFSET)


def _next_annotated(sch: Schedule):
    for node, anc in tree.walk(sch.func.body):
        if isinstance(node, For) and ANN_COOPERATIVE_FETCH in dict(node.annotations):
            return node, anc
    return None


def _kernel_threads(ancestors: tuple) -> int | None:
    """The threadIdx.x extent used by the compute of the kernel around ``ancestors``."""
    kernel = next((a for a in ancestors if isinstance(a, For) and a.kind == "thread_binding"
                   and a.thread_tag.startswith("blockIdx")), None)
    if kernel is None:
        return None
    for node, _ in tree.walk(kernel):
        if isinstance(node, For) and node.kind == "thread_binding" and \
                node.thread_tag == "threadIdx.x":
            return A.const_extent(node)
    return None
