"""Helpers of the command-line tests: ``tilecraft`` run as a user would, from a directory outside
the checkout (the checkout on ``PYTHONPATH``, as an installed package would be on ``sys.path``),
optionally with packages made unimportable; a tiny ONNX model; background ``tilecraft rpc``
processes.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOST = "127.0.0.1"

# what a board has not: `pip install --no-deps tilecraft numpy`
BOARD_BLOCKED = ("llvmlite", "xgboost", "onnx", "onnxruntime", "pyopencl", "wgpu", "torch")

# `python -m tilecraft ARGS` with some top-level packages unimportable (ModuleNotFoundError, as
# when they are not installed): a meta-path finder ahead of the real ones
_PRELUDE = """
import importlib.abc, runpy, sys
BLOCKED = set(sys.argv[1].split(",")) - {""}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
sys.argv = ["tilecraft"] + sys.argv[2:]
runpy.run_module("tilecraft", run_name="__main__", alter_sys=True)
"""


def env(**extra) -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e["PYTHONUNBUFFERED"] = "1"
    e.update(extra)
    return e


def command(*args, block=()) -> list[str]:
    """The argv of ``tilecraft ARGS`` (with ``block``: those packages made unimportable)."""
    if block:
        return [sys.executable, "-c", _PRELUDE, ",".join(block), *map(str, args)]
    return [sys.executable, "-m", "tilecraft", *map(str, args)]


def tilecraft(*args, cwd, check=True, block=(), timeout=600, **extra_env):
    """Run ``tilecraft ARGS`` in ``cwd`` (a directory outside the checkout)."""
    assert not os.path.abspath(str(cwd)).startswith(ROOT + os.sep), cwd
    proc = subprocess.run(command(*args, block=block), cwd=str(cwd), env=env(**extra_env),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"tilecraft {' '.join(map(str, args))} exited {proc.returncode}:"
                             f"\n{proc.stdout}\n{proc.stderr}")
    return proc


def last_error(proc) -> str:
    """The last stderr line (after any progress lines): ``tilecraft: error: ...``."""
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def tiny_onnx(path, rng=None):
    """y = relu(x @ W + B), x: (batch, 8) with a symbolic batch; returns (W, B)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = rng or np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype("float32")
    b = rng.standard_normal(4).astype("float32")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Add", ["h", "B"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [numpy_helper.from_array(w, "W"),
                                                       numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return w, b


def _die_with_parent() -> None:
    # a test process killed hard runs no teardown: the kernel kills this child too (Linux)
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Background:
    """A ``tilecraft rpc server|tracker`` (or any command printing "... listening on HOST:PORT
    ...") in its own process group; ``port`` is where it listens. ``stop()`` kills the group."""

    def __init__(self, cmd: list[str], cwd, env_: dict | None = None,
                 ready_timeout: float = 120.0):
        self.cmd = cmd
        self.log = tempfile.TemporaryFile(mode="w+")
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                      env=env_ or env(), cwd=str(cwd), start_new_session=True,
                                      preexec_fn=_die_with_parent)
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        try:
            line = self.lines.get(timeout=ready_timeout)
        except queue.Empty:
            line = ""
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"{' '.join(cmd)} did not start:\n{line}\n{self.stderr()}")
        self.first_line = line
        self.port = int(line.split("listening on ")[1].split()[0].rsplit(":", 1)[1])

    def _pump(self):
        for line in self.popen.stdout:
            self.lines.put(line)
        self.lines.put("")

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        for _ in range(2):   # the group may outlive its leader (a server's sessions)
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
