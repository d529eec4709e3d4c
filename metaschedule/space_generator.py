"""``SpaceGenerator``: the design space of a function for a target (TVM's ``PostOrderApply``),
and drawing, mutating and finishing schedules from it.

``generate`` applies every schedule rule, in order, to every block, from the last block to the
first; a rule may branch, so the result is a list of *design spaces*: schedules whose traces
hold sampling instructions. ``sample`` replays one of those traces with its decisions dropped
(fresh random choices) and runs the postprocessors; ``mutate`` changes one decision of a
finished schedule's trace with a mutator picked by ``mutator_probs`` and replays it; ``finish``
replays a stored trace and runs the postprocessors.

Symbolic extents: ``shape_hints={"n": 64}`` gives the representative values tile sizes are
drawn at (``sample_tile``). The traces never depend on them: a split keeps the outer factor
``None`` and the split's predicate guards tails, so a trace tuned at ``n = 64`` replays to a
correct program for every ``n``.

Examples
--------
>>> from tilecraft import targets
>>> from tilecraft.metaschedule import default_space
>>> space = default_space(targets.Target("llvm"))
>>> designs = space.generate(func, "llvm")                      # doctest: +SKIP
>>> sch = space.sample(designs[0], func, "llvm", seed=1)        # doctest: +SKIP
>>> mod = targets.build(sch.mod, "llvm")                        # doctest: +SKIP
"""
from __future__ import annotations

import warnings
from typing import Mapping, Sequence

import numpy as np

from tilecraft.targets import Target, TargetError
from tilecraft.tensorir.expr import TIRError, Var
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.functor import free_vars
from tilecraft.tensorir.schedule import Schedule, ScheduleError, Trace

from .errors import TuneError
from .mutator import (MutateComputeLocation, MutateParallel, MutateThreadBinding,
                      MutateTileSize, MutateUnroll, Mutator)
from .postproc import (DisallowDynamicLoop, Postproc, RewriteCooperativeFetch,
                       RewritePackedLayout, RewriteParallelVectorizeUnroll,
                       RewriteReductionBlock, RewriteTensorize, RewriteUnboundBlock,
                       VerifyGPUCode)
from .schedule_rule import (AddRFactor, AutoBind, AutoInline, CrossThreadReduction,
                            MultiLevelTiling, MultiLevelTilingAMX, MultiLevelTilingDot4,
                            MultiLevelTilingWithIntrin, ParallelVectorizeUnroll,
                            RandomComputeLocation, ReuseConfig, ScheduleRule, has_amx,
                            has_dot_instruction)
from .schedule_rule.analysis import all_blocks, has_block
from .schedule_rule.base import CPU_KINDS, GPU_KINDS, SHARED_LAYOUTS, SpaceContext

# the value a symbolic shape variable is tiled at when no hint is given
DEFAULT_SHAPE_HINT = 64


def _target(target) -> Target:
    supported = ", ".join(CPU_KINDS + GPU_KINDS)
    if isinstance(target, (str, dict)):
        try:
            target = Target(target)
        except TargetError as err:
            raise TuneError(f"no schedule rules for target {target!r}: {err}; the design space "
                            f"supports the kinds {supported}") from None
    kind = getattr(target, "kind", None)
    if not isinstance(target, Target) or kind not in CPU_KINDS + GPU_KINDS:
        raise TuneError(f"no schedule rules for target {target!r} (kind {kind!r}); the design "
                        f"space supports the kinds {supported}")
    return target


def _func(func_or_mod) -> PrimFunc:
    if isinstance(func_or_mod, PrimFunc):
        return func_or_mod
    if isinstance(func_or_mod, IRModule):
        prims = {k: v for k, v in func_or_mod.functions.items() if isinstance(v, PrimFunc)}
        if "main" in prims:
            return prims["main"]
        if len(prims) == 1:
            return next(iter(prims.values()))
        raise TuneError(f"the module has {len(prims)} PrimFuncs and none is 'main'; tune one "
                        f"function at a time")
    raise TuneError(f"expected a PrimFunc, got {type(func_or_mod).__name__}")


def shape_vars(func: PrimFunc) -> list[Var]:
    """The symbolic shape variables of a function's buffers, in first-appearance order."""
    out: dict[int, Var] = {}
    for b in func.buffers:
        for dim in b.shape:
            for v in free_vars(dim):
                out.setdefault(id(v), v)
    for p in func.scalar_params:
        out.setdefault(id(p), p)
    return list(out.values())


def resolve_shape_hints(func: PrimFunc, shape_hints: Mapping[str, int] | None) -> dict:
    """``shape_hints`` completed for every symbolic dim of ``func`` (a missing one gets
    ``DEFAULT_SHAPE_HINT``, with a warning); unknown names are an error."""
    hints = {str(k): int(v) for k, v in (shape_hints or {}).items()}
    names = [v.name for v in shape_vars(func)]
    unknown = sorted(set(hints) - set(names))
    if unknown:
        raise TuneError(f"shape_hints name {unknown}, which are not symbolic dims of the "
                        f"function (it has {names or 'none'})")
    for k, v in hints.items():
        if v < 1:
            raise TuneError(f"shape_hints[{k!r}] must be a positive int, got {v}")
    missing = [n for n in names if n not in hints]
    if missing:
        warnings.warn(f"no shape_hints for the symbolic dims {missing}: tiling them at "
                      f"{DEFAULT_SHAPE_HINT}; pass shape_hints={{...}} with representative "
                      f"values", stacklevel=3)
        for n in missing:
            hints[n] = DEFAULT_SHAPE_HINT
    return hints


def hints_from_trace(trace: Trace) -> dict:
    """The shape hints a trace's ``sample_tile`` instructions were drawn with."""
    out: dict = {}
    for inst in trace.instructions:
        if inst.kind == "sample_tile" and len(inst.inputs) >= 4 and isinstance(inst.inputs[3],
                                                                                dict):
            out.update({str(k): int(v) for k, v in inst.inputs[3].items()})
    return out


# Per-level bounds of the GPU tiling (S0 blocks, S1 vthread, S2 threads, S3 x S4 the register
# tile; R0 k-steps, R1 x R2 the shared k-tile): up to 32 threads and 8 registers per dimension
# (8 x 8 = 64 accumulators, the usual SGEMM tile; 16 x 16 spills on the H200), k-tiles up to
# 128. Mutation keeps a level that grows within its bound (a seed may start above one). S1 stays 1: our lowering runs a vthread as a
# serial loop around the k loop, which reloads the shared tiles per virtual thread (TVM's
# InjectVirtualThread interleaves them instead); MultiLevelTiling's strided alternative is S3.
GPU_TILE_CAPS = {"S": (None, 1, 32, 2, 4), "R": (None, 32, 4)}


def default_rules(target: Target) -> list[ScheduleRule]:
    """The schedule rules of ``default_space`` for a target (TVM's ``DefaultLLVM`` /
    ``DefaultCUDA`` lists, with our micro-kernel rule and ``local`` caches on CPUs, and on
    CPUs with a dot-product instruction ``MultiLevelTilingDot4`` for 8-bit blocks, and with
    Intel AMX ``MultiLevelTilingAMX`` for int8 dense blocks on packed words)."""
    if target.kind in GPU_KINDS:
        return [
            MultiLevelTiling("SSSRRSRS", tile_binds=("blockIdx.x", "vthread.x", "threadIdx.x"),
                             max_innermost_factor=64, vector_load_lens=(1, 2, 4),
                             reuse_read=ReuseConfig("must", (4,), "shared"),
                             reuse_write=ReuseConfig("must", (3,), "local"),
                             tile_caps=GPU_TILE_CAPS, shared_layouts=SHARED_LAYOUTS),
            AutoInline(into_producer=True, into_consumer=True, disallow_if_then_else=False,
                       require_injective=False, disallow_op=()),
            CrossThreadReduction(thread_extents=(4, 8, 16, 32, 64, 128, 256, 512)),
            ParallelVectorizeUnroll(max_jobs_per_core=-1, max_vectorize_extent=-1,
                                    unroll_max_steps=(0, 16, 64, 512, 1024, 4096)),
            AutoBind(max_threadblocks=256, thread_extents=(32, 64, 128, 256, 512, 1024)),
        ]
    # 8-bit multiply-accumulates tiled around the dot-product instruction where there is one
    dot4 = [MultiLevelTilingDot4()] if has_dot_instruction(target) else []
    # int8 dense blocks on words around the AMX block product where there are AMX tiles
    amx = [MultiLevelTilingAMX()] if has_amx(target) else []
    return [
        AutoInline(into_producer=False, into_consumer=True, disallow_if_then_else=True,
                   require_injective=True, disallow_op=("exp",)),
        AddRFactor(max_jobs_per_core=16, max_innermost_factor=64),
        *amx,
        *dot4,
        MultiLevelTilingWithIntrin(),
        MultiLevelTiling("SSRSRS", max_innermost_factor=64,
                         reuse_write=ReuseConfig("may", (1, 2), "local"), pack="may"),
        ParallelVectorizeUnroll(max_jobs_per_core=16, max_vectorize_extent=64,
                                unroll_max_steps=(0, 16, 64, 512)),
        RandomComputeLocation(),
    ]


def default_postprocs(target: Target) -> list[Postproc]:
    """The postprocessors of ``default_space`` for a target."""
    if target.kind in GPU_KINDS:
        return [DisallowDynamicLoop(), RewriteCooperativeFetch(), RewriteUnboundBlock(),
                RewriteParallelVectorizeUnroll(), RewriteReductionBlock(), VerifyGPUCode()]
    return [DisallowDynamicLoop(), RewritePackedLayout(), RewriteReductionBlock(),
            RewriteTensorize(), RewriteParallelVectorizeUnroll()]


def default_mutator_probs(target: Target) -> dict[Mutator, float]:
    """TVM's default mutator probabilities: CPU tile size 0.9, compute location 0.05, unroll
    0.03, parallel 0.02; GPU tile size 0.9, unroll 0.08, thread binding 0.02."""
    if target.kind in GPU_KINDS:
        return {MutateTileSize(): 0.9, MutateUnroll(): 0.08, MutateThreadBinding(): 0.02}
    return {MutateTileSize(): 0.9, MutateComputeLocation(): 0.05, MutateUnroll(): 0.03,
            MutateParallel(max_jobs_per_core=16): 0.02}


def first_rejection(sch: Schedule, postprocs: Sequence[Postproc]
                    ) -> tuple[Postproc, str] | None:
    """Apply ``postprocs`` to ``sch`` in order; the first that rejects it and why (its
    ``reason``, its error's message, or ``"rejected"``), or None where all accept it."""
    for p in postprocs:
        try:
            ok = p.apply(sch)
        except (ScheduleError, TIRError, ValueError) as err:
            ok, why = False, str(err)
        else:
            why = getattr(p, "reason", None)
        if not ok:
            return p, why or "rejected"
    return None


class SpaceGenerator:
    """Design spaces from schedule rules, finished by postprocessors, explored by mutators.

    Parameters
    ----------
    rules : list of ScheduleRule, optional
    postprocs : list of Postproc, optional
    mutator_probs : dict of Mutator -> float, optional
        Each None: the defaults for the target of the call (``default_rules`` ...).

    Examples
    --------
    >>> space = SpaceGenerator()                                 # defaults per target
    >>> designs = space.generate(func, "llvm", shape_hints={"n": 64})   # doctest: +SKIP
    """

    def __init__(self, rules: list | None = None, postprocs: list | None = None,
                 mutator_probs: dict | None = None):
        self._rules = list(rules) if rules is not None else None
        self._postprocs = list(postprocs) if postprocs is not None else None
        self._mutator_probs = dict(mutator_probs) if mutator_probs is not None else None
        for m, p in (self._mutator_probs or {}).items():
            if not isinstance(m, Mutator) or not p >= 0:
                raise TuneError(f"mutator_probs maps Mutators to probabilities >= 0, got "
                                f"{m!r}: {p!r}")
        self._defaults: dict[str, tuple] = {}
        self._last: Target | None = None
        # why the last sample / mutate / finish returned None (for logs and debugging)
        self.last_rejection: str | None = None

    # -- the components for a target ------------------------------------------------------------
    def _components(self, target: Target) -> tuple[list, list, dict]:
        key = str(target)
        if key not in self._defaults:
            self._defaults[key] = (
                self._rules if self._rules is not None else default_rules(target),
                self._postprocs if self._postprocs is not None else default_postprocs(target),
                self._mutator_probs if self._mutator_probs is not None
                else default_mutator_probs(target))
        self._last = target
        return self._defaults[key]

    def _current(self, i: int):
        if self._last is None:
            given = (self._rules, self._postprocs, self._mutator_probs)[i]
            if given is not None:
                return given
            raise TuneError("this SpaceGenerator uses the defaults of the target it is called "
                            "with; call generate() first (or use default_space(target))")
        return self._components(self._last)[i]

    @property
    def rules(self) -> list[ScheduleRule]:
        return self._current(0)

    @property
    def postprocs(self) -> list[Postproc]:
        return self._current(1)

    @property
    def mutator_probs(self) -> dict[Mutator, float]:
        return self._current(2)

    def _context(self, func: PrimFunc, target: Target, hints: dict) -> tuple:
        rules, postprocs, mutators = self._components(target)
        ctx = SpaceContext(target, dict(hints), func)
        for x in (*rules, *postprocs, *mutators):
            x.initialize(ctx)
        return rules, postprocs, mutators

    # -- generating the design spaces ---------------------------------------------------------
    def generate(self, func: PrimFunc, target, shape_hints: Mapping[str, int] | None = None
                 ) -> list[Schedule]:
        """The design spaces of ``func`` for ``target``: schedules whose traces the search
        re-draws. A function without blocks to schedule gives ``[Schedule(func)]``.

        Raises
        ------
        TuneError
            For a target kind the rules do not support, or bad ``shape_hints``.
        """
        target = _target(target)
        func = _func(func)
        hints = resolve_shape_hints(func, shape_hints)
        rules, _, _ = self._context(func, target, hints)
        return self._apply_rules(rules, func)

    def seeds(self, func: PrimFunc, target, shape_hints: Mapping[str, int] | None = None
              ) -> list[Schedule]:
        """Finished schedules at the known-good points of the design spaces: the rules'
        ``seed_variants`` (for the CPU micro-kernel rule, the hand GEMM recipe at a few
        register tiles) in place of the rules, every other decision as drawn. The search
        measures them first and evolves from them. ``[]`` when no rule has a seed for
        ``func`` (no block the recipe fits).

        Their traces are traces of the design spaces (the same instructions, decisions
        fixed), so mutators move them like any other point.

        Examples
        --------
        >>> seeds = space.seeds(gemm_func, "llvm")                   # doctest: +SKIP
        >>> len(seeds)                                               # doctest: +SKIP
        4
        """
        target = _target(target)
        func = _func(func)
        hints = resolve_shape_hints(func, shape_hints)
        rules, _, _ = self._context(func, target, hints)
        variants = [r.seed_variants() for r in rules]
        # the rules with one fixed variant (no extra unrolling) take it in every seed; a rule
        # with several (register tiles) makes one seed family each
        fixed = [v[0] if len(v) == 1 else r for r, v in zip(rules, variants)]
        families = [(n, v) for n, v in enumerate(variants) if len(v) > 1]
        out, keys = [], set()
        for n, family in families:
            for variant in family:
                chosen = list(fixed)
                chosen[n] = variant
                variant.seeded = 0
                designs = self._apply_rules(chosen, func)
                if not variant.seeded:
                    continue   # no block the variant fits: these are no seeds
                for design in designs:
                    sch = self._finish(design.trace, func, target, hints, 0)
                    if sch is None:
                        continue
                    key = str(sch.trace)
                    if key not in keys:
                        keys.add(key)
                        out.append(sch)
        return out

    def _apply_rules(self, rules: list, func: PrimFunc) -> list[Schedule]:
        sch = Schedule(func, seed=0)
        names = [br.block.name for br in all_blocks(func)]
        if not names:
            return [sch]
        blocks = [sch.get_block(n) for n in names]
        root = sch.get_block(func.body.block.name) if hasattr(func.body, "block") else None
        order = ([root] if root is not None else []) + blocks
        result = [sch]
        for rule in rules:
            stack = [(s, list(order)) for s in result]
            result = []
            while stack:
                s, todo = stack.pop()
                if not todo:
                    result.append(s)
                    continue
                block = todo.pop()
                if not has_block(s, block):
                    stack.append((s, todo))
                    continue
                try:
                    applied = rule.apply(s, block)
                except ScheduleError as err:
                    raise TuneError(f"schedule rule {rule!r} failed on block "
                                    f"{s.get(block).name!r}: {err}") from err
                for a in reversed(applied):
                    stack.append((a, list(todo)))
        return result

    # -- drawing, mutating, finishing -----------------------------------------------------------
    def _finish(self, trace: Trace, func: PrimFunc, target: Target, hints: dict,
                seed: int | None) -> Schedule | None:
        _, postprocs, _ = self._context(func, target, hints)
        sch = Schedule(func, seed=seed)
        self.last_rejection = None
        try:
            sch.replay(trace)
        except (ScheduleError, TIRError, ValueError) as err:
            self.last_rejection = f"replay: {err}"
            return None
        sch.enter_postproc()
        rejected = first_rejection(sch, postprocs)
        if rejected is not None:
            self.last_rejection = f"{type(rejected[0]).__name__}: {rejected[1]}"
            return None
        return sch

    def _hints(self, func: PrimFunc, trace: Trace, shape_hints) -> dict:
        if shape_hints is not None:
            return resolve_shape_hints(func, shape_hints)
        hints = hints_from_trace(trace)
        for v in shape_vars(func):
            hints.setdefault(v.name, DEFAULT_SHAPE_HINT)
        return {k: v for k, v in hints.items() if k in {x.name for x in shape_vars(func)}}

    def sample(self, space: Schedule | Trace, func: PrimFunc, target, seed: int,
               shape_hints: Mapping[str, int] | None = None) -> Schedule | None:
        """A random point of a design space: its trace replayed with every decision drawn
        again (seeded), then the postprocessors. None when they reject it.

        Examples
        --------
        >>> sch = space.sample(designs[0], func, "llvm", seed=3)     # doctest: +SKIP
        """
        target = _target(target)
        func = _func(func)
        trace = space.trace if isinstance(space, Schedule) else space
        trace = trace.without_postproc().with_decisions_dropped()
        return self._finish(trace, func, target, self._hints(func, trace, shape_hints), seed)

    def mutate(self, trace: Trace, func: PrimFunc, target, rng: np.random.Generator,
               shape_hints: Mapping[str, int] | None = None) -> Schedule | None:
        """A neighbour of a schedule: one mutator (drawn by ``mutator_probs``) changes a
        decision of ``trace`` (cut at its postprocessing), which is replayed and postprocessed.
        None when no mutator applies or the result is rejected.

        Examples
        --------
        >>> nxt = space.mutate(sch.trace, func, "llvm", np.random.default_rng(0))  # doctest: +SKIP
        """
        target = _target(target)
        func = _func(func)
        base = trace.without_postproc()
        hints = self._hints(func, base, shape_hints)
        _, _, mutators = self._context(func, target, hints)
        items = [(m, p) for m, p in mutators.items() if p > 0]
        if not items:
            return None
        probs = np.array([p for _, p in items], dtype=float)
        probs /= probs.sum()
        order = list(rng.choice(len(items), size=len(items), replace=False, p=probs))
        for idx in order:  # the drawn mutator first; the others if it finds nothing to change
            new = items[idx][0].apply(base, rng)
            if new is not None:
                return self._finish(new, func, target, hints, int(rng.integers(0, 2**31)))
        return None

    def finish(self, trace: Trace, func: PrimFunc, target,
               shape_hints: Mapping[str, int] | None = None) -> Schedule | None:
        """Replay a stored trace (its decisions kept) and run the postprocessors; None when
        it no longer applies.

        Examples
        --------
        >>> sch = space.finish(record.trace, func, "llvm")           # doctest: +SKIP
        """
        target = _target(target)
        func = _func(func)
        base = trace.without_postproc()
        return self._finish(base, func, target, self._hints(func, base, shape_hints), 0)


def default_space(target) -> SpaceGenerator:
    """The default design space for ``target``: ``llvm`` (CPU) or ``opencl`` / ``webgpu`` (GPU).

    Raises
    ------
    TuneError
        For any other target kind.

    Examples
    --------
    >>> from tilecraft import targets
    >>> space = default_space(targets.Target("llvm"))
    >>> [type(m).__name__ for m in space.mutator_probs]
    ['MutateTileSize', 'MutateComputeLocation', 'MutateUnroll', 'MutateParallel']
    """
    t = _target(target)
    return SpaceGenerator(default_rules(t), default_postprocs(t), default_mutator_probs(t))
