"""Tuning a whole Relax model: ``relax.extract_tasks`` and ``relax.tune``.

``extract_tasks(mod, target)`` runs the same steps as ``relax.build`` up to scheduling — the
graph pipeline, ``LegalizeOps``, ``StaticPlanBlockMemory`` — and turns every kernel the program
calls into a ``metaschedule.Task``: identical kernels (the same structural hash, whatever their
names) become one task whose ``weight`` is how many call sites they have; a kernel's symbolic
dims get shape hints from ``shape_hints``, else ``upper_bounds``, else
``metaschedule.DEFAULT_SHAPE_HINT``. Kernels that already carry a schedule (hand-written ones)
are left out. The int8 dense kernels on Intel AMX tiles (``backend.cpu.dense_amx``) are tasks
like the others: their default schedule ends in ``tensorize`` with the tensor intrinsic
``amx_u8s8s32_*``, a trace that replays, and the tuner's ``MultiLevelTilingAMX`` searches
their tiles. On a CPU target each task's ``baseline`` is the default schedule ``relax.build``
gives the kernel without a record (``relax.default_schedules``, the packed kernels of
``AlterLayout`` included), on a GPU target the default GPU schedule (``relax.gpu_schedules``;
none for a GEMM whose default is several schedules chosen per call by a symbolic batch):
``tune`` measures it first, so a tuned record is used only where it beats it, and a tuned build
is never slower, kernel by kernel, than the untuned one (as measured by the tuner's runner). On
a GPU target the GEMM-like kernels are searched in the knob space of the default GEMM recipe
(``relax.gpu_space``), their baseline the space's point at the defaults; on a target with
tensor cores the fp16 GEMMs in the tensor-core kernel's (``relax.tensor_core_space``).
``tune(mod, target, max_trials, work_dir)`` tunes those tasks with ``metaschedule.tune_tasks``
and returns the database, which ``relax.build(mod, target, database=db)`` then uses for
every kernel it covers (the rest get the default schedules).

Examples
--------
>>> db = relax.tune(mod, "llvm", max_trials=2000, work_dir="tune_mlp/",
...                 upper_bounds={"batch": 64})                             # doctest: +SKIP
>>> exe = relax.build(mod, "llvm", database=db, upper_bounds={"batch": 64})  # doctest: +SKIP
"""
from __future__ import annotations

import inspect
from typing import Mapping

from tilecraft.targets import Target
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.functor import post_order_visit

from tilecraft import metaschedule
from tilecraft.metaschedule import Database, KnobSpace, Task
from tilecraft.metaschedule.database import workload_hash
from tilecraft.metaschedule.space_generator import DEFAULT_SHAPE_HINT, shape_vars

from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.structural import structural_hash

from . import default_schedules, gpu_schedules
from .build import _called_kernels, _layout_pipeline, _run_pipeline, legalize
from .tune_layouts import tune_layouts
from .default_schedules import is_scheduled
from .gpu_space import gpu_space
from .expr import Call, Function, RelaxError
from .op.base import Op
from .transform.static_plan_block_memory import StaticPlanBlockMemory

__all__ = ["extract_tasks", "tune", "default_schedule"]


def _prepare(mod: IRModule, target: Target, upper_bounds, pipeline, database=None) -> IRModule:
    """What ``relax.build`` schedules: the module after its pipeline, legalization and memory
    planning."""
    pipeline = _layout_pipeline(pipeline, database, target)
    if "target" in inspect.signature(_run_pipeline).parameters:
        mod = _run_pipeline(mod, pipeline, target=target)
    else:
        mod = _run_pipeline(mod, pipeline)
    mod = legalize(mod)
    return StaticPlanBlockMemory(upper_bounds)(mod)


def default_schedule(func: PrimFunc, target: Target) -> Schedule | None:
    """The default schedule of ``func`` (what ``relax.build`` applies without a record) as a
    ``Schedule`` whose trace replays to it; None where there is no such single schedule (a
    kernel versioned on its symbolic row count or batch, a rule that failed, a target kind
    without default schedules). CPU: ``relax.default_schedules``; GPU (``opencl``,
    ``webgpu``): ``relax.gpu_schedules.default_schedule``.

    Examples
    --------
    >>> sch = default_schedule(func, Target("llvm"))          # doctest: +SKIP
    >>> sch.trace.apply(func).func                            # doctest: +SKIP
    """
    if target.kind in gpu_schedules.GPU_KINDS:
        return gpu_schedules.default_schedule(func, target)
    if target.kind != "llvm" or is_scheduled(func):
        return None
    built = default_schedules.apply(func, target)
    sch = Schedule(func)
    try:
        # the rules of default_schedules.apply, kept as one trace (apply returns the function)
        default_schedules.schedule_blocks(sch, target)
    except ScheduleError:
        return None
    # apply may do more than one trace can say (two versions of the body on a symbolic row
    # count): only an identical program is a baseline
    return sch if workload_hash(sch.func) == workload_hash(built) else None


def _knob_baselines(tasks: list[Task], space: KnobSpace, target: Target,
                    baselines: bool = True) -> None:
    """Each task a knob space has knobs for (``space``, else the first of its ``KnobSpace``
    fallbacks that has) gets that space's point at the defaults as its baseline (the same
    program as its default schedule, but a trace of the space, so the search moves its knobs
    from it). A kernel whose default is built whole, not as a schedule trace (the tensor-core
    GEMM: ``default_schedule`` is None), gets it too where ``baselines``: a rule has knobs
    only where its defaults make the default kernel."""
    for task in tasks:
        own = space
        while isinstance(own, KnobSpace) and \
                own.knobs_of(task.func, target, task.shape_hints) is None:
            own = own.fallback
        if not isinstance(own, KnobSpace) or (task.baseline is None and not baselines):
            continue
        seeds = own.seeds(task.func, target, task.shape_hints)
        if not seeds:
            continue
        if task.baseline is None or \
                structural_hash(seeds[0].func) == structural_hash(task.baseline.func):
            task.baseline = seeds[0]


def _call_counts(mod: IRModule) -> dict[str, int]:
    counts: dict[str, int] = {}

    def visit(n):
        if isinstance(n, Call) and isinstance(n.op, Op) and \
                n.op.name in ("relax.call_tir", "relax.call_tir_dps"):
            name = n.args[0].name_hint
            counts[name] = counts.get(name, 0) + 1
    for f in mod.functions.values():
        if isinstance(f, Function):
            post_order_visit(f, visit)
    return counts


def extract_tasks(mod: IRModule, target="llvm", *, upper_bounds: Mapping[str, int] | None = None,
                  shape_hints: Mapping[str, int] | None = None, pipeline=None,
                  baselines: bool = True, database=None) -> list[Task]:
    """The tuning tasks of a Relax module: one per distinct kernel, weighted by its calls.

    Parameters
    ----------
    mod : IRModule
        The Relax module, as given to ``relax.build``.
    target : Target | str
    upper_bounds : dict[str, int], optional
        As for ``relax.build`` (memory planning); also the shape hints of symbolic dims that
        ``shape_hints`` does not name.
    shape_hints : dict[str, int], optional
        Representative values of symbolic dims by name (``{"batch": 16}``).
    pipeline : optional
        As for ``relax.build``.
    baselines : bool
        Give each task its default schedule as ``Task.baseline`` (``default_schedule``).
    database : metaschedule.Database, optional
        Its layout decisions (``relax.tune_layouts``) choose the convolutions' kernels, as
        in ``relax.build(..., database=db)``.

    Returns
    -------
    list of metaschedule.Task
        In the order the program first calls them; their functions are exactly the kernels
        ``relax.build`` schedules (after fusion, ``AlterLayout``, ``FoldScaleAxis``).

    Examples
    --------
    >>> tasks = relax.extract_tasks(mod, "llvm", upper_bounds={"batch": 64})   # doctest: +SKIP
    >>> [(t.name, t.weight) for t in tasks]                                    # doctest: +SKIP
    [('fused_matmul_add_relu', 2), ('fused_matmul_add', 1)]
    """
    if not isinstance(mod, IRModule):
        raise TypeError(f"relax.extract_tasks takes an IRModule, got {type(mod).__name__}")
    target = target if isinstance(target, Target) else Target(target)
    prepared = _prepare(mod, target, upper_bounds, pipeline, database)
    counts = _call_counts(prepared)
    hints_in = {str(k): int(v) for k, v in (upper_bounds or {}).items()}
    hints_in.update({str(k): int(v) for k, v in (shape_hints or {}).items()})
    tasks: dict[str, Task] = {}
    for name in _called_kernels(prepared):
        func = prepared[name]
        if not isinstance(func, PrimFunc):
            raise RelaxError(f"relax.extract_tasks: call_tir of {name}, which is not a PrimFunc")
        if is_scheduled(func):
            continue
        shash = workload_hash(func)
        if shash in tasks:
            tasks[shash].weight += counts.get(name, 1)
            continue
        hints = {v.name: hints_in.get(v.name, DEFAULT_SHAPE_HINT) for v in shape_vars(func)}
        base = default_schedule(func, target) if baselines else None
        tasks[shash] = Task(name, func, weight=counts.get(name, 1), shape_hints=hints or None,
                            baseline=base)
    return list(tasks.values())


def tune(mod: IRModule, target="llvm", max_trials: int = 1000, work_dir="tune", *,
         runner=None, builder=None, upper_bounds: Mapping[str, int] | None = None,
         shape_hints: Mapping[str, int] | None = None, pipeline=None,
         num_trials_per_iter: int = 64, max_trials_per_task: int | None = None,
         cost_model="xgb", space=None, search=None, task_scheduler="gradient",
         seed: int | None = None, progress: bool = True, baselines: bool = True,
         layouts: bool = True,
         remeasure: int = metaschedule.tune.DEFAULT_REMEASURE,
         remeasure_rounds: int = metaschedule.tune.DEFAULT_REMEASURE_ROUNDS,
         remeasure_margin: float = metaschedule.tune.DEFAULT_REMEASURE_MARGIN) -> Database:
    """Tune every kernel of a Relax model; the tuning database for ``relax.build``.

    ``max_trials`` is the budget of the whole model, shared by its tasks through the gradient
    task scheduler (``metaschedule.tune_tasks``, whose other parameters these are; on a CPU
    the default runner is ``LocalRunner(enable_cpu_cache_flush=False)``, warm caches as in the
    model, where ``tune_tir`` flushes them). With
    ``baselines`` (the default), every task's default schedule is measured first (one trial
    each): the database's best record of a kernel is then its default schedule unless the
    search found a faster one, so ``relax.build(mod, target, database=db)`` never uses a
    record slower than what it would build without one.

    ``space``: the design space (default: ``default_space(target)``; on ``opencl`` and
    ``webgpu``, ``relax.gpu_space.gpu_space(target)``: the default GEMM recipe's knobs for the
    GEMM-like kernels, the generic GPU space for the others). With a ``KnobSpace``, each task
    it has knobs for gets the space's point at the defaults as its baseline.

    With ``layouts`` (the default) on a CPU target of this machine measured here (no remote
    runner), each convolution's packed kernel is chosen by measurement first
    (``relax.tune_layouts``; its decisions go to the same database, and the tasks are the
    chosen kernels).

    At the end (``remeasure``, the default 4; 0 turns it off) each task's best distinct
    records are re-measured with its default schedule, interleaved over ``remeasure_rounds``
    rounds (medians), and a record is used only where it beats the default schedule by
    ``remeasure_margin`` (3%); elsewhere the database selects the default schedule, so the
    minimum of many noisy measurements does not replace it by luck.

    Raises
    ------
    metaschedule.TuneError
        When the model has no kernel to tune, or as ``tune_tasks``.

    Examples
    --------
    >>> db = relax.tune(mod, "llvm", max_trials=500, work_dir="tune/")        # doctest: +SKIP
    >>> exe = relax.build(mod, "llvm", database=db)                           # doctest: +SKIP
    >>> db = relax.tune(mod, "llvm", 500, "tune/", remeasure_margin=0.05)     # doctest: +SKIP
    """
    target = target if isinstance(target, Target) else Target(target)
    database = None
    if layouts and target.kind == "llvm" and target.is_host and \
            (runner is None or isinstance(runner, metaschedule.LocalRunner)) and \
            (pipeline is None or pipeline == "default"):
        # timed on this machine: not for a board's target or a remote runner
        database = Database(work_dir)
        tune_layouts(mod, target, database, progress=progress,
                     builder=builder if isinstance(builder, metaschedule.LocalBuilder) else None)
    tasks = extract_tasks(mod, target, upper_bounds=upper_bounds, shape_hints=shape_hints,
                          pipeline=pipeline, baselines=baselines, database=database)
    if not tasks:
        raise metaschedule.TuneError("relax.tune: the module calls no kernel that can be tuned "
                                     "(no call_tir of an unscheduled PrimFunc)")
    if space is None and target.kind in gpu_schedules.GPU_KINDS:
        space = gpu_space(target)
    if isinstance(space, KnobSpace):
        _knob_baselines(tasks, space, target, baselines)
    own_runner = runner is None and target.kind == "llvm"
    if own_runner:
        # kernels of a model run on activations their producer just wrote, not on cold caches:
        # with the caches flushed before each repeat, ResNet-50's tuner preferred schedules
        # that were faster cold and up to 1.6x slower in the model (docs/notes/tuning-log.md)
        runner = metaschedule.LocalRunner(enable_cpu_cache_flush=False)
    try:
        return metaschedule.tune_tasks(tasks, target, max_trials, work_dir=work_dir,
                                       num_trials_per_iter=num_trials_per_iter,
                                       max_trials_per_task=max_trials_per_task, builder=builder,
                                       runner=runner, cost_model=cost_model, space=space,
                                       search=search, task_scheduler=task_scheduler, seed=seed,
                                       progress=progress, remeasure=remeasure,
                                       remeasure_rounds=remeasure_rounds,
                                       remeasure_margin=remeasure_margin)
    finally:
        if own_runner:
            runner.close()
