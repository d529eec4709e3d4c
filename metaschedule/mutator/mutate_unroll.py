"""``MutateUnroll``: draw another unroll depth for a ``sample_categorical`` whose value is an
unroll annotation (``meta_schedule.unroll_explicit``, ``pragma_auto_unroll_max_step``)."""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.schedule import Trace

from ..schedule_rule.base import ANN_UNROLL
from .base import Mutator, categorical_uses, other_index

UNROLL_KEYS = (ANN_UNROLL, "meta_schedule.unroll_implicit", "pragma_auto_unroll_max_step")


class MutateUnroll(Mutator):
    """Mutate the unroll depth (TVM's ``MutateUnroll``).

    Examples
    --------
    >>> new = MutateUnroll().apply(sch.trace, np.random.default_rng(0))   # doctest: +SKIP
    """

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace | None:
        cands = []
        for i, inst in enumerate(trace.instructions):
            if inst.kind != "sample_categorical" or inst.decision is None:
                continue
            for u in categorical_uses(trace, i):
                use = trace.instructions[u]
                if use.kind == "annotate" and len(use.inputs) > 1 and use.inputs[1] in UNROLL_KEYS:
                    cands.append(i)
                    break
        if not cands:
            return None
        i = cands[int(rng.integers(0, len(cands)))]
        inst = trace.instructions[i]
        new = other_index(len(inst.inputs[0]), int(inst.decision), rng)
        return None if new is None else trace.with_decision(i, new)
