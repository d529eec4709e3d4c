"""The VM on a GPU device (``relax.VirtualMachine(exe, targets.opencl(0))``): the instructions
that touch tensors, for device arrays.

An executable built for an ``opencl`` (or ``webgpu``) target runs with every tensor of the
program on the device: arguments in host memory (numpy arrays, CPU NDArrays) are copied to the
device when the function is entered — the one host-to-device copy at the boundary — constants
once per VM, storages and fresh tensors are device allocations, planned tensors are views of
their storage, kernels are the GPU module's functions (``targets.runtime.device_module``).
Results are device NDArrays; ``.numpy()`` copies one back. The builtins that have no device
version (``tensor_to_shape``, ``print``, an ``If`` condition) read their tensor back to the host.

Kernels are launched with ``enqueue``: nothing waits for the device inside a call. Kernels with
in-kernel run-time checks write an error word; ``GPUTensorOps.call`` reads all of a call's words
once, at its end (``DeviceKernelError: main: take: kernel take_kernel0: index ... out of bounds``).

``GPUTensorOps`` is the interface of ``relax.vm_cpu.CPUTensorOps`` for a GPU:
``relax.VirtualMachine`` decodes ``const``, ``alloc``, ``alloc_storage``, ``alloc_tensor``,
``call_kernel`` and ``builtin`` with it when its device is not the CPU; everything else (shape
arithmetic, tuples, calls, matching) is the VM's own.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from tilecraft.targets.runtime.device import device_runtime
from tilecraft.targets.runtime.host_program import DeviceKernelError
from tilecraft.targets.runtime.ndarray import NDArray

from .vm_builtins import BUILTINS, as_ndarray, read_condition
from .vm_values import StoragePool, as_closure, compile_expr, compile_shape, to_vm_value

__all__ = ["GPUTensorOps", "to_device", "to_host"]


def to_device(x, device, what: str = "a tensor"):
    """``x`` as an array on ``device`` (copied when it is elsewhere)."""
    if isinstance(x, NDArray) and x.device == device:
        return x
    if isinstance(x, NDArray):
        x = x.numpy()
    return device_runtime(device.kind).array(np.require(x, requirements="C"), device)


def to_host(x):
    """Device arrays inside ``x`` (a value of the VM) as CPU NDArrays."""
    if isinstance(x, NDArray) and x.device.kind != "cpu":
        return as_ndarray(np.ascontiguousarray(x.numpy()))
    if isinstance(x, tuple):
        return tuple(to_host(v) for v in x)
    return x


def _on_device(v, device):
    """The tensors of a VM value copied to ``device``."""
    if isinstance(v, NDArray):
        return to_device(v, device)
    if isinstance(v, tuple):
        return tuple(_on_device(x, device) for x in v)
    return v


def _view(storage, shape: tuple, dtype: str, device):
    """A tensor of ``shape`` over ``storage`` (a device array of bytes) from its start; a fresh
    array when the back end has no views or the storage is too small."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    view = getattr(storage, "_view", None)
    if view is not None and hasattr(storage, "storage_nbytes"):
        # a back end whose elements take other sizes on the device (WebGPU widens int8 to a
        # word, narrows int64): its own _view checks the view's device bytes against the buffer
        try:
            return view(shape, dtype)
        except ValueError:
            pass
    elif view is not None and nbytes <= storage.nbytes:
        return view(shape, dtype)
    return device_runtime(device.kind).empty(shape, dtype, device)


def _storage(rt, nbytes: int, dev):
    """Raw storage of ``nbytes`` bytes: 32-bit words (a uint8 array would take 4 bytes an
    element on WebGPU, which keeps 8-bit integers widened)."""
    return rt.empty((max(1, (int(nbytes) + 3) // 4),), "uint32", dev)


_DEVICE_BUILTINS = {"vm.builtin.shape_of", "vm.builtin.make_tuple", "vm.builtin.tuple_getitem",
                    "vm.builtin.null_value"}


class GPUTensorOps:
    """The instructions that touch tensors, on a GPU, for the VirtualMachine ``vm``.

    The same interface as ``relax.vm_cpu.CPUTensorOps``: each ``const`` ... ``builtin`` method
    decodes one instruction into a closure over the register file; ``argument``, ``condition``
    and ``call`` are the call boundary (arguments copied to the device, a condition read back,
    the kernels' error words read once at the end of a call).
    """

    def __init__(self, vm):
        self.vm = vm
        self.device = dev = vm.device
        self.runtime = rt = device_runtime(dev.kind)
        # 4-byte granules: storages are arrays of 32-bit words (see _storage)
        self.pool = StoragePool(lambda nbytes: _storage(rt, nbytes, dev), align=4)
        self.static_storage: dict[tuple, object] = {}
        self.static_storage_bytes = 0
        self.constants = [to_device(c, dev) for c in vm.exe.constants]   # once per VM

    # -- the call boundary -------------------------------------------------------------------
    def argument(self, x, spec: dict, fname: str, what: str):
        """A caller's argument as a VM value, its tensors copied to the device (the one
        host-to-device copy at the boundary)."""
        return _on_device(to_vm_value(x, spec, fname, what), self.device)

    @staticmethod
    def condition(value) -> bool:
        return read_condition(to_host(value))

    def call(self, fn, args):
        """Run the VM function ``fn`` (a top-level call) and check its kernels' errors at the
        end.

        If the call fails on the host after a kernel's check failed (a builtin reading garbage
        back), the kernel's error is what is raised: it is the cause.
        """
        try:
            out = fn.run(args)
        except Exception:
            self.check_kernel_errors(fn.name)
            raise
        self.check_kernel_errors(fn.name)
        return out

    def check_kernel_errors(self, fname: str) -> None:
        """Read the error words of the kernels the call launched (one wait, only when some
        kernel has in-kernel checks) and raise the first failed check: ``DeviceKernelError``
        naming the VM function, the kernel function and the check. Otherwise the queued work is
        flushed."""
        try:
            self.runtime.check_errors(self.device.index)
        except DeviceKernelError as err:
            raise DeviceKernelError(f"{fname}: {err}") from None

    # -- instructions ------------------------------------------------------------------------
    def const(self, ctx, dst: int, index: int) -> Callable:
        c = self.constants[index]

        def const(regs):
            regs[dst] = c
        return const

    def alloc(self, ctx, dst: int, shape, dtype: str) -> Callable:
        static, shp = compile_shape(shape)
        rt, dev = self.runtime, self.device

        def alloc(regs):
            regs[dst] = rt.empty(shp if static else shp(regs), dtype, dev)
        return alloc

    def alloc_storage(self, ctx, dst: int, size, static: bool) -> Callable:
        if static:
            # allocated once per VM, when the program is decoded (shared by the profiled copy)
            key = (ctx.name, dst)
            buf = self.static_storage.get(key)
            if buf is None:
                buf = self.static_storage[key] = _storage(self.runtime, size, self.device)
                self.static_storage_bytes += int(size)

            def alloc_static(regs):
                regs[dst] = buf
            return alloc_static
        size_fn = as_closure(compile_expr(size))
        pool = self.pool     # given back at the end of the call, by byte size

        def alloc_pool(regs):
            regs[dst] = buf = pool.take(size_fn(regs))
            regs[0].append(buf)
        return alloc_pool

    def alloc_tensor(self, ctx, dst: int, storage: int, offset, shape, dtype: str) -> Callable:
        static_shape, shp = compile_shape(shape)
        off_c, off = compile_expr(offset)
        if not off_c or off != 0:
            raise ValueError(f"{ctx.name}: the GPU VM needs tensors at offset 0 of their storage")
        dev = self.device
        last = [None, None, None]

        def alloc_tensor(regs):
            st = regs[storage]
            s = shp if static_shape else shp(regs)
            if st is last[0] and s == last[1]:
                regs[dst] = last[2]
                return
            t = _view(st, s, dtype, dev)
            last[0], last[1], last[2] = st, s, t
            regs[dst] = t
        return alloc_tensor

    def call_kernel(self, ctx, kname: str, tensor_regs: list, scalars: list,
                    outputs: int | None = None) -> Callable:
        kfn = self.vm._kernel(kname)
        # launched without waiting for in-kernel checks: call() reads them once per call
        enqueue = kfn.enqueue
        fname = ctx.name
        scalar_fns = [as_closure(compile_expr(e)) for e in scalars]
        regs_t = tuple(tensor_regs)

        def call(regs):
            args = [regs[r] for r in regs_t] + [f(regs) for f in scalar_fns]
            try:
                enqueue(*args)
            except (ValueError, TypeError) as err:
                raise ValueError(f"{fname}: kernel {kname}: {err}") from None
        if ctx.timers is None:
            return call
        timers, clock, dev = ctx.timers, time.perf_counter, self.device

        def timed_call(regs):
            start = clock()
            call(regs)
            dev.sync()
            elapsed = clock() - start
            entry = timers.get(kname)
            timers[kname] = (1, elapsed) if entry is None else (entry[0] + 1, entry[1] + elapsed)
        return timed_call

    def builtin(self, ctx, dst: int, name: str, arg_regs: list, attrs: dict) -> Callable:
        fn = BUILTINS.get(name)
        if fn is None:
            raise ValueError(f"{ctx.name}: the program calls the unknown VM builtin {name!r}")
        fname, dev, rt = ctx.name, self.device, self.runtime
        attrs = dict(attrs or {})

        if name == "vm.builtin.reshape":
            def reshape(regs):
                x, shape = regs[arg_regs[0]], tuple(int(s) for s in regs[arg_regs[1]])
                if int(np.prod(shape, dtype=np.int64)) != x.size:
                    raise ValueError(f"{fname}: reshape: the element count of the input "
                                     f"{x.shape} ({x.size}) differs from that of the output "
                                     f"{shape}")
                view = getattr(x, "_view", None)
                regs[dst] = view(shape) if view is not None else to_device(
                    x.numpy().reshape(shape), dev)
            return reshape
        if name == "vm.builtin.copy":
            def copy(regs):
                x = regs[arg_regs[0]]
                regs[dst] = rt.empty(x.shape, x.dtype, dev).copyfrom(x)
            return copy

        def builtin(regs):
            args = [regs[r] for r in arg_regs]
            if name not in _DEVICE_BUILTINS:
                args = [to_host(a) for a in args]
            try:
                out = fn(*args, **attrs)
            except (ValueError, TypeError) as err:
                raise ValueError(f"{fname}: {name}: {err}") from None
            if isinstance(out, NDArray) and out.device.kind == "cpu":
                out = to_device(out, dev)
            regs[dst] = out
        return builtin
