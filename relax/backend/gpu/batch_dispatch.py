"""Two schedules of one GPU kernel, chosen at run time by its symbolic batch.

One build of a model serves every batch, but the GEMM tile that fills a GPU at batch 1 (small
register tiles, many work-groups) wastes it at batch 16, and the tile that is efficient at
batch 16 leaves most multiprocessors idle at batch 1. So a GEMM-like kernel whose batch is a
symbolic loop on ``blockIdx.z`` gets both: the tile sized for batch 1 and the tile sized for
``GEMM_NOMINAL_BATCH``, in one PrimFunc as ``if batch < threshold: <small> else: <large>``.
The condition is over a symbolic dim only, so ``split_host_device`` keeps it in the host
program: each call evaluates it and launches one of the two kernels (no extra launch, no test
inside a kernel).

- ``symbolic_batch(func)``: the Var on ``blockIdx.z`` of a scheduled function, or None;
- ``by_batch(batch, threshold, small, large)``: the function that runs ``small`` below the
  threshold and ``large`` from it on.

Examples
--------
>>> from tilecraft.tensorir import te
>>> from tilecraft.tensorir.schedule import Schedule
>>> n = te.var("n")
>>> A = te.placeholder((n, 64), "float32", "A")
>>> B = te.compute((n, 64), lambda b, i: A[b, i] * 2.0, "B")
>>> func = te.create_prim_func([A, B])
>>> def bound(split):
...     sch = Schedule(func)
...     b, i = sch.get_loops(sch.get_block("B"))
...     sch.bind(b, "blockIdx.z")
...     io, ii = sch.split(i, [None, split])
...     sch.bind(io, "blockIdx.x")
...     sch.bind(ii, "threadIdx.x")
...     return sch.func
>>> f = by_batch(symbolic_batch(bound(32)), 4, bound(32), bound(64))
>>> "if n < 4" in f.script()
True
"""
from __future__ import annotations

from tilecraft.tensorir.expr import LT, IntImm, Var
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import Block, BlockRealize, For, IfThenElse

__all__ = ["symbolic_batch", "by_batch"]


def symbolic_batch(func: PrimFunc) -> Var | None:
    """The symbolic dim that is the extent of ``func``'s ``blockIdx.z`` loops (all of them the
    same Var), else None."""
    found = []

    def visit(n):
        if isinstance(n, For) and n.kind == "thread_binding" and n.thread_tag == "blockIdx.z":
            found.append(n.extent)
    post_order_visit(func.body, visit)
    if not found or not all(isinstance(e, Var) and e is found[0] for e in found):
        return None
    return found[0]


def _root(func: PrimFunc) -> BlockRealize:
    body = func.body
    if not isinstance(body, BlockRealize) or body.block.iter_vars:
        raise ValueError(f"{func.attr_dict.get('global_symbol', 'function')}: not a function "
                         f"with a root block")
    return body


def _identities(x) -> list:
    """The ids of the nodes in a (nested) parameter list or buffer map (nodes compare by
    building expressions, not by ==)."""
    if isinstance(x, dict):
        x = list(x.items())
    if isinstance(x, (list, tuple)):
        return [_identities(v) for v in x]
    return id(x)


def by_batch(batch: Var, threshold: int, small: PrimFunc, large: PrimFunc) -> PrimFunc:
    """One function running ``small``'s body when ``batch < threshold``, else ``large``'s.

    ``small`` and ``large`` must be schedules of the same function (the same parameters and
    buffers); their root blocks' allocations are merged (each branch uses its own).
    """
    if _identities(small.params) != _identities(large.params) or \
            _identities(small.buffer_map) != _identities(large.buffer_map):
        raise ValueError("by_batch: the two functions have different parameters")
    rs, rl = _root(small), _root(large)
    s, lg = rs.block, rl.block
    cond = LT(batch, IntImm(threshold, batch.dtype))
    root = Block(s.name, s.iter_vars, s.reads, s.writes, IfThenElse(cond, s.body, lg.body),
                 None, tuple(s.alloc_buffers) + tuple(lg.alloc_buffers), dict(s.annotations))
    return small.replace(body=BlockRealize(rs.iter_values, rs.predicate, root))
