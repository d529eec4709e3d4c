"""Schedule helpers shared by the GPU default schedules (``relax.gpu_schedules``) and the GPU
kernel families: loop extents (a symbolic one counts as ``SYMBOLIC``), block kinds, a block's
spatial and reduction loops and the loop nesting.

Examples
--------
>>> from tilecraft.tensorir import te
>>> from tilecraft.tensorir.schedule import Schedule, ScheduleError
>>> A = te.placeholder((64, 32), "float32", "A")
>>> k = te.reduce_axis((0, 32), "k")
>>> B = te.compute((64,), lambda i: te.sum(A[i, k], axis=k), "B")
>>> sch = Schedule(te.create_prim_func([A, B]))
>>> [loop_extent(node_of(sch, lp)) for lp in spatial_loops(sch, sch.get_block("B"))[1]]
[32]
"""
from __future__ import annotations

from tilecraft.tensorir.expr import IntImm
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.stmt import Block, BlockRealize, For
from tilecraft.tensorir.transform._common import uses_any

__all__ = ["SYMBOLIC", "KEEP_STAGE", "inline_spatial_producers", "node_of", "loop_extent", "is_reduction", "is_spatial", "spatial_loops",
           "iter_values", "is_under", "keeps_stage"]

SYMBOLIC = 1 << 20     # what a symbolic extent counts as when sizing tiles
# A block annotation: the spatial block stays a kernel of its own, not inlined into its
# consumer (a Winograd input transform, which the GEMM's fetch would recompute for every tile
# of output channels).
KEEP_STAGE = "tilecraft.gpu_keep_stage"


def keeps_stage(block: Block) -> bool:
    """Whether ``block`` carries ``KEEP_STAGE`` (see there)."""
    value = dict(block.annotations or {}).get(KEEP_STAGE)
    return bool(getattr(value, "value", value))


def node_of(sch: Schedule, rv) -> Block | For:
    """The node (``Block`` or ``For``) the random variable ``rv`` stands for."""
    return sch.get(rv)


def loop_extent(loop: For) -> int:
    """The constant extent of ``loop``; ``SYMBOLIC`` for a symbolic one."""
    return loop.extent.value if isinstance(loop.extent, IntImm) else SYMBOLIC


def is_reduction(block: Block) -> bool:
    """Whether ``block`` has a reduction iter var."""
    return any(iv.kind == "reduce" for iv in block.iter_vars)


def is_spatial(block: Block) -> bool:
    """Whether ``block`` has no reduction iter var."""
    return not is_reduction(block)


def spatial_loops(sch: Schedule, block):
    """(spatial loops, reduce loops) of a block in te form (spatial loops outermost)."""
    node = node_of(sch, block)
    loops = sch.get_loops(block)
    realize_vals = iter_values(sch, block)
    rvars = [v for iv, v in zip(node.iter_vars, realize_vals) if iv.kind == "reduce"]
    spatial, reduce = [], []
    for lp in loops:
        var = node_of(sch, lp).loop_var
        (reduce if any(uses_any(v, [var]) for v in rvars) else spatial).append(lp)
    return spatial, reduce


def iter_values(sch: Schedule, block):
    """The values bound to ``block``'s iter vars (in terms of the loop variables)."""
    node = node_of(sch, block)
    found = []

    def visit(n):
        if isinstance(n, BlockRealize) and n.block is node:
            found.append(n)
    post_order_visit(sch.func.body, visit)
    return found[0].iter_values if found else ()


def is_under(sch: Schedule, loop, ancestor) -> bool:
    """Whether ``loop`` is nested (at any depth) in the body of the loop ``ancestor``."""
    anc = node_of(sch, ancestor)
    found = False

    def visit(n):
        nonlocal found
        if n is node_of(sch, loop):
            found = True
    post_order_visit(anc.body, visit)
    return found


def inline_spatial_producers(sch: Schedule, keep=lambda node: False) -> None:
    """Inline every spatial block that has consumers (casts, bias adds, activations, paddings)
    into them (``compute_inline``) until none is left, except the blocks ``keep(node)`` names;
    a block that cannot be inlined stays where it is."""
    changed = True
    while changed:
        changed = False
        root = sch.get_root()
        blocks = sch.get_child_blocks(sch.get_block(root.name)) if root is not None else []
        for b in blocks[:-1]:
            node = node_of(sch, b)
            if keep(node) or not (is_spatial(node) and sch.get_consumers(b)):
                continue
            try:
                sch.compute_inline(b)
                changed = True
                break
            except ScheduleError:
                pass
