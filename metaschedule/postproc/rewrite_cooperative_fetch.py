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
not hit one bank), ``permuted`` (``X_shared[r, c % w, c // w]`` with ``w`` the consumer's
columns per thread, read off its final binding: thread ``t`` reads columns ``t * w + x``, which
land ``x * T + t``, consecutive across the threads; a tile whose consumer does not stride its
threads so keeps its layout).

The serial loop the caches are computed under (the k-tile loop) is annotated
``register_prefetch`` (``tensorir.transform.register_prefetch``: the next tiles are loaded into
registers during the current step).
"""
from __future__ import annotations

from tilecraft.tensorir.expr import Add, BufferLoad, FloorMod, IntImm, Mul, Var
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.schedule import Schedule, ScheduleError, tree
from tilecraft.tensorir.stmt import For
from tilecraft.tensorir.transform.register_prefetch import ANN_REGISTER_PREFETCH

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
        _annotate_prefetch(sch, ancestors)
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


def _annotate_prefetch(sch: Schedule, ancestors: tuple) -> None:
    """Mark the serial loop the shared cache is computed under (the k-tile loop ``R0``) for
    ``tensorir.transform.register_prefetch``: its next tiles are then loaded into registers
    while the current ones are used (a loop whose body does not fit that form is left as it
    is by the pass)."""
    at = next((a for a in reversed(ancestors) if isinstance(a, For) and a.kind == "serial"),
              None)
    if at is None or dict(at.annotations).get(ANN_REGISTER_PREFETCH):
        return
    for block in tree.child_block_realizes(at):
        rv = next((r for r in sch.get_loops(sch.get_block(block.block.name))
                   if sch.get(r).loop_var is at.loop_var), None)
        if rv is not None:
            sch.annotate(rv, ANN_REGISTER_PREFETCH, 1)
            return


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
        if layout == "permuted":
            w = _thread_width(sch, block, node.writes[0].buffer)
            if w is not None:
                sch.transform_layout(block, 0, lambda r, c: (r, c % w, c // w), "write")


def _thread_width(sch: Schedule, block, buf) -> int | None:
    """``w`` where the consumer reads ``buf[..., e]`` with ``e`` bound to ``threadIdx.x * w +
    ...`` (or ``(threadIdx.x % T) * w + ...``), ``w > 1`` dividing the tile's columns; else
    None."""
    cons = sch.get_consumers(block)
    if len(cons) != 1:
        return None
    info = A.find_block_info(sch.func, sch.get(cons[0]).name)
    loads = []

    def visit(e):
        if isinstance(e, BufferLoad) and e.buffer is buf:
            loads.append(e)
    post_order_visit(info.block.body, visit)
    if not loads or not isinstance(loads[0].indices[-1], Var):
        return None
    binding = dict(zip((iv.var for iv in info.block.iter_vars), info.realize.iter_values))
    value = next((v for k, v in binding.items() if k is loads[0].indices[-1]), None)
    tx = next((f.loop_var for f in info.loops if f.kind == "thread_binding" and
               f.thread_tag == "threadIdx.x"), None)
    if value is None or tx is None:
        return None
    w = _stride_of(value, tx)
    if w is None or w <= 1:
        return None
    extent = A.const_extent(next(f for f in info.loops if f.loop_var is tx))
    return w if extent else None


def _stride_of(e, tx) -> int | None:
    """The constant multiplying the term of ``e`` (a sum) that uses ``tx``."""
    if isinstance(e, Add):
        return _stride_of(e.a, tx) or _stride_of(e.b, tx)
    uses = A.uses_var(e, tx)
    if not uses:
        return None
    if isinstance(e, Mul):
        for x, c in ((e.a, e.b), (e.b, e.a)):
            if isinstance(c, IntImm) and A.uses_var(x, tx) and \
                    isinstance(x, (Var, FloorMod)):
                return int(c.value)
        return None
    return 1 if isinstance(e, (Var, FloorMod)) else None


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
