"""Hand schedules for row softmax and log-softmax on CPUs, and their TE definitions.

The kernels reduce over the last axis (TOPI's structure and block names)::

    T_softmax_maxelem[i] = max_k x[i, k]
    T_softmax_exp[i, k]  = exp(x[i, k] - T_softmax_maxelem[i])
    T_softmax_expsum[i]  = sum_k T_softmax_exp[i, k]
    T_softmax_norm[i, k] = T_softmax_exp[i, k] / T_softmax_expsum[i]

``schedule_softmax`` works on that structure whatever the names: rows run in parallel, one row
per task with everything it needs computed under the row loop (a row stays in L1 between its
passes); the elementwise ``exp`` is inlined into both consumers (computing it twice is cheaper
than writing and re-reading it), and each reduction is vectorized through ``rfactor``: a partial
result per vector lane (in a ``local`` buffer that the code generator keeps in a register),
then one reduction over the lanes.

Examples
--------
>>> from tilecraft import targets
>>> from tilecraft.tensorir import Schedule
>>> from benchmarks.schedules import softmax
>>> sch = Schedule(softmax.softmax_func(("n", 1024)))
>>> softmax.schedule_softmax(sch, targets.Target("llvm"))
>>> mod = targets.build(sch.mod, "llvm")                    # doctest: +SKIP
"""
from __future__ import annotations

from tilecraft.tensorir import te
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import free_vars
from tilecraft.tensorir.schedule import BlockRV, Schedule, ScheduleError
from tilecraft.tensorir.schedule import tree

from .elementwise import (const_int, inline_injective, is_output_block, is_spatial, vector_lanes)


# ----------------------------------------------------------------------------------------------
# TE definitions


def _shape(shape) -> tuple:
    """A shape whose string entries become symbolic dims (``("n", 1024)``)."""
    return tuple(te.var(d) if isinstance(d, str) else d for d in shape)


def softmax_func(shape, dtype: str = "float32") -> PrimFunc:
    """Softmax over the last axis of a tensor of ``shape`` (strings are symbolic dims).

    Examples
    --------
    >>> f = softmax_func(("n", 1024))
    """
    shape = _shape(shape)
    x = te.placeholder(shape, dtype, "x")
    *rows, cols = shape
    k1 = te.reduce_axis((0, cols), "k")
    mx = te.compute(tuple(rows), lambda *i: te.max(x[i + (k1,)], axis=k1), "T_softmax_maxelem")
    ex = te.compute(shape, lambda *i: te.exp(x[i] - mx[i[:-1]]), "T_softmax_exp")
    k2 = te.reduce_axis((0, cols), "k")
    sm = te.compute(tuple(rows), lambda *i: te.sum(ex[i + (k2,)], axis=k2), "T_softmax_expsum")
    out = te.compute(shape, lambda *i: ex[i] / sm[i[:-1]], "T_softmax_norm")
    return te.create_prim_func([x, out])


def log_softmax_func(shape, dtype: str = "float32") -> PrimFunc:
    """Log-softmax over the last axis: ``x - max - log(sum(exp(x - max)))``.

    Examples
    --------
    >>> f = log_softmax_func((8, "m"))
    """
    shape = _shape(shape)
    x = te.placeholder(shape, dtype, "x")
    *rows, cols = shape
    k1 = te.reduce_axis((0, cols), "k")
    mx = te.compute(tuple(rows), lambda *i: te.max(x[i + (k1,)], axis=k1),
                    "T_log_softmax_maxelem")
    k2 = te.reduce_axis((0, cols), "k")
    sm = te.compute(tuple(rows), lambda *i: te.sum(te.exp(x[i + (k2,)] - mx[i]), axis=k2),
                    "T_log_softmax_expsum")
    out = te.compute(shape, lambda *i: x[i] - mx[i[:-1]] - te.log(sm[i[:-1]]),
                     "T_log_softmax_norm")
    return te.create_prim_func([x, out])


# ----------------------------------------------------------------------------------------------
# the schedule


def _reduce_loop_index(sch: Schedule, block: BlockRV, loops) -> list[int]:
    """Positions in ``loops`` of the loops that feed the block's reduce iter vars."""
    br, _ = tree.find_block(sch.func, sch.get(block).name)
    used = set()
    for iv, value in zip(br.block.iter_vars, br.iter_values):
        if iv.kind == "reduce":
            used |= {id(v) for v in free_vars(value)}
    return [k for k, l in enumerate(loops) if id(sch.get(l).loop_var) in used]


def schedule_row_reduction(sch: Schedule, target, *, lanes: int | None = None) -> None:
    """Schedule a function made of reductions over the last axis and elementwise blocks
    consuming them, ending in one elementwise output block (softmax, log-softmax, layer norm
    statistics with their normalization, ...).

    1. intermediate elementwise blocks are inlined;
    2. each reduction's innermost (reduce) loop is split by the vector lanes ``L`` and
       ``rfactor``-ed, so the partial results of a row are one vector;
    3. the output block's row loops are fused and run in parallel, its last axis vectorized;
    4. every other block is computed at the row loop (consumers first), the partial-result
       loops reordered to put the lanes innermost and vectorized, their inits split out
       (``decompose_reduction``) and vectorized, their buffers made ``local``.

    A last axis of constant extent below ``2 L`` keeps scalar reductions (still one row per
    task). Symbolic dims (rows and the last axis) are supported: the split's tail becomes a
    predicate.

    Parameters
    ----------
    sch : Schedule
        A schedule of such a function (e.g. ``softmax_func``), not yet scheduled.
    target : targets.Target or str
        Sets the vector lanes.
    lanes : int, optional
        Override the vector lanes.

    Examples
    --------
    ``schedule_row_reduction(sch, "llvm")`` on ``softmax_func((4096, 1024))`` gives::

        for i0 in T.parallel(4096):
            for ax0_init in T.vectorized(16):
                with T.block("T_softmax_maxelem_rf_init"): ...
            for ax1 in range(64):
                for ax0 in T.vectorized(16):
                    with T.block("T_softmax_maxelem_rf"): ...      # max of 16 lanes at a time
            for ax0 in range(16):
                with T.block("T_softmax_maxelem"): ...             # max over the lanes
            ...                                                     # the same for expsum
            for i1_0 in range(64):
                for i1_1 in T.vectorized(16):
                    with T.block("T_softmax_norm"): ...
    """
    prim = "schedule_row_reduction"
    root = sch.get_block("root")
    blocks = sch.get_child_blocks(root)
    # check everything first, so a function of another shape is left as it was
    outs = [b for b in blocks if is_output_block(sch, b)]
    if len(outs) != 1 or not is_spatial(sch, outs[0]) or sch.get(outs[0]).name != \
            sch.get(blocks[-1]).name:
        raise ScheduleError(prim, "expected one elementwise output block at the end, got "
                            f"{[sch.get(b).name for b in blocks]}")
    out = outs[0]
    out_loops = sch.get_loops(out)
    if len(out_loops) < 2:
        raise ScheduleError(prim, f"block {sch.get(out).name} has no row axis to parallelize")
    for b in blocks:
        if not is_spatial(sch, b):
            loops = sch.get_loops(b)
            if _reduce_loop_index(sch, b, loops) != [len(loops) - 1]:
                raise ScheduleError(prim, f"block {sch.get(b).name} must reduce over its "
                                    f"innermost loop only")
    inline_injective(sch)
    blocks = sch.get_child_blocks(root)
    dtype = sch.get(out).writes[0].buffer.dtype
    lanes = lanes or vector_lanes(target, dtype)
    cols = const_int(sch.get(out_loops[-1]).extent)
    vector_reduce = cols is None or cols >= 2 * lanes
    # computing everything at the row loop needs whole vectors: compute_at cannot move a block
    # whose predicate (the split's tail) relates its iter vars
    fused = cols is not None and (not vector_reduce or cols % lanes == 0)

    # 2. rfactor the reductions (each needs its loop nest to itself: before compute_at)
    rf_blocks = []
    for b in blocks:
        if is_spatial(sch, b):
            continue
        loops = sch.get_loops(b)
        if vector_reduce:
            _, ki = sch.split(loops[-1], [None, lanes])
            rf_blocks.append(sch.rfactor(ki, -1))

    # 3. the output block: parallel rows, vectorized columns
    row = _parallel_rows_vector_cols(sch, out, lanes)

    # 4. everything else under the row loop, consumers first -- or, with a tail, in loop nests
    # of their own (each parallel over the rows)
    if fused:
        for b in reversed(sch.get_child_blocks(root)[:-1]):
            sch.compute_at(b, row)
    else:
        rf_names = {sch.get(rf).name for rf in rf_blocks}
        for b in sch.get_child_blocks(root)[:-1]:
            loops = sch.get_loops(b)
            n_rows = len(loops) - (2 if sch.get(b).name in rf_names else 1)
            if n_rows > 0:
                sch.parallel(sch.fuse(*loops[:n_rows]) if n_rows > 1 else loops[0])
    for rf in rf_blocks:
        loops = sch.get_loops(rf)
        (k,) = _reduce_loop_index(sch, rf, loops)
        (lane_loop,) = [l for j, l in enumerate(loops)
                        if j != k and sch.get(l).kind != "parallel"]
        if loops.index(lane_loop) < k:
            sch.reorder(loops[k], lane_loop)
        init = sch.decompose_reduction(rf, loops[k])
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(lane_loop)
        sch.set_scope(rf, 0, "local")


def _parallel_rows_vector_cols(sch: Schedule, block: BlockRV, lanes: int):
    """Fuse the row loops of ``block`` into a parallel loop, vectorize its last loop."""
    *rows, col = sch.get_loops(block)
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    cols = const_int(sch.get(col).extent)
    if cols is not None and cols <= lanes:
        sch.vectorize(col)
    else:
        _, ci = sch.split(col, [None, lanes])
        sch.vectorize(ci)
    sch.parallel(row)
    return row


def schedule_softmax(sch: Schedule, target, *, lanes: int | None = None) -> None:
    """Schedule ``softmax_func`` / ``log_softmax_func`` (or a legalized softmax of the same
    structure); see ``schedule_row_reduction``.

    Examples
    --------
    >>> sch = Schedule(softmax_func((4096, 1024)))
    >>> schedule_softmax(sch, "llvm")
    """
    schedule_row_reduction(sch, target, lanes=lanes)
