"""``WebGPUModule``: calling, timing and exporting built WebGPU functions.

A call goes through the launch path shared with OpenCL (``targets.runtime.host_program``): the
function's host program is translated once into the shared normal form and compiled into a
``HostPlan``, which checks the arguments (count, kind, dtype, rank, every dimension against the
symbolic constraints, sizes that fit 32-bit indices), binds the shape variables and walks the
program (checks, device temporaries, launches). What is WebGPU's own is the launcher here: per
kernel a pipeline, the bind group (cached by its buffers), the uniform buffer of the scalars
(cached by its bytes, written without a sync) and the workgroup counts. Dispatches are recorded
into the device's command batch; a call submits it (one command buffer for all its kernels) and
the GPU VM submits once per VM call. Nothing waits, except a function with in-kernel run-time
checks: its error words are read back once at the end of the call (for the VM: of the VM call),
raising the failed check's message (``DeviceKernelError``, a ``ValueError``).

``export_library(path)`` writes the module as JSON (format ``tilecraft-webgpu``: each kernel's
WGSL, bindings, uniform layout and launch geometry as expressions, and the host program);
``targets.load_module(path)`` reads it back, and ``docs/webgpu_browser/`` runs it in a browser.

Examples
--------
>>> mod = targets.build(sch.mod, "webgpu")                            # doctest: +SKIP
>>> a = targets.array(x, targets.webgpu(0)); b = targets.empty(x.shape, "float32", a.device)
>>> mod["main"](a, b)                                                 # doctest: +SKIP
>>> mod.time_evaluator("main", targets.webgpu(0), number=20)(a, b).mean   # doctest: +SKIP
"""
from __future__ import annotations

import json
import os
import struct
import time
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from ..runtime.device import Device
from ..runtime.host_program import (ERROR_SLOT, INT32_MAX, INT32_MIN, HostPlan, ParamSpec,
                                    eval_expr)
from ..fileio import atomic_write
from ..runtime.module import BenchmarkResult, Module, repeat_timings
from ..target import Target
from . import storage
from .runtime import context, encode_commands, note_target

# the file format of an exported module (build.py writes it, load_webgpu_module reads it)
FORMAT = "tilecraft-webgpu"
FORMAT_VERSION = 1

MAX_WORKGROUPS = 65535
_BIND_TYPES = {"read": "read-only-storage", "read_write": "storage"}


class _Word:
    """A device buffer the host program uses that is no user array (a temporary, an error
    word): its ``GPUBuffer`` and element count (for packed bindings)."""

    __slots__ = ("buffer", "size")

    def __init__(self, buffer, size: int):
        self.buffer, self.size = buffer, size


def _normal_form(meta: dict):
    """The module's host program (``build._HostProgram``'s JSON) as ``HostPlan``'s normal form:
    refs ``p<i>`` (parameter i) and ``t<k>`` (temporaries) become slots, ``e<k>`` the error
    slot; a launch passes its bindings' buffers in binding order and the uniform's scalar
    fields."""
    slots = {}
    for i, p in enumerate(meta["params"]):
        if p["kind"] == "buffer":
            slots[f"p{i}"] = len(slots)
    kernels = meta["kernels"]

    def slot(ref):
        if ref.startswith("e"):
            return ERROR_SLOT
        if ref not in slots:
            raise ValueError(f"{meta['name']}: the host program uses buffer {ref}, which it "
                             f"does not provide")
        return slots[ref]

    def stmt(s):
        if s is None:
            return None
        head = s[0]
        if head == "seq":
            return ("seq", [stmt(x) for x in s[1]])
        if head in ("let", "assert"):
            return (head, s[1], s[2], stmt(s[3]))
        if head == "if":
            return ("if", s[1], stmt(s[2]), stmt(s[3]))
        if head == "for":
            return ("for", s[1], s[2], s[3], stmt(s[4]))
        if head == "alloc":
            _, ref, dtype, size, body = s
            slots[ref] = len(slots)
            return ("alloc", slots[ref], dtype, size, ref, stmt(body))
        if head == "launch":
            rec = kernels[s[1]]
            refs = [r for b in rec["bindings"] for r in b["buffers"]]
            scalars = [(u["value"], u["type"]) for u in rec["uniform"]
                       if not isinstance(u["value"], dict)]
            return ("launch", s[1], [slot(r) for r in refs], scalars, rec["grid"])
        if head == "nop":
            return ("seq", [])
        raise ValueError(f"{meta['name']}: unknown host statement {head!r} in the module")
    return stmt(meta["host"])


def workgroup_counts(fname: str, rec: dict, g) -> tuple[int, int, int]:
    """The dispatch of kernel record ``rec`` for a grid ``g`` of positive sizes: linearized
    grids as ``(min(total, 65535), ceil(total / 65535), 1)``; over the limit a ValueError."""
    if rec["linear_grid"]:
        total = g[0] * g[1] * g[2]
        y = -(-total // MAX_WORKGROUPS)
        if y > MAX_WORKGROUPS:
            raise ValueError(f"{fname}: kernel {rec['name']} needs {total} workgroups, "
                             f"more than a dispatch can hold ({MAX_WORKGROUPS}**2)")
        return (min(total, MAX_WORKGROUPS), y, 1)
    for axis, n in zip("xyz", g):
        if n > MAX_WORKGROUPS:
            raise ValueError(f"{fname}: kernel {rec['name']} needs {n} workgroups in "
                             f"{axis}, over WebGPU's limit of {MAX_WORKGROUPS}")
    return tuple(g)


class _OnDevice:
    """One function's kernels on one device: what ``HostPlan.run`` launches through."""

    BIND_GROUP_CACHE = 64
    UNIFORM_CACHE = 64

    def __init__(self, fn: "WebGPUFunction", ctx):
        meta = fn.module.metadata
        ctx.check_requirements(f"module function {fn.name}", meta.get("required_limits", {}),
                               meta.get("required_features", []))
        self.fn, self.ctx = fn, ctx
        self.errors = ctx.errors
        self.uniforms: OrderedDict = OrderedDict()
        self.groups: OrderedDict = OrderedDict()
        self.packed: dict = {}

    def alloc_temp(self, dtype: str, size: int, what: str) -> _Word:
        nbytes = size * np.dtype(storage.storage_dtype(dtype)).itemsize
        return _Word(self.ctx.create_buffer(nbytes, what), size)

    def alloc_error_word(self, key) -> _Word:
        return _Word(self.ctx.create_buffer(4, "an error word"), 1)   # buffers start zeroed

    def launcher(self, k: int):
        """``launch(arrays, scalars, grid, sink)`` for kernel ``k``: appends the dispatch (and
        the copies of packed bindings) to ``sink``."""
        fn, ctx = self.fn, self.ctx
        rec = fn.kernels[k]
        pipe, bgl = ctx.pipeline(rec["wgsl"], fn._layouts[k], rec["name"],
                                 trusted=bool(fn.module.metadata.get("trusted_shaders")))
        fname = fn.name
        # where each binding's buffers are in the launch's array list
        bindings, pos = [], 0
        for b in rec["bindings"]:
            n = len(b["buffers"])
            bindings.append((b["binding"], b["packed"], pos, n, b["access"] == "read_write"))
            pos += n
        plain = all(not p for _, p, _, _, _ in bindings)
        fmt = "<" + "".join({"f32": "f", "u32": "I"}.get(u["type"], "i") for u in rec["uniform"])
        fields = []
        si = 0
        for u in rec["uniform"]:
            if isinstance(u["value"], dict):
                fields.append(("offset", tuple(u["value"]["offset"])))
            else:
                fields.append(("scalar", si))
                si += 1
        only_scalars = all(f[0] == "scalar" for f in fields)
        ubind = rec["uniform_binding"]
        uniforms, groups, packed_bufs = self.uniforms, self.groups, self.packed
        ucap, gcap = self.UNIFORM_CACHE, self.BIND_GROUP_CACHE
        device = ctx.device

        def uniform_of(data: bytes):
            ukey = (k, data)
            ub = uniforms.get(ukey)
            if ub is None:
                ub = uniforms[ukey] = ctx.uniform_buffer(data)   # queue.write_buffer: no sync
                if len(uniforms) > ucap:
                    uniforms.popitem(last=False)
            return ub

        def launch(arrays, scalars, grid, sink, memo):
            if memo is not None and plain:
                # a call site of the VM: the same buffers, scalars and grid as last time are
                # the same dispatch (pipeline, cached bind group and uniform). Buffers by id:
                # the site's arrays are alive while its memo is in use. A site is memoized
                # from its second launch on (a fresh output each call never is).
                key = (tuple([id(a.buffer) for a in arrays]), tuple(scalars), tuple(grid))
                if memo.get("key") == key:
                    sink.append(memo["dispatch"])
                    return
                launch_new(arrays, scalars, grid, sink)
                if memo.setdefault("launches", 0) >= 1:
                    memo["key"], memo["dispatch"] = key, sink[-1]
                memo["launches"] += 1
                return
            launch_new(arrays, scalars, grid, sink)

        def launch_new(arrays, scalars, grid, sink):
            entries = []
            offsets = {}
            after = []
            if plain:
                for binding, _, p, _, _ in bindings:
                    entries.append((binding, arrays[p].buffer))
            else:
                for binding, is_packed, p, n, written in bindings:
                    if not is_packed:
                        entries.append((binding, arrays[p].buffer))
                        continue
                    total, members = 0, []
                    for j in range(n):
                        a = arrays[p + j]
                        offsets[(binding, j)] = total
                        members.append((a.buffer, total, a.size))
                        total += a.size
                    pkey = (k, binding, total)
                    pk = packed_bufs.get(pkey)
                    if pk is None:
                        pk = packed_bufs[pkey] = ctx.create_buffer(
                            total * 4, f"the packed binding {binding} of kernel {rec['name']}")
                    for buf, off, m in members:
                        if m:
                            sink.append(("copy", buf, 0, pk, off * 4, m * 4))
                            if written:
                                after.append(("copy", pk, off * 4, buf, 0, m * 4))
                    entries.append((binding, pk))
            if ubind is not None:
                if only_scalars:
                    values = scalars
                else:
                    values = [scalars[x] if kind == "scalar" else offsets[x]
                              for kind, x in fields]
                entries.append((ubind, uniform_of(_pack(fname, rec, fmt, values))))
            gkey = (k, tuple([id(b) for _, b in entries]))
            hit = groups.get(gkey)
            if hit is None:
                group = device.create_bind_group(layout=bgl, entries=[
                    {"binding": i, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
                    for i, buf in entries])
                # the cached group holds its buffers, so their ids are not reused while it lives
                groups[gkey] = (group, [b for _, b in entries])
                if len(groups) > gcap:
                    groups.popitem(last=False)
            else:
                group = hit[0]
            sink.append(("dispatch", pipe, group, workgroup_counts(fname, rec, grid)))
            if after:
                sink.extend(after)
        return launch


def _pack(fname: str, rec: dict, fmt: str, values) -> bytes:
    try:
        return struct.pack(fmt, *values)
    except struct.error:
        # a packed offset out of range (the scalars were checked by the plan): say which
        for u, v in zip(rec["uniform"], values):
            lo, hi = (0, 2 ** 32 - 1) if u["type"] == "u32" else (INT32_MIN, INT32_MAX)
            if u["type"] != "f32" and not lo <= int(v) <= hi:
                raise ValueError(f"{fname}: the value {v} for {u['field']} of kernel "
                                 f"{rec['name']} does not fit in 32 bits") from None
        raise


class WebGPUFunction:
    """One function of a ``WebGPUModule``; call it with device arrays and scalars."""

    def __init__(self, module: "WebGPUModule", meta: dict):
        self.module = module
        self.meta = meta
        self.name = meta["name"]
        self.params = meta["params"]
        self.kernels = meta["kernels"]
        self._layouts = []
        for k in self.kernels:
            layout = [(b["binding"], _BIND_TYPES[b["access"]]) for b in k["bindings"]]
            if k["uniform_binding"] is not None:
                layout.append((k["uniform_binding"], "uniform"))
            self._layouts.append(tuple(layout))
        params = [ParamSpec(p["name"], p["kind"], p["dtype"], p.get("shape", ()),
                            written=p.get("written", False)) for p in self.params]
        kernels = {i: {"name": k["name"], "error_messages": k["error_messages"]}
                   for i, k in enumerate(self.kernels)}
        self.plan = HostPlan(self.name, params, _normal_form(meta), kernels, "webgpu",
                             float_scalars=True)
        self._per_ctx: dict[int, _OnDevice] = {}

    def _check_runnable(self) -> None:
        """Kernels of a WebGPU module run wherever wgpu finds an adapter (checked per call)."""

    def __repr__(self):
        return f"<tilecraft.WebGPUFunction {self.name}({', '.join(p['name'] for p in self.params)})>"

    def _on(self, device) -> _OnDevice:
        ctx = context(device.index if device is not None else 0)
        od = self._per_ctx.get(ctx.index)
        if od is None or od.ctx is not ctx:
            od = self._per_ctx[ctx.index] = _OnDevice(self, ctx)
        return od

    def _record(self, args: Sequence[Any], sink=None, cached: bool = False) -> _OnDevice:
        memo = None
        if cached:
            device, arrays, env, memo = self.plan.bind_cached(args)
        else:
            device, arrays, env = self.plan.bind(args)
        od = self._on(device)
        self.plan.run(od, arrays, env, od.ctx.batch if sink is None else sink, memo)
        return od

    def __call__(self, *args) -> None:
        """Record the dispatches and submit them (no wait); with in-kernel checks, wait for
        them and raise the first failed check's message."""
        od = self._record(args)
        od.ctx.flush()
        if self.plan.has_kernel_checks:
            od.errors.check()

    def enqueue(self, *args) -> None:
        """Record the dispatches into the device's batch (what the GPU VM calls): submitted
        once the batch holds ``submit_every`` commands (the GPU starts while the host records
        the rest), and at the end of the VM call (checked then), or at the next flush /
        ``Device.sync()``."""
        od = self._record(args, cached=True)
        if len(od.ctx.batch) >= od.ctx.submit_every:
            od.ctx.flush()

    def _prepare(self, args: Sequence[Any]) -> tuple[Any, list]:
        """(device context, commands) of one call, recorded but not submitted."""
        commands: list = []
        od = self._record(args, commands)
        return od.ctx, commands

    # -- what the browser loader mirrors (tests/targets/test_webgpu_browser_loader.py) ----------
    def _uniform_bytes(self, rec, env, offsets) -> bytes:
        fmt = "<" + "".join({"f32": "f", "u32": "I"}.get(u["type"], "i") for u in rec["uniform"])
        values = []
        for u in rec["uniform"]:
            v = u["value"]
            v = offsets[tuple(v["offset"])] if isinstance(v, dict) else eval_expr(v, env)
            values.append(float(v) if u["type"] == "f32" else int(v))
        return _pack(self.name, rec, fmt, values)

    def _counts(self, rec, env):
        g = [int(eval_expr(x, env)) for x in rec["grid"]]
        if min(g) <= 0:
            return None
        return workgroup_counts(self.name, rec, g)


class WebGPUModule(Module):
    """Functions built for WebGPU (``targets.build(..., "webgpu")``) or loaded from JSON."""

    def __init__(self, metadata: dict):
        super().__init__(metadata)
        for f in metadata["functions"]:
            f.setdefault("symbol", f["name"])

    def __getitem__(self, name: str) -> WebGPUFunction:
        fn = self._cache.get(name)
        if fn is None:
            meta = self._funcs_meta.get(name)
            if meta is None:
                raise KeyError(f"module has no function {name!r}; it has "
                               f"{sorted(self._funcs_meta)}")
            fn = self._cache[name] = WebGPUFunction(self, meta)
        return fn

    @property
    def num_threads(self) -> int:
        return 0

    @property
    def kernels(self) -> list[dict]:
        """Every kernel's record (name, WGSL, bindings, launch geometry), in function order."""
        return [k for f in self.metadata["functions"] for k in f["kernels"]]

    def get_source(self, fmt: str = "wgsl") -> str:
        """The WGSL of every kernel, each after a comment line with its launch geometry."""
        if fmt not in ("wgsl", ""):
            raise ValueError(f"a WebGPU module has WGSL source, not {fmt!r}")
        parts = []
        for k in self.kernels:
            grid = ", ".join(json.dumps(g) for g in k["grid"])
            parts.append(f"// kernel {k['name']}: workgroups ({grid}), workgroup_size "
                         f"{tuple(k['workgroup_size'])}\n{k['wgsl']}")
        return "\n".join(parts)

    def export_library(self, path: str) -> str:
        """Write the module as one JSON file (atomically); ``targets.load_module`` reads it."""
        data = json.dumps(self.metadata, indent=1).encode("utf-8")
        atomic_write(path, data)
        return os.fspath(path)

    def time_evaluator(self, name: str, device: Device | None = None, number: int = 10,
                       repeat: int = 3, min_repeat_ms: float = 0, f_preproc: Any = None):
        """Time ``name`` on the GPU: ``number`` calls per measurement, ``repeat`` measurements.

        With the adapter's ``timestamp-query`` feature the time is the GPU's, from timestamps
        written at the start of the first compute pass and the end of the last one of the
        ``number`` calls (recorded into one command buffer). Without it, the wall-clock time
        from submitting them to the queue's completion (``on_submitted_work_done``), which
        includes the submission cost. Arguments are checked and prepared once, outside the
        timing. Returns a ``BenchmarkResult`` (seconds per call).
        """
        fn = self[name]
        if number < 1 or repeat < 1:
            raise ValueError(f"time_evaluator: number and repeat must be >= 1 (got {number}, "
                             f"{repeat})")

        def evaluator(*args) -> BenchmarkResult:
            ctx, commands = fn._prepare(args)
            if device is not None and (device.kind != "webgpu" or device.index != ctx.index):
                raise ValueError(f"time_evaluator: the arrays live on webgpu({ctx.index}), not "
                                 f"on {device}")
            ctx.enqueue(commands)    # warm up: pipelines, caches; sync raises failed checks
            ctx.sync()

            def time_calls(n: int) -> tuple[float, float]:
                elapsed = _time_once(ctx, commands, n)
                return elapsed, elapsed

            return repeat_timings(time_calls, number, repeat, min_repeat_ms, f_preproc)

        return evaluator

    def __repr__(self):
        return f"<tilecraft.WebGPUModule {self.target!r} functions={self.function_names}>"


def _time_once(ctx, commands, n: int) -> float:
    wgpu = ctx._wgpu
    if not any(c[0] == "dispatch" for c in commands):
        return 0.0
    if ctx.has_timestamps:
        qs = ctx.device.create_query_set(type="timestamp", count=2)
        out = ctx.device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE |
                                       wgpu.BufferUsage.COPY_SRC)
        enc, _ = encode_commands(ctx.device, commands, repeat=n, timestamps=qs)
        enc.resolve_query_set(qs, 0, 2, out, 0)
        ctx.queue.submit([enc.finish()])
        ts = np.frombuffer(ctx.queue.read_buffer(out), np.uint64)
        qs.destroy()
        return float(int(ts[1]) - int(ts[0])) * 1e-9   # WebGPU timestamps are nanoseconds
    enc, _ = encode_commands(ctx.device, commands, repeat=n)
    buf = enc.finish()
    start = time.perf_counter()
    ctx.queue.submit([buf])
    ctx.sync()
    return time.perf_counter() - start


def load_webgpu_module(path: str, data: bytes | None = None) -> WebGPUModule:
    """Read a module written by ``WebGPUModule.export_library``."""
    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    try:
        meta = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a WebGPU module (bad JSON: {err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a tilecraft WebGPU module")
    if meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path} is WebGPU module format version {meta.get('version')}; this "
                         f"runtime reads version {FORMAT_VERSION}")
    try:
        note_target(Target(meta["target_config"]))
    except Exception:
        pass
    return WebGPUModule(meta)


def is_webgpu_module_file(head: bytes) -> bool:
    return head.lstrip()[:1] == b"{" and b"tilecraft-webgpu" in head
