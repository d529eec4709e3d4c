"""Runners: measure built candidates, check their results, survive the ones that crash.

``LocalRunner().run([RunnerInput(artifact, target, args_info, shape_vars, seed, reference)])``
measures each candidate on this machine, one at a time (candidates measured side by side would
disturb each other's timings):

1. A worker process of its own (``metaschedule.popen_worker``) forks a fresh child per
   candidate; the child loads the library with ``targets.load_module``, so whatever the
   candidate does — a segmentation fault, an endless loop, a leak — dies with the child. The
   worker reports the crash (``killed by signal 11 (SIGSEGV, segmentation fault)``) or kills
   the child past ``timeout_sec``; a worker that dies itself is started again. Either way the
   trial fails with a clear ``error_msg`` and the tuner goes on.
2. The child fills the arguments with ``random_inputs(args_info, seed)``, calls the kernel once
   and compares the outputs (the parameters the kernel writes) with ``reference``: a mismatch is
   a failed trial with ``wrong=True`` and the largest error in ``error_msg``.
3. It times the kernel with ``time_evaluator(number, repeat, min_repeat_ms)``; with
   ``enable_cpu_cache_flush`` it first writes a buffer bigger than the caches (twice the last
   level cache plus every core's L2, read from ``/sys``) before each repeat, so every repeat
   starts with cold caches, as the kernel will inside a model.

Examples
--------
>>> runner = LocalRunner(timeout_sec=10, number=3, repeat=2)            # doctest: +SKIP
>>> res, = runner.run([RunnerInput(path, Target("llvm"), infos, {}, seed=0,
...                                reference=ref)])                       # doctest: +SKIP
>>> res.run_secs, res.error_msg                                          # doctest: +SKIP
([0.0012, 0.0011], None)
"""
from __future__ import annotations

import glob
import math
import mmap
import os
import pickle
import select
import signal
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tilecraft.targets import Target

from .arg_info import ArgInfo, random_inputs
from .builder import remove_artifact
from .popen_worker import PopenWorker, WorkerDied, WorkerError, WorkerTimeout, describe_status

__all__ = ["RunnerInput", "RunnerResult", "LocalRunner", "default_tolerance", "compare_outputs",
           "cache_flush_bytes"]


@dataclass
class RunnerInput:
    """A built candidate and what to run it on.

    ``reference`` holds the expected outputs (aligned with ``output_indices(func)``: the
    parameters the kernel writes, in order), computed on ``random_inputs(args_info, seed)``;
    None skips the check.
    """

    artifact_path: str | None
    target: "Target | str"
    args_info: list[ArgInfo]
    shape_vars: dict = field(default_factory=dict)
    seed: int = 0
    reference: list[np.ndarray] | None = None


@dataclass
class RunnerResult:
    """Seconds per call, one per repeat (``run_secs``), or why there are none (``error_msg``;
    ``wrong`` when the outputs did not match the reference). ``checked``: the outputs were
    compared with the reference and matched (False when there was no reference, or the
    runner does not check)."""

    run_secs: list[float] | None
    error_msg: str | None
    wrong: bool = False
    checked: bool = False


# -- correctness ------------------------------------------------------------------------------------
def default_tolerance(dtype: str) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing a candidate's outputs of ``dtype`` with the reference.

    Candidates sum in other orders than the reference, so floats differ in rounding; the
    absolute tolerance is scaled by the reference's largest magnitude (see ``compare_outputs``).
    Integers and booleans must match exactly.
    """
    if dtype in ("float16", "bfloat16"):
        return 2e-2, 2e-2
    if dtype == "float32":
        return 1e-3, 1e-4
    if dtype == "float64":
        return 1e-7, 1e-9
    return 0.0, 0.0


def compare_outputs(outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray],
                    names: Sequence[str] | None = None, rtol: float | None = None,
                    atol: float | None = None) -> str | None:
    """None if every output matches its reference, else a message naming the first output that
    does not and its largest error.

    A float output matches where ``|out - ref| <= atol * max(1, max|ref|) + rtol * |ref|``
    (NaN matches NaN); integer outputs must be equal.

    Examples
    --------
    >>> compare_outputs([np.ones(3, "float32")], [np.ones(3, "float32")]) is None
    True
    >>> print(compare_outputs([np.zeros(3, "float32")], [np.ones(3, "float32")], ["C"]))
    output C differs from the reference: max abs error 1 (max |ref| 1) at index (0,); 3 of 3 elements off (rtol 0.001, atol 0.0001)
    """
    if len(outputs) != len(reference):
        return (f"the kernel writes {len(outputs)} output(s) but the reference has "
                f"{len(reference)}")
    for k, (out, ref) in enumerate(zip(outputs, reference)):
        name = names[k] if names is not None else str(k)
        out, ref = np.asarray(out), np.asarray(ref)
        if out.shape != ref.shape:
            return f"output {name} has shape {out.shape}, the reference {ref.shape}"
        if out.dtype != ref.dtype:
            return f"output {name} has dtype {out.dtype.name}, the reference {ref.dtype.name}"
        d_rtol, d_atol = default_tolerance(out.dtype.name)
        r = d_rtol if rtol is None else rtol
        a = d_atol if atol is None else atol
        if out.dtype.kind in "fc":
            o64, r64 = out.astype(np.float64), ref.astype(np.float64)
            both_nan = np.isnan(o64) & np.isnan(r64)
            finite_ref = r64[np.isfinite(r64)]
            scale = max(1.0, float(np.abs(finite_ref).max())) if finite_ref.size else 1.0
            with np.errstate(invalid="ignore"):
                same = both_nan | (o64 == r64)                      # inf == inf too
                err = np.where(same, 0.0, np.abs(o64 - r64))
                bad = ~(same | (err <= a * scale + r * np.abs(r64)))
        else:
            err = np.abs(out.astype(np.int64) - ref.astype(np.int64)).astype(np.float64) \
                if out.dtype.kind in "iub" else (out != ref).astype(np.float64)
            bad = err != 0
            scale = float(np.abs(ref.astype(np.float64)).max()) if ref.size else 0.0
        if bad.any():
            flat = np.where(bad.ravel(), np.nan_to_num(err.ravel(), nan=np.inf), -1.0)
            worst = int(np.argmax(flat))
            where = tuple(int(i) for i in np.unravel_index(worst, bad.shape)) if bad.ndim else ()
            max_err = float(flat[worst])
            return (f"output {name} differs from the reference: max abs error {max_err:.6g} "
                    f"(max |ref| {scale:.6g}) at index {where}; {int(bad.sum())} of {bad.size} "
                    f"elements off (rtol {r:g}, atol {a:g})")
    return None


# -- caches ---------------------------------------------------------------------------------------
def cache_flush_bytes() -> int:
    """How much to write to evict a kernel's data from this machine's caches: twice the sum of
    every distinct L2-and-beyond cache (from ``/sys/devices/system/cpu``), at least 8 MiB, at
    most 512 MiB; 64 MiB when the caches cannot be read."""
    seen: set[tuple[str, str]] = set()
    total = 0
    for d in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cache/index[0-9]*"):
        try:
            with open(os.path.join(d, "level")) as f:
                level = int(f.read())
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(d, "size")) as f:
                size = f.read().strip()
            with open(os.path.join(d, "shared_cpu_list")) as f:
                shared = f.read().strip()
        except (OSError, ValueError):
            continue
        if level < 2 or kind == "Instruction" or (str(level), shared) in seen:
            continue
        seen.add((str(level), shared))
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        try:
            total += int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        except ValueError:
            continue
    if not total:
        return 64 << 20
    return int(min(max(2 * total, 8 << 20), 512 << 20))


# -- the measuring child ------------------------------------------------------------------------------
def _device_and_arrays(target_kind: str, arrays):
    from tilecraft import targets as _targets
    if target_kind == "llvm":
        return _targets.cpu(0), arrays
    dev = _targets.device(target_kind, 0)
    return dev, [_targets.array(a, dev) if isinstance(a, np.ndarray) else a for a in arrays]


def _measure_here(req: dict, flush) -> dict:
    """Load, check and time one candidate in this process (the forked child)."""
    from tilecraft.targets import load_module
    infos = [ArgInfo.from_json(a) for a in req["args_info"]]
    mod = load_module(req["artifact_path"])
    fname = mod.entry_name
    fn = mod[fname]
    params = fn.params
    if len(params) != len(infos):
        return {"error": f"the library's {fname} takes {len(params)} arguments "
                         f"({', '.join(p['name'] for p in params)}); the runner was given "
                         f"{len(infos)} ArgInfo(s)"}
    arrays = random_inputs(infos, req["seed"])
    call_args = [a[()].item() if info.scalar else a for a, info in zip(arrays, infos)]
    dev, call_args = _device_and_arrays(req["target_kind"], call_args)
    fn(*call_args)
    dev.sync()
    outs = [i for i, p in enumerate(params) if p.get("written")]
    checked = req.get("reference") is not None
    if checked:
        got = [call_args[i].numpy() if hasattr(call_args[i], "numpy") else call_args[i]
               for i in outs]
        msg = compare_outputs(got, req["reference"], [params[i]["name"] for i in outs],
                              req.get("rtol"), req.get("atol"))
        if msg is not None:
            return {"error": f"wrong result: {msg}", "wrong": True}
    # CPU caches matter to CPU kernels; a GPU kernel's data lives in device memory
    timer = mod.time_evaluator(fname, dev, number=req["number"], repeat=req["repeat"],
                               min_repeat_ms=req["min_repeat_ms"],
                               f_preproc=flush if req["target_kind"] == "llvm" else None)
    return {"run_secs": list(timer(*call_args).results), "checked": checked}


_FLUSH: dict[str, object] = {}


def _flusher(nbytes: int):
    """A function that writes ``nbytes`` of memory shared with the forked children (so a
    child's writes fault no pages in: the buffer is touched once here)."""
    if not nbytes:
        return None
    buf = _FLUSH.get("buf")
    if buf is None or len(buf) != nbytes:
        mm = mmap.mmap(-1, nbytes)
        arr = np.frombuffer(mm, dtype=np.uint8)
        arr[:] = 1
        _FLUSH["mm"], _FLUSH["buf"] = mm, arr
        buf = arr
    return lambda: np.add(buf, 1, out=buf)


def _measure_in_worker(req: dict) -> dict:
    """Runs in the worker: fork a child to measure ``req``; report what became of it."""
    flush = _flusher(req["flush_bytes"])
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, send the result, leave without cleanup
        code = 0
        try:
            os.close(rfd)
            try:
                reply = _measure_here(req, flush)
            except BaseException as err:  # the candidate's error is a result
                reply = {"error": f"{type(err).__name__}: {err}"}
            data = pickle.dumps(reply)
            view = memoryview(data)
            while view:
                view = view[os.write(wfd, view):]
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    os.close(wfd)
    deadline = time.monotonic() + req["timeout"]
    chunks = []
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([rfd], [], [], left)
            if not ready:
                timed_out = True
                break
            chunk = os.read(rfd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(rfd)
        if timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(pid, 0)
    if timed_out:
        return {"error": f"the candidate ran past its time limit of {req['timeout']:g} s "
                         f"(killed)"}
    data = b"".join(chunks)
    if data:
        try:
            return pickle.loads(data)
        except Exception:
            pass
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return {"error": f"the candidate crashed the measuring process: {describe_status(code)}"}


# -- the runner --------------------------------------------------------------------------------------
def _check_timing(timeout_sec, number, repeat, min_repeat_ms) -> None:
    if not timeout_sec > 0:
        raise ValueError(f"timeout_sec must be > 0, got {timeout_sec}")
    if int(number) < 1 or int(repeat) < 1:
        raise ValueError(f"number and repeat must be >= 1, got {number}, {repeat}")
    if min_repeat_ms < 0:
        raise ValueError(f"min_repeat_ms must be >= 0, got {min_repeat_ms}")


class LocalRunner:
    """Measure candidates on this machine, each in a process of its own.

    Parameters
    ----------
    timeout_sec : float
        The longest one candidate may take (loading, the checked call and the timing runs).
    number, repeat, min_repeat_ms
        As ``time_evaluator``: ``repeat`` measurements of ``number`` calls each, ``number``
        grown until a measurement takes ``min_repeat_ms``; ``run_secs`` has one entry per
        repeat.
    enable_cpu_cache_flush : bool
        Write ``cache_flush_bytes()`` of memory before each repeat (cold caches).
    rtol, atol : float, optional
        Tolerances of the correctness check (default by dtype: ``default_tolerance``).
    cleanup : bool
        Remove each artifact (a builder's temporary directory) once it is measured.

    Examples
    --------
    >>> runner = LocalRunner(timeout_sec=5)                                  # doctest: +SKIP
    >>> [r.error_msg for r in runner.run(inputs)]                            # doctest: +SKIP
    [None, 'the candidate crashed the measuring process: killed by signal 11 (SIGSEGV, ...)']
    """

    def __init__(self, timeout_sec: float = 10.0, number: int = 3, repeat: int = 1,
                 min_repeat_ms: float = 50, enable_cpu_cache_flush: bool = True, *,
                 rtol: float | None = None, atol: float | None = None, cleanup: bool = True):
        _check_timing(timeout_sec, number, repeat, min_repeat_ms)
        self.timeout_sec = float(timeout_sec)
        self.number, self.repeat = int(number), int(repeat)
        self.min_repeat_ms = float(min_repeat_ms)
        self.enable_cpu_cache_flush = bool(enable_cpu_cache_flush)
        self.rtol, self.atol = rtol, atol
        self.cleanup = cleanup
        self._flush_bytes = cache_flush_bytes() if enable_cpu_cache_flush else 0
        self._worker = PopenWorker()

    def run(self, inputs: list[RunnerInput]) -> list[RunnerResult]:
        """Measure every input, one after another; one ``RunnerResult`` per input, in order."""
        return [self._run_one(inp) for inp in inputs]

    def _run_one(self, inp: RunnerInput) -> RunnerResult:
        if inp.artifact_path is None:
            return RunnerResult(None, "no artifact to run (the build failed)")
        try:
            try:
                target = inp.target if isinstance(inp.target, Target) else Target(inp.target)
                req = {"artifact_path": os.path.abspath(inp.artifact_path),
                       "target_kind": target.kind,
                       "args_info": [a.to_json() for a in inp.args_info],
                       "seed": int(inp.seed),
                       "reference": None if inp.reference is None else
                       [np.asarray(r) for r in inp.reference],
                       "number": self.number, "repeat": self.repeat,
                       "min_repeat_ms": self.min_repeat_ms, "flush_bytes": self._flush_bytes,
                       "rtol": self.rtol, "atol": self.atol, "timeout": self.timeout_sec}
            except Exception as err:
                return RunnerResult(None, f"{type(err).__name__}: {err}")
            try:
                # the worker enforces the candidate's limit; this one is for the worker itself
                reply = self._worker.call(_measure_in_worker, req,
                                          timeout=self.timeout_sec + 60)
            except (WorkerDied, WorkerTimeout) as err:
                return RunnerResult(None, f"the measuring worker failed: {err} (restarted)")
            except WorkerError as err:
                return RunnerResult(None, f"the measuring worker failed: {err}")
            if "error" in reply:
                return RunnerResult(None, reply["error"], bool(reply.get("wrong")))
            secs = [float(t) for t in reply["run_secs"]]
            if not all(math.isfinite(t) and t >= 0 for t in secs):
                return RunnerResult(None, f"the timings are not finite: {secs}")
            return RunnerResult(secs, None, checked=bool(reply.get("checked")))
        finally:
            if self.cleanup:
                remove_artifact(inp.artifact_path)

    def close(self) -> None:
        """End the worker process (it starts again on the next ``run``)."""
        self._worker.kill()

    def __enter__(self) -> "LocalRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
