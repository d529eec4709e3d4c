"""Builders: compile scheduled candidates into kernel libraries, in parallel, safely.

``LocalBuilder().build([BuilderInput(mod, target), ...])`` lowers and compiles each scheduled
module with ``targets.build`` and writes it with ``export_library`` (a shared library; for a
board's triple it is cross-linked with ``ld.lld``) into a fresh temporary directory. The work is
spread over a pool of worker processes (``metaschedule.popen_worker``), one per core by default.
A candidate that does not build — an error in lowering or codegen, a crash of LLVM, a build that
takes longer than ``timeout_sec`` — comes back as a ``BuilderResult`` with ``error_msg`` set;
``build`` itself does not raise for it.

Examples
--------
>>> from tilecraft.tensorir import Schedule
>>> builder = LocalBuilder()                                                # doctest: +SKIP
>>> res, = builder.build([BuilderInput(Schedule(func).mod, Target("llvm"))])  # doctest: +SKIP
>>> res.error_msg is None, res.artifact_path.endswith(".so")               # doctest: +SKIP
(True, True)
"""
from __future__ import annotations

import io
import os
import pickle
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tilecraft.tensorir.expr import Node
from tilecraft.tensorir.function import IRModule, PrimFunc

from tilecraft import targets
from tilecraft.targets import Target, parallel

from .popen_worker import PopenWorker, WorkerDied, WorkerError, WorkerTimeout

__all__ = ["BuilderInput", "BuilderResult", "LocalBuilder", "ARTIFACT_PREFIX",
           "remove_artifact"]

# the temporary directories of artifacts are named so; runners remove only such directories
ARTIFACT_PREFIX = "tilecraft-build-"


@dataclass
class BuilderInput:
    """A scheduled module (its ``"main"`` PrimFunc) and the target to build it for."""

    mod: "IRModule | PrimFunc"
    target: "Target | str"


@dataclass
class BuilderResult:
    """Where the library is (``artifact_path``), or why there is none (``error_msg``)."""

    artifact_path: str | None
    error_msg: str | None
    build_secs: float = 0.0


# -- shipping IR to a worker ------------------------------------------------------------------------
# IR nodes are immutable (their __setattr__ raises), which the default pickling cannot rebuild;
# this pickler rebuilds them field by field. Shared nodes stay shared (pickle's memo), so a
# variable used in many places is still one variable after the trip.
def _slots(cls) -> tuple[str, ...]:
    names: list[str] = []
    for c in reversed(cls.__mro__):
        s = c.__dict__.get("__slots__", ())
        for n in ((s,) if isinstance(s, str) else s):
            if n not in ("__weakref__", "__dict__") and n not in names:
                names.append(n)
    return tuple(names)


_SLOTS: dict[type, tuple[str, ...]] = {}


def _rebuild_node(cls, names, values):
    node = cls.__new__(cls)
    for k, v in zip(names, values):
        object.__setattr__(node, k, v)
    return node


class _IRPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, Node):
            cls = type(obj)
            names = _SLOTS.get(cls)
            if names is None:
                names = _SLOTS[cls] = _slots(cls)
            present = tuple(n for n in names if hasattr(obj, n))
            extra = getattr(obj, "__dict__", None)
            if extra:
                raise pickle.PicklingError(f"{cls.__name__} has instance attributes outside its "
                                           f"slots ({sorted(extra)}); cannot ship it to a worker")
            return _rebuild_node, (cls, present, tuple(getattr(obj, n) for n in present))
        return NotImplemented


def dumps_ir(obj) -> bytes:
    """Pickle IR (modules, functions, expressions) for another of our processes."""
    buf = io.BytesIO()
    _IRPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


# -- the worker's side ----------------------------------------------------------------------------
def _build_in_worker(payload: bytes, target: str, out_dir: str,
                     cache: "str | bool | None" = None) -> tuple[str, float]:
    import sys
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))  # deep IR
    mod = pickle.loads(payload)
    start = time.perf_counter()
    # one process per candidate already: no compiler workers of its own (jobs=1)
    built = targets.build(mod, target, jobs=1, cache=cache)
    path = os.path.join(out_dir, "candidate.so")
    built.export_library(path)
    return path, time.perf_counter() - start


# -- the pool -------------------------------------------------------------------------------------
class LocalBuilder:
    """Build candidates in parallel worker processes on this machine.

    Parameters
    ----------
    max_workers : int, optional
        Worker processes (default: ``$TILECRAFT_JOBS``, else the number of cores this process
        may use; ``targets.parallel.default_jobs``).
    timeout_sec : float
        The longest one build may take; past it the build fails and its worker is restarted.
    work_dir : str, optional
        Where the artifacts' temporary directories go (default: the system's temp directory).
        A relative path is resolved here, against the current directory of the caller (the
        worker processes run elsewhere).
    cache : None | bool | str
        The kernel cache the builds go through (``targets.kernel_cache``): None, the default
        one (``$TILECRAFT_CACHE_DIR``, ``TILECRAFT_CACHE=0``); False, none; or a directory.
        A candidate built before (a repeated schedule, the best ones built again by
        ``relax.build``) comes from it instead of LLVM.

    Each artifact lives in its own directory (``tilecraft-build-*``); a runner removes it after
    measuring (``cleanup=True``), or call ``remove_artifact(path)``. ``close()`` ends the
    workers (also at garbage collection).

    Examples
    --------
    >>> builder = LocalBuilder(max_workers=2, timeout_sec=30)         # doctest: +SKIP
    >>> results = builder.build([BuilderInput(sch.mod, "llvm") for sch in schedules])  # doctest: +SKIP
    >>> [r.error_msg for r in results]                                # doctest: +SKIP
    [None, None, 'ScheduleError: ...']
    """

    def __init__(self, max_workers: int | None = None, timeout_sec: float = 60.0,
                 work_dir: str | None = None, cache: "str | bool | None" = None):
        if max_workers is None:
            max_workers = parallel.default_jobs()
        if max_workers < 1:
            raise ValueError(f"LocalBuilder: max_workers must be >= 1, got {max_workers}")
        if not timeout_sec > 0:
            raise ValueError(f"LocalBuilder: timeout_sec must be > 0, got {timeout_sec}")
        self.max_workers = int(max_workers)
        self.timeout_sec = float(timeout_sec)
        self.work_dir = None if work_dir is None else os.path.abspath(os.fspath(work_dir))
        if not (cache is None or isinstance(cache, (bool, str, os.PathLike))):
            raise TypeError(f"LocalBuilder: cache must be None, a bool or a directory, got "
                            f"{type(cache).__name__}")
        self.cache = cache if cache is None or isinstance(cache, bool) else \
            os.path.abspath(os.fspath(cache))
        self._idle: list[PopenWorker] = []
        self._lock = threading.Lock()

    def _take(self) -> PopenWorker:
        with self._lock:
            return self._idle.pop() if self._idle else PopenWorker()

    def _give(self, w: PopenWorker) -> None:
        with self._lock:
            self._idle.append(w)

    def build(self, inputs: list[BuilderInput]) -> list[BuilderResult]:
        """Build every input; one ``BuilderResult`` per input, in order (never raises for a
        candidate that does not build)."""
        inputs = list(inputs)
        if not inputs:
            return []
        workers = min(self.max_workers, len(inputs))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tilecraft-build") as ex:
            return list(ex.map(self._build_one, inputs))

    def _build_one(self, inp: BuilderInput) -> BuilderResult:
        start = time.perf_counter()
        try:
            target = inp.target if isinstance(inp.target, Target) else Target(inp.target)
            mod = inp.mod
            if isinstance(mod, PrimFunc):
                mod = IRModule({"main": mod})
            if not isinstance(mod, IRModule):
                raise TypeError(f"BuilderInput.mod must be an IRModule or a PrimFunc, got "
                                f"{type(mod).__name__}")
            payload = dumps_ir(mod)
        except Exception as err:
            return BuilderResult(None, f"{type(err).__name__}: {err}",
                                 time.perf_counter() - start)
        if self.work_dir is not None:
            os.makedirs(self.work_dir, exist_ok=True)
        out_dir = tempfile.mkdtemp(prefix=ARTIFACT_PREFIX, dir=self.work_dir)
        worker = self._take()
        try:
            path, secs = worker.call(_build_in_worker, payload, str(target), out_dir,
                                     self.cache, timeout=self.timeout_sec)
            return BuilderResult(path, None, secs)
        except WorkerError as err:
            msg = str(err)
        except WorkerTimeout:
            msg = f"the build ran past its time limit of {self.timeout_sec:g} s"
        except WorkerDied as err:
            msg = f"the build crashed: {err}"
        finally:
            self._give(worker)
        shutil.rmtree(out_dir, ignore_errors=True)
        return BuilderResult(None, msg, time.perf_counter() - start)

    def close(self) -> None:
        """End the worker processes (they start again if ``build`` is called later)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "LocalBuilder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def remove_artifact(path: str | None) -> None:
    """Remove a builder's artifact and its temporary directory; a file anywhere else (not
    made by a builder) is left alone."""
    if not path:
        return
    d = os.path.dirname(os.path.abspath(path))
    if os.path.basename(d).startswith(ARTIFACT_PREFIX):
        shutil.rmtree(d, ignore_errors=True)
