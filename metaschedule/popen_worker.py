"""A Python process of our own that runs functions sent to it (TVM's ``PopenWorker``).

The builder and the runner do their risky work — compiling with LLVM, running candidate kernels —
in worker processes, so that a crash, a hang or a leak there costs one candidate, never the
tuner. A worker is a fresh interpreter (``python -m tilecraft.metaschedule.popen_worker``), not a fork of
the tuner: the tuner may have threads (LLVM's, a thread pool of a kernel, xgboost's), and a
forked copy of a threaded process may deadlock; nor is the user's ``__main__`` imported again,
as ``multiprocessing``'s spawn would.

Calls go over a pair of pipes as length-prefixed pickles (our own process on both ends; the RPC
protocol to boards never uses pickle). ``PopenWorker.call(fn, *args, timeout=...)`` returns the
function's result, re-raises its exception as ``WorkerError``, and raises ``WorkerTimeout`` or
``WorkerDied`` — after killing the worker, which starts again on the next call.

Examples
--------
>>> w = PopenWorker()
>>> w.call(divmod, 7, 2, timeout=30)
(3, 1)
>>> w.close()
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

from tilecraft.errors import TilecraftError

__all__ = ["PopenWorker", "WorkerError", "WorkerTimeout", "WorkerDied", "describe_status"]

_HEADER = struct.Struct("<Q")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WorkerError(TilecraftError, RuntimeError):
    """The function raised in the worker; ``remote_type`` is its exception's class name and
    ``remote_traceback`` the worker's traceback."""

    def __init__(self, message: str, remote_type: str = "Exception", remote_traceback: str = ""):
        super().__init__(message)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback


class WorkerTimeout(TilecraftError, RuntimeError):
    """The call ran past its time limit; the worker was killed."""


class WorkerDied(TilecraftError, RuntimeError):
    """The worker process ended during the call (a crash: ``describe_status`` says how)."""


def describe_status(status: int) -> str:
    """A process's exit as words: ``"killed by signal 11 (SIGSEGV, segmentation fault)"``.

    ``status`` is a ``subprocess`` return code: negative for a signal.
    """
    if status < 0:
        sig = -status
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        what = {signal.SIGSEGV: "segmentation fault", signal.SIGBUS: "bus error",
                signal.SIGILL: "illegal instruction", signal.SIGFPE: "arithmetic exception",
                signal.SIGABRT: "aborted", signal.SIGKILL: "killed"}.get(sig)
        return f"killed by signal {sig} ({name}{', ' + what if what else ''})"
    return f"exited with status {status}"


def _write_frame(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """``n`` bytes from ``fd``; None at end of file; TimeoutError past ``deadline``."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_body(fd: int, deadline: float | None = None) -> bytes:
    head = _read_exact(fd, _HEADER.size, deadline)
    if head is None:
        raise EOFError
    body = _read_exact(fd, _HEADER.unpack(head)[0], deadline)
    if body is None:
        raise EOFError
    return body


def _read_frame(fd: int, deadline: float | None = None):
    return pickle.loads(_read_body(fd, deadline))


class PopenWorker:
    """One worker process; started on the first call and again after a crash or a timeout.

    Parameters
    ----------
    env : dict, optional
        Extra environment variables of the worker.

    Its standard output and error go to a private log file; the tail of it is in the message of
    ``WorkerDied`` (what a crashing library printed).
    """

    def __init__(self, env: dict | None = None):
        self.env = dict(env or {})
        self._proc: subprocess.Popen | None = None
        self._to_child = self._from_child = None
        self._log = None
        self._log_start = 0
        self.restarts = -1   # starts so far, minus the first

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        if self.alive:
            return
        self.kill()
        c_read, p_write = os.pipe()
        p_read, c_write = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = _REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                     else "")
        env.update(self.env)
        self._log = tempfile.TemporaryFile(prefix="tilecraft-worker-")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tilecraft.metaschedule.popen_worker", str(c_read), str(c_write)],
                pass_fds=(c_read, c_write), stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=self._log, env=env, cwd=_REPO, start_new_session=True)
        finally:
            os.close(c_read)
            os.close(c_write)
        self._to_child, self._from_child = p_write, p_read
        self.restarts += 1

    def call(self, fn: Callable, *args, timeout: float | None = None, **kwargs) -> Any:
        """Run ``fn(*args, **kwargs)`` in the worker; ``fn`` must be importable by name."""
        self.start()
        self._log.seek(0, os.SEEK_END)
        self._log_start = self._log.tell()
        try:
            _write_frame(self._to_child, (fn, args, kwargs))
        except (BrokenPipeError, OSError):
            return self._died()
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        try:
            kind, payload = _read_frame(self._from_child, deadline)
        except TimeoutError:
            self.kill()
            raise WorkerTimeout(f"ran past its time limit of {timeout:g} s (the worker process "
                                f"was killed)") from None
        except (EOFError, OSError, pickle.UnpicklingError):
            return self._died()
        if kind == "ok":
            return payload
        type_name, message, tb = payload
        raise WorkerError(f"{type_name}: {message}", type_name, tb)

    def _died(self):
        proc = self._proc
        try:
            status = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            status = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        tail = self.output_tail()
        self.kill()
        raise WorkerDied(f"the worker process {describe_status(status)}"
                         + (f"; its last output: {tail}" if tail else ""))

    def output_tail(self, limit: int = 600) -> str:
        """What the worker printed since the current call started (the end of it)."""
        if self._log is None:
            return ""
        try:
            self._log.seek(self._log_start)
            data = self._log.read()
        except (OSError, ValueError):
            return ""
        text = data.decode("utf-8", "replace").strip()
        return text[-limit:]

    def kill(self) -> None:
        """Kill the worker (and whatever it started); the next call starts a new one."""
        proc, self._proc = self._proc, None
        for fd in (self._to_child, self._from_child):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._to_child = self._from_child = None
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    close = kill

    def __del__(self):
        try:
            self.kill()
        except Exception:
            pass

    def __repr__(self):
        return f"<PopenWorker pid={self.pid} alive={self.alive}>"


def _serve(read_fd: int, write_fd: int) -> None:
    while True:
        try:
            body = _read_body(read_fd)
        except EOFError:
            return  # the parent went away
        try:
            fn, args, kwargs = pickle.loads(body)  # may import the function's module
            reply = ("ok", fn(*args, **kwargs))
        except BaseException as err:  # everything goes back to the parent
            reply = ("error", (type(err).__name__, str(err), traceback.format_exc()))
        try:
            _write_frame(write_fd, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            _write_frame(write_fd, ("error", (type(err).__name__,
                                              f"the result could not be sent back: {err}", "")))


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
