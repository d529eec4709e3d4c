"""Questions the rules, postprocessors and mutators ask about blocks and loops.

All helpers read the schedule's current function; none of them changes it or records anything
in the trace (they use ``sch.get`` and the tree utilities, not traced primitives).
"""
from __future__ import annotations

from dataclasses import dataclass

from tilecraft.tensorir.expr import BufferLoad, Call, IntImm, PrimExpr, Select, Var
from tilecraft.tensorir.functor import free_vars, post_order_visit
from tilecraft.tensorir.schedule import BlockRV, LoopRV, Schedule, ScheduleError
from tilecraft.tensorir.schedule import tree
from tilecraft.tensorir.schedule.sampling import representative_extent
from tilecraft.tensorir.stmt import Block, BlockRealize, For, IfThenElse


@dataclass
class BlockInfo:
    """A block with its realize, ancestors and the loops between it and its scope block."""

    realize: BlockRealize
    ancestors: tuple
    loops: list[For]

    @property
    def block(self) -> Block:
        return self.realize.block


def has_block(sch: Schedule, block: BlockRV) -> bool:
    """Whether ``block`` still names a block of ``sch`` (inlining removes blocks)."""
    try:
        sch.get(block)
        return True
    except ScheduleError:
        return False


def block_info(sch: Schedule, block: BlockRV) -> BlockInfo:
    br, anc = tree.find_block(sch.func, sch.get(block).name)
    return BlockInfo(br, anc, tree.loops_between(anc))


def find_block_info(func, name: str) -> BlockInfo:
    br, anc = tree.find_block(func, name)
    return BlockInfo(br, anc, tree.loops_between(anc))


def is_root(info: BlockInfo) -> bool:
    return not info.ancestors or not info.block.iter_vars and tree.enclosing_block(
        info.ancestors) is None


def is_subroot(info: BlockInfo) -> bool:
    """A block directly under the root block (loops in between are fine)."""
    scope = tree.enclosing_block(info.ancestors)
    return scope is not None and tree.enclosing_block(
        info.ancestors[:info.ancestors.index(scope)]) is None


def param_buffer_ids(func) -> set[int]:
    return {id(b) for b in func.buffers}


def is_output_block(func, block: Block) -> bool:
    """The block writes a buffer of the function's parameters."""
    params = param_buffer_ids(func)
    return any(id(w.buffer) in params for w in block.writes)


def is_spatial(block: Block) -> bool:
    return all(iv.kind == "spatial" for iv in block.iter_vars)


def is_reduction(block: Block) -> bool:
    return block.init is not None or any(iv.kind == "reduce" for iv in block.iter_vars)


def loop_iter_kinds(info: BlockInfo) -> list[str | None]:
    """For each loop above the block: "S" when it feeds only spatial iter vars, "R" when only
    reduce ones, "SR" when both, None when none (the block repeats under it)."""
    kinds = []
    for loop in info.loops:
        used = set()
        for iv, value in zip(info.block.iter_vars, info.realize.iter_values):
            if any(v is loop.loop_var for v in free_vars(value)):
                used.add(iv.kind)
        kinds.append({frozenset({"spatial"}): "S", frozenset({"reduce"}): "R",
                      frozenset({"spatial", "reduce"}): "SR"}.get(frozenset(used)))
    return kinds


def trivial_binding(info: BlockInfo) -> dict | None:
    """iter var -> its loop when every iter value is one loop variable of a distinct loop of
    extent equal to the iter var's domain; else None."""
    loops_by_var = {id(l.loop_var): l for l in info.loops}
    out = {}
    used = set()
    for iv, value in zip(info.block.iter_vars, info.realize.iter_values):
        if not isinstance(value, Var) or id(value) not in loops_by_var or id(value) in used:
            return None
        used.add(id(value))
        out[iv.var] = loops_by_var[id(value)]
    return out


def uses_var(expr, var: Var) -> bool:
    return any(v is var for v in free_vars(expr))


def read_loads(block: Block) -> list[BufferLoad]:
    """Every BufferLoad in the block body (not the init)."""
    out = []
    post_order_visit(block.body, lambda n: out.append(n) if isinstance(n, BufferLoad) else None)
    return out


def has_data_reuse(block: Block) -> bool:
    """Some read of the block misses a spatial iter var: the same data serves several outputs
    (what makes multi-level tiling pay off, TVM's ``NeedsMultiLevelTiling``)."""
    spatial = [iv.var for iv in block.iter_vars if iv.kind == "spatial"]
    written = {id(w.buffer) for w in block.writes}
    for r in block.reads:
        if id(r.buffer) in written:
            continue
        region_vars = set()
        for rng in r.region:
            region_vars.update(id(v) for v in free_vars(rng.min))
        if any(id(v) not in region_vars for v in spatial):
            return True
    return False


def contains_op(block: Block, names) -> bool:
    """The block body calls one of the intrinsics ``names`` (e.g. ``exp``)."""
    found = []

    def visit(n):
        if isinstance(n, Call) and n.op in names:
            found.append(n)
    post_order_visit(block.body, visit)
    return bool(found)


def has_if_then_else(block: Block) -> bool:
    """An ``if_then_else`` call, ``Select`` or ``IfThenElse`` statement in the body (padding)."""
    found = []

    def visit(n):
        if isinstance(n, (Select, IfThenElse)) or (isinstance(n, Call) and
                                                   n.op == "if_then_else"):
            found.append(n)
    post_order_visit(block.body, visit)
    return bool(found)


def extent_value(loop: For, hints: dict | None) -> int | None:
    """The loop's extent at the representative shape values (None when still symbolic)."""
    return representative_extent(loop.extent, hints)


def const_extent(loop: For) -> int | None:
    return loop.extent.value if isinstance(loop.extent, IntImm) else None


def consumers_of(sch: Schedule, info: BlockInfo) -> list[BlockRealize]:
    """Sibling blocks after ``info``'s block that read a buffer it writes."""
    scope = tree.enclosing_block(info.ancestors)
    if scope is None:
        return []
    siblings = tree.child_block_realizes(scope)
    idx = next((i for i, s in enumerate(siblings) if s is info.realize), None)
    if idx is None:
        return []
    written = {id(w.buffer) for w in info.block.writes}
    return [s for s in siblings[idx + 1:] if any(id(r.buffer) in written for r in s.block.reads)]


def elementwise_consumer(sch: Schedule, info: BlockInfo) -> str | None:
    """The name of the single consumer of ``info``'s (single) output, if that consumer is
    spatial and reads the output at exactly its own iter vars in order (``D[i, j] = f(C[i, j],
    ...)``) -- an epilogue that can be computed on each output tile."""
    if len(info.block.writes) != 1:
        return None
    out = info.block.writes[0].buffer
    cons = consumers_of(sch, info)
    if len(cons) != 1:
        return None
    c = cons[0].block
    if not is_spatial(c) or len(c.writes) != 1:
        return None
    ivars = [iv.var for iv in c.iter_vars]
    loads = [ld for ld in read_loads(c) if ld.buffer is out]
    if not loads or len(ivars) != len(out.shape):
        return None
    for ld in loads:
        if len(ld.indices) != len(ivars) or any(i is not v for i, v in zip(ld.indices, ivars)):
            return None
    return c.name


def loop_rvs_of(sch: Schedule, block: BlockRV) -> list[LoopRV]:
    """``sch.get_loops(block)`` (traced: the returned RVs are usable by later primitives)."""
    return sch.get_loops(block)


def thread_tag(loop: For) -> str | None:
    return loop.thread_tag if loop.kind == "thread_binding" else None


def is_thread_bound(info: BlockInfo) -> bool:
    """The block sits under a thread-bound loop (or is inside a block that does)."""
    return any(isinstance(a, For) and a.kind == "thread_binding" for a in info.ancestors)


def as_int(e: PrimExpr | int) -> int | None:
    if isinstance(e, int):
        return e
    return e.value if isinstance(e, IntImm) else None


def all_blocks(func) -> list[BlockRealize]:
    """Every BlockRealize of ``func`` except the root's, in program order."""
    return [br for br in tree.all_blocks(func) if br is not func.body]
