"""The tuning database: what was measured, kept in two append-only JSON-lines files.

``Database(work_dir)`` keeps

* ``work_dir/workloads.json`` — one line per workload (a kernel to tune): its structural hash
  and its TensorIR text (``func.script()``);
* ``work_dir/records.json`` — one line per measured candidate: the workload's hash, the target,
  the schedule's trace, the run times (or the error), the arguments it ran on, and whether its
  outputs were checked against a reference (``"checked"``);
* ``work_dir/remeasured.json`` — one line per re-measurement (``Remeasurement``): the tuner's
  best candidates of a workload and its baseline timed again, interleaved, over several
  rounds, and the one it selected. Once a workload has one, ``query_tuning_record`` /
  ``query_schedule`` return the latest one's selection instead of the fastest record (whose
  time is the minimum of many noisy measurements, often a lucky one). A database without the
  file (written before it existed) loads as before;
* ``work_dir/layouts.json`` — one line per layout decision (``commit_layout``): a choice made
  before the kernels exist, such as which packed tile a convolution's kernel is built with
  (``relax.tune_layouts``), keyed by a string that names what was decided and the target,
  with the candidates' measured times. The latest line of a key and target is in force
  (``query_layout``).

Every line carries the schema version (``"v": 1``). A line is written with a single ``write``
under an exclusive ``flock`` and ``fsync``'d before the call returns, so a tuning run killed at
any moment loses at most the trial in flight; a half-written last line (the kill came in the
middle of it) or any other unreadable line is skipped with a warning naming the file and line,
and everything else loads. Several processes may read and append at once: each ``Database``
picks up lines other processes appended when it is next queried.

``work_dir/tasks.json`` (the tuner's tasks: names, weights, flops) is rewritten, not appended:
``merge_tasks`` reads, merges and replaces it under the records' lock (an exclusive ``flock``
on ``records.json``), so two tuners sharing a ``work_dir`` never lose each other's entries.

Records are keyed by the workload's structural hash (``workload_hash``: stable across processes
and machines, blind to variable names) and the target string (``str(Target(...))``).

Examples
--------
>>> db = Database("tune/")                                  # doctest: +SKIP
>>> wl = db.commit_workload(func)                           # doctest: +SKIP
>>> db.commit_tuning_record(TuningRecord(sch.trace, wl, "llvm", [1.2e-3]))   # doctest: +SKIP
>>> db.get_top_k(wl, "llvm", 1)[0].run_secs                 # doctest: +SKIP
[0.0012]
>>> db.query_schedule(func, "llvm").mod                     # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Iterable

from tilecraft.tensorir.expr import Node, Var
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.parser import parse
from tilecraft.tensorir.schedule import Schedule, Trace
from tilecraft.tensorir.stmt import Buffer
from tilecraft.tensorir.structural import _definitions, _is_leaf

from tilecraft.targets import Target
from tilecraft.targets.fileio import atomic_write

from .arg_info import ArgInfo

try:  # POSIX advisory locks; elsewhere appends rely on O_APPEND alone
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

__all__ = ["Workload", "TuningRecord", "Remeasurement", "Database", "workload_hash",
           "target_key", "SCHEMA_VERSION", "WORKLOADS_FILE", "RECORDS_FILE", "REMEASURED_FILE",
           "LAYOUTS_FILE", "TASKS_FILE", "read_tasks_file"]

SCHEMA_VERSION = 1
WORKLOADS_FILE = "workloads.json"
RECORDS_FILE = "records.json"
REMEASURED_FILE = "remeasured.json"
LAYOUTS_FILE = "layouts.json"
TASKS_FILE = "tasks.json"

# attributes that name a function rather than say what it computes
_NAME_ATTRS = ("global_symbol",)


# -- a structural hash that is stable across processes -------------------------------------------
class _StableHasher:
    """``tensorir.structural_hash``'s notion of sameness (defined variables and buffers match
    by position, not by name), fed to BLAKE2b instead of Python's per-process ``hash``, so the
    digest is the same in every process and on every machine. Unlike ``structural_hash``, a
    defined buffer's dtype, shape, strides and scope are part of the digest."""

    def __init__(self):
        self.ids: dict[int, int] = {}
        self.h = hashlib.blake2b(digest_size=16)

    def tok(self, *parts) -> None:
        for p in parts:
            b = str(p).encode("utf-8", "surrogatepass")
            self.h.update(len(b).to_bytes(4, "little"))
            self.h.update(b)

    def define(self, d) -> None:
        if id(d) in self.ids:
            return
        self.ids[id(d)] = len(self.ids)
        if isinstance(d, Var):
            self.tok("defvar", d.dtype)
        elif isinstance(d, Buffer):
            self.tok("defbuf", d.dtype, d.scope)
            for s in d.shape:  # symbolic dims first seen in a defined buffer are defined there
                if isinstance(s, Var):
                    self.define(s)
            self.visit(d.shape)
            self.visit(d.strides)
        else:
            self.tok("def", type(d).__name__)
            info = getattr(d, "struct_info", None)
            if info is not None:
                self.visit(info)

    def visit(self, x) -> None:
        if isinstance(x, (tuple, list)):
            self.tok("[", len(x))
            for v in x:
                self.visit(v)
            return
        if isinstance(x, dict):
            self.tok("{", len(x))
            for k, v in x.items():
                self.visit(k)
                self.visit(v)
            return
        if type(x).__module__ == "numpy" and type(x).__name__ == "ndarray":
            self.tok("ndarray", x.dtype.str, x.shape, hashlib.sha256(x.tobytes()).hexdigest())
            return
        if not isinstance(x, Node):
            self.tok(type(x).__name__, repr(x))
            return
        if _is_leaf(x):
            idx = self.ids.get(id(x))
            if idx is not None:
                self.tok("ref", idx)
            elif isinstance(x, Var):
                self.tok("freevar", x.name, x.dtype)
            elif isinstance(x, Buffer):
                self.tok("freebuf", x.name, x.dtype, x.scope)
                self.visit(x.shape)
            else:
                self.tok("free", type(x).__name__, getattr(x, "name_hint", ""))
            return
        for d in _definitions(x):
            self.define(d)
        self.tok(type(x).__name__, len(x._fields))
        for f in x._fields:
            value = getattr(x, f)
            if isinstance(x, PrimFunc) and f == "attrs":
                value = tuple((k, v) for k, v in value if k not in _NAME_ATTRS)
            self.visit(value)


def _as_func(func) -> PrimFunc:
    if isinstance(func, Workload):
        return func.func
    if isinstance(func, IRModule):
        if "main" in func:
            func = func["main"]
        elif len(func) == 1:
            func = next(iter(func.functions.values()))
        else:
            raise ValueError(f"the module has no 'main' function (it has {sorted(func.functions)})")
    if not isinstance(func, PrimFunc):
        raise TypeError(f"expected a PrimFunc, got {type(func).__name__}")
    return func


def workload_hash(func: "PrimFunc | IRModule") -> str:
    """The structural hash of a workload, as 32 hex digits.

    Structurally equal functions (``tensorir.structural_equal``: the same up to names of defined
    variables and buffers) hash alike in every process and on every machine; the function's
    ``global_symbol`` is ignored (a kernel is the same workload whatever it is called).

    Examples
    --------
    >>> from tilecraft.tensorir import te
    >>> def f(dtype):
    ...     A = te.placeholder((8,), dtype, "A")
    ...     return te.create_prim_func([A, te.compute((8,), lambda i: A[i] + A[i], "B")])
    >>> workload_hash(f("float32")) == workload_hash(f("float32"))
    True
    >>> workload_hash(f("float32")) == workload_hash(f("float16"))
    False
    """
    h = _StableHasher()
    h.visit(_as_func(func))
    return h.h.hexdigest()


def target_key(target) -> str:
    """The canonical string of a target (``str(Target(target))``): records are keyed by it."""
    if isinstance(target, Target):
        return str(target)
    try:
        return str(Target(target))
    except Exception:  # a target this build does not know: keep its text as the key
        return str(target)


# -- workloads and records ------------------------------------------------------------------------
class Workload:
    """A kernel to tune: the function and its structural hash (``shash``, hex).

    A workload loaded from a database keeps its TensorIR text and parses it when ``func`` is
    first used.
    """

    def __init__(self, func: PrimFunc | None = None, shash: str | None = None, *,
                 script: str | None = None):
        if func is None and script is None:
            raise ValueError("Workload needs a function (or its TensorIR text)")
        self._func = _as_func(func) if func is not None else None
        self._script = script
        self.shash = shash or workload_hash(self._func)

    @property
    def func(self) -> PrimFunc:
        if self._func is None:
            try:
                self._func = parse(self._script)
            except Exception as err:
                raise ValueError(f"workload {self.shash}: its stored TensorIR text does not "
                                 f"parse: {err}") from None
        return self._func

    @property
    def script(self) -> str:
        if self._script is None:
            self._script = self._func.script()
        return self._script

    def to_json(self) -> dict:
        return {"v": SCHEMA_VERSION, "shash": self.shash, "func": self.script}

    @staticmethod
    def from_json(data: dict) -> "Workload":
        shash, script = data.get("shash"), data.get("func")
        if not isinstance(shash, str) or not isinstance(script, str):
            raise ValueError("a workload line needs 'shash' and 'func' strings")
        return Workload(None, shash, script=script)

    def __eq__(self, other):
        return isinstance(other, Workload) and other.shash == self.shash

    def __hash__(self):
        return hash(self.shash)

    def __repr__(self):
        return f"Workload(shash={self.shash!r})"


@dataclass
class TuningRecord:
    """One measured candidate.

    Attributes
    ----------
    trace : Trace
        The schedule, replayable on ``workload.func``.
    workload : Workload
    target : str
        The target it was built for (canonicalized with ``target_key`` when committed).
    run_secs : list[float] or None
        Seconds per call, one per repeat; None for a candidate that failed.
    args_info : list[ArgInfo], optional
        The arguments it was measured on.
    shape_vars : dict, optional
        The values of the symbolic dimensions it was measured at.
    error : str, optional
        Why it failed (build error, crash, timeout, wrong result).
    checked : bool, optional
        Whether its outputs were compared with the reference and matched: False for a
        candidate measured without a correctness check (no reference could be computed, or the
        runner does not check); None in records written before the field existed.
    """

    trace: Trace
    workload: Workload
    target: str
    run_secs: list[float] | None
    args_info: list[ArgInfo] | None = None
    shape_vars: dict | None = None
    error: str | None = None
    timestamp: float | None = field(default=None, compare=False)
    checked: bool | None = None

    @property
    def ok(self) -> bool:
        """Measured without error."""
        return self.error is None and bool(self.run_secs)

    @property
    def mean_secs(self) -> float:
        """The mean run time, ``inf`` for a failed candidate."""
        return (math.fsum(self.run_secs) / len(self.run_secs)) if self.ok else math.inf

    def as_schedule(self, func: "PrimFunc | IRModule | None" = None) -> Schedule:
        """Replay the trace on ``func`` (default: the workload's function)."""
        return self.trace.apply(func if func is not None else self.workload.func)

    def to_json(self) -> dict:
        run_secs = None
        if self.run_secs is not None:
            run_secs = [float(t) for t in self.run_secs]
            if not all(math.isfinite(t) for t in run_secs):
                raise ValueError(f"run_secs must be finite numbers, got {self.run_secs}")
        return {"v": SCHEMA_VERSION, "workload": self.workload.shash,
                "target": target_key(self.target), "trace": self.trace.to_json(),
                "run_secs": run_secs,
                "args_info": None if self.args_info is None else
                [a.to_json() for a in self.args_info],
                "shape_vars": None if self.shape_vars is None else
                {str(k): int(v) for k, v in self.shape_vars.items()},
                "error": None if self.error is None else str(self.error),
                "checked": None if self.checked is None else bool(self.checked),
                "time": round(self.timestamp if self.timestamp is not None else time.time(), 3)}

    @staticmethod
    def from_json(data: dict, workload: Workload) -> "TuningRecord":
        target, run_secs = data.get("target"), data.get("run_secs")
        if not isinstance(target, str):
            raise ValueError("a record needs a 'target' string")
        if run_secs is not None and (not isinstance(run_secs, list) or not all(
                isinstance(t, (int, float)) and not isinstance(t, bool) for t in run_secs)):
            raise ValueError(f"'run_secs' must be a list of numbers or null, got {run_secs!r}")
        infos = data.get("args_info")
        shape_vars = data.get("shape_vars")
        error = data.get("error")
        if shape_vars is not None and not isinstance(shape_vars, dict):
            raise ValueError("'shape_vars' must be an object")
        if error is not None and not isinstance(error, str):
            raise ValueError("'error' must be a string or null")
        checked = data.get("checked")
        if checked is not None and not isinstance(checked, bool):
            raise ValueError("'checked' must be true, false or null")
        return TuningRecord(
            trace=Trace.from_json(data.get("trace")), workload=workload, target=target,
            run_secs=None if run_secs is None else [float(t) for t in run_secs],
            args_info=None if infos is None else [ArgInfo.from_json(a) for a in infos],
            shape_vars=None if shape_vars is None else {str(k): int(v)
                                                        for k, v in shape_vars.items()},
            error=error, timestamp=data.get("time"), checked=checked)


@dataclass
class Remeasurement:
    """A workload's best candidates (and its baseline) measured again, and the one selected.

    ``metaschedule.tune_tasks`` writes one per task at the end of a run: the top few distinct
    records and the task's baseline (its default schedule) are built again and run
    interleaved for several rounds, and a candidate is selected only if its median beats the
    baseline's by ``margin`` (otherwise the baseline is selected).

    Attributes
    ----------
    workload : Workload
    target : str
    traces : list[Trace]
        The re-measured schedules.
    run_secs : list[list[float] | None]
        Per schedule: its time in each round (the median of the round's repeats); None for
        one that failed in some round.
    selected : int
        The index of the selected schedule (the one a build uses).
    baseline : int, optional
        The index of the task's baseline among ``traces`` (None without one).
    margin : float
        The speedup over the baseline a candidate needed (0.03: 3% faster).
    errors : list[str | None], optional
        Why a schedule failed.

    Examples
    --------
    >>> m = Remeasurement(wl, "llvm", [base.trace, sch.trace],
    ...                   [[1.0e-3, 1.1e-3], [0.9e-3, 0.8e-3]], selected=1, baseline=0,
    ...                   margin=0.03)                                      # doctest: +SKIP
    >>> m.median_secs(1), m.selected_record.run_secs                        # doctest: +SKIP
    (0.00085, [0.00085])
    """

    workload: Workload
    target: str
    traces: list
    run_secs: list
    selected: int
    baseline: int | None = None
    margin: float = 0.0
    errors: list | None = None
    timestamp: float | None = field(default=None, compare=False)

    def __post_init__(self):
        n = len(self.traces)
        if n == 0 or len(self.run_secs) != n:
            raise ValueError(f"Remeasurement: {n} traces but {len(self.run_secs)} run_secs "
                             f"lists (one per trace, at least one)")
        if self.errors is None:
            self.errors = [None] * n
        if len(self.errors) != n:
            raise ValueError(f"Remeasurement: {n} traces but {len(self.errors)} errors")
        for name, idx in (("selected", self.selected), ("baseline", self.baseline)):
            if idx is None and name == "baseline":
                continue
            if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < n:
                raise ValueError(f"Remeasurement: {name} must be an index below {n}, got "
                                 f"{idx!r}")
        if not math.isfinite(self.median_secs(self.selected)):
            raise ValueError("Remeasurement: the selected schedule has no run time")
        if not isinstance(self.margin, (int, float)) or not math.isfinite(self.margin):
            raise ValueError(f"Remeasurement: margin must be a number, got {self.margin!r}")

    def median_secs(self, i: int) -> float:
        """The median of schedule ``i``'s round times (``inf`` where it failed)."""
        times = self.run_secs[i]
        if not times or self.errors[i] is not None:
            return math.inf
        t = sorted(times)
        mid = len(t) // 2
        return t[mid] if len(t) % 2 else (t[mid - 1] + t[mid]) / 2

    def record(self, i: int) -> TuningRecord:
        """Schedule ``i`` as a ``TuningRecord`` whose ``run_secs`` is ``[its median]`` (so its
        ``mean_secs`` is the time it was selected on)."""
        med = self.median_secs(i)
        return TuningRecord(self.traces[i], self.workload, self.target,
                            [med] if math.isfinite(med) else None,
                            error=None if math.isfinite(med) else
                            (self.errors[i] or "failed in the re-measurement"),
                            timestamp=self.timestamp)

    @property
    def selected_record(self) -> TuningRecord:
        """The selected schedule as a ``TuningRecord`` (see ``record``)."""
        return self.record(self.selected)

    @property
    def baseline_record(self) -> TuningRecord | None:
        """The baseline as a ``TuningRecord`` (see ``record``), None without one."""
        return None if self.baseline is None else self.record(self.baseline)

    def to_json(self) -> dict:
        cands = []
        for trace, times, err in zip(self.traces, self.run_secs, self.errors):
            if times is not None:
                times = [float(t) for t in times]
                if not all(math.isfinite(t) for t in times):
                    raise ValueError(f"run_secs must be finite numbers, got {times}")
            cands.append({"trace": trace.to_json(), "run_secs": times,
                          "error": None if err is None else str(err)})
        return {"v": SCHEMA_VERSION, "workload": self.workload.shash,
                "target": target_key(self.target), "candidates": cands,
                "selected": self.selected, "baseline": self.baseline,
                "margin": float(self.margin),
                "time": round(self.timestamp if self.timestamp is not None else time.time(), 3)}

    @staticmethod
    def from_json(data: dict, workload: Workload) -> "Remeasurement":
        target, cands = data.get("target"), data.get("candidates")
        if not isinstance(target, str):
            raise ValueError("a re-measurement needs a 'target' string")
        if not isinstance(cands, list) or not all(isinstance(c, dict) for c in cands):
            raise ValueError("a re-measurement needs a 'candidates' list of objects")
        run_secs = []
        for c in cands:
            times = c.get("run_secs")
            if times is not None and (not isinstance(times, list) or not all(
                    isinstance(t, (int, float)) and not isinstance(t, bool) for t in times)):
                raise ValueError(f"'run_secs' must be a list of numbers or null, got {times!r}")
            run_secs.append(None if times is None else [float(t) for t in times])
        errors = [c.get("error") for c in cands]
        if not all(e is None or isinstance(e, str) for e in errors):
            raise ValueError("'error' must be a string or null")
        return Remeasurement(workload, target, [Trace.from_json(c.get("trace")) for c in cands],
                             run_secs, data.get("selected"), data.get("baseline"),
                             data.get("margin", 0.0), errors, data.get("time"))


# -- the files --------------------------------------------------------------------------------------
class _Log:
    """One append-only JSON-lines file and how much of it has been read."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0       # bytes consumed (always just after a newline)
        self.lines = 0        # lines consumed
        self.warned: set[int] = set()   # numbers of the broken lines already reported

    def _lock(self, fd: int, exclusive: bool) -> None:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)

    def locked(self) -> "_Locked":
        """This file's exclusive lock, held over a ``with`` block (the lock ``append`` takes),
        for an update of another file that must not interleave with other writers."""
        return _Locked(self.path)

    def append(self, obj: dict) -> None:
        data = (json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode()
        new = not os.path.exists(self.path)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._lock(fd, True)
            size = os.fstat(fd).st_size
            # a line cut short by a killed writer: end it, so ours stays a line of its own
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)  # releases the lock
        if new:
            _fsync_dir(os.path.dirname(self.path))

    def read_new(self) -> list[tuple[int, dict]]:
        """Parse the lines appended since the last call: ``[(line number, object)]``. Broken
        lines are reported once with ``warnings.warn`` and skipped."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return []
        try:
            if os.fstat(fd).st_size <= self.offset:
                return []
            self._lock(fd, False)
            size = os.fstat(fd).st_size
            chunks = []
            pos = self.offset
            while pos < size:
                chunk = os.pread(fd, min(size - pos, 1 << 24), pos)
                if not chunk:
                    break
                chunks.append(chunk)
                pos += len(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        end = data.rfind(b"\n") + 1
        out = []
        start = 0
        while start < end:
            stop = data.index(b"\n", start)
            self.lines += 1
            line = data[start:stop]
            start = stop + 1
            if not line.strip():
                continue
            try:
                obj = json.loads(line.decode("utf-8"))
                if not isinstance(obj, dict):
                    raise ValueError("not a JSON object")
                version = obj.get("v")
                if version != SCHEMA_VERSION:
                    raise ValueError(f"schema version {version!r}; this tilecraft reads version "
                                     f"{SCHEMA_VERSION}" + (" (written by a newer tilecraft?)"
                                                            if isinstance(version, int) and
                                                            version > SCHEMA_VERSION else ""))
            except UnicodeDecodeError:
                self.warn(self.lines, "not JSON (not even UTF-8 text)")
                continue
            except json.JSONDecodeError as err:
                self.warn(self.lines, f"not JSON ({err})")
                continue
            except ValueError as err:
                self.warn(self.lines, str(err))
                continue
            out.append((self.lines, obj))
        tail = data[end:]
        if tail:
            # a last line without its newline: a write cut short by a kill; leave it unread
            # (the next append ends it with a newline, and it is then skipped as corrupt)
            self.warn(self.lines + 1, f"truncated last line ({len(tail)} bytes without a "
                                      f"newline: a write cut short?)")
        self.offset += end
        return out

    def warn(self, lineno: int, why: str) -> None:
        if lineno in self.warned:
            return
        self.warned.add(lineno)
        warnings.warn(f"{self.path}:{lineno}: skipping a corrupt database line: {why}",
                      RuntimeWarning, stacklevel=4)


class _Locked:
    def __init__(self, path: str):
        self.path = path
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)   # releases the lock
        self.fd = None


def read_tasks_file(work_dir: "str | os.PathLike") -> list[dict]:
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
    tasks = data.get("tasks", []) if isinstance(data, dict) else []
    return [t for t in tasks if isinstance(t, dict) and "shash" in t]


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Database:
    """Tuning records in ``work_dir`` (``workloads.json``, ``records.json``,
    ``remeasured.json``), append-only.

    Parameters
    ----------
    work_dir : str or os.PathLike
        The directory (created if missing). Reopening it resumes: every record written before,
        by this process or another, is there.

    Examples
    --------
    >>> db = Database(tmp_path)                                           # doctest: +SKIP
    >>> wl = db.commit_workload(func)                                     # doctest: +SKIP
    >>> db.commit_tuning_record(TuningRecord(trace, wl, "llvm", [2e-3, 2.1e-3]))  # doctest: +SKIP
    >>> len(db), db.query_schedule(func, "llvm") is not None              # doctest: +SKIP
    (1, True)
    """

    def __init__(self, work_dir: "str | os.PathLike"):
        self.work_dir = os.path.abspath(os.fspath(work_dir))
        os.makedirs(self.work_dir, exist_ok=True)
        self._lock = threading.RLock()
        self._wl_log = _Log(os.path.join(self.work_dir, WORKLOADS_FILE))
        self._rec_log = _Log(os.path.join(self.work_dir, RECORDS_FILE))
        self._remeasure_log = _Log(os.path.join(self.work_dir, REMEASURED_FILE))
        self._layout_log = _Log(os.path.join(self.work_dir, LAYOUTS_FILE))
        self._layouts: dict[tuple[str, str], dict] = {}
        self._workloads: dict[str, Workload] = {}
        self._records: list[TuningRecord] = []
        self._by_key: dict[tuple[str, str], list[TuningRecord]] = {}
        self._remeasured: dict[tuple[str, str], list[Remeasurement]] = {}
        self._refresh()

    # -- loading ----------------------------------------------------------------------------
    def _read_workloads(self) -> None:
        for lineno, obj in self._wl_log.read_new():
            try:
                wl = Workload.from_json(obj)
            except ValueError as err:
                self._wl_log.warn(lineno, str(err))
                continue
            self._workloads.setdefault(wl.shash, wl)

    def _line_workload(self, log: _Log, lineno: int, obj: dict) -> Workload | None:
        shash = obj.get("workload")
        wl = self._workloads.get(shash) if isinstance(shash, str) else None
        if wl is None and isinstance(shash, str):
            self._read_workloads()  # another writer may have added it meanwhile
            wl = self._workloads.get(shash)
        if wl is None:
            # workloads.json is read first and a workload line is always written before
            # the lines that refer to it: this one's workload line is lost or corrupt
            log.warn(lineno, f"its workload {shash!r} is not in {WORKLOADS_FILE}")
        return wl

    def _refresh(self) -> None:
        with self._lock:
            self._read_workloads()
            for lineno, obj in self._rec_log.read_new():
                wl = self._line_workload(self._rec_log, lineno, obj)
                if wl is None:
                    continue
                try:
                    rec = TuningRecord.from_json(obj, wl)
                except (ValueError, TypeError, KeyError) as err:
                    self._rec_log.warn(lineno, f"{type(err).__name__}: {err}")
                    continue
                self._records.append(rec)
                self._by_key.setdefault((wl.shash, rec.target), []).append(rec)
            for lineno, obj in self._remeasure_log.read_new():
                wl = self._line_workload(self._remeasure_log, lineno, obj)
                if wl is None:
                    continue
                try:
                    m = Remeasurement.from_json(obj, wl)
                except (ValueError, TypeError, KeyError) as err:
                    self._remeasure_log.warn(lineno, f"{type(err).__name__}: {err}")
                    continue
                self._remeasured.setdefault((wl.shash, target_key(m.target)), []).append(m)
            for lineno, obj in self._layout_log.read_new():
                key, tgt, choice = obj.get("key"), obj.get("target"), obj.get("choice")
                if not (isinstance(key, str) and isinstance(tgt, str) and
                        isinstance(choice, dict)):
                    self._layout_log.warn(lineno, "a layout line needs a string key and "
                                                  "target and an object choice")
                    continue
                self._layouts[(key, tgt)] = obj

    # -- workloads --------------------------------------------------------------------------
    def commit_workload(self, func: "PrimFunc | IRModule") -> Workload:
        """The workload of ``func``, added to the database if it is new."""
        func = _as_func(func)
        shash = workload_hash(func)
        with self._lock:
            self._refresh()
            wl = self._workloads.get(shash)
            if wl is not None:
                if wl._func is None:
                    wl._func = func  # equal by construction of the hash: skip parsing
                return wl
            wl = Workload(func, shash)
            self._wl_log.append(wl.to_json())
            self._refresh()
            got = self._workloads.setdefault(shash, wl)
            if got._func is None:
                got._func = func
            return got

    def has_workload(self, func: "PrimFunc | IRModule") -> bool:
        """Whether ``func``'s workload is in the database."""
        self._refresh()
        return workload_hash(func) in self._workloads

    @property
    def workloads(self) -> list[Workload]:
        self._refresh()
        return list(self._workloads.values())

    # -- records ----------------------------------------------------------------------------
    def commit_tuning_record(self, record: TuningRecord) -> None:
        """Append ``record`` (durably: it is on disk when this returns)."""
        if not isinstance(record, TuningRecord):
            raise TypeError(f"expected a TuningRecord, got {type(record).__name__}")
        with self._lock:
            self._refresh()
            if record.workload.shash not in self._workloads:
                self.commit_workload(record.workload.func)
            self._rec_log.append(record.to_json())
            self._refresh()

    def get_all_tuning_records(self) -> list[TuningRecord]:
        """Every record, in the order written (failed ones too)."""
        self._refresh()
        with self._lock:
            return list(self._records)

    def get_top_k(self, workload: "Workload | PrimFunc", target, k: int) -> list[TuningRecord]:
        """The ``k`` fastest successful records of ``workload`` on ``target``, best mean first."""
        if k < 0:
            raise ValueError(f"get_top_k: k must be >= 0, got {k}")
        shash = workload.shash if isinstance(workload, Workload) else workload_hash(workload)
        self._refresh()
        with self._lock:
            recs = [r for r in self._by_key.get((shash, target_key(target)), ()) if r.ok]
        recs.sort(key=lambda r: r.mean_secs)
        return recs[:k]

    def commit_remeasurement(self, remeasurement: Remeasurement) -> None:
        """Append ``remeasurement`` (durably); from now on its selection is what
        ``query_tuning_record`` and ``query_schedule`` return for its workload and target."""
        if not isinstance(remeasurement, Remeasurement):
            raise TypeError(f"expected a Remeasurement, got {type(remeasurement).__name__}")
        with self._lock:
            self._refresh()
            if remeasurement.workload.shash not in self._workloads:
                self.commit_workload(remeasurement.workload.func)
            self._remeasure_log.append(remeasurement.to_json())
            self._refresh()

    def get_remeasurements(self, workload: "Workload | PrimFunc", target) -> list[Remeasurement]:
        """The re-measurements of ``workload`` on ``target``, in the order written (the last is
        the one in force).

        Examples
        --------
        >>> ms = db.get_remeasurements(func, "llvm")           # doctest: +SKIP
        >>> ms[-1].selected_record.mean_secs                   # doctest: +SKIP
        0.00085
        """
        shash = workload.shash if isinstance(workload, Workload) else workload_hash(workload)
        self._refresh()
        with self._lock:
            return list(self._remeasured.get((shash, target_key(target)), ()))

    # -- tasks ------------------------------------------------------------------------------
    def merge_tasks(self, entries: Iterable[dict]) -> list[dict]:
        """Add or replace (by ``shash``) ``entries`` in ``work_dir/tasks.json``; returns every
        task now in it. The file is read, merged and replaced atomically under the records'
        lock, so tuners sharing the directory keep each other's tasks.

        Examples
        --------
        >>> db.merge_tasks([{"name": "gemm", "shash": wl.shash, "weight": 1}])  # doctest: +SKIP
        """
        entries = list(entries)
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("shash"), str):
                raise ValueError(f"merge_tasks: each task needs a 'shash' string, got {e!r}")
        path = os.path.join(self.work_dir, TASKS_FILE)
        with self._lock, self._rec_log.locked():
            known = {t["shash"]: t for t in read_tasks_file(self.work_dir)}
            for e in entries:
                known[e["shash"]] = e
            tasks = list(known.values())
            atomic_write(path, json.dumps({"v": SCHEMA_VERSION, "tasks": tasks}, indent=1) + "\n",
                         durable=True)
        _fsync_dir(self.work_dir)
        return tasks

    # -- layout decisions -------------------------------------------------------------------
    def commit_layout(self, key: str, target, choice: dict,
                      candidates: Iterable[dict] = ()) -> None:
        """Append the layout decision ``choice`` for ``key`` on ``target`` (durably), with
        the ``candidates`` it was chosen from (their plans and times, for the record); from
        now on ``query_layout(key, target)`` returns ``choice``.

        Examples
        --------
        >>> db.commit_layout("conv2d_nchw c=64 ...", "llvm", {"kind": "cvec", "rows": 8,
        ...                  "width": 32})                                   # doctest: +SKIP
        """
        if not isinstance(key, str) or not key:
            raise ValueError(f"commit_layout: the key must be a non-empty string, got {key!r}")
        if not isinstance(choice, dict):
            raise TypeError(f"commit_layout: the choice must be a dict, got "
                            f"{type(choice).__name__}")
        obj = {"v": SCHEMA_VERSION, "key": key, "target": target_key(target),
               "choice": choice, "candidates": list(candidates), "time": time.time()}
        with self._lock:
            self._layout_log.append(obj)
            self._refresh()

    def query_layout(self, key: str, target) -> dict | None:
        """The layout decision in force for ``key`` on ``target`` (the latest committed), or
        None."""
        self._refresh()
        with self._lock:
            obj = self._layouts.get((key, target_key(target)))
        return None if obj is None else dict(obj["choice"])

    def get_layouts(self, target) -> dict[str, dict]:
        """Every layout decision in force on ``target``: ``{key: line}``, each line with its
        ``choice`` and ``candidates``."""
        self._refresh()
        tk = target_key(target)
        with self._lock:
            return {k: dict(v) for (k, t), v in self._layouts.items() if t == tk}

    def query_tuning_record(self, func: "PrimFunc | IRModule", target) -> TuningRecord | None:
        """The record a build of ``func`` on ``target`` uses, or None: the selection of the
        latest re-measurement (``Remeasurement.selected_record``: its ``run_secs`` is the
        re-measured median) when the workload has one, else the fastest successful record."""
        func = _as_func(func)
        found = self.get_remeasurements(func, target)
        if found:
            return found[-1].selected_record
        top = self.get_top_k(func, target, 1)
        return top[0] if top else None

    def query_schedule(self, func: "PrimFunc | IRModule", target) -> Schedule | None:
        """The best record's trace replayed on ``func``: the tuned schedule, or None if the
        database has no successful record of ``func`` on ``target``. The best record is
        ``query_tuning_record``'s: the latest re-measurement's selection where there is one
        (which may be the task's baseline: then the default schedule is what is returned),
        else the fastest record.

        A record whose trace no longer replays (a trace written by an incompatible version)
        is skipped with a warning and the next best is tried.

        Examples
        --------
        >>> sch = db.query_schedule(func, "llvm")          # doctest: +SKIP
        >>> targets.build(sch.mod, "llvm")                 # doctest: +SKIP
        """
        func = _as_func(func)
        recs = self.get_top_k(func, target, 8)
        found = self.get_remeasurements(func, target)
        if found:
            recs.insert(0, found[-1].selected_record)
        for rec in recs:
            try:
                return rec.trace.apply(func)
            except Exception as err:  # a broken record must not stop the build
                # the same workload under other names (a fused kernel's blocks and buffers are
                # named after the Relax variables of its call site, and the trace names blocks):
                # replay on the function it was tuned on, under this function's symbol
                try:
                    alias = rec.workload.func
                    symbol = func.attr_dict.get("global_symbol")
                    if symbol is not None:
                        alias = alias.with_attr("global_symbol", symbol)
                    return rec.trace.apply(alias)
                except Exception:  # noqa: BLE001 - report the first error
                    pass
                warnings.warn(f"{self._rec_log.path}: a record of workload {rec.workload.shash} "
                              f"does not replay ({type(err).__name__}: {err}); trying the next",
                              RuntimeWarning, stacklevel=2)
        return None

    def __len__(self) -> int:
        self._refresh()
        return len(self._records)

    def __repr__(self):
        n_re = sum(len(v) for v in self._remeasured.values())
        return (f"<metaschedule.Database {self.work_dir!r}: {len(self._workloads)} workloads, "
                f"{len(self._records)} records, {n_re} re-measurements, "
                f"{len(self._layouts)} layout decisions>")
