"""Schedule helpers shared by the CPU default schedules (``relax.default_schedules``) and the
kernel families' schedules: loop extents and work estimates, vector lanes, the analyses of a
block's reads, and the steps every register tile ends with (the epilogue fused into the
write-back, the init and write-back blocks unrolled and vectorized).

Every helper takes a ``tensorir.schedule.Schedule`` and block or loop random variables (or the
nodes they stand for) and applies checked primitives only.

Examples
--------
>>> from tilecraft.tensorir import te
>>> from tilecraft.tensorir.schedule import Schedule
>>> A = te.placeholder((64, 32), "float32", "A")
>>> B = te.compute((64, 32), lambda i, j: A[i, j] + 1.0, "B")
>>> sch = Schedule(te.create_prim_func([A, B]))
>>> loop_work(loop_nodes(sch, sch.get_loops(sch.get_block("B"))))
2048
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import Add, BufferLoad, IntImm, Mul, PrimExpr, Sub, Var
from tilecraft.tensorir.functor import post_order_visit, substitute
from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.schedule import tree
from tilecraft.tensorir.stmt import Block, BlockRealize, For

from .registry import block_rule

__all__ = ["vectorize_partials", "MR", "MIN_PARALLEL_WORK", "SYMBOLIC_EXTENT", "VECTOR_STRIDES", "MAX_UNROLLED_FMAS",
           "root_children", "intermediate_buffers", "is_spatial", "ann_int", "loop_extent",
           "loop_work", "block_lanes", "loop_nodes", "input_indices", "strided_reads",
           "parallel_outer", "uses_var", "var_coeff", "fuse_epilogue", "tile_tail",
           "finish_tile_block", "core_balance", "conv_tile_block", "rows_per_output_row"]

MR = 6                    # rows of the register tile of matmul-like reductions and dense layers
MIN_PARALLEL_WORK = 4096  # output elements below which a parallel launch costs more than it saves
SYMBOLIC_EXTENT = 64      # what a symbolic extent counts as in the work estimate
VECTOR_STRIDES = (1, 2, 3, 4)   # input strides a vectorized loop reads without a gather
MAX_UNROLLED_FMAS = 256   # unroll a convolution's kernel rows too while the body stays this small


def root_children(sch: Schedule) -> list[BlockRealize]:
    """The block realizes directly under the root block of ``sch``'s function (one loop nest
    each in a ``te.create_prim_func`` kernel)."""
    body = sch.func.body
    if not isinstance(body, BlockRealize):
        return []
    return tree.child_block_realizes(body.block.body)


def intermediate_buffers(sch: Schedule) -> set:
    """The ids of the buffers the root block allocates (the kernel's intermediates)."""
    body = sch.func.body
    return {id(b) for b in body.block.alloc_buffers} if isinstance(body, BlockRealize) else set()


def is_spatial(block: Block) -> bool:
    """Whether every iter var of ``block`` is spatial (no reduction)."""
    return all(iv.kind == "spatial" for iv in block.iter_vars)


def ann_int(block: Block, key: str, default: int | None = None) -> int:
    """The integer annotation ``key`` of ``block`` (``default`` when it has none, if given)."""
    ann = dict(block.annotations or {})
    if key not in ann and default is not None:
        return default
    value = ann[key]
    return int(getattr(value, "value", value))


def loop_extent(loop: For) -> int | None:
    """The constant extent of ``loop``, or None when it is symbolic."""
    return loop.extent.value if isinstance(loop.extent, IntImm) else None


def loop_work(loops: list[For]) -> int:
    """The iterations of a nest of ``loops``, a symbolic extent counting as
    ``SYMBOLIC_EXTENT``."""
    w = 1
    for f in loops:
        e = loop_extent(f)
        w *= SYMBOLIC_EXTENT if e is None else e
    return w


def block_lanes(block: Block, target: Target) -> int:
    """The vector lanes of ``target`` for the widest element ``block`` writes (at least 4)."""
    bits = [8 if w.buffer.dtype == "bool" else dt.bits(w.buffer.dtype) for w in block.writes]
    return max(4, target.vector_width // max(bits or [32]))


def loop_nodes(sch: Schedule, rvs) -> list[For]:
    """The ``For`` nodes of the loop random variables ``rvs``."""
    return [sch.get(rv) for rv in rvs]


def input_indices(sch: Schedule, block_rv) -> list[list[PrimExpr]]:
    """The indices of each read of ``block_rv``'s inputs (not of what it writes), in terms of
    the loop variables. Reads of 0-d inputs are left out: one element, the same for every
    iteration, they constrain no loop (and have no last index to look at)."""
    blk = sch.get(block_rv)
    br = tree.find_block(sch.func, blk.name)[0]
    binding = {iv.var: value for iv, value in zip(blk.iter_vars, br.iter_values)}
    out = {id(w.buffer) for w in blk.writes}
    loads = []
    post_order_visit(blk.body, lambda n: loads.append(n) if isinstance(n, BufferLoad) else None)
    return [[substitute(e, binding) for e in ld.indices] for ld in loads
            if id(ld.buffer) not in out and ld.indices]


def strided_reads(sch: Schedule, block_rv, loop_rv) -> bool:
    """Whether vectorizing ``loop_rv`` would gather some input: its variable outside the last
    index (a transpose) or scaled in it by other than 1 to 4 (the code generator loads strides
    of 2 to 4 as one wide load and a shuffle). Gathers measured 50-70x slower than a scalar
    loop on this machine's AVX-512 (Zen 4), so such loops stay scalar (LLVM vectorizes them
    with shuffles where it can)."""
    var = sch.get(loop_rv).loop_var
    for idx in input_indices(sch, block_rv):
        for k, e in enumerate(idx):
            if uses_var(e, var) and (k != len(idx) - 1 or
                                     var_coeff(e, var) not in VECTOR_STRIDES):
                return True
    return False


def parallel_outer(sch: Schedule, loops: list):
    """The loop to run in parallel over the outer ``loops`` of a nest: the constant loops after
    the last symbolic one, fused, else that symbolic loop (the ones before it stay serial).
    A fused symbolic index (``f // 3584 < n``) is one the verifier cannot prove in bounds, and
    it keeps its check in the inner loop."""
    symbolic = [k for k, rv in enumerate(loops) if loop_extent(sch.get(rv)) is None]
    start = symbolic[-1] + 1 if symbolic else 0
    const = loops[start:]
    if not const:
        return loops[-1]
    return sch.fuse(*const) if len(const) > 1 else const[0]


def uses_var(e: PrimExpr, v: Var) -> bool:
    """Whether the expression ``e`` reads the variable ``v``."""
    found = []
    post_order_visit(e, lambda n: found.append(n) if n is v else None)
    return bool(found)


def var_coeff(e: PrimExpr, v: Var) -> int | None:
    """``c`` when ``e`` is ``c * v`` plus terms free of ``v`` (``ow * 2 + rw``), else None."""
    if e is v:
        return 1
    if isinstance(e, Mul):
        for k, other in ((e.a, e.b), (e.b, e.a)):
            if isinstance(k, IntImm):
                c = var_coeff(other, v)
                return None if c is None else c * k.value
        return None
    if isinstance(e, (Add, Sub)):
        ua, ub = uses_var(e.a, v), uses_var(e.b, v)
        if ua and ub:
            return None
        if ua:
            return var_coeff(e.a, v)
        c = var_coeff(e.b, v) if ub else None
        return None if c is None else (c if isinstance(e, Add) else -c)
    return None


def fuse_epilogue(sch: Schedule, write_back) -> None:
    """Compute an elementwise consumer of the tile's result (bias, activation) in the tile's
    write-back, from the accumulators, so the result never goes to memory before it: the
    consumer is inlined into the write-back (``reverse_compute_inline``) when it is the only
    reader of an intermediate result."""
    wb = sch.get(write_back)
    out = wb.writes[0].buffer
    if id(out) not in intermediate_buffers(sch):
        return
    readers = [br for br in root_children(sch) if br.block is not wb and
               any(r.buffer is out for r in br.block.reads)]
    if len(readers) != 1 or not is_spatial(readers[0].block):
        return
    try:
        sch.reverse_compute_inline(sch.get_block(readers[0].block.name))
    except ScheduleError:
        pass  # not elementwise over the result: it is scheduled on its own


def tile_tail(sch: Schedule, block_rv, outer_count: int) -> list:
    """The loops of ``block_rv`` below its first ``outer_count`` loops."""
    return sch.get_loops(block_rv)[outer_count:]


def finish_tile_block(sch: Schedule, block_rv, outer_count: int) -> None:
    """Unroll the constant loops of an init or write-back block inside a tile and vectorize its
    innermost loop."""
    own = tile_tail(sch, block_rv, outer_count)
    for rv in own[:-1]:
        if loop_extent(sch.get(rv)) is not None:
            sch.unroll(rv)
    if own:
        sch.vectorize(own[-1])


def core_balance(extent: int, cores: int, last: float = 1.0) -> float:
    """The share of the cores' time in use when a parallel loop of ``extent`` iterations runs
    in even chunks on ``cores`` cores (7 on 2: 0.875), its last iteration ``last`` of the
    others' work (a ragged tile)."""
    if cores <= 1 or extent <= 0:
        return 1.0
    return (extent - 1 + last) / (cores * -(-extent // cores))


def conv_tile_block(sch: Schedule, name: str, keys: tuple, count: int = 7):
    """(block, its integer annotations ``keys``, its ``count`` loops) of a packed 2-D
    convolution block (batch, three spatial loops, three reduction loops; two spatial loops
    over a flattened plane)."""
    block = sch.get_block(name)
    blk = sch.get(block)
    loops = sch.get_loops(block)
    if len(loops) != count:
        raise ScheduleError("conv2d", f"block {name}: unexpected loop nest", blk)
    return block, tuple(ann_int(blk, k) for k in keys), loops


def rows_per_output_row(sch: Schedule, block, rule: str, row_loops: list):
    """Run ``block``'s output rows (its ``row_loops``, fused) in parallel when the work pays
    for a launch, and compute its producer marked ``rule`` (the input rows one output row
    reads) inside that loop, so each output row's input rows are made just before they are
    read (from L1). Returns the producer."""
    producer = next(p for p in sch.get_producers(block) if block_rule(sch.get(p)) == rule)
    par = parallel_outer(sch, row_loops)
    if loop_work(loop_nodes(sch, sch.get_loops(block))) >= MIN_PARALLEL_WORK:
        sch.parallel(par)
    sch.compute_at(producer, par)
    return producer


def vectorize_partials(sch: Schedule, rf) -> None:
    """The partial reduction ``rf`` under the row loop: its init and its update vectorized
    over the ``lanes`` partial results (its innermost loop)."""
    ki, ko = sch.get_loops(rf)[-2:]
    sch.reorder(ko, ki)
    sch.set_scope(rf, 0, "local")
    init = sch.decompose_reduction(rf, ko)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(sch.get_loops(rf)[-1])
