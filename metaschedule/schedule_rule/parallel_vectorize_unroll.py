"""``ParallelVectorizeUnroll``: annotate the root block with how far to parallelize, vectorize
and unroll; ``RewriteParallelVectorizeUnroll`` applies it once the loop nests are final.

The unroll depth is sampled (``sample_categorical`` over ``unroll_max_steps``, uniformly, as
TVM does), so ``MutateUnroll`` can change it; the parallel extent is
``max_jobs_per_core * cores`` (``MutateParallel`` changes it).
"""
from __future__ import annotations

from tilecraft.tensorir.schedule import BlockRV, Schedule

from . import analysis as A
from .base import ANN_PARALLEL, ANN_UNROLL, ANN_VECTORIZE, ScheduleRule


class ParallelVectorizeUnroll(ScheduleRule):
    """Annotate the root block (TVM's ``ParallelizeVectorizeUnroll``).

    Parameters
    ----------
    max_jobs_per_core : int
        Parallel loops are fused up to ``max_jobs_per_core * cores`` iterations; <= 0: no
        parallelization (GPU).
    max_vectorize_extent : int
        Longest vectorized loop; <= 0: no vectorization.
    unroll_max_steps : tuple of int
        Candidate unroll depths (0: none).

    Examples
    --------
    >>> rule = ParallelVectorizeUnroll(16, 64, (0, 16, 64, 512))
    """

    def __init__(self, max_jobs_per_core: int = 16, max_vectorize_extent: int = 64,
                 unroll_max_steps=(0, 16, 64, 512)):
        self.max_jobs_per_core = int(max_jobs_per_core)
        self.max_vectorize_extent = int(max_vectorize_extent)
        self.unroll_max_steps = tuple(int(u) for u in unroll_max_steps)
        self.seed_unroll: int | None = None   # a seed variant's fixed decision (an index)

    def __repr__(self):
        return (f"ParallelVectorizeUnroll(max_jobs_per_core={self.max_jobs_per_core}, "
                f"max_vectorize_extent={self.max_vectorize_extent}, unroll_max_steps="
                f"{self.unroll_max_steps})")

    def seed_variants(self) -> list["ParallelVectorizeUnroll"]:
        """The rule with no extra unrolling (the smallest unroll depth): seeds such as the
        micro-kernel recipe unroll their register tile themselves."""
        if not self.unroll_max_steps:
            return []
        v = ParallelVectorizeUnroll(self.max_jobs_per_core, self.max_vectorize_extent,
                                    self.unroll_max_steps)
        v.seed_unroll = self.unroll_max_steps.index(min(self.unroll_max_steps))
        if self.context is not None:
            v.initialize(self.context)
        return [v]

    def apply(self, sch: Schedule, block: BlockRV) -> list[Schedule]:
        info = A.block_info(sch, block)
        if not A.is_root(info):
            return [sch]
        if self.max_jobs_per_core > 0:
            cores = self.context.num_cores if self.context else 1
            sch.annotate(block, ANN_PARALLEL, self.max_jobs_per_core * cores)
        if self.max_vectorize_extent > 0:
            sch.annotate(block, ANN_VECTORIZE, self.max_vectorize_extent)
        if self.unroll_max_steps:
            n = len(self.unroll_max_steps)
            v = sch.sample_categorical(list(self.unroll_max_steps), [1.0 / n] * n,
                                       decision=self.seed_unroll)
            sch.annotate(block, ANN_UNROLL, v)
        return [sch]
