"""``KnobSpace``: a design space whose points are a schedule recipe's decisions (knobs).

Some schedules are recipes with a few discrete decisions that steer more than loop extents:
the GPU GEMM rule's register fragments on or off, its fetch vector width, its register
prefetch, its tile threads and registers, its k-step. Their traces cannot be mutated like
``MultiLevelTiling``'s (changing one ``sample_tile`` there only changes the splits that read
it; turning the fragments off removes whole stages). A ``KnobRule`` names the knobs of a
function (each a ``Knob``: integer candidates and the recipe's default) and applies the recipe
at chosen values; ``KnobSpace`` makes every point's trace

    one ``sample_categorical`` per knob (its decision: the index of the chosen value),
    the recipe's primitives at those values,
    ``enter_postproc`` and the postprocessors (``VerifyGPUCode`` on a GPU by default)

and re-applies the recipe whenever a decision changes (``sample`` draws every knob again,
``mutate`` moves one knob to another candidate, ``finish`` replays a stored trace's knob
decisions), so a trace always says what its program is. The database replays a record's
trace as it is (``Trace.apply``: no rule needed); the cost model sees the program. Functions
the rule does not apply to get the ``fallback`` space (by default ``default_space``).

The seed (``seeds``, measured first) is the point at the knobs' defaults: the recipe as the
compiler applies it without tuning.

A combination the target cannot run (threads per block over the limit, shared memory over
the target's) is rejected before any build, with the reason in ``last_rejection``: by the
rule's ``check``, by the recipe raising ``ScheduleError`` / ``ValueError``, or by a
postprocessor.

Examples
--------
>>> from tilecraft.metaschedule.knob_space import Knob
>>> Knob("k_step", (4, 8, 16, 32), 16).index(16)
2
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tilecraft.tensorir.expr import TIRError
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.schedule import Schedule, ScheduleError, Trace
from tilecraft.tensorir.structural import structural_hash

from .errors import TuneError
from .postproc import Postproc, VerifyGPUCode
from .schedule_rule.base import GPU_KINDS, SpaceContext
from .space_generator import (DEFAULT_SHAPE_HINT, SpaceGenerator, _func, _target,
                              default_space, first_rejection, resolve_shape_hints, shape_vars)

__all__ = ["Knob", "KnobRule", "KnobSpace", "knob_values"]


@dataclass(frozen=True)
class Knob:
    """One decision of a schedule recipe: ``candidates`` (ints) and the recipe's ``default``
    (one of them).

    Examples
    --------
    >>> Knob("fragments", (0, 1), 1).candidates
    (0, 1)
    """

    name: str
    candidates: tuple
    default: int

    def __post_init__(self):
        cands = tuple(int(c) for c in self.candidates)
        if not cands or len(set(cands)) != len(cands):
            raise TuneError(f"knob {self.name!r}: candidates must be distinct ints, got "
                            f"{self.candidates!r}")
        object.__setattr__(self, "candidates", cands)
        if int(self.default) not in cands:
            raise TuneError(f"knob {self.name!r}: the default {self.default!r} is not one of "
                            f"its candidates {cands}")

    def index(self, value: int) -> int:
        return self.candidates.index(int(value))


class KnobRule:
    """A schedule recipe with knobs (subclass it).

    ``knobs(func, target, hints)``: the knobs of ``func`` (None: the recipe does not apply);
    ``check(func, target, values)``: why ``values`` cannot run on ``target`` (None: they can),
    asked before the recipe is applied; ``apply(sch, target, values)``: the recipe on ``sch``
    (a fresh ``Schedule`` of the function) at ``values`` (knob name -> int), raising
    ``ScheduleError`` / ``ValueError`` where it does not apply at them.

    Examples
    --------
    >>> class Unroll(KnobRule):
    ...     def knobs(self, func, target, hints):
    ...         return [Knob("unroll", (1, 4), 1)]
    ...     def apply(self, sch, target, values):
    ...         pass
    """

    def knobs(self, func: PrimFunc, target, hints: dict) -> list[Knob] | None:
        raise NotImplementedError

    def check(self, func: PrimFunc, target, values: dict) -> str | None:
        return None

    def apply(self, sch: Schedule, target, values: dict) -> None:
        raise NotImplementedError


def knob_values(trace: Trace, knobs: Sequence[Knob]) -> dict | None:
    """The knob values a ``KnobSpace`` trace was made at (its first ``len(knobs)``
    instructions), or None when ``trace`` is not a trace of these knobs.

    Examples
    --------
    >>> knob_values(record.trace, space.knobs_of(func, "opencl"))     # doctest: +SKIP
    {'rows_threads': 16, 'rows_regs': 8, ...}
    """
    insts = trace.instructions
    if len(insts) < len(knobs):
        return None
    out = {}
    for inst, knob in zip(insts, knobs):
        if inst.kind != "sample_categorical" or not inst.inputs or \
                [int(c) for c in inst.inputs[0]] != list(knob.candidates) or \
                inst.decision is None:
            return None
        out[knob.name] = knob.candidates[int(inst.decision)]
    return out


class KnobSpace(SpaceGenerator):
    """The design space of a ``KnobRule`` (see the module docstring); other functions get
    ``fallback``'s.

    Parameters
    ----------
    rule : KnobRule
    fallback : SpaceGenerator, optional
        For functions ``rule`` has no knobs for (default: ``default_space`` of the target).
    postprocs : list of Postproc, optional
        Run on every point (default: ``[VerifyGPUCode()]`` for a GPU target, none for a
        CPU).
    probs : callable, optional
        ``probs(knob) -> list of float``: the prior ``sample`` draws a knob's value with
        (default: uniform).

    Examples
    --------
    >>> space = KnobSpace(MyRule())                                   # doctest: +SKIP
    >>> db = tune_tasks(tasks, "opencl", 64, work_dir="t/", space=space)   # doctest: +SKIP
    """

    def __init__(self, rule: KnobRule, fallback: SpaceGenerator | None = None,
                 postprocs: list | None = None, probs=None):
        super().__init__()
        if not isinstance(rule, KnobRule):
            raise TuneError(f"KnobSpace takes a KnobRule, got {type(rule).__name__}")
        self.rule = rule
        self.fallback = fallback
        self._knob_postprocs = list(postprocs) if postprocs is not None else None
        for p in self._knob_postprocs or []:
            if not isinstance(p, Postproc):
                raise TuneError(f"KnobSpace postprocs must be Postprocs, got {p!r}")
        self._probs = probs
        self._fallbacks: dict = {}
        self._knobs: dict = {}
        self._own_rejection: str | None = None

    # -- which space a function belongs to --------------------------------------------------------
    def _fallback(self, target) -> SpaceGenerator:
        if self.fallback is not None:
            return self.fallback
        key = str(target)
        if key not in self._fallbacks:
            self._fallbacks[key] = default_space(target)
        return self._fallbacks[key]

    def knobs_of(self, func, target, shape_hints: Mapping[str, int] | None = None
                 ) -> list[Knob] | None:
        """The rule's knobs of ``func`` (cached per function and target), or None."""
        target = _target(target)
        func = _func(func)
        key = (structural_hash(func), str(target))
        if key not in self._knobs:
            hints = resolve_shape_hints(func, shape_hints) if shape_hints is not None else {}
            knobs = self.rule.knobs(func, target, hints)
            self._knobs[key] = list(knobs) if knobs else None
        return self._knobs[key]

    @property
    def last_rejection(self) -> str | None:
        own = self._own_rejection
        if own is not None:
            return own
        fb = self.fallback or next(iter(self._fallbacks.values()), None)
        return getattr(fb, "last_rejection", None)

    @last_rejection.setter
    def last_rejection(self, value) -> None:
        self._own_rejection = value

    # -- making a point -------------------------------------------------------------------------
    def point(self, func, target, values: Mapping[str, int], seed: int | None = 0,
              shape_hints: Mapping[str, int] | None = None) -> Schedule | None:
        """The finished schedule of ``func`` at the knob ``values`` (missing knobs: their
        defaults); None when rejected (``last_rejection`` says why).

        Examples
        --------
        >>> sch = space.point(func, "opencl", {"k_step": 8})          # doctest: +SKIP
        """
        target = _target(target)
        func = _func(func)
        knobs = self.knobs_of(func, target, shape_hints)
        if knobs is None:
            raise TuneError(f"{type(self.rule).__name__} has no knobs for this function")
        unknown = sorted(set(values) - {k.name for k in knobs})
        if unknown:
            raise TuneError(f"unknown knobs {unknown}; the function's are "
                            f"{[k.name for k in knobs]}")
        decisions = []
        for k in knobs:
            v = values.get(k.name, k.default)
            if int(v) not in k.candidates:
                raise TuneError(f"knob {k.name!r}: {v!r} is not one of {k.candidates}")
            decisions.append(k.index(v))
        return self._make(func, target, knobs, decisions, seed, shape_hints)

    def _make(self, func: PrimFunc, target, knobs: list[Knob], decisions: list,
              seed: int | None, shape_hints) -> Schedule | None:
        """The recipe at ``decisions`` (an index per knob; None: drawn with ``seed``)."""
        self._own_rejection = None
        sch = Schedule(func, seed=seed)
        values = {}
        for k, d in zip(knobs, decisions):
            probs = list(self._probs(k)) if self._probs is not None else [1.0] * len(k.candidates)
            sch.sample_categorical(list(k.candidates), probs, decision=d)
            values[k.name] = k.candidates[int(sch.trace.instructions[-1].decision)]
        why = self.rule.check(func, target, values)
        if why:
            self._own_rejection = f"{type(self.rule).__name__}: {why}"
            return None
        try:
            self.rule.apply(sch, target, values)
        except (ScheduleError, TIRError, ValueError) as err:
            self._own_rejection = f"{type(self.rule).__name__} at {values}: {err}"
            return None
        hints = resolve_shape_hints(func, shape_hints) if shape_hints is not None else \
            {v.name: DEFAULT_SHAPE_HINT for v in shape_vars(func)}
        ctx = SpaceContext(target, dict(hints), func)
        sch.enter_postproc()
        postprocs = self._knob_postprocs
        if postprocs is None:
            postprocs = [VerifyGPUCode()] if target.kind in GPU_KINDS else []
        for p in postprocs:
            p.initialize(ctx)
        rejected = first_rejection(sch, postprocs)
        if rejected is not None:
            self._own_rejection = f"{type(rejected[0]).__name__} at {values}: {rejected[1]}"
            return None
        return sch

    # -- the SpaceGenerator interface -------------------------------------------------------------
    def generate(self, func, target, shape_hints: Mapping[str, int] | None = None
                 ) -> list[Schedule]:
        """One design space for a function the rule has knobs for (the point at the
        defaults, whose decisions ``sample`` draws again); else ``fallback``'s."""
        target = _target(target)
        func = _func(func)
        knobs = self.knobs_of(func, target, shape_hints)
        if knobs is None:
            self._own_rejection = None
            return self._fallback(target).generate(func, target, shape_hints)
        sch = self._make(func, target, knobs, [k.index(k.default) for k in knobs], 0,
                         shape_hints)
        if sch is None:
            raise TuneError(f"{type(self.rule).__name__}: the defaults do not make a schedule "
                            f"({self.last_rejection})")
        return [sch]

    def seeds(self, func, target, shape_hints: Mapping[str, int] | None = None
              ) -> list[Schedule]:
        """The point at the knobs' defaults; ``fallback``'s seeds for other functions."""
        target = _target(target)
        func = _func(func)
        knobs = self.knobs_of(func, target, shape_hints)
        if knobs is None:
            return self._fallback(target).seeds(func, target, shape_hints)
        sch = self._make(func, target, knobs, [k.index(k.default) for k in knobs], 0,
                         shape_hints)
        return [sch] if sch is not None else []

    def sample(self, space, func, target, seed: int,
               shape_hints: Mapping[str, int] | None = None) -> Schedule | None:
        """Every knob drawn again (seeded); ``fallback``'s ``sample`` for other functions."""
        target = _target(target)
        func = _func(func)
        knobs = self.knobs_of(func, target, shape_hints)
        if knobs is None:
            self._own_rejection = None
            return self._fallback(target).sample(space, func, target, seed, shape_hints)
        return self._make(func, target, knobs, [None] * len(knobs), seed, shape_hints)

    def mutate(self, trace: Trace, func, target, rng: np.random.Generator,
               shape_hints: Mapping[str, int] | None = None) -> Schedule | None:
        """One knob (with more than one candidate) moved to another candidate; the others
        kept. ``fallback``'s ``mutate`` for other functions."""
        target = _target(target)
        func = _func(func)
        knobs = self.knobs_of(func, target, shape_hints)
        if knobs is None:
            self._own_rejection = None
            return self._fallback(target).mutate(trace, func, target, rng, shape_hints)
        values = knob_values(trace, knobs)
        if values is None:
            self._own_rejection = "the trace is not a point of this knob space"
            return None
        movable = [i for i, k in enumerate(knobs) if len(k.candidates) > 1]
        if not movable:
            return None
        i = movable[int(rng.integers(0, len(movable)))]
        k = knobs[i]
        others = [c for c in k.candidates if c != values[k.name]]
        values[k.name] = others[int(rng.integers(0, len(others)))]
        return self._make(func, target, knobs, [kk.index(values[kk.name]) for kk in knobs],
                          int(rng.integers(0, 2**31)), shape_hints)

    def finish(self, trace: Trace, func, target,
               shape_hints: Mapping[str, int] | None = None) -> Schedule | None:
        """The point of a stored trace's knob decisions (the recipe applied again);
        ``fallback``'s ``finish`` for other functions and for traces made elsewhere (a
        default schedule's)."""
        target = _target(target)
        func = _func(func)
        knobs = self.knobs_of(func, target, shape_hints)
        values = knob_values(trace, knobs) if knobs is not None else None
        if values is None:
            self._own_rejection = None
            return self._fallback(target).finish(trace, func, target, shape_hints)
        return self._make(func, target, knobs, [k.index(values[k.name]) for k in knobs], 0,
                          shape_hints)
