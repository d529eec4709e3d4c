"""Default CPU schedules: what ``relax.build`` applies to every kernel no tuning record covers,
so that an untuned build is already reasonably fast.

Kernels of the CPU kernel library (``relax.backend.cpu``: the packed convolutions, dense
layers, pooling and depthwise kernels that ``AlterLayout`` puts in place) mark their blocks
with a ``"schedule_rule"``; such a block gets the schedule the library's table holds for its
rule (``KERNELS.schedule_of``). The other blocks get generic rules, applied block by block to a
``te.create_prim_func``-style kernel (a root block whose children are loop nests of one block
each):

1. **Inline** cheap intermediate producers (padding, broadcasts, elementwise stages read by a
   single consumer) into their consumers (``compute_inline``); not into a kernel family's
   register tile (``KernelFamily.tile``), where they would be recomputed in its inner loop.
2. **Spatial blocks** (elementwise, broadcast, injective): the innermost loop is vectorized
   (``vector_width / bits`` lanes; the code generator handles any extent, with a masked tail),
   the loops outside it are fused and run in parallel when the work is large enough.
3. **Matmul-like reductions** (the output's last index ``j`` appears in the inputs only as their
   last index, or not at all — matmul, batch matmul, dense, NCHW convolutions): a register tile
   ``MR x lanes``: ``i`` split by ``MR``, ``j`` by the vector lanes, the reduction loops moved
   between the tile loops and the tile, the reduction decomposed (init outside the reduction),
   the tile rows unrolled and the lanes vectorized, the outer loops fused and parallel.
4. **Other reductions** (row sums and maxima, norms): the spatial loops fused and parallel, the
   reduction serial inside.

Every rule is a sequence of checked ``Schedule`` primitives, so a rule that does not apply stops
with a ``ScheduleError`` and leaves a correct program; a kernel that already has parallel,
vectorized or thread-bound loops (a hand schedule) is left alone.

Examples
--------
>>> from tilecraft.tensorir import te
>>> A = te.placeholder((64, 64), "float32", "A")
>>> B = te.compute((64, 64), lambda i, j: A[i, j] * 2.0, "B")
>>> f = apply(te.create_prim_func([A, B]), Target("llvm -mcpu=skylake-avx512"))
>>> [l.kind for l in _loops_of(f)]
['parallel', 'vectorized']
"""
from __future__ import annotations

import warnings

from tilecraft.targets import Target
from tilecraft.tensorir.expr import (LT, Add, And, BufferLoad, Call, FloatImm, FloorDiv, FloorMod,
                                     IntImm, Max, Min, Mul, PrimExpr, Sub, Var, true)
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import IRMutator, post_order_visit
from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.schedule import tree
from tilecraft.tensorir.structural import structural_equal
from tilecraft.tensorir.stmt import Block, BlockRealize, BufferStore, For, IfThenElse

from .backend.cpu import KERNELS, block_rule
from .backend.cpu.dense import RULE_DENSE
from .backend.cpu.softmax import schedule_softmax_rows
from .backend.cpu.schedule_utils import (MIN_PARALLEL_WORK, MR, SYMBOLIC_EXTENT, VECTOR_STRIDES,
                                         block_lanes, finish_tile_block, fuse_epilogue,
                                         input_indices, intermediate_buffers, is_spatial,
                                         loop_extent, loop_nodes, loop_work, parallel_outer,
                                         root_children, strided_reads, uses_var, var_coeff,
                                         vectorize_partials)

GEMV_MAX_ROWS = 3         # symbolic row counts up to this run rows on a 1-row micro-kernel


class DefaultScheduleWarning(UserWarning):
    """A kernel the default rules could not schedule (left as it is: correct, slow);
    ``relax.build(..., strict=True)`` raises instead."""


def _loops_of(func: PrimFunc) -> list[For]:
    out = []
    post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, For) else None)
    return out[::-1]


def is_scheduled(func: PrimFunc) -> bool:
    """Whether ``func`` is marked scheduled or already has non-serial loops."""
    attrs = func.attr_dict
    if attrs.get("tir.is_scheduled") or attrs.get("is_scheduled"):
        return True
    return any(f.kind != "serial" for f in _loops_of(func))


def apply(func: PrimFunc, target: Target) -> PrimFunc:
    """``func`` with the default schedule for ``target`` (unchanged for non-CPU targets and
    kernels that are already scheduled).

    A dense layer (``RULE_DENSE``) with a symbolic row count ``n`` runs each tile of ``MR``
    rows on a tile of exactly the rows it has (``split_row_tails``: ``MR`` rows, or the
    ``n % MR`` of the last tile, each without row tests), so ``n = 1`` runs a 1-row tile and
    ``n = 8`` one of 6 and one of 2, as the kernels built for those row counts do. Another
    matmul-like block with a symbolic row count gets two versions of its body instead, ``if n
    <= GEMV_MAX_ROWS: <row-vector version> else: <register-tile version>``: a tile of ``MR``
    rows at ``n = 1`` would be all tail (masked rows and a row test per reduction step), so
    small ``n`` runs each row on its own predicate-free ``1 x width`` micro-kernel instead.
    Where no block has that version, the tiles of row reductions (layer norm, softmax) and of
    matmul-like blocks over symbolic columns (attention scores ``q @ k^T``) also run exactly
    their rows (``split_row_tails(any_tile=True)``), their accumulators' column tests moved
    off the tile first (``unmask_tile_lanes``).
    """
    if target.kind != "llvm" or is_scheduled(func):
        return func
    try:
        sch = Schedule(func)
        schedule_blocks(sch, target)
        scheduled = unmask_tile_lanes(sch.func)
        rows = _symbolic_rows(scheduled)
        if rows is None:
            return scheduled
        tiled = split_row_tails(scheduled)
        if tiled is not scheduled:
            # every row count runs on whole tiles of exactly its rows: no row-vector version
            return tiled
        small = Schedule(func)
        if not schedule_blocks(small, target, gemv_rows=rows):
            # no block took the row-vector schedule: one version, on exact row tiles where
            # the accumulators are tested on their rows only (row sums, attention scores)
            return split_row_tails(scheduled, any_tile=True)
        return _versioned(rows <= IntImm(GEMV_MAX_ROWS, rows.dtype),
                          unmask_tile_lanes(small.func), tiled)
    except ScheduleError:
        return func
    except Exception as err:  # a bug in a rule must not break the build: keep the kernel as is
        warnings.warn(f"default schedule of {func.attr_dict.get('global_symbol', '?')} failed "
                      f"({type(err).__name__}: {err}); the kernel is left unscheduled",
                      DefaultScheduleWarning)
        return func


# ---------------------------------------------------------------------------------------------


def _is_cheap(block: Block) -> bool:
    """No transcendental calls: data movement and plain arithmetic."""
    found = []
    post_order_visit(block.body, lambda n: found.append(n) if isinstance(n, Call) and
                     n.op not in ("if_then_else",) else None)
    return not found


def _consumers(children: list[BlockRealize], block: Block) -> int:
    mine = {id(w.buffer) for w in block.writes}
    return sum(1 for br in children if br.block is not block and
               any(id(r.buffer) in mine for r in br.block.reads))


def _feeds_tile(children: list[BlockRealize], block: Block) -> bool:
    """Whether ``block``'s result is read by a kernel family's register tile (a convolution or
    dense block: inlined there it would be recomputed in the micro-kernel's inner loop)."""
    mine = {id(w.buffer) for w in block.writes}
    return any(KERNELS.is_tile(block_rule(br.block))
               for br in children if br.block is not block and
               any(id(r.buffer) in mine for r in br.block.reads))


def _inline(sch: Schedule) -> None:
    changed = True
    while changed:
        changed = False
        inter = intermediate_buffers(sch)
        children = root_children(sch)
        for br in children:
            blk = br.block
            if not is_spatial(blk) or blk.init is not None or len(blk.writes) != 1 or \
                    id(blk.writes[0].buffer) not in inter:
                continue
            if block_rule(blk) is not None or _feeds_tile(children, blk):
                continue
            if not (_is_cheap(blk) or _consumers(children, blk) <= 1):
                continue
            try:
                sch.compute_inline(sch.get_block(blk.name))
            except ScheduleError:
                continue
            changed = True
            break


def schedule_blocks(sch: Schedule, target: Target, gemv_rows: PrimExpr | None = None) -> int:
    """Schedule every block of ``sch`` in place (what ``apply`` does, as one ``Schedule``
    whose trace replays it): a block with a kernel family's rule by the library's schedule for
    it, the others by the generic rules. ``gemv_rows``: matmul-like blocks with that
    (symbolic) row extent get the row-vector schedule (``_schedule_gemv``) instead of the
    register tile. Returns how many blocks got it.

    Examples
    --------
    >>> sch = Schedule(func)                                      # doctest: +SKIP
    >>> schedule_blocks(sch, Target("llvm"))                      # doctest: +SKIP
    0
    """
    _inline(sch)
    if schedule_softmax_rows(sch, target):
        return 0
    gemv = 0
    for br in root_children(sch):
        blk = br.block
        if not any(b.block.name == blk.name for b in root_children(sch)):
            continue  # inlined into a tile by an earlier block's rule
        try:
            rule = block_rule(blk)
            if KERNELS.knows(rule):
                schedule = KERNELS.schedule_of(rule)
                # None: a stage that its family's main block places and schedules
                if schedule is not None:
                    gemv += bool(schedule(sch, blk.name, target, gemv_rows))
            elif is_spatial(blk):
                _schedule_spatial(sch, blk.name, target)
            else:
                done = _schedule_row_min_max(sch, blk.name, target) or \
                    _schedule_matmul_like(sch, blk.name, target, gemv_rows)
                if not done and not _schedule_vector_reduction(sch, blk.name, target):
                    _schedule_reduction(sch, blk.name, target)
                gemv += done == "gemv"
        except ScheduleError:
            continue  # this block keeps what was applied (each primitive preserves semantics)
    return gemv


def _schedule_spatial(sch: Schedule, name: str, target: Target) -> None:
    block = sch.get_block(name)
    loops = sch.get_loops(block)
    if not loops:
        return
    nodes = loop_nodes(sch, loops)
    lanes = block_lanes(sch.get(block), target)
    work = loop_work(nodes)
    if len(loops) == 1:
        ext = loop_extent(nodes[0])
        if ext is not None and ext <= lanes:
            sch.vectorize(loops[0])
            return
        outer, inner = sch.split(loops[0], [None, lanes * 4])
        if work >= MIN_PARALLEL_WORK:
            sch.parallel(outer)
        sch.vectorize(inner)
        return
    if loop_extent(nodes[-1]) != 1 and not strided_reads(sch, block, loops[-1]):
        sch.vectorize(_vector_inner(sch, loops[-1], lanes))
    elif _vector_runs(sch, block, loops, lanes):
        pass
    elif _transpose_tiles(sch, block, loops, work):
        return
    if work >= MIN_PARALLEL_WORK:
        last = loop_extent(nodes[-1])
        sch.parallel(_outermost_parallel(sch, loops[:-1], 1 if last is None else last))


def _outermost_parallel(sch: Schedule, outer: list, inner_work: int = 1):
    """The loop to run in parallel over the ``outer`` loops of a spatial nest whose innermost
    loops do ``inner_work`` iterations. ``parallel_outer`` runs the constant loops after the
    last symbolic one in parallel inside the symbolic loops, one parallel launch per outer
    iteration; that is the right place when those constant loops alone carry a launch's
    worth of work (``MIN_PARALLEL_WORK``: a ReLU over ``(n, 64, 28, 28)`` runs ``n``
    launches of 1792 rows). When they do not, the constant loops go outermost (a spatial
    block's loops reorder freely) and are fused, so the nest makes one launch per call: a
    softmax's ``exp`` over ``(batch, 4, seq, seq)`` made ``batch * 4`` launches of one row
    of ``seq``, about 40 ns each on one thread (0.4 of the 0.9 us its symbolic kernel took
    over the concrete one at 1 x 8 tokens); BERT's attention layout copies the same.
    Without constant loops, ``parallel_outer``'s choice."""
    const = [rv for rv in outer if loop_extent(sch.get(rv)) is not None]
    symbolic = [rv for rv in outer if loop_extent(sch.get(rv)) is None]
    if not const or not symbolic:
        return parallel_outer(sch, outer)
    const_work = inner_work
    for rv in const:
        const_work *= loop_extent(sch.get(rv))
    if const_work >= MIN_PARALLEL_WORK:
        return parallel_outer(sch, outer)
    sch.reorder(*const, *symbolic)
    return sch.fuse(*const) if len(const) > 1 else const[0]


def _vector_runs(sch: Schedule, block_rv, loops: list, lanes: int) -> bool:
    """Vectorize the innermost loop in runs of ``c`` when every input reads its variable ``v``
    as ``v % c`` in the last index and ``v // c`` before it (a copy out of a channel-blocked
    buffer ``[.., o // c, .., o % c]``, such as the NHWC convolution's tile buffer): split by
    ``c``, the inner loop reads contiguously. ``c`` must be a multiple of the lanes dividing
    the loop. Returns whether it did."""
    loop = sch.get(loops[-1])
    var, extent = loop.loop_var, loop_extent(loop)
    runs = set()
    for idx in input_indices(sch, block_rv):
        last = idx[-1]
        if not uses_var(last, var):
            if any(uses_var(e, var) for e in idx):
                return False
            continue
        if _unit_stride(last, var) and not any(uses_var(e, var) for e in idx[:-1]):
            continue        # contiguous along the loop whatever the split
        if not (isinstance(last, FloorMod) and last.a is var and isinstance(last.b, IntImm)):
            return False
        c = last.b.value
        for e in idx[:-1]:
            if uses_var(e, var) and not (isinstance(e, FloorDiv) and e.a is var and
                                      isinstance(e.b, IntImm) and e.b.value == c):
                return False
        runs.add(c)
    if len(runs) != 1:
        return False
    c = runs.pop()
    if extent is None or c % lanes or extent % c:
        return False
    _, inner = sch.split(loops[-1], [None, c])
    sch.vectorize(_vector_inner(sch, inner, lanes))
    return True


TRANSPOSE_TILE = 16     # a transpose's square tile: 16 lines read, 16 lines written


def _tile_side(extent: int | None) -> int:
    """The side of a transpose tile along a loop of ``extent``: its largest divisor from 16
    down to 4 (no tail), else 16."""
    if extent is None:
        return TRANSPOSE_TILE
    return next((d for d in range(TRANSPOSE_TILE, 3, -1) if extent % d == 0), TRANSPOSE_TILE)


def _transpose_tiles(sch: Schedule, block_rv, loops: list, work: int) -> bool:
    """A transpose (``permute_dims``, a layout change): the innermost loop walks the output's
    last axis while the input's last axis is another loop's. Run both in square tiles, so a
    tile reads whole lines of the input and writes whole lines of the output (the outer loops
    in parallel). Walking the output alone reads one float per line: NHWC -> NCHW of
    ``28 x 28 x 512`` took 1.17 ms, the input's lines evicted from L1 before their next
    channel is read; tiled, 0.17 ms (Zen 3). Returns False when the block is not such a copy
    or needs no tiles."""
    if not isinstance(sch.get(block_rv).body, BufferStore):
        return False
    reads = input_indices(sch, block_rv)
    if len(reads) != 1:
        return False
    last = reads[0][-1]
    vars_ = [sch.get(rv).loop_var for rv in loops]
    inner = [k for k, v in enumerate(vars_[:-1]) if _unit_stride(last, v)]
    if not inner or inner[0] == len(loops) - 2:
        # the input's last axis right outside the innermost loop: the lines one pass of that
        # loop reads are the next pass's too, a tile already (NCHW -> NHWC of 64 x 56 x 56:
        # 0.064 ms so, 0.080 ms tiled)
        return False
    k = inner[0]
    t, out_inner = loops[k], loops[-1]
    side_t = _tile_side(loop_extent(sch.get(t)))
    side_l = _tile_side(loop_extent(sch.get(out_inner)))
    t0, t1 = sch.split(t, [None, side_t])
    l0, l1 = sch.split(out_inner, [None, side_l])
    outer = [rv for j, rv in enumerate(loops[:-1]) if j != k]
    sch.reorder(*outer, t0, l0, t1, l1)
    if work >= MIN_PARALLEL_WORK:
        sch.parallel(_outermost_parallel(sch, outer + [t0], side_t * side_l))
    return True


def _unit_stride(e: PrimExpr, v: Var) -> bool:
    """Whether ``e`` is ``v`` plus terms that do not use ``v`` (``x + rx - 1``)."""
    if e is v:
        return True
    if isinstance(e, Add):
        return (_unit_stride(e.a, v) and not uses_var(e.b, v)) or \
            (_unit_stride(e.b, v) and not uses_var(e.a, v))
    if isinstance(e, Sub):
        return _unit_stride(e.a, v) and not uses_var(e.b, v)
    return False


def _matmul_axes(block: Block):
    """(i, j) iter var indices of a matmul-like reduction block, or None."""
    if len(block.writes) != 1 or block.init is None:
        return None
    store = block.body
    if not isinstance(store, BufferStore) or not store.indices:
        return None
    iter_vars = [iv.var for iv in block.iter_vars]
    spatial = [iv.var for iv in block.iter_vars if iv.kind == "spatial"]
    vj = store.indices[-1]
    if not isinstance(vj, Var) or vj not in spatial:
        return None
    loads = []
    post_order_visit(store.value, lambda n: loads.append(n) if isinstance(n, BufferLoad) else None)
    independent = 0
    for load in loads:
        if load.buffer is store.buffer:
            continue
        # only unit-stride last-index uses of j (or none) keep the j lanes contiguous
        idx = load.indices
        for k, e in enumerate(idx):
            if uses_var(e, vj) and (k != len(idx) - 1 or not _unit_stride(e, vj)):
                return None
        if not any(uses_var(e, vj) for e in idx):
            independent += 1
    if independent == 0:
        return None
    j = iter_vars.index(vj)
    # the row axis of the tile: the spatial iter var of the index before j
    i = None
    if len(store.indices) >= 2 and isinstance(store.indices[-2], Var) and \
            store.indices[-2] in spatial:
        i = iter_vars.index(store.indices[-2])
    return i, j


def _loop_of_iter(sch: Schedule, block_rv, loops, iv_index: int):
    """The loop whose variable is exactly the binding of the iter var ``iv_index``."""
    br = tree.find_block(sch.func, sch.get(block_rv).name)[0]
    value = br.iter_values[iv_index]
    for rv in loops:
        if sch.get(rv).loop_var is value:
            return rv
    return None


def _split_lanes(sch: Schedule, loop, extent: int | None, lanes: int):
    """(outer, inner) for the vectorized loop of a tile: two vectors wide when that divides
    the extent, a constant multiple of the lanes of up to four vectors whole, else vector-wide
    with a masked tail (LLVM handles odd-sized vectors badly, and masked lanes keep the
    accumulators out of registers, so the tail is the last resort). A symbolic extent (the
    attention scores' key positions): one vector wide, so that a short sequence fills more of
    its lanes (BERT's scores, 4 heads of 64, at 8 tokens: 3.3 -> 2.2 us on a tile of 16 lanes
    rather than 32; at 8 x 128 tokens 1.80 -> 1.65 ms, one thread, Zen 4)."""
    if extent is not None:
        if extent <= lanes or (extent % lanes == 0 and extent <= 4 * lanes and
                               extent % (2 * lanes) != 0) or extent == 2 * lanes:
            return None, loop
        if extent % (2 * lanes) == 0:
            return tuple(sch.split(loop, [None, 2 * lanes]))
        return tuple(sch.split(loop, [None, lanes]))
    return tuple(sch.split(loop, [None, lanes]))


def _vector_inner(sch: Schedule, loop, lanes: int):
    """The loop to vectorize for an innermost spatial ``loop``: itself, or for a constant
    extent of a few odd-sized vectors (35), its vector-wide inner part (the code generator
    masks the tail of longer and symbolic loops itself)."""
    ext = loop_extent(sch.get(loop))
    if ext is None or ext <= lanes or ext % lanes == 0 or ext > 64:
        return loop
    return sch.split(loop, [None, lanes])[1]


def _schedule_matmul_like(sch: Schedule, name: str, target: Target,
                          gemv_rows: PrimExpr | None = None) -> bool | str:
    """The register tile of a matmul-like block (True), its row-vector schedule when its row
    extent is ``gemv_rows`` ("gemv"), or False when the block is not matmul-like."""
    block = sch.get_block(name)
    blk = sch.get(block)
    axes = _matmul_axes(blk)
    if axes is None:
        return False
    i_idx, j_idx = axes
    loops = sch.get_loops(block)
    kinds = {}
    for rv in loops:
        kinds[rv.name] = None
    spatial_loops, reduce_loops = [], []
    br = tree.find_block(sch.func, name)[0]
    for rv in loops:
        var = sch.get(rv).loop_var
        kind = None
        for iv, value in zip(blk.iter_vars, br.iter_values):
            if uses_var(value, var):
                kind = iv.kind if kind in (None, iv.kind) else "mixed"
        if kind == "spatial":
            spatial_loops.append(rv)
        elif kind == "reduce":
            reduce_loops.append(rv)
        else:
            return False
    # te's order: every spatial loop outside every reduction loop
    if not reduce_loops or loops[:len(spatial_loops)] != spatial_loops:
        return False
    lj = _loop_of_iter(sch, block, loops, j_idx)
    li = _loop_of_iter(sch, block, loops, i_idx) if i_idx is not None else None
    if lj is None:
        return False
    lanes = block_lanes(blk, target)
    if gemv_rows is not None and li is not None and \
            _gemv_width(sch.get(li), sch.get(lj), lanes, gemv_rows) is not None:
        return _schedule_gemv(sch, block, spatial_loops, reduce_loops, li, lj, lanes,
                              _gemv_width(sch.get(li), sch.get(lj), lanes, gemv_rows))
    mr = MR if target.vector_width >= 512 or target.arch in ("aarch64", "arm") else 4
    ej = loop_extent(sch.get(lj))
    jo, ji = _split_lanes(sch, lj, ej, lanes)
    io = ii = None
    if li is not None:
        ei = loop_extent(sch.get(li))
        if ei is None:
            io, ii = sch.split(li, [None, mr])       # rows beyond n: a predicate, not a mask
        elif ei > mr:
            d = max(f for f in range(1, mr + 1) if ei % f == 0)
            io, ii = sch.split(li, [None, d if d >= (mr + 1) // 2 else mr])
        else:
            io, ii = None, li
    outer = [rv for rv in spatial_loops if rv is not lj and rv is not li]
    outer += [rv for rv in (io, jo) if rv is not None]
    tile = [rv for rv in (ii, ji) if rv is not None]
    # loops of constant extent outside the symbolic ones: they are fused and run in parallel
    # whatever the symbolic sizes (one row tile at batch 1 still uses every core)
    outer = [rv for rv in outer if loop_extent(sch.get(rv)) is not None] + \
        [rv for rv in outer if loop_extent(sch.get(rv)) is None]
    sch.reorder(*outer, *reduce_loops, *tile)
    # the accumulators of one tile live in a local buffer (registers once unrolled and
    # vectorized) written back after the reduction
    write_back = None
    if outer:
        write_back = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(write_back, outer[-1])
        fuse_epilogue(sch, write_back)
    init = sch.decompose_reduction(block, reduce_loops[0])
    if ii is not None:
        sch.unroll(ii)
    sch.vectorize(ji)
    for b in (init, write_back):
        if b is None:
            continue
        own = sch.get_loops(b)[len(outer):]
        for rv in own[:-1]:
            if loop_extent(sch.get(rv)) is not None:
                sch.unroll(rv)
        if own:
            sch.vectorize(own[-1])
    if outer and loop_work(loop_nodes(sch, outer + tile)) >= MIN_PARALLEL_WORK // 4:
        # Fuse only up to the first symbolic extent: a fused index ``f // (n // 6)`` is not
        # affine in a loop var, which keeps the code generator from shrinking the accumulator
        # tile to registers and from partitioning the tile loop on its ``i < n`` tail test.
        prefix = []
        for rv in outer:
            prefix.append(rv)
            if loop_extent(sch.get(rv)) is None:
                break
        fused = sch.fuse(*prefix) if len(prefix) > 1 and \
            all(loop_extent(sch.get(rv)) is not None for rv in prefix) else prefix[0]
        sch.parallel(fused)
    return True


GEMV_VECTORS = 16   # vectors per row of the row-vector micro-kernel (16 x 16 lanes: 256 floats)


def _gemv_width(li: For, lj: For, lanes: int, rows: PrimExpr) -> int | None:
    """Columns per row-vector micro-kernel for a tile with row loop ``li`` and column loop
    ``lj``: a multiple of ``2 * lanes`` dividing the column extent into at least two parallel
    parts, when the row extent is ``rows``; else None."""
    ej = loop_extent(lj)
    if loop_extent(li) is not None or not bool(li.extent == rows) or ej is None:
        return None
    for vectors in (GEMV_VECTORS, GEMV_VECTORS // 2, GEMV_VECTORS // 4, 2):
        width = vectors * lanes
        if ej % width == 0 and ej // width >= 2:
            return width
    return None


def _schedule_gemv(sch: Schedule, block, spatial_loops, reduce_loops, li, lj, lanes: int,
                   width: int) -> str:
    """The row-vector schedule of a matmul-like block with few rows: the columns split into
    parallel strips of ``width``; in each, a row loop outside the reduction and a ``1 x width``
    tile (``width / (2 lanes)`` unrolled vectors of ``2 lanes``) inside it. No row is masked and
    the reduction reads one contiguous ``width``-float run of the weights per step (a whole
    strip of cache lines, which the hardware prefetcher follows; a ``2 lanes`` tile would
    touch one new 4 KiB page per step)."""
    jo, jm, ji = sch.split(lj, [None, width // (2 * lanes), 2 * lanes])
    outer = [rv for rv in spatial_loops if rv is not lj and rv is not li]
    outer = [rv for rv in outer if loop_extent(sch.get(rv)) is not None] + [jo] + \
        [rv for rv in outer if loop_extent(sch.get(rv)) is None] + [li]
    sch.reorder(*outer, *reduce_loops, jm, ji)
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, li)
    fuse_epilogue(sch, write_back)
    init = sch.decompose_reduction(block, reduce_loops[0])
    sch.unroll(jm)
    sch.vectorize(ji)
    for b in (init, write_back):
        own = sch.get_loops(b)[len(outer):]
        for rv in own[:-1]:
            if loop_extent(sch.get(rv)) is not None:
                sch.unroll(rv)
        if own:
            sch.vectorize(own[-1])
    prefix = outer[:outer.index(jo) + 1]
    if loop_work(loop_nodes(sch, prefix + [jm, ji] + reduce_loops)) >= 16 * MIN_PARALLEL_WORK:
        sch.parallel(sch.fuse(*prefix) if len(prefix) > 1 else prefix[0])
    return "gemv"


def _symbolic_rows(func: PrimFunc) -> PrimExpr | None:
    """The row extent of the first register tile of ``func`` (a scheduled kernel) whose rows
    are split from a symbolic extent: the ``n`` of ``for i_0 in range((n + 5) // 6)``."""
    for loop in _loops_of(func):
        ext = loop.extent
        # (n + MR - 1) // MR: the outer row loop of a symbolic split
        # n is a dim (batch) or a product of dims (batch * seq: a dense layer's rows)
        if isinstance(ext, FloorDiv) and isinstance(ext.b, IntImm) and \
                ext.b.value in (MR, 4) and isinstance(ext.a, Add) and \
                isinstance(ext.a.b, IntImm) and ext.a.b.value == ext.b.value - 1 and \
                not isinstance(ext.a.a, IntImm):
            return ext.a.a
    return None


def _row_tiles(extent) -> tuple[int, PrimExpr] | None:
    """``(c, n)`` when ``extent`` is ``(n + c - 1) // c`` (the tiles of a symbolic split)."""
    if isinstance(extent, FloorDiv) and isinstance(extent.b, IntImm) and extent.b.value > 1 \
            and isinstance(extent.a, Add) and isinstance(extent.a.b, IntImm) and \
            extent.a.b.value == extent.b.value - 1 and not isinstance(extent.a.a, IntImm):
        return extent.b.value, extent.a.a
    return None


def _is_true(p) -> bool:
    return isinstance(p, IntImm) and p.dtype == "bool" and bool(p.value)


def _conjuncts(p) -> list:
    return _conjuncts(p.a) + _conjuncts(p.b) if isinstance(p, And) else [p]


def _without_row_test(p, io: Var, c: int, n: PrimExpr):
    """``(r, rest)``: the row loop var of the conjunct ``io * c + r < n`` of predicate ``p``
    and the other conjuncts (``true()`` when none), or ``(None, p)``."""
    parts = _conjuncts(p)
    for i, q in enumerate(parts):
        r = _row_test(q, io, c, n)
        if r is not None:
            rest = parts[:i] + parts[i + 1:]
            out = rest[0] if rest else true()
            for q2 in rest[1:]:
                out = And(out, q2)
            return r, out
    return None, p


def _row_test(p, io: Var, c: int, n: PrimExpr) -> Var | None:
    """The row loop var ``r`` of a predicate ``io * c + r < n``, else None."""
    if isinstance(p, LT) and structural_equal(p.b, n) and isinstance(p.a, Add) and isinstance(p.a.a, Mul) and \
            p.a.a.a is io and isinstance(p.a.a.b, IntImm) and p.a.a.b.value == c and \
            isinstance(p.a.b, Var):
        return p.a.b
    return None


class _TileOfRows(IRMutator):
    """The body of row tile ``io`` (``c`` rows of ``n``) when it holds ``rows`` rows: the row
    loops (the vars of the tests ``io * c + r < n``, extent ``c``) run ``rows`` times and the
    tests go."""

    def __init__(self, io: Var, c: int, n: PrimExpr, row_vars: set, rows: int):
        super().__init__()
        self.io, self.c, self.n, self.row_vars, self.rows = io, c, n, row_vars, rows

    def visit_For(self, loop: For):
        loop = self.generic_visit(loop)
        if id(loop.loop_var) in self.row_vars and self.rows != self.c:
            return loop.replace(extent=IntImm(self.rows, loop.extent.dtype))
        return loop

    def visit_BlockRealize(self, br: BlockRealize):
        br = self.generic_visit(br)
        r, rest = _without_row_test(br.predicate, self.io, self.c, self.n)
        return br if r is None else br.replace(predicate=rest)


class _SplitRowTails(IRMutator):
    def __init__(self, any_tile: bool):
        super().__init__()
        self.any_tile = any_tile

    def visit_For(self, loop: For):
        loop = self.generic_visit(loop)
        tiles = _row_tiles(loop.extent)
        if tiles is None:
            return loop
        c, n = tiles
        io = loop.loop_var
        row_vars: set[int] = set()
        row_loops: list[For] = []
        dense = []
        column_tests = []

        def find(node):
            if isinstance(node, BlockRealize):
                r, rest = _without_row_test(node.predicate, io, c, n)
                if r is not None:
                    row_vars.add(id(r))
                    dense.append(block_rule(node.block) == RULE_DENSE)
                    # a test left on an accumulator tile (see unmask_tile_lanes)
                    column_tests.append(not _is_true(rest) and
                                        node.block.writes[0].buffer.scope == "local")
            elif isinstance(node, For):
                row_loops.append(node)
        post_order_visit(loop.body, find)
        rows = [f for f in row_loops if id(f.loop_var) in row_vars]
        # the dense family's tiles, and tiles whose accumulators are tested on their rows only
        # (a layer norm's or softmax's row sums; attention scores once unmask_tile_lanes took
        # the column tests off the tile): with a column test on the accumulators (attention
        # scores, with their column versions) they were no longer compacted to one tile
        # (a tile loop whose "rows" are all vectorized loops is over a tile's columns: they
        # keep their lane test)
        if not (any(dense) or (self.any_tile and not any(column_tests))) or not rows or \
                all(f.kind == "vectorized" for f in rows) or any(not (isinstance(f.extent, IntImm) and f.extent.value == c and
                                isinstance(f.min, IntImm) and f.min.value == 0) for f in rows):
            return loop
        left = n - io * c           # rows from this tile on
        # the versions go inside the loops between the row tiles and the tile (a tile's
        # column tiles): the innermost loop holding all of a tile's accesses stays the one of
        # one tile, so its accumulators are still compacted to one register tile
        chain, body = [], loop.body
        while isinstance(body, For) and id(body.loop_var) not in row_vars:
            chain.append(body)
            body = body.body
        whole = _TileOfRows(io, c, n, row_vars, c).visit(body)
        tails = _TileOfRows(io, c, n, row_vars, c - 1).visit(body)
        for r in range(c - 2, 0, -1):
            tails = IfThenElse(left == r, _TileOfRows(io, c, n, row_vars, r).visit(body),
                               tails)
        body = IfThenElse(left >= c, whole, tails)
        for outer in reversed(chain):
            body = outer.replace(body=body)
        return loop.replace(body=body)


class _UnmaskTileLanes(IRMutator):
    """See ``unmask_tile_lanes``."""

    def __init__(self):
        super().__init__()
        self.vector_vars: list[For] = []
        self.padded: dict[int, tuple] = {}   # id(tile buffer) -> (buffer, {dim: extent})

    def visit_For(self, loop: For):
        vector = loop.kind == "vectorized" and isinstance(loop.extent, IntImm)
        if vector:
            self.vector_vars.append(loop)
        try:
            return self.generic_visit(loop)
        finally:
            if vector:
                self.vector_vars.pop()

    def visit_BlockRealize(self, br: BlockRealize):
        br = self.generic_visit(br)
        blk = br.block
        store = blk.body
        if not self.vector_vars or not isinstance(store, BufferStore) or \
                store.buffer.scope != "local" or len(blk.writes) != 1:
            return br
        lane, keep = [], []
        for q in _conjuncts(br.predicate):
            (lane if any(uses_var(q, f.loop_var) for f in self.vector_vars) else keep).append(q)
        if not lane:
            return br
        # each lane test is ``o * w + v < n`` for the vectorized loop ``v`` of extent ``w``:
        # the tile's lanes reach index ``ceil(n / w) * w - 1`` of the dim the test bounds, so
        # the tile buffer is padded to that (the tile is compacted to its w lanes anyway)
        on_iters, pads = [], {}
        for q in lane:
            # a symbolic bound only: a constant tail (45 columns) was measured as it is
            if not (isinstance(q, LT) and isinstance(q.a, Add) and isinstance(q.a.a, Mul) and
                    isinstance(q.a.a.b, IntImm)) or isinstance(q.b, IntImm):
                return br
            loop = next((f for f in self.vector_vars if f.loop_var is q.a.b), None)
            width = q.a.a.b.value
            if loop is None or loop.extent.value != width:
                return br
            iv = next((iv for iv, value in zip(blk.iter_vars, br.iter_values)
                       if structural_equal(value, q.a)), None)
            dim = next((d for d, x in enumerate(store.indices) if x is iv.var), None) \
                if iv is not None else None
            if dim is None:
                return br
            on_iters.append(LT(iv.var, q.b))
            pads[dim] = FloorDiv(q.b + (width - 1), IntImm(width, q.b.dtype)) * \
                IntImm(width, q.b.dtype)
        value = store.value
        loads = []
        post_order_visit(value, lambda n: loads.append(n) if isinstance(n, BufferLoad) else None)
        if not loads:
            new_value = value         # an accumulator's init: every lane may hold it
        elif isinstance(value, Add) and isinstance(value.a, BufferLoad) and \
                value.a.buffer is store.buffer and \
                all(structural_equal(x, y) for x, y in zip(value.a.indices, store.indices)):
            cond = on_iters[0]
            for q in on_iters[1:]:
                cond = And(cond, q)
            zero = IntImm(0, value.dtype) if "int" in str(value.dtype) else \
                FloatImm(0.0, value.dtype)
            new_value = Add(value.a, Call(value.dtype, "if_then_else", (cond, value.b, zero)))
        else:
            return br
        known = self.padded.setdefault(id(store.buffer), (store.buffer, {}))[1]
        for dim, extent in pads.items():
            if dim in known and not structural_equal(known[dim], extent):
                return br
        known.update(pads)
        pred = keep[0] if keep else true()
        for q in keep[1:]:
            pred = And(pred, q)
        return br.replace(predicate=pred, block=blk.replace(body=store.replace(value=new_value)))


class _ReplaceBuffers(IRMutator):
    def __init__(self, mapping: dict):
        super().__init__()
        self.buffer_map.update(mapping)


def unmask_tile_lanes(func: PrimFunc) -> PrimFunc:
    """``func`` (scheduled) with the lane tests of its accumulator tiles (``local`` blocks
    under a vectorized loop, ``j < n`` on a symbolic column extent ``n``) moved off the tile: the
    init writes every lane, the update ``acc += if_then_else(j < n, a * b, 0)`` reads its
    inputs under the lane mask (masked loads) and updates every lane; the tile buffer is
    padded to whole vectors in that dim. A masked store to the tile kept LLVM from holding it
    in registers: the attention scores ``q @ k^T`` of 8 tokens on a symbolic sequence ran at
    2.3x the kernel built for 8 tokens. The tile's extra lanes are never written back (the
    write-back keeps its test).

    Examples
    --------
    >>> new_func = unmask_tile_lanes(scheduled_func)              # doctest: +SKIP
    """
    unmask = _UnmaskTileLanes()
    body = unmask.visit(func.body)
    if body is func.body:
        return func
    mapping = {}
    for buf, pads in unmask.padded.values():
        shape = tuple(pads.get(d, extent) for d, extent in enumerate(buf.shape))
        mapping[buf] = buf.replace(shape=shape)
    return func.replace(body=_ReplaceBuffers(mapping).visit(body))


def split_row_tails(func: PrimFunc, any_tile: bool = False) -> PrimFunc:
    """``func`` (scheduled) with each loop over the row tiles of a dense layer's (the
    ``RULE_DENSE`` family's) symbolic split,
    ``for io in range((n + c - 1) // c)``, running a tile of exactly the rows it has: ``if n -
    io * c >= c: <c rows> elif n - io * c == 1: <1 row> ... else: <c - 1 rows>``, each with its
    row loops of constant extent and no row tests. With a row test inside the reduction LLVM
    kept a partial tile's accumulators in memory: a dense layer of 4 x 256 x 1024 on a
    symbolic row count ran at 1.66x the time of the kernel built for 4 rows, one of 8 rows at
    1.2x. Each tile's body is copied ``c`` times (the tails are short); the copies go inside
    the loops between the row tiles and the tile (column tiles), so the accumulators are
    still compacted to one tile. The rows may be one dim or a product (``batch * seq``).

    ``any_tile``: also the tiles of other blocks whose accumulators (``local`` blocks) are
    tested on their rows only: a layer norm's or softmax's row sums (1.2x to 1.0x at 8 rows
    of a symbolic sequence) and attention scores once ``unmask_tile_lanes`` took their column
    tests off the tile. ``apply`` asks for it where no block has the row-vector version.

    Examples
    --------
    >>> new_func = split_row_tails(scheduled_func)                # doctest: +SKIP
    """
    body = _SplitRowTails(any_tile).visit(func.body)
    return func if body is func.body else func.replace(body=body)


def _versioned(cond: PrimExpr, then_func: PrimFunc, else_func: PrimFunc) -> PrimFunc:
    """One function running ``then_func``'s body when ``cond`` holds, else ``else_func``'s
    (two schedules of one kernel: same parameters and buffers)."""
    a, b = then_func.body, else_func.body
    # intermediates neither schedule replaced are the same Buffer in both: allocated once
    alloc = list(b.block.alloc_buffers)
    alloc += [x for x in a.block.alloc_buffers if not any(x is y for y in alloc)]
    root = b.block.replace(body=IfThenElse(cond, a.block.body, b.block.body),
                           alloc_buffers=tuple(alloc))
    return else_func.replace(body=b.replace(block=root))


def _schedule_vector_reduction(sch: Schedule, name: str, target: Target) -> bool:
    """A reduction whose output's last index ``j`` is read only as ``s * j + ...`` (``s`` in
    ``VECTOR_STRIDES``) in the last index of its inputs (pooling windows, NHWC pooling, column
    sums): the reduction loops go between ``j``'s
    vector-wide tile and the loops outside it, so each step of the window updates one vector of
    ``j`` accumulators (in a ``local`` tile, registers), the epilogue (an average's division)
    computed on the write-back; the outer loops parallel. False when the block is not of that
    form."""
    block = sch.get_block(name)
    blk = sch.get(block)
    if len(blk.writes) != 1 or blk.init is None or not isinstance(blk.body, BufferStore):
        return False
    store = blk.body
    spatial = [iv.var for iv in blk.iter_vars if iv.kind == "spatial"]
    if not store.indices or list(store.indices) != spatial:
        return False
    vj = spatial[-1]
    loads = []
    post_order_visit(store.value, lambda n: loads.append(n) if isinstance(n, BufferLoad) else None)
    if not any(ld.buffer is not store.buffer for ld in loads):
        return False
    for ld in loads:
        if ld.buffer is store.buffer:
            continue
        for k, e in enumerate(ld.indices):
            if uses_var(e, vj) and (k != len(ld.indices) - 1 or
                                 var_coeff(e, vj) not in VECTOR_STRIDES):
                return False   # a gather per step (see strided_reads)
    loops = sch.get_loops(block)
    n_sp = len(spatial)
    if len(loops) != len(blk.iter_vars) or len(loops) == n_sp:
        return False
    lj = loops[n_sp - 1]
    ej = loop_extent(sch.get(lj))
    if ej is not None and ej < 2:
        return False
    lanes = block_lanes(blk, target)
    if ej is None or ej > lanes:
        jo, ji = sch.split(lj, [None, lanes])
        outer = loops[:n_sp - 1] + [jo]
    else:
        ji, outer = lj, loops[:n_sp - 1]
    reduce_loops = loops[n_sp:]
    sch.reorder(*outer, *reduce_loops, ji)
    if outer:
        acc = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(acc, outer[-1])
        fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, reduce_loops[0])
    sch.vectorize(ji)
    # a small window (3 x 3) unrolled: straight-line code keeps the accumulator vector in a
    # register (a serial tap loop left it in memory, a store-to-load chain per tap)
    taps = 1
    for rv in reduce_loops:
        taps *= loop_extent(sch.get(rv)) or SYMBOLIC_EXTENT
    if taps <= 64:
        for rv in reduce_loops:
            sch.unroll(rv)
    for b in ([init, acc] if outer else [init]):
        finish_tile_block(sch, b, len(outer))
    if outer and loop_work(loop_nodes(sch, outer + [ji])) >= MIN_PARALLEL_WORK:
        sch.parallel(parallel_outer(sch, outer[:-1] if len(outer) > 1 else outer))
    return True


def _schedule_row_min_max(sch: Schedule, name: str, target: Target) -> bool:
    """A min or max over the innermost axis (int8-dynamic's per-row activation ranges) of a
    constant extent, a multiple of the vector lanes and at least two vectors: on one or four
    vectors of partial results per row (``rfactor``), updated a vector at a time; four are
    reduced to one a vector at a time (a second ``rfactor``), then to the row's (exact in any
    order, so the result is the scalar chain's); the rows parallel.
    A scalar chain of ``minss`` per row took 38 us for BERT's 128 x 768 rows. False when the
    block is not of that form."""
    block = sch.get_block(name)
    blk = sch.get(block)
    if len(blk.writes) != 1 or blk.init is None or not isinstance(blk.body, BufferStore) or \
            not isinstance(blk.body.value, (Max, Min)) or \
            sum(iv.kind != "spatial" for iv in blk.iter_vars) != 1:
        return False
    loops = sch.get_loops(block)
    lanes = block_lanes(blk, target)
    extent = loop_extent(sch.get(loops[-1]))
    if len(loops) != len(blk.iter_vars) or len(loops) < 2 or extent is None or \
            extent % lanes or extent < 2 * lanes or blk.iter_vars[-1].kind == "spatial":
        return False
    # four vectors of partial results where the row allows: four independent min / max chains
    width = 4 * lanes if extent % (4 * lanes) == 0 and extent >= 8 * lanes else lanes
    _, ki = sch.split(loops[-1], [None, width])
    stages = [sch.rfactor(ki, -1)]
    if width > lanes:
        # the four vectors of partial results to one, a vector at a time, before the scalar
        # chain: 64 scalar NaN-aware steps a row (a dependent chain, ~6 cycles a step) were
        # most of the kernel (BERT's 768-float rows: 12 vector steps a chain, then 64 scalar)
        _, li = sch.split(sch.get_loops(sch.get_block(name))[-1], [None, lanes])
        stages.append(sch.rfactor(li, -1))
    # the row loops of the reduction of the partial results: the partial ones go under them
    rows = sch.get_loops(sch.get_block(name))[:-1]
    for rf in reversed(stages):
        sch.compute_at(rf, rows[-1])
    for rf in stages:
        vectorize_partials(sch, rf)
    if loop_work(loop_nodes(sch, rows)) * extent >= MIN_PARALLEL_WORK:
        sch.parallel(sch.fuse(*rows) if len(rows) > 1 else rows[0])
    return True


def _schedule_reduction(sch: Schedule, name: str, target: Target) -> None:
    block = sch.get_block(name)
    blk = sch.get(block)
    loops = sch.get_loops(block)
    br = tree.find_block(sch.func, name)[0]
    spatial = []
    for rv in loops:
        var = sch.get(rv).loop_var
        kinds = {iv.kind for iv, v in zip(blk.iter_vars, br.iter_values) if uses_var(v, var)}
        if kinds != {"spatial"}:
            break
        spatial.append(rv)
    if not spatial:
        return
    if loop_work(loop_nodes(sch, loops)) < MIN_PARALLEL_WORK:
        return
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    sch.parallel(fused)


__all__ = ["apply", "is_scheduled", "schedule_blocks", "split_row_tails", "GEMV_MAX_ROWS"]
