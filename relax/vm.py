"""The Relax virtual machine: runs an ``Executable``'s program on a device.

A program has, per Relax function, a register count, its parameters and a compact instruction
list (plain JSON data, written by ``relax.build``). When a ``VirtualMachine`` is made, each
instruction is decoded once into a Python closure with everything it needs resolved: kernel
entry points (ctypes), pre-built argument arrays with the constant words (DLTensor templates,
type codes) already written, static storage, compiled shape expressions. Running a function is
then one loop over closures; a kernel call writes only the data pointers and extents that
changed since the previous call (a planned intermediate keeps its buffer, so its words are
written once) and calls the entry.

Instructions (``[opcode, operands...]``; ``%r`` a register, ``expr`` a shape expression)::

    match        %src what spec phase        check / bind an argument or a match_cast value
    const        %dst index                  a constant tensor
    alloc        %dst [expr..] dtype         a fresh tensor (function outputs)
    alloc_storage %dst expr static           raw storage: static (once per VM) or from the pool
    alloc_tensor %dst %storage expr [expr..] dtype    a view of a storage
    call_kernel  name [%args..] [expr..]     a kernel: tensors (inputs then outputs), scalars
    builtin      %dst name [%args..] attrs   a VM builtin (relax.vm_builtins)
    call_func    %dst name [%args..]         another Relax function
    tuple        %dst [%fields..]            get_item %dst %src index
    shape        %dst [expr..]               prim %dst expr          move %dst %src
    if           %dst %cond [then..] %then_ret [else..] %else_ret

Shape expressions are ints, ``["r", reg]`` (a symbolic variable's register) or
``[op, operands...]`` with op one of ``add sub mul floordiv floormod div mod min max lt le eq ne
gt ge and or not select cast``.

A VirtualMachine is not reentrant and not thread-safe (its static storage and argument arrays
are its own): use one per thread.

Examples
--------
>>> vm = VirtualMachine(exe, targets.cpu(0))                 # doctest: +SKIP
>>> out = vm["main"](np.random.rand(7, 64).astype("float32"))   # doctest: +SKIP
>>> vm.time_evaluator("main", targets.cpu(0), number=100)(x).mean   # doctest: +SKIP
>>> print(vm.profile(x))                                     # doctest: +SKIP
"""
from __future__ import annotations

import ctypes
import time
from typing import Any, Callable, Sequence

import numpy as np

from tilecraft.targets.runtime import abi
from tilecraft.targets.runtime.device import Device, cpu
from tilecraft.targets.runtime.module import BenchmarkResult
from tilecraft.targets.runtime.ndarray import NDArray

from .executable import Executable
from . import boundary_dtypes, vm_gpu
from .vm_builtins import BUILTINS, aligned_bytes, as_ndarray, empty, read_condition

_ALIGN = 64


class VMArgumentError(ValueError, TypeError):
    """Arguments that do not match a function's signature: count, kind, rank, dtype or a
    dimension. A ``ValueError`` (and a ``TypeError`` for a wrong count or kind)."""


# ---------------------------------------------------------------------------------------------
# shape expressions


def _truncdiv(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _truncmod(a, b):
    return a - _truncdiv(a, b) * b


_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b,
    "div": _truncdiv, "mod": _truncmod, "min": min, "max": max,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "and": lambda a, b: bool(a) and bool(b), "or": lambda a, b: bool(a) or bool(b),
}


def _cast(dtype: str, v):
    if dtype == "bool":
        return bool(v)
    if dtype.startswith("float"):
        return float(v)
    return int(v)


def compile_expr(e) -> tuple[bool, Any]:
    """(is_constant, value or closure(regs)) for a shape expression of the program."""
    if isinstance(e, (bool, int, float)):
        return True, e
    if not isinstance(e, list) or not e:
        raise ValueError(f"malformed shape expression {e!r} in the VM program")
    op = e[0]
    if op == "r":
        reg = e[1]
        return False, lambda regs: regs[reg]
    if op == "cast":
        c, a = compile_expr(e[2])
        dtype = e[1]
        if c:
            return True, _cast(dtype, a)
        return False, lambda regs: _cast(dtype, a(regs))
    if op == "not":
        c, a = compile_expr(e[1])
        return (True, not a) if c else (False, lambda regs: not a(regs))
    if op == "select":
        parts = [compile_expr(x) for x in e[1:4]]
        fs = [(lambda regs, v=v: v) if c else v for c, v in parts]
        cond, t, f = fs
        return False, lambda regs: t(regs) if cond(regs) else f(regs)
    fn = _BINARY.get(op)
    if fn is None or len(e) != 3:
        raise ValueError(f"unknown shape expression operator {op!r} in the VM program")
    (ca, a), (cb, b) = compile_expr(e[1]), compile_expr(e[2])
    if ca and cb:
        return True, fn(a, b)
    if op in ("floordiv", "floormod", "div", "mod"):
        fa = (lambda regs: a) if ca else a
        fb = (lambda regs: b) if cb else b

        def divide(regs):
            d = fb(regs)
            if d == 0:
                raise ValueError(f"division by zero in the shape expression {e!r}")
            return fn(fa(regs), d)
        return False, divide
    if ca:
        return False, lambda regs: fn(a, b(regs))
    if cb:
        return False, lambda regs: fn(a(regs), b)
    return False, lambda regs: fn(a(regs), b(regs))


def compile_shape(exprs) -> tuple[bool, Any]:
    """(is_constant, tuple or closure(regs) -> tuple of ints)."""
    parts = [compile_expr(e) for e in exprs]
    if all(c for c, _ in parts):
        return True, tuple(int(v) for _, v in parts)
    fs = tuple((lambda regs, v=v: v) if c else v for c, v in parts)
    if len(fs) == 1:
        f0 = fs[0]
        return False, lambda regs: (f0(regs),)
    if len(fs) == 2:
        f0, f1 = fs
        return False, lambda regs: (f0(regs), f1(regs))
    return False, lambda regs: tuple(f(regs) for f in fs)


def _as_closure(parts):
    c, v = parts
    return (lambda regs: v) if c else v


# ---------------------------------------------------------------------------------------------
# memory


class StoragePool:
    """Free buffers keyed by byte size: dynamic storages come from here and go back at the end
    of the call that took them."""

    def __init__(self):
        self.free: dict[int, list] = {}
        self.allocated_bytes = 0

    def take(self, nbytes: int) -> np.ndarray:
        nbytes = max(_ALIGN, (int(nbytes) + _ALIGN - 1) // _ALIGN * _ALIGN)
        lst = self.free.get(nbytes)
        if lst:
            return lst.pop()
        self.allocated_bytes += nbytes
        return aligned_bytes(nbytes)[0]

    def give(self, buf: np.ndarray) -> None:
        self.free.setdefault(buf.nbytes, []).append(buf)


def _view(storage: np.ndarray, offset: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
    n = dtype.itemsize
    for s in shape:
        n *= s
    return storage[offset:offset + n].view(dtype).reshape(shape)


# ---------------------------------------------------------------------------------------------
# values


def _to_value(x, spec: dict, fname: str, what: str):
    """Convert a caller's argument to a VM value, checking its kind."""
    kind = spec["kind"]
    if kind == "tensor":
        if type(x) is NDArray:
            if x.device.kind != "cpu":
                raise VMArgumentError(f"{fname}: {what} lives on {x.device}; this VM runs on the "
                                      f"CPU")
            return x
        if isinstance(x, np.ndarray):
            if not x.flags.c_contiguous or not x.flags.aligned or not x.dtype.isnative:
                x = np.require(x.astype(x.dtype.newbyteorder("="), copy=False), requirements=["C", "A"])
            return as_ndarray(x)
        if isinstance(x, NDArray):
            return x
        raise VMArgumentError(f"{fname}: {what} must be a tensor (numpy array or NDArray), got "
                              f"{type(x).__name__}")
    if kind == "tuple":
        if not isinstance(x, (tuple, list)):
            raise VMArgumentError(f"{fname}: {what} must be a tuple of {len(spec['fields'])}, "
                                  f"got {type(x).__name__}")
        if len(x) != len(spec["fields"]):
            raise VMArgumentError(f"{fname}: {what} must be a tuple of {len(spec['fields'])}, "
                                  f"got one of {len(x)}")
        return tuple(_to_value(v, s, fname, f"{what}[{i}]")
                     for i, (v, s) in enumerate(zip(x, spec["fields"])))
    if kind == "shape":
        if not isinstance(x, (tuple, list)) or not all(isinstance(v, (int, np.integer))
                                                        for v in x):
            raise VMArgumentError(f"{fname}: {what} must be a shape (a tuple of ints), got "
                                  f"{x!r}")
        return tuple(int(v) for v in x)
    if kind == "prim":
        if isinstance(x, np.ndarray) and x.ndim == 0:
            x = x[()]
        if isinstance(x, NDArray) and x.ndim == 0:
            x = x.numpy()[()]
        if not isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating)):
            raise VMArgumentError(f"{fname}: {what} must be a scalar ({spec.get('dtype')}), got "
                                  f"{type(x).__name__}")
        return x.item() if isinstance(x, np.generic) else x
    # no static information: arrays become tensors, sequences tuples
    if isinstance(x, np.ndarray):
        return _to_value(x, {"kind": "tensor"}, fname, what)
    if isinstance(x, (tuple, list)):
        return tuple(_to_value(v, spec, fname, f"{what}[{i}]") for i, v in enumerate(x))
    return x


_CPU = cpu(0)


def _on_device(v, device):
    """Tensors of an argument value copied to ``device`` (the GPU VM's boundary)."""
    if isinstance(v, NDArray):
        return vm_gpu.to_device(v, device)
    if isinstance(v, tuple):
        return tuple(_on_device(x, device) for x in v)
    return v


class _Ctx:
    """What closures of one function share."""

    def __init__(self, vm: "VirtualMachine", name: str, fn: dict, timers: dict | None):
        self.vm, self.name, self.fn, self.timers = vm, name, fn, timers
        self.origins: dict[int, str] = {}
        # registers whose value is the same on every call (constants, views of static
        # storage): known when decoding, so kernel calls write their argument words once
        self.fixed: dict[int, Any] = {}


class _Function:
    """A decoded VM function: ``f(*args)`` runs it."""

    def __init__(self, vm: "VirtualMachine", name: str, fn: dict, timers: dict | None):
        self.vm, self.name = vm, name
        self.params = list(fn["params"])
        self.param_regs = list(fn["param_regs"])
        self.param_specs = list(fn["param_specs"])
        self.num_regs = int(fn["num_regs"])
        self.ret = fn["ret"]
        # bfloat16 / float8 / int4... parameters and results: ml_dtypes arrays at the boundary
        self.boundary = fn.get(boundary_dtypes.ATTR)
        ctx = _Ctx(vm, name, fn, timers)
        self.code = tuple(vm._decode(ins, ctx) for ins in fn["code"])

    def __call__(self, *args):
        if len(args) != len(self.params):
            raise VMArgumentError(
                f"{self.name} takes {len(self.params)} argument(s) ({', '.join(self.params)}), "
                f"got {len(args)}")
        if self.boundary:
            args = boundary_dtypes.args_to_storage(args, self.boundary.get("params"), self.name,
                                                   self.params, VMArgumentError)
        if self.vm._gpu:   # in-kernel checks are read once, at the end of the call
            out = vm_gpu.run_checked(self, args)
        else:
            out = self.run(args)
        if self.boundary:
            out = boundary_dtypes.result_from_storage(out, self.boundary.get("ret"))
        return out

    def run(self, args):
        regs = [None] * self.num_regs
        regs[0] = taken = []  # dynamic storages this call took from the pool
        for r, a in zip(self.param_regs, args):
            regs[r] = a
        try:
            for ins in self.code:
                ins(regs)
            return regs[self.ret]
        finally:
            if taken:
                # back in reverse order: the next call takes the same buffers for the same
                # instructions, so the views cached on them stay valid
                pool = self.vm._pool
                for buf in reversed(taken):
                    pool.give(buf)

    def __repr__(self):
        return f"<relax.VM function {self.name}({', '.join(self.params)})>"


class ProfileReport:
    """Per-kernel times of one or more runs of a function: ``rows`` (dicts with ``name``,
    ``calls``, ``total_ms``, ``percent``, ``mean_us``), ``total_ms``; ``str()`` is a table."""

    def __init__(self, func_name: str, rows: list[dict], total_ms: float, runs: int):
        self.func_name, self.rows, self.total_ms, self.runs = func_name, rows, total_ms, runs

    def table(self) -> str:
        width = max([len(r["name"]) for r in self.rows] + [12])
        head = f"{'name':<{width}}  {'calls':>6}  {'total ms':>10}  {'percent':>7}  {'mean us':>10}"
        lines = [f"profile of {self.func_name} ({self.runs} run(s))", head, "-" * len(head)]
        for r in self.rows:
            lines.append(f"{r['name']:<{width}}  {r['calls']:>6}  {r['total_ms']:>10.4f}  "
                         f"{r['percent']:>6.1f}%  {r['mean_us']:>10.2f}")
        lines.append("-" * len(head))
        lines.append(f"{'total':<{width}}  {'':>6}  {self.total_ms:>10.4f}  {100.0:>6.1f}%")
        return "\n".join(lines)

    __str__ = table

    def __repr__(self):
        return f"<ProfileReport {self.func_name}: {len(self.rows)} rows, {self.total_ms:.3f} ms>"


class VirtualMachine:
    """Run an ``Executable``: ``vm["main"](*inputs)``.

    Parameters
    ----------
    exe : Executable
        From ``relax.build`` or ``relax.load_executable``.
    device : Device
        Where to run (``targets.cpu(0)``, the default).

    Inputs are numpy arrays or ``NDArray``s (and Python ints / tuples for scalar and shape
    parameters); a tensor result is an ``NDArray``, a tuple result a tuple. Arguments are checked
    against the function's signature: a wrong count, rank, dtype or dimension raises
    ``VMArgumentError`` (a ``ValueError``) naming the function, the argument and the dimension,
    and the VM stays usable.

    Examples
    --------
    >>> vm = VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))     # doctest: +SKIP
    >>> vm["main"](x).numpy()                                            # doctest: +SKIP
    """

    def __init__(self, exe: Executable, device: Device | None = None):
        if not isinstance(exe, Executable):
            raise TypeError(f"VirtualMachine takes an Executable (from relax.build or "
                            f"relax.load_executable), got {type(exe).__name__}")
        device = device or cpu(0)
        if not isinstance(device, Device):
            raise TypeError(f"VirtualMachine: device must be a targets.Device, got {device!r}")
        kind = (exe.target.split() or ["llvm"])[0]
        want = "cpu" if kind == "llvm" else kind
        if device.kind != want:
            where = "the CPU" if want == "cpu" else f"an {want} device (built for {kind})"
            raise ValueError(f"VirtualMachine: this executable's kernels run on {where}, not "
                             f"on {device}")
        reason = exe.unavailable_reason()
        if reason:
            raise RuntimeError(f"VirtualMachine: cannot run this executable here: {reason}")
        self.exe = exe
        self.device = device
        self._pool = StoragePool()
        self._static_storage: dict[tuple, np.ndarray] = {}
        self.static_storage_bytes = 0
        self._gpu = device.kind != "cpu"   # tensors live on the device (relax.vm_gpu)
        self._constants = (vm_gpu.upload_constants(self) if self._gpu else
                           [as_ndarray(c) for c in exe.constants])
        self._kernel_fns: dict[str, Any] = {}
        self._functions: dict[str, _Function] = {}
        self._profiled: dict[str, _Function] | None = None
        self._timers: dict[str, list] | None = None
        self._decoding: dict | None = None
        self._functions = self._decode_all(None)

    def _decode_all(self, timers):
        funcs: dict[str, _Function] = {}
        self._decoding = funcs
        for name, fn in self.exe.program["functions"].items():
            funcs[name] = _Function(self, name, fn, timers)
        self._decoding = None
        return funcs

    # -- calling ----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> _Function:
        try:
            return self._functions[name]
        except KeyError:
            raise KeyError(f"the executable has no function {name!r}; it has "
                           f"{sorted(self._functions)}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._functions

    def invoke(self, name: str, *args):
        return self[name](*args)

    def _prepare(self, fn: _Function, args) -> list:
        """Arguments converted once (numpy -> NDArray), for repeated calls."""
        if len(args) != len(fn.params):
            fn(*args)  # raises the count error
        if fn.boundary:
            args = boundary_dtypes.args_to_storage(args, fn.boundary.get("params"), fn.name,
                                                   fn.params, VMArgumentError)
        return [_to_value(a, s, fn.name, f"argument {p}")
                for a, s, p in zip(args, fn.param_specs, fn.params)]

    def time_evaluator(self, func_name: str, device: Device | None = None, number: int = 10,
                       repeat: int = 3, min_repeat_ms: float = 0) -> Callable[..., BenchmarkResult]:
        """A function that runs ``func_name`` ``number`` times per repeat and returns the
        timings (seconds per call) as a ``targets.BenchmarkResult``.

        Examples
        --------
        >>> vm.time_evaluator("main", targets.cpu(0), number=100)(x).mean    # doctest: +SKIP
        """
        fn = self[func_name]
        if number < 1 or repeat < 1:
            raise ValueError(f"time_evaluator: number and repeat must be >= 1 (got {number}, "
                             f"{repeat})")
        device = device or self.device

        def evaluator(*args) -> BenchmarkResult:
            values = self._prepare(fn, args)
            fn.run(values)  # checks the arguments once and warms caches and storage up
            device.sync()
            run = fn.run
            n = number
            results = []
            clock = time.perf_counter
            for _ in range(repeat):
                while True:
                    start = clock()
                    for _ in range(n):
                        run(values)
                    device.sync()  # a GPU queue runs behind the host: time the work, not the enqueue
                    elapsed = clock() - start
                    if min_repeat_ms <= 0 or elapsed * 1000 >= min_repeat_ms:
                        break
                    n = max(n * 2, int(n * min_repeat_ms / max(elapsed * 1000, 1e-3) * 1.2))
                results.append(elapsed / n)
            return BenchmarkResult(results)

        return evaluator

    def profile(self, *args, func_name: str = "main", number: int = 1) -> ProfileReport:
        """Run ``func_name`` ``number`` times (after one warm-up run), timing every kernel call.

        Returns a ``ProfileReport``: one row per kernel (name, calls, total ms, percent of the
        function's time, mean us), slowest first, plus a ``(vm)`` row for the time spent outside
        kernels (argument checks, allocation, builtins, dispatch).

        Examples
        --------
        >>> print(vm.profile(x))                                     # doctest: +SKIP
        """
        if self._profiled is None:
            self._timers = {}
            self._profiled = self._decode_all(self._timers)
        fn = self._profiled.get(func_name)
        if fn is None:
            self[func_name]  # raises the KeyError
        values = self._prepare(fn, args)
        fn.run(values)
        timers = self._timers
        timers.clear()
        clock = time.perf_counter
        start = clock()
        for _ in range(number):
            fn.run(values)
        total = clock() - start
        rows = []
        spent = 0.0
        for name, (calls, secs) in timers.items():
            spent += secs
            rows.append({"name": name, "calls": calls, "total_ms": secs * 1e3,
                         "percent": 100.0 * secs / total if total else 0.0,
                         "mean_us": secs / calls * 1e6 if calls else 0.0})
        rows.sort(key=lambda r: -r["total_ms"])
        other = max(total - spent, 0.0)
        rows.append({"name": "(vm)", "calls": number, "total_ms": other * 1e3,
                     "percent": 100.0 * other / total if total else 0.0,
                     "mean_us": other / number * 1e6})
        return ProfileReport(func_name, rows, total * 1e3, number)

    def memory_stats(self) -> dict:
        """Bytes of static storage (allocated once) and of pool buffers allocated so far."""
        return {"static_storage_bytes": self.static_storage_bytes,
                "pool_bytes": self._pool.allocated_bytes}

    def __repr__(self):
        return f"<relax.VirtualMachine {self.device} functions={sorted(self._functions)}>"

    # -- decoding ---------------------------------------------------------------------------
    def _kernel(self, name: str):
        fn = self._kernel_fns.get(name)
        if fn is None:
            mod = self.exe.kernel_module
            if mod is None:
                raise RuntimeError(f"the executable has no kernel library, but its program calls "
                                   f"kernel {name!r}")
            fn = mod[name]
            fn._check_runnable()
            self._kernel_fns[name] = fn
        return fn

    def _decode(self, ins: list, ctx: _Ctx) -> Callable:
        if self._gpu and ins[0] in vm_gpu.GPU_OPS:
            return vm_gpu.GPU_OPS[ins[0]](self, ctx, *ins[1:])
        method = getattr(self, "_op_" + ins[0], None)
        if method is None:
            raise ValueError(f"{ctx.name}: unknown VM instruction {ins[0]!r}")
        return method(ctx, *ins[1:])

    def _op_match(self, ctx: _Ctx, src: int, what: str, spec: dict, phase: str):
        fname = ctx.name
        binds = phase in ("bind", "both")
        checks = phase in ("check", "both")
        convert = phase == "bind"  # a parameter: the caller's value becomes a VM value
        matcher = _compile_match(spec, fname, what, binds, checks, ctx.origins)

        if convert and self._gpu:
            dev = self.device

            def match(regs):
                v = _to_value(regs[src], spec, fname, what)
                regs[src] = v = _on_device(v, dev)
                matcher(v, regs)
        elif convert:
            def match(regs):
                regs[src] = v = _to_value(regs[src], spec, fname, what)
                matcher(v, regs)
        else:
            def match(regs):
                matcher(regs[src], regs)
        return match

    def _op_const(self, ctx, dst: int, index: int):
        c = self._constants[index]
        ctx.fixed[dst] = c

        def const(regs):
            regs[dst] = c
        return const

    def _op_alloc(self, ctx, dst: int, shape, dtype: str):
        static, shp = compile_shape(shape)
        dt = np.dtype(dtype)
        if static:
            def alloc(regs):
                regs[dst] = empty(shp, dt)
        else:
            def alloc(regs):
                regs[dst] = empty(shp(regs), dt)
        return alloc

    def _op_alloc_storage(self, ctx, dst: int, size, static: bool):
        if static:
            # allocated once per VM, when the program is decoded (shared by the profiled copy)
            key = (ctx.name, dst)
            buf = self._static_storage.get(key)
            if buf is None:
                buf = self._static_storage[key] = aligned_bytes(max(int(size), 1))[0]
                self.static_storage_bytes += int(size)
            ctx.fixed[dst] = buf

            def alloc_static(regs):
                regs[dst] = buf
            return alloc_static
        size_fn = _as_closure(compile_expr(size))
        pool = self._pool

        def alloc_pool(regs):
            regs[dst] = buf = pool.take(size_fn(regs))
            regs[0].append(buf)
        return alloc_pool

    def _op_alloc_tensor(self, ctx, dst: int, storage: int, offset, shape, dtype: str):
        static_shape, shp = compile_shape(shape)
        off_c, off = compile_expr(offset)
        dt = np.dtype(dtype)
        pool = self._pool
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

    def _op_call_kernel(self, ctx, kname: str, tensor_regs: list, scalars: list):
        return _make_kernel_call(self._kernel(kname), ctx.name, kname, tensor_regs, scalars,
                                 ctx.timers, ctx.fixed)

    def _op_builtin(self, ctx, dst: int, name: str, arg_regs: list, attrs: dict):
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

    def _op_call_func(self, ctx, dst: int, name: str, arg_regs: list):
        funcs = self._decoding  # the dict being filled: every function is in it before a run

        def call_func(regs):
            regs[dst] = funcs[name].run([regs[r] for r in arg_regs])
        return call_func

    def _op_tuple(self, ctx, dst: int, fields: list):
        fields = tuple(fields)

        def make_tuple(regs):
            regs[dst] = tuple([regs[r] for r in fields])
        return make_tuple

    def _op_get_item(self, ctx, dst: int, src: int, index: int):
        fname = ctx.name

        def get_item(regs):
            t = regs[src]
            if type(t) is not tuple:
                raise ValueError(f"{fname}: TupleGetItem of a {type(t).__name__}, not a tuple")
            regs[dst] = t[index]
        return get_item

    def _op_shape(self, ctx, dst: int, exprs: list):
        static, shp = compile_shape(exprs)
        if static:
            def shape(regs):
                regs[dst] = shp
        else:
            def shape(regs):
                regs[dst] = shp(regs)
        return shape

    def _op_prim(self, ctx, dst: int, expr):
        fn = _as_closure(compile_expr(expr))

        def prim(regs):
            regs[dst] = fn(regs)
        return prim

    def _op_move(self, ctx, dst: int, src: int):
        def move(regs):
            regs[dst] = regs[src]
        return move

    def _op_if(self, ctx, dst: int, cond: int, then_code, then_ret, else_code, else_ret):
        then_c = tuple(self._decode(i, ctx) for i in then_code)
        else_c = tuple(self._decode(i, ctx) for i in else_code)
        fname = ctx.name
        gpu = self._gpu

        def if_(regs):
            try:
                c = read_condition(regs[cond]) if not gpu else vm_gpu.condition(regs[cond])
            except ValueError as err:
                raise ValueError(f"{fname}: {err}") from None
            if c:
                for ins in then_c:
                    ins(regs)
                regs[dst] = regs[then_ret]
            else:
                for ins in else_c:
                    ins(regs)
                regs[dst] = regs[else_ret]
        return if_


# ---------------------------------------------------------------------------------------------
# matching


def _compile_match(spec: dict, fname: str, what: str, binds: bool, checks: bool,
                   origins: dict) -> Callable:
    """A closure ``(value, regs)`` checking ``value`` against ``spec`` and binding dims."""
    kind = spec["kind"]
    if kind == "tuple":
        subs = [_compile_match(s, fname, f"{what}[{i}]", binds, checks, origins)
                for i, s in enumerate(spec["fields"])]
        n = len(subs)

        def match_tuple(v, regs):
            if type(v) is not tuple or len(v) != n:
                raise VMArgumentError(f"{fname}: {what} must be a tuple of {n}, got "
                                      f"{_describe(v)}")
            for sub, x in zip(subs, v):
                sub(x, regs)
        return match_tuple
    if kind == "object":
        return lambda v, regs: None
    if kind == "prim":
        value = spec.get("value")
        if value is None:
            return lambda v, regs: None
        action = value
        if action[0] == "bind" and binds:
            reg = action[1]
            origins.setdefault(reg, what)

            def bind_prim(v, regs):
                regs[reg] = v
            return bind_prim
        if action[0] == "check" and (checks if isinstance(action[1], list) else binds):
            fn = _as_closure(compile_expr(action[1]))
            text = action[2]

            def check_prim(v, regs):
                want = fn(regs)
                if v != want:
                    raise VMArgumentError(f"{fname}: {what} is {v}, expected {text}"
                                          f"{_bound_note(text, want)}")
            return check_prim
        return lambda v, regs: None
    # tensors and shapes: rank, dtype, dims
    ndim = spec.get("ndim", -1)
    dtype = spec.get("dtype")
    np_dtype = np.dtype(dtype) if kind == "tensor" and dtype else None
    dims = spec.get("dims") or []
    bind_list = []
    check_list = []
    for i, action in enumerate(dims):
        if action is None:
            continue
        if action[0] == "bind":
            bind_list.append((i, action[1]))
            origins.setdefault(action[1], f"{what}, dimension {i}")
        else:
            check_list.append((i, _as_closure(compile_expr(action[1])), action[2],
                               action[1] if isinstance(action[1], list) else None))
    shape_text = spec.get("shape_text")
    # constant dims are checked with the binds; dims that depend on symbolic variables once
    # every parameter has bound its variables
    bind_t = tuple(bind_list) if binds else ()
    check_t = tuple(c for c in check_list if (c[3] is None and binds) or
                    (c[3] is not None and checks))
    check_kind = binds  # rank and dtype are checked with the binds (before dims are read)

    def match_tensor(v, regs):
        if kind == "tensor":
            if type(v) is NDArray:
                arr = v._data
            elif isinstance(v, NDArray):
                arr = v            # a device array: shape, ndim and dtype, no host data
            else:
                raise VMArgumentError(f"{fname}: {what} must be a tensor, got {_describe(v)}")
            shape = arr.shape
            if check_kind:
                if ndim >= 0 and arr.ndim != ndim:
                    raise VMArgumentError(f"{fname}: {what} has rank {arr.ndim} (shape "
                                          f"{tuple(shape)}), expected rank {ndim}"
                                          f"{' ' + shape_text if shape_text else ''}")
                if np_dtype is not None and np.dtype(arr.dtype) != np_dtype:
                    raise VMArgumentError(f"{fname}: {what} has dtype {np.dtype(arr.dtype).name}, "
                                          f"expected {dtype}")
        else:
            if type(v) is not tuple:
                raise VMArgumentError(f"{fname}: {what} must be a shape, got {_describe(v)}")
            shape = v
            if check_kind and ndim >= 0 and len(shape) != ndim:
                raise VMArgumentError(f"{fname}: {what} has {len(shape)} dimensions, expected "
                                      f"{ndim}")
        for i, reg in bind_t:
            regs[reg] = shape[i]
        for i, fn, text, ex in check_t:
            want = fn(regs)
            if shape[i] != want:
                whole = f" (shape {tuple(shape)}, expected {shape_text})" if shape_text else ""
                origin = origins.get(ex[1]) if ex and ex[0] == "r" else None
                where = f"; {text} is bound by {origin}" if origin else ""
                raise VMArgumentError(f"{fname}: {what}: dimension {i} is {shape[i]}, expected "
                                      f"{text}{_bound_note(text, want)}{whole}{where}")
    return match_tensor


def _bound_note(text: str, want) -> str:
    """`` = 4`` after a symbolic expected value (``n = 4``); nothing after a constant."""
    try:
        int(text)
        return ""
    except ValueError:
        return f" = {want}"


def _describe(v) -> str:
    if isinstance(v, NDArray):
        return f"a tensor of shape {v.shape}"
    if isinstance(v, tuple):
        return f"a tuple of {len(v)}"
    return type(v).__name__


# ---------------------------------------------------------------------------------------------
# kernel calls


def _make_kernel_call(kfn, fname: str, kname: str, tensor_regs: Sequence[int], scalars: list,
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

    call.keep = (words, codes)  # the closure owns the argument arrays
    if timers is None:
        return call
    clock = time.perf_counter

    def timed_call(regs):
        start = clock()
        call(regs)
        elapsed = clock() - start
        entry = timers.get(kname)
        timers[kname] = (1, elapsed) if entry is None else (entry[0] + 1, entry[1] + elapsed)
    return timed_call


def _check_value(x, slot, fname: str, kname: str) -> None:
    """The value passed for a kernel's tensor parameter is a tensor of its dtype and rank (the
    entry checks the extents; the rank and dtype words are the template's)."""
    _, _, _, _, nd, dt, pname = slot
    if type(x) is not NDArray:
        raise ValueError(f"{fname}: kernel {kname}: argument {pname} must be a tensor, got "
                         f"{_describe(x)}")
    arr = x._data
    if arr.dtype != dt or arr.ndim != nd:
        raise ValueError(f"{fname}: kernel {kname}: argument {pname} has dtype "
                         f"{arr.dtype.name} and rank {arr.ndim}, expected {dt.name} and rank {nd}")


__all__ = ["VirtualMachine", "VMArgumentError", "ProfileReport", "StoragePool"]
