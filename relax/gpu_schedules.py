"""Default GPU schedules: what ``relax.build`` applies, for an ``opencl`` or ``webgpu`` target, to
every kernel no tuning record covers — every nest bound to work-groups and threads, so an
untuned GPU build runs at a sensible speed (``relax/default_schedules.py`` is the CPU one).

Rules, tried in order on a ``te.create_prim_func``-style kernel (a root block whose children
are loop nests of one block each):

1. **Inline** cheap spatial producers into their consumers (``compute_inline``) and
   elementwise epilogues into their producers (``reverse_compute_inline``).
2. **GEMM-like reductions** (two inputs read with the reduction variable: matmul, batch matmul,
   dense, convolution): a block tile of ``BM x BN`` outputs per work-group (128 x 128 from
   8 x 16 threads), ``TM x TN`` per thread in registers (16 x 8) (``cache_write`` local), the reduction split by ``BK`` with both input
   tiles staged in shared memory (``cache_read`` shared + a cooperative fetch over all threads),
   init decomposed out of the reduction, the register tile unrolled. Each thread owns a
   contiguous ``TM x TN`` patch (its shared loads vectorize). Epilogues (bias, activation)
   are inlined into the register write-back.
3. **Row reductions** (softmax, layer / RMS norm, sums and maxima): one work-group per row,
   ``T`` threads sharing each reduction (a cross-thread reduction: partials per thread, a tree
   in shared memory), every reduction of the kernel ``compute_at`` the output's row loop with
   its result in a register, the output written by the same threads — one pass over a row that
   stays in cache.
4. **Injective** blocks (elementwise, broadcast, reshape, transpose): all loops fused, four
   consecutive elements per thread as one vector when the extent allows, 256 threads per
   work-group.
5. Anything else: one thread per output element, its reduction serial.

``Target("opencl -device=cpu")`` (a CPU driver such as PoCL) gets a smaller GEMM tile.

Each rule is a sequence of checked ``Schedule`` primitives; a rule that does not apply (a
``ScheduleError``, or a kernel the device lowering rejects — over the target's limits) falls
back to the next, down to rule 5. A kernel that already has thread-bound loops (a hand
schedule or a tuning record) is left alone.

Examples
--------
>>> from tensorir import te
>>> A = te.placeholder((1024,), "float32", "A")
>>> B = te.compute((1024,), lambda i: A[i] * 2.0, "B")
>>> f = apply(te.create_prim_func([A, B]), Target("opencl"))
>>> sorted({l.thread_tag for l in _loops_of(f) if l.kind == "thread_binding"})
['blockIdx.x', 'threadIdx.x']
"""
from __future__ import annotations

import os
import warnings

from targets import Target
from tensorir import dtype as dt
from tensorir.expr import IntImm, TIRError
from tensorir.function import PrimFunc
from tensorir.functor import post_order_visit
from tensorir.schedule import Schedule, ScheduleError
from tensorir.stmt import Block, For
from tensorir.transform import lower_device
from tensorir.transform._common import uses_any

GPU_KINDS = ("opencl", "webgpu")
THREADS = 256          # threads per work-group of injective kernels and row reductions
VECTOR = 4             # elements per thread of injective kernels (one float4)
# threads x register elements per GEMM output dimension: a 128 x 128 block tile of 8 x 16
# threads, each 16 rows x 8 columns in registers. On the H200 (OpenCL, 4096^3 fp32) this runs at
# 28 TFLOP/s, 0.55x cuBLAS; 16 x 16 threads of 8 x 8 ran at 20 (benchmarks/gpu.py --sweep).
GEMM_TILE = (8, 16)    # rows
GEMM_TILE_J = (16, 8)  # columns
# For a CPU OpenCL driver (``Target("opencl -device=cpu")``, e.g. PoCL): a small tile with the
# reduction step not unrolled. PoCL compiles the GPU tile's 2048 unrolled multiply-adds per
# work-item for minutes.
GEMM_TILE_CPU = (16, 4)
GEMM_BK_CPU = 8
GEMM_BK = 16           # reduction step staged in shared memory (H200: 16 beats 8 by 6%)
GEMM_FETCH_VECTOR = 1  # elements per thread and step of the shared-memory fetch (4: slower on H200)
SYMBOLIC = 1 << 20     # what a symbolic extent counts as when sizing tiles


def _loops_of(func: PrimFunc) -> list[For]:
    out = []
    post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, For) else None)
    return out[::-1]


def is_scheduled(func: PrimFunc) -> bool:
    """Whether ``func`` already has thread-bound loops (or is marked scheduled)."""
    attrs = func.attr_dict
    if attrs.get("tir.is_scheduled") or attrs.get("is_scheduled"):
        return True
    return any(f.kind == "thread_binding" for f in _loops_of(func))


def apply(func: PrimFunc, target: Target) -> PrimFunc:
    """``func`` with the default GPU schedule for ``target`` (see the module docstring).

    Unchanged when the target is not a GPU or ``func`` is already scheduled. The result is
    checked by lowering it for ``target``; a rule whose kernel the lowering rejects falls back
    to a simpler one.
    """
    if target.kind not in GPU_KINDS or is_scheduled(func):
        return func
    name = func.attr_dict.get("global_symbol", "main")
    for strategy in (_schedule_best, _schedule_simple):
        try:
            sch = Schedule(func)
            strategy(sch, target)
            out = sch.mod[sch._func_name] if hasattr(sch, "_func_name") else sch.func
            lower_device(out, target)      # over a limit -> try the next strategy
            return out
        except (ScheduleError, ValueError, TIRError) as err:   # does not apply / over a limit
            if os.environ.get("TILECRAFT_DEBUG_SCHEDULES"):
                warnings.warn(f"{strategy.__name__} of {name}: {type(err).__name__}: {err}")
            continue
        except Exception as err:  # a bug in a rule must not break the build
            warnings.warn(f"GPU default schedule of {name} failed ({type(err).__name__}: "
                          f"{err}); trying a simpler one")
            continue
    warnings.warn(f"no GPU default schedule applies to {name}; it runs as one thread")
    return func


# ---------------------------------------------------------------------------------------------
# analysis


def _blocks(sch: Schedule) -> list:
    root = sch.get_root()
    return sch.get_child_blocks(sch.get_block(root.name)) if root is not None else []


def _node(sch: Schedule, rv) -> Block:
    return sch.get(rv)


def _extent(loop: For) -> int:
    return loop.extent.value if isinstance(loop.extent, IntImm) else SYMBOLIC


def _is_reduction(block: Block) -> bool:
    return any(iv.kind == "reduce" for iv in block.iter_vars)


def _is_spatial(block: Block) -> bool:
    return not _is_reduction(block)


def _reduce_inputs(block: Block) -> list[int]:
    """Indices (in ``block.reads``) of the buffers read with a reduce iter var."""
    rvars = [iv.var for iv in block.iter_vars if iv.kind == "reduce"]
    out = []
    for i, r in enumerate(block.reads):
        if any(uses_any(rng.min, rvars) or uses_any(rng.extent, rvars) for rng in r.region):
            out.append(i)
    return out


def _is_gemm_like(block: Block) -> bool:
    if not _is_reduction(block):
        return False
    inputs = _reduce_inputs(block)
    if len(inputs) < 2:
        return False
    svars = [iv.var for iv in block.iter_vars if iv.kind == "spatial"]
    # each of two inputs misses a spatial var the other has: an outer product of tiles
    uses = []
    for i in inputs:
        r = block.reads[i]
        uses.append({v for v in svars if any(uses_any(x.min, [v]) for x in r.region)})
    return any(a - b and b - a for a in uses for b in uses)


# ---------------------------------------------------------------------------------------------
# strategies


def _inline(sch: Schedule) -> None:
    """Inline spatial producers into consumers, then elementwise epilogues into producers."""
    changed = True
    while changed:
        changed = False
        blocks = _blocks(sch)
        if len(blocks) <= 1:
            return
        for b in blocks[:-1]:
            if _is_spatial(_node(sch, b)) and sch.get_consumers(b):
                try:
                    sch.compute_inline(b)
                    changed = True
                    break
                except ScheduleError:
                    pass
    changed = True
    while changed:
        changed = False
        for b in _blocks(sch)[1:]:
            node = _node(sch, b)
            producers = sch.get_producers(b)
            if _is_spatial(node) and producers and \
                    all(_is_spatial(_node(sch, p)) for p in producers):
                try:
                    sch.reverse_compute_inline(b)
                    changed = True
                    break
                except ScheduleError:
                    pass


def _schedule_best(sch: Schedule, target: Target) -> None:
    _inline(sch)
    blocks = _blocks(sch)
    reductions = [b for b in blocks if _is_reduction(_node(sch, b))]
    gemms = [b for b in reductions if _is_gemm_like(_node(sch, b)) and _big_output(sch, b)]
    if gemms:
        done = set()
        for g in gemms:
            done |= _schedule_gemm(sch, g, target)
        for b in _blocks(sch):
            name = _node(sch, b).name
            if name not in done and not _bound(sch, b):
                _schedule_block(sch, b)
        return
    if reductions and _schedule_rows(sch, reductions):
        return
    for b in _blocks(sch):
        _schedule_block(sch, b)


def _schedule_simple(sch: Schedule, target: Target) -> None:
    """One thread per output element; reductions serial."""
    for b in _blocks(sch):
        _thread_per_output(sch, b, 64)


def _bound(sch: Schedule, block) -> bool:
    return any(_node(sch, lp).kind == "thread_binding" for lp in sch.get_loops(block))


def _schedule_block(sch: Schedule, block) -> None:
    node = _node(sch, block)
    if _is_spatial(node):
        _injective(sch, block)
        return
    spatial, reduce = _spatial_loops(sch, block)
    work = 1
    for lp in reduce:
        work *= _extent(_node(sch, lp))
    # threads share a reduction when it is long and there are few outputs to spread instead
    if work >= 128 and (not spatial or _output_elements(sch, block) <= 4096):
        _cross_thread(sch, block)
    else:
        _thread_per_output(sch, block, 64)


def _spatial_loops(sch: Schedule, block):
    """(spatial loops, reduce loops) of a block in te form (spatial loops outermost)."""
    node = _node(sch, block)
    loops = sch.get_loops(block)
    realize_vals = _iter_values(sch, block)
    rvars = [v for iv, v in zip(node.iter_vars, realize_vals) if iv.kind == "reduce"]
    spatial, reduce = [], []
    for lp in loops:
        var = _node(sch, lp).loop_var
        (reduce if any(uses_any(v, [var]) for v in rvars) else spatial).append(lp)
    return spatial, reduce


def _iter_values(sch: Schedule, block):
    from tensorir.stmt import BlockRealize
    node = _node(sch, block)
    found = []

    def visit(n):
        if isinstance(n, BlockRealize) and n.block is node:
            found.append(n)
    post_order_visit(sch.func.body, visit)
    return found[0].iter_values if found else ()


def _output_elements(sch: Schedule, block) -> int:
    n = 1
    for lp in _spatial_loops(sch, block)[0]:
        n *= _extent(_node(sch, lp))
    return n


def _big_output(sch: Schedule, block) -> bool:
    return _output_elements(sch, block) > 4096


def _injective(sch: Schedule, block) -> None:
    loops = sch.get_loops(block)
    if not loops:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    total = _extent(_node(sch, fused))
    lanes = VECTOR if _vector_ok(sch, block, loops, total) else 1
    if lanes > 1:
        outer, vec = sch.split(fused, [None, lanes])
        bx, tx = sch.split(outer, [None, THREADS])
        sch.vectorize(vec)
    else:
        bx, tx = sch.split(fused, [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _vector_ok(sch: Schedule, block, loops, total: int) -> bool:
    """Four elements per thread when the fused extent is a constant multiple of 4 (so the
    vector loop has no tail) and large enough to fill the device."""
    if total == SYMBOLIC or total % VECTOR or total < VECTOR * THREADS * 4:
        return False
    node = _node(sch, block)
    return all(dt.bits(w.buffer.dtype) == 32 for w in node.writes)


def _thread_per_output(sch: Schedule, block, threads: int) -> None:
    spatial, reduce = _spatial_loops(sch, block)
    if not spatial:
        _cross_thread(sch, block)
        return
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _threads_for(extent: int) -> int:
    t = 32
    while t < THREADS and t < extent:
        t *= 2
    return t


def _cross_thread(sch: Schedule, block, bx=None) -> None:
    """Spatial loops -> blockIdx.x (unless already under ``bx``), the reduction shared by T
    threads: fused, split [serial, T], the thread loop outside."""
    spatial, reduce = _spatial_loops(sch, block)
    if bx is None and spatial:
        fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        sch.bind(fused, "blockIdx.x")
    elif bx is not None:
        for lp in spatial:
            if _node(sch, lp).kind != "thread_binding" and _extent(_node(sch, lp)) != 1:
                raise ScheduleError("default GPU schedule", "a spatial loop is left inside the "
                                    "row", None)
    if not reduce:
        raise ScheduleError("default GPU schedule", "no reduce loop", None)
    r = sch.fuse(*reduce) if len(reduce) > 1 else reduce[0]
    t = _threads_for(_extent(_node(sch, r)))
    ro, ri = sch.split(r, [None, t])
    sch.reorder(ri, ro)
    sch.bind(ri, "threadIdx.x")


def _schedule_rows(sch: Schedule, reductions) -> bool:
    """Rule 3: every reduction at the output's row loop, one work-group per row."""
    blocks = _blocks(sch)
    out = blocks[-1]
    onode = _node(sch, out)
    if not _is_spatial(onode):
        if len(blocks) == 1:
            _cross_thread(sch, out)
            return True
        return False
    # rows: the reductions' spatial dims that are not 1 (keepdims leaves unit dims)
    rank = {len([iv for iv in _node(sch, r).iter_vars if iv.kind == "spatial" and
                 not (isinstance(iv.dom.extent, IntImm) and iv.dom.extent.value == 1)])
            for r in reductions}
    if len(rank) != 1:
        return False
    rows = rank.pop()
    loops = sch.get_loops(out)
    if rows == 0 or rows >= len(loops):
        return False
    cols = loops[rows:]
    if all(_extent(_node(sch, lp)) == 1 for lp in cols):
        return False        # nothing to spread over threads: one reduction per row
    row = sch.fuse(*loops[:rows]) if rows > 1 else loops[0]
    col = sch.fuse(*cols) if len(cols) > 1 else cols[0]
    t = _threads_for(_extent(_node(sch, col)))
    co, ci = sch.split(col, [None, t])
    sch.bind(row, "blockIdx.x")
    sch.bind(ci, "threadIdx.x")
    for b in reversed(_blocks(sch)[:-1]):
        node = _node(sch, b)
        # the scope first: a global buffer would be shared by all work-groups, so compute_at
        # would compute every row in each; in a register each thread has the row's result (a
        # cross-thread reduction leaves it in every thread), in shared memory the work-group
        sch.set_scope(b, 0, "local" if _is_reduction(node) else "shared")
        sch.compute_at(b, row)
        if _is_reduction(node):
            _cross_thread(sch, b, bx=row)
        else:
            inner = [lp for lp in sch.get_loops(b)
                     if _node(sch, lp).kind != "thread_binding"]
            if inner:
                f = sch.fuse(*inner) if len(inner) > 1 else inner[0]
                _, fi = sch.split(f, [None, t])
                sch.bind(fi, "threadIdx.x")
    return True


def _schedule_gemm(sch: Schedule, block, target: Target) -> set:
    """Rule 2 on one GEMM-like block; the names of the blocks it scheduled."""
    node = _node(sch, block)
    spatial, reduce = _spatial_loops(sch, block)
    if len(spatial) < 2 or not reduce:
        raise ScheduleError("default GPU schedule", "not a 2-D tiled reduction", None)
    jl = spatial[-1]
    rest = spatial[:-1]
    # the row loop: the largest of the others (a symbolic one counts as large)
    il = max(rest, key=lambda lp: _extent(_node(sch, lp)))
    batch = [lp for lp in rest if lp is not il]
    cpu = _for_cpu(target)
    ti, ri = _tile(_extent(_node(sch, il)), GEMM_TILE_CPU if cpu else GEMM_TILE)
    tj, rj = _tile(_extent(_node(sch, jl)), GEMM_TILE_CPU if cpu else GEMM_TILE_J)
    i0, i1, i2 = sch.split(il, [None, ti, ri])
    j0, j1, j2 = sch.split(jl, [None, tj, rj])
    k = sch.fuse(*reduce) if len(reduce) > 1 else reduce[0]
    step = GEMM_BK_CPU if cpu else GEMM_BK
    bk = step if _extent(_node(sch, k)) >= step else _extent(_node(sch, k))
    k0, k1 = sch.split(k, [None, bk])
    sch.reorder(*batch, i0, j0, i1, j1, k0, k1, i2, j2)
    if batch:
        b = sch.fuse(*batch) if len(batch) > 1 else batch[0]
        sch.bind(b, "blockIdx.z")
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    sch.bind(i1, "threadIdx.y")
    sch.bind(j1, "threadIdx.x")
    names = {node.name}
    consumers = sch.get_consumers(block)
    local = sch.cache_write(block, 0, "local")
    names.add(_node(sch, local).name)
    sch.reverse_compute_at(local, j1)
    for c in consumers:            # bias / activation into the register write-back
        try:
            sch.reverse_compute_inline(c)
        except ScheduleError:
            pass
    inputs = _reduce_inputs(node)
    for idx in inputs:
        shared = sch.cache_read(block, idx, "shared")
        names.add(_node(sch, shared).name)
        sch.compute_at(shared, k0)
        inner = [lp for lp in sch.get_loops(shared) if _node(sch, lp).kind == "serial" and
                 _is_under(sch, lp, k0)]
        last = _extent(_node(sch, inner[-1]))
        vec = GEMM_FETCH_VECTOR
        fv = None
        if vec > 1 and last % vec == 0 and last != SYMBOLIC:
            # each thread copies `vec` consecutive elements of a row: one vector load / store
            lo, fv = sch.split(inner[-1], [None, vec])
            inner = inner[:-1] + [lo]
        f = sch.fuse(*inner) if len(inner) > 1 else inner[0]
        _, fy, fx = sch.split(f, [None, ti, tj])
        if fv is not None:
            sch.vectorize(fv)
        sch.bind(fy, "threadIdx.y")
        sch.bind(fx, "threadIdx.x")
    init = sch.decompose_reduction(block, k0)
    names.add(_node(sch, init).name)
    for lp in ((i2, j2) if cpu else (k1, i2, j2)):
        sch.unroll(lp)
    # the register tile's init and write-back unrolled too: indexed by constants only, the
    # accumulators stay in registers
    for b in (init, local):
        for lp in sch.get_loops(b):
            if _node(sch, lp).kind == "serial" and _is_under(sch, lp, j1) and \
                    _extent(_node(sch, lp)) <= 64:
                sch.unroll(lp)
    return names


def _for_cpu(target: Target) -> bool:
    """Whether the target names a CPU OpenCL device (``-device=cpu``)."""
    return str(target.export().get("device", "")).lower() in ("cpu", "pocl")


def _is_under(sch: Schedule, loop, ancestor) -> bool:
    anc = _node(sch, ancestor)
    found = False

    def visit(n):
        nonlocal found
        if n is _node(sch, loop):
            found = True
    post_order_visit(anc.body, visit)
    return found


def _tile(extent: int, config: tuple[int, int]) -> tuple[int, int]:
    """(threads, elements per thread) of one GEMM output dimension."""
    threads, regs = config
    if extent >= threads * regs:
        return threads, regs
    if extent >= threads * 2:
        return threads, 2
    if extent >= threads:
        return threads, 1
    t = 1
    while t * 2 <= extent:
        t *= 2
    return t, 1


__all__ = ["apply", "is_scheduled", "GPU_KINDS"]
