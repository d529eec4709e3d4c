"""``WebGPUModule``: calling, timing and exporting built WebGPU functions.

A call checks its arguments (count, kind, dtype, rank, every dimension against the symbolic
constraints, sizes that fit 32-bit indices), binds the shape variables, walks the function's host
program (checks, device temporaries, launches) and records one command buffer: the dispatches,
plus the copies of packed bindings. It is submitted without waiting, as on any GPU; reading an
array (``.numpy()``) waits. A function with in-kernel run-time checks reads its error word back
after the call (that waits), and raises the check's message.

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
from ..runtime.module import BenchmarkResult, Module, atomic_write_bytes, repeat_timings
from ..runtime.ndarray import NDArray
from . import exprjson, storage
from .runtime import WebGPUError, WebGPUNDArray, context

INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1
MAX_WORKGROUPS = 65535
_BIND_TYPES = {"read": "read-only-storage", "read_write": "storage"}


class _Launch:
    """A prepared call: the commands to encode and what to check afterwards."""

    __slots__ = ("ctx", "commands", "errors", "keep")

    def __init__(self, ctx):
        self.ctx = ctx
        self.commands: list[tuple] = []
        self.errors: list[tuple] = []    # (buffer, messages, kernel name)
        self.keep: list = []


def _int_range(dtype: str) -> tuple[int, int]:
    if dtype == "bool":
        return 0, 1
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


class WebGPUFunction:
    """One function of a ``WebGPUModule``; call it with device arrays and scalars."""

    BIND_GROUP_CACHE = 64
    UNIFORM_CACHE = 64

    def __init__(self, module: "WebGPUModule", meta: dict):
        self.module = module
        self.meta = meta
        self.name = meta["name"]
        self.params = meta["params"]
        self.kernels = meta["kernels"]
        self._bind_pos = {}    # shape var -> (param index, dim): where a call binds it
        for v in meta["shape_vars"]:
            for i, p in enumerate(self.params):
                if p["kind"] == "buffer" and ["var", v] in p["shape"]:
                    self._bind_pos[v] = (i, p["shape"].index(["var", v]))
                    break
        self._layouts = []
        for k in self.kernels:
            layout = [(b["binding"], _BIND_TYPES[b["access"]]) for b in k["bindings"]]
            if k["uniform_binding"] is not None:
                layout.append((k["uniform_binding"], "uniform"))
            self._layouts.append(tuple(layout))
        self._per_ctx: dict[int, dict] = {}

    def _check_runnable(self) -> None:
        """Kernels of a WebGPU module run wherever wgpu finds an adapter (checked per call)."""

    def __repr__(self):
        return f"<tilecraft.WebGPUFunction {self.name}({', '.join(p['name'] for p in self.params)})>"

    # -- argument checks ----------------------------------------------------------------------
    def _bind_args(self, args: Sequence[Any]):
        fname = self.name
        if len(args) != len(self.params):
            raise ValueError(f"{fname} takes {len(self.params)} argument(s) "
                             f"({', '.join(p['name'] for p in self.params)}), got {len(args)}")
        env: dict[str, Any] = {}
        device = None
        for p, a in zip(self.params, args):
            if p["kind"] == "buffer":
                if not isinstance(a, WebGPUNDArray):
                    where = f"lives on {a.device}" if isinstance(a, NDArray) else \
                        f"is a {type(a).__name__}"
                    raise ValueError(f"{fname}: argument {p['name']} {where}; a WebGPU kernel "
                                     f"takes arrays on a WebGPU device: "
                                     f"targets.array(x, targets.webgpu(0))")
                if device is None:
                    device = a.device
                elif a.device != device:
                    raise ValueError(f"{fname}: argument {p['name']} lives on {a.device}, the "
                                     f"others on {device}")
                if a.dtype != p["dtype"]:
                    raise ValueError(f"{fname}: argument {p['name']} has dtype {a.dtype}, "
                                     f"expected {p['dtype']}")
                if a.ndim != len(p["shape"]):
                    raise ValueError(f"{fname}: argument {p['name']} has {a.ndim} dimension(s), "
                                     f"expected {len(p['shape'])}")
                if a.size > INT32_MAX:
                    raise ValueError(f"{fname}: argument {p['name']} has {a.size} elements; "
                                     f"WebGPU kernels index with 32-bit integers (fewer than "
                                     f"2**31 elements)")
            else:
                dtype = p["dtype"]
                if isinstance(a, np.ndarray) and a.ndim == 0:
                    a = a[()]
                if dtype.startswith("float"):
                    if isinstance(a, bool) or not isinstance(a, (int, float, np.integer,
                                                                 np.floating)):
                        raise ValueError(f"{fname}: argument {p['name']} must be a number "
                                         f"({dtype}), got {type(a).__name__}")
                    env[p["name"]] = float(a)
                else:
                    if not isinstance(a, (int, np.integer, bool, np.bool_)):
                        raise ValueError(f"{fname}: argument {p['name']} must be an integer "
                                         f"({dtype}), got {type(a).__name__} {a!r}")
                    lo, hi = _int_range(dtype)
                    if not lo <= int(a) <= hi:
                        raise ValueError(f"{fname}: argument {p['name']} = {int(a)} does not fit "
                                         f"in {dtype} [{lo}, {hi}]")
                    env[p["name"]] = int(a)
        for v, (i, d) in self._bind_pos.items():
            if v not in env:
                env[v] = int(args[i].shape[d])
        for p, a in zip(self.params, args):
            if p["kind"] != "buffer":
                continue
            for d, (dim, want) in enumerate(zip(a.shape, p["shape"])):
                expected = exprjson.evaluate(want, env)
                if dim != expected:
                    raise ValueError(f"{fname}: argument {p['name']}: dimension {d} has extent "
                                     f"{dim}, expected {expected}")
        return env, device

    # -- the host program ---------------------------------------------------------------------
    def _state(self, ctx) -> dict:
        st = self._per_ctx.get(ctx.index)
        if st is None:
            meta = self.module.metadata
            ctx.check_requirements(f"module function {self.name}",
                                   meta.get("required_limits", {}),
                                   meta.get("required_features", []))
            st = {"pipelines": [None] * len(self.kernels), "temps": {}, "errors": {},
                  "uniforms": OrderedDict(), "groups": OrderedDict(), "packed": {}}
            self._per_ctx[ctx.index] = st
        return st

    def _prepare(self, args: Sequence[Any]) -> _Launch:
        env, device = self._bind_args(args)
        ctx = context(device.index if device is not None else 0)
        st = self._state(ctx)
        launch = _Launch(ctx)
        refs: dict[str, tuple] = {}   # ref -> (GPUBuffer, elements)
        for i, (p, a) in enumerate(zip(self.params, args)):
            if p["kind"] == "buffer":
                refs[f"p{i}"] = (a.buffer, a.size)
        seen = {}
        for i, (p, a) in enumerate(zip(self.params, args)):
            if p["kind"] == "buffer":
                other = seen.get(id(a.buffer))
                if other is not None and (p["written"] or other["written"]):
                    raise ValueError(f"{self.name}: arguments {other['name']} and {p['name']} "
                                     f"are the same array; a kernel's buffers must not overlap")
                seen[id(a.buffer)] = p
        self._run(self.meta["host"], env, refs, ctx, st, launch)
        return launch

    def _run(self, node, env, refs, ctx, st, launch):
        head = node[0]
        if head == "seq":
            for x in node[1]:
                self._run(x, env, refs, ctx, st, launch)
        elif head == "launch":
            self._launch(node[1], env, refs, ctx, st, launch)
        elif head == "let":
            env[node[1]] = exprjson.evaluate(node[2], env)
            self._run(node[3], env, refs, ctx, st, launch)
        elif head == "assert":
            if not exprjson.evaluate(node[1], env):
                raise ValueError(f"{self.name}: {node[2]}")
            self._run(node[3], env, refs, ctx, st, launch)
        elif head == "if":
            if exprjson.evaluate(node[1], env):
                self._run(node[2], env, refs, ctx, st, launch)
            elif node[3] is not None:
                self._run(node[3], env, refs, ctx, st, launch)
        elif head == "for":
            lo = exprjson.evaluate(node[2], env)
            for i in range(lo, lo + exprjson.evaluate(node[3], env)):
                env[node[1]] = i
                self._run(node[4], env, refs, ctx, st, launch)
        elif head == "alloc":
            _, ref, dtype, size, body = node
            n = max(0, exprjson.evaluate(size, env))
            nbytes = n * np.dtype(storage.storage_dtype(dtype)).itemsize
            key = (ref, nbytes)
            buf = st["temps"].get(key)
            if buf is None:
                # temporaries are reused across calls: the queue runs calls in order
                buf = st["temps"][key] = ctx.create_buffer(nbytes, f"temporary {ref} of "
                                                                   f"{self.name}")
            refs[ref] = (buf, n)
            self._run(body, env, refs, ctx, st, launch)
        elif head == "nop":
            pass
        else:
            raise ValueError(f"{self.name}: unknown host statement {head!r} in the module")

    def _pipeline(self, k: int, ctx, st):
        hit = st["pipelines"][k]
        if hit is None:
            rec = self.kernels[k]
            hit = st["pipelines"][k] = ctx.pipeline(rec["wgsl"], self._layouts[k], rec["name"])
        return hit

    def _launch(self, k: int, env, refs, ctx, st, launch):
        rec = self.kernels[k]
        pipe, bgl = self._pipeline(k, ctx, st)
        entries = []
        offsets = {}
        copies_after = []
        for b in rec["bindings"]:
            if not b["packed"]:
                buf, _ = self._buffer(b["buffers"][0], refs, ctx, st, launch, rec)
                entries.append((b["binding"], buf))
                continue
            total = 0
            members = []
            for j, ref in enumerate(b["buffers"]):
                buf, n = self._buffer(ref, refs, ctx, st, launch, rec)
                offsets[(b["binding"], j)] = total
                members.append((buf, total, n))
                total += n
            key = (k, b["binding"], total)
            packed = st["packed"].get(key)
            if packed is None:
                packed = st["packed"][key] = ctx.create_buffer(
                    total * 4, f"the packed binding {b['binding']} of kernel {rec['name']}")
            for buf, off, n in members:
                if n:
                    launch.commands.append(("copy", buf, 0, packed, off * 4, n * 4))
                    if b["access"] == "read_write":
                        copies_after.append(("copy", packed, off * 4, buf, 0, n * 4))
            entries.append((b["binding"], packed))
        uniform = None
        if rec["uniform_binding"] is not None:
            data = self._uniform_bytes(rec, env, offsets)
            ukey = (k, data)
            uniform = st["uniforms"].get(ukey)
            if uniform is None:
                uniform = ctx.uniform_buffer(data)
                st["uniforms"][ukey] = uniform
                while len(st["uniforms"]) > self.UNIFORM_CACHE:
                    st["uniforms"].popitem(last=False)
            else:
                st["uniforms"].move_to_end(ukey)
            entries.append((rec["uniform_binding"], uniform))
        gkey = (k, tuple(id(b) for _, b in entries))
        group = st["groups"].get(gkey)
        if group is None:
            group = ctx.device.create_bind_group(layout=bgl, entries=[
                {"binding": i, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
                for i, buf in entries])
            # the cached group holds the buffers, so their ids cannot be reused while it lives
            st["groups"][gkey] = (group, [b for _, b in entries])
            while len(st["groups"]) > self.BIND_GROUP_CACHE:
                st["groups"].popitem(last=False)
        else:
            st["groups"].move_to_end(gkey)
            group = group[0]
        counts = self._counts(rec, env)
        if counts is not None:
            launch.commands.append(("dispatch", pipe, group, counts))
        launch.commands.extend(copies_after)

    def _buffer(self, ref, refs, ctx, st, launch, rec):
        if ref in refs:
            return refs[ref]
        if ref.startswith("e"):
            buf = st["errors"].get(ref)
            if buf is None:
                buf = st["errors"][ref] = ctx.create_buffer(4, "an error word")
            launch.commands.append(("clear", buf))
            launch.errors.append((buf, rec["error_messages"], rec["name"]))
            refs[ref] = (buf, 1)
            return refs[ref]
        raise ValueError(f"{self.name}: kernel {rec['name']} uses buffer {ref}, which the host "
                         f"program did not provide")

    def _uniform_bytes(self, rec, env, offsets) -> bytes:
        out = bytearray()
        for u in rec["uniform"]:
            v = u["value"]
            if isinstance(v, dict):
                value = offsets[tuple(v["offset"])]
            else:
                value = exprjson.evaluate(v, env)
            t = u["type"]
            if t == "f32":
                out += struct.pack("<f", float(value))
            elif t == "u32":
                value = int(value)
                if not 0 <= value <= 2 ** 32 - 1:
                    raise ValueError(f"{self.name}: the value {value} for {u['field']} of kernel "
                                     f"{rec['name']} does not fit in 32 bits")
                out += struct.pack("<I", value)
            else:
                value = int(value)
                if not INT32_MIN <= value <= INT32_MAX:
                    raise ValueError(f"{self.name}: the value {value} for {u['field']} of kernel "
                                     f"{rec['name']} does not fit in int32 (WebGPU kernels "
                                     f"compute indices in 32 bits)")
                out += struct.pack("<i", value)
        return bytes(out)

    def _counts(self, rec, env):
        g = [exprjson.evaluate(x, env) for x in rec["grid"]]
        if min(g) <= 0:
            return None
        if rec["linear_grid"]:
            total = g[0] * g[1] * g[2]
            x = min(total, MAX_WORKGROUPS)
            y = -(-total // MAX_WORKGROUPS)
            if y > MAX_WORKGROUPS:
                raise ValueError(f"{self.name}: kernel {rec['name']} needs {total} workgroups, "
                                 f"more than a dispatch can hold ({MAX_WORKGROUPS}**2)")
            return (x, y, 1)
        for axis, n in zip("xyz", g):
            if n > MAX_WORKGROUPS:
                raise ValueError(f"{self.name}: kernel {rec['name']} needs {n} workgroups in "
                                 f"{axis}, over WebGPU's limit of {MAX_WORKGROUPS}")
        return tuple(g)

    # -- encoding -----------------------------------------------------------------------------
    @staticmethod
    def _encode(ctx, commands, repeat: int = 1, timestamps=None):
        enc = ctx.device.create_command_encoder()
        passes = []
        cpass = None
        for _ in range(repeat):
            for c in commands:
                if c[0] == "dispatch":
                    if cpass is None:
                        cpass = [enc, []]
                        passes.append(cpass)
                    cpass[1].append(c)
                else:
                    cpass = None
                    passes.append(c)
        n_passes = sum(1 for p in passes if isinstance(p, list))
        seen = 0
        for p in passes:
            if isinstance(p, list):
                tw = None
                if timestamps is not None:
                    tw = {"query_set": timestamps}
                    if seen == 0:
                        tw["beginning_of_pass_write_index"] = 0
                    if seen == n_passes - 1:
                        tw["end_of_pass_write_index"] = 1
                    if len(tw) == 1:
                        tw = None
                seen += 1
                cp = enc.begin_compute_pass(timestamp_writes=tw) if tw else \
                    enc.begin_compute_pass()
                for _, pipe, group, counts in p[1]:
                    cp.set_pipeline(pipe)
                    cp.set_bind_group(0, group)
                    cp.dispatch_workgroups(*counts)
                cp.end()
            elif p[0] == "copy":
                _, src, so, dst, do, size = p
                enc.copy_buffer_to_buffer(src, so, dst, do, size)
            elif p[0] == "clear":
                enc.clear_buffer(p[1])
        return enc, n_passes

    def _check_errors(self, launch: _Launch):
        for buf, messages, kname in launch.errors:
            code = int(np.frombuffer(launch.ctx.read(buf, 4).tobytes(), np.int32)[0])
            if code:
                msg = messages[code - 1] if 0 < code <= len(messages) else f"error code {code}"
                raise ValueError(f"{self.name}: {msg}")

    def __call__(self, *args) -> None:
        launch = self._prepare(args)
        ctx = launch.ctx
        enc, _ = self._encode(ctx, launch.commands)
        ctx.queue.submit([enc.finish()])
        if launch.errors:
            self._check_errors(launch)


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
        atomic_write_bytes(path, data)
        os.chmod(path, 0o644)
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
            launch = fn._prepare(args)
            ctx = launch.ctx
            if device is not None and (device.kind != "webgpu" or device.index != ctx.index):
                raise ValueError(f"time_evaluator: the arrays live on webgpu({ctx.index}), not "
                                 f"on {device}")
            enc, _ = fn._encode(ctx, launch.commands)
            ctx.queue.submit([enc.finish()])    # warm up: pipelines, caches
            if launch.errors:
                fn._check_errors(launch)
            ctx.sync()

            def time_calls(n: int) -> tuple[float, float]:
                elapsed = _time_once(fn, ctx, launch.commands, n)
                return elapsed, elapsed

            return repeat_timings(time_calls, number, repeat, min_repeat_ms, f_preproc)

        return evaluator

    def __repr__(self):
        return f"<tilecraft.WebGPUModule {self.target!r} functions={self.function_names}>"


def _time_once(fn: WebGPUFunction, ctx, commands, n: int) -> float:
    wgpu = ctx._wgpu
    if not any(c[0] == "dispatch" for c in commands):
        return 0.0
    if ctx.has_timestamps:
        qs = ctx.device.create_query_set(type="timestamp", count=2)
        out = ctx.device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE |
                                       wgpu.BufferUsage.COPY_SRC)
        enc, _ = fn._encode(ctx, commands, repeat=n, timestamps=qs)
        enc.resolve_query_set(qs, 0, 2, out, 0)
        ctx.queue.submit([enc.finish()])
        ts = np.frombuffer(ctx.queue.read_buffer(out), np.uint64)
        qs.destroy()
        return float(int(ts[1]) - int(ts[0])) * 1e-9   # WebGPU timestamps are nanoseconds
    enc, _ = fn._encode(ctx, commands, repeat=n)
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
    from .build import FORMAT, FORMAT_VERSION
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a tilecraft WebGPU module")
    if meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path} is WebGPU module format version {meta.get('version')}; this "
                         f"runtime reads version {FORMAT_VERSION}")
    try:
        from ..target import Target
        from .runtime import note_target
        note_target(Target(meta["target_config"]))
    except Exception:
        pass
    return WebGPUModule(meta)


def is_webgpu_module_file(head: bytes) -> bool:
    return head.lstrip()[:1] == b"{" and b"tilecraft-webgpu" in head
