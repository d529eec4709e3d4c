"""Modules of GPU kernels: the host program interpreter shared by the GPU back ends.

A GPU module (``targets.build(func, "opencl")``) holds, per function, a *host program* (plain
JSON, see ``targets.gpu_build``) and the kernels' source. Calling ``mod["main"](*arrays)``:

1. checks the arguments: device arrays of the module's device kind, one device for all, the
   right count, dtypes and ranks; binds each symbolic dim from the first dimension that is
   exactly that variable and checks every other dimension against its expression;
2. runs the host program: run-time checks (``ValueError`` with the lowering's message),
   device temporaries, and kernel launches with their grid evaluated from the dims — each
   array checked to have fewer than 2**31 elements and each scalar to fit in int32, as the
   kernels index in 32 bits;
3. after a kernel that reports errors (``kernel_error``), reads the flag back and raises the
   message of the check that failed.

A back end subclasses ``DeviceModule`` and supplies ``_loaded(device)``: an object with
``launch(kernel, arrays, scalars, grid, block) -> event`` (the kernel source compiled for that
device, cached), ``error_buffer()`` / ``read_error(buf)`` and ``elapsed(events) -> seconds``
(from the device's own timestamps, for ``time_evaluator``).

This module needs only numpy: no tensorir, no driver library.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from .device import Device, device_runtime
from .module import BenchmarkResult, Module, repeat_timings
from .ndarray import NDArray

INT32_MAX = 2 ** 31 - 1


class DeviceKernelError(ValueError):
    """A run-time check inside a kernel failed (an index out of bounds, ...)."""


def _floordiv(a, b):
    if b == 0:
        raise ValueError("division by zero in a shape expression")
    return a // b


def _floormod(a, b):
    if b == 0:
        raise ValueError("division by zero in a shape expression")
    return a % b


def _truncdiv(a, b):
    if b == 0:
        raise ValueError("division by zero in a shape expression")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _truncmod(a, b):
    return a - _truncdiv(a, b) * b


_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "floordiv": _floordiv, "floormod": _floormod, "div": _truncdiv, "mod": _truncmod,
        "min": min, "max": max, "eq": lambda a, b: int(a == b), "ne": lambda a, b: int(a != b),
        "lt": lambda a, b: int(a < b), "le": lambda a, b: int(a <= b),
        "gt": lambda a, b: int(a > b), "ge": lambda a, b: int(a >= b),
        "and": lambda a, b: int(bool(a) and bool(b)), "or": lambda a, b: int(bool(a) or bool(b))}


def eval_expr(e, env: dict) -> int:
    """Evaluate a host-program expression (``targets.gpu_build``'s JSON form)."""
    if isinstance(e, int):
        return e
    op = e[0]
    if op == "var":
        try:
            return env[e[1]]
        except KeyError:
            raise ValueError(f"host program: variable {e[1]} is not bound") from None
    if op == "not":
        return int(not eval_expr(e[1], env))
    if op == "select":
        return eval_expr(e[2], env) if eval_expr(e[1], env) else eval_expr(e[3], env)
    fn = _OPS.get(op)
    if fn is None:
        raise ValueError(f"host program: unknown operator {op!r}")
    return fn(eval_expr(e[1], env), eval_expr(e[2], env))


def expr_text(e) -> str:
    """Readable text of a JSON expression (for messages)."""
    if isinstance(e, int):
        return str(e)
    if e[0] == "var":
        return e[1]
    sym = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "floormod": "%"}.get(e[0])
    if sym and len(e) == 3:
        return f"{expr_text(e[1])} {sym} {expr_text(e[2])}"
    return f"{e[0]}({', '.join(expr_text(x) for x in e[1:])})"


class DeviceFunction:
    """A function of a ``DeviceModule``; call it with device arrays (and ints for scalars)."""

    def __init__(self, module: "DeviceModule", program: dict):
        self.module = module
        self.program = program
        self.name = program["name"]
        self.params = program["params"]
        self.meta = program

    def __repr__(self):
        return f"<tilecraft.DeviceFunction {self.name}({', '.join(p['name'] for p in self.params)})>"

    def _check_runnable(self):
        reason = self.module._unavailable_reason()
        if reason:
            raise RuntimeError(reason)

    # -- arguments --------------------------------------------------------------------------
    def bind(self, args: Sequence[Any]) -> tuple[Device, list, dict]:
        """Check ``args``; the device, the buffer table (arguments first) and the scalars."""
        params = self.params
        if len(args) != len(params):
            raise TypeError(f"{self.name} takes {len(params)} argument(s) "
                            f"({', '.join(p['name'] for p in params)}), got {len(args)}")
        kind = self.module.device_kind
        device = None
        buffers = []
        env: dict[str, int] = {}
        pending = []
        for p, a in zip(params, args):
            pname = p["name"]
            if p["kind"] == "buffer":
                if isinstance(a, np.ndarray) or (isinstance(a, NDArray) and
                                                 a.device.kind == "cpu"):
                    raise ValueError(f"{self.name}: argument {pname} is in host memory; this "
                                     f"kernel runs on {kind}: copy it there first with "
                                     f"targets.array(x, targets.{kind}(i))")
                if not isinstance(a, NDArray) or a.device.kind != kind:
                    raise ValueError(f"{self.name}: argument {pname} must be an array on a "
                                     f"{kind} device, got {type(a).__name__}")
                if device is None:
                    device = a.device
                elif a.device != device:
                    raise ValueError(f"{self.name}: argument {pname} is on {a.device}, the "
                                     f"others on {device}")
                if a.dtype != p["dtype"]:
                    raise ValueError(f"{self.name}: argument {pname} has dtype {a.dtype}, "
                                     f"expected {p['dtype']}")
                shape = a.shape
                want = p["shape_json"]
                if len(shape) != len(want):
                    raise ValueError(f"{self.name}: argument {pname} has rank {len(shape)} (shape "
                                     f"{shape}), expected rank {len(want)} {tuple(p['shape'])}")
                for d, (n, w) in enumerate(zip(shape, want)):
                    if isinstance(w, list) and w[0] == "var" and w[1] not in env:
                        env[w[1]] = int(n)
                    else:
                        pending.append((pname, d, n, w, shape, p["shape"]))
                buffers.append(a)
            else:
                if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
                    if p["dtype"].startswith("float"):
                        raise ValueError(f"{self.name}: float scalar parameters are not "
                                         f"supported on {kind}")
                    raise ValueError(f"{self.name}: argument {pname} must be an integer "
                                     f"({p['dtype']}), got {type(a).__name__}")
                env[pname] = int(a)
        for pname, d, n, w, shape, text in pending:
            want = eval_expr(w, env)
            if n != want:
                raise ValueError(f"{self.name}: argument {pname}: dimension {d} is {n}, expected "
                                 f"{text[d]}{'' if isinstance(w, int) else f' = {want}'} "
                                 f"(shape {tuple(shape)}, expected {tuple(text)})")
        if device is None:
            device = Device(kind, 0)
        for a, p in zip(buffers, [p for p in params if p["kind"] == "buffer"]):
            if a.size > INT32_MAX:
                raise ValueError(f"{self.name}: argument {p['name']} has {a.size} elements; "
                                 f"{kind} kernels index with 32-bit integers (at most "
                                 f"{INT32_MAX})")
        aliased = {}
        for a, p in zip(buffers, [p for p in params if p["kind"] == "buffer"]):
            key = self.module._buffer_key(a)
            if key in aliased and (p["written"] or aliased[key]["written"]):
                raise ValueError(f"{self.name}: arguments {aliased[key]['name']} and {p['name']} "
                                 f"are the same array, and one of them is written; pass a copy")
            aliased[key] = p
        return device, buffers, env

    # -- running ----------------------------------------------------------------------------
    def __call__(self, *args) -> None:
        self._check_runnable()
        device, buffers, env = self.bind(args)
        self.run(device, buffers, env, None)

    def run(self, device: Device, buffers: list, env: dict, events: list | None) -> None:
        loaded = self.module._loaded(device)
        table = list(buffers) + [None] * len(self.program["temporaries"])
        self._exec(self.program["body"], env, table, loaded, device, events)

    def _exec(self, s, env, table, loaded, device, events):
        op = s[0]
        if op == "seq":
            for c in s[1]:
                self._exec(c, env, table, loaded, device, events)
        elif op == "launch":
            self._launch(s, env, table, loaded, events)
        elif op == "let":
            env[s[1]] = eval_expr(s[2], env)
            self._exec(s[3], env, table, loaded, device, events)
        elif op == "assert":
            if not eval_expr(s[1], env):
                raise ValueError(f"{self.name}: {s[2]}")
            self._exec(s[3], env, table, loaded, device, events)
        elif op == "if":
            if eval_expr(s[1], env):
                self._exec(s[2], env, table, loaded, device, events)
            elif s[3] is not None:
                self._exec(s[3], env, table, loaded, device, events)
        elif op == "for":
            lo, ext = eval_expr(s[2], env), eval_expr(s[3], env)
            for i in range(lo, lo + ext):
                env[s[1]] = i
                self._exec(s[4], env, table, loaded, device, events)
        elif op == "alloc":
            index = s[1]
            temp = next(t for t in self.program["temporaries"] if t["index"] == index)
            size = eval_expr(temp["size"], env)
            if size > INT32_MAX:
                raise ValueError(f"{self.name}: the temporary {temp['name']} needs {size} "
                                 f"elements, over the 32-bit indexing limit")
            table[index] = device_runtime(device.kind).empty((max(size, 1),), temp["dtype"],
                                                             device)
            self._exec(s[2], env, table, loaded, device, events)
            table[index] = None
        else:
            raise ValueError(f"{self.name}: unknown host-program statement {op!r}")

    def _launch(self, s, env, table, loaded, events):
        _, kname, bidx, scalars, grid, block = s
        values = []
        for e in scalars:
            v = eval_expr(e, env)
            if not -INT32_MAX - 1 <= v <= INT32_MAX:
                raise ValueError(f"{self.name}: kernel {kname}: the value {v} of "
                                 f"{expr_text(e)} does not fit the kernel's 32-bit scalar")
            values.append(v)
        g = [eval_expr(x, env) for x in grid]
        if any(x <= 0 for x in g):
            return      # nothing to do (an empty dimension)
        self.module._check_grid(kname, g)
        arrays = [table[i] for i in bidx]
        meta = self.program["kernels"][kname]
        err = None
        if meta["error_messages"]:
            err = loaded.error_buffer()
        ev = loaded.launch(kname, arrays + ([err] if err is not None else []), values, g, block)
        if events is not None and ev is not None:
            events.append(ev)
        if err is not None:
            code = loaded.read_error(err)
            if code:
                msgs = meta["error_messages"]
                msg = msgs[code - 1] if 0 < code <= len(msgs) else f"error code {code}"
                raise DeviceKernelError(f"{self.name}: {msg}")


class DeviceModule(Module):
    """A compiled GPU module: functions by name, source, timing on the device."""

    device_kind = "opencl"

    def __init__(self, metadata: dict, programs: dict[str, dict], source: str):
        super().__init__(metadata)
        self.programs = programs
        self.source = source
        self._funcs: dict[str, DeviceFunction] = {}

    # -- provided by the back end -----------------------------------------------------------
    def _loaded(self, device: Device):
        raise NotImplementedError

    def _buffer_key(self, arr: NDArray):
        return id(arr)

    def _check_grid(self, kernel: str, grid: list) -> None:
        """Raise if a launch's grid exceeds the device's limits (WebGPU: 65535 per dim)."""

    # -- Module interface -------------------------------------------------------------------
    def __getitem__(self, name: str) -> DeviceFunction:
        fn = self._funcs.get(name)
        if fn is None:
            if name not in self.programs:
                raise KeyError(f"module has no function {name!r}; it has {sorted(self.programs)}")
            fn = self._funcs[name] = DeviceFunction(self, self.programs[name])
        return fn

    def _address(self, symbol: str) -> int:
        raise ValueError(f"{type(self).__name__} kernels have no host address")

    def _last_error(self) -> str:
        return ""

    @property
    def num_threads(self) -> int:
        return 1

    def get_source(self, fmt: str = "") -> str:
        """The kernels' source code (OpenCL C, WGSL)."""
        return self.source

    def time_evaluator(self, name: str, device: Device | None = None, number: int = 10,
                       repeat: int = 3, min_repeat_ms: float = 0, f_preproc: Any = None):
        """Time ``name`` on the device: each measurement is the device's own timestamps from
        the first kernel's start to the last kernel's end of a call (host overhead between
        launches counted, Python argument checks not), averaged over ``number`` calls.

        Examples
        --------
        >>> t = mod.time_evaluator("main", targets.opencl(0), number=20)(a, b, c)   # doctest: +SKIP
        >>> t.mean                                                                 # doctest: +SKIP
        4.1e-05
        """
        fn = self[name]
        if number < 1 or repeat < 1:
            raise ValueError(f"time_evaluator: number and repeat must be >= 1 (got {number}, "
                             f"{repeat})")

        def evaluator(*args) -> BenchmarkResult:
            fn._check_runnable()
            dev, buffers, env = fn.bind(args)
            if device is not None and device != dev:
                raise ValueError(f"time_evaluator: the arrays are on {dev}, not on {device}")
            loaded = self._loaded(dev)
            fn.run(dev, buffers, dict(env), None)      # warm-up: compiles, checks
            dev.sync()

            def time_calls(n: int) -> tuple[float, float]:
                spans = []
                start = time.perf_counter()
                for _ in range(n):
                    events: list = []
                    fn.run(dev, buffers, dict(env), events)
                    spans.append(events)
                dev.sync()
                wall = time.perf_counter() - start
                total = sum(loaded.elapsed(evs) for evs in spans if evs)
                if not any(spans):
                    total = wall
                return total, wall

            return repeat_timings(time_calls, number, repeat, min_repeat_ms, f_preproc)

        return evaluator

    def export_library(self, path: str) -> str:
        raise NotImplementedError(f"{type(self).__name__}.export_library is not supported")

    def __repr__(self):
        return (f"<tilecraft.{type(self).__name__} {self.target!r} "
                f"functions={sorted(self.programs)}>")


__all__ = ["DeviceFunction", "DeviceKernelError", "DeviceModule", "eval_expr", "expr_text"]
