"""``MutateParallel``: change how far ``RewriteParallelVectorizeUnroll`` fuses outer loops
for the thread pool -- the ``meta_schedule.parallel`` value of the root block's annotation --
to another multiple of the core count."""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.schedule import Trace

from ..schedule_rule.base import ANN_PARALLEL
from .base import Mutator, with_input


class MutateParallel(Mutator):
    """Mutate the parallel extent (TVM's ``MutateParallel``).

    Parameters
    ----------
    max_jobs_per_core : int
        The largest extent offered is ``max_jobs_per_core * 4 * cores``.

    Examples
    --------
    >>> new = MutateParallel(16).apply(sch.trace, np.random.default_rng(0))   # doctest: +SKIP
    """

    def __init__(self, max_jobs_per_core: int = 16):
        self.max_jobs_per_core = int(max_jobs_per_core)

    def __repr__(self):
        return f"MutateParallel(max_jobs_per_core={self.max_jobs_per_core})"

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace | None:
        cands = [i for i, inst in enumerate(trace.instructions)
                 if inst.kind == "annotate" and len(inst.inputs) > 2 and
                 inst.inputs[1] == ANN_PARALLEL and isinstance(inst.inputs[2], int)]
        if not cands:
            return None
        i = cands[int(rng.integers(0, len(cands)))]
        current = int(trace.instructions[i].inputs[2])
        cores = self.context.num_cores if self.context else 1
        values, v = [], 1
        while v <= self.max_jobs_per_core * 4:
            values.append(v * cores)
            v *= 2
        values = [x for x in values if x != current]
        if not values:
            return None
        return with_input(trace, i, 2, int(values[int(rng.integers(0, len(values)))]))
