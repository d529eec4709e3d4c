"""``AddRFactor``: for a reduction with little spatial parallelism and a long reduction (a sum
of a whole tensor, the rows of a short, wide matrix), also offer ``rfactor`` schedules whose
partial results are independent and can run in parallel.

The reduce loops are fused and split in two (``sample_tile``); each of the two loops gives one
rfactor'ed design space, beside the unchanged one. The partial-result block is then placed by
``RandomComputeLocation``.
"""
from __future__ import annotations

from tilecraft.tensorir.schedule import BlockRV, Schedule, ScheduleError

from . import analysis as A
from .base import ANN_TILED, ScheduleRule


class AddRFactor(ScheduleRule):
    """Branch reductions into rfactor'ed variants (TVM's ``AddRFactor``).

    Parameters
    ----------
    max_jobs_per_core : int
        The reduction is rfactor'ed when its spatial extent is below ``max_jobs_per_core *
        cores`` and its reduce extent at least that.
    max_innermost_factor : int
        Bound of the inner factor of the split reduce loop.

    Examples
    --------
    >>> rule = AddRFactor(16, 64)
    """

    def __init__(self, max_jobs_per_core: int = 16, max_innermost_factor: int = 64):
        self.max_jobs_per_core = int(max_jobs_per_core)
        self.max_innermost_factor = int(max_innermost_factor)

    def __repr__(self):
        return f"AddRFactor({self.max_jobs_per_core}, {self.max_innermost_factor})"

    def apply(self, sch: Schedule, block: BlockRV) -> list[Schedule]:
        info = A.block_info(sch, block)
        b = info.block
        if A.is_root(info) or not A.is_subroot(info) or not A.is_reduction(b):
            return [sch]
        if dict(b.annotations).get(ANN_TILED) is not None or A.has_data_reuse(b):
            return [sch]
        if A.trivial_binding(info) is None or len(info.loops) != len(b.iter_vars):
            return [sch]
        kinds = A.loop_iter_kinds(info)
        if any(k not in ("S", "R") for k in kinds):
            return [sch]
        hints = self.context.shape_hints if self.context else {}
        cores = self.context.num_cores if self.context else 1
        limit = self.max_jobs_per_core * cores
        spatial = reduce_ = 1
        for loop, kind in zip(info.loops, kinds):
            e = A.extent_value(loop, hints)
            e = 1 << 30 if e is None else e
            if kind == "S":
                spatial *= e
            else:
                reduce_ *= e
        if spatial >= limit or reduce_ < limit:
            return [sch]
        # the reduce loops must be innermost and consecutive to be fused
        first_r = kinds.index("R")
        if any(k != "R" for k in kinds[first_r:]):
            return [sch]
        out = [sch]
        for which in (0, 1):
            s = sch.copy()
            try:
                loops = s.get_loops(block)
                r = loops[first_r:]
                fused = s.fuse(*r) if len(r) > 1 else r[0]
                inner = s.sample_tile(fused, 2, self.max_innermost_factor, hints or None)
                split = s.split(fused, [None, *inner])
                s.rfactor(split[which], 0)
            except ScheduleError:
                continue
            out.append(s)
        return out
