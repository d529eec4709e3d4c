"""``MutateComputeLocation``: move a block placed by ``sample_compute_location`` to another of
its legal locations (a loop of its consumers, the root, or inlined).

The legal locations depend on the program at that point of the trace, so the trace is
replayed up to the sampling instruction on the task's function to list them.
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.schedule import Schedule, ScheduleError, Trace
from tilecraft.tensorir.schedule.primitives_compute import compute_location_candidates

from .base import Mutator, producer


class MutateComputeLocation(Mutator):
    """Mutate a compute location (TVM's ``MutateComputeLocation``).

    Examples
    --------
    >>> new = MutateComputeLocation().apply(sch.trace, np.random.default_rng(0))  # doctest: +SKIP
    """

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace | None:
        func = self.context.func if self.context else None
        if func is None:
            return None
        made = producer(trace)
        cands = []
        for i, inst in enumerate(trace.instructions):
            if inst.kind != "sample_compute_location" or inst.decision is None:
                continue
            name = _block_name(trace, made, inst.inputs[0])
            if name is not None:
                cands.append((i, name))
        for pick in rng.permutation(len(cands)):
            i, name = cands[int(pick)]
            try:
                sch = Schedule(func)
                sch.replay(Trace(trace.instructions[:i]))
                options = [d for d, _ in compute_location_candidates(sch.func, name)]
            except (ScheduleError, ValueError, KeyError):
                continue
            current = int(trace.instructions[i].decision)
            options = [d for d in options if d != current]
            if options:
                return trace.with_decision(i, int(options[int(rng.integers(0, len(options)))]))
        return None


def _block_name(trace: Trace, made: dict, ref) -> str | None:
    """The name of the block an RV reference stands for, when a ``get_block`` made it."""
    if not isinstance(ref, str) or not ref.startswith("$"):
        return None
    idx = made.get(ref[1:])
    if idx is None:
        return None
    inst = trace.instructions[idx]
    if inst.kind == "get_block" and inst.inputs and isinstance(inst.inputs[0], str):
        return inst.inputs[0]
    return None
