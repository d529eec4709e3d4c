"""``Mutator``: change one decision of a trace to explore the neighbourhood of a schedule.

A mutator gets a trace cut at its postprocessing (``trace.without_postproc()``) and returns a
new trace -- the same instructions with one sampling decision (or one annotation value)
changed -- or None when it finds nothing to change. The space generator replays the result and
runs the postprocessors again, so a mutated trace is checked like a sampled one.
"""
from __future__ import annotations

import copy

import numpy as np

from tilecraft.tensorir.schedule import Trace

from ..schedule_rule.base import SpaceContext


class Mutator:
    """A mutator: ``apply(trace, rng) -> Trace | None``.

    Examples
    --------
    >>> class Identity(Mutator):
    ...     def apply(self, trace, rng):
    ...         return None
    """

    context: SpaceContext | None = None

    def __getstate__(self):
        # the context holds the task's function (IR does not pickle); initialize() sets it again
        state = dict(self.__dict__)
        state.pop("context", None)
        return state

    def initialize(self, context: SpaceContext) -> None:
        self.context = context

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace | None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # mutators are dict keys (mutator_probs): identity semantics, one object per entry
    __hash__ = object.__hash__


def rv_uses(trace: Trace) -> dict[str, list[int]]:
    """RV name -> indices of the instructions that take it as an input."""
    out: dict[str, list[int]] = {}

    def names(x):
        if isinstance(x, str) and x.startswith("$"):
            yield x[1:]
        elif isinstance(x, list):
            for y in x:
                yield from names(y)
        elif isinstance(x, dict):
            for y in x.values():
                yield from names(y)

    for i, inst in enumerate(trace.instructions):
        for x in inst.inputs:
            for n in names(x):
                out.setdefault(n, []).append(i)
    return out


def producer(trace: Trace) -> dict[str, int]:
    """RV name -> index of the instruction that made it."""
    return {name: i for i, inst in enumerate(trace.instructions) for name in inst.outputs}


def split_outputs_bound_to(trace: Trace, split_index: int, prefix: str) -> bool:
    """Some loop made by the split at ``split_index`` is bound (``bind``) to a thread axis
    starting with ``prefix``, directly or after a ``fuse``."""
    uses = rv_uses(trace)
    frontier = list(trace.instructions[split_index].outputs)
    seen = set()
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        for u in uses.get(name, []):
            inst = trace.instructions[u]
            if inst.kind == "bind" and len(inst.inputs) > 1 and str(inst.inputs[1]).startswith(
                    prefix):
                return True
            if inst.kind == "fuse":
                frontier.extend(inst.outputs)
    return False


def with_input(trace: Trace, index: int, position: int, value) -> Trace:
    """A copy with input ``position`` of instruction ``index`` replaced."""
    t = Trace(copy.deepcopy(trace.instructions))
    t.instructions[index].inputs[position] = copy.deepcopy(value)
    return t


def categorical_uses(trace: Trace, index: int) -> list[int]:
    """Indices of the instructions using the output of the sample_categorical at ``index``."""
    inst = trace.instructions[index]
    uses = rv_uses(trace)
    return sorted({u for o in inst.outputs for u in uses.get(o, [])})


def other_index(n: int, current: int, rng: np.random.Generator) -> int | None:
    """A uniformly drawn index in ``range(n)`` other than ``current``; None if there is none."""
    choices = [i for i in range(n) if i != current]
    if not choices:
        return None
    return int(choices[int(rng.integers(0, len(choices)))])
