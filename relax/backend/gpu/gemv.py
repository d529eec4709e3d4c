"""The float32 GEMV of the GPU targets: a dense layer or matmul whose rows are few (one token of
a decoder, a batch of 1 to ``GEMV_MAX_ROWS``), scheduled on the GEMM-like block of a
legalized kernel.

At one row a dense layer is a pass over its weight: ``K x N`` floats read once, two flops per
float. What counts is how many bytes are in flight, not the arithmetic. The kernel:

* one work-group per block of output columns (``blockIdx.x``) and row (``blockIdx.y``: the row
  loops fused, symbolic ones included), the column blocks small enough that the kernel has at
  least ``GEMV_MIN_GROUPS`` work-groups (twice an H100's 132 multiprocessors);
* the reduction split across the threads of the work-group (``rfactor``): each thread
  accumulates a partial sum of its share of ``K`` in registers, the weight read through a
  register fragment (``cache_read`` local at the k-step) as one 16-byte vector load
  (``float4``; scalar where the layout does not allow it);
* the partial sums meet in shared memory: for an ``(N, K)`` weight a tree over the column's
  threads (``LowerCrossThreadReduction``), for ``(K, N)`` a thread per column adding them in
  turn (its threads hold 4 columns each: 4 trees would run one after another);
* the epilogue (bias, activation, residual) computed in the write-back.

The weight's layout picks the thread arrangement:

* ``(N, K)`` (``relax.linear``, ONNX ``Gemm`` with ``transB``, torch ``Linear``): ``threadIdx.y``
  over the work-group's columns, ``threadIdx.x`` over ``K`` in runs of 4: a warp reads a
  contiguous 512 bytes of one weight row per step;
* ``(K, N)`` (ONNX ``MatMul``): ``threadIdx.x`` over runs of 4 columns (4 accumulators per
  thread), ``threadIdx.y`` over ``K``: a warp reads 16-byte runs of several weight rows, each
  thread one ``float4``.

- which blocks: ``gemv_layout`` (None where the kernel is not a GEMV);
- schedule: ``schedule_gemv(sch, block, target)``;
- its launch shape: ``gemv_tile``.

Examples
--------
>>> from tilecraft.tensorir import te
>>> from tilecraft.tensorir.schedule import Schedule
>>> A = te.placeholder((1, 768), "float32", "A")
>>> W = te.placeholder((768, 2304), "float32", "W")
>>> k = te.reduce_axis((0, 768), "k")
>>> C = te.compute((1, 2304), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
>>> sch = Schedule(te.create_prim_func([A, W, C]))
>>> gemv_layout(sch, sch.get_block("C"))
GemvLayout(rows=1, k=768, n=2304, weight='KN')
>>> gemv_tile(gemv_layout(sch, sch.get_block("C")))
GemvTile(cols=8, vector=4, split=64, col_threads=2)
"""
from __future__ import annotations

from dataclasses import dataclass

from tilecraft.targets import Target
from tilecraft.tensorir.expr import IntImm, Var
from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.transform._common import uses_any

from .gemm import _gemm_groups, reduce_inputs
from .schedule_utils import SYMBOLIC, iter_values, loop_extent, node_of, spatial_loops

__all__ = ["GEMV_MAX_ROWS", "GEMV_MIN_GROUPS", "GEMV_THREADS", "GEMV_VECTOR", "GEMV_WARP", "GemvLayout",
           "GEMV_UNROLL_STEPS", "GemvTile", "gemv_layout", "gemv_rows", "gemv_tile",
           "schedule_gemv"]

# Rows up to which a dense layer runs as the GEMV (a static count; a symbolic one gets the GEMV
# while it is at most this, chosen per call: ``relax.backend.gpu.batch_dispatch``): each row is
# a work-group row of its own and reads the weight again (from L2 after the first), so beyond a
# few rows the GEMM's tiles, which read each weight element once per 8-128 rows, win.
# 0 turns the GEMV off (the GEMM rule for every row count: benchmarks/lowp.py's baseline).
GEMV_MAX_ROWS = 4
# Work-groups the GEMV should have at least: twice the H100's 132 multiprocessors (a GEMV is
# memory-bound: each multiprocessor needs loads in flight).
GEMV_MIN_GROUPS = 264
GEMV_THREADS = 256      # threads per work-group at most (WebGPU's limit too)
GEMV_WARP = 32          # threads per work-group at least, where the columns allow
GEMV_VECTOR = 4         # floats per weight load (one float4 / vec4<f32>)
GEMV_UNROLL_STEPS = 16  # k-steps per thread up to which its loop is unrolled


@dataclass(frozen=True)
class GemvLayout:
    """One GEMV: ``rows`` (an int, or None when symbolic) of ``k`` inputs times a weight of
    ``n`` columns stored ``(K, N)`` (``weight='KN'``) or ``(N, K)`` (``'NK'``)."""
    rows: int | None
    k: int
    n: int
    weight: str


@dataclass(frozen=True)
class GemvTile:
    """A GEMV's launch shape: ``cols`` output columns per work-group, ``vector`` floats per
    weight load, ``split`` threads sharing each column's reduction, ``col_threads`` threads
    across the columns (``cols / vector`` for ``'KN'``, ``cols`` for ``'NK'``)."""
    cols: int
    vector: int
    split: int
    col_threads: int

    @property
    def threads(self) -> int:
        return self.split * self.col_threads


def _pow2_at_most(x: int) -> int:
    p = 1
    while p * 2 <= x:
        p *= 2
    return p


def _divisor_near(n: int, want: int, cap: int) -> int:
    """The divisor of ``n`` of at most ``cap`` nearest ``want`` (by ratio; the larger one of
    two as near)."""
    divisors = [d for d in range(1, min(n, cap) + 1) if n % d == 0]
    return min(divisors, key=lambda d: (max(d / want, want / d), -d))


def gemv_tile(layout: GemvLayout, min_groups: int = GEMV_MIN_GROUPS) -> GemvTile:
    """The launch shape of ``layout`` (see the module docstring): the columns per work-group
    halved until the kernel has ``min_groups`` work-groups (a symbolic row count counted as 1).
    ``split`` divides ``K`` (in vectors): the partial sums are factored out of the reduction
    (``rfactor``), which a tail of ``K`` would leave behind a guard the schedule cannot keep.

    Examples
    --------
    >>> gemv_tile(GemvLayout(1, 768, 768, "NK"))
    GemvTile(cols=2, vector=4, split=32, col_threads=2)
    >>> gemv_tile(GemvLayout(1, 4096, 11008, "KN"))
    GemvTile(cols=32, vector=4, split=32, col_threads=8)
    """
    rows = layout.rows or 1
    if layout.weight == "NK":
        vec = GEMV_VECTOR if layout.k % GEMV_VECTOR == 0 else 1
        # each thread about four loads of its column or more; at most 64 threads per column
        want = max(8, min(64, _pow2_at_most(max(1, layout.k // (vec * 4)))))
        split = _divisor_near(layout.k // vec, want, 64)
        cols = _pow2_at_most(max(1, GEMV_THREADS // split))
        # (a work-group of a warp at least: a smaller one leaves lanes of its warp idle)
        while cols > 1 and rows * -(-layout.n // cols) < min_groups and \
                split * cols // 2 >= GEMV_WARP:
            cols //= 2
        return GemvTile(cols, vec, split, cols)
    vec = GEMV_VECTOR if layout.n % GEMV_VECTOR == 0 else 1
    col_threads = 32 // vec       # 128 contiguous bytes of a weight row per work-group
    while col_threads > 1 and rows * -(-layout.n // (col_threads * vec)) < min_groups:
        col_threads //= 2
    # threads along K: each about 8 steps or more (a few work-groups of few columns need many
    # threads for their loads in flight: 3072 x 768 gets 192 of 1 x 256), GEMV_THREADS in all
    want = max(1, min(GEMV_THREADS // col_threads, _pow2_at_most(max(1, layout.k // 8))))
    split = _divisor_near(layout.k, want, GEMV_THREADS // col_threads)
    return GemvTile(col_threads * vec, vec, split, col_threads)


def _var_of(sch: Schedule, block, loop):
    """The block iter var bound to exactly ``loop``'s variable, else None."""
    node = node_of(sch, block)
    lv = node_of(sch, loop).loop_var
    found = [iv.var for iv, v in zip(node.iter_vars, iter_values(sch, block))
             if v is lv]
    return found[0] if len(found) == 1 else None


def gemv_layout(sch: Schedule, block, max_rows: int | None = GEMV_MAX_ROWS) -> GemvLayout | None:
    """The GEMV the GEMM-like ``block`` is, or None: one constant reduction loop ``k``, a
    float32 weight input indexed by exactly ``(k, j)`` or ``(j, k)`` (the column loop ``j``
    innermost in the output), a float32 activation read at ``[..rows.., k]``, and a row count
    (the product of the other output loops) of at most ``max_rows`` or symbolic (None: any)."""
    found = _analyse(sch, block, max_rows)
    return None if found is None else found[0]


def _analyse(sch: Schedule, block, max_rows: int | None):
    """``(GemvLayout, weight buffer)`` of ``block``, or None (see ``gemv_layout``)."""
    node = node_of(sch, block)
    spatial, reduce = spatial_loops(sch, block)
    if len(reduce) != 1 or not spatial or len(node.reads) < 2:
        return None
    if any(node_of(sch, lp).kind != "serial" for lp in spatial + reduce):
        return None
    try:
        _, _, cols, _, col_input = _gemm_groups(sch, block, spatial) if len(spatial) > 1 else \
            (None, None, spatial, None, None)
    except ScheduleError:
        return None
    if len(cols) != 1 or cols[0] is not spatial[-1]:
        return None
    kloop = reduce[0]
    K = loop_extent(node_of(sch, kloop))
    N = loop_extent(node_of(sch, spatial[-1]))
    if K == SYMBOLIC or N == SYMBOLIC:
        return None
    kvar, jvar = _var_of(sch, block, kloop), _var_of(sch, block, spatial[-1])
    if kvar is None or jvar is None:
        return None
    inputs = reduce_inputs(node)
    if len(inputs) != 2:
        return None
    weight = None
    for i in inputs:
        region = node.reads[i].region
        mins = [r.min for r in region]
        if len(mins) == 2 and mins[0] is kvar and mins[1] is jvar:
            weight = (i, "KN")
        elif len(mins) == 2 and mins[0] is jvar and mins[1] is kvar:
            weight = (i, "NK")
    if weight is None or (col_input is not None and weight[0] != col_input):
        return None
    x = next(i for i in inputs if i != weight[0])
    xr = node.reads[x].region
    if xr[-1].min is not kvar or any(uses_any(r.min, [kvar, jvar]) for r in xr[:-1]):
        return None
    if node.reads[weight[0]].buffer.dtype != "float32" or node.reads[x].buffer.dtype != \
            "float32":
        return None
    rows = 1
    for lp in spatial[:-1]:
        e = loop_extent(node_of(sch, lp))
        if e == SYMBOLIC:
            rows = None
            break
        rows *= e
    if rows is not None and max_rows is not None and rows > max_rows:
        return None
    return GemvLayout(rows, K, N, weight[1]), node.reads[weight[0]].buffer, node.reads[x].buffer


def gemv_rows(sch: Schedule, block):
    """The row count of the GEMV ``block`` as an expression (the product of its output loops
    but the last; symbolic where they are), or None where ``block`` is no GEMV or its rows are
    never as few as ``GEMV_MAX_ROWS`` (a constant factor above it: ``(n, 128, 768)``)."""
    if _analyse(sch, block, max_rows=None) is None:
        return None
    spatial, _ = spatial_loops(sch, block)
    rows, const = None, 1
    for lp in spatial[:-1]:
        e = node_of(sch, lp).extent
        if isinstance(e, IntImm):
            const *= e.value
        rows = e if rows is None else rows * e
    if const > GEMV_MAX_ROWS:
        return None
    return rows if rows is not None else IntImm(1, "int64")


def schedule_gemv(sch: Schedule, block, target: Target) -> set:
    """The GEMV schedule (see the module docstring) on the GEMM-like ``block``; the names of
    the blocks it scheduled. ``ScheduleError`` where ``gemv_layout`` finds no GEMV (any row
    count is taken: the caller decides which row counts get the GEMV)."""
    found = _analyse(sch, block, max_rows=None)
    if found is None:
        raise ScheduleError("GPU GEMV", "not a dense layer of the GEMV's form", None)
    layout, wbuf, xbuf = found
    tile = gemv_tile(layout)
    if tile.split == 1:
        raise ScheduleError("GPU GEMV", f"K = {layout.k} has no divisor to share among threads",
                            None)
    name = node_of(sch, block).name
    consumers = sch.get_consumers(block)
    # the reduction into registers; the epilogue (bias, activation, residual) in the write-back
    wb = sch.cache_write(block, 0, "local")
    for c in consumers:
        try:
            sch.reverse_compute_inline(c)
        except ScheduleError:
            pass
    names = {name, node_of(sch, wb).name}
    # the split of the reduction, factored out as per-thread partial sums
    *rows, j = sch.get_loops(block)[:-1]
    k = sch.get_loops(block)[-1]
    if layout.weight == "NK":
        kv = tile.vector
        ko, kt, ki = sch.split(k, [None, tile.split, kv])
        sch.reorder(kt, ko, ki)
    else:
        ko, kt = sch.split(k, [None, tile.split])
        sch.reorder(kt, ko)
    rf = sch.rfactor(kt, 0)
    names.add(node_of(sch, rf).name)
    # the write-back's loops: rows -> blockIdx.y, column blocks -> blockIdx.x, threads
    *wrows, wj = sch.get_loops(wb)
    if layout.weight == "NK":
        jb, jt = sch.split(wj, [None, tile.cols])
        anchor = jt
    else:
        jb, jt, jv = sch.split(wj, [None, tile.col_threads, tile.vector])
        anchor = jv
    if wrows:
        r = sch.fuse(*wrows) if len(wrows) > 1 else wrows[0]
        sch.reorder(jb, r)
        sch.bind(r, "blockIdx.y")
    sch.bind(jb, "blockIdx.x")
    sch.bind(jt, "threadIdx.y" if layout.weight == "NK" else "threadIdx.x")
    # the final sum of the partials at the thread's column: (N, K) a tree over the column's
    # threads; (K, N) a thread per column (of the 4 of a run: threadIdx.y < 4) adding the
    # column's partials in turn -- the 4 columns of a thread's run would otherwise need 4
    # trees one after another (4 x log2(split) barriers; lavapipe ran the layer 10x slower)
    sch.set_scope(block, 0, "local")
    if layout.weight == "KN":
        sch.bind(jv, "threadIdx.y")
    sch.compute_at(block, anchor)
    fin = sch.get_loops(block)
    if layout.weight == "NK":
        sch.bind(fin[-1], "threadIdx.x")
    # the partial sums: per thread in registers, then in shared memory for the tree
    sch.set_scope(rf, 0, "shared")
    # (at the column-block's thread loop of full extent: the (K, N) final sum's loop over the
    # run's 4 columns is guarded, and a shared stage may not be)
    sch.compute_at(rf, jt, preserve_unit_loops=True)
    # rf's iter vars: (thread's share of K, rows.., column, k-step[, vector])
    nvars = len(node_of(sch, rf).iter_vars)
    rt, ro = _serial_loop_of(sch, rf, 0), _serial_loop_of(sch, rf, nvars - (2 if layout.weight
                                                                             == "NK" else 1))
    # (in shared memory, the partials are the work-group's: computed at the thread loop, the
    # block covers all the work-group's columns, which go to the threads again)
    rj = _serial_loop_of(sch, rf, nvars - (3 if layout.weight == "NK" else 2))
    if layout.weight == "NK":
        inner = _serial_loop_of(sch, rf, nvars - 1)
        sch.reorder(rj, rt, ro, inner)
        sch.bind(rj, "threadIdx.y")
        sch.bind(rt, "threadIdx.x")
    else:
        jt, inner = sch.split(rj, [None, tile.vector])
        sch.reorder(jt, rt, ro, inner)
        sch.bind(jt, "threadIdx.x")
        sch.bind(rt, "threadIdx.y")
    # the thread's partial sums in registers, stored to shared memory once
    acc = sch.cache_write(rf, 0, "local")
    names.add(node_of(sch, acc).name)
    sch.reverse_compute_at(acc, rt)
    # the weight through a register fragment: one vector load per k-step
    # (and, where the weight is (N, K), the activation's 4 values beside it)
    reads = node_of(sch, rf).reads
    w_idx = next(i for i, r in enumerate(reads) if r.buffer is wbuf)
    x_idx = next(i for i, r in enumerate(reads) if r.buffer is xbuf)
    for idx in ([w_idx, x_idx] if layout.weight == "NK" else [w_idx]):
        frag = sch.cache_read(rf, idx, "local")
        names.add(node_of(sch, frag).name)
        sch.compute_at(frag, ro)
        fv = sch.get_loops(frag)[-1]
        if tile.vector > 1 and loop_extent(node_of(sch, fv)) == tile.vector:
            sch.vectorize(fv)
    init = sch.decompose_reduction(rf, ro)
    names.add(node_of(sch, init).name)
    sch.unroll(inner)
    if loop_extent(node_of(sch, ro)) <= GEMV_UNROLL_STEPS:
        sch.unroll(ro)       # the loads of all steps issued ahead of their multiply-adds
    for b in (init, acc):
        for lp in sch.get_loops(b):
            if node_of(sch, lp).kind == "serial" and loop_extent(node_of(sch, lp)) <= 16:
                sch.unroll(lp)
    return names


def _serial_loop_of(sch: Schedule, block, index: int):
    """The serial loop whose variable the ``index``-th iter value of ``block`` uses."""
    value = iter_values(sch, block)[index]
    found = [lp for lp in sch.get_loops(block) if node_of(sch, lp).kind == "serial" and
             uses_any(value, [node_of(sch, lp).loop_var])]
    if len(found) != 1:
        raise ScheduleError("GPU GEMV", f"iter var {index} of {node_of(sch, block).name} is "
                            f"not one serial loop's", None)
    return found[0]
