"""Helpers of the rpc tests: loopback servers and trackers in their own processes, kernels.

Everything listens on 127.0.0.1 only. Each process runs in its own process group, which the
fixture kills at the end, so a failing test leaves nothing behind.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

from capabilities import needs_lld  # noqa: F401  (the rpc tests' mark)
from tilecraft.tensorir import te

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOST = "127.0.0.1"


def repo_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _die_with_parent() -> None:
    # a test process killed hard (SIGKILL, a crashed pytest) runs no fixture teardown: ask the
    # kernel to kill this child too, so no orphan server outlives the test run (Linux only)
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Proc:
    """A server or tracker process started by a test; ``port`` is where it listens."""

    def __init__(self, cmd: list[str], env: dict | None = None, ready_timeout: float = 60.0,
                 wait: bool = True, cwd: str = REPO):
        self.cmd = cmd
        self.log = tempfile.TemporaryFile(mode="w+")
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                      env=env or repo_env(), cwd=cwd, start_new_session=True,
                                      preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.port = None
        self.ready_timeout = ready_timeout
        if wait:
            self.ready()

    def ready(self) -> "Proc":
        """Wait for the "listening" line: "rpc server listening on 127.0.0.1:PORT ..."."""
        if self.port is None:
            self.first_line = self.wait_line(self.ready_timeout)
            self.port = int(self.first_line.split()[4].rsplit(":", 1)[1])
        return self

    def _pump(self):
        for line in self.popen.stdout:
            self.lines.put(line)
        self.lines.put("")

    def wait_line(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if not line:
            self.stop()
            raise RuntimeError(f"{' '.join(self.cmd)} did not start:\n{self.stderr()}")
        return line

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig) -> None:
        os.kill(self.popen.pid, sig)

    def stop(self) -> None:
        """Kill the process group (the server, its launcher and its sessions)."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        # the group may outlive its leader (sessions): make sure it is gone
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _insecure_unless_token(args) -> list[str]:
    """A loopback test server without --token-file must say --insecure-local."""
    return [] if "--token-file" in args or "--insecure-local" in args else ["--insecure-local"]


def start_server(*args, key: str = "test", port: int = 0, tracker: int | None = None,
                 wait: bool = True) -> Proc:
    cmd = [sys.executable, "-m", "tilecraft.rpc.server", "--host", HOST, "--port", str(port),
           "--key", key, "-v", *args, *_insecure_unless_token(args)]
    if tracker is not None:
        cmd += ["--tracker", f"{HOST}:{tracker}", "--tracker-retry", "0.2"]
    return Proc(cmd, wait=wait)


def start_tracker(*args, port: int = 0) -> Proc:
    return Proc([sys.executable, "-m", "tilecraft.rpc.tracker", "--host", HOST, "--port",
                 str(port), "-v", *args, *_insecure_unless_token(args)])


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# -- kernels ------------------------------------------------------------------------------------
def axpb_func():
    """B = A * 2 + c over (n, 7): a symbolic dimension and a scalar."""
    n = te.var("n")
    c = te.var("c", "float32")
    A = te.placeholder((n, 7), "float32", "A")
    B = te.compute((n, 7), lambda i, j: A[i, j] * 2.0 + c, "B")
    return te.create_prim_func([A, B, c])


FAULTY_C = r"""
#include <stdint.h>
const int32_t tilecraft_abi_version = 1;
int32_t tilecraft_num_threads = 1;
const char tilecraft_metadata[] =
  "{\"abi_version\": 1, \"target\": \"c\", \"triple\": \"host\", \"num_cores\": 1,"
  " \"entry\": \"ok\", \"functions\": ["
  "{\"name\": \"ok\", \"symbol\": \"tilecraft_fn_ok\", \"shape_vars\": [], \"params\": []},"
  "{\"name\": \"crash\", \"symbol\": \"tilecraft_fn_crash\", \"shape_vars\": [], \"params\": []},"
  "{\"name\": \"spin\", \"symbol\": \"tilecraft_fn_spin\", \"shape_vars\": [], \"params\": []}]}";
const char *tilecraft_get_last_error(void) { return ""; }
int32_t tilecraft_fn_ok(void *args, int32_t *codes, int32_t n) { return 0; }
int32_t tilecraft_fn_crash(void *args, int32_t *codes, int32_t n) {
  volatile int32_t *p = (volatile int32_t *)0;   /* a kernel that dereferences NULL */
  return *p;
}
int32_t tilecraft_fn_spin(void *args, int32_t *codes, int32_t n) {
  volatile uint64_t i = 0;                        /* a kernel that never returns */
  for (;;) i++;
  return 0;
}
"""
