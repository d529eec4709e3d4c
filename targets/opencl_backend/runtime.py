"""The OpenCL runtime, through ``pyopencl``: devices, arrays, program cache, launches, timing.

``targets.opencl(i)`` numbers the devices of *all* platforms: first every GPU (platforms in
the order the ICD loader lists them), then the other devices (CPUs such as PoCL, accelerators).
``targets.opencl("NVIDIA")`` picks the first device whose platform, vendor or device name
contains the text (case-insensitive). ``pyopencl`` is imported when a device is first needed,
so ``import targets`` works without it (then ``targets.opencl(0).exist`` is False and using the
device raises ``tilecraft.optional.MissingDependencyError`` naming ``pip install
'tilecraft[opencl]'``); no platform at all is an ``OpenCLError`` saying so.

Each device gets one context and one in-order command queue with profiling enabled, so
``time_evaluator`` reads the device's own timestamps. Programs are cached per (source, device):
a module is compiled for a device the first time it runs there. A compile error from the
driver is an ``OpenCLBuildError`` quoting the source line it names.

Examples
--------
>>> import numpy as np
>>> from tilecraft import targets
>>> dev = targets.opencl(0)                                      # doctest: +SKIP
>>> a = targets.array(np.arange(4, dtype="float32"), dev)        # doctest: +SKIP
>>> a.numpy()                                                    # doctest: +SKIP
array([0., 1., 2., 3.], dtype=float32)
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
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
from . import tensor_core


class OpenCLError(TilecraftError, RuntimeError):
    """No OpenCL platform, an unknown device, a missing device feature."""


class OpenCLBuildError(OpenCLError):
    """The driver's compiler rejected a program; the message quotes the line it names."""


_CL = None
_LOCK = threading.RLock()


def cl_module():
    """``pyopencl``, imported on first use."""
    global _CL
    if _CL is None:
        with _LOCK:
            if _CL is None:
                os.environ.setdefault("PYOPENCL_NO_CACHE", "0")
                _CL = import_optional("pyopencl", "the OpenCL runtime")
    return _CL


# ---------------------------------------------------------------------------------------------
# devices

_DEVICES: list | None = None


def _device_list() -> list:
    """(platform, device) of every OpenCL device: GPUs first, then the others."""
    global _DEVICES
    if _DEVICES is None:
        cl = cl_module()
        try:
            platforms = cl.get_platforms()
        except Exception as err:   # pyopencl raises LogicError(PLATFORM_NOT_FOUND_KHR)
            raise OpenCLError(f"no OpenCL platform found ({err}); install a driver such as "
                              f"the vendor's ICD or PoCL (Debian: pocl-opencl-icd)") from None
        gpus, others = [], []
        for p in platforms:
            try:
                devices = p.get_devices()
            except Exception:
                continue
            for d in devices:
                (gpus if d.type & cl.device_type.GPU else others).append((p, d))
        _DEVICES = gpus + others
    if not _DEVICES:
        raise OpenCLError("no OpenCL device found: the platforms list no devices")
    return _DEVICES


def list_devices() -> list[dict[str, Any]]:
    """Every device, in ``targets.opencl(i)`` order: index, name, platform, type, limits."""
    cl = cl_module()
    out = []
    for i, (p, d) in enumerate(_device_list()):
        out.append({"index": i, "name": d.name.strip(), "platform": p.name.strip(),
                    "vendor": d.vendor.strip(), "type": cl.device_type.to_string(d.type),
                    "max_work_group_size": int(d.max_work_group_size),
                    "local_mem_size": int(d.local_mem_size),
                    "fp16": "cl_khr_fp16" in d.extensions,
                    "fp64": "cl_khr_fp64" in d.extensions})
    return out


def find_device(name: str) -> int:
    """The index of the first device whose platform, vendor or device name contains ``name``."""
    want = name.lower()
    devs = _device_list()
    for i, (p, d) in enumerate(devs):
        if want in f"{p.name} {p.vendor} {d.name} {d.vendor}".lower():
            return i
    names = [f"{i}: {d.name.strip()} ({p.name.strip()})" for i, (p, d) in enumerate(devs)]
    raise OpenCLError(f"no OpenCL device matches {name!r}; devices: {'; '.join(names)}")


class DeviceContext:
    """One OpenCL device: context, profiling queue, limits, compiled programs."""

    def __init__(self, index: int):
        cl = cl_module()
        devs = _device_list()
        if index >= len(devs):
            raise OpenCLError(f"opencl({index}) does not exist: {len(devs)} OpenCL device(s) "
                              f"found ({', '.join(d.name.strip() for _, d in devs)})")
        self.index = index
        self.platform, self.device = devs[index]
        self.cl = cl
        self.context = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.context, self.device,
                                     properties=cl.command_queue_properties.PROFILING_ENABLE)
        d = self.device
        self.name = d.name.strip()
        self.platform_name = self.platform.name.strip()
        self.extensions = set(d.extensions.split())
        self.max_work_group_size = int(d.max_work_group_size)
        self.max_work_item_sizes = tuple(int(x) for x in d.max_work_item_sizes)
        self.local_mem_size = int(d.local_mem_size)
        self.is_gpu = bool(d.type & cl.device_type.GPU)
        self.compute_capability = nvidia_compute_capability(d, self.extensions)
        self.programs: dict[str, Any] = {}
        self.pool = BufferPool()       # freed buffers of ``empty`` arrays, reused by size
        # error words of kernels launched since the last check (read once, at the check)
        self.errors = KernelErrorLog(self._read_error_words, self._clear_error_word)

    def __repr__(self):
        return f"<OpenCL device {self.index}: {self.name} ({self.platform_name})>"

    def limits(self) -> dict[str, Any]:
        """The device's limits by the names ``split_host_device`` checks."""
        return {"max_threads_per_block": self.max_work_group_size,
                "max_block_dims": self.max_work_item_sizes,
                "max_shared_memory_per_block": self.local_mem_size}

    @property
    def has_tensor_cores(self) -> bool:
        """Whether kernels with inline-PTX ``mma.sync`` run here: NVIDIA's driver, compute
        capability >= 8.0 (read through ``cl_nv_device_attribute_query``)."""
        return self.compute_capability is not None and self.compute_capability >= (8, 0)

    def _capability_note(self) -> str:
        if self.compute_capability is None:
            return ""
        return f" (compute capability {self.compute_capability[0]}.{self.compute_capability[1]})"

    def target(self):
        """The ``Target`` for this device: ``opencl -device=nvidia`` (tensor cores allowed) on an
        NVIDIA GPU of compute capability >= 8.0, plain ``opencl`` elsewhere."""
        return Target("opencl -device=nvidia") if self.has_tensor_cores else Target("opencl")

    # -- memory ------------------------------------------------------------------------------
    def create_buffer(self, nbytes: int, what: str):
        cl = self.cl
        try:
            return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size=max(int(nbytes), 4))
        except Exception as err:
            raise OpenCLError(f"{self.name}: cannot allocate {nbytes} bytes for {what}: {err}") \
                from None

    def write(self, buffer, data: np.ndarray) -> None:
        if data.nbytes:
            self.cl.enqueue_copy(self.queue, buffer, np.require(data, requirements="C"),
                                 is_blocking=True)

    def read(self, buffer, out: np.ndarray) -> np.ndarray:
        if out.nbytes:
            self.cl.enqueue_copy(self.queue, out, buffer, is_blocking=True)
        return out

    def copy(self, dst, src, nbytes: int) -> None:
        if nbytes:
            self.cl.enqueue_copy(self.queue, dst, src, byte_count=nbytes)

    def sync(self) -> None:
        """Wait for the queue; raise a failed in-kernel check of the kernels run since the
        last check (``DeviceKernelError``)."""
        self.queue.finish()
        self.errors.check()

    def check_errors(self) -> None:
        """The end of a VM call: read pending error words (one wait) or just flush."""
        if self.errors:
            self.errors.check()
        else:
            self.queue.flush()     # start the queued kernels without waiting for them

    def _read_error_words(self, words: list) -> list[int]:
        out = np.zeros(len(words), np.int32)
        for i, w in enumerate(words):      # all queued, then one wait (the queue is in order)
            self.cl.enqueue_copy(self.queue, out[i:i + 1], w._buffer, is_blocking=False)
        self.queue.finish()
        return [int(c) for c in out]

    def _clear_error_word(self, word) -> None:
        self.write(word._buffer, np.zeros(1, np.int32))

    # -- programs ----------------------------------------------------------------------------
    def program(self, source: str, extensions: Sequence[str] = ()):
        """The program of ``source`` built for this device (cached by source)."""
        key = hashlib.sha1(source.encode()).hexdigest()
        prog = self.programs.get(key)
        if prog is not None:
            return prog
        for ext in extensions:
            if ext == tensor_core.REQUIREMENT:
                if not self.has_tensor_cores:
                    raise OpenCLError(
                        f"the module was built for Target('opencl -device=nvidia'): its kernels "
                        f"use tensor cores through inline PTX (mma.sync), which needs NVIDIA's "
                        f"OpenCL driver on a GPU of compute capability 8.0 or more; {self.name} "
                        f"({self.platform_name}) is not one{self._capability_note()}; build for "
                        f"Target('opencl') (or targets.opencl(i).target()) instead")
                continue
            if ext not in self.extensions:
                what = {"cl_khr_fp16": "float16 arithmetic",
                        "cl_khr_fp64": "float64"}.get(ext, ext)
                hint = ""
                if ext == "cl_khr_fp16":
                    hint = ("; build for Target('opencl') instead, which keeps float16 in memory "
                            "(vload_half / vstore_half) and computes in float")
                raise OpenCLError(f"the module uses {what}, which needs the {ext} extension; "
                                  f"{self.name} ({self.platform_name}) does not report it{hint}")
        cl = self.cl
        try:
            prog = cl.Program(self.context, source).build(options=["-cl-std=CL1.2"])
        except Exception as err:
            raise OpenCLBuildError(explain_build_error(str(err), source, self.name)) from None
        self.programs[key] = prog
        return prog


def nvidia_compute_capability(device, extensions) -> tuple[int, int] | None:
    """(major, minor) of an NVIDIA device (``cl_nv_device_attribute_query``), None for any other
    device or where the driver does not answer."""
    if "cl_nv_device_attribute_query" not in extensions:
        return None
    try:
        return (int(device.compute_capability_major_nv), int(device.compute_capability_minor_nv))
    except Exception:    # noqa: BLE001 - an old pyopencl or driver: treated as no tensor cores
        return None


def explain_build_error(log: str, source: str, device: str) -> str:
    """The compiler's log with the source lines it names quoted."""
    lines = source.splitlines()
    quoted = []
    # NVIDIA: "<kernel>:2:10: error: msg"; PoCL (clang): "error: /tmp/x.cl:2:10: msg"
    pattern = re.compile(r"^\s*(error: )?\S*?:(\d+):(\d+):\s*(error|warning)?:?\s*(.*)$")
    for text in log.splitlines():
        m = pattern.match(text)
        if not m or m.group(4) == "warning" or not (m.group(1) or m.group(4)):
            continue
        ln = int(m.group(2))
        if 1 <= ln <= len(lines):
            quoted.append(f"  line {ln}: {lines[ln - 1].strip()}\n    -> {m.group(5).strip()}")
    head = f"the OpenCL compiler of {device} rejected the generated program"
    if quoted:
        return head + ":\n" + "\n".join(quoted[:8]) + "\n\nfull log:\n" + log.strip()[-4000:]
    return head + ":\n" + log.strip()[-4000:]


_CONTEXTS: dict[int, DeviceContext] = {}


def context(index: int) -> DeviceContext:
    """The (cached) ``DeviceContext`` of ``opencl(index)``."""
    ctx = _CONTEXTS.get(index)
    if ctx is None:
        with _LOCK:
            ctx = _CONTEXTS.get(index)
            if ctx is None:
                ctx = _CONTEXTS[index] = DeviceContext(index)
    return ctx


# ---------------------------------------------------------------------------------------------
# arrays


class OpenCLNDArray(DeviceNDArray):
    """An array in an OpenCL buffer. ``.numpy()`` waits for queued kernels and copies out.

    ``bool`` elements are one byte, as in numpy. A view (``_view``) shares its base's buffer.
    """

    __slots__ = ("_base",)
    _API = "OpenCL"

    def __init__(self, ctx: DeviceContext, buffer, shape: Sequence[int], dtype: str, base=None):
        super().__init__(Device("opencl", ctx.index), ctx, buffer, shape, dtype)
        self._base = base

    @property
    def buffer(self):
        """The ``pyopencl.Buffer`` holding the elements."""
        return self._buffer

    def _view(self, shape: Sequence[int], dtype: str | None = None) -> "OpenCLNDArray":
        """Another shape (and dtype) over the same buffer, from its start."""
        return OpenCLNDArray(self._ctx, self._buffer, shape, dtype or self._dtype,
                             self._base or self)

    def numpy(self) -> np.ndarray:
        out = np.empty(self._shape, dtype=self._dtype)
        return self._ctx.read(self._buffer, out)

    asnumpy = numpy

    def _device_copy(self, source: "OpenCLNDArray") -> None:
        self._ctx.copy(self._buffer, source._buffer, self.nbytes)

    def _host_write(self, src: np.ndarray) -> None:
        self._ctx.write(self._buffer, src)

    def copyto(self, target) -> NDArray:
        if isinstance(target, NDArray):
            return target.copyfrom(self)
        if isinstance(target, Device) and target == self._device:
            out = OpenCLRuntime().empty(self._shape, self._dtype, target)
            return out.copyfrom(self)
        return array(self.numpy(), target)


class OpenCLRuntime:
    """What ``targets.array`` / ``targets.empty`` / ``Device`` use for ``opencl`` devices."""

    def array(self, src: np.ndarray, device: Device) -> OpenCLNDArray:
        ctx = context(device.index)
        dtype = _dtype_name(src.dtype)
        src = np.require(src, requirements="C")     # (ascontiguousarray makes 0-d 1-d)
        buf = ctx.create_buffer(src.nbytes, f"an array of shape {tuple(src.shape)} {dtype}")
        ctx.write(buf, src)
        return OpenCLNDArray(ctx, buf, src.shape, dtype)

    def empty(self, shape, dtype: str, device: Device) -> OpenCLNDArray:
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"array shape {shape} has a negative dimension")
        ctx = context(device.index)
        dtype = _dtype_name(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        size = max(nbytes, 4)          # what create_buffer allocates
        buf = ctx.pool.take(size)      # a freed buffer of this size (buffer_pool: why)
        if buf is None:
            buf = ctx.create_buffer(nbytes, f"an array of shape {shape} {dtype}")
        out = OpenCLNDArray(ctx, buf, shape, dtype)
        ctx.pool.track(out, size, buf)
        return out

    def exist(self, index: int) -> bool:
        try:
            return index < len(_device_list())
        except (OpenCLError, MissingDependencyError):   # no platform, or no pyopencl
            return False

    def sync(self, index: int) -> None:
        if index in _CONTEXTS:
            _CONTEXTS[index].sync()

    def check_errors(self, index: int) -> None:
        """Raise a failed in-kernel check of the kernels launched since the last check (one
        wait when there are such kernels; otherwise the queue is only flushed)."""
        if index in _CONTEXTS:
            _CONTEXTS[index].check_errors()

    def find(self, name: str) -> int:
        return find_device(name)

    def target(self, index: int):
        """``targets.opencl(index).target()``: ``DeviceContext.target``."""
        return context(index).target()


# ---------------------------------------------------------------------------------------------
# a module's kernels on one device


class LoadedProgram:
    """A module's program built for one device: what ``HostPlan.run`` launches through
    (per-kernel launchers, temporaries, error words) and event timing."""

    def __init__(self, ctx: DeviceContext, source: str, extensions: Sequence[str],
                 kernel_names: Sequence[str], blocks: dict | None = None):
        self.ctx = ctx
        self.cl = ctx.cl
        self.program = prog = ctx.program(source, extensions)
        self.kernels = {name: self.cl.Kernel(prog, name) for name in kernel_names}
        self.blocks = dict(blocks or {})
        self.errors = ctx.errors
        self._device = Device("opencl", ctx.index)
        self._last_args: dict[str, tuple] = {}     # kernel -> the arguments set on it

    def launcher(self, name: str):
        """``launch(arrays, scalars, grid, events, memo)`` for kernel ``name``: sets the
        arguments and enqueues it. Setting arguments is skipped when they are those already
        set: on the shared kernel object (direct calls) or, with a call site's ``memo`` (the
        VM), on the site's own kernel object, which keeps its arguments between calls."""
        k = self.kernels[name]
        ctx, cl, prog = self.ctx, self.cl, self.program
        queue, enqueue = ctx.queue, cl.enqueue_nd_range_kernel
        block = tuple(int(b) for b in self.blocks.get(name, (1, 1, 1)))
        b0, b1, b2 = block
        i32 = np.int32
        last = self._last_args

        def launch(arrays, scalars, grid, events, memo):
            nbuf = len(arrays)
            args = []
            for a in arrays:
                if a._ctx is not ctx:
                    raise ValueError(f"kernel {name}: an argument lives on {a.device}, the "
                                     f"kernel runs on opencl({ctx.index})")
                args.append(a._buffer)
            for v in scalars:
                args.append(i32(v))
            # buffers by id: the arrays (and so their buffers) are alive while a key is compared
            key = tuple([id(x) for x in args[:nbuf]]) + tuple(scalars)
            kern = None
            if memo is not None:
                kern = memo.get("kernel")
                if kern is None and memo.setdefault("launches", 0) >= 1:
                    # the site came back: give it its own kernel object (its arguments stay set)
                    kern = memo["kernel"] = cl.Kernel(prog, name)
                    memo["args"] = None
                memo["launches"] += 1
            if kern is None:
                # the shared kernel object: compared by the buffers themselves, which the
                # comparison key keeps alive (so a freed buffer's id cannot come back)
                kern = k
                full = tuple(args)
                if last.get(name) != full:
                    k.set_args(*args)
                    last[name] = full
            elif memo["args"] != key:
                kern.set_args(*args)
                memo["args"] = key
            ev = enqueue(queue, kern, (grid[0] * b0, grid[1] * b1, grid[2] * b2), block)
            if events is not None:
                events.append(ev)
        return launch

    def alloc_temp(self, dtype: str, size: int, what: str):
        return OpenCLRuntime().empty((max(size, 1),), dtype, self._device)

    def alloc_error_word(self, kernel: str):
        word = OpenCLRuntime().empty((1,), "int32", self._device)
        self.ctx.write(word._buffer, np.zeros(1, np.int32))
        return word

    @staticmethod
    def elapsed(events) -> float:
        events[-1].wait()
        return (events[-1].profile.end - events[0].profile.start) * 1e-9


register_device_runtime("opencl", OpenCLRuntime())


__all__ = ["DeviceContext", "LoadedProgram", "OpenCLBuildError", "OpenCLError", "OpenCLNDArray",
           "OpenCLRuntime", "cl_module", "context", "explain_build_error", "find_device",
           "list_devices"]
