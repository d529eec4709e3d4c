"""``RPCRunner``: measure candidates on remote boards through an RPC tracker.

``RPCRunner(tracker=("host", 9190), key="rasp4").run(inputs)`` is ``LocalRunner.run`` on the
boards registered under ``key``: one worker thread per board of the key (the tracker's
``summary()`` says how many), each holding a session on one board and measuring candidates from
a shared queue, so two boards measure twice as many candidates per minute. For each candidate
the worker uploads the library, fills the arguments from ``random_inputs(args_info, seed)`` (the
same arrays the reference was computed on here), calls the kernel once, fetches and checks the
outputs against ``reference``, and times it with the board's ``time_evaluator`` (on the board's
clock; with ``enable_cpu_cache_flush`` the board writes a large buffer before each repeat).

Faults cost one trial, never the run:

* a kernel that crashes or runs past ``timeout_sec`` ends its session on the board
  (``rpc.SessionLost``): the trial fails with the board's explanation and the worker opens a
  new session;
* a board that dies or drops off the network mid-measurement fails the trial in flight; the
  worker asks the tracker for another board and goes on (the tracker drops the dead board);
* a board lost before the kernel ran (during the upload) costs nothing: the candidate is
  measured on the next session.

When no board of the key is left, the candidates still waiting fail with that reason. An
unreachable tracker, or a key with no board registered, raises ``TuneError`` from ``run``.

Examples
--------
>>> runner = RPCRunner(tracker=("127.0.0.1", 9190), key="rasp4", timeout_sec=20)   # doctest: +SKIP
>>> results = runner.run(inputs)                                                   # doctest: +SKIP
"""
from __future__ import annotations

import math
import os
import queue
import threading
import time

import numpy as np

from tilecraft import rpc
from tilecraft.targets import Target

from .arg_info import random_inputs
from .builder import remove_artifact
from .errors import TuneError
from .runner import RunnerInput, RunnerResult, _check_timing, compare_outputs

__all__ = ["RPCRunner"]

# errors of the connection rather than of the candidate
_LINK_ERRORS = (rpc.SessionLost, rpc.ConnectionClosed, rpc.ProtocolError, rpc.RPCTimeoutError,
                ConnectionError, OSError)


def _parse_tracker(tracker) -> tuple[str, int]:
    if isinstance(tracker, str):
        host, sep, port = tracker.rpartition(":")
        if not sep or not host:
            raise ValueError(f"RPCRunner: tracker must be 'HOST:PORT' or (host, port), got "
                             f"{tracker!r}")
        return host, int(port)
    if isinstance(tracker, (tuple, list)) and len(tracker) == 2:
        return str(tracker[0]), int(tracker[1])
    raise ValueError(f"RPCRunner: tracker must be 'HOST:PORT' or (host, port), got {tracker!r}")


class _Lost(Exception):
    """The session went away before the candidate's kernel ran: measure it elsewhere."""


class _RunState:
    """What the workers of one ``run`` share: the queue, the results, what is left."""

    def __init__(self, inputs, results, todo, cleanup: bool):
        self.inputs, self.results, self.todo = inputs, results, todo
        self.cleanup = cleanup
        self.left = todo.qsize()
        self.done = threading.Event()   # every candidate has its result
        self.lock = threading.Lock()
        self.lost_once: set[int] = set()

    def lost(self, i: int) -> bool:
        """Note that candidate ``i`` lost its board before running; True the second time."""
        with self.lock:
            if i in self.lost_once:
                return True
            self.lost_once.add(i)
            return False

    def finish(self, i: int, result: RunnerResult) -> None:
        self.results[i] = result
        if self.cleanup:
            remove_artifact(self.inputs[i].artifact_path)
        with self.lock:
            self.left -= 1
            if self.left <= 0:
                self.done.set()


class RPCRunner:
    """Measure candidates on the boards of ``key`` registered with a tracker.

    Parameters
    ----------
    tracker : str or (str, int)
        ``"host:port"`` or ``(host, port)`` of ``python -m tilecraft.rpc.tracker``.
    key : str
        The boards' key (``python -m tilecraft.rpc.server --key KEY``).
    token : str or bytes, optional
        The boards' shared secret (their ``--token-file``): sessions are authenticated both
        ways and every frame carries a MAC, so neither an impostor board nor anyone on the
        network can put a timing or a result into the tuning database.
    tracker_token : str or bytes, optional
        The tracker's own secret (its ``--token-file``).
    timeout_sec : float
        Time limit of each call and each timing run on the board; past it the board kills the
        session and the trial fails.
    number, repeat, min_repeat_ms, enable_cpu_cache_flush
        As ``LocalRunner``.
    cache_flush_bytes : int
        What the board writes before each repeat when flushing (32 MiB: more than the caches
        of the boards one tunes for).
    rtol, atol : float, optional
        Tolerances of the correctness check (``runner.default_tolerance`` by dtype).
    request_timeout : float
        How long a worker waits for a free board (and ``run`` for the first board to register).
    session_timeout : float
        Connection and ordinary-request timeout of a session.
    max_workers : int, optional
        At most this many boards at once (default: every board of the key).
    trials_per_session : int
        A worker opens a fresh session after this many candidates, so the loaded libraries of
        old candidates do not pile up in the board's session process.
    cleanup : bool
        Remove each local artifact once measured.

    Examples
    --------
    >>> runner = RPCRunner("192.168.1.10:9190", "rasp4", token=board_token,
    ...                    tracker_token=tracker_token)                     # doctest: +SKIP
    >>> [r.run_secs for r in runner.run(inputs)]                            # doctest: +SKIP
    """

    def __init__(self, tracker, key: str, token=None, *, tracker_token=None,
                 timeout_sec: float = 10.0,
                 number: int = 3, repeat: int = 1, min_repeat_ms: float = 50,
                 enable_cpu_cache_flush: bool = True, cache_flush_bytes: int = 32 << 20,
                 rtol: float | None = None, atol: float | None = None,
                 request_timeout: float = 60.0, session_timeout: float = 30.0,
                 max_workers: int | None = None, trials_per_session: int = 64,
                 cleanup: bool = True):
        self.host, self.port = _parse_tracker(tracker)
        if not isinstance(key, str) or not key:
            raise ValueError(f"RPCRunner: key must be a non-empty string, got {key!r}")
        _check_timing(timeout_sec, number, repeat, min_repeat_ms)
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"RPCRunner: max_workers must be >= 1, got {max_workers}")
        self.key = key
        self.token = token
        self.timeout_sec = float(timeout_sec)
        self.number, self.repeat = int(number), int(repeat)
        self.min_repeat_ms = float(min_repeat_ms)
        self.enable_cpu_cache_flush = bool(enable_cpu_cache_flush)
        self.cache_flush_bytes = int(cache_flush_bytes) if enable_cpu_cache_flush else 0
        self.rtol, self.atol = rtol, atol
        self.request_timeout = float(request_timeout)
        self.session_timeout = float(session_timeout)
        self.max_workers = max_workers
        self.trials_per_session = max(1, int(trials_per_session))
        self.cleanup = cleanup
        self.tracker = rpc.connect_tracker(self.host, self.port, token=tracker_token)
        self.last_num_workers = 0   # workers the last run used (one per board)

    def __repr__(self):
        return f"RPCRunner(tracker='{self.host}:{self.port}', key={self.key!r})"

    def close(self) -> None:
        """Nothing to release: sessions end with each ``run`` (for symmetry with LocalRunner)."""

    def __enter__(self) -> "RPCRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- boards -----------------------------------------------------------------------------
    def num_servers(self) -> int:
        """Boards of ``key`` registered with the tracker now (free or busy)."""
        try:
            info = self.tracker.summary()
        except (OSError, rpc.RPCError) as err:
            raise TuneError(f"RPCRunner: cannot reach the tracker at {self.host}:{self.port}: "
                            f"{type(err).__name__}: {err}") from None
        return int(info.get("queue_info", {}).get(self.key, {}).get("total", 0))

    def _wait_for_servers(self) -> int:
        deadline = time.monotonic() + self.request_timeout
        while True:
            n = self.num_servers()
            if n:
                return n
            if time.monotonic() > deadline:
                keys = sorted(self.tracker.summary().get("queue_info", {}))
                raise TuneError(f"RPCRunner: no server of key {self.key!r} registered with the "
                                f"tracker at {self.host}:{self.port} within "
                                f"{self.request_timeout:g} s (it has keys: "
                                f"{', '.join(keys) or 'none'})")
            time.sleep(0.2)

    def _open(self, stop: threading.Event):
        """A session on a free board; None if none comes within ``request_timeout`` or the
        queue ran dry meanwhile (``stop``). Asks in short steps so a worker waiting for a board
        notices that the others finished the work."""
        deadline = time.monotonic() + self.request_timeout
        last = None
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                return self.tracker.request(self.key, timeout=min(left, 2.0), token=self.token,
                                            session_timeout=self.session_timeout,
                                            call_timeout=self.timeout_sec)
            except rpc.TrackerError as err:
                last = err
            except (OSError, rpc.RPCError) as err:   # the tracker itself: retry until the end
                last = err
                time.sleep(0.5)
        self._last_open_error = last
        return None

    # -- running ----------------------------------------------------------------------------
    def run(self, inputs: list[RunnerInput]) -> list[RunnerResult]:
        """Measure every input on the boards; one ``RunnerResult`` per input, in order."""
        inputs = list(inputs)
        results: list[RunnerResult | None] = [None] * len(inputs)
        todo: "queue.Queue[int]" = queue.Queue()
        for i, inp in enumerate(inputs):
            if inp.artifact_path is None:
                results[i] = RunnerResult(None, "no artifact to run (the build failed)")
            else:
                todo.put(i)
        if todo.empty():
            return results  # type: ignore[return-value]
        n = min(self._wait_for_servers(), todo.qsize())
        if self.max_workers is not None:
            n = min(n, self.max_workers)
        self.last_num_workers = n
        self._last_open_error = None
        state = _RunState(inputs, results, todo, self.cleanup)
        threads = [threading.Thread(target=self._worker, args=(state,), name=f"rpc-runner-{k}",
                                    daemon=True) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        why = self._last_open_error
        for i, r in enumerate(results):
            if r is None:   # every worker gave up waiting for a board
                state.finish(i, RunnerResult(
                    None, f"no board of key {self.key!r} was available to measure it (within "
                          f"{self.request_timeout:g} s)" + (f": {why}" if why else "")))
        return results  # type: ignore[return-value]

    def _worker(self, state: "_RunState") -> None:
        """Measure candidates from the queue on one board. A worker holds a session only while
        it has one: when its board goes away it puts its candidate back (unless the kernel had
        started: then the trial failed) and waits for another board."""
        sess = None
        used = 0
        try:
            while not state.done.is_set():
                if sess is None or used >= self.trials_per_session:
                    if sess is not None:
                        _close(sess)
                    sess, used = self._open(state.done), 0
                    if sess is None:
                        return   # no board within request_timeout, or nothing left to do
                try:
                    i = state.todo.get(timeout=0.05)
                except queue.Empty:
                    continue     # the others' candidates may still come back
                try:
                    result, alive = self._measure(sess, state.inputs[i])
                except _Lost as err:
                    _close(sess)
                    sess = None
                    if state.lost(i):   # lost twice before it could run: give up on it
                        state.finish(i, RunnerResult(None, f"lost the board twice while putting "
                                                           f"the candidate on it: {err}"))
                    else:
                        state.todo.put(i)
                    continue
                used += 1
                state.finish(i, result)
                if not alive:
                    _close(sess)
                    sess = None
        finally:
            if sess is not None:
                _close(sess)

    def _measure(self, sess: "rpc.Session", inp: RunnerInput) -> tuple[RunnerResult, bool]:
        """Measure ``inp`` in ``sess``: the result and whether the session is still usable.
        Raises ``_Lost`` when the link failed before the kernel ran."""
        # 1. put the candidate on the board: a failure of the link here is not the candidate's
        try:
            with open(inp.artifact_path, "rb") as f:
                data = f.read()
        except OSError as err:
            return RunnerResult(None, f"cannot read the artifact {inp.artifact_path}: {err}"), True
        try:
            target = inp.target if isinstance(inp.target, Target) else Target(inp.target)
            name = sess.upload(data, "candidate.so")
            try:
                mod = sess.load_module(name)
            except rpc.RemoteError as err:   # the board could not load it: the candidate's fault
                return RunnerResult(None, f"the board cannot load the library: {err}"), True
            entry = mod.entry_name
            fmeta = next((f for f in mod.metadata.get("functions", []) if f["name"] == entry),
                         None)
            params = fmeta["params"] if fmeta else []
            if len(params) != len(inp.args_info):
                return RunnerResult(None, f"the library's {entry} takes {len(params)} arguments; "
                                          f"the runner was given {len(inp.args_info)} ArgInfo(s)"
                                    ), True
            dev = sess.cpu(0) if target.kind == "llvm" else sess.device(target.kind, 0)
            arrays = random_inputs(inp.args_info, inp.seed)
            args = [a[()].item() if info.scalar else sess.array(a, dev)
                    for a, info in zip(arrays, inp.args_info)]
        except rpc.RemoteError as err:   # e.g. an array over the board's limits
            return RunnerResult(None, f"{err}"), True
        except _LINK_ERRORS as err:
            raise _Lost(f"{type(err).__name__}: {err}") from None
        except (ValueError, TypeError) as err:   # refused here (too big for the board, ...)
            return RunnerResult(None, f"{type(err).__name__}: {err}"), True
        # 2. run, check, time: a failure now may be the candidate's (a crash) or the board's
        where = f"board {sess.address[0]}:{sess.address[1]}"
        try:
            mod[entry](*args, timeout=self.timeout_sec)
            outs = [i for i, p in enumerate(params) if p.get("written")]
            checked = inp.reference is not None
            if checked:
                got = [args[i].numpy() for i in outs]
                msg = compare_outputs(got, [np.asarray(r) for r in inp.reference],
                                      [params[i]["name"] for i in outs], self.rtol, self.atol)
                if msg is not None:
                    return RunnerResult(None, f"wrong result: {msg}", wrong=True), True
            timer = mod.time_evaluator(entry, dev, number=self.number, repeat=self.repeat,
                                       min_repeat_ms=self.min_repeat_ms, timeout=self.timeout_sec,
                                       cache_flush_bytes=self.cache_flush_bytes)
            secs = [float(t) for t in timer(*args).results]
        except rpc.RemoteError as err:   # the kernel refused its arguments; the session goes on
            return RunnerResult(None, f"{err}"), True
        except rpc.SessionLost as err:
            return RunnerResult(None, f"the session on {where} ended during the measurement: "
                                      f"{err}"), False
        except rpc.RPCTimeoutError as err:
            return RunnerResult(None, f"{where} stopped answering during the measurement: "
                                      f"{err}"), False
        except (rpc.ConnectionClosed, rpc.ProtocolError, ConnectionError, OSError) as err:
            return RunnerResult(None, f"lost {where} during the measurement: "
                                      f"{type(err).__name__}: {err}"), False
        if not all(math.isfinite(t) and t >= 0 for t in secs):
            return RunnerResult(None, f"the timings are not finite: {secs}"), True
        return RunnerResult(secs, None, checked=checked), True


def _close(sess) -> None:
    try:
        sess.close()
    except Exception:
        pass
