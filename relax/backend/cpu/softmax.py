"""Softmax over the last axis in one pass per row: ``relax.op.nn.te_softmax``'s four blocks
(the row's max, ``exp(x - max)``, the row's sum, ``exp / sum``) computed row by row, so that
the row's ``exp`` stays in L1 between its three uses (a 128- to 1024-float row is 0.5-4 KB;
the generic rules ran four passes over the whole tensor, the ``exp`` written to memory and
read twice), and each row reduction runs on a vector of ``lanes`` partial results
(``rfactor``) reduced to one value at the row's end (the generic rules: a scalar chain over
the row, four rows interleaved).

A symbolic or ragged row takes the same partial results, its last vector masked: ``rfactor``
over the row split by the lanes leaves the tail's predicate on the partial results
(``vk_0 * 16 + vk_1 < s``) and on the write-back (``vk_1 < s``); ``compute_at`` keeps a
predicate it can write over the block's iter vars, and the LLVM code generator writes the masked
step on the partial results (a stack buffer) as a blend it keeps in a register. A constant row
shorter than ``RAGGED_VECTOR_MIN`` vectors and not a multiple of the lanes takes the one pass
over groups of ``ROW_GROUP`` rows instead, the row reductions scalar, the groups' rows
interleaved (four independent chains). A softmax over another axis keeps the generic rules. A
fused kernel holding a softmax (BERT's ``divide``, ``add`` and ``softmax``) is one too: its
cheap elementwise producers are inlined into the max and the ``exp`` first
(``default_schedules``).

Measured on ``intel-avx512`` (one thread, thread CPU time, medians of 15 interleaved rounds,
load 0.8-2.0), against the generic rules: 8 x 4 x 128 x 128 (BERT's attention scores at 8 x
128) 0.72-0.76 -> 0.37-0.43 ms, PyTorch eager 0.33-0.39; 3 x 5 x 1024 0.026 -> 0.013 ms. The
fused ``softmax(x / 8 - 1)`` over a symbolic ``(n, 4, s, s)`` (``benchmarks.softmax_cpu``,
load 1.7-3.3): at 8 x 128 0.42-0.52 ms (the row groups it replaces: 0.68-0.72; concrete
0.34-0.42), at 2 x 384 1.00 ms (row groups 1.48; concrete 0.89).

Examples
--------
>>> from tilecraft.tensorir import te
>>> from tilecraft.relax.op.nn.activation import te_softmax
>>> x = te.placeholder((4, 96), "float32", "x")
>>> sch = Schedule(te.create_prim_func([x, te_softmax(x, -1)]))
>>> schedule_softmax_rows(sch, Target("llvm"))
True
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir.schedule import Schedule, ScheduleError, Trace
from tilecraft.tensorir.stmt import BlockRealize

from .schedule_utils import (MIN_PARALLEL_WORK, block_lanes, loop_extent, loop_nodes,
                             loop_work, parallel_outer, root_children,
                             vectorize_partials)

__all__ = ["ROW_GROUP", "softmax_blocks", "schedule_softmax_rows"]

# te_softmax's block names (``out_name`` may add a ``_<k>`` suffix when an input is so named)
_PARTS = ("T_softmax_max", "T_softmax_exp", "T_softmax_sum", "T_softmax")


def _base(name: str) -> str:
    """``name`` without ``out_name``'s ``_<k>`` suffix."""
    head, _, tail = name.rpartition("_")
    return head if tail.isdigit() and head else name


def softmax_blocks(children: list[BlockRealize]) -> list[str] | None:
    """The names of a softmax's four blocks (max, exp, sum, result), when ``children`` (the
    root's blocks, after inlining) are exactly those, reducing over the last axis; else None.

    Examples
    --------
    >>> softmax_blocks([])
    """
    names = [br.block.name for br in children]
    if len(names) != 4 or [_base(n) for n in names] != list(_PARTS):
        return None
    mx, _, sm, _ = (br.block for br in children)
    for red in (mx, sm):
        kinds = [iv.kind for iv in red.iter_vars]
        # (spatial..., the kept axis of extent 1, reduce): the last axis is the one reduced
        if kinds[-1] != "reduce" or kinds.count("reduce") != 1:
            return None
        if loop_extent_of(red.iter_vars[-2]) != 1:
            return None
    return names


def loop_extent_of(iv) -> int | None:
    """The constant extent of the iter var ``iv``, or None."""
    ext = iv.dom.extent
    return getattr(ext, "value", None)


def _factor_row_reduction(sch: Schedule, name: str, lanes: int):
    """Split the row reduction ``name`` (its innermost loop) into ``lanes`` partial results:
    ``<name>_rf[.., l] = op over ko of f(x[.., ko * lanes + l])`` (returned), and ``name``
    reducing those ``lanes`` values to the row's."""
    block = sch.get_block(name)
    ko, ki = sch.split(sch.get_loops(block)[-1], [None, lanes])
    return sch.rfactor(ki, -1)


def schedule_softmax_rows(sch: Schedule, target: Target) -> bool:
    """Schedule a softmax over the last axis (``softmax_blocks``) row by row: its max, ``exp``
    and sum computed at the result's row loop, the row's ``exp`` in a local buffer, the ``exp``
    and the division vectorized; the row reductions on vectors of partial results (the last
    one masked where the row is symbolic or ragged), except on a short ragged constant row:
    there over groups of ``ROW_GROUP`` rows interleaved; the rows in parallel where there is
    the work for it. Returns False, ``sch`` unchanged, where it does not apply.

    Examples
    --------
    >>> from tilecraft.tensorir import te
    >>> from tilecraft.relax.op.nn.activation import te_softmax
    >>> x = te.placeholder((te.var("n"), 128), "float32", "x")
    >>> sch = Schedule(te.create_prim_func([x, te_softmax(x, -1)]))
    >>> schedule_softmax_rows(sch, Target("llvm"))
    True
    """
    names = softmax_blocks(root_children(sch))
    if names is None:
        return False
    lanes = block_lanes(sch.get(sch.get_block(names[-1])), target)
    loops = sch.get_loops(sch.get_block(names[-1]))
    width = loop_extent(sch.get(loops[-1]))
    if len(loops) < 2:
        return False
    # all or nothing: on a copy, replayed here once every step has succeeded
    trial = sch.copy()
    done = len(trial.trace.instructions)
    try:
        if width is not None and width % lanes and width < RAGGED_VECTOR_MIN * lanes:
            _schedule_row_groups(trial, names)
        else:
            _schedule_rows(trial, names, lanes)
    except ScheduleError:
        return False
    sch.replay(Trace(trial.trace.instructions[done:]))
    return True


def _schedule_rows(sch: Schedule, names: list[str], lanes: int) -> None:
    """The one pass over each row, its reductions on ``lanes`` partial results (on a row not
    a multiple of ``lanes``, the last vector masked by ``rfactor``'s tail predicate, which
    ``compute_at`` keeps)."""
    mx, ex, sm, out = names
    loops = sch.get_loops(sch.get_block(out))
    rows, col = loops[:-1], loops[-1]
    mx_rf = _factor_row_reduction(sch, mx, lanes)
    sm_rf = _factor_row_reduction(sch, sm, lanes)
    # consumers first: each block's readers must already sit under the row loop
    for block in (sch.get_block(sm), sm_rf, sch.get_block(ex), sch.get_block(mx), mx_rf):
        sch.compute_at(block, rows[-1])
    # the row's exp (compacted to one row), its max and sum: registers and L1
    for name in (ex, mx, sm):
        sch.set_scope(sch.get_block(name), 0, "local")
    sch.vectorize(sch.get_loops(sch.get_block(ex))[-1])
    sch.vectorize(col)
    vectorize_partials(sch, mx_rf)
    vectorize_partials(sch, sm_rf)
    if loop_work(loop_nodes(sch, sch.get_loops(sch.get_block(out)))) >= MIN_PARALLEL_WORK:
        sch.parallel(_outermost_groups(sch, rows))


# a constant ragged row takes the vector partial results from this many vectors: 8 x 4 x 100 x
# 100 0.42 -> 0.35 ms, but at 17 (one vector and a lane) the row groups are faster (1 x 4 x 17 x
# 17: 7.4 against 8.5 us)
RAGGED_VECTOR_MIN = 2

# rows whose scalar reductions interleave on a short row (8 ran slower: 0.74
# against 0.68 ms at 8 x 4 x 128 x 128)
ROW_GROUP = 4


def _schedule_row_groups(sch: Schedule, names: list[str]) -> None:
    """The one pass over groups of ``ROW_GROUP`` rows: the reductions' row loop innermost and
    unrolled (independent scalar chains), the ``exp`` and the division vectorized over the
    row (its tail masked); the groups in parallel where there is the work for it."""
    mx, ex, sm, out = names
    loops = sch.get_loops(sch.get_block(out))
    rows, col = loops[:-1], loops[-1]
    ro, ri = sch.split(rows[-1], [None, ROW_GROUP])
    for name in (sm, ex, mx):
        sch.compute_at(sch.get_block(name), ro)
    for name in (mx, sm):
        block = sch.get_block(name)
        own = sch.get_loops(block)[len(rows):]
        sch.reorder(own[-1], *own[:-1])
        init = sch.decompose_reduction(block, sch.get_loops(block)[len(rows)])
        for rv in sch.get_loops(block)[len(rows) + 1:]:
            sch.unroll(rv)
        for rv in sch.get_loops(init)[len(rows):]:
            sch.unroll(rv)
    for name in (ex, mx, sm):
        sch.set_scope(sch.get_block(name), 0, "local")
    sch.vectorize(sch.get_loops(sch.get_block(ex))[-1])
    sch.vectorize(col)
    if loop_work(loop_nodes(sch, sch.get_loops(sch.get_block(out)))) >= MIN_PARALLEL_WORK:
        sch.parallel(_outermost_groups(sch, [*rows[:-1], ro]))


def _outermost_groups(sch: Schedule, outer: list):
    """The parallel loop over the row groups' ``outer`` loops: as
    ``default_schedules._outermost_parallel`` does for a spatial nest, the constant loops
    (BERT's heads) go outermost, fused, when the symbolic loops would otherwise run a parallel
    launch per iteration of theirs and the constant ones carry less than a launch's work."""
    const = [rv for rv in outer if loop_extent(sch.get(rv)) is not None]
    symbolic = [rv for rv in outer if loop_extent(sch.get(rv)) is None]
    work = 1
    for rv in const:
        work *= loop_extent(sch.get(rv))
    if not const or not symbolic or work >= MIN_PARALLEL_WORK:
        return parallel_outer(sch, outer)
    sch.reorder(*const, *symbolic)
    return sch.fuse(*const) if len(const) > 1 else const[0]
