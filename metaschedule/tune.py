"""Tuning drivers: ``tune_tir`` (one kernel), ``tune_tasks`` (many, with a task scheduler),
``apply_best`` (the tuned schedule of a kernel).

A tuning run works in ``work_dir``:

* ``workloads.json`` / ``records.json`` — the ``Database``: every measured candidate, failed
  and wrong ones included (so they are never measured again). A second run with the same
  ``work_dir`` resumes: its search starts from the best records, and its trials come on top.
* ``remeasured.json`` — per task, its best candidates and baseline timed again at the end of a
  run and the schedule selected (``Database.get_remeasurements``; see ``tune_tasks``'s
  ``remeasure``): the record ``apply_best`` / ``relax.build`` use.
* ``tune.log`` — what happened: tasks, batches, best times, rejected candidates, the
  re-measurements, a summary.
* ``tasks.json`` — the tasks (name, workload hash, weight, flop, shape hints), which
  ``plot_tuning_curve`` uses to label and scale its curves; updated under the records' lock
  (``Database.merge_tasks``), so tuners sharing a ``work_dir`` keep each other's tasks.

Every record says whether the candidate's outputs were checked (``TuningRecord.checked``):
against the unscheduled function's outputs on the same inputs (or ``Task.reference``). When no
reference can be computed, the candidates are still measured, their records say
``checked: false``, and ``tune.log`` warns for that task.
* ``cost_model.npz`` — the XGBoost model and its training data, reloaded on resume.

Dynamic shapes: a kernel with symbolic extents is tuned at representative values
(``shape_hints``, e.g. ``{"n": 64}``; a missing one is ``DEFAULT_SHAPE_HINT``). Tile sizes are
drawn, features computed and candidates measured at those values, but the traces never depend
on them (splits keep a free outer factor and guard tails), so the winning schedule is correct
for every value of ``n``.

Examples
--------
>>> from tilecraft.tensorir import te
>>> from tilecraft import metaschedule
>>> A = te.placeholder((512, 512), "float32", "A")
>>> B = te.placeholder((512, 512), "float32", "B")
>>> k = te.reduce_axis((0, 512), "k")
>>> C = te.compute((512, 512), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
>>> db = metaschedule.tune_tir(te.create_prim_func([A, B, C]), "llvm", max_trials=64,
...                            work_dir="tune_gemm")                    # doctest: +SKIP
>>> sch = metaschedule.apply_best(db, te.create_prim_func([A, B, C]), "llvm")  # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from tilecraft.targets import Target
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.schedule import Schedule

from .arg_info import output_indices, random_inputs
from .builder import ARTIFACT_PREFIX, BuilderResult, LocalBuilder, remove_artifact
from .cost_model import CostModel, RandomModel, XGBModel
from .database import (TASKS_FILE, Database, Remeasurement, TuningRecord, target_key,
                       workload_hash)
from .database import read_tasks_file  # noqa: F401 - its home was here (plot imports it)
from .errors import TuneError
from .feature import count_flop
from .progress import Progress
from .runner import LocalRunner
from .search import (Candidate, EvolutionarySearch, LOG, MeasureResult, TuneContext,
                     build_candidates, compute_reference, lift_tiles, measure_candidates,
                     run_candidates, trace_key)
from .space_generator import (DEFAULT_SHAPE_HINT, SpaceGenerator, default_space,
                              resolve_shape_hints, shape_vars as symbolic_vars)
from .task_scheduler import TaskScheduler, make_task_scheduler

__all__ = ["Task", "tune_tir", "tune_tasks", "apply_best", "baseline_record",
           "DEFAULT_SHAPE_HINT", "DEFAULT_REMEASURE", "DEFAULT_REMEASURE_ROUNDS",
           "DEFAULT_REMEASURE_MARGIN",
           "TASKS_FILE", "LOG_FILE", "COST_MODEL_FILE"]

LOG_FILE = "tune.log"
COST_MODEL_FILE = "cost_model.npz"

# the re-measurement at the end of a run (tune_tasks' remeasure, remeasure_rounds,
# remeasure_margin): ResNet-50's best records summed to 46.1 ms in the tuner and the model
# built with them ran in 52.2 ms, slower than the untuned 50.1 (docs/tuning.md)
DEFAULT_REMEASURE = 4
DEFAULT_REMEASURE_ROUNDS = 5
DEFAULT_REMEASURE_MARGIN = 0.03


def _as_func(func) -> PrimFunc:
    if isinstance(func, PrimFunc):
        return func
    if isinstance(func, IRModule):
        prims = {k: v for k, v in func.functions.items() if isinstance(v, PrimFunc)}
        if len(prims) == 1:
            return next(iter(prims.values()))
        if "main" in prims:
            return prims["main"]
        raise TuneError(f"the module has {len(prims)} PrimFuncs and none is 'main'; tune them "
                        f"as separate tasks")
    raise TuneError(f"expected a PrimFunc (or a module of one), got {type(func).__name__}")


@dataclass
class Task:
    """A kernel to tune.

    Parameters
    ----------
    name : str
        Shown in the progress line and the log.
    func : PrimFunc
        The unscheduled kernel.
    weight : int
        How often the kernel runs per call of the model (the task scheduler weighs its
        latency by it).
    shape_hints : dict[str, int], optional
        Representative values of its symbolic dims.
    flop : float, optional
        Floating-point operations per call, at the shape hints; counted from the IR when
        None.
    baseline : Schedule, optional
        The schedule the kernel gets without a tuning record (``relax.extract_tasks`` gives
        the default CPU schedule). ``tune_tasks`` measures it first, like any candidate: its
        record (a trace replaying to that schedule) is in the database, so a tuned record is
        the best — and is what ``relax.build`` / ``apply_best`` use — only where it measured
        faster than the baseline (and, re-measured with it at the end of the run, beat it by
        the margin: ``tune_tasks``' ``remeasure``); and the search and the task scheduler
        start from its time.
        Its constant splits are lifted into tile decisions (``search.lift_tiles``: the same
        program), so the search's initial population holds it and mutates its tile sizes.
    reference : callable, optional
        ``reference(*arrays) -> list of arrays``: the kernel's outputs from its argument arrays
        (numpy), which candidates are checked against instead of the outputs of the
        unscheduled function built for the CPU -- for kernels too large for that (a GEMM
        4096^3 takes that build a quarter of an hour): ``lambda a, b, c: [a @ b]``.

    Examples
    --------
    >>> t = Task("gemm", func, weight=2)                 # doctest: +SKIP
    >>> t.flop                                           # doctest: +SKIP
    268435456.0
    """

    name: str
    func: PrimFunc
    weight: int = 1
    shape_hints: dict | None = None
    flop: float | None = None
    baseline: Schedule | None = None
    reference: object = None

    def __post_init__(self):
        self.func = _as_func(self.func)
        if self.baseline is not None and not isinstance(self.baseline, Schedule):
            raise TypeError(f"Task {self.name}: baseline must be a tensorir Schedule of the "
                            f"task's function, got {type(self.baseline).__name__}")
        if self.baseline is not None:
            # the same program, with its constant splits as tile decisions the search mutates
            self.baseline = lift_tiles(self.func, self.baseline)
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, np.integer)) \
                or self.weight < 1:
            raise ValueError(f"Task {self.name}: weight must be an int >= 1, got "
                             f"{self.weight!r}")
        self.shape_hints = resolve_shape_hints(self.func, self.shape_hints)
        if self.flop is None:
            self.flop = count_flop(self.func, self.shape_hints)


# ---------------------------------------------------------------------------------------------
# work_dir files


class _LogFile:
    """Attach ``work_dir/tune.log`` to the ``metaschedule`` logger for the run."""

    def __init__(self, work_dir: str):
        self.handler = logging.FileHandler(os.path.join(work_dir, LOG_FILE), encoding="utf-8")
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self.handler.setLevel(logging.INFO)
        self.logger = LOG
        self.saved_level = LOG.level

    def __enter__(self) -> logging.Logger:
        self.logger.addHandler(self.handler)
        if self.logger.level == logging.NOTSET or self.logger.level > logging.INFO:
            self.logger.setLevel(logging.INFO)
        return self.logger

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.saved_level)
        self.handler.close()


def _make_cost_model(cost_model, work_dir: str, seed: int, log) -> CostModel:
    if isinstance(cost_model, CostModel):
        return cost_model
    if cost_model == "random":
        return RandomModel(seed=seed)
    if cost_model != "xgb":
        raise ValueError(f"cost_model must be 'xgb', 'random' or a CostModel, got "
                         f"{cost_model!r}")
    model = XGBModel(seed=seed)
    path = os.path.join(work_dir, COST_MODEL_FILE)
    if os.path.exists(path):
        try:
            model.load(path)
            log.info("cost model: resumed from %s (%d measured candidates)", path,
                     model.num_samples)
        except (ValueError, OSError) as err:
            warnings.warn(f"{path}: cannot be loaded ({err}); starting a fresh cost model",
                          RuntimeWarning, stacklevel=3)
            model = XGBModel(seed=seed)
    return model


# ---------------------------------------------------------------------------------------------
# the drivers


@dataclass
class _TaskState:
    task: Task
    ctx: TuneContext
    search: EvolutionarySearch
    trials: int = 0
    best_secs: float = math.inf
    history: list = field(default_factory=list)
    done: bool = False
    ok_ever: bool = False
    baseline_secs: float | None = None
    remeasured: bool = False


def tune_tasks(tasks: Sequence[Task], target, max_trials: int, *, work_dir,
               num_trials_per_iter: int = 64, max_trials_per_task: int | None = None,
               builder=None, runner=None, cost_model="xgb", space: SpaceGenerator | None = None,
               search: EvolutionarySearch | dict | None = None,
               task_scheduler: "str | TaskScheduler" = "gradient", seed: int | None = None,
               progress: bool = True, remeasure: int = DEFAULT_REMEASURE,
               remeasure_rounds: int = DEFAULT_REMEASURE_ROUNDS,
               remeasure_margin: float = DEFAULT_REMEASURE_MARGIN) -> Database:
    """Tune several kernels with one trial budget; the tuning database.

    At the end of the run each task's ``remeasure`` best distinct records are built again
    and timed together with its baseline, interleaved (each round runs them all, in a
    rotated order), for ``remeasure_rounds`` rounds; a candidate's time is the median of its
    rounds. The fastest candidate is selected only if it beats the baseline by
    ``remeasure_margin``, else the baseline is (and ``relax.build`` keeps the default
    schedule); without a baseline the median-fastest is selected. The selection is committed
    as a ``Remeasurement`` and is what ``apply_best`` / ``Database.query_schedule`` return:
    the best record of the search alone is the minimum of many noisy measurements, often a
    lucky draw rather than a faster schedule. The re-measurement does not count as trials.

    Parameters
    ----------
    tasks : list of Task
    target : Target | str
    max_trials : int
        Trials (measured candidates) of this run, over all tasks.
    work_dir : str | os.PathLike
        Where the database, ``tune.log``, ``tasks.json`` and the cost model live.
    num_trials_per_iter : int
        Candidates measured per batch.
    max_trials_per_task : int, optional
        A cap per task (default: none beyond ``max_trials``).
    builder, runner : optional
        Default ``LocalBuilder()`` and ``LocalRunner()``; an ``RPCRunner`` measures on boards.
    cost_model : "xgb" | "random" | CostModel
    space : SpaceGenerator, optional
        Default ``default_space(target)``.
    search : EvolutionarySearch | dict, optional
        The search (one per task is made from it) or its keyword arguments.
    task_scheduler : "gradient" | "round-robin" | TaskScheduler
    seed : int, optional
    progress : bool
        Show a live line per task.
    remeasure : int
        How many of each task's best distinct records to re-measure at the end (default 4);
        0 turns the re-measurement off (then the fastest record is the best, as measured).
    remeasure_rounds : int
        Rounds of the re-measurement (each runs every candidate once, with the runner's
        repeats).
    remeasure_margin : float
        The speedup over the baseline a candidate needs to be selected (0.03: 3% faster).

    Returns
    -------
    Database
        ``relax.build(mod, target, database=db)`` and ``apply_best`` read it.

    Raises
    ------
    TuneError
        For a target the design space does not support, or when every candidate of a
        task's first batch failed to build (a broken toolchain) or to run (an unreachable
        board, a broken runtime).

    Examples
    --------
    >>> db = tune_tasks([Task("gemm", func, baseline=sch)], "llvm", 256, work_dir="tune/",
    ...                 remeasure=4, remeasure_margin=0.05)              # doctest: +SKIP
    >>> db.get_remeasurements(func, "llvm")[-1].selected                # doctest: +SKIP
    2
    """
    if not tasks:
        raise TuneError("tune_tasks: no tasks to tune")
    if isinstance(max_trials, bool) or not isinstance(max_trials, (int, np.integer)) or \
            max_trials < 1:
        raise ValueError(f"max_trials must be an int >= 1, got {max_trials!r}")
    if num_trials_per_iter < 1:
        raise ValueError(f"num_trials_per_iter must be >= 1, got {num_trials_per_iter}")
    remeasure_cfg = _check_remeasure(remeasure, remeasure_rounds, remeasure_margin)
    target = target if isinstance(target, Target) else Target(target)
    space = space if space is not None else default_space(target)   # TuneError if unsupported
    seed = int(np.random.SeedSequence().entropy % (2**31)) if seed is None else int(seed)
    work_dir = os.path.abspath(os.fspath(work_dir))
    os.makedirs(work_dir, exist_ok=True)
    db = Database(work_dir)
    search_kwargs = search if isinstance(search, dict) else {}
    with _LogFile(work_dir) as log:
        log.info("tuning %d task(s) for %s: %d trials, %d per batch, seed %d, work_dir %s",
                 len(tasks), target, max_trials, num_trials_per_iter, seed, work_dir)
        model = _make_cost_model(cost_model, work_dir, seed, log)
        own_builder, own_runner = builder is None, runner is None
        builder = builder if builder is not None else LocalBuilder()
        runner = runner if runner is not None else LocalRunner()
        try:
            return _tune(tasks, target, max_trials, work_dir, num_trials_per_iter,
                         max_trials_per_task, builder, runner, model, space, search,
                         search_kwargs, task_scheduler, seed, progress, db, log,
                         remeasure_cfg)
        finally:
            if own_builder:
                builder.close()
            if own_runner:
                runner.close()


def _tune(tasks, target, max_trials, work_dir, per_iter, per_task, builder, runner, model,
          space, search, search_kwargs, task_scheduler, seed, progress, db, log,
          remeasure_cfg) -> Database:
    start = time.time()
    states: list[_TaskState] = []
    entries = []
    for i, task in enumerate(tasks):
        if not isinstance(task, Task):
            raise TypeError(f"tune_tasks: tasks[{i}] is a {type(task).__name__}, not a Task")
        ctx = TuneContext(task.func, target, space, model, db, dict(task.shape_hints),
                          name=task.name, seed=seed + i, flop=task.flop)
        s = EvolutionarySearch(**search_kwargs) if not isinstance(search, EvolutionarySearch) \
            else _copy_search(search)
        s.initialize(ctx)                     # TuneError for an unsupported target
        ctx.reference = compute_reference(task.func, ctx.args_info, ctx.seed, ctx.shape_vars) \
            if task.reference is None else _reference_of(task, ctx)
        st = _TaskState(task, ctx, s)
        top = db.get_top_k(ctx.workload, target, 1)
        if top:
            st.best_secs = top[0].mean_secs
            st.ok_ever = True
            st.history.append(st.best_secs)   # the scheduler starts from it: no warm-up round
            log.info("%s: resuming; the database's best is %.4g ms", task.name,
                     st.best_secs * 1e3)
        if not s.tunable:
            warnings.warn(f"{task.name}: nothing to tune (its design space is a single "
                          f"schedule); measuring that schedule once", RuntimeWarning,
                          stacklevel=3)
            log.warning("%s: nothing to tune; measuring its only schedule", task.name)
        hints = f", shape hints {task.shape_hints}" if task.shape_hints else ""
        log.info("task %d: %s (workload %s, weight %d, %.4g GFLOP%s, %d design space(s))",
                 i, task.name, ctx.workload.shash, task.weight, task.flop / 1e9, hints,
                 len(s.spaces))
        states.append(st)
        entries.append({"name": task.name, "shash": ctx.workload.shash, "weight": task.weight,
                        "flop": task.flop, "shape_hints": task.shape_hints,
                        "target": target_key(target)})
    db.merge_tasks(entries)        # under the records' lock: other tuners' tasks stay
    total = _measure_baselines(states, target, builder, runner, db, log)
    totals = [min(max_trials, per_task) if per_task else max_trials for _ in states]
    if len(states) > 1 and not per_task:
        share = sum(t.weight for t in tasks)
        totals = [max(1, round(max_trials * t.weight / share)) for t in tasks]  # for the ETA
    prog = Progress([s.task.name for s in states], totals, [s.task.flop for s in states],
                    enabled=progress)
    sched = make_task_scheduler(task_scheduler, seed)
    try:
        while total < max_trials:
            i = sched.next_task([s.history for s in states], [s.task.weight for s in states],
                                [s.done for s in states])
            if i is None:
                break
            st = states[i]
            n = min(per_iter, max_trials - total)
            if per_task:
                n = min(n, per_task - st.trials)
            if n <= 0:
                st.done = True
                continue
            t0 = time.time()
            control = _control(st) if n > 1 else None
            cands = st.search.generate_candidates(n - 1 if control is not None else n)
            t_search = time.time() - t0
            if not cands:
                st.done = True
                if st.trials == 0 and not st.ok_ever:
                    why = getattr(space, "last_rejection", None)
                    msg = (f"{st.task.name}: the design space gave no valid schedule to "
                           f"measure" + (f" (last rejection: {why})" if why else ""))
                    warnings.warn(msg, RuntimeWarning, stacklevel=3)
                    log.warning("%s", msg)
                else:
                    log.info("%s: the design space is exhausted after %d trials", st.task.name,
                             st.trials)
                if not st.history:
                    st.history.append(st.best_secs)
                continue
            t0 = time.time()
            if control is not None:
                # the baseline again, in the same batch: measured beside the candidates, under
                # the same load, so a candidate beats it by speed, not by a quieter minute
                results = measure_candidates(st.ctx, cands + [control], builder, runner, log)
                ctl = results.pop()
                if ctl.ok:
                    st.baseline_secs = min(st.baseline_secs or math.inf, ctl.mean_secs)
                    st.best_secs = min(st.best_secs, ctl.mean_secs)
                st.trials += 1
                total += 1
            else:
                results = measure_candidates(st.ctx, cands, builder, runner, log)
            t_measure = time.time() - t0
            st.search.notify(cands, results)
            st.trials += len(cands)
            total += len(cands)
            ok = [r for r in results if r.ok]
            _check_runner(st, results, runner)
            if ok:
                st.ok_ever = True
                st.best_secs = min(st.best_secs, min(r.mean_secs for r in ok))
            st.history.append(st.best_secs)
            if per_task and st.trials >= per_task:
                st.done = True
            n_wrong = sum(r.wrong for r in results)
            n_fail = len(results) - len(ok) - n_wrong
            log.info("%s: batch of %d (%d ok, %d failed, %d wrong): search %.1fs, measure "
                     "%.1fs", st.task.name, len(cands), len(ok), n_fail, n_wrong, t_search,
                     t_measure)
            line = prog.update(i, st.trials, st.best_secs, total, max_trials)
            log.info("%s", line)
            if isinstance(model, XGBModel):
                model.save(os.path.join(work_dir, COST_MODEL_FILE))
    finally:
        prog.close()
    if remeasure_cfg is not None:
        _remeasure(states, target, builder, runner, db, log, *remeasure_cfg)
    elapsed = time.time() - start
    rate = total / elapsed * 60 if elapsed > 0 else 0.0
    log.info("done: %d trials in %.1fs (%.1f trials/min)", total, elapsed, rate)
    for st in states:
        best = f"{st.best_secs * 1e3:.4g} ms" if math.isfinite(st.best_secs) else "none"
        gf = f", {st.task.flop / st.best_secs / 1e9:.4g} GFLOP/s" \
            if math.isfinite(st.best_secs) and st.task.flop else ""
        base = ""
        if st.baseline_secs is not None and math.isfinite(st.best_secs):
            speedup = st.baseline_secs / st.best_secs
            base = f", baseline {st.baseline_secs * 1e3:.4g} ms (x{speedup:.3g})"
        how = " (re-measured)" if st.remeasured else ""
        log.info("  %s: %d trials, best %s%s%s%s", st.task.name, st.trials, best, gf, base,
                 how)
        if not st.ok_ever:
            warnings.warn(f"{st.task.name}: no candidate ran correctly in {st.trials} trials; "
                          f"see {os.path.join(work_dir, LOG_FILE)} (relax.build falls back to "
                          f"the default schedule)", RuntimeWarning, stacklevel=3)
    return db


def _reference_of(task: Task, ctx: TuneContext) -> list[np.ndarray]:
    arrays = random_inputs(ctx.args_info, ctx.seed)
    outs = [np.asarray(o) for o in task.reference(*arrays)]
    n_out = len(output_indices(task.func))
    if len(outs) != n_out:
        raise TuneError(f"{task.name}: reference gave {len(outs)} output(s), the function has "
                        f"{n_out}")
    return outs


def baseline_record(db: Database, task: Task, target) -> TuningRecord | None:
    """The record of ``task``'s baseline schedule in ``db`` (None without a baseline or
    before it was measured): its re-measured time (``run_secs`` ``[the median]``) where the
    latest re-measurement of the task has it -- comparable with ``query_tuning_record``'s
    selection --, else its fastest record.

    Examples
    --------
    >>> rec = baseline_record(db, task, "llvm")          # doctest: +SKIP
    >>> rec.mean_secs                                   # doctest: +SKIP
    0.00123
    """
    if task.baseline is None:
        return None
    key = trace_key(task.baseline.trace)
    shash, tkey = workload_hash(task.func), target_key(target)
    remeasured = db.get_remeasurements(task.func, target)
    if remeasured:
        last = remeasured[-1]
        if last.baseline is not None and trace_key(last.traces[last.baseline]) == key and \
                math.isfinite(last.median_secs(last.baseline)):
            return last.baseline_record
    found = None
    for rec in db.get_all_tuning_records():
        if rec.workload.shash == shash and rec.target == tkey and trace_key(rec.trace) == key:
            # the fastest of its measurements (it is measured again in each batch, as the
            # candidates' best is the fastest of many)
            if found is None or rec.mean_secs < found.mean_secs or not found.ok:
                found = rec
    return found


def _measure_baselines(states: list[_TaskState], target, builder, runner, db: Database,
                       log) -> int:
    """Measure every task's baseline schedule not measured yet (all built in one builder call,
    so in parallel); set each task's ``best_secs`` / ``baseline_secs``. Returns how many were
    measured (they count as trials)."""
    todo = []
    for st in states:
        if st.task.baseline is None:
            continue
        cand = st.search.baseline_candidate(st.task.baseline)
        if cand is not None:
            todo.append((st, cand))
        else:                                     # measured by an earlier run
            rec = baseline_record(db, st.task, target)
            if rec is not None:
                st.baseline_secs = rec.mean_secs
    if not todo:
        return 0
    t0 = time.time()
    built = build_candidates("baselines", target, [c for _, c in todo], builder)
    for (st, cand), b in zip(todo, built):
        res, = run_candidates(st.ctx, [cand], [b], runner, log)
        st.search.notify([cand], [res])           # the cost model learns it; never re-measured
        st.baseline_secs = res.mean_secs
        if res.ok:
            st.ok_ever = True
            st.best_secs = min(st.best_secs, res.mean_secs)
            # the task scheduler's first round: it has a time, so no warm-up batch is spent on
            # it; trials go where weight x latency is largest (not to a reshape first)
            if st.history:
                st.history[-1] = st.best_secs
            else:
                st.history.append(st.best_secs)
            log.info("%s: baseline (default schedule) %.4g ms", st.task.name,
                     res.mean_secs * 1e3)
        else:
            log.warning("%s: the baseline schedule failed: %s", st.task.name, res.error)
    log.info("measured %d baseline schedule(s) in %.1fs", len(todo), time.time() - t0)
    return len(todo)


def _control(st: _TaskState) -> Candidate | None:
    """The task's baseline as the control of a batch (measured again beside the candidates),
    or None without a measured baseline."""
    if st.task.baseline is None or st.baseline_secs is None or \
            not math.isfinite(st.baseline_secs):
        return None
    return Candidate(st.task.baseline, workload_hash(st.task.baseline.func),
                     np.zeros((1, 0), np.float32), source="control")


# ---------------------------------------------------------------------------------------------
# re-measuring the best candidates


def _check_remeasure(top, rounds, margin) -> tuple[int, int, float] | None:
    """``(top, rounds, margin)`` checked, or None when the re-measurement is off."""
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 0:
        raise ValueError(f"remeasure must be an int >= 0 (0: off), got {top!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ValueError(f"remeasure_rounds must be an int >= 1, got {rounds!r}")
    if isinstance(margin, bool) or not isinstance(margin, (int, float, np.floating)) or \
            not 0 <= margin < 1:
        raise ValueError(f"remeasure_margin must be a number in [0, 1), got {margin!r}")
    return (int(top), int(rounds), float(margin)) if top else None


class _RecordSink:
    """Stands in for the database while ``run_candidates`` runs the re-measurement rounds:
    each round's times are not trials (they would again be single noisy measurements, and
    the minimum of them the best); they go to the database as one ``Remeasurement``."""

    def commit_tuning_record(self, record: TuningRecord) -> None:
        pass


def _remeasure_contenders(st: _TaskState, target, db: Database, top: int):
    """``(traces, candidates, baseline index)``: the task's ``top`` fastest distinct programs
    in ``db`` (its baseline left out) and, when it ran, the baseline -- each replayed on the
    task's function as ``query_schedule`` would."""
    func = st.ctx.func
    traces, cands, seen = [], [], set()

    def add(trace, source) -> bool:
        try:
            sch = trace.apply(func)
            shash = workload_hash(sch.func)
        except Exception as err:  # noqa: BLE001 - a record that no longer replays
            LOG.debug("%s: a record does not replay for the re-measurement: %s", st.task.name,
                      err)
            return False
        if shash in seen:              # another trace of a program already in
            return False
        seen.add(shash)
        traces.append(trace)
        cands.append(Candidate(sch, shash, np.zeros((1, 0), np.float32), source=source))
        return True

    base_idx = None
    base = baseline_record(db, st.task, target) if st.task.baseline is not None else None
    if base is not None and base.ok and add(st.task.baseline.trace, "baseline"):
        base_idx = 0
    base_key = trace_key(st.task.baseline.trace) if st.task.baseline is not None else None
    n_tuned = 0
    for rec in db.get_top_k(st.ctx.workload, target, len(db)):
        if n_tuned >= top:
            break
        if base_key is not None and trace_key(rec.trace) == base_key:
            continue
        if add(rec.trace, "remeasure"):
            n_tuned += 1
    return traces, cands, base_idx


def _remeasure(states: list[_TaskState], target, builder, runner, db: Database, log,
               top: int, rounds: int, margin: float) -> None:
    """Re-measure every task's best candidates with its baseline and commit the selection
    (see ``tune_tasks``). All builds go to one builder call first, so the builder is idle
    while the rounds run."""
    plans = []
    for st in states:
        if not st.ok_ever:
            continue
        traces, cands, base_idx = _remeasure_contenders(st, target, db, top)
        n_tuned = len(cands) - (base_idx is not None)
        if n_tuned == 0 or len(cands) < 2:
            log.info("%s: nothing to re-measure (%d tuned candidate(s)%s)", st.task.name,
                     n_tuned, ", no baseline" if base_idx is None else "")
            continue
        plans.append((st, traces, cands, base_idx))
    if not plans:
        return
    t0 = time.time()
    built = build_candidates("re-measurement", target,
                             [c for _, _, cands, _ in plans for c in cands], builder)
    pos = 0
    for st, traces, cands, base_idx in plans:
        mine = built[pos:pos + len(cands)]
        pos += len(cands)
        _remeasure_task(st, traces, cands, mine, base_idx, runner, db, log, rounds, margin)
    log.info("re-measured %d task(s) in %.1fs (%d rounds each)", len(plans), time.time() - t0,
             rounds)


def _median(xs) -> float:
    return float(np.median(xs))


def _artifact_copy(b: BuilderResult) -> BuilderResult:
    """A copy of a built artifact in a directory of its own, for one round: runners remove
    the artifact they ran (``cleanup``), and building again for every round would cost what
    the trials cost. An artifact outside a builder's directory (which no runner removes) is
    used as it is."""
    d = os.path.dirname(os.path.abspath(b.artifact_path))
    if not os.path.basename(d).startswith(ARTIFACT_PREFIX):
        return b
    new = tempfile.mkdtemp(prefix=ARTIFACT_PREFIX, dir=os.path.dirname(d))
    shutil.copytree(d, new, dirs_exist_ok=True)
    return BuilderResult(os.path.join(new, os.path.basename(b.artifact_path)), None,
                         b.build_secs)


def _remeasure_task(st: _TaskState, traces, cands, built, base_idx, runner, db: Database, log,
                    rounds: int, margin: float) -> None:
    n = len(cands)
    run_secs: list[list[float] | None] = [[] for _ in range(n)]
    errors: list[str | None] = [None] * n
    live = []
    for i, b in enumerate(built):
        if b.error_msg is not None or b.artifact_path is None:
            errors[i], run_secs[i] = f"build error: {b.error_msg}", None
        else:
            live.append(i)
    sink_ctx = dataclasses.replace(st.ctx, database=_RecordSink())
    try:
        for r in range(rounds):
            # interleaved: every round runs them all, each round in an order rotated by one,
            # so a slow minute of the machine falls on all of them and none always runs first
            order = [i for i in live[r % len(live):] + live[:r % len(live)]
                     if errors[i] is None] if live else []
            results = run_candidates(sink_ctx, [cands[i] for i in order],
                                     [_artifact_copy(built[i]) for i in order], runner, log)
            for i, res in zip(order, results):
                if res.ok:
                    run_secs[i].append(_median(res.run_secs))
                else:                  # failed once: not reliable enough to select
                    errors[i], run_secs[i] = res.error or "failed", None
    finally:
        for b in built:
            remove_artifact(b.artifact_path)
    medians = [_median(t) if errors[i] is None and t else math.inf
               for i, t in enumerate(run_secs)]
    tuned = [i for i in range(n) if i != base_idx and math.isfinite(medians[i])]
    base_ok = base_idx is not None and math.isfinite(medians[base_idx])
    name = st.task.name
    n_tuned = n - (base_idx is not None)
    if not tuned and not base_ok:
        log.warning("%s: every re-measured schedule failed (%s); the selection is left as it "
                    "was", name, next(e for e in errors if e))
        return
    best = min(tuned, key=lambda i: medians[i]) if tuned else None
    if base_idx is None:
        selected = best
        log.info("%s: re-measured top %d among themselves (no baseline, %d rounds): selected "
                 "%.4g ms (median)", name, n_tuned, rounds, medians[best] * 1e3)
    elif not base_ok:
        selected = best
        log.warning("%s: the baseline failed in the re-measurement (%s); selected the "
                    "median-fastest of top %d, %.4g ms", name, errors[base_idx], n_tuned,
                    medians[best] * 1e3)
    elif best is None:
        selected = base_idx
        log.info("%s: re-measured top %d vs baseline: every candidate failed (%s): the default "
                 "schedule stays", name, n_tuned, next(e for e in errors if e))
    else:
        speedup = medians[base_idx] / medians[best]
        if speedup >= 1 + margin:
            selected = best
            log.info("%s: re-measured top %d vs baseline (%d rounds): best x%.3g (%.4g vs "
                     "%.4g ms), kept", name, n_tuned, rounds, speedup, medians[best] * 1e3,
                     medians[base_idx] * 1e3)
        else:
            selected = base_idx
            log.info("%s: re-measured top %d vs baseline (%d rounds): best x%.3g (%.4g vs "
                     "%.4g ms); no candidate beat the baseline by %g%%: the default schedule "
                     "stays", name, n_tuned, rounds, speedup, medians[best] * 1e3,
                     medians[base_idx] * 1e3, round(margin * 100, 2))
    db.commit_remeasurement(Remeasurement(
        st.ctx.workload, target_key(st.ctx.target), list(traces), run_secs, selected,
        base_idx, margin, errors, time.time()))
    st.best_secs = medians[selected]
    if base_ok:
        st.baseline_secs = medians[base_idx]
    st.remeasured = True


def _check_runner(st: _TaskState, results: list[MeasureResult], runner) -> None:
    """A task whose first batch could not build, or built but could not run, at all: the
    builder or the runner is broken (an unreachable board, a missing toolchain)."""
    if st.ok_ever or any(r.ok for r in results) or st.trials != len(results):
        return
    errors = [r.error or "" for r in results]
    if all(e.startswith("build error") for e in errors):
        raise TuneError(f"{st.task.name}: every candidate of the first batch failed to build: "
                        f"{errors[0]}; is the builder (toolchain, target) working?")
    if all(e and not e.startswith("build error") for e in errors) and \
            not any(r.wrong for r in results):
        raise TuneError(f"{st.task.name}: every candidate of the first batch failed to run on "
                        f"{type(runner).__name__}: {errors[0]}; is the runner (device, "
                        f"tracker, board) reachable and working?")


def _copy_search(s: EvolutionarySearch) -> EvolutionarySearch:
    return EvolutionarySearch(s.population_size, s.init_measured_ratio, s.init_min_unmeasured,
                              s.genetic_num_iters, s.genetic_mutate_prob,
                              s.genetic_max_fail_count, s.eps_greedy, s.max_unrolled_stmts)


def tune_tir(func: PrimFunc | IRModule, target, max_trials: int = 256, *, work_dir,
             num_trials_per_iter: int = 64, builder=None, runner=None, cost_model="xgb",
             space: SpaceGenerator | None = None, shape_hints: Mapping[str, int] | None = None,
             seed: int | None = None, progress: bool = True,
             search: EvolutionarySearch | dict | None = None,
             remeasure: int = DEFAULT_REMEASURE,
             remeasure_rounds: int = DEFAULT_REMEASURE_ROUNDS) -> Database:
    """Tune one kernel; the tuning database (see ``tune_tasks`` for the parameters).

    The kernel has no baseline: at the end, its ``remeasure`` best records are re-measured
    among themselves and the median-fastest is selected (``remeasure=0``: the fastest
    record as measured).

    Parameters
    ----------
    func : PrimFunc
        The unscheduled kernel (symbolic extents allowed: ``shape_hints`` gives the values
        it is tuned at).
    max_trials : int
        Candidates to measure in this run.

    Examples
    --------
    >>> db = tune_tir(func, "llvm", max_trials=64, work_dir="tune/")   # doctest: +SKIP
    >>> sch = apply_best(db, func, "llvm")                             # doctest: +SKIP
    """
    f = _as_func(func)
    name = str(f.attr_dict.get("global_symbol", "main"))
    task = Task(name, f, 1, dict(shape_hints) if shape_hints else None)
    return tune_tasks([task], target, max_trials, work_dir=work_dir,
                      num_trials_per_iter=num_trials_per_iter, builder=builder, runner=runner,
                      cost_model=cost_model, space=space, search=search, seed=seed,
                      progress=progress, remeasure=remeasure,
                      remeasure_rounds=remeasure_rounds)


def apply_best(db: Database, func: PrimFunc | IRModule, target) -> Schedule | None:
    """The best tuned schedule of ``func`` on ``target`` in ``db`` (its trace replayed on
    ``func``), or None when ``db`` has no successful record of it.

    Examples
    --------
    >>> sch = apply_best(db, func, "llvm")             # doctest: +SKIP
    >>> mod = targets.build(sch.mod, "llvm")           # doctest: +SKIP
    """
    if not isinstance(db, Database):
        raise TypeError(f"apply_best takes a metaschedule.Database, got {type(db).__name__}")
    return db.query_schedule(_as_func(func), target)
