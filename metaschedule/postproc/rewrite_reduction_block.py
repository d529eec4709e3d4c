"""``RewriteReductionBlock``: split each reduction's init out of the reduction
(``decompose_reduction`` at its outermost reduce loop), so the init is a loop nest of its own
that can be vectorized, unrolled or tensorized (``fill_zero``) like the update."""
from __future__ import annotations

from tilecraft.tensorir.schedule import Schedule, ScheduleError

from ..schedule_rule import analysis as A
from .base import Postproc


class RewriteReductionBlock(Postproc):
    """Decompose every reduction block with an init at its first reduce loop (TVM's
    ``RewriteReductionBlock``).

    Examples
    --------
    >>> RewriteReductionBlock().apply(sch)              # doctest: +SKIP
    True
    """

    def apply(self, sch: Schedule) -> bool:
        for name in [br.block.name for br in A.all_blocks(sch.func)]:
            info = A.find_block_info(sch.func, name)
            if info.block.init is None or not info.loops:
                continue
            kinds = A.loop_iter_kinds(info)
            # the first loop feeding a reduce iter var; not a loop the block merely repeats
            # under (a compute_at location): the init must run again in every repetition
            first = next((i for i, k in enumerate(kinds) if k in ("R", "SR")), None)
            if first is None:
                continue  # no loop of the reduction (every reduce extent is 1)
            block = sch.get_block(name)
            loops = sch.get_loops(block)
            try:
                sch.decompose_reduction(block, loops[first])
            except ScheduleError:
                return False
        return True
