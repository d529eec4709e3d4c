"""``InjectRegisterPrefetch``: software-pipeline the global -> shared copies of a GPU reduction
loop through registers (the register double buffering of SGEMM kernels).

A serial loop annotated ``register_prefetch`` (``ANN_REGISTER_PREFETCH``; the GPU default GEMM
schedule and the MetaSchedule cooperative-fetch postproc set it on the reduction loop whose body
stages the input tiles in shared memory) whose body starts with *copy nests* — loop nests (of any
kinds: serial, unrolled, vectorized, thread-bound) around one store ``shared[..] = global[..]``,
optionally guarded — is rewritten, on the flat form (after ``FlattenBuffers``), from::

    for k in range(n):
        copy_A(k); copy_B(k)            # shared <- global
        compute(k)                      # reads the shared tiles

into::

    load_A(0); load_B(0)                # registers <- global
    for k in range(n):
        store_A(k); store_B(k)          # shared <- registers
        if k + 1 < n:
            load_A(k + 1); load_B(k + 1)
        compute(k)

Each copy nest gets a ``local`` staging array indexed by its loops that are not thread-bound
(each thread copies the elements it would have copied; the thread loops stay as they are, so
every thread keeps its own elements), those loops unrolled so that the array stays in
registers. The next tile's global loads are issued before the current tile's multiply-adds,
which then hide their latency instead of waiting for them after the barrier. The barriers are
inserted later (``split_host_device``) as for any shared access: before the stores (the
previous step's compute read the tiles) and before the compute.

A loop whose body does not have this form (no copy nest first, a non-constant extent inside a
copy, a staging array over ``MAX_STAGING`` elements, a copied buffer written inside the loop)
is left unchanged: the annotation is a hint, never an error.

Examples
--------
>>> from tilecraft.tensorir.transform.register_prefetch import InjectRegisterPrefetch  # doctest: +SKIP
>>> lowered = InjectRegisterPrefetch(FlattenBuffers(func))                  # doctest: +SKIP
"""
from __future__ import annotations

from ..expr import Add, BufferLoad, Cast, IntImm, LT, Mul, Sub, Var
from ..function import PrimFunc
from ..functor import IRMutator, post_order_visit
from ..stmt import Allocate, Buffer, BufferStore, For, IfThenElse, SeqStmt, seq
from ._common import prim_func_pass, subst

ANN_REGISTER_PREFETCH = "register_prefetch"
# registers per thread a staging array may take (beside a GEMM's register tile)
MAX_STAGING = 64


def _copy_nest(s):
    """``(loops, store)`` when ``s`` is a nest of For / guard-IfThenElse around one store of a
    shared buffer whose value reads only global buffers; else None."""
    loops = []
    while True:
        if isinstance(s, For):
            loops.append(s)
            s = s.body
        elif isinstance(s, IfThenElse) and s.else_case is None:
            s = s.then_case
        else:
            break
    if not isinstance(s, BufferStore) or s.buffer.scope != "shared":
        return None
    loads = []
    post_order_visit(s.value, lambda n: loads.append(n) if isinstance(n, BufferLoad) else None)
    if not loads or any(ld.buffer.scope != "global" for ld in loads):
        return None
    return loops, s


def _written(s) -> set:
    out = set()
    post_order_visit(s, lambda n: out.add(n.buffer) if isinstance(n, BufferStore) else None)
    return out


def _read_buffers(e) -> set:
    out = set()
    post_order_visit(e, lambda n: out.add(n.buffer) if isinstance(n, BufferLoad) else None)
    return out


class _Staged:
    """One copy nest split in a load (registers <- global) and a store (shared <- registers)."""

    def __init__(self, nest, loops, store, index: int):
        self.nest = nest
        serial = [lp for lp in loops if lp.kind != "thread_binding"]
        dtype = store.indices[0].dtype
        size, offset = 1, IntImm(0, dtype)
        for lp in reversed(serial):          # row-major over the nest's non-thread loops
            v = lp.loop_var
            term = v if lp.min.value == 0 else Sub(v, IntImm(lp.min.value, v.dtype))
            if v.dtype != dtype:
                term = Cast(dtype, term)
            offset = Add(offset, Mul(term, IntImm(size, dtype)) if size != 1 else term)
            size *= lp.extent.value
        self.size = size
        self.buffer = Buffer(f"{store.buffer.name}_prefetch{index}", (size,), store.buffer.dtype,
                             scope="local")
        self.offset = offset
        self.store = store

    def _rebuild(self, leaf, unroll: bool):
        """The nest with its innermost store replaced by ``leaf``, serial loops unrolled, every
        loop variable fresh (the nest appears up to three times)."""
        def walk(s):
            if isinstance(s, For):
                kind = "unrolled" if unroll and s.kind == "serial" else s.kind
                return For(s.loop_var, s.min, s.extent, kind, walk(s.body), s.thread_tag,
                           s.annotation_dict)
            if isinstance(s, IfThenElse):
                return IfThenElse(s.condition, walk(s.then_case), None)
            return leaf
        out = walk(self.nest)
        return _fresh_loops(out)

    def load(self):
        return self._rebuild(BufferStore(self.buffer, self.store.value, [self.offset]), True)

    def write(self):
        value = BufferLoad(self.buffer, [self.offset])
        return self._rebuild(BufferStore(self.store.buffer, value, list(self.store.indices)),
                             True)


def _fresh_loops(s):
    """``s`` with every For's loop variable replaced by a new Var of the same name."""
    vmap = {}

    def collect(n):
        if isinstance(n, For) and n.loop_var not in vmap:
            vmap[n.loop_var] = Var(n.loop_var.name, n.loop_var.dtype)
    post_order_visit(s, collect)

    class _Fresh(IRMutator):
        def visit_Var(self, v):
            return vmap.get(v, v)

        def visit_For(self, f):
            body = self.visit(f.body)
            return For(vmap.get(f.loop_var, f.loop_var), self.visit(f.min), self.visit(f.extent),
                       f.kind, body, f.thread_tag, f.annotation_dict)
    return _Fresh().visit(s)


def _pipeline(loop: For):
    """The rewritten loop (with its prologue and staging allocations), or None when the body
    does not have the form of the module docstring."""
    wrappers = []
    body = loop.body
    while isinstance(body, Allocate):
        wrappers.append(body)
        body = body.body
    stmts = list(body.seq) if isinstance(body, SeqStmt) else [body]
    copies = []
    for s in stmts:
        found = _copy_nest(s)
        if found is None:
            break
        copies.append((s, *found))
    rest = stmts[len(copies):]
    if not copies or not rest:
        return None
    staged = []
    total = 0
    for i, (nest, loops, store) in enumerate(copies):
        if any(not isinstance(lp.extent, IntImm) or not isinstance(lp.min, IntImm)
               for lp in loops if lp.kind != "thread_binding"):
            return None
        st = _Staged(nest, loops, store, i)
        total += st.size
        staged.append(st)
    if total > MAX_STAGING:
        return None
    # the copied global buffers must not change inside the loop (the load moves a step ahead)
    sources = set().union(*(_read_buffers(st.store.value) for st in staged))
    if sources & _written(loop.body):
        return None
    k = loop.loop_var
    nxt = Add(k, IntImm(1, k.dtype))
    end = Add(loop.min, loop.extent)
    prologue = [subst(st.load(), {k: loop.min}) for st in staged]
    ahead = IfThenElse(LT(nxt, end), seq(*[subst(st.load(), {k: nxt}) for st in staged]), None)
    inner = seq(*[st.write() for st in staged], ahead, *rest)
    for a in reversed(wrappers):
        inner = Allocate(a.buffer, inner)
    ann = {key: v for key, v in loop.annotation_dict.items() if key != ANN_REGISTER_PREFETCH}
    out = seq(*prologue, For(loop.loop_var, loop.min, loop.extent, loop.kind, inner,
                             loop.thread_tag, ann))
    for st in reversed(staged):
        out = Allocate(st.buffer, out)
    return out


class _Inject(IRMutator):
    def visit_For(self, f):
        f = self.generic_visit(f)
        if f.kind == "serial" and f.annotation_dict.get(ANN_REGISTER_PREFETCH):
            out = _pipeline(f)
            if out is not None:
                return out
        return f


@prim_func_pass
def InjectRegisterPrefetch(func: PrimFunc) -> PrimFunc:
    """Apply the register prefetch of the module docstring to every annotated loop of the flat
    ``func``."""
    body = _Inject().visit(func.body)
    return func if body is func.body else func.replace(body=body)


__all__ = ["InjectRegisterPrefetch", "ANN_REGISTER_PREFETCH", "MAX_STAGING"]
