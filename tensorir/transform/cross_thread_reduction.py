"""``LowerCrossThreadReduction``: reductions whose reduce loops are bound to ``threadIdx``.

``sch.bind(k_inner, "threadIdx.x")`` on a reduction loop (TVM's cross-thread reduction, what
``CrossThreadReduction`` in metaschedule and the GPU default schedules of softmax / norms /
row reductions do) means: the threads of a work-group split the reduction among themselves
and combine their partial results. This pass (block form, before ``ConvertBlocksToLoops``)
rewrites such a block

    for tx in thread_binding(T, "threadIdx.x"):      # reduce loops, thread-bound ...
        for ki in range(K):                          # ... and serial, in any order
            block B (reduce): B[i] = B[i] + A[i, vk]

into, per thread,

    partial[0] = identity
    for ki in range(K): if P: partial[0] = partial[0] + A[i, tx * K + ki]
    red[tx] = partial[0]                             # red: shared, one slot per thread
    if tx < 128: red[tx] = red[tx] + red[tx + 128]   # a tree over the threads; the device
    ...                                              # lowering puts barriers between steps
    if tx < 1:   red[tx] = red[tx] + red[tx + 1]
    B[i] = red[0]                                    # every thread writes (and has) the result

(the thread loops stay, moved outside the serial ones). The block's init (``B[i] = 0``) or,
without one (after ``decompose_reduction``), the value already in ``B[i]`` is combined with
the result. Conditions: the block's body is ``B[idx] = B[idx] op value`` with ``op`` one of
``+ * max min``; the loops from the outermost reduce loop down to the block hold nothing else
and are all reduce loops; the spatial indices do not depend on them.
"""
from __future__ import annotations

from ..expr import (Add, And, BufferLoad, IntImm, Max, Min, Mul, PrimExpr, TIRError, combine,
                    identity_of)
from ..function import PrimFunc
from ..functor import IRMutator, IRVisitor
from ..stmt import (Allocate, AssertStmt, BlockRealize, Buffer, BufferStore, For, IfThenElse,
                    Stmt, is_true, seq)
from ..structural import structural_equal
from ._common import prim_func_pass, subst, uses_any

_COMBINERS = {Add: "sum", Mul: "prod", Max: "max", Min: "min"}


def _combine(kind: str, a: PrimExpr, b: PrimExpr) -> PrimExpr:
    return combine(kind, a, b)


def _identity(kind: str, dtype: str) -> PrimExpr:
    return identity_of(kind, dtype)


def _conjuncts(e: PrimExpr) -> list:
    if isinstance(e, And):
        return _conjuncts(e.a) + _conjuncts(e.b)
    return [e]


def _all(conds):
    out = None
    for c in conds:
        out = c if out is None else And(out, c)
    return out


class _Find(IRVisitor):
    """Cross-thread reduction blocks and the outermost loop of their reduce loops."""

    def __init__(self):
        super().__init__()
        self.stack: list[For] = []
        self.found: list[tuple[For, list[For], BlockRealize]] = []

    def visit_For(self, f: For):
        self.stack.append(f)
        self.visit(f.body)
        self.stack.pop()

    def visit_BlockRealize(self, br: BlockRealize):
        block = br.block
        reduce_values = [v for iv, v in zip(block.iter_vars, br.iter_values)
                         if iv.kind == "reduce"]
        if reduce_values:
            used = [f for f in self.stack if any(uses_any(v, [f.loop_var]) for v in reduce_values)]
            threads = [f for f in used if f.kind == "thread_binding" and f.thread_tag and
                       f.thread_tag.startswith("threadIdx")]
            if threads:
                start = next(i for i, f in enumerate(self.stack) if f is used[0])
                chain = self.stack[start:]
                # threads bound outside the reduction (a GEMV's columns on threadIdx.x, its
                # reduction on threadIdx.y) each reduce their own outputs: a tree apiece
                outer = [f for f in self.stack[:start] if f.kind == "thread_binding" and
                         f.thread_tag and f.thread_tag.startswith("threadIdx")]
                self.found.append((chain[0], list(chain), br, outer))
        self.visit(block.body)
        if block.init is not None:
            self.visit(block.init)


def _fail(br: BlockRealize, why: str):
    raise TIRError(f"cross-thread reduction of block {br.block.name}: {why}", br)


def _thread_index(loops: list[For], br: BlockRealize) -> tuple[PrimExpr, int]:
    """The row-major index of a thread among the constant-extent thread ``loops``, and their
    number of threads."""
    total = 1
    index: PrimExpr = IntImm(0, "int64")
    for f in loops:
        ext = f.extent
        if not isinstance(ext, IntImm):
            _fail(br, f"thread loop {f.loop_var.name} has the non-constant extent {ext}")
        pos = f.loop_var if isinstance(f.min, IntImm) and f.min.value == 0 else f.loop_var - f.min
        index = pos if total == 1 else index * ext.value + pos
        total *= ext.value
    return index, total


def _lower_one(chain: list[For], br: BlockRealize,
               outer_threads: list[For]) -> tuple[Stmt, Buffer]:
    """The reduction rewritten (its partial result allocated) and the shared buffer of its
    trees, which the caller allocates around the outermost of ``outer_threads`` (else here)."""
    block = br.block
    loop_vars = [f.loop_var for f in chain]
    for outer, inner in zip(chain, chain[1:]):
        if outer.body is not inner:
            _fail(br, f"loop {outer.loop_var.name} holds more than the reduce loops and the "
                      f"block; the loops from the outermost reduce loop down to the block must "
                      f"hold nothing else")
    if chain[-1].body is not br:
        _fail(br, f"loop {chain[-1].loop_var.name} holds more than the block")
    vmap = {iv.var: v for iv, v in zip(block.iter_vars, br.iter_values)}
    for iv, v in zip(block.iter_vars, br.iter_values):
        if iv.kind == "spatial" and uses_any(v, loop_vars):
            _fail(br, f"the spatial iter var {iv.var.name} = {v!r} depends on a loop of the "
                      f"reduction (a thread-bound reduce loop must enclose only reduce loops)")
    for f in chain:
        if not any(uses_any(v, [f.loop_var]) for iv, v in zip(block.iter_vars, br.iter_values)
                   if iv.kind == "reduce"):
            _fail(br, f"loop {f.loop_var.name} between the reduce loops is not a reduce loop")
        if f.kind == "thread_binding" and not f.thread_tag.startswith("threadIdx"):
            _fail(br, f"reduce loop {f.loop_var.name} is bound to {f.thread_tag}; only threadIdx "
                      f"axes can share a reduction")
        if f.kind == "parallel":
            _fail(br, f"reduce loop {f.loop_var.name} is parallel")
    body = block.body
    checks = []     # run-time checks VerifyMemoryAccess put around the update: keep them there
    while isinstance(body, AssertStmt):
        checks.append(body)
        body = body.body
    if not isinstance(body, BufferStore):
        _fail(br, "its body must be one store B[...] = B[...] op value")
    buf = body.buffer
    value = body.value
    kind = _COMBINERS.get(type(value))
    if kind is None:
        _fail(br, f"its update {value!r} is not a sum, product, max or min")

    def is_acc(e):
        return isinstance(e, BufferLoad) and e.buffer is buf and len(e.indices) == \
            len(body.indices) and all(structural_equal(a, b)
                                      for a, b in zip(e.indices, body.indices))
    if is_acc(value.a):
        rhs = value.b
    elif is_acc(value.b):
        rhs = value.a
    else:
        _fail(br, f"its update {value!r} does not combine B[...] with a value")
    idx = [subst(i, vmap) for i in body.indices]
    rhs = subst(rhs, vmap)
    pred = subst(br.predicate, vmap)
    spatial_guard, reduce_guard = [], []
    if not is_true(pred):
        for c in _conjuncts(pred):
            (reduce_guard if uses_any(c, loop_vars) else spatial_guard).append(c)
    dtype = buf.dtype
    identity = _identity(kind, dtype)
    threads = [f for f in chain if f.kind == "thread_binding"]
    serial = [f for f in chain if f.kind != "thread_binding"]
    lin, total = _thread_index(threads, br)
    # the slot of this thread's group of reducing threads: one tree per outer thread index
    base, groups = _thread_index(outer_threads, br)
    base = base * total
    partial = Buffer(f"{buf.name}_in_thread", [IntImm(1, "int64")], dtype, scope="local")
    red = Buffer(f"{buf.name}_red", [IntImm(total * groups, "int64")], dtype, scope="shared")
    zero = [IntImm(0, "int64")]
    slot = lin if groups == 1 else base + lin
    acc = BufferLoad(partial, zero)
    update: Stmt = BufferStore(partial, _combine(kind, acc, rhs), zero)
    for chk in reversed(checks):
        update = AssertStmt(subst(chk.condition, vmap), chk.message, update)
    if reduce_guard:
        update = IfThenElse(_all(reduce_guard), update)
    for f in reversed(serial):
        update = For(f.loop_var, f.min, f.extent, f.kind if f.kind != "vectorized" else "serial",
                     update, None, f.annotation_dict)
    if spatial_guard:
        # a thread past a split's tail (a column beyond the last) reads nothing: its loads
        # would be out of bounds. It still writes the identity to its slot and takes part in
        # the tree (every thread must reach the barriers); only the final store skips it.
        update = IfThenElse(_all(spatial_guard), update)
    steps = [BufferStore(partial, identity, zero), update, BufferStore(red, acc, [slot])]
    s = 1
    while s * 2 < total:
        s *= 2
    while s >= 1:
        cond = lin < s
        if s * 2 > total:
            cond = And(cond, lin + s < total)
        steps.append(IfThenElse(cond, BufferStore(red, _combine(
            kind, BufferLoad(red, [slot]), BufferLoad(red, [slot + s])), [slot])))
        s //= 2
    result = BufferLoad(red, zero if groups == 1 else [base])
    if block.init is None:
        final = _combine(kind, BufferLoad(buf, idx), result)
    else:
        init = block.init
        if not isinstance(init, BufferStore) or init.buffer is not buf:
            _fail(br, "its init must be one store to the reduction's buffer")
        init_value = subst(init.value, vmap)
        same = structural_equal(init_value, identity)
        final = result if same else _combine(kind, init_value, result)
    out: Stmt = BufferStore(buf, final, idx)
    if spatial_guard:
        out = IfThenElse(_all(spatial_guard), out)
    steps.append(out)
    inner: Stmt = seq(*steps)
    for f in reversed(threads):
        inner = For(f.loop_var, f.min, f.extent, "thread_binding", inner, f.thread_tag,
                    f.annotation_dict)
    return Allocate(partial, inner), red


class _Rewrite(IRMutator):
    def __init__(self, found):
        super().__init__()
        self.by_loop = {id(f): (chain, br, outer) for f, chain, br, outer in found}
        # the shared tree buffers of reductions under outer thread loops, allocated around the
        # outermost of those loops: inside one, a buffer would be taken as that thread's own
        # (CompactBufferAllocation shrinks it to one thread's slots)
        self.hoisted: dict[int, list[Buffer]] = {id(outer[0]): [] for *_, outer in found if outer}

    def visit_For(self, f: For):
        hit = self.by_loop.get(id(f))
        if hit is not None:
            stmt, red = _lower_one(*hit)
            outer = hit[2]
            if outer:
                self.hoisted[id(outer[0])].append(red)
                return stmt
            return Allocate(red, stmt)
        if id(f) in self.hoisted:
            new = self.generic_visit(f)
            for red in self.hoisted[id(f)]:
                new = Allocate(red, new)
            return new
        return self.generic_visit(f)


@prim_func_pass
def LowerCrossThreadReduction(func: PrimFunc) -> PrimFunc:
    """Lower reductions over ``threadIdx``-bound loops to a partial result per thread and a
    tree over the threads in shared memory (see the module docstring)."""
    finder = _Find()
    finder.visit(func.body)
    if not finder.found:
        return func
    seen = set()
    for f, _, br, _ in finder.found:
        if id(f) in seen:
            _fail(br, f"loop {f.loop_var.name} is the outer reduce loop of two blocks")
        seen.add(id(f))
    body = _Rewrite(finder.found).visit(func.body)
    return func.replace(body=body)


__all__ = ["LowerCrossThreadReduction"]

