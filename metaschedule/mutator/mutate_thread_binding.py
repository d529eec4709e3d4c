"""``MutateThreadBinding``: draw another thread count for a ``sample_categorical`` whose value
splits a loop that is then bound to ``threadIdx`` (``AutoBind``, ``CrossThreadReduction``)."""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.schedule import Trace

from .base import Mutator, categorical_uses, other_index, split_outputs_bound_to


class MutateThreadBinding(Mutator):
    """Mutate a thread extent (TVM's ``MutateThreadBinding``).

    Examples
    --------
    >>> new = MutateThreadBinding().apply(sch.trace, np.random.default_rng(0))  # doctest: +SKIP
    """

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace | None:
        cands = []
        for i, inst in enumerate(trace.instructions):
            if inst.kind != "sample_categorical" or inst.decision is None:
                continue
            if any(trace.instructions[u].kind == "split" and
                   split_outputs_bound_to(trace, u, "threadIdx")
                   for u in categorical_uses(trace, i)):
                cands.append(i)
        if not cands:
            return None
        i = cands[int(rng.integers(0, len(cands)))]
        inst = trace.instructions[i]
        new = other_index(len(inst.inputs[0]), int(inst.decision), rng)
        return None if new is None else trace.with_decision(i, new)
