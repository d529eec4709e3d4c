"""The WebGPU runtime, through ``wgpu`` (wgpu-native): adapters, devices, arrays, pipelines.

``targets.webgpu(i)`` names adapter ``i``: 0 is the one wgpu picks for
``power_preference="high-performance"``, then the other adapters in the order wgpu lists them
(on this machine: lavapipe on Vulkan, then llvmpipe on OpenGL). ``targets.webgpu("llvmpipe")``
picks by name. ``wgpu`` is imported when an adapter is first needed, so ``import targets`` works
without it.

A ``GPUDevice`` is opened on an adapter on first use. It requests the WebGPU *spec's default*
limits (8 storage buffers per stage, 256 invocations per workgroup, 16 KiB of workgroup storage,
65535 workgroups per dimension, 128 MiB per storage binding, 256 MiB per buffer) — not the
adapter's, so code that runs here also runs in a browser — raised only where a WebGPU target
built or loaded in this process declares more (``Target("webgpu -max-storage-buffers=16")``,
``adapter_target(i)``: all of the adapter's own; ``note_target`` asks without building), as
far as the adapter allows. Features: ``timestamp-query`` whenever the adapter has it (it only
serves ``time_evaluator``), ``shader-f16`` only when a target declares ``supports_float16``.
A module that needs more than the device was opened with, or a feature it lacks, fails with a
``WebGPUError`` naming the limit or feature before anything is dispatched.

Examples
--------
>>> import numpy as np
>>> from tilecraft import targets
>>> dev = targets.webgpu(0)                                     # doctest: +SKIP
>>> a = targets.array(np.arange(4, dtype="float32"), dev)       # doctest: +SKIP
>>> a.numpy()                                                   # doctest: +SKIP
array([0., 1., 2., 3.], dtype=float32)
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from tilecraft.errors import TilecraftError
from tilecraft.optional import MissingDependencyError, import_optional

from ..runtime.device import Device, register_device_runtime
from ..runtime.buffer_pool import BufferPool
from ..runtime.device_ndarray import DeviceNDArray
from ..runtime.host_program import KernelErrorLog
from ..runtime.ndarray import NDArray, _dtype_name, array
from ..target import Target
from . import storage
from .unchecked import create_unchecked_shader_module

# The WebGPU specification's default limits, by wgpu's names: what a browser grants unasked.
SPEC_LIMITS = {
    "max-bind-groups": 4,
    "max-bindings-per-bind-group": 1000,
    "max-buffer-size": 268435456,
    "max-storage-buffer-binding-size": 134217728,
    "max-uniform-buffer-binding-size": 65536,
    "max-storage-buffers-per-shader-stage": 8,
    "max-uniform-buffers-per-shader-stage": 12,
    "max-dynamic-storage-buffers-per-pipeline-layout": 4,
    "max-dynamic-uniform-buffers-per-pipeline-layout": 8,
    "max-compute-workgroup-storage-size": 16384,
    "max-compute-invocations-per-workgroup": 256,
    "max-compute-workgroup-size-x": 256,
    "max-compute-workgroup-size-y": 256,
    "max-compute-workgroup-size-z": 64,
    "max-compute-workgroups-per-dimension": 65535,
    "min-storage-buffer-offset-alignment": 256,
    "min-uniform-buffer-offset-alignment": 256,
}
# For these a smaller value is the stronger requirement.
_ALIGNMENT_LIMITS = {"min-storage-buffer-offset-alignment", "min-uniform-buffer-offset-alignment"}


class WebGPUError(TilecraftError, RuntimeError):
    """No adapter, a missing feature, a limit the device does not have, a failed dispatch."""


class WGSLCompileError(WebGPUError):
    """The WebGPU implementation rejected generated WGSL; the message quotes the line it names."""


# ---------------------------------------------------------------------------------------------
# wgpu, loaded on first use

_WGPU = None
_LOCK = threading.RLock()


def _quiet_environment() -> None:
    """Mesa's loaders complain on stderr when XDG_RUNTIME_DIR is unset; give them a private one."""
    if os.environ.get("XDG_RUNTIME_DIR"):
        return
    path = os.path.join(tempfile.gettempdir(), f"tilecraft-xdg-{os.getuid()}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        if os.stat(path).st_uid == os.getuid():
            os.environ["XDG_RUNTIME_DIR"] = path
    except OSError:
        pass


def wgpu_module():
    """The ``wgpu`` package (imported on first call); ``MissingDependencyError`` naming
    ``pip install 'tilecraft[webgpu]'`` if it is not installed."""
    global _WGPU
    if _WGPU is None:
        with _LOCK:
            if _WGPU is None:
                _quiet_environment()
                # the back end's driver library, needed only to run kernels
                _WGPU = import_optional("wgpu", "the WebGPU runtime")
    return _WGPU


# ---------------------------------------------------------------------------------------------
# adapters

_ADAPTERS: list | None = None


def _adapter_key(adapter) -> tuple:
    info = adapter.info
    return (info.get("backend_type"), info.get("device"), info.get("vendor_id"),
            info.get("device_id"), info.get("adapter_type"))


def _adapter_list() -> list:
    global _ADAPTERS
    if _ADAPTERS is None:
        with _LOCK:
            if _ADAPTERS is None:
                wgpu = wgpu_module()
                try:
                    listed = list(wgpu.gpu.enumerate_adapters_sync())
                except Exception as err:  # a broken driver must not take the process down
                    raise WebGPUError(f"wgpu could not list adapters: {err}") from None
                try:
                    best = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
                except Exception:
                    best = None
                ordered = []
                if best is not None:
                    ordered.append(best)
                    key = _adapter_key(best)
                    listed = [a for a in listed if _adapter_key(a) != key] + \
                        [a for a in listed if _adapter_key(a) == key][1:]
                ordered.extend(listed)
                _ADAPTERS = ordered
    return _ADAPTERS


def adapter_name(adapter) -> str:
    info = adapter.info
    return f"{info.get('device') or info.get('vendor') or '?'} ({info.get('backend_type')})"


def list_adapters() -> list[dict[str, Any]]:
    """What ``targets.webgpu(i)`` can name: index, name, backend, type, features, limits.

    Examples
    --------
    >>> [a["name"] for a in list_adapters()]           # doctest: +SKIP
    ['llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)', 'llvmpipe (LLVM 15.0.6, 256 bits) (OpenGL)']
    """
    out = []
    for i, a in enumerate(_adapter_list()):
        out.append({"index": i, "name": adapter_name(a), "backend": a.info.get("backend_type"),
                    "type": a.info.get("adapter_type"), "features": sorted(a.features),
                    "limits": dict(a.limits)})
    return out


def num_adapters() -> int:
    """How many adapters wgpu finds (0 when wgpu or a driver is missing)."""
    try:
        return len(_adapter_list())
    except (WebGPUError, MissingDependencyError):
        return 0


def find_adapter(name: str) -> int:
    """The index of the first adapter whose name (or backend) contains ``name``, case-insensitive."""
    needle = name.lower()
    names = []
    for i, a in enumerate(_adapter_list()):
        text = adapter_name(a)
        names.append(text)
        if needle in text.lower() or needle in (a.info.get("vendor") or "").lower():
            return i
    raise WebGPUError(f"no WebGPU adapter matches {name!r}; adapters: "
                      f"{', '.join(names) if names else 'none'}")


# ---------------------------------------------------------------------------------------------
# what targets ask of the device

_REQUESTED_LIMITS: dict[str, int] = {}
_REQUESTED_FEATURES: set[str] = set()


def target_limits(target) -> dict[str, int]:
    """The device limits a WebGPU target needs: the spec defaults, raised where it declares more."""
    limits = dict(SPEC_LIMITS)
    lim = target.limits
    threads = int(lim.get("max_threads_per_block") or 0)
    if threads > limits["max-compute-invocations-per-workgroup"]:
        limits["max-compute-invocations-per-workgroup"] = threads
        limits["max-compute-workgroup-size-x"] = max(limits["max-compute-workgroup-size-x"],
                                                     threads)
        limits["max-compute-workgroup-size-y"] = max(limits["max-compute-workgroup-size-y"],
                                                     threads)
    shared = int(lim.get("max_shared_memory_per_block") or 0)
    limits["max-compute-workgroup-storage-size"] = max(
        limits["max-compute-workgroup-storage-size"], shared)
    buffers = int(lim.get("max_storage_buffers_per_shader_stage") or 0)
    limits["max-storage-buffers-per-shader-stage"] = max(
        limits["max-storage-buffers-per-shader-stage"], buffers)
    for key in ("max_storage_buffer_binding_size", "max_buffer_size"):
        name = key.replace("_", "-")
        limits[name] = max(limits[name], int(lim.get(key) or 0))
    return limits


# Above these the adapter's limit buys nothing: the default GPU schedules use at most 1024
# threads, and kernels index with 32-bit integers (an array of 2**31 elements is refused).
_ADAPTER_TARGET_CAPS = {"max-compute-invocations-per-workgroup": 1024,
                        "max-storage-buffer-binding-size": 2 ** 31 - 4,
                        "max-buffer-size": 2 ** 31}


def adapter_target(index: int = 0):
    """A ``Target("webgpu ...")`` carrying adapter ``index``'s own limits instead of the spec's
    defaults: invocations per workgroup (at most 1024), workgroup storage, storage buffers per
    stage, the largest storage binding and buffer (at most 2 GiB: indices are 32-bit).

    Code built for it runs on this adapter (and on any whose limits are as large: a browser
    page that requests them, ``requestDevice({requiredLimits})``), not necessarily in a browser
    that asks for nothing: ``Target("webgpu")`` stays the portable default. Its string form
    names every limit, so it can be written down, exported and rebuilt on a machine without
    the GPU. ``targets.webgpu(i).target()`` is the same.

    Examples
    --------
    >>> t = adapter_target(0)                                      # doctest: +SKIP
    >>> str(t)                                                     # doctest: +SKIP
    'webgpu -max-threads-per-block=1024 -max-shared-memory-per-block=32768 -max-storage-buffers=32 -max-storage-buffer-binding-size=134217728 -max-buffer-size=2147483647'
    """
    adapters = _adapter_list()
    if not 0 <= index < len(adapters):
        raise WebGPUError(f"webgpu({index}) does not exist: {len(adapters)} adapter(s)")
    have = dict(adapters[index].limits)

    def limit(name: str) -> int:
        value = max(int(have.get(name, SPEC_LIMITS[name])), SPEC_LIMITS[name])
        return min(value, _ADAPTER_TARGET_CAPS.get(name, value))
    threads = min(limit("max-compute-invocations-per-workgroup"),
                  limit("max-compute-workgroup-size-x"))
    # buffers are allocated in multiples of 16 bytes (storage.buffer_bytes)
    binding = limit("max-storage-buffer-binding-size") // 16 * 16
    return Target({"kind": "webgpu", "max_threads_per_block": threads,
                   "max_shared_memory_per_block": limit("max-compute-workgroup-storage-size"),
                   "max_storage_buffers": limit("max-storage-buffers-per-shader-stage"),
                   "max_storage_buffer_binding_size": binding,
                   "max_buffer_size": limit("max-buffer-size")})


def target_features(target) -> set[str]:
    return {"shader-f16"} if target.supports_float16 else set()


def note_target(target) -> None:
    """Remember what ``target`` needs, for devices opened later (building or loading a module
    calls it; call it first to open a device for a target built only later).

    Examples
    --------
    >>> note_target(targets.webgpu(0).target())      # doctest: +SKIP
    >>> a = targets.array(x, targets.webgpu(0))       # the device opens with those limits
    """
    with _LOCK:
        for k, v in target_limits(target).items():
            if k in _ALIGNMENT_LIMITS:
                continue
            if v > _REQUESTED_LIMITS.get(k, SPEC_LIMITS[k]):
                _REQUESTED_LIMITS[k] = v
        _REQUESTED_FEATURES.update(target_features(target))


# ---------------------------------------------------------------------------------------------
# devices

_WGSL_LINE = re.compile(r"wgsl:(\d+):(\d+)")


class DeviceContext:
    """One opened ``GPUDevice`` on one adapter, with its queue and pipeline cache."""

    PIPELINE_CACHE_SIZE = 256

    def __init__(self, index: int):
        adapters = _adapter_list()
        if not adapters:
            raise WebGPUError("no WebGPU adapter found: install a Vulkan, Metal or D3D12 driver "
                              "(Debian: mesa-vulkan-drivers for the lavapipe software adapter)")
        if index >= len(adapters):
            raise WebGPUError(f"webgpu({index}) does not exist: {len(adapters)} adapter(s): "
                              + ", ".join(f"{i}: {adapter_name(a)}"
                                          for i, a in enumerate(adapters)))
        self.index = index
        self.adapter = adapters[index]
        self.name = adapter_name(self.adapter)
        supported = dict(self.adapter.limits)
        with _LOCK:
            wanted = dict(SPEC_LIMITS)
            wanted.update(_REQUESTED_LIMITS)
            wanted_features = set(_REQUESTED_FEATURES)
        limits = {}
        for k, v in wanted.items():
            if k not in supported:
                continue
            if k in _ALIGNMENT_LIMITS:
                limits[k] = max(v, supported[k])
            else:
                limits[k] = min(v, supported[k])
        features = {"timestamp-query"} | wanted_features
        features &= set(self.adapter.features)
        try:
            self.device = self.adapter.request_device_sync(required_features=sorted(features),
                                                           required_limits=limits)
        except Exception as err:
            raise WebGPUError(f"could not open a device on adapter {self.name}: {err}") from None
        self.queue = self.device.queue
        self.limits = dict(self.device.limits)
        self.features = set(self.device.features)
        self.has_timestamps = "timestamp-query" in self.features
        # False: every pipeline created from now on skips naga's run-time checks (a native-only
        # diagnostic for benchmarks; see ``unchecked``). A browser always keeps them. A module
        # built for a ``trusted_shaders`` target skips them for its own pipelines only.
        self.bounds_checks = True
        self._pipelines: OrderedDict = OrderedDict()
        self._wgpu = wgpu_module()
        self._sync_buffer = None
        # Commands (dispatches, copies) recorded but not yet submitted: calls append to it and
        # one command buffer is submitted for many of them (flush). Anything else that uses
        # the queue (writes, reads, syncs) flushes first, so the queue's order is the program's.
        self.batch: list[tuple] = []
        # Submit once this many commands are recorded (and at the end of a VM call): the GPU
        # starts on a call's first kernels while the host still records the rest. One
        # submission per call (512 before issue 32) kept the GPU idle for the whole recording
        # (tens of us a dispatch in Python), which the OpenCL queue, starting each kernel as
        # it is enqueued, does not.
        self.submit_every = submit_every()
        self.kernel_times: dict | None = None     # within ``timing_kernels``
        self._gather = None        # where the error words are copied to be read at once
        self.pool = BufferPool()   # freed buffers of ``empty`` arrays, reused by size
        # error words of kernels launched since the last check
        self.errors = KernelErrorLog(self._read_error_words, self._clear_error_word)

    def __repr__(self):
        return f"<webgpu({self.index}) {self.name}>"

    # -- requirements -------------------------------------------------------------------------
    def check_requirements(self, what: str, limits: dict[str, int], features: Sequence[str]):
        """Raise WebGPUError if this device lacks a feature or a limit ``what`` needs."""
        for f in features:
            if f not in self.features:
                if f in self.adapter.features:
                    raise WebGPUError(
                        f"{what} needs the WebGPU feature {f!r}, but webgpu({self.index}) "
                        f"({self.name}) was opened without it: build or load the module before "
                        f"the first array is made on the device")
                raise WebGPUError(f"{what} needs the WebGPU feature {f!r}, which adapter "
                                  f"webgpu({self.index}) ({self.name}) does not have")
        for k, v in limits.items():
            if k in _ALIGNMENT_LIMITS or k not in self.limits:
                continue
            if v > self.limits[k]:
                top = self.adapter.limits.get(k, 0)
                if v > top:
                    raise WebGPUError(f"{what} needs the device limit {k} = {v}, but adapter "
                                      f"webgpu({self.index}) ({self.name}) supports at most {top}")
                raise WebGPUError(f"{what} needs the device limit {k} = {v}, but "
                                  f"webgpu({self.index}) was opened with {self.limits[k]}: build "
                                  f"or load the module before the first array is made on the "
                                  f"device")

    # -- pipelines ----------------------------------------------------------------------------
    def pipeline(self, wgsl: str, layout: Sequence[tuple[int, str]] = (), label: str = "",
                 trusted: bool = False):
        """A compute pipeline (entry ``main``) for ``wgsl`` with bind group 0 laid out as
        ``layout`` — ``(binding, "storage" | "read-only-storage" | "uniform")`` pairs — and its
        bind group layout; cached by source and by whether naga's run-time checks are kept.
        With ``trusted`` (a module built for a ``trusted_shaders`` target), or with
        ``bounds_checks`` False, the shader module is created without them (``unchecked``).
        WGSLCompileError on WGSL the implementation rejects.
        """
        checked = self.bounds_checks and not trusted
        key = (hashlib.sha256(wgsl.encode()).hexdigest(), tuple(layout), checked)
        with _LOCK:
            hit = self._pipelines.get(key)
            if hit is not None:
                self._pipelines.move_to_end(key)
                return hit
        wgpu = self._wgpu
        try:
            if checked:
                module = self.device.create_shader_module(label=label, code=wgsl)
            else:
                module = create_unchecked_shader_module(self.device, wgsl, label)
        except Exception as err:
            raise WGSLCompileError(explain_wgsl_error(str(err), wgsl, label)) from None
        try:
            bgl = self.device.create_bind_group_layout(entries=[
                {"binding": b, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": t}}
                for b, t in layout])
            playout = self.device.create_pipeline_layout(bind_group_layouts=[bgl])
            pipe = self.device.create_compute_pipeline(
                label=label, layout=playout, compute={"module": module, "entry_point": "main"})
        except Exception as err:
            raise WGSLCompileError(explain_wgsl_error(str(err), wgsl, label)) from None
        with _LOCK:
            self._pipelines[key] = (pipe, bgl)
            while len(self._pipelines) > self.PIPELINE_CACHE_SIZE:
                self._pipelines.popitem(last=False)
        return pipe, bgl

    # -- buffers --------------------------------------------------------------------------------
    def create_buffer(self, nbytes: int, what: str = "array"):
        size = storage.buffer_bytes(nbytes)   # a multiple of 16: vec4 bindings (storage.py)
        cap = min(self.limits.get("max-buffer-size", size),
                  self.limits.get("max-storage-buffer-binding-size", size)) // 16 * 16
        if size > cap:
            raise WebGPUError(f"{what} needs {nbytes} bytes on webgpu({self.index}), over the "
                              f"device's buffer limit of {cap} bytes (max-buffer-size / "
                              f"max-storage-buffer-binding-size)")
        usage = self._wgpu.BufferUsage
        return self.device.create_buffer(
            size=size, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST)

    def uniform_buffer(self, data: bytes):
        usage = self._wgpu.BufferUsage
        size = max(16, (len(data) + 15) // 16 * 16)
        buf = self.device.create_buffer(size=size, usage=usage.UNIFORM | usage.COPY_DST)
        self.queue.write_buffer(buf, 0, data + bytes(size - len(data)))
        return buf

    # -- the command batch ----------------------------------------------------------------------

    def flush(self) -> None:
        """Submit the recorded commands as one command buffer (does not wait; within
        ``timing_kernels``, times each dispatch and waits)."""
        if self.batch:
            commands, self.batch = self.batch, []
            if self.kernel_times is not None:
                self._submit_timed(commands)
                return
            enc, _ = encode_commands(self.device, commands)
            self.queue.submit([enc.finish()])

    @contextlib.contextmanager
    def timing_kernels(self):
        """A context in which every submission puts each dispatch in a compute pass of its
        own between two GPU timestamps and waits for it; yields a dict, filled as it goes,
        kernel name -> [calls, GPU seconds]. A profile of the kernels themselves, unlike
        ``VirtualMachine.profile``, which times each kernel with a host synchronization (on
        WebGPU a submission and a read-back, hundreds of microseconds). Needs the adapter's
        ``timestamp-query`` feature (``WebGPUError`` without it).

        Examples
        --------
        >>> with runtime.context(0).timing_kernels() as times:      # doctest: +SKIP
        ...     vm["main"](x); targets.webgpu(0).sync()
        """
        if not self.has_timestamps:
            raise WebGPUError(f"timing kernels needs the timestamp-query feature, which "
                              f"webgpu({self.index}) ({self.name}) does not have")
        self.flush()
        self.kernel_times = {}
        try:
            yield self.kernel_times
            self.flush()
        finally:
            self.kernel_times = None

    def _submit_timed(self, commands: list) -> None:
        wgpu = self._wgpu
        n = sum(1 for c in commands if c[0] == "dispatch")
        qs = self.device.create_query_set(type="timestamp", count=max(2 * n, 2))
        out = self.device.create_buffer(size=max(16 * n, 16), usage=wgpu.BufferUsage.QUERY_RESOLVE
                                        | wgpu.BufferUsage.COPY_SRC)
        enc = self.device.create_command_encoder()
        labels = []
        for c in commands:
            if c[0] == "dispatch":
                i = len(labels)
                cp = enc.begin_compute_pass(timestamp_writes={
                    "query_set": qs, "beginning_of_pass_write_index": 2 * i,
                    "end_of_pass_write_index": 2 * i + 1})
                cp.set_pipeline(c[1])
                cp.set_bind_group(0, c[2])
                cp.dispatch_workgroups(*c[3])
                cp.end()
                labels.append(c[1].label)
            elif c[0] == "copy":
                enc.copy_buffer_to_buffer(*c[1:])
            elif c[0] == "clear":
                enc.clear_buffer(c[1])
        if n:
            enc.resolve_query_set(qs, 0, 2 * n, out, 0)
        self.queue.submit([enc.finish()])
        if n:
            ts = np.frombuffer(self.queue.read_buffer(out, 0, 16 * n), np.uint64)
            for i, label in enumerate(labels):
                entry = self.kernel_times.setdefault(label, [0, 0.0])
                entry[0] += 1
                entry[1] += float(int(ts[2 * i + 1]) - int(ts[2 * i])) * 1e-9
        qs.destroy()
        out.destroy()

    def enqueue(self, commands: list) -> None:
        """Record ``commands``; submitted at the next flush (or once the batch is long)."""
        self.batch.extend(commands)
        if len(self.batch) >= self.submit_every:
            self.flush()

    def check_errors(self) -> None:
        """The end of a VM call: submit the batch; read pending error words (one wait)."""
        self.flush()
        if self.errors:
            self.errors.check()

    def _read_error_words(self, words: list) -> list[int]:
        self.flush()
        nbytes = 4 * len(words)
        if self._gather is None or self._gather.size < nbytes:
            self._gather = self.create_buffer(max(nbytes, 256), "the error-word readback")
        enc = self.device.create_command_encoder()
        for i, w in enumerate(words):
            enc.copy_buffer_to_buffer(w.buffer, 0, self._gather, 4 * i, 4)
        self.queue.submit([enc.finish()])
        data = self.queue.read_buffer(self._gather, 0, nbytes)
        return [int(c) for c in np.frombuffer(data, np.int32)]

    def _clear_error_word(self, word) -> None:
        self.queue.write_buffer(word.buffer, 0, bytes(4))

    def write(self, buffer, data: np.ndarray) -> None:
        self.flush()   # queue.write_buffer lands before the next submission: keep the order
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        pad = (-raw.size) % 4
        if pad:
            raw = np.concatenate([raw, np.zeros(pad, np.uint8)])
        if raw.size:
            self.queue.write_buffer(buffer, 0, raw)

    def copy(self, src, dst, nbytes: int) -> None:
        """Record a device-to-device copy of ``nbytes`` (a multiple of 4) in the batch."""
        self.enqueue([("copy", src, 0, dst, 0, nbytes)])

    def read(self, buffer, nbytes: int) -> np.ndarray:
        self.flush()
        if nbytes == 0:
            return np.zeros(0, np.uint8)
        size = (nbytes + 3) // 4 * 4
        data = self.queue.read_buffer(buffer, 0, size)
        return np.frombuffer(data, np.uint8)[:nbytes]

    def sync(self) -> None:
        """Wait until the work recorded so far has finished; raise a failed in-kernel check of
        the kernels run since the last check (``DeviceKernelError``)."""
        self.flush()
        if self.errors:
            self.errors.check()     # reading the words waits for the queue
            return
        # Reading a buffer back maps it after every earlier submission is done (the queue runs
        # in order); wgpu 0.32's on_submitted_work_done_sync does not work with its wgpu-native.
        if self._sync_buffer is None:
            self._sync_buffer = self.create_buffer(4, "a sync word")
        self.queue.read_buffer(self._sync_buffer, 0, 4)


# commands recorded per submission unless TILECRAFT_WEBGPU_SUBMIT_EVERY says otherwise
SUBMIT_EVERY = 32


def submit_every() -> int:
    """The commands a device context records before it submits them:
    ``TILECRAFT_WEBGPU_SUBMIT_EVERY`` (a positive integer) or ``SUBMIT_EVERY``; a device's
    ``context(i).submit_every`` may be set afterwards."""
    text = os.environ.get("TILECRAFT_WEBGPU_SUBMIT_EVERY", "").strip()
    if not text:
        return SUBMIT_EVERY
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"TILECRAFT_WEBGPU_SUBMIT_EVERY must be a positive integer, got {text!r}")
    return n


def encode_commands(device, commands, repeat: int = 1, timestamps=None):
    """A command encoder with ``commands`` (``repeat`` times): consecutive dispatches share one
    compute pass; ``("copy", src, src_offset, dst, dst_offset, size)`` and ``("clear", buf)``
    go between passes. With a timestamp query set, the first pass writes timestamp 0 at its
    start and the last one timestamp 1 at its end. Returns (encoder, number of passes)."""
    enc = device.create_command_encoder()
    passes = []
    cpass = None
    for _ in range(repeat):
        for c in commands:
            if c[0] == "dispatch":
                if cpass is None:
                    cpass = []
                    passes.append(cpass)
                cpass.append(c)
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
            cp = enc.begin_compute_pass(timestamp_writes=tw) if tw else enc.begin_compute_pass()
            last_pipe = last_group = None
            for _, pipe, group, counts in p:
                if pipe is not last_pipe:
                    cp.set_pipeline(pipe)
                    last_pipe, last_group = pipe, None   # another layout: bind again
                if group is not last_group:
                    cp.set_bind_group(0, group)
                    last_group = group
                cp.dispatch_workgroups(*counts)
            cp.end()
        elif p[0] == "copy":
            _, src, so, dst, do, size = p
            enc.copy_buffer_to_buffer(src, so, dst, do, size)
        elif p[0] == "clear":
            enc.clear_buffer(p[1])
    return enc, n_passes


def explain_wgsl_error(message: str, wgsl: str, label: str = "") -> str:
    """The implementation's message, with the WGSL line it names quoted."""
    lines = wgsl.splitlines()
    quoted = []
    for m in _WGSL_LINE.finditer(message):
        n = int(m.group(1))
        if 1 <= n <= len(lines) and n not in quoted:
            quoted.append(n)
    text = f"WGSL of {label or 'a kernel'} was rejected by the WebGPU implementation:\n{message}"
    for n in quoted[:3]:
        text += f"\n  line {n}: {lines[n - 1].strip()}"
    return text


_CONTEXTS: dict[int, DeviceContext] = {}


def context(index: int) -> DeviceContext:
    """The opened device of adapter ``index`` (opened on first call)."""
    ctx = _CONTEXTS.get(index)
    if ctx is None:
        with _LOCK:
            ctx = _CONTEXTS.get(index)
            if ctx is None:
                ctx = DeviceContext(index)
                _CONTEXTS[index] = ctx
    return ctx


def close_device(index: int) -> None:
    """Forget the opened device of adapter ``index``; the next use opens a new one, with the
    limits and features the targets built so far ask for. Arrays and modules used on the old
    device must not be used again."""
    with _LOCK:
        ctx = _CONTEXTS.pop(index, None)
    if ctx is not None:
        try:
            ctx.device.destroy()
        except Exception:
            pass


def adapter_features(index: int) -> set[str]:
    """The features adapter ``index`` offers (without opening a device)."""
    adapters = _adapter_list()
    if index >= len(adapters):
        raise WebGPUError(f"webgpu({index}) does not exist: {len(adapters)} adapter(s)")
    return set(adapters[index].features)


# ---------------------------------------------------------------------------------------------
# arrays


class WebGPUNDArray(DeviceNDArray):
    """An array in a ``GPUBuffer`` of a WebGPU device.

    Elements are kept in their storage dtype (``storage.STORAGE_DTYPE``: 8/16-bit integers and
    bool widened to 32 bits, 64-bit integers narrowed to 32); ``.numpy()`` converts back.
    Operations are queued on the device: ``.numpy()`` waits for the kernels before it.
    """

    __slots__ = ("_nbytes", "_base")
    _API = "WebGPU"

    def __init__(self, ctx: DeviceContext, buffer, shape: Sequence[int], dtype: str,
                 base=None):
        super().__init__(Device("webgpu", ctx.index), ctx, buffer, shape, dtype)
        # a view keeps the array that owns the buffer alive: the buffer goes back to the
        # device's pool only when neither is referenced
        self._base = base
        self._nbytes = int(np.prod(self._shape, dtype=np.int64)) * \
            np.dtype(storage.storage_dtype(dtype)).itemsize

    @property
    def storage_nbytes(self) -> int:
        """Bytes the elements take on the device (widened dtypes take 4 per element)."""
        return self._nbytes

    @property
    def buffer(self):
        """The ``wgpu.GPUBuffer`` holding the elements."""
        return self._buffer

    def numpy(self) -> np.ndarray:
        raw = self._ctx.read(self._buffer, self._nbytes)
        sdt = np.dtype(storage.storage_dtype(self._dtype))
        flat = np.frombuffer(raw.tobytes(), sdt) if raw.size else np.zeros(0, sdt)
        return storage.from_device_bytes(flat, self._dtype).reshape(self._shape).copy()

    asnumpy = numpy

    def _view(self, shape: Sequence[int], dtype: str | None = None) -> "WebGPUNDArray":
        """An array of ``shape`` over the same buffer, from its start (the VM's planned tensors
        and reshapes). Every storage dtype takes at most 4 bytes per element, so a view fits
        when its elements fit the buffer's words."""
        dtype = dtype or self._dtype
        view = WebGPUNDArray(self._ctx, self._buffer, shape, _dtype_name(dtype),
                             self if self._base is None else self._base)
        if view._nbytes > self._buffer.size:
            raise ValueError(f"a view of shape {tuple(shape)} {dtype} needs {view._nbytes} "
                             f"bytes; the buffer has {self._buffer.size}")
        return view

    def _device_copy(self, source: "WebGPUNDArray") -> None:
        if self._nbytes:
            self._ctx.copy(source._buffer, self._buffer, (self._nbytes + 3) // 4 * 4)

    def _host_write(self, src: np.ndarray) -> None:
        self._ctx.write(self._buffer, storage.to_device_bytes(src))

    def copyto(self, target) -> NDArray:
        if isinstance(target, NDArray):
            return target.copyfrom(self.numpy())
        return array(self.numpy(), target)


class WebGPURuntime:
    """What ``targets.array`` / ``targets.empty`` / ``Device`` use for ``webgpu`` devices."""

    def array(self, src: np.ndarray, device: Device) -> WebGPUNDArray:
        ctx = context(device.index)
        dtype = _dtype_name(src.dtype)
        data = storage.to_device_bytes(src)
        buf = ctx.create_buffer(data.nbytes, f"an array of shape {tuple(src.shape)} {dtype}")
        ctx.write(buf, data)
        return WebGPUNDArray(ctx, buf, src.shape, dtype)

    def empty(self, shape, dtype: str, device: Device) -> WebGPUNDArray:
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"array shape {shape} has a negative dimension")
        ctx = context(device.index)
        nbytes = int(np.prod(shape, dtype=np.int64)) * \
            np.dtype(storage.storage_dtype(dtype)).itemsize
        size = storage.buffer_bytes(nbytes)      # what create_buffer allocates
        buf = ctx.pool.take(size)                # a freed buffer of this size (buffer_pool)
        if buf is None:
            buf = ctx.create_buffer(nbytes, f"an array of shape {shape} {dtype}")
        out = WebGPUNDArray(ctx, buf, shape, dtype)
        ctx.pool.track(out, size, buf)
        return out

    def exist(self, index: int) -> bool:
        return index < num_adapters()

    def sync(self, index: int) -> None:
        if index in _CONTEXTS:
            _CONTEXTS[index].sync()

    def check_errors(self, index: int) -> None:
        """Submit the recorded work; raise a failed in-kernel check of the kernels launched
        since the last check (one wait when there are such kernels)."""
        if index in _CONTEXTS:
            _CONTEXTS[index].check_errors()

    def find(self, name: str) -> int:
        return find_adapter(name)

    def target(self, index: int):
        return adapter_target(index)


register_device_runtime("webgpu", WebGPURuntime())
