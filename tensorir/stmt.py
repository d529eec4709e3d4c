"""Statements, buffers, and the loop/block structure of TensorIR.

A ``te.create_prim_func`` result has the TensorIR shape that schedules work on::

    PrimFunc
      body: BlockRealize(root)            # root block owns intermediate buffers
        For i: For j: BlockRealize         # one loop nest per computation
                 Block "C" (iter_vars vi, vj; reads/writes; init for reductions)
                   BufferStore C[vi, vj] = ...

Lowering (``tensorir.transform``) removes blocks and flattens buffers to one dimension; see
``transform.lower`` for the exact form that code generators consume.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from . import dtype as dt
from .expr import (PREFETCH, BufferLoad, Call, IntImm, Node, PrimExpr, TIRError, Var, convert,
                   true)

FOR_KINDS = ("serial", "parallel", "vectorized", "unrolled", "thread_binding")
# a vectorized loop annotated with this stores its full vectors with non-temporal stores
# where they are aligned to a cache line (the LLVM back end; a hint the others ignore): a
# kernel whose output is far larger than the caches then writes it without reading each line
# in first. The value is the size in bytes from which a stored buffer is written that way
# (1: always): the back end tests a buffer of symbolic shape at run time, so one kernel
# streams a large batch's output and keeps a small one's in the caches
ANN_NONTEMPORAL_STORE = "nontemporal_store"
SCOPES = ("global", "shared", "local")
ITER_KINDS = ("spatial", "reduce")


class Buffer(Node):
    """A multi-dimensional array: ``shape`` (ints or expressions), ``dtype``, storage ``scope``.

    Buffers compare by identity, like variables. ``strides`` is None for a compact row-major
    layout. ``buffer[i, j]`` builds a ``BufferLoad``.
    """

    _fields = ("name", "shape", "dtype", "strides", "scope", "align")
    __slots__ = ("name", "shape", "dtype", "strides", "scope", "align")

    def __init__(self, name: str, shape: Sequence, dtype: str = "float32", strides=None,
                 scope: str = "global", align: int = 64):
        shape = tuple(convert(s) for s in shape)
        for s in shape:
            if not dt.is_integer(s.dtype):
                raise TIRError(f"buffer {name}: shape entry {s!r} must be an integer expression", s)
        if scope not in SCOPES:
            raise TIRError(f"buffer {name}: unknown storage scope {scope!r}; expected one of {SCOPES}")
        strides = None if strides is None else tuple(convert(s) for s in strides)
        self._init(name=str(name), shape=shape, dtype=dt.check(dtype), strides=strides,
                   scope=scope, align=int(align))

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices):
        if not isinstance(indices, tuple):
            indices = (indices,)
        return BufferLoad(self, indices)

    def vload(self, indices):
        return self[tuple(indices)]

    def vstore(self, indices, value) -> "BufferStore":
        return BufferStore(self, value, indices)


def decl_buffer(shape: Sequence, dtype: str = "float32", name: str = "buffer",
                scope: str = "global") -> Buffer:
    """Declare a buffer (TVM's ``tir.decl_buffer``)."""
    return Buffer(name, shape, dtype, scope=scope)


class Range(Node):
    """``[min, min + extent)``."""

    _fields = ("min", "extent")
    __slots__ = ("min", "extent")

    def __init__(self, min, extent):
        self._init(min=convert(min), extent=convert(extent))

    @staticmethod
    def from_min_extent(min, extent) -> "Range":
        return Range(min, extent)


class IterVar(Node):
    """A block iteration variable (``kind`` spatial or reduce) over ``dom``; te axes are IterVars too."""

    _fields = ("var", "dom", "kind")
    __slots__ = ("var", "dom", "kind")

    def __init__(self, var: Var, dom: Range, kind: str = "spatial"):
        if kind not in ITER_KINDS:
            raise TIRError(f"IterVar {var.name}: kind must be one of {ITER_KINDS}, got {kind!r}")
        self._init(var=var, dom=dom, kind=kind)

    # te code uses axes directly in index expressions: k in A[i, k]
    def _as_expr(self):
        return self.var

    def __add__(self, other): return self.var + other
    def __radd__(self, other): return other + self.var
    def __sub__(self, other): return self.var - other
    def __rsub__(self, other): return other - self.var
    def __mul__(self, other): return self.var * other
    def __rmul__(self, other): return other * self.var
    def __floordiv__(self, other): return self.var // other
    def __mod__(self, other): return self.var % other
    def __lt__(self, other): return self.var < other
    def __le__(self, other): return self.var <= other
    def __gt__(self, other): return self.var > other
    def __ge__(self, other): return self.var >= other

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other


class BufferRegion(Node):
    """The part of ``buffer`` a block touches: one Range per dimension."""

    _fields = ("buffer", "region")
    __slots__ = ("buffer", "region")

    def __init__(self, buffer: Buffer, region: Sequence[Range]):
        region = tuple(region)
        if len(region) != buffer.ndim:
            raise TIRError(f"region of {buffer.name} has {len(region)} ranges for "
                           f"{buffer.ndim} dimensions", buffer)
        self._init(buffer=buffer, region=region)

    @staticmethod
    def full(buffer: Buffer) -> "BufferRegion":
        return BufferRegion(buffer, [Range(0, s) for s in buffer.shape])


class Stmt(Node):
    __slots__ = ()


class BufferStore(Stmt):
    """``buffer[indices] = value``."""

    _fields = ("buffer", "value", "indices")
    __slots__ = ("buffer", "value", "indices")

    def __init__(self, buffer: Buffer, value, indices: Sequence):
        value = convert(value)
        indices = tuple(convert(i) for i in indices)
        if len(indices) != buffer.ndim:
            raise TIRError(f"store to {buffer.name}: {len(indices)} indices for "
                           f"{buffer.ndim} dimensions", buffer)
        if dt.element_of(value.dtype) != buffer.dtype:
            raise TIRError(f"store to {buffer.name} ({buffer.dtype}) of a {value.dtype} value "
                           f"{value!r}; cast it with .astype('{buffer.dtype}')", value)
        self._init(buffer=buffer, value=value, indices=indices)


class Evaluate(Stmt):
    """Evaluate an expression for its side effect (e.g. an intrinsic call)."""

    _fields = ("value",)
    __slots__ = ("value",)

    def __init__(self, value):
        self._init(value=convert(value))


def prefetch(buffer: "Buffer", indices: Sequence) -> Evaluate:
    """A software prefetch of the cache line holding ``buffer[indices]`` (read, high
    locality, data cache): a hint with no effect on the results. The LLVM back end emits
    ``llvm.prefetch``; ``tensorir.interpret`` and the GPU back ends emit nothing.

    The indices must stay inside the buffer, as for a load (``VerifyMemoryAccess`` checks
    them): clamp them, or guard the prefetch, where the element may not exist.

    Examples
    --------
    >>> a = decl_buffer((1024,), "float32", "a")
    >>> s = prefetch(a, [64])
    >>> s.value.op
    'prefetch'
    """
    return Evaluate(Call("int32", PREFETCH, [BufferLoad(buffer, indices)]))


def is_prefetch(s) -> bool:
    """Whether ``s`` is a software prefetch statement (``prefetch``)."""
    return isinstance(s, Evaluate) and isinstance(s.value, Call) and s.value.op == PREFETCH


class SeqStmt(Stmt):
    _fields = ("seq",)
    __slots__ = ("seq",)

    def __init__(self, seq: Sequence[Stmt]):
        flat = []
        for s in seq:
            if isinstance(s, SeqStmt):
                flat.extend(s.seq)
            elif s is not None:
                flat.append(s)
        self._init(seq=tuple(flat))


def seq(*stmts) -> Stmt:
    """A SeqStmt, or the single statement when there is only one."""
    s = SeqStmt(stmts)
    return s.seq[0] if len(s.seq) == 1 else s


class IfThenElse(Stmt):
    _fields = ("condition", "then_case", "else_case")
    __slots__ = ("condition", "then_case", "else_case")

    def __init__(self, condition, then_case: Stmt, else_case: Stmt | None = None):
        condition = convert(condition)
        if not dt.is_bool(condition.dtype):
            raise TIRError(f"IfThenElse condition must be bool, got {condition.dtype}", condition)
        self._init(condition=condition, then_case=then_case, else_case=else_case)


class LetStmt(Stmt):
    _fields = ("var", "value", "body")
    __slots__ = ("var", "value", "body")

    def __init__(self, var: Var, value, body: Stmt):
        value = convert(value)
        if value.dtype != var.dtype:
            raise TIRError(f"LetStmt {var.name}: value dtype {value.dtype} differs from {var.dtype}",
                           var)
        self._init(var=var, value=value, body=body)


class AssertStmt(Stmt):
    """Check ``condition`` at run time; fail with ``message`` otherwise, then run ``body``."""

    _fields = ("condition", "message", "body")
    __slots__ = ("condition", "message", "body")

    def __init__(self, condition, message: str, body: Stmt):
        self._init(condition=convert(condition), message=str(message), body=body)


class Allocate(Stmt):
    """Allocate ``buffer`` (in its scope) for the duration of ``body``."""

    _fields = ("buffer", "body")
    __slots__ = ("buffer", "body")

    def __init__(self, buffer: Buffer, body: Stmt):
        self._init(buffer=buffer, body=body)


class For(Stmt):
    """``for loop_var in range(min, min + extent)`` of a kind: serial / parallel / vectorized /
    unrolled / thread_binding (``thread_tag`` is then e.g. ``"blockIdx.x"``)."""

    _fields = ("loop_var", "min", "extent", "kind", "body", "thread_tag", "annotations")
    __slots__ = ("loop_var", "min", "extent", "kind", "body", "thread_tag", "annotations")

    def __init__(self, loop_var: Var, min, extent, kind: str, body: Stmt,
                 thread_tag: str | None = None, annotations: Mapping | None = None):
        if kind not in FOR_KINDS:
            raise TIRError(f"loop {loop_var.name}: kind must be one of {FOR_KINDS}, got {kind!r}",
                           loop_var)
        if kind == "thread_binding" and not thread_tag:
            raise TIRError(f"loop {loop_var.name}: a thread_binding loop needs a thread_tag", loop_var)
        annotations = tuple(sorted(dict(annotations or {}).items()))
        self._init(loop_var=loop_var, min=convert(min), extent=convert(extent), kind=kind, body=body,
                   thread_tag=thread_tag, annotations=annotations)

    @property
    def annotation_dict(self) -> dict:
        return dict(self.annotations)


class Block(Stmt):
    """A unit of computation with explicit iteration variables and data dependences.

    ``iter_vars``: the block's IterVars (spatial or reduce); ``reads`` / ``writes``: BufferRegions in
    terms of those variables; ``init``: the statement run when every reduce variable is at its
    minimum (reductions); ``alloc_buffers``: buffers that live inside the block.
    """

    _fields = ("name", "iter_vars", "reads", "writes", "body", "init", "alloc_buffers",
               "annotations")
    __slots__ = ("name", "iter_vars", "reads", "writes", "body", "init", "alloc_buffers",
                 "annotations")

    def __init__(self, name: str, iter_vars: Sequence[IterVar], reads: Sequence[BufferRegion],
                 writes: Sequence[BufferRegion], body: Stmt, init: Stmt | None = None,
                 alloc_buffers: Sequence[Buffer] = (), annotations: Mapping | None = None):
        annotations = tuple(sorted(dict(annotations or {}).items()))
        self._init(name=str(name), iter_vars=tuple(iter_vars), reads=tuple(reads),
                   writes=tuple(writes), body=body, init=init, alloc_buffers=tuple(alloc_buffers),
                   annotations=annotations)


class BlockRealize(Stmt):
    """Instantiate ``block`` with ``iter_values`` (one per IterVar) when ``predicate`` holds."""

    _fields = ("iter_values", "predicate", "block")
    __slots__ = ("iter_values", "predicate", "block")

    def __init__(self, iter_values: Sequence, predicate, block: Block):
        iter_values = tuple(convert(v) for v in iter_values)
        if len(iter_values) != len(block.iter_vars):
            raise TIRError(f"block {block.name}: {len(iter_values)} iter values for "
                           f"{len(block.iter_vars)} iter vars", block)
        predicate = true() if predicate is None else convert(predicate)
        self._init(iter_values=iter_values, predicate=predicate, block=block)


def is_true(e: PrimExpr) -> bool:
    return isinstance(e, IntImm) and e.dtype == "bool" and e.value == 1
