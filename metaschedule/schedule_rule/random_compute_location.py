"""``RandomComputeLocation``: compute a block that no other rule placed (padding, a kept
``exp``, a small reduction) at a random legal loop of its consumers, at the root, or inlined:
``loop = sch.sample_compute_location(block); sch.compute_at(block, loop)``, which
``MutateComputeLocation`` moves later."""
from __future__ import annotations

from tilecraft.tensorir.schedule import BlockRV, Schedule, ScheduleError

from . import analysis as A
from .base import ANN_TILED, ScheduleRule


class RandomComputeLocation(ScheduleRule):
    """Sample where to compute each sub-root, non-output block (TVM's rule of the same name).

    Examples
    --------
    >>> rule = RandomComputeLocation()
    """

    def apply(self, sch: Schedule, block: BlockRV) -> list[Schedule]:
        info = A.block_info(sch, block)
        if A.is_root(info) or not A.is_subroot(info) or A.is_thread_bound(info):
            return [sch]
        if dict(info.block.annotations).get(ANN_TILED) is not None:
            return [sch]
        if A.is_output_block(sch.func, info.block) or not A.consumers_of(sch, info):
            return [sch]
        n = len(sch.trace.instructions)
        try:
            loop = sch.sample_compute_location(block)
            sch.compute_at(block, loop, preserve_unit_loops=True)
        except ScheduleError:
            del sch.trace.instructions[n:]
        return [sch]
