"""Tuning drivers: ``tune_tir`` (one kernel), ``tune_tasks`` (many, with a task scheduler),
``apply_best`` (the tuned schedule of a kernel).

A tuning run works in ``work_dir``:

* ``workloads.json`` / ``records.json`` — the ``Database``: every measured candidate, failed
  and wrong ones included (so they are never measured again). A second run with the same
  ``work_dir`` resumes: its search starts from the best records, and its trials come on top.
* ``tune.log`` — what happened: tasks, batches, best times, rejected candidates, a summary.
* ``tasks.json`` — the tasks (name, workload hash, weight, flop, shape hints), which
  ``plot_tuning_curve`` uses to label and scale its curves.
* ``cost_model.npz`` — the XGBoost model and its training data, reloaded on resume.

Dynamic shapes: a kernel with symbolic extents is tuned at representative values
(``shape_hints``, e.g. ``{"n": 64}``; a missing one is ``DEFAULT_SHAPE_HINT``). Tile sizes are
drawn, features computed and candidates measured at those values, but the traces never depend
on them (splits keep a free outer factor and guard tails), so the winning schedule is correct
for every value of ``n``.

Examples
--------
>>> from tensorir import te
>>> import metaschedule
>>> A = te.placeholder((512, 512), "float32", "A")
>>> B = te.placeholder((512, 512), "float32", "B")
>>> k = te.reduce_axis((0, 512), "k")
>>> C = te.compute((512, 512), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
>>> db = metaschedule.tune_tir(te.create_prim_func([A, B, C]), "llvm", max_trials=64,
...                            work_dir="tune_gemm")                    # doctest: +SKIP
>>> sch = metaschedule.apply_best(db, te.create_prim_func([A, B, C]), "llvm")  # doctest: +SKIP
"""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from targets import Target
from tensorir.function import IRModule, PrimFunc
from tensorir.schedule import Schedule

from .arg_info import output_indices, random_inputs
from .builder import LocalBuilder
from .cost_model import CostModel, RandomModel, XGBModel
from .database import Database, TuningRecord, target_key, workload_hash
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
           "DEFAULT_SHAPE_HINT",
           "TASKS_FILE", "LOG_FILE", "COST_MODEL_FILE"]

TASKS_FILE = "tasks.json"
LOG_FILE = "tune.log"
COST_MODEL_FILE = "cost_model.npz"


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
        faster than the baseline; and the search and the task scheduler start from its time.
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


def _atomic_json(path: str, data) -> None:
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tasks.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_tasks_file(work_dir: str | os.PathLike) -> list[dict]:
    """The tasks recorded in ``work_dir/tasks.json`` (empty when there is none)."""
    path = os.path.join(os.fspath(work_dir), TASKS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:
        warnings.warn(f"{path}: unreadable ({err}); task names and flops are not shown",
                      RuntimeWarning, stacklevel=2)
        return []
    return [t for t in data.get("tasks", []) if isinstance(t, dict) and "shash" in t]


def _write_tasks_file(work_dir: str, entries: list[dict]) -> None:
    known = {t["shash"]: t for t in read_tasks_file(work_dir)}
    for e in entries:
        known[e["shash"]] = e
    _atomic_json(os.path.join(work_dir, TASKS_FILE), {"v": 1, "tasks": list(known.values())})


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


def tune_tasks(tasks: Sequence[Task], target, max_trials: int, *, work_dir,
               num_trials_per_iter: int = 64, max_trials_per_task: int | None = None,
               builder=None, runner=None, cost_model="xgb", space: SpaceGenerator | None = None,
               search: EvolutionarySearch | dict | None = None,
               task_scheduler: "str | TaskScheduler" = "gradient", seed: int | None = None,
               progress: bool = True) -> Database:
    """Tune several kernels with one trial budget; the tuning database.

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
    """
    if not tasks:
        raise TuneError("tune_tasks: no tasks to tune")
    if isinstance(max_trials, bool) or not isinstance(max_trials, (int, np.integer)) or \
            max_trials < 1:
        raise ValueError(f"max_trials must be an int >= 1, got {max_trials!r}")
    if num_trials_per_iter < 1:
        raise ValueError(f"num_trials_per_iter must be >= 1, got {num_trials_per_iter}")
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
                         search_kwargs, task_scheduler, seed, progress, db, log)
        finally:
            if own_builder:
                builder.close()
            if own_runner:
                runner.close()


def _tune(tasks, target, max_trials, work_dir, per_iter, per_task, builder, runner, model,
          space, search, search_kwargs, task_scheduler, seed, progress, db, log) -> Database:
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
    _write_tasks_file(work_dir, entries)
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
        log.info("  %s: %d trials, best %s%s%s", st.task.name, st.trials, best, gf, base)
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
    """The fastest record of ``task``'s baseline schedule in ``db`` (None without a baseline
    or before it was measured).

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
             search: EvolutionarySearch | dict | None = None) -> Database:
    """Tune one kernel; the tuning database (see ``tune_tasks`` for the parameters).

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
                      progress=progress)


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
