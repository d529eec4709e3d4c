"""``EvolutionarySearch``: which candidates of a design space to measure next.

One call of ``generate_candidates(num)`` (TVM's ``EvolutionarySearch``):

1. **Initial population** (``population_size``): the best measured schedules of the workload
   from the database (``init_measured_ratio`` of it; a second run starts from the first's
   best), filled with random samples of the design spaces (``SpaceGenerator.sample``).
2. **Evolution** (``genetic_num_iters`` rounds): the cost model scores the population; parents
   are drawn with a probability that falls with their rank, and each child is a mutation of its
   parent (``SpaceGenerator.mutate``, with probability ``genetic_mutate_prob``) or the parent
   itself. Every scheduled function is identified by the structural hash of its IR
   (``database.workload_hash``), so schedules that differ only in their traces count once.
3. **Selection** (ε-greedy): the best-scored unmeasured candidates seen during evolution,
   except for a fraction ``eps_greedy`` drawn at random from the random samples, so that a
   wrong cost model cannot keep the search away from a part of the space forever.

``measure_candidates`` builds and runs a batch (the builder and runner of ``metaschedule``),
checks every candidate's outputs against the reference — the *unscheduled* function built with
``targets.build`` and run on the same ``random_inputs`` — commits a ``TuningRecord`` for each
(a failed or wrong one with its error, so it is never measured again), and returns the results.
A candidate that is fast but wrong is rejected and logged: it never becomes the best.

Examples
--------
>>> ctx = TuneContext(func, Target("llvm"), default_space("llvm"), XGBModel(),
...                   Database("tune/"))                                   # doctest: +SKIP
>>> search = EvolutionarySearch(population_size=64)                        # doctest: +SKIP
>>> search.initialize(ctx)                                                 # doctest: +SKIP
>>> batch = search.generate_candidates(16)                                 # doctest: +SKIP
>>> results = measure_candidates(ctx, batch, LocalBuilder(), LocalRunner())  # doctest: +SKIP
>>> search.notify(batch, results)                                          # doctest: +SKIP
"""
from __future__ import annotations

import json
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tilecraft import targets
from tilecraft.targets import Target
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.schedule import Schedule, ScheduleError, Trace
from tilecraft.tensorir.transform import lower

from .arg_info import ArgInfo, args_info, output_indices, random_inputs, reference_outputs
from .builder import BuilderInput
from .cost_model import CostModel
from .database import Database, TuningRecord, Workload, target_key, workload_hash
from .errors import TuneError
from .feature import PerStoreFeature
from .runner import RunnerInput

__all__ = ["Candidate", "MeasureResult", "TuneContext", "EvolutionarySearch",
           "measure_candidates", "build_candidates", "run_candidates", "compute_reference",
           "trace_key", "lift_tiles"]

LOG = logging.getLogger("metaschedule")


def trace_key(trace: Trace) -> str:
    """A canonical text of a trace (its decisions included): equal traces, equal keys."""
    return json.dumps(trace.to_json(), sort_keys=True, separators=(",", ":"))


@dataclass
class Candidate:
    """A finished schedule the search may measure."""

    sch: Schedule
    shash: str                          # structural hash of the scheduled function
    features: np.ndarray
    score: float = 0.0
    source: str = "random"              # "random", "mutation", "database"

    @property
    def trace(self) -> Trace:
        return self.sch.trace


@dataclass
class MeasureResult:
    """What measuring one candidate gave: seconds per repeat, or an error. ``checked``: its
    outputs were compared with the reference (and matched, unless ``wrong``)."""

    run_secs: list[float] | None
    error: str | None = None
    wrong: bool = False
    checked: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.run_secs)

    @property
    def mean_secs(self) -> float:
        return float(np.mean(self.run_secs)) if self.ok else math.inf


@dataclass
class TuneContext:
    """Everything the search of one task needs.

    ``shape_vars`` are the representative values of the function's symbolic dims (the task's
    shape hints): tile sizes are drawn, features computed and candidates measured at them.
    """

    func: PrimFunc
    target: Target
    space: object                       # SpaceGenerator
    cost_model: CostModel
    database: Database
    shape_vars: dict = field(default_factory=dict)
    name: str = "main"
    seed: int = 0
    workload: Workload | None = None
    args_info: list[ArgInfo] | None = None
    reference: list[np.ndarray] | None = None
    rng: np.random.Generator | None = None
    flop: float = 0.0
    # set once tune.log said that this task's candidates are measured without a check
    warned_unchecked: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.target, Target):
            self.target = Target(self.target)
        if self.workload is None:
            self.workload = self.database.commit_workload(self.func)
        if self.rng is None:
            self.rng = np.random.default_rng(self.seed)
        if self.args_info is None:
            self.args_info = args_info(self.func, self.shape_vars)

    @property
    def group(self) -> str:
        """The cost-model group of the task: its workload hash."""
        return self.workload.shash


# ---------------------------------------------------------------------------------------------
# code size

# Statements a lowered candidate may have once its unrolled loops are expanded. Measured on the
# design space of ResNet-50's convolutions: the candidates that ran past the builder's 60 s limit
# (LLVM on the expanded code) had 2,209 and 2,688; the largest that built, 1,905; the default
# schedules (hand micro-kernels) have about 400.
MAX_UNROLLED_STMTS = 2048


def unrolled_size(func: PrimFunc) -> int:
    """Statements of a *lowered* function with each constant ``unrolled`` loop expanded (its
    body counted extent times): about the code LLVM gets, whose size is what makes a build slow.

    Examples
    --------
    >>> unrolled_size(lower(sch.func))                       # doctest: +SKIP
    370
    """
    from tilecraft.tensorir.expr import IntImm
    from tilecraft.tensorir.stmt import For, IfThenElse, SeqStmt

    def size(st) -> int:
        if isinstance(st, For):
            body = size(st.body)
            if st.kind == "unrolled" and isinstance(st.extent, IntImm):
                return max(1, st.extent.value) * body
            return body + 1
        if isinstance(st, SeqStmt):
            return sum(size(x) for x in st.seq)
        if isinstance(st, IfThenElse):
            return 1 + size(st.then_case) + (size(st.else_case) if st.else_case is not None
                                             else 0)
        body = getattr(st, "body", None)
        return 1 + size(body) if body is not None else 1
    return size(func.body)


# ---------------------------------------------------------------------------------------------
# baselines


def lift_tiles(func: PrimFunc, sch: Schedule, max_innermost_factor: int = 64) -> Schedule:
    """``sch`` (a schedule of ``func`` made outside the design space, e.g. a compiler's default)
    with every ``split`` by constant factors of a constant-extent loop made a
    ``sample_perfect_tile`` whose decision is those factors, then a split by them: the same
    program, but a trace that ``MutateTileSize`` can mutate, so the evolutionary search explores
    tile sizes around it. Returns ``sch`` itself when nothing can be lifted or the lifted trace
    does not give the same program.

    Examples
    --------
    >>> lifted = lift_tiles(func, default_sch)                 # doctest: +SKIP
    >>> [i.kind for i in lifted.trace][:4]                     # doctest: +SKIP
    ['get_block', 'get_loops', 'sample_perfect_tile', 'split']
    """
    from tilecraft.tensorir.expr import IntImm
    out = Schedule(func)
    names: dict = {}
    lifted = 0
    try:
        for inst in sch.trace.instructions:
            args = [out._decode(v, names) for v in inst.inputs]
            kwargs = {"decision": inst.decision} if inst.decision is not None else {}
            result = None
            if inst.kind == "split" and isinstance(args[1], list) and all(
                    f is None or (isinstance(f, int) and f >= 1) for f in args[1]) and \
                    sum(f is None for f in args[1]) <= 1:
                extent = out.get(args[0]).extent
                known = math.prod(f for f in args[1] if f is not None)
                if isinstance(extent, IntImm) and extent.value % known == 0 and \
                        (None in args[1] or known == extent.value) and len(args[1]) > 1:
                    factors = [extent.value // known if f is None else f for f in args[1]]
                    inner = max(max_innermost_factor, factors[-1])
                    rvs = out.sample_perfect_tile(args[0], len(factors), inner,
                                                  decision=factors)
                    result = out.split(args[0], rvs, *args[2:])
                    lifted += 1
            if result is None:
                result = getattr(out, inst.kind)(*args, **kwargs)
            if not isinstance(result, (list, tuple)):
                result = [result] if result is not None and inst.outputs else []
            for name, rv in zip(inst.outputs, result):
                names[name] = rv
        if not lifted or workload_hash(out.trace.apply(func).func) != workload_hash(sch.func):
            return sch
    except Exception as err:  # noqa: BLE001 - keep the schedule as it is
        LOG.debug("lift_tiles: %s: %s", type(err).__name__, err)
        return sch
    return out


# ---------------------------------------------------------------------------------------------
# the reference result


def compute_reference(func: PrimFunc, infos: Sequence[ArgInfo], seed: int,
                      shape_vars: dict | None = None) -> list[np.ndarray] | None:
    """The outputs of the unscheduled ``func`` on ``random_inputs(infos, seed)`` (aligned with
    ``output_indices(func)``): built with ``targets.build`` for this machine; the numpy
    interpreter if that fails; None (with a warning) when neither can run it."""
    arrays = random_inputs(infos, seed)
    call_args = [a[()].item() if info.scalar else a for a, info in zip(arrays, infos)]
    try:
        mod = targets.build(func, Target("llvm"))
        mod["main"](*call_args)
        return [call_args[i] for i in output_indices(func)]
    except Exception as err:  # noqa: BLE001 - fall back to the interpreter, then to no check
        build_err = err
    try:
        return reference_outputs(func, infos, seed)
    except Exception as err:  # noqa: BLE001
        warnings.warn(f"no reference result for {func.attr_dict.get('global_symbol', 'main')}: "
                      f"building the unscheduled function failed ({build_err}) and so did the "
                      f"interpreter ({err}); candidates are measured without a correctness "
                      f"check", RuntimeWarning, stacklevel=2)
        return None


# ---------------------------------------------------------------------------------------------
# the search


class EvolutionarySearch:
    """Evolutionary search guided by a cost model (see the module docstring).

    Parameters
    ----------
    population_size : int
        Candidates per generation.
    init_measured_ratio : float
        Share of the initial population taken from the database's best records.
    init_min_unmeasured : int
        Random samples in the initial population, at least.
    genetic_num_iters : int
        Generations per call of ``generate_candidates``.
    genetic_mutate_prob : float
        Probability that a child is a mutation (else a copy of its parent).
    genetic_max_fail_count : int
        Failed mutations tolerated per child before the generation ends early.
    eps_greedy : float
        Share of each batch drawn at random from the random samples.
    max_unrolled_stmts : int, optional
        Candidates whose lowered code has more statements than this once their unrolled loops
        are expanded (``unrolled_size``) are dropped before scoring: their builds run into the
        builder's time limit. None: no limit.

    Examples
    --------
    >>> search = EvolutionarySearch(population_size=64, genetic_num_iters=2)
    >>> search.eps_greedy
    0.05
    """

    def __init__(self, population_size: int = 128, init_measured_ratio: float = 0.2,
                 init_min_unmeasured: int = 16, genetic_num_iters: int = 3,
                 genetic_mutate_prob: float = 0.85, genetic_max_fail_count: int = 4,
                 eps_greedy: float = 0.05, max_unrolled_stmts: int | None = MAX_UNROLLED_STMTS):
        if population_size < 1:
            raise ValueError(f"population_size must be >= 1, got {population_size}")
        if not 0.0 <= init_measured_ratio <= 1.0 or not 0.0 <= eps_greedy <= 1.0 or \
                not 0.0 <= genetic_mutate_prob <= 1.0:
            raise ValueError("init_measured_ratio, eps_greedy and genetic_mutate_prob are "
                             "probabilities in [0, 1]")
        self.population_size = int(population_size)
        self.init_measured_ratio = float(init_measured_ratio)
        self.init_min_unmeasured = int(init_min_unmeasured)
        self.genetic_num_iters = int(genetic_num_iters)
        self.genetic_mutate_prob = float(genetic_mutate_prob)
        self.genetic_max_fail_count = int(genetic_max_fail_count)
        self.eps_greedy = float(eps_greedy)
        self.max_unrolled_stmts = int(max_unrolled_stmts) if max_unrolled_stmts else None
        self.ctx: TuneContext | None = None

    # -- state ----------------------------------------------------------------------------------
    def initialize(self, ctx: TuneContext) -> None:
        """Generate the design spaces of ``ctx.func`` and load what the database has measured.

        Raises
        ------
        TuneError
            For a target the design space does not support (from ``SpaceGenerator``).
        """
        self.ctx = ctx
        self.spaces = ctx.space.generate(ctx.func, ctx.target, ctx.shape_vars or None)
        if not self.spaces:
            raise TuneError(f"{ctx.name}: the design space of the function is empty")
        self.extractor = PerStoreFeature(ctx.target, ctx.shape_vars)
        self.measured: set[str] = set()          # structural hashes measured in this run
        self.measured_traces: set[str] = set()   # trace keys measured in this or earlier runs
        for rec in ctx.database.get_all_tuning_records():
            if rec.workload.shash == ctx.workload.shash and \
                    rec.target == target_key(ctx.target):
                self.measured_traces.add(trace_key(rec.trace))
        self.tunable = any(inst.decision is not None for s in self.spaces
                           for inst in s.trace.instructions)
        self.exhausted = False
        self.seeds = self._seeds()
        self.stats = {"sampled": 0, "sample_failed": 0, "mutated": 0, "mutate_failed": 0,
                      "duplicates": 0, "too_large": 0}

    def _seed(self) -> int:
        return int(self.ctx.rng.integers(0, 2**31 - 1))

    def _candidate(self, sch: Schedule | None, source: str) -> Candidate | None:
        if sch is None:
            return None
        try:
            shash = workload_hash(sch.func)
            lowered = lower(sch.func)
        except Exception as err:  # noqa: BLE001 - a schedule that does not lower is no candidate
            LOG.debug("%s: dropped a candidate that does not lower: %s", self.ctx.name, err)
            return None
        if self.max_unrolled_stmts and source != "baseline":
            n = unrolled_size(lowered)
            if n > self.max_unrolled_stmts:
                # its build would take LLVM a minute or more (and such code is rarely fast):
                # rejected before it costs a builder slot
                self.stats["too_large"] += 1
                LOG.debug("%s: dropped a candidate of %d unrolled statements (> %d)",
                          self.ctx.name, n, self.max_unrolled_stmts)
                return None
        try:
            feats = self.extractor.extract_one(lowered)
        except Exception as err:  # noqa: BLE001
            LOG.debug("%s: dropped a candidate without features: %s", self.ctx.name, err)
            return None
        return Candidate(sch, shash, feats, source=source)

    def baseline_candidate(self, baseline: Schedule) -> Candidate | None:
        """``baseline`` (a schedule of the task's function made outside the design space, e.g.
        the default schedule a compiler applies without a record) as a candidate to measure;
        None when its trace is measured already (a resumed run) or does not replay on the
        task's function to the same program (then a record of it would not reproduce it).
        """
        if self.ctx is None:
            raise TuneError("EvolutionarySearch.baseline_candidate before initialize(ctx)")
        if not isinstance(baseline, Schedule):
            raise TypeError(f"{self.ctx.name}: a baseline is a tensorir Schedule, got "
                            f"{type(baseline).__name__}")
        if trace_key(baseline.trace) in self.measured_traces:
            return None
        try:
            replayed = baseline.trace.apply(self.ctx.func)
            same = workload_hash(replayed.func) == workload_hash(baseline.func)
        except Exception as err:  # noqa: BLE001 - a baseline of another function
            LOG.warning("%s: the baseline schedule does not replay on the task's function "
                        "(%s: %s); it is not measured", self.ctx.name, type(err).__name__, err)
            return None
        if not same:
            LOG.warning("%s: the baseline's trace replays to another program than the "
                        "baseline; it is not measured", self.ctx.name)
            return None
        return self._candidate(replayed, "baseline")

    def _seeds(self) -> list[Candidate]:
        """The design spaces' known-good points (``SpaceGenerator.seeds``) as candidates:
        measured in the first batches and in every initial population, so the evolution
        starts from them."""
        ctx = self.ctx
        if not hasattr(ctx.space, "seeds"):
            return []
        try:
            seeds = ctx.space.seeds(ctx.func, ctx.target, ctx.shape_vars or None)
        except (ScheduleError, TuneError) as err:
            LOG.warning("%s: no seed schedules: %s", ctx.name, err)
            return []
        out = []
        for sch in seeds:
            c = self._candidate(sch, "seed")
            if c is not None and c.shash not in {x.shash for x in out}:
                out.append(c)
        return out

    def _is_measured(self, c: Candidate) -> bool:
        return c.shash in self.measured or trace_key(c.trace) in self.measured_traces

    # -- the initial population -----------------------------------------------------------------
    def _from_database(self, k: int) -> list[Candidate]:
        ctx = self.ctx
        out = []
        if k <= 0:
            return out
        for rec in ctx.database.get_top_k(ctx.workload, ctx.target, k):
            sch = ctx.space.finish(rec.trace, ctx.func, ctx.target, ctx.shape_vars or None)
            c = self._candidate(sch, "database")
            if c is not None:
                self.measured.add(c.shash)
                out.append(c)
        return out

    def _random(self, n: int, seen: set[str]) -> list[Candidate]:
        ctx = self.ctx
        out: list[Candidate] = []
        fails = 0
        max_fails = max(2 * n, 16)
        while len(out) < n and fails < max_fails:
            space = self.spaces[int(ctx.rng.integers(0, len(self.spaces)))]
            sch = ctx.space.sample(space, ctx.func, ctx.target, self._seed(),
                                   ctx.shape_vars or None)
            c = self._candidate(sch, "random")
            if c is None:
                self.stats["sample_failed"] += 1
                fails += 1
                continue
            self.stats["sampled"] += 1
            if c.shash in seen:
                self.stats["duplicates"] += 1
                fails += 1
                continue
            seen.add(c.shash)
            out.append(c)
        return out

    # -- scoring and evolution ------------------------------------------------------------------
    def _score(self, cands: list[Candidate]) -> None:
        if not cands:
            return
        scores = self.ctx.cost_model.predict_features([c.features for c in cands],
                                                      group=self.ctx.group)
        for c, s in zip(cands, scores):
            c.score = float(s)

    def _parent_probs(self, cands: list[Candidate]) -> np.ndarray:
        """Selection probabilities falling with the rank: the best is drawn about e^2 times
        as often as the median."""
        n = len(cands)
        order = np.argsort([-c.score for c in cands], kind="stable")
        rank = np.empty(n)
        rank[order] = np.arange(n)
        p = np.exp(-4.0 * rank / max(n, 1))
        return p / p.sum()

    def _evolve(self, population: list[Candidate], pool: dict[str, Candidate]) -> list[Candidate]:
        ctx = self.ctx
        for _ in range(self.genetic_num_iters):
            self._score(population)
            for c in population:
                if not self._is_measured(c):
                    pool.setdefault(c.shash, c)
            probs = self._parent_probs(population)
            children: list[Candidate] = []
            seen: set[str] = set()
            fails = 0
            max_fails = self.population_size * self.genetic_max_fail_count
            while len(children) < self.population_size and fails < max_fails:
                parent = population[int(ctx.rng.choice(len(population), p=probs))]
                if ctx.rng.random() < self.genetic_mutate_prob:
                    sch = ctx.space.mutate(parent.trace, ctx.func, ctx.target, ctx.rng,
                                           ctx.shape_vars or None)
                    child = self._candidate(sch, "mutation")
                    if child is None:
                        self.stats["mutate_failed"] += 1
                        fails += 1
                        continue
                    self.stats["mutated"] += 1
                    if child.shash in pool:       # seen before: reuse its features and score
                        child = pool[child.shash]
                else:
                    child = parent
                if child.shash in seen:
                    self.stats["duplicates"] += 1
                    fails += 1
                    continue
                seen.add(child.shash)
                children.append(child)
            if not children:
                break
            population = children
        self._score(population)
        for c in population:
            if not self._is_measured(c):
                pool.setdefault(c.shash, c)
        return population

    # -- the batch ------------------------------------------------------------------------------
    def generate_candidates(self, num: int) -> list[Candidate]:
        """The next ``num`` (or fewer, when the space runs out) unmeasured candidates."""
        if self.ctx is None:
            raise TuneError("EvolutionarySearch.generate_candidates before initialize(ctx)")
        if num <= 0 or self.exhausted:
            return []
        n_db = int(self.population_size * self.init_measured_ratio)
        population = self._from_database(n_db)
        seen = {c.shash for c in population}
        for c in self.seeds:
            if c.shash not in seen:
                seen.add(c.shash)
                population.append(c)
        n_random = max(self.population_size - len(population), self.init_min_unmeasured)
        randoms = self._random(n_random, seen)
        population += randoms
        if not population:
            self.exhausted = True
            return []
        pool: dict[str, Candidate] = {}
        if self.tunable and self.genetic_num_iters > 0:
            self._evolve(population, pool)
        else:
            self._score(population)
            for c in population:
                if not self._is_measured(c):
                    pool.setdefault(c.shash, c)
        ranked = sorted(pool.values(), key=lambda c: -c.score)
        # seeds not measured yet go first, whatever the (still untrained) model says
        first = [c for c in self.seeds if not self._is_measured(c)][:num]
        if first:
            shashes = {c.shash for c in first}
            num -= len(first)
            ranked = [c for c in ranked if c.shash not in shashes]
            randoms = [c for c in randoms if c.shash not in shashes]
            if num == 0:
                return first
        n_random_pick = int(round(num * self.eps_greedy)) if len(ranked) > num else 0
        picks = ranked[:num - n_random_pick]
        chosen = {c.shash for c in picks}
        rest = [c for c in randoms if c.shash not in chosen and not self._is_measured(c)]
        order = self.ctx.rng.permutation(len(rest)) if rest else []
        for i in order[:n_random_pick]:
            picks.append(rest[int(i)])
            chosen.add(rest[int(i)].shash)
        for c in ranked[num - n_random_pick:]:      # top up when the random share ran short
            if len(picks) >= num:
                break
            if c.shash not in chosen:
                picks.append(c)
                chosen.add(c.shash)
        picks = first + picks
        if not picks:
            self.exhausted = True
        return picks

    def notify(self, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        """Record measured candidates and teach the cost model their run times."""
        if len(candidates) != len(results):
            raise ValueError(f"notify: {len(candidates)} candidates but {len(results)} results")
        for c in candidates:
            self.measured.add(c.shash)
            self.measured_traces.add(trace_key(c.trace))
        if candidates:
            self.ctx.cost_model.update_features(
                [c.features for c in candidates],
                [r.mean_secs if r.ok else None for r in results], group=self.ctx.group)


# ---------------------------------------------------------------------------------------------
# measurement


def measure_candidates(ctx: TuneContext, candidates: Sequence[Candidate], builder, runner,
                       logger: logging.Logger | None = None) -> list[MeasureResult]:
    """Build and run ``candidates``, check them against ``ctx.reference``, commit a record per
    candidate to ``ctx.database``; the results, in order.

    Raises
    ------
    TuneError
        When the builder or runner itself fails (raises) rather than a candidate.
    """
    if not candidates:
        return []
    built = build_candidates(ctx.name, ctx.target, candidates, builder)
    return run_candidates(ctx, candidates, built, runner, logger)


def build_candidates(name: str, target: Target, candidates: Sequence[Candidate],
                     builder) -> list:
    """``builder.build`` of the candidates' modules (``BuilderResult`` s, in order).

    Several tasks' candidates may go to one call (the builder's workers build them in
    parallel), then ``run_candidates`` per task.

    Raises
    ------
    TuneError
        When the builder itself fails (raises) rather than a candidate.
    """
    if not candidates:
        return []
    try:
        return builder.build([BuilderInput(c.sch.mod, target) for c in candidates])
    except Exception as err:  # noqa: BLE001
        raise TuneError(f"{name}: the builder {type(builder).__name__} failed: "
                        f"{type(err).__name__}: {err}") from err


def run_candidates(ctx: TuneContext, candidates: Sequence[Candidate], built: Sequence,
                   runner, logger: logging.Logger | None = None) -> list[MeasureResult]:
    """Run built ``candidates`` (``build_candidates``), check them against ``ctx.reference``
    and commit a record per candidate; the results, in order (see ``measure_candidates``)."""
    log = logger or LOG
    if len(built) != len(candidates):
        raise ValueError(f"run_candidates: {len(candidates)} candidates but {len(built)} "
                         f"build results")
    results: list[MeasureResult | None] = [None] * len(candidates)
    run_idx, run_inputs = [], []
    for i, b in enumerate(built):
        if b.error_msg is not None or b.artifact_path is None:
            results[i] = MeasureResult(None, f"build error: {b.error_msg}")
        else:
            run_idx.append(i)
            run_inputs.append(RunnerInput(b.artifact_path, ctx.target, list(ctx.args_info),
                                          dict(ctx.shape_vars), ctx.seed, ctx.reference))
    if run_inputs:
        try:
            ran = runner.run(run_inputs)
        except Exception as err:  # noqa: BLE001
            raise TuneError(f"{ctx.name}: the runner {type(runner).__name__} failed: "
                            f"{type(err).__name__}: {err}") from err
        for i, r in zip(run_idx, ran):
            if r.error_msg is None and r.run_secs:
                results[i] = MeasureResult([float(t) for t in r.run_secs],
                                           checked=bool(getattr(r, "checked", False)))
            else:
                results[i] = MeasureResult(None, r.error_msg or "no run time", bool(r.wrong),
                                           checked=bool(r.wrong))
    unchecked = sum(1 for r in results if r.ok and not r.checked)
    if unchecked and not ctx.warned_unchecked:
        ctx.warned_unchecked = True
        why = ("no reference output could be computed for it" if ctx.reference is None else
               f"the runner {type(runner).__name__} did not check them")
        log.warning("%s: candidates are measured WITHOUT a correctness check (%s); their "
                    "records say checked=false", ctx.name, why)
    now = time.time()
    for c, r in zip(candidates, results):
        ctx.database.commit_tuning_record(TuningRecord(
            trace=c.trace, workload=ctx.workload, target=target_key(ctx.target),
            run_secs=r.run_secs if r.ok else None, args_info=list(ctx.args_info),
            shape_vars=dict(ctx.shape_vars) or None, error=r.error, timestamp=now,
            checked=r.checked))
        if r.wrong:
            log.warning("%s: rejected a wrong candidate (%s); trace:\n%s", ctx.name, r.error,
                        c.trace)
        elif not r.ok:
            log.info("%s: candidate failed: %s", ctx.name, r.error)
    return results
