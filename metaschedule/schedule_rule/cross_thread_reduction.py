"""``CrossThreadReduction`` (GPU): reduce one output over many threads of a thread block.

A row reduction (softmax's max and sum, a norm's mean) has few outputs and a long reduction:
one thread per output leaves the GPU idle. The rule splits the (fused) reduce loops by a
sampled thread count ``T`` and ``rfactor``s the inner part: ``T`` threads each reduce a strided
share into a ``shared`` buffer of partial results, then the block's final stage combines the
``T`` partials. The outputs are spread over ``blockIdx.x``.

This compiler's ``bind`` refuses a reduce loop bound to ``threadIdx`` (lowering has no
cross-thread all-reduce), so the partial results go through shared memory explicitly; the final
combination runs in the thread block without a thread loop: every thread sums the shared
partials (after the barrier the GPU lowering puts between the stages) into its own ``local``
accumulator and stores it, so all threads store the same value and none reads a global
location another is updating.
The unchanged schedule stays in the space too (``AutoBind`` then gives each output a thread).
"""
from __future__ import annotations

from tilecraft.tensorir.schedule import BlockRV, Schedule, ScheduleError

from . import analysis as A
from .base import ANN_TILED, ScheduleRule


class CrossThreadReduction(ScheduleRule):
    """Branch GPU reductions into a thread-block reduction (TVM's ``CrossThreadReduction``).

    Parameters
    ----------
    thread_extents : tuple of int
        Thread counts to sample from (those above the target's threads per block are dropped).

    Examples
    --------
    >>> rule = CrossThreadReduction((32, 64, 128, 256))
    """

    def __init__(self, thread_extents=(4, 8, 16, 32, 64, 128, 256, 512)):
        self.thread_extents = tuple(int(t) for t in thread_extents)

    def __repr__(self):
        return f"CrossThreadReduction(thread_extents={self.thread_extents})"

    def apply(self, sch: Schedule, block: BlockRV) -> list[Schedule]:
        info = A.block_info(sch, block)
        b = info.block
        if A.is_root(info) or not A.is_subroot(info) or A.is_thread_bound(info):
            return [sch]
        if not A.is_reduction(b) or dict(b.annotations).get(ANN_TILED) is not None:
            return [sch]
        if A.trivial_binding(info) is None or len(info.loops) != len(b.iter_vars):
            return [sch]
        kinds = A.loop_iter_kinds(info)
        if "R" not in kinds or any(k not in ("S", "R") for k in kinds):
            return [sch]
        first_r = kinds.index("R")
        if any(k != "R" for k in kinds[first_r:]):
            return [sch]
        hints = self.context.shape_hints if self.context else {}
        reduce_ext = 1
        for loop in info.loops[first_r:]:
            e = A.extent_value(loop, hints)
            reduce_ext *= (1 << 30) if e is None else e
        max_threads = self.context.target.max_threads_per_block if self.context else 256
        extents = [t for t in self.thread_extents if t <= max_threads and t <= reduce_ext]
        if not extents or reduce_ext < 16:
            return [sch]
        s = sch.copy()
        try:
            self._rewrite(s, block, first_r, extents)
        except ScheduleError:
            return [sch]
        return [sch, s]

    def _rewrite(self, sch: Schedule, block: BlockRV, first_r: int, extents: list[int]) -> None:
        loops = sch.get_loops(block)
        r = loops[first_r:]
        fused = sch.fuse(*r) if len(r) > 1 else r[0]
        t = sch.sample_categorical(extents, [1.0 / len(extents)] * len(extents))
        _, inner = sch.split(fused, [None, t])
        rf = sch.rfactor(inner, 0)
        sch.set_scope(rf, 0, "shared")
        # every thread of the block combines the partials into its own (local) accumulator and
        # writes the same value: no thread updates global memory another one is updating
        write_back = sch.cache_write(block, 0, "local")
        # the outputs over thread blocks
        spatial = sch.get_loops(block)[:first_r]
        if spatial:
            bx = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        else:
            bx = sch.add_unit_loop(block)
        sch.bind(bx, "blockIdx.x")
        sch.compute_at(rf, bx, preserve_unit_loops=True)
        sch.reverse_compute_at(write_back, bx, preserve_unit_loops=True)
        info = A.block_info(sch, rf)
        own = [n for n, l in enumerate(info.loops) if l.kind == "serial"]
        kinds = A.loop_iter_kinds(info)
        tx = next(n for n in own if kinds[n] == "S")
        sch.bind(sch.get_loops(rf)[tx], "threadIdx.x")
