"""``MutateTileSize``: move a prime factor of one tile level to another.

For ``sample_perfect_tile`` and ``sample_tile`` decisions (``sample_tile``'s first factor is
the outer level at the representative extent), it picks a level with a factor > 1, divides it
by one of its prime factors and multiplies another level by it -- the product stays the
extent, the innermost bound holds (TVM's ``MutateTileSize``). For the ``sample_categorical``
decisions that size a register tile (their value is a ``split`` factor: ``MR`` / ``NR`` of
``MultiLevelTilingWithIntrin``), and on GPUs those giving a shared tile's cooperative-fetch
vector length or layout, it draws another candidate. A ``sample_tile`` drawn with per-level
bounds (``max_factors``, the GPU tiling) keeps them.
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.schedule import Trace
from tilecraft.tensorir.schedule.sampling import prime_factors

from ..schedule_rule.base import ANN_COOPERATIVE_FETCH, ANN_SHARED_LAYOUT
from .base import Mutator, categorical_uses, other_index


class MutateTileSize(Mutator):
    """Mutate a tiling decision (TVM's ``MutateTileSize``).

    Examples
    --------
    >>> new = MutateTileSize().apply(sch.trace, np.random.default_rng(0))   # doctest: +SKIP
    """

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace | None:
        cands = []
        for i, inst in enumerate(trace.instructions):
            if inst.decision is None:
                continue
            if inst.kind in ("sample_perfect_tile", "sample_tile"):
                if any(int(f) > 1 for f in inst.decision):
                    cands.append(i)
            elif inst.kind == "sample_categorical" and len(inst.inputs[0]) > 1 and any(
                    _sizes_tile(trace.instructions[u]) for u in categorical_uses(trace, i)):
                cands.append(i)
        order = list(rng.permutation(len(cands)))
        for pick in order:
            i = cands[int(pick)]
            inst = trace.instructions[i]
            if inst.kind == "sample_categorical":
                new = other_index(len(inst.inputs[0]), int(inst.decision), rng)
                if new is not None:
                    return trace.with_decision(i, new)
                continue
            max_inner = int(inst.inputs[2])
            caps = inst.inputs[4] if inst.kind == "sample_tile" and len(inst.inputs) > 4 \
                else None
            new = _move_factor([int(f) for f in inst.decision], max_inner, rng, caps)
            if new is not None:
                return trace.with_decision(i, new)
        return None


def _sizes_tile(inst) -> bool:
    """A use that makes a categorical a tiling decision: a ``split`` factor, or (GPU) the
    vector length of a cooperative fetch or the layout of a shared tile."""
    if inst.kind == "split":
        return True
    return inst.kind == "annotate" and len(inst.inputs) > 1 and \
        inst.inputs[1] in (ANN_COOPERATIVE_FETCH, ANN_SHARED_LAYOUT)


def _move_factor(factors: list[int], max_inner: int, rng: np.random.Generator,
                 caps=None, attempts: int = 16) -> list[int] | None:
    n = len(factors)
    if n < 2:
        return None
    for _ in range(attempts):
        src = [k for k in range(n) if factors[k] > 1]
        if not src:
            return None
        x = src[int(rng.integers(0, len(src)))]
        y = int(rng.integers(0, n - 1))
        y = y if y < x else y + 1
        primes = prime_factors(factors[x])
        p = primes[int(rng.integers(0, len(primes)))]
        new = list(factors)
        new[x] //= p
        new[y] *= p
        if caps is not None and caps[y] is not None and y > 0 and new[y] > int(caps[y]):
            continue          # the level that grows would pass its bound (GPU threads, registers)
        if new[-1] <= max_inner and new != factors:
            return new
    return None
