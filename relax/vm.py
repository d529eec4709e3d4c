"""The Relax virtual machine: runs an ``Executable``'s program on a device.

A program has, per Relax function, a register count, its parameters and a compact instruction
list (plain JSON data, written by ``relax.build``). When a ``VirtualMachine`` is made, each
instruction is decoded once into a Python closure with everything it needs resolved: kernel
entry points (ctypes), pre-built argument arrays with the constant words (DLTensor templates,
type codes) already written, static storage, compiled shape expressions. Running a function is
then one loop over closures; a kernel call writes only the data pointers and extents that
changed since the previous call (a planned intermediate keeps its buffer, so its words are
written once) and calls the entry. Consecutive kernel calls whose every argument word is fixed
by the shape plan are one native call of the library's sequence runner
(``tilecraft_call_sequence``), not one ctypes call each.

Instructions (``[opcode, operands...]``; ``%r`` a register, ``expr`` a shape expression)::

    match        %src what spec phase        check / bind an argument or a match_cast value
    const        %dst index                  a constant tensor
    alloc        %dst [expr..] dtype         a fresh tensor (function outputs)
    alloc_storage %dst expr static           raw storage: static (once per VM) or from the pool
    alloc_tensor %dst %storage expr [expr..] dtype    a view of a storage
    call_kernel  name [%args..] [expr..] n   a kernel: tensors (inputs then n outputs), scalars
    builtin      %dst name [%args..] attrs   a VM builtin (relax.vm_builtins)
    call_func    %dst name [%args..]         another Relax function
    tuple        %dst [%fields..]            get_item %dst %src index
    shape        %dst [expr..]               prim %dst expr          move %dst %src
    if           %dst %cond [then..] %then_ret [else..] %else_ret

Shape expressions are ints, ``["r", reg]`` (a symbolic variable's register) or
``[op, operands...]`` with op one of ``add sub mul floordiv floormod div mod min max lt le eq ne
gt ge and or not select cast`` (``relax.vm_values`` compiles them).

The instructions that touch tensors (``const``, ``alloc``, ``alloc_storage``, ``alloc_tensor``,
``call_kernel``, ``builtin``) and the call boundary (arguments in, an ``If`` condition read, the
end of a call) depend on the device: the VM decodes them with its device's tensor operations,
``relax.vm_cpu.CPUTensorOps`` (host memory, kernels called through ctypes) or
``relax.vm_gpu.GPUTensorOps`` (device arrays, kernels enqueued, in-kernel checks read once per
call). Everything else (matching, shape arithmetic, tuples, calls, control flow, timing) is
the same on every device and lives here. One ``VirtualMachine`` class serves both, so
``relax.VirtualMachine(exe, targets.opencl(0))`` needs no other name.

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

import time
from collections import Counter
from operator import itemgetter
from typing import Any, Callable

import numpy as np

from tilecraft.targets.runtime.device import Device, cpu
from tilecraft.targets.runtime.module import BenchmarkResult
from tilecraft.targets.runtime.ndarray import NDArray

from . import boundary_dtypes
from .executable import Executable
from .vm_cpu import CPUTensorOps
from .vm_gpu import GPUTensorOps
from .vm_values import (StoragePool, VMArgumentError, as_closure, compile_expr, compile_shape,
                        describe, to_vm_value)

# ---------------------------------------------------------------------------------------------
# functions


class _Ctx:
    """What closures of one function share."""

    def __init__(self, vm: "VirtualMachine", name: str, fn: dict, timers: dict | None):
        self.vm, self.name, self.fn, self.timers = vm, name, fn, timers
        self.origins: dict[int, str] = {}
        # registers whose value is the same on every call (constants, views of static
        # storage): known when decoding, so kernel calls write their argument words once
        self.fixed: dict[int, Any] = {}


# Top-level instructions whose result depends on nothing but the values that the parameters'
# shapes bind (the "shape key": batch, sequence length...), the constants and static storage:
# run once per distinct key, when its plan is made. A builtin is one of them only when it is a
# pure check of such values (the range asserts a torch.export model starts with) or a view of
# one (``vm.builtin.reshape`` of a planned tensor: RewriteReshapeView's reshapes between
# kernels), so that the kernels reading the view keep their argument words fixed too.
_SHAPE_OPS = ("const", "alloc_storage", "alloc_tensor", "shape", "prim")
# ... and these, when every register they read is such a value (a tuple of planned tensors, an
# item of one: a split's outputs), so the kernels that read them are the plan's too
_PURE_IF_KNOWN = ("tuple", "get_item", "move")
_PURE_BUILTINS = frozenset({"vm.builtin.assert_op", "vm.builtin.reshape"})
# plans kept per function (distinct shape keys); the oldest goes, its pool buffers back to the
# pool, when another key comes
MAX_PLANS = 8


def _expr_regs(e, out: set) -> set:
    """The registers a shape expression, or a list of them (a shape's dims), reads
    (``["r", reg]`` anywhere in it). An expression node starts with its operator's name; a
    list of dims does not, and every element is read (its first dim too)."""
    if isinstance(e, list) and e:
        if e[0] == "r":
            out.add(e[1])
        else:
            for x in (e[1:] if isinstance(e[0], str) else e):
                _expr_regs(x, out)
    return out


def _per_shape_call(ins: list, per_shape: set, storage_of: dict, views_of: Counter) -> bool:
    """Whether the ``call_kernel`` ``ins`` reads only registers of ``per_shape`` (constants and
    what such calls wrote) and writes only views that are alone in their storage."""
    if len(ins) < 5 or not ins[4]:
        return False      # a program without output counts: every kernel runs per call
    regs = ins[2]
    inputs, outputs = regs[:len(regs) - ins[4]], regs[len(regs) - ins[4]:]
    return set(inputs) <= per_shape and \
        all(r in storage_of and views_of[storage_of[r]] == 1 for r in outputs)


def _bound_regs(spec: dict, out: set) -> set:
    """The registers a parameter's match binds (its symbolic dims and values)."""
    if spec.get("kind") == "tuple":
        for f in spec["fields"]:
            _bound_regs(f, out)
    elif spec.get("kind") == "prim":
        value = spec.get("value")
        if value and value[0] == "bind":
            out.add(value[1])
    else:
        for action in spec.get("dims") or []:
            if action is not None and action[0] == "bind":
                out.add(action[1])
    return out


class _Plan:
    """The registers of one shape key after its shape instructions ran: a template the call
    copies (views of planned storage, shapes, sizes), and the pool buffers the plan holds."""

    __slots__ = ("template", "buffers")

    def __init__(self, template: list, buffers: list):
        self.template, self.buffers = template, buffers


class _Function:
    """A decoded VM function: ``f(*args)`` runs it.

    At decode time the top-level instructions are split in three: the *prologue* (the
    parameters' matches: conversion, rank / dtype / dim checks, binding the symbolic dims), the
    *shape* instructions (constants, storage, tensor views, shape arithmetic and the range
    asserts on it: they depend only on the values the prologue binds, the shape key) and the
    *body* (kernel calls, builtins, outputs, calls, control flow; a run of CPU kernel calls whose
    arguments all come from the plan is one step, ``CPUTensorOps.kernel_run``: one foreign call
    of the library's sequence runner). A call runs the prologue,
    looks its shape key up among the plans (the shape instructions' results for that key, made
    on its first call) and runs the body on a copy of the plan's registers, so per call only the
    checks that catch a bad input, the kernels and the outputs' allocation remain. A program the
    split does not apply to (a register written twice) runs instruction by instruction.
    """

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
        code = fn["code"]
        self.code = tuple(vm._decode(ins, ctx) for ins in code)
        self._current = None      # the plan whose words the fixed kernel calls hold
        self._plans: dict | None = self._split(code)
        self._active = 0    # calls of this function in progress (a recursive call runs unplanned)

    def _split(self, code: list) -> dict | None:
        """Sort the top-level instructions into prologue, shape instructions and body; None
        where the plan does not apply."""
        params = set(self.param_regs)
        i, key_regs = 0, set()
        while i < len(code) and code[i][0] == "match" and code[i][1] in params and \
                code[i][4] in ("bind", "both"):
            _bound_regs(code[i][3], key_regs)
            i += 1
        written = set(params) | key_regs | {0}
        known = set(key_regs)     # registers that are a function of the shape key
        prologue, shape, body, fixed_kernels = list(self.code[:i]), [], [], []
        # values of the shape key and the constants alone (position ids, causal masks): a
        # kernel that reads only such values and writes views of storages of their own is run
        # once per plan switch, not per call (the memory plan gives such values their own
        # storage: StaticPlanBlockMemory)
        views_of = Counter(ins[2] for ins in code[i:] if ins[0] == "alloc_tensor")
        storage_of = {ins[1]: ins[2] for ins in code[i:] if ins[0] == "alloc_tensor"}
        per_shape: set[int] = set()
        shape_kernels = []
        host = isinstance(self.vm._tensor_ops, CPUTensorOps)
        for ins, closure in zip(code[i:], self.code[i:]):
            op = ins[0]
            dst = ins[1] if op not in ("match", "call_kernel") else None
            if dst is not None:
                if dst in written:
                    return None            # not single-assignment: no plan
                written.add(dst)
            if op in _SHAPE_OPS:
                if op == "alloc_tensor":
                    reads = _expr_regs(ins[4], _expr_regs(ins[3], {ins[2]}))
                elif op == "const":
                    reads = set()
                else:
                    reads = _expr_regs(ins[2], set())
                pure = reads <= known
            elif op in _PURE_IF_KNOWN:
                pure = (set(ins[2]) if op == "tuple" else {ins[2]}) <= known
            else:
                pure = op == "builtin" and ins[2] in _PURE_BUILTINS and set(ins[3]) <= known
            if pure:
                known.add(dst)
                shape.append(closure)
                if op == "const":
                    per_shape.add(dst)
            elif op == "call_kernel" and host and \
                    set(ins[2]) <= known and _expr_regs(ins[3], set()) <= known and \
                    _per_shape_call(ins, per_shape, storage_of, views_of):
                per_shape.update(ins[2][len(ins[2]) - ins[4]:])
                shape_kernels.append(closure)
            elif op == "call_kernel" and hasattr(closure, "fixed") and \
                    set(ins[2]) <= known and _expr_regs(ins[3], set()) <= known:
                # every argument is the plan's: its words are written when the plan changes;
                # consecutive such calls become one step, a tuple of bare entry calls
                fixed_kernels.append(closure)
                if body and type(body[-1]) is list:
                    body[-1].append(closure.entry)
                else:
                    body.append([closure.entry])
            else:
                body.append(closure)
        body = [self.vm._tensor_ops.kernel_run(step) if type(step) is list else step
                for step in body]
        self._prologue, self._shape_code, self._body = tuple(prologue), tuple(shape), tuple(body)
        self._fixed_kernels = tuple(fixed_kernels)
        self._shape_kernels = tuple(shape_kernels)
        self._current = None      # the plan whose words the fixed kernel calls hold
        order = sorted(key_regs)
        self._key = (lambda regs: None) if not order else itemgetter(*order)
        return {}

    def __call__(self, *args):
        if len(args) != len(self.params):
            raise VMArgumentError(
                f"{self.name} takes {len(self.params)} argument(s) ({', '.join(self.params)}), "
                f"got {len(args)}")
        if self.boundary:
            args = boundary_dtypes.args_to_storage(args, self.boundary.get("params"), self.name,
                                                   self.params, VMArgumentError)
        # the device's boundary: on a GPU, in-kernel checks are read once, at the end of the call
        out = self.vm._tensor_ops.call(self, args)
        if self.boundary:
            out = boundary_dtypes.result_from_storage(out, self.boundary.get("ret"))
        return out

    def run(self, args):
        plans = self._plans
        if plans is None or self._active:
            return self._run_each(args)
        regs = [None] * self.num_regs
        regs[0] = taken = []  # dynamic storages this call took from the pool
        for r, a in zip(self.param_regs, args):
            regs[r] = a
        self._active = 1
        try:
            for ins in self._prologue:
                ins(regs)
            key = self._key(regs)
            plan = plans.get(key)
            if plan is None:
                plan = self._make_plan(key, regs)
            new = plan.template.copy()
            for r in self.param_regs:
                new[r] = regs[r]
            new[0] = taken
            if plan is not self._current:
                for k in self._fixed_kernels:
                    k.refresh(new)
                self._current = None
                # the values of this shape key alone, in their storage (which another key's
                # plan may have written, when it is static)
                for k in self._shape_kernels:
                    k(new)
                self._current = plan
            for step in self._body:
                if type(step) is tuple:     # a run of kernel calls on the plan's arguments
                    runner, records, count, failed, fail = step
                    rc = runner(records, count, failed)
                    if rc:
                        fail(rc)
                else:
                    step(new)
            return new[self.ret]
        finally:
            self._active = 0
            if taken:
                pool = self.vm._tensor_ops.pool
                for buf in reversed(taken):
                    pool.give(buf)

    def _make_plan(self, key, regs: list) -> _Plan:
        """Run the shape instructions for ``key`` (the prologue has run on ``regs``) and keep
        their registers; a failing range assert raises here and no plan is kept."""
        held = []     # the pool buffers of this key's storage, held while the plan lives
        regs[0] = held
        try:
            for ins in self._shape_code:
                ins(regs)
        except BaseException:
            pool = self.vm._tensor_ops.pool
            for buf in reversed(held):
                pool.give(buf)
            raise
        template = regs.copy()
        for r in self.param_regs:
            template[r] = None     # the caller's arguments are not kept
        template[0] = None
        plans = self._plans
        if len(plans) >= MAX_PLANS:
            oldest = plans.pop(next(iter(plans)))
            if oldest is self._current:
                self._current = None
            pool = self.vm._tensor_ops.pool
            for buf in reversed(oldest.buffers):
                pool.give(buf)
        plan = plans[key] = _Plan(template, held)
        return plan

    def _run_each(self, args):
        """Every instruction in order, storage from the pool (no plan)."""
        self._current = None    # the kernel calls' argument words are no longer the plan's
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
                pool = self.vm._tensor_ops.pool
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
        # the instructions that touch tensors, for host memory or for a GPU's
        self._tensor_ops = CPUTensorOps(self) if device.kind == "cpu" else GPUTensorOps(self)
        ops = self._tensor_ops
        # one dispatch table: opcode -> decoder of one instruction into a closure
        self._decoders: dict[str, Callable] = {
            "match": self._op_match, "call_func": self._op_call_func, "tuple": self._op_tuple,
            "get_item": self._op_get_item, "shape": self._op_shape, "prim": self._op_prim,
            "move": self._op_move, "if": self._op_if,
            "const": ops.const, "alloc": ops.alloc, "alloc_storage": ops.alloc_storage,
            "alloc_tensor": ops.alloc_tensor, "call_kernel": ops.call_kernel,
            "builtin": ops.builtin,
        }
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
        return [to_vm_value(a, s, fn.name, f"argument {p}")
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
        return {"static_storage_bytes": self._tensor_ops.static_storage_bytes,
                "pool_bytes": self._tensor_ops.pool.allocated_bytes}

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
        decoder = self._decoders.get(ins[0])
        if decoder is None:
            raise ValueError(f"{ctx.name}: unknown VM instruction {ins[0]!r}")
        return decoder(ctx, *ins[1:])

    def _op_match(self, ctx: _Ctx, src: int, what: str, spec: dict, phase: str):
        fname = ctx.name
        binds = phase in ("bind", "both")
        checks = phase in ("check", "both")
        convert = phase == "bind"  # a parameter: the caller's value becomes a VM value
        matcher = _compile_match(spec, fname, what, binds, checks, ctx.origins)

        if convert:
            argument = self._tensor_ops.argument   # to a VM value on the VM's device

            def match(regs):
                regs[src] = v = argument(regs[src], spec, fname, what)
                matcher(v, regs)
        else:
            def match(regs):
                matcher(regs[src], regs)
        return match

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
        fn = as_closure(compile_expr(expr))

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
        condition = self._tensor_ops.condition

        def if_(regs):
            try:
                c = condition(regs[cond])
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
                                      f"{describe(v)}")
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
            fn = as_closure(compile_expr(action[1]))
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
            check_list.append((i, as_closure(compile_expr(action[1])), action[2],
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
                raise VMArgumentError(f"{fname}: {what} must be a tensor, got {describe(v)}")
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
                raise VMArgumentError(f"{fname}: {what} must be a shape, got {describe(v)}")
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


__all__ = ["VirtualMachine", "VMArgumentError", "ProfileReport", "StoragePool"]
