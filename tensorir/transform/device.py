"""Device lowering: split a lowered function into a host program and GPU kernels.

``split_host_device(func, target)`` takes a function in the lowered form (``transform.lower``;
thread-bound loops still in it) and returns a ``HostDeviceSplit``:

* ``host`` — a PrimFunc with the original parameters and attributes whose body is host code
  only: ``SeqStmt``, ``LetStmt`` / ``AssertStmt`` / ``IfThenElse`` over host scalars (symbolic
  dims, scalar parameters, host loop variables), serial ``For`` loops, ``Allocate`` of
  ``global`` buffers (device temporaries) and ``LaunchKernel`` statements;
* ``kernels`` — one ``DeviceKernel`` per thread-bound loop nest: a PrimFunc in *device form*
  plus its launch geometry.

See ``docs/lowering.md`` ("Device lowering") for the exact contract the OpenCL and WGSL code
generators consume. In short, in a kernel:

* there are no thread-bound loops: ``blockIdx.*`` / ``threadIdx.*`` are int32 Vars
  (``kernel.thread_vars``); a loop of a smaller extent than its axis's launch size is guarded
  by ``if threadIdx.x < extent``; ``vthread`` loops became ``unrolled`` loops;
* all index arithmetic is int32 (the runtime checks that every array has fewer than 2**31
  elements and every scalar fits); data keeps its dtype (an int64 tensor stays int64);
* ``shared`` buffers are hoisted to the top of the body as ``Allocate`` statements of constant
  size; ``local`` ones stay where they are (constant size);
* ``Evaluate(Call("int32", "tvm_storage_sync", [StringImm("shared")]))`` is a work-group
  barrier, inserted wherever a shared buffer written by some threads is then read (or written)
  by others, always in control flow uniform across the work-group;
* a run-time check that stays inside the kernel (its condition depends on thread indices or
  data) becomes ``if cond: body else: kernel_error[0] = k`` and the kernel gets a last buffer
  parameter ``kernel_error`` (int32, one element); ``kernel.error_messages[k - 1]`` is what the
  host raises when it reads ``k`` back.

Limits (threads per block, per-dimension block and grid sizes, shared memory) come from the
target (``target.limits``); anything over them is a ``DeviceLimitError`` at build time.

Examples
--------
>>> from tilecraft.tensorir import te, transform, Schedule
>>> A = te.placeholder((1024,), "float32", "A")
>>> B = te.compute((1024,), lambda i: A[i] * 2.0, "B")
>>> sch = Schedule(te.create_prim_func([A, B]))
>>> i, = sch.get_loops(sch.get_block("B"))
>>> bx, tx = sch.split(i, [None, 128])
>>> sch.bind(bx, "blockIdx.x"); sch.bind(tx, "threadIdx.x")
>>> split = transform.lower_device(sch.mod["main"], {"max_threads_per_block": 256})
>>> k = split.kernels[0]
>>> k.grid, k.block                                             # doctest: +SKIP
((8, 1, 1), (128, 1, 1))
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .. import arith
from .. import dtype as dt
from ..expr import (WRITES_FIRST_ARG, BinaryOp, BufferLoad, Call, Cast, IntImm, Let, Not,
                    PrimExpr, Select, StringImm, TIRError, Var)
from ..function import PrimFunc
from ..functor import IRMutator, IRVisitor, free_vars
from ..stmt import (Allocate, AssertStmt, Buffer, BufferStore, Evaluate, For, IfThenElse,
                    LetStmt, SeqStmt, Stmt, seq)
from ..structural import structural_equal
from ._common import func_shape_vars, is_no_op, subst, uses_any

GPU_KINDS = ("opencl", "webgpu")
BARRIER_OP = "tvm_storage_sync"
ERROR_BUFFER_NAME = "kernel_error"
INT32_MAX = 2 ** 31 - 1


class DeviceLimitError(TIRError, ValueError):
    """A kernel over one of the target's limits (threads per block, block or grid dimension,
    shared memory), or a kernel shape the device cannot run (a symbolic thread extent)."""


class LaunchKernel(Stmt):
    """Host statement: launch kernel ``kernel`` over ``grid`` work-groups of ``block`` threads.

    ``buffers`` are the (global) buffers passed, in the kernel's buffer-parameter order;
    ``scalars`` the host expressions passed for its scalar parameters; ``grid`` three int64
    host expressions; ``block`` three ``IntImm``.
    """

    _fields = ("kernel", "buffers", "scalars", "grid", "block")
    __slots__ = ("kernel", "buffers", "scalars", "grid", "block")

    def __init__(self, kernel: str, buffers, scalars, grid, block):
        self._init(kernel=str(kernel), buffers=tuple(buffers), scalars=tuple(scalars),
                   grid=tuple(grid), block=tuple(block))


@dataclass(frozen=True)
class DeviceKernel:
    """One GPU kernel of a ``HostDeviceSplit``.

    Attributes
    ----------
    name : str
        The kernel's symbol (``main_kernel0``).
    func : PrimFunc
        The kernel in device form: params are one handle per buffer (``buffer_map``) then the
        int32 scalars; see the module docstring.
    grid : tuple[PrimExpr, PrimExpr, PrimExpr]
        Work-groups per dimension, int64 expressions of the host scalars.
    block : tuple[int, int, int]
        Threads per work-group per dimension.
    thread_vars : dict[str, Var]
        ``"blockIdx.x"`` / ``"threadIdx.y"`` ... -> the int32 Var that stands for it in the body.
    shared_bytes : int
        Bytes of shared memory the kernel declares.
    error_messages : tuple[str, ...]
        Messages of the in-kernel run-time checks (the kernel then has a last buffer parameter
        ``kernel_error``).
    host_scalars : tuple[PrimExpr, ...]
        For each scalar parameter, the host expression it is launched with.
    """

    name: str
    func: PrimFunc
    grid: tuple
    block: tuple
    thread_vars: dict
    shared_bytes: int
    error_messages: tuple = ()
    host_scalars: tuple = ()

    @property
    def buffer_params(self) -> list[Buffer]:
        return self.func.buffers

    @property
    def scalar_params(self) -> list[Var]:
        return self.func.scalar_params

    @property
    def shared_buffers(self) -> list[Buffer]:
        out = []
        s = self.func.body
        while isinstance(s, Allocate) and s.buffer.scope == "shared":
            out.append(s.buffer)
            s = s.body
        return out


@dataclass(frozen=True)
class HostDeviceSplit:
    """The result of ``split_host_device``: the ``host`` PrimFunc and its ``kernels``."""

    host: PrimFunc
    kernels: tuple = field(default_factory=tuple)

    def kernel(self, name: str) -> DeviceKernel:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(f"no kernel {name!r}; kernels: {[k.name for k in self.kernels]}")

    def script(self) -> str:
        """The host function and every kernel, as text."""
        parts = [self.host.script()]
        for k in self.kernels:
            grid = ", ".join(str(g) for g in k.grid)
            parts.append(f"# kernel {k.name}: grid ({grid}), block {k.block}, "
                         f"{k.shared_bytes} bytes shared\n{k.func.script()}")
        return "\n".join(parts)


def barrier() -> Evaluate:
    """The work-group barrier statement of device code."""
    return Evaluate(Call("int32", BARRIER_OP, [StringImm("shared")]))


def is_barrier(s) -> bool:
    return isinstance(s, Evaluate) and isinstance(s.value, Call) and s.value.op == BARRIER_OP


# ---------------------------------------------------------------------------------------------
# limits


def _limits_of(target) -> dict:
    if target is None:
        return {}
    if isinstance(target, Mapping):
        return dict(target)
    limits = getattr(target, "limits", None)
    if limits is None:
        raise TIRError(f"split_host_device: target {target!r} has no limits")
    return dict(limits)


def _block_dim_limits(limits: dict) -> tuple:
    if "max_block_dims" in limits and limits["max_block_dims"]:
        return tuple(limits["max_block_dims"])
    keys = ("max_compute_workgroup_size_x", "max_compute_workgroup_size_y",
            "max_compute_workgroup_size_z")
    if all(k in limits for k in keys):
        return tuple(limits[k] for k in keys)
    return (None, None, None)


def _grid_dim_limits(limits: dict) -> tuple:
    if "max_grid_dims" in limits and limits["max_grid_dims"]:
        return tuple(limits["max_grid_dims"])
    if "max_compute_workgroups_per_dimension" in limits:
        n = limits["max_compute_workgroups_per_dimension"]
        return (n, n, n)
    return (None, None, None)


# ---------------------------------------------------------------------------------------------
# helpers

_AXES = ("x", "y", "z")


def _contains_thread_loop(s) -> bool:
    found = False

    class V(IRVisitor):
        def visit_For(self, f):
            nonlocal found
            if f.kind == "thread_binding":
                found = True
                return
            self.generic_visit(f)

        def visit_BufferLoad(self, e):   # expressions hold no loops
            return

    V().visit(s)
    return found


def _buffers_used(s) -> list[Buffer]:
    """Buffers loaded or stored in ``s``, in first-use order."""
    out: dict = {}

    class V(IRVisitor):
        def visit_BufferLoad(self, e):
            out.setdefault(e.buffer, None)
            for i in e.indices:
                self.visit(i)

        def visit_BufferStore(self, st):
            out.setdefault(st.buffer, None)
            self.visit(st.value)
            for i in st.indices:
                self.visit(i)

        def visit_Buffer(self, b):   # shapes do not count as uses
            return

    V().visit(s)
    return list(out)


def _loads_memory(e) -> bool:
    found = False

    class V(IRVisitor):
        def visit_BufferLoad(self, x):
            nonlocal found
            found = True

    V().visit(e)
    return found


def _const_int(e) -> int | None:
    e = arith.simplify(e) if isinstance(e, PrimExpr) else e
    return e.value if isinstance(e, IntImm) else None


def _buffer_bytes(buf: Buffer, what: str, kernel: str) -> int:
    n = 1
    for s in buf.shape:
        c = _const_int(s)
        if c is None:
            raise DeviceLimitError(f"kernel {kernel}: {what} buffer {buf.name} has the non-constant "
                                   f"size {tuple(buf.shape)}; {what} memory needs a size known at "
                                   f"build time (schedule it under the loops that make its tile "
                                   f"constant, e.g. compute_at)", buf)
        n *= c
    return n * (dt.bits(buf.dtype) // 8 or 1) * dt.lanes(buf.dtype)


# ---------------------------------------------------------------------------------------------
# the splitter


class _Splitter:
    def __init__(self, func: PrimFunc, limits: dict):
        self.func = func
        self.limits = limits
        self.symbol = func.attr_dict.get("global_symbol", "main")
        self.kernels: list[DeviceKernel] = []
        self.outer_allocs: list[Buffer] = []      # shared / local allocated at host level
        self.alloc_users: dict[Buffer, str] = {}
        self.host_vars: list[Var] = list(func.scalar_params) + list(func_shape_vars(func))

    # -- host level -------------------------------------------------------------------------
    def host(self, s: Stmt) -> Stmt:
        if is_no_op(s):
            return s
        if isinstance(s, Allocate):
            if s.buffer.scope == "global":       # a device temporary of the host program
                return Allocate(s.buffer, self.host(s.body))
            self.outer_allocs.append(s.buffer)
            body = self.host(s.body)
            self.outer_allocs.pop()
            return body
        if not _contains_thread_loop(s):
            return self.kernel(s, single_thread=True)
        if isinstance(s, SeqStmt):
            out, pending = [], []
            for c in s.seq:
                if _contains_thread_loop(c):
                    if pending:
                        out.append(self.kernel(seq(*pending), single_thread=True))
                        pending = []
                    out.append(self.host(c))
                elif not is_no_op(c):
                    pending.append(c)
            if pending:
                out.append(self.kernel(seq(*pending), single_thread=True))
            return seq(*out)
        if isinstance(s, For):
            if s.kind == "thread_binding":
                return self.kernel(s)
            self._host_expr(s.min, f"the start of loop {s.loop_var.name}")
            self._host_expr(s.extent, f"the extent of loop {s.loop_var.name}")
            self.host_vars.append(s.loop_var)
            body = self.host(s.body)
            self.host_vars.pop()
            return For(s.loop_var, s.min, s.extent, "serial", body)
        if isinstance(s, IfThenElse):
            self._host_expr(s.condition, "a condition around a kernel")
            then = self.host(s.then_case)
            other = None if s.else_case is None else self.host(s.else_case)
            return IfThenElse(s.condition, then, other)
        if isinstance(s, LetStmt):
            self._host_expr(s.value, f"the value of {s.var.name}")
            self.host_vars.append(s.var)
            body = self.host(s.body)
            self.host_vars.pop()
            return LetStmt(s.var, s.value, body)
        if isinstance(s, AssertStmt):
            self._host_expr(s.condition, f"the check {s.message!r}")
            return AssertStmt(s.condition, s.message, self.host(s.body))
        raise TIRError(f"split_host_device: unexpected host statement {type(s).__name__}", s)

    def _host_expr(self, e: PrimExpr, what: str):
        if _loads_memory(e):
            raise TIRError(f"{self.symbol}: {what} reads device memory but encloses a kernel "
                           f"launch; the host cannot read device buffers", e)
        known = set(self.host_vars)
        for v in free_vars(e):
            if v not in known:
                raise TIRError(f"{self.symbol}: {what} uses {v.name}, which is not known on the "
                               f"host", e)

    # -- one kernel -------------------------------------------------------------------------
    def kernel(self, s: Stmt, single_thread: bool = False) -> Stmt:
        name = f"{self.symbol}_kernel{len(self.kernels)}"
        tvars = {}
        grid = [IntImm(1, "int64")] * 3
        block = [1, 1, 1]
        body = s
        if not single_thread:
            body, grid, block, tvars = self._bind_threads(name, s)
        body, shared = _Hoist(name, self.outer_allocs).run(body)
        for buf in shared:
            if buf in self.alloc_users and self.alloc_users[buf] != name:
                raise TIRError(f"{self.symbol}: {buf.scope} buffer {buf.name} is used by kernels "
                               f"{self.alloc_users[buf]} and {name}; {buf.scope} memory does not "
                               f"survive a kernel launch (bind the loops of both to one kernel, or "
                               f"make the buffer global)", buf)
            self.alloc_users[buf] = name
        shared_bytes = sum(_buffer_bytes(b, "shared", name) for b in shared if b.scope == "shared")
        self._check_limits(name, s, grid, block, shared_bytes)
        thread_only = [v for tag, v in tvars.items() if tag.startswith("threadIdx")]
        body = _Sync(name, thread_only).run(body)
        body, messages, err_buf = _DeviceAsserts(self.host_vars).run(body)
        for buf in reversed([b for b in shared if b.scope == "shared"]):
            body = Allocate(buf, body)      # (local ones are declared by _Hoist already)
        # parameters: global buffers, then the host scalars the body mentions
        buffers = [b for b in _buffers_used(body) if b.scope == "global" and b is not err_buf]
        order = {b: i for i, b in enumerate(self.func.buffers)}
        buffers.sort(key=lambda b: order.get(b, len(order)))
        known = set(self.host_vars)
        thread_set = set(tvars.values())
        scalars = []
        for v in free_vars(body):
            if v in thread_set:
                continue
            if v not in known:
                raise TIRError(f"{self.symbol}: kernel {name} uses {v.name}, which is neither a "
                               f"thread index nor known on the host", v)
            scalars.append(v)
        host_order = {v: i for i, v in enumerate(self.host_vars)}
        scalars.sort(key=lambda v: host_order[v])
        narrow = _Narrow()
        new_body = narrow.visit(body)
        scalar_params = [narrow.var(v) for v in scalars]
        new_tvars = {tag: narrow.var(v) for tag, v in tvars.items()}
        handles = []
        bmap = {}
        for b in buffers + ([err_buf] if err_buf is not None else []):
            h = Var(b.name, "handle")
            handles.append(h)
            bmap[h] = b
        kfunc = PrimFunc(handles + scalar_params, new_body, bmap, attrs={
            "global_symbol": name, "tir.is_device_kernel": True,
            "thread_vars": tuple(new_tvars.items()),
            "launch_block": tuple(block)})
        self.kernels.append(DeviceKernel(name, kfunc, tuple(grid), tuple(block), new_tvars,
                                         shared_bytes, tuple(messages), tuple(scalars)))
        return LaunchKernel(name, buffers, scalars, grid, [IntImm(b, "int64") for b in block])

    def _bind_threads(self, name: str, s: Stmt):
        """Replace thread-bound loops by thread Vars; the launch geometry."""
        loops: list[For] = []

        class Collect(IRVisitor):
            def visit_For(self, f):
                if f.kind == "thread_binding":
                    loops.append(f)
                self.generic_visit(f)

        Collect().visit(s)
        # blockIdx loops: the chain at the top of the nest
        top = []
        cur = s
        while isinstance(cur, For) and cur.kind == "thread_binding" and \
                cur.thread_tag.startswith("blockIdx"):
            top.append(cur)
            cur = cur.body
        for f in loops:
            if f.thread_tag.startswith("blockIdx") and not any(f is t for t in top):
                raise DeviceLimitError(f"kernel {name}: loop {f.loop_var.name} is bound to "
                                       f"{f.thread_tag} but is not one of the outermost loops of "
                                       f"its kernel; blockIdx loops must enclose everything else "
                                       f"in the kernel", f)
        tvars: dict[str, Var] = {}
        extents: dict[str, int] = {}
        grid = [IntImm(1, "int64")] * 3
        for f in top:
            tag = f.thread_tag
            if tag in tvars:
                raise DeviceLimitError(f"kernel {name}: {tag} is bound twice", f)
            known = set(self.host_vars)
            for v in free_vars(f.extent):
                if v not in known:
                    raise DeviceLimitError(f"kernel {name}: the extent {f.extent} of loop "
                                           f"{f.loop_var.name} ({tag}) depends on {v.name}; a "
                                           f"grid size can only use host values", f)
            tvars[tag] = Var(tag.replace(".", "_"), "int64")
            grid[_AXES.index(tag[-1])] = arith.simplify(f.extent)
        for f in loops:
            tag = f.thread_tag
            if tag.startswith("threadIdx"):
                ext = _const_int(f.extent)
                if ext is None:
                    raise DeviceLimitError(f"kernel {name}: loop {f.loop_var.name} is bound to "
                                           f"{tag} with the non-constant extent {f.extent}; "
                                           f"threads per block must be known at build time "
                                           f"(split the loop by a constant factor first)", f)
                extents[tag] = max(extents.get(tag, 0), ext)
                tvars.setdefault(tag, Var(tag.replace(".", "_"), "int64"))
        block = [1, 1, 1]
        for tag, ext in extents.items():
            block[_AXES.index(tag[-1])] = ext
        body = _ReplaceThreadLoops(tvars, extents).visit(s)
        return body, grid, block, tvars

    def _check_limits(self, name, node, grid, block, shared_bytes):
        lim = self.limits
        threads = block[0] * block[1] * block[2]
        mt = lim.get("max_threads_per_block")
        if mt and threads > mt:
            raise DeviceLimitError(f"kernel {name}: {threads} threads per block "
                                   f"({' x '.join(map(str, block))}) exceed the target's limit of "
                                   f"{mt}", node)
        for d, (b, m) in enumerate(zip(block, _block_dim_limits(lim))):
            if m and b > m:
                raise DeviceLimitError(f"kernel {name}: threadIdx.{_AXES[d]} extent {b} exceeds "
                                       f"the target's limit of {m} for that dimension", node)
        for d, (g, m) in enumerate(zip(grid, _grid_dim_limits(lim))):
            c = _const_int(g)
            if m and c is not None and c > m:
                raise DeviceLimitError(f"kernel {name}: blockIdx.{_AXES[d]} extent {c} exceeds "
                                       f"the target's limit of {m} work-groups per dimension",
                                       node)
        ms = lim.get("max_shared_memory_per_block")
        if ms is not None and shared_bytes > ms:
            raise DeviceLimitError(f"kernel {name}: {shared_bytes} bytes of shared memory exceed "
                                   f"the target's limit of {ms} bytes per block", node)


class _ReplaceThreadLoops(IRMutator):
    def __init__(self, tvars: dict, extents: dict):
        super().__init__()
        self.tvars, self.extents = tvars, extents

    def visit_Buffer(self, buf):
        return buf

    def visit_For(self, f: For):
        if f.kind != "thread_binding":
            return self.generic_visit(f)
        tag = f.thread_tag
        if tag.startswith("vthread"):
            body = self.visit(f.body)
            kind = "unrolled" if _const_int(f.extent) is not None else "serial"
            return For(f.loop_var, f.min, f.extent, kind, body, annotations=f.annotation_dict)
        tv = self.tvars[tag]
        value = tv if isinstance(f.min, IntImm) and f.min.value == 0 else tv + f.min
        body = self.visit(subst(f.body, {f.loop_var: value}))
        if tag.startswith("threadIdx"):
            ext = _const_int(f.extent)
            if ext < self.extents[tag]:
                body = IfThenElse(tv < ext, body)
        return body


class _Hoist(IRMutator):
    """Take shared Allocates out to the kernel's top; declare the host-level shared / local
    buffers the kernel uses; check local sizes are constant; reject global Allocates."""

    def __init__(self, kernel: str, outer: list):
        super().__init__()
        self.kernel_name, self.outer = kernel, outer
        self.shared: list[Buffer] = []

    def visit_Buffer(self, buf):
        return buf

    def run(self, s: Stmt):
        body = self.visit(s)
        used = set(_buffers_used(body))
        locals_ = []
        for buf in self.outer:
            if buf in used:
                if buf.scope == "shared":
                    self.shared.append(buf)
                else:
                    _buffer_bytes(buf, "local", self.kernel_name)
                    locals_.append(buf)
        for buf in reversed(locals_):
            body = Allocate(buf, body)
        return body, self.shared + locals_

    def visit_Allocate(self, a: Allocate):
        scope = a.buffer.scope
        if scope == "global":
            raise TIRError(f"kernel {self.kernel_name}: global buffer {a.buffer.name} is "
                           f"allocated inside the kernel; allocate intermediates outside the "
                           f"thread-bound loops (or give them shared / local scope)", a)
        body = self.visit(a.body)
        if scope == "shared":
            self.shared.append(a.buffer)
            return body
        _buffer_bytes(a.buffer, "local", self.kernel_name)
        return Allocate(a.buffer, body) if body is not a.body else a


# ---------------------------------------------------------------------------------------------
# barriers


class _Accesses(IRVisitor):
    """Shared-buffer reads and writes of a statement: buffer -> list of index tuples."""

    def __init__(self):
        super().__init__()
        self.reads: dict[Buffer, list] = {}
        self.writes: dict[Buffer, list] = {}

    def visit_Buffer(self, b):
        return

    def visit_BufferLoad(self, e):
        if e.buffer.scope == "shared":
            self.reads.setdefault(e.buffer, []).append(e.indices)
        for i in e.indices:
            self.visit(i)

    def visit_BufferStore(self, s):
        if s.buffer.scope == "shared":
            self.writes.setdefault(s.buffer, []).append(s.indices)
        self.visit(s.value)
        for i in s.indices:
            self.visit(i)

    def visit_Call(self, e):
        # an intrinsic that writes through its first argument (a tensor-core copy into a
        # shared tile) is a write of that buffer
        first = e.args[0] if e.args else None
        if e.op in WRITES_FIRST_ARG and isinstance(first, BufferLoad):
            if first.buffer.scope == "shared":
                self.writes.setdefault(first.buffer, []).append(first.indices)
            for i in first.indices:
                self.visit(i)
            rest = e.args[1:]
        else:
            rest = e.args
        for a in rest:
            self.visit(a)


def _accesses(s):
    a = _Accesses()
    a.visit(s)
    return a


class _State:
    __slots__ = ("reads", "writes")

    def __init__(self, reads=(), writes=()):
        self.reads, self.writes = set(reads), set(writes)

    def copy(self):
        return _State(self.reads, self.writes)

    def merge(self, other):
        return _State(self.reads | other.reads, self.writes | other.writes)

    def conflicts(self, reads, writes) -> bool:
        # read-after-write and write-after-read; two writes without a read between them need
        # no barrier (each phase of a cooperative stage writes its own elements)
        return bool((set(reads) & self.writes) or (set(writes) & self.reads))


class _Sync:
    """Insert work-group barriers (TVM's ThreadSync for the shared scope), conservatively:
    between any write of a shared buffer and a later read of it, and between a read
    and a later write, with loop-carried dependences seen by a second pass over loop bodies.
    Barriers go only into control flow that does not depend on threadIdx."""

    def __init__(self, kernel: str, thread_vars):
        self.kernel = kernel
        self.tvars = set(thread_vars)
        # A loop body is visited twice (loop-carried dependences), so the body of a loop nest
        # of depth d would be visited 2**d times, each time collecting its accesses again.
        # Both are memoized: the accesses of a statement, and the result of a statement from a
        # state. ``tvars`` only grows (a LetStmt's variable, before its body is visited), so its
        # size tells which set a result was computed with.
        self._acc: dict[int, tuple] = {}
        self._memo: dict[tuple, tuple] = {}

    def run(self, s: Stmt) -> Stmt:
        out, _ = self.stmt(s, _State())
        return out

    def _dependent(self, e) -> bool:
        return uses_any(e, self.tvars)

    def _accesses(self, s: Stmt) -> "_Accesses":
        hit = self._acc.get(id(s))
        if hit is None or hit[0] is not s:
            hit = self._acc[id(s)] = (s, _accesses(s))
        return hit[1]

    def stmt(self, s: Stmt, st: _State):
        key = (id(s), frozenset(st.reads), frozenset(st.writes), len(self.tvars))
        hit = self._memo.get(key)
        if hit is not None and hit[0] is s:
            _, out, reads, writes = hit
            return out, _State(reads, writes)
        out, st = self._stmt(s, st)
        self._memo[key] = (s, out, frozenset(st.reads), frozenset(st.writes))
        return out, st

    def _stmt(self, s: Stmt, st: _State):
        if is_barrier(s):
            # a barrier already in the kernel (a cp.async ring's, after its wait) publishes
            # every access before it: none needs another
            return s, _State()
        acc = self._accesses(s)
        if not acc.reads and not acc.writes:
            return s, st
        if isinstance(s, SeqStmt):
            out = []
            for c in s.seq:
                c2, st = self.stmt(c, st)
                out.append(c2)
            return seq(*out), st
        uniform_loop = isinstance(s, For) and not (self._dependent(s.min) or
                                                   self._dependent(s.extent))
        uniform_if = isinstance(s, IfThenElse) and not self._dependent(s.condition)
        if (uniform_loop or uniform_if) and st.conflicts(acc.reads, acc.writes):
            # one barrier before the loop (or branch) rather than one in every iteration
            out, st = self.stmt(s, _State())
            return seq(barrier(), out), st
        if uniform_loop:
            _, st1 = self.stmt(s.body, st.copy())
            body, st2 = self.stmt(s.body, st.merge(st1))
            return s.replace(body=body), st.merge(st2)
        if uniform_if:
            then, st1 = self.stmt(s.then_case, st.copy())
            if s.else_case is None:
                return IfThenElse(s.condition, then, None), st.merge(st1)
            other, st2 = self.stmt(s.else_case, st.copy())
            return IfThenElse(s.condition, then, other), st1.merge(st2)
        if isinstance(s, LetStmt):
            if self._dependent(s.value):
                self.tvars.add(s.var)
            body, st = self.stmt(s.body, st)
            return LetStmt(s.var, s.value, body), st
        if isinstance(s, Allocate):
            body, st = self.stmt(s.body, st)
            return Allocate(s.buffer, body), st
        if isinstance(s, AssertStmt):
            body, st = self.stmt(s.body, st)
            return AssertStmt(s.condition, s.message, body), st
        # a leaf, or control flow that depends on the thread index: one unit
        if not isinstance(s, (BufferStore, Evaluate)):
            self._check_divergent(s)
        reads, writes = set(acc.reads), set(acc.writes)
        if st.conflicts(reads, writes):
            return seq(barrier(), s), _State(reads, writes)
        st.reads |= reads
        st.writes |= writes
        return s, st

    def _check_divergent(self, s: Stmt):
        """Inside thread-dependent control flow no barrier can go: fail if threads would need
        one there (accesses of one shared buffer at different indices in different
        statements)."""
        leaves = []

        class V(IRVisitor):
            def visit_BufferStore(self, x):
                leaves.append(_accesses(x))

            def visit_Evaluate(self, x):
                leaves.append(_accesses(x))

        V().visit(s)
        for i, a in enumerate(leaves):
            for b in leaves[i + 1:]:
                for buf in (set(a.writes) & (set(b.reads) | set(b.writes))) | \
                        (set(a.reads) & set(b.writes)):
                    idx = [*a.writes.get(buf, []), *a.reads.get(buf, []),
                           *b.writes.get(buf, []), *b.reads.get(buf, [])]
                    first = idx[0]
                    if not all(len(x) == len(first) and
                               all(structural_equal(p, q) for p, q in zip(x, first))
                               for x in idx[1:]):
                        raise TIRError(
                            f"kernel {self.kernel}: shared buffer {buf.name} is written and read "
                            f"at different indices inside control flow that depends on the "
                            f"thread index, where no barrier can be placed; keep the guards of "
                            f"cooperative shared-memory stages inside each stage (give every "
                            f"thread loop of the kernel the same extent)", s)


# ---------------------------------------------------------------------------------------------
# run-time checks inside kernels


class _DeviceAsserts(IRMutator):
    """An ``AssertStmt`` inside a kernel reports through the ``kernel_error`` buffer."""

    def __init__(self, host_vars):
        super().__init__()
        self.messages: list[str] = []
        self.err = None

    def visit_Buffer(self, buf):
        return buf

    def run(self, s):
        out = self.visit(s)
        return out, self.messages, self.err

    def visit_AssertStmt(self, a: AssertStmt):
        if self.err is None:
            self.err = Buffer(ERROR_BUFFER_NAME, [IntImm(1, "int64")], "int32")
        self.messages.append(a.message)
        code = len(self.messages)
        body = self.visit(a.body)
        report = BufferStore(self.err, IntImm(code, "int32"), [IntImm(0, "int64")])
        return IfThenElse(a.condition, body, report)


# ---------------------------------------------------------------------------------------------
# int32 index arithmetic


def _to_i32(e: PrimExpr) -> PrimExpr:
    if e.dtype == "int32":
        return e
    if isinstance(e, IntImm):
        return IntImm(e.value, "int32")
    if isinstance(e, Cast) and e.value.dtype == "int32":
        return e.value
    return Cast("int32", e)


def _unify(a: PrimExpr, b: PrimExpr):
    """Promote the narrower integer side so both have one dtype."""
    if a.dtype == b.dtype:
        return a, b
    if dt.is_integer(a.dtype) and dt.is_integer(b.dtype):
        wide = a.dtype if dt.bits(a.dtype) >= dt.bits(b.dtype) else b.dtype
        a = a if a.dtype == wide else (IntImm(a.value, wide) if isinstance(a, IntImm)
                                       else Cast(wide, a))
        b = b if b.dtype == wide else (IntImm(b.value, wide) if isinstance(b, IntImm)
                                       else Cast(wide, b))
    return a, b


class _Narrow(IRMutator):
    """int64 index arithmetic -> int32: int64 Vars become int32 Vars, int64 constants that fit
    become int32, indices and loop bounds are int32; int64 data (loads of int64 buffers and
    what is computed from them) stays int64, the narrower side promoted where they meet."""

    def __init__(self):
        super().__init__()
        self.vmap: dict[Var, Var] = {}

    def visit_Buffer(self, buf):
        return buf

    def var(self, v: Var) -> Var:
        if v.dtype != "int64":
            return v
        nv = self.vmap.get(v)
        if nv is None:
            nv = self.vmap[v] = Var(v.name, "int32")
        return nv

    def visit_Var(self, v):
        return self.var(v)

    def visit_IntImm(self, e):
        if e.dtype == "int64" and -INT32_MAX - 1 <= e.value <= INT32_MAX:
            return IntImm(e.value, "int32")
        return e

    def generic_visit(self, node):
        if isinstance(node, BinaryOp):
            a, b = _unify(self.visit(node.a), self.visit(node.b))
            if a is node.a and b is node.b:
                return node
            return type(node)(a, b)
        return super().generic_visit(node)

    def visit_Cast(self, e: Cast):
        v = self.visit(e.value)
        if e.dtype == "int64" and dt.is_integer(v.dtype) and not _loads_memory(v):
            return v            # index arithmetic: stays int32
        if v.dtype == e.dtype:
            return v
        return Cast(e.dtype, v)

    def visit_Select(self, e: Select):
        t, f = _unify(self.visit(e.true_value), self.visit(e.false_value))
        return Select(self.visit(e.condition), t, f)

    def visit_Call(self, e: Call):
        args = [self.visit(a) for a in e.args]
        if e.op == "if_then_else":
            t, f = _unify(args[1], args[2])
            return Call(t.dtype, e.op, [args[0], t, f])
        dtype = e.dtype
        if dtype == "int64" and all(a.dtype == "int32" for a in args if dt.is_integer(a.dtype)) \
                and not _loads_memory(e):
            dtype = "int32"
        return Call(dtype, e.op, args)

    def visit_Let(self, e: Let):
        value = self.visit(e.value)
        var = e.var
        if var.dtype != value.dtype:
            var = self.vmap[e.var] = Var(e.var.name, value.dtype)
        return Let(var, value, self.visit(e.body))

    def visit_Not(self, e: Not):
        return Not(self.visit(e.a))

    def visit_BufferLoad(self, e: BufferLoad):
        return BufferLoad(e.buffer, [_to_i32(self.visit(i)) for i in e.indices])

    def visit_BufferStore(self, s: BufferStore):
        value = self.visit(s.value)
        if value.dtype != s.buffer.dtype:
            value = IntImm(value.value, s.buffer.dtype) if isinstance(value, IntImm) \
                else Cast(s.buffer.dtype, value)
        return BufferStore(s.buffer, value, [_to_i32(self.visit(i)) for i in s.indices])

    def visit_For(self, f: For):
        return For(self.var(f.loop_var), _to_i32(self.visit(f.min)),
                   _to_i32(self.visit(f.extent)), f.kind, self.visit(f.body), f.thread_tag,
                   f.annotation_dict)

    def visit_LetStmt(self, s: LetStmt):
        value = self.visit(s.value)
        var = s.var
        if var.dtype != value.dtype:
            var = self.vmap[s.var] = Var(s.var.name, value.dtype)
        return LetStmt(var, value, self.visit(s.body))


# ---------------------------------------------------------------------------------------------


def split_host_device(func: PrimFunc, target: Any = None) -> HostDeviceSplit:
    """Split a lowered function into a host program and device kernels.

    Parameters
    ----------
    func : PrimFunc
        In the lowered form (``transform.lower(func, target)``), thread-bound loops included.
    target : Target | dict | None
        Where the limits come from: a ``targets.Target`` (its ``.limits``) or a dict of them
        (``max_threads_per_block``, ``max_shared_memory_per_block``, ``max_block_dims``,
        ``max_grid_dims`` or WebGPU's ``max_compute_workgroup_size_x`` ... names). None checks
        nothing.

    Returns
    -------
    HostDeviceSplit

    Raises
    ------
    DeviceLimitError
        A kernel over a limit, a non-constant thread extent, a misplaced blockIdx loop.
    TIRError
        Host code that would need device memory, a shared buffer used by two kernels, a barrier
        needed in divergent control flow.
    """
    if not isinstance(func, PrimFunc):
        raise TIRError(f"split_host_device takes a PrimFunc, got {type(func).__name__}", func)
    if "arg_buffers" not in func.attr_dict:
        raise TIRError("split_host_device needs a lowered function (transform.lower first)", func)
    sp = _Splitter(func, _limits_of(target))
    body = sp.host(func.body)
    host = func.replace(body=body, attrs={**func.attr_dict, "tir.is_host_func": True})
    return HostDeviceSplit(host, tuple(sp.kernels))


__all__ = ["DeviceKernel", "DeviceLimitError", "GPU_KINDS", "HostDeviceSplit", "LaunchKernel",
           "barrier", "is_barrier", "split_host_device", "BARRIER_OP", "ERROR_BUFFER_NAME"]

