"""Modules of GPU kernels built by ``targets.gpu_build`` (the OpenCL back end).

A GPU module (``targets.build(func, "opencl")``) holds, per function, a *host program* (plain
JSON, see ``targets.gpu_build``) and the kernels' source. Each function's host program is
translated once into the shared normal form and compiled into a ``HostPlan``
(``targets.runtime.host_program``, the launch path the WebGPU back end uses too). Calling
``mod["main"](*arrays)``:

1. checks the arguments: device arrays of the module's device kind, one device for all, the
   right count, dtypes and ranks; binds each symbolic dim from the first dimension that is
   exactly that variable and checks every other dimension against its expression;
2. runs the host program: run-time checks (``ValueError`` with the lowering's message),
   device temporaries (cached per device), and kernel launches with their grid evaluated from
   the dims — each scalar checked to fit in int32, as the kernels index in 32 bits;
3. if the function has in-kernel checks (``kernel_error``), reads their error words back once
   at the end of the call and raises the message of the first check that failed
   (``DeviceKernelError``). ``enqueue`` (what the GPU VM calls) leaves that read to the end
   of the VM function call or the next ``Device.sync()``.

A back end subclasses ``DeviceModule`` and supplies ``_loaded(device)``: the object
``HostPlan.run`` launches through (``launcher(kernel)``, ``alloc_temp``,
``alloc_error_word``, ``errors``) plus ``elapsed(events) -> seconds`` (from the device's own
timestamps, for ``time_evaluator``).

This module needs only numpy: no tensorir, no driver library.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from .device import Device
from .host_program import (ERROR_SLOT, DeviceArgumentError, DeviceKernelError, HostPlan,
                           ParamSpec, eval_expr, expr_text)
from .module import BenchmarkResult, Module, repeat_timings

INT32_MAX = 2 ** 31 - 1


def _normal_form(program: dict):
    """``targets.gpu_build``'s host program as ``HostPlan``'s normal form."""
    temps = {t["index"]: t for t in program["temporaries"]}
    kernels = program["kernels"]

    def stmt(s):
        if s is None:
            return None
        op = s[0]
        if op == "seq":
            return ("seq", [stmt(c) for c in s[1]])
        if op in ("let", "assert"):
            return (op, s[1], s[2], stmt(s[3]))
        if op == "if":
            return ("if", s[1], stmt(s[2]), stmt(s[3]))
        if op == "for":
            return ("for", s[1], s[2], s[3], stmt(s[4]))
        if op == "alloc":
            t = temps[s[1]]
            return ("alloc", s[1], t["dtype"], t["size"], t["name"], stmt(s[2]))
        if op == "launch":
            _, kname, bidx, scalars, grid, _block = s
            slots = list(bidx) + ([ERROR_SLOT] if kernels[kname]["error_messages"] else [])
            return ("launch", kname, slots, [(e, "i32") for e in scalars], list(grid))
        raise ValueError(f"{program['name']}: unknown host-program statement {op!r}")
    return stmt(program["body"])


def plan_of(program: dict, device_kind: str) -> HostPlan:
    """The ``HostPlan`` of one function of a ``targets.gpu_build`` module."""
    params = [ParamSpec(p["name"], p["kind"], p["dtype"], p.get("shape_json", ()),
                        p.get("shape"), p.get("written", False)) for p in program["params"]]
    kernels = {k: {"name": k, "error_messages": m["error_messages"]}
               for k, m in program["kernels"].items()}
    return HostPlan(program["name"], params, _normal_form(program), kernels, device_kind)


class DeviceFunction:
    """A function of a ``DeviceModule``; call it with device arrays (and ints for scalars)."""

    def __init__(self, module: "DeviceModule", program: dict):
        self.module = module
        self.program = program
        self.name = program["name"]
        self.params = program["params"]
        self.meta = program
        self.plan = plan_of(program, module.device_kind)

    def __repr__(self):
        return f"<tilecraft.DeviceFunction {self.name}({', '.join(p['name'] for p in self.params)})>"

    def _check_runnable(self):
        reason = self.module._unavailable_reason()
        if reason:
            raise RuntimeError(reason)

    def bind(self, args: Sequence[Any]) -> tuple[Device, list, dict]:
        """Check ``args``; the device, the buffer parameters' arrays and the variables."""
        return self.plan.bind(args)

    def __call__(self, *args) -> None:
        """Launch the function's kernels; with in-kernel checks, wait for them and raise the
        first failed check's message (``DeviceKernelError``)."""
        self._check_runnable()
        device, buffers, env = self.plan.bind(args)
        loaded = self.module._loaded(device)
        self.plan.run(loaded, buffers, env, None)
        if self.plan.has_kernel_checks:
            loaded.errors.check()

    def enqueue(self, *args) -> None:
        """Launch without reading error words back: they are read at the next check (the end
        of the VM function call, ``Device.sync()``)."""
        device, buffers, env, memo = self.plan.bind_cached(args)
        self.plan.run(self.module._loaded(device), buffers, env, None, memo)

    def run(self, device: Device, buffers: list, env: dict, events: list | None) -> None:
        """Run the host program on bound arguments (``bind``); ``events`` collects the
        launches' profiling events."""
        self.plan.run(self.module._loaded(device), buffers, env, events)


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
            loaded.errors.check()

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


__all__ = ["DeviceArgumentError", "DeviceFunction", "DeviceKernelError", "DeviceModule",
           "eval_expr", "expr_text", "plan_of"]
