"""Run independent compilation tasks in worker processes, with the result of a serial run.

``run_tasks(tasks, jobs)`` calls each task (a callable without arguments) and returns the
results in order. With ``jobs > 1`` the tasks run in forked worker processes (the workers
inherit the tasks, so nothing but the results -- object code and metadata -- crosses a process
boundary), longest first by the ``cost`` estimates, each worker taking the next task when it is
free. The results are the same as a serial run's, in the same order, and so are the warnings
the tasks issue (issued again here, in task order). A task that raises in a worker is run
again in this process, so the exception (with the IR node it names) is exactly the serial
build's; a worker that dies (a crash of LLVM, out of memory) raises ``RuntimeError`` naming the
tasks it may have been running.

Forking is what makes a parallel build cheap (no new interpreter imports tilecraft and LLVM),
and it is safe here: a worker only runs scheduling, lowering, code generation and LLVM on its
own data, never the kernel thread pool or anything else another thread of this process may
hold. Where ``fork`` is not available (Windows, macOS) or inside a worker, tasks run serially.
The number of workers: ``jobs``, else ``$TILECRAFT_JOBS``, else one per core.
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import threading
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Sequence

__all__ = ["default_jobs", "resolve_jobs", "run_tasks", "can_fork"]

_TASKS: Sequence[Callable] | None = None   # what forked workers run (set while a pool lives)
_POOL_LOCK = threading.Lock()
_IN_WORKER = False


ENV_JOBS = "TILECRAFT_JOBS"


def default_jobs() -> int:
    """``$TILECRAFT_JOBS``, else the cores this process may run on."""
    text = os.environ.get(ENV_JOBS, "").strip()
    if text:
        try:
            jobs = int(text)
        except ValueError:
            jobs = 0
        if jobs < 1:
            raise ValueError(f"{ENV_JOBS}={text!r} must be a positive integer")
        return jobs
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_jobs(jobs: int | None) -> int:
    """``jobs`` checked (a positive int), or ``default_jobs()`` for None."""
    if jobs is None:
        return default_jobs()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer (or None: one per core), got {jobs!r}")
    return jobs


def can_fork() -> bool:
    """Whether tasks can run in forked workers here."""
    return (not _IN_WORKER and sys.platform.startswith("linux")
            and "fork" in multiprocessing.get_all_start_methods()
            and not multiprocessing.current_process().daemon)


def _worker_init():
    global _IN_WORKER
    _IN_WORKER = True


def _run_one(index: int):
    """Task ``index`` in a worker: (ok, result or error text, warnings it issued)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ok, value = True, _TASKS[index]()
        except BaseException as err:  # noqa: BLE001 - reported, then re-raised by the parent
            ok, value = False, f"{type(err).__name__}: {err}"
    issued = [(str(w.message), w.category, w.filename, w.lineno) for w in caught
              if _picklable_category(w.category)]
    return ok, value, issued


def _picklable_category(category) -> bool:
    return getattr(sys.modules.get(category.__module__), category.__qualname__, None) is category


def run_tasks(tasks: Sequence[Callable], jobs: int = 1, cost: Sequence[float] | None = None,
              names: Sequence[str] | None = None) -> list:
    """The results of ``task()`` for each task, in order (see the module docstring).

    Parameters
    ----------
    tasks : sequence of callables
        Independent tasks; each returns a picklable result.
    jobs : int
        Worker processes (at most one per task); 1 runs the tasks here, one after the other.
    cost : sequence of float, optional
        An estimate of each task's run time: workers take the longest first.
    names : sequence of str, optional
        What each task is, for error messages.

    Examples
    --------
    >>> run_tasks([lambda: 1 + 1, lambda: 2 * 3], jobs=2)
    [2, 6]
    """
    jobs = min(resolve_jobs(jobs), len(tasks))
    if jobs <= 1 or not can_fork():
        return [task() for task in tasks]
    order = sorted(range(len(tasks)), key=lambda i: -cost[i]) if cost is not None else \
        list(range(len(tasks)))
    results: list = [None] * len(tasks)
    issued: list = [()] * len(tasks)
    failed: list[int] = []
    global _TASKS
    with _POOL_LOCK:
        _TASKS = tasks
        try:
            with warnings.catch_warnings():
                # Python >= 3.12 warns when a process with threads forks; see the module
                # docstring for why these workers are safe
                warnings.simplefilter("ignore", DeprecationWarning)
                pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"),
                                           initializer=_worker_init)
                with pool:
                    # the workers are forked at the first submit. Objects of this process
                    # frozen for it are never collected in a worker: a destructor of a
                    # library's object left in a reference cycle (a WebGPU buffer) would run
                    # there, in a copy whose library threads did not survive the fork, and
                    # hang the build (seen: wgpu-native's release under a worker's collection)
                    gc.freeze()
                    try:
                        futures = {i: pool.submit(_run_one, i) for i in order}
                    finally:
                        gc.unfreeze()
                    for i in order:
                        try:
                            ok, value, issued[i] = futures[i].result()
                        except BrokenProcessPool:
                            unfinished = [j for j in order if not (
                                futures[j].done() and futures[j].exception(timeout=0) is None)]
                            what = ", ".join(names[j] if names else f"#{j}"
                                             for j in sorted(unfinished))
                            raise RuntimeError(
                                f"a compiler worker process died (a crash in code generation or "
                                f"LLVM, or out of memory) while compiling: {what}; build with "
                                f"jobs=1 to compile in this process") from None
                        if ok:
                            results[i] = value
                        else:
                            failed.append(i)
        finally:
            _TASKS = None
    first = min(failed) if failed else len(tasks)
    # the warnings the workers' tasks issued, here and in task order, as a serial run issues them
    for i in range(first):
        for message, category, filename, lineno in issued[i]:
            warnings.warn_explicit(message, category, filename, lineno)
    if failed:
        # the first failure in task order, raised by this process as a serial run raises it
        results[first] = tasks[first]()
        raise RuntimeError(f"task {names[first] if names else first} failed in a worker "
                           f"process but not when run again here")
    return results
