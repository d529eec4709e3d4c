"""``RewriteUnboundBlock`` (GPU): bind any block still outside a GPU kernel (no thread-bound
loop above it) to ``blockIdx.x`` / ``threadIdx.x``, so nothing runs on the host."""
from __future__ import annotations

from tilecraft.tensorir.schedule import Schedule, ScheduleError

from ..schedule_rule import analysis as A
from ..schedule_rule.auto_bind import bind_block
from .base import Postproc


class RewriteUnboundBlock(Postproc):
    """Bind unbound blocks (TVM's postproc of the same name).

    Parameters
    ----------
    max_threads : int
        Threads per block (capped at the target's limit).

    Examples
    --------
    >>> RewriteUnboundBlock(256).apply(sch)             # doctest: +SKIP
    True
    """

    def __init__(self, max_threads: int = 256):
        self.max_threads = int(max_threads)

    def apply(self, sch: Schedule) -> bool:
        limit = self.context.target.max_threads_per_block if self.context else 256
        extents = [t for t in (32, 64, 128, 256, 512, 1024) if t <= min(limit, self.max_threads)]
        extents = extents or [1]
        for br in list(A.all_blocks(sch.func)):
            name = br.block.name
            try:
                info = A.find_block_info(sch.func, name)
            except KeyError:
                continue
            if not A.is_subroot(info) or A.is_thread_bound(info):
                continue
            try:
                bind_block(sch, sch.get_block(name), extents, self.shape_hints, sample=False)
            except ScheduleError:
                return False
        return True
