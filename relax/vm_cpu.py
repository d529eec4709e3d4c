"""The VM's tensor operations on the CPU: the instructions that touch tensors, for host memory
and the kernels of an LLVM-built library (called through ctypes).

``CPUTensorOps`` decodes ``const``, ``alloc``, ``alloc_storage``, ``alloc_tensor``,
``call_kernel`` and ``builtin`` for ``relax.VirtualMachine`` (``relax.vm``), and handles the call
boundary: arguments become CPU ``NDArray``s (numpy arrays are wrapped, not copied), an ``If``
condition is read in place. ``relax.vm_gpu.GPUTensorOps`` is the same interface for a GPU.

A kernel call goes through a pre-built argument array (``make_kernel_call``): the constant words
(DLTensor templates, type codes, and the pointers and extents of constants and static storage)
are written once, when the instruction is decoded; per call, only the data pointers and extents
of tensors that changed since the previous call are written.

This module needs only numpy and the ``targets`` runtime: it runs on the board.
"""
from __future__ import annotations

import ctypes
import time
from typing import Callable, Sequence

import numpy as np

from tilecraft.targets.runtime import abi
from tilecraft.targets.runtime.ndarray import NDArray

from .vm_builtins import BUILTINS, aligned_bytes, as_ndarray, empty, read_condition
from .vm_values import (StoragePool, as_closure, compile_expr, compile_shape, describe,
                        to_vm_value)

__all__ = ["CPUTensorOps", "make_kernel_call"]


def _view(storage: np.ndarray, offset: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
    n = dtype.itemsize
    for s in shape:
        n *= s
    return storage[offset:offset + n].view(dtype).reshape(shape)


class CPUTensorOps:
    """The instructions that touch tensors, on the CPU, for the VirtualMachine ``vm``.

    Each ``const`` ... ``builtin`` method decodes one instruction (``ctx`` is the decoding
    context of the function: its name, timers, and ``fixed``, the registers whose value is the
    same on every call) into a closure over the register file. Static storage is allocated once
    per VM, when the program is decoded; dynamic storage comes from ``pool`` and goes back at the
    end of the call.
    """

    def __init__(self, vm):
        self.vm = vm
        self.pool = StoragePool()
        self.static_storage: dict[tuple, np.ndarray] = {}
        self.static_storage_bytes = 0
        self.constants = [as_ndarray(c) for c in vm.exe.constants]
        self._records: list = []    # the record arrays of kernel runs (see kernel_run)

    # -- the call boundary -------------------------------------------------------------------
    # a caller's argument as a VM value: numpy arrays are wrapped as CPU NDArrays
    argument = staticmethod(to_vm_value)
    condition = staticmethod(read_condition)

    @staticmethod
    def call(fn, args):
        """Run the VM function ``fn`` (a top-level call)."""
        return fn.run(args)

    # -- instructions ------------------------------------------------------------------------
    def const(self, ctx, dst: int, index: int):
        c = self.constants[index]
        ctx.fixed[dst] = c

        def const(regs):
            regs[dst] = c
        return const

    def alloc(self, ctx, dst: int, shape, dtype: str):
        static, shp = compile_shape(shape)
        dt = np.dtype(dtype)
        if static:
            def alloc(regs):
                regs[dst] = empty(shp, dt)
        else:
            def alloc(regs):
                regs[dst] = empty(shp(regs), dt)
        return alloc

    def alloc_storage(self, ctx, dst: int, size, static: bool):
        if static:
            # allocated once per VM, when the program is decoded (shared by the profiled copy)
            key = (ctx.name, dst)
            buf = self.static_storage.get(key)
            if buf is None:
                buf = self.static_storage[key] = aligned_bytes(max(int(size), 1))[0]
                self.static_storage_bytes += int(size)
            ctx.fixed[dst] = buf

            def alloc_static(regs):
                regs[dst] = buf
            return alloc_static
        size_fn = as_closure(compile_expr(size))
        pool = self.pool

        def alloc_pool(regs):
            regs[dst] = buf = pool.take(size_fn(regs))
            regs[0].append(buf)
        return alloc_pool

    def alloc_tensor(self, ctx, dst: int, storage: int, offset, shape, dtype: str):
        static_shape, shp = compile_shape(shape)
        off_c, off = compile_expr(offset)
        dt = np.dtype(dtype)
        pool = self.pool
        fixed_storage = ctx.fixed.get(storage)
        if fixed_storage is not None and static_shape and off_c and \
                off + int(np.prod(shp, dtype=np.int64)) * dt.itemsize <= fixed_storage.nbytes:
            nd = as_ndarray(_view(fixed_storage, off, shp, dt))
            ctx.fixed[dst] = nd

            def alloc_fixed(regs):
                regs[dst] = nd
            return alloc_fixed
        last = [None, None, None]   # storage, shape, NDArray of the previous call

        def alloc_tensor(regs):
            st = regs[storage]
            s = shp if static_shape else shp(regs)
            if st is last[0] and s == last[1]:
                regs[dst] = last[2]
                return
            o = off if off_c else off(regs)
            n = dt.itemsize
            for d in s:
                n *= d
            if o + n > st.nbytes:
                # beyond the upper bound the storage was planned for: a pool buffer instead
                buf = pool.take(n)
                regs[0].append(buf)
                regs[dst] = as_ndarray(_view(buf, 0, s, dt))
                return
            nd = as_ndarray(_view(st, o, s, dt))
            last[0], last[1], last[2] = st, s, nd
            regs[dst] = nd
        return alloc_tensor

    def kernel_run(self, entries: list) -> tuple:
        """A run of kernel calls whose argument words are all written (a shape plan's): the
        step ``(runner, records, count, failed, fail)`` that ``relax.vm`` runs as ``rc =
        runner(records, count, failed)`` and, when ``rc`` is nonzero, ``fail(rc)`` (raises the
        failing kernel's error). ``entries`` are ``make_kernel_call``'s ``call.entry`` tuples.
        The runner is the kernel library's ``tilecraft_call_sequence`` (one foreign call for the
        whole run); for a library without it, a Python loop over the entries."""
        failed = ctypes.c_int32(0)
        fails = tuple(e[4] for e in entries)

        def fail(rc):
            fails[failed.value](rc)

        mod = self.vm.exe.kernel_module
        native = mod.call_sequence() if mod is not None else None
        if native is None:
            return (_call_each(tuple(entries), failed), 0, len(entries), 0, fail)
        records = (ctypes.c_ssize_t * (4 * len(entries)))()
        for i, (cfunc, words, codes, count, _) in enumerate(entries):
            records[4 * i:4 * i + 4] = [ctypes.cast(cfunc, ctypes.c_void_p).value, words, codes,
                                        count]
        self._records.append((records, failed))   # the runner reads and writes them
        return (native, ctypes.addressof(records), len(entries), ctypes.addressof(failed), fail)

    def call_kernel(self, ctx, kname: str, tensor_regs: list, scalars: list,
                    outputs: int | None = None):
        return make_kernel_call(self.vm._kernel(kname), ctx.name, kname, tensor_regs, scalars,
                                ctx.timers, ctx.fixed)

    def builtin(self, ctx, dst: int, name: str, arg_regs: list, attrs: dict):
        fn = BUILTINS.get(name)
        if fn is None:
            raise ValueError(f"{ctx.name}: the program calls the unknown VM builtin {name!r}")
        fname = ctx.name
        attrs = dict(attrs or {})

        def builtin(regs):
            try:
                regs[dst] = fn(*[regs[r] for r in arg_regs], **attrs)
            except (ValueError, TypeError) as err:
                raise ValueError(f"{fname}: {name}: {err}") from None
        return builtin


# ---------------------------------------------------------------------------------------------
# kernel calls


def make_kernel_call(kfn, fname: str, kname: str, tensor_regs: Sequence[int], scalars: list,
                     timers: dict | None, fixed: dict) -> Callable:
    """A closure calling the kernel ``kfn`` (a ``targets`` Function) through a pre-built
    argument array. The constant words (DLTensor templates, type codes, and the pointers and
    extents of tensors fixed for the VM's lifetime: constants, static storage) are written here,
    once; per call, a tensor's data pointer and extents are written only when its register holds
    a different object from the previous call's."""
    params = kfn.params
    n_tensor = sum(p["kind"] == "buffer" for p in params)
    if len(tensor_regs) != n_tensor or len(tensor_regs) + len(scalars) != len(params):
        raise ValueError(f"{fname}: the program calls kernel {kname} with {len(tensor_regs)} "
                         f"tensor(s) and {len(scalars)} scalar(s); it takes "
                         f"{', '.join(p['name'] + ':' + p['kind'] for p in params)}")
    if any(p["kind"] != "buffer" for p in params[:n_tensor]):
        raise ValueError(f"{fname}: kernel {kname}: tensor parameters must come before scalars")
    count = len(params)
    shape_words = sum(len(p["shape"]) for p in params if p["kind"] == "buffer")
    size = count + 6 * n_tensor + shape_words
    words = (ctypes.c_int64 * max(size, 1))()
    base = ctypes.addressof(words)
    codes = (ctypes.c_int32 * max(count, 1))()
    slots = []   # per tensor argument not fixed: (register, pointer word, shape words, ...)
    t = count
    s = count + 6 * n_tensor
    for i, (reg, p) in enumerate(zip(tensor_regs, params)):
        nd = len(p["shape"])
        code, bits, lanes = abi.dl_dtype(p["dtype"])
        words[i] = base + 8 * t
        words[t + 1] = abi.DL_CPU
        words[t + 2] = nd | code << 32 | bits << 40 | lanes << 48
        words[t + 3] = base + 8 * s
        codes[i] = abi.TYPE_DLTENSOR
        slot = (reg, t, s, s + nd, nd, np.dtype(p["dtype"]), p["name"])
        value = fixed.get(reg)
        if type(value) is NDArray:
            _check_value(value, slot, fname, kname)
            words[t] = value._ptr
            words[s:s + nd] = value._data.shape
        else:
            slots.append(slot)
        t += 6
        s += nd
    scalar_slots = []
    for j, (expr, p) in enumerate(zip(scalars, params[n_tensor:])):
        i = n_tensor + j
        if p["dtype"].startswith("float"):
            raise ValueError(f"{fname}: kernel {kname}: float scalar parameters are not supported "
                             f"by the VM")
        codes[i] = abi.TYPE_INT
        const, value = compile_expr(expr)
        if const:
            words[i] = int(value)
        else:
            scalar_slots.append((i, value))
    slots = tuple(slots)
    slot_regs = tuple(sl[0] for sl in slots)
    scalar_slots = tuple(scalar_slots)
    last = [None] * len(slots)
    cfunc = kfn._cfunc
    codes_addr = ctypes.addressof(codes)
    module = kfn.module

    def fail(rc):
        raise ValueError(f"{fname}: kernel {kname}: "
                         f"{module._last_error() or f'failed with code {rc}'}")

    def update(j, x):
        slot = slots[j]
        _check_value(x, slot, fname, kname)
        words[slot[1]] = x._ptr
        words[slot[2]:slot[3]] = x._data.shape
        last[j] = x

    if not slots and not scalar_slots:
        def call(regs):
            rc = cfunc(base, codes_addr, count)
            if rc:
                fail(rc)
    elif len(slots) == 1 and not scalar_slots:
        r0 = slot_regs[0]

        def call(regs):
            x = regs[r0]
            if x is not last[0]:
                update(0, x)
            rc = cfunc(base, codes_addr, count)
            if rc:
                fail(rc)
    else:
        def call(regs):
            j = 0
            for r in slot_regs:
                x = regs[r]
                if x is not last[j]:
                    update(j, x)
                j += 1
            for i, fn in scalar_slots:
                words[i] = fn(regs)
            rc = cfunc(base, codes_addr, count)
            if rc:
                fail(rc)

    def refresh(regs):
        """Write every argument word from ``regs`` (a function's plan: its views and shape
        values are the same on every call with that shape key)."""
        for j, r in enumerate(slot_regs):
            update(j, regs[r])
        for i, fn in scalar_slots:
            words[i] = fn(regs)

    def call_fixed(regs):
        # every argument word is the plan's, written by refresh when the plan was switched to
        rc = cfunc(base, codes_addr, count)
        if rc:
            fail(rc)

    call.keep = (words, codes)  # the closure owns the argument arrays
    if timers is None:
        # for relax.vm's plans: the registers the call reads, and its variant for a call whose
        # arguments are all fixed by the plan
        call.reads = tuple(tensor_regs)
        call.refresh, call.fixed = refresh, call_fixed
        # the bare entry call, for a run of such calls made in one loop without a closure each
        call.entry = (cfunc, base, codes_addr, count, fail)
        return call
    clock = time.perf_counter

    def timed_call(regs):
        start = clock()
        call(regs)
        elapsed = clock() - start
        entry = timers.get(kname)
        timers[kname] = (1, elapsed) if entry is None else (entry[0] + 1, entry[1] + elapsed)
    return timed_call


def _call_each(entries: tuple, failed: ctypes.c_int32) -> Callable:
    """The sequence runner's contract in Python, for a library that lacks the native one."""
    def run(records, count, failed_address):
        for i, (cfunc, words, codes, n, _) in enumerate(entries):
            rc = cfunc(words, codes, n)
            if rc:
                failed.value = i
                return rc
        return 0
    return run


def _check_value(x, slot, fname: str, kname: str) -> None:
    """The value passed for a kernel's tensor parameter is a tensor of its dtype and rank (the
    entry checks the extents; the rank and dtype words are the template's)."""
    _, _, _, _, nd, dt, pname = slot
    if type(x) is not NDArray:
        raise ValueError(f"{fname}: kernel {kname}: argument {pname} must be a tensor, got "
                         f"{describe(x)}")
    arr = x._data
    if arr.dtype != dt or arr.ndim != nd:
        raise ValueError(f"{fname}: kernel {kname}: argument {pname} has dtype "
                         f"{arr.dtype.name} and rank {arr.ndim}, expected {dt.name} and rank {nd}")
