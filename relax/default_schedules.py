"""Default CPU schedules: what ``relax.build`` applies to every kernel no tuning record covers,
so that an untuned build is already reasonably fast.

Generic rules, applied block by block to a ``te.create_prim_func``-style kernel (a root block
whose children are loop nests of one block each):

1. **Inline** cheap intermediate producers (padding, broadcasts, elementwise stages read by a
   single consumer) into their consumers (``compute_inline``).
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

import os
import warnings

from tilecraft.targets import Target
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import (Add, BufferLoad, Call, FloorDiv, FloorMod, IntImm, Mul, PrimExpr, Sub,
                           Var)
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import post_order_visit, substitute
from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.schedule import tree
from tilecraft.tensorir.stmt import Block, BlockRealize, BufferStore, For, IfThenElse

from .transform.alter_layout import cpu_tile_params
from .transform.packed_kernels import (RULE_CONV_NCHW, RULE_CONV_NCHW_CVEC, RULE_CONV_NHWC,
                                       RULE_DENSE, RULE_DW, RULE_DW_ROWS, RULE_PAD, RULE_POOL,
                                       RULE_POOL_ROWS, SCHEDULE_RULE)
from .transform.winograd import RULE_WINOGRAD_GEMM

MR = 6                    # rows of the register tile of matmul-like reductions
MIN_PARALLEL_WORK = 4096  # output elements below which a parallel launch costs more than it saves
SYMBOLIC_EXTENT = 64      # what a symbolic extent counts as in the work estimate
GEMV_MAX_ROWS = 3         # symbolic row counts up to this run rows on a 1-row micro-kernel
VECTOR_STRIDES = (1, 2, 3, 4)   # input strides a vectorized loop reads without a gather


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

    A kernel whose matmul-like block has a symbolic row count ``n`` gets two versions of its
    body, ``if n <= GEMV_MAX_ROWS: <row-vector version> else: <register-tile version>``: a tile of ``MR``
    rows at ``n = 1`` would be all tail (masked rows and a row test per reduction step), so
    small ``n`` runs each row on its own predicate-free ``1 x width`` micro-kernel instead.
    """
    if target.kind != "llvm" or is_scheduled(func):
        return func
    try:
        sch = Schedule(func)
        _schedule(sch, target)
        rows = _symbolic_rows(sch.func)
        if rows is None:
            return sch.func
        small = Schedule(func)
        if not _schedule(small, target, gemv_rows=rows):
            return sch.func  # no block took the row-vector schedule: one version
        return _versioned(rows <= IntImm(GEMV_MAX_ROWS, rows.dtype), small.func, sch.func)
    except ScheduleError:
        return func
    except Exception as err:  # a bug in a rule must not break the build: keep the kernel as is
        warnings.warn(f"default schedule of {func.attr_dict.get('global_symbol', '?')} failed "
                      f"({type(err).__name__}: {err}); the kernel is left unscheduled",
                      DefaultScheduleWarning)
        return func


# ---------------------------------------------------------------------------------------------


def _root_children(sch: Schedule) -> list[BlockRealize]:
    body = sch.func.body
    if not isinstance(body, BlockRealize):
        return []
    return tree.child_block_realizes(body.block.body)


def _intermediates(sch: Schedule) -> set:
    body = sch.func.body
    return {id(b) for b in body.block.alloc_buffers} if isinstance(body, BlockRealize) else set()


def _is_spatial(block: Block) -> bool:
    return all(iv.kind == "spatial" for iv in block.iter_vars)


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


def _rule(block: Block) -> str | None:
    """The ``"schedule_rule"`` annotation of a block (set by the packed kernels of
    ``relax.transform.packed_kernels``), or None."""
    value = dict(block.annotations or {}).get(SCHEDULE_RULE)
    return getattr(value, "value", value)


def _ann_int(block: Block, key: str, default: int | None = None) -> int:
    """The integer annotation ``key`` of ``block`` (``default`` when it has none, if given)."""
    ann = dict(block.annotations or {})
    if key not in ann and default is not None:
        return default
    value = ann[key]
    return int(getattr(value, "value", value))


def _feeds_tile(children: list[BlockRealize], block: Block) -> bool:
    """Whether ``block``'s result is read by a convolution or dense block (inlined there it
    would be recomputed in the micro-kernel's inner loop)."""
    mine = {id(w.buffer) for w in block.writes}
    return any(_rule(br.block) in (RULE_CONV_NCHW, RULE_CONV_NCHW_CVEC, RULE_CONV_NHWC,
                                   RULE_DENSE, RULE_WINOGRAD_GEMM)
               for br in children if br.block is not block and
               any(id(r.buffer) in mine for r in br.block.reads))


def _inline(sch: Schedule) -> None:
    changed = True
    while changed:
        changed = False
        inter = _intermediates(sch)
        children = _root_children(sch)
        for br in children:
            blk = br.block
            if not _is_spatial(blk) or blk.init is not None or len(blk.writes) != 1 or \
                    id(blk.writes[0].buffer) not in inter:
                continue
            if _rule(blk) is not None or _feeds_tile(children, blk):
                continue
            if not (_is_cheap(blk) or _consumers(children, blk) <= 1):
                continue
            try:
                sch.compute_inline(sch.get_block(blk.name))
            except ScheduleError:
                continue
            changed = True
            break


def _extent(loop: For) -> int | None:
    return loop.extent.value if isinstance(loop.extent, IntImm) else None


def _work(loops: list[For]) -> int:
    w = 1
    for f in loops:
        e = _extent(f)
        w *= SYMBOLIC_EXTENT if e is None else e
    return w


def _lanes(block: Block, target: Target) -> int:
    bits = [8 if w.buffer.dtype == "bool" else dt.bits(w.buffer.dtype) for w in block.writes]
    return max(4, target.vector_width // max(bits or [32]))


def _schedule(sch: Schedule, target: Target, gemv_rows: PrimExpr | None = None) -> int:
    """Schedule every block; ``gemv_rows``: matmul-like blocks with that (symbolic) row extent
    get the row-vector schedule (``_schedule_gemv``) instead of the register tile. Returns how
    many blocks got it."""
    _inline(sch)
    gemv = 0
    for br in _root_children(sch):
        blk = br.block
        if not any(b.block.name == blk.name for b in _root_children(sch)):
            continue  # inlined into a tile by an earlier block's rule
        try:
            rule = _rule(blk)
            if rule == RULE_CONV_NCHW:
                _schedule_conv_nchw(sch, blk.name, target)
            elif rule == RULE_CONV_NCHW_CVEC:
                _schedule_conv_nchw_cvec(sch, blk.name, target)
            elif rule == RULE_CONV_NHWC:
                _schedule_conv_nhwc(sch, blk.name, target)
            elif rule == RULE_DENSE:
                gemv += _schedule_dense(sch, blk.name, target, gemv_rows) == "gemv"
            elif rule == RULE_WINOGRAD_GEMM:
                _schedule_winograd_gemm(sch, blk.name, target)
            elif rule == RULE_PAD:
                _schedule_pad(sch, blk.name, target)
            elif rule == RULE_POOL_ROWS:
                continue    # placed and scheduled with its consumer (RULE_POOL)
            elif rule == RULE_POOL:
                _schedule_pool_separable(sch, blk.name, target)
            elif rule == RULE_DW_ROWS:
                continue    # placed and scheduled with its consumer (RULE_DW)
            elif rule == RULE_DW:
                _schedule_depthwise_rows(sch, blk.name, target)
            elif _is_spatial(blk):
                _schedule_spatial(sch, blk.name, target)
            else:
                done = _schedule_matmul_like(sch, blk.name, target, gemv_rows)
                if not done and not _schedule_vector_reduction(sch, blk.name, target):
                    _schedule_reduction(sch, blk.name, target)
                gemv += done == "gemv"
        except ScheduleError:
            continue  # this block keeps what was applied (each primitive preserves semantics)
    return gemv


def _loop_nodes(sch: Schedule, rvs) -> list[For]:
    return [sch.get(rv) for rv in rvs]


def _schedule_spatial(sch: Schedule, name: str, target: Target) -> None:
    block = sch.get_block(name)
    loops = sch.get_loops(block)
    if not loops:
        return
    nodes = _loop_nodes(sch, loops)
    lanes = _lanes(sch.get(block), target)
    work = _work(nodes)
    if len(loops) == 1:
        ext = _extent(nodes[0])
        if ext is not None and ext <= lanes:
            sch.vectorize(loops[0])
            return
        outer, inner = sch.split(loops[0], [None, lanes * 4])
        if work >= MIN_PARALLEL_WORK:
            sch.parallel(outer)
        sch.vectorize(inner)
        return
    if _extent(nodes[-1]) != 1 and not _strided_reads(sch, block, loops[-1]):
        sch.vectorize(_vector_inner(sch, loops[-1], lanes))
    elif _vector_runs(sch, block, loops, lanes):
        pass
    elif _transpose_tiles(sch, block, loops, work):
        return
    if work >= MIN_PARALLEL_WORK:
        sch.parallel(_parallel_outer(sch, loops[:-1]))


def _vector_runs(sch: Schedule, block_rv, loops: list, lanes: int) -> bool:
    """Vectorize the innermost loop in runs of ``c`` when every input reads its variable ``v``
    as ``v % c`` in the last index and ``v // c`` before it (a copy out of a channel-blocked
    buffer ``[.., o // c, .., o % c]``, such as the NHWC convolution's tile buffer): split by
    ``c``, the inner loop reads contiguously. ``c`` must be a multiple of the lanes dividing
    the loop. Returns whether it did."""
    loop = sch.get(loops[-1])
    var, extent = loop.loop_var, _extent(loop)
    runs = set()
    for idx in _input_indices(sch, block_rv):
        last = idx[-1]
        if not _uses(last, var):
            if any(_uses(e, var) for e in idx):
                return False
            continue
        if _unit_stride(last, var) and not any(_uses(e, var) for e in idx[:-1]):
            continue        # contiguous along the loop whatever the split
        if not (isinstance(last, FloorMod) and last.a is var and isinstance(last.b, IntImm)):
            return False
        c = last.b.value
        for e in idx[:-1]:
            if _uses(e, var) and not (isinstance(e, FloorDiv) and e.a is var and
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
    reads = _input_indices(sch, block_rv)
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
    t0, t1 = sch.split(t, [None, _tile_side(_extent(sch.get(t)))])
    l0, l1 = sch.split(out_inner, [None, _tile_side(_extent(sch.get(out_inner)))])
    outer = [rv for j, rv in enumerate(loops[:-1]) if j != k]
    sch.reorder(*outer, t0, l0, t1, l1)
    if work >= MIN_PARALLEL_WORK:
        sch.parallel(_parallel_outer(sch, outer + [t0]))
    return True


def _input_indices(sch: Schedule, block_rv) -> list[list[PrimExpr]]:
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


def _strided_reads(sch: Schedule, block_rv, loop_rv) -> bool:
    """Whether vectorizing ``loop_rv`` would gather some input: its variable outside the last
    index (a transpose) or scaled in it by other than 1 to 4 (the code generator loads strides
    of 2 to 4 as one wide load and a shuffle). Gathers measured 50-70x slower than a scalar
    loop on this machine's AVX-512 (Zen 4), so such loops stay scalar (LLVM vectorizes them
    with shuffles where it can)."""
    var = sch.get(loop_rv).loop_var
    for idx in _input_indices(sch, block_rv):
        for k, e in enumerate(idx):
            if _uses(e, var) and (k != len(idx) - 1 or _coeff(e, var) not in VECTOR_STRIDES):
                return True
    return False


def _parallel_outer(sch: Schedule, loops: list):
    """The loop to run in parallel over the outer ``loops`` of a nest: the constant loops after
    the last symbolic one, fused, else that symbolic loop (the ones before it stay serial).
    A fused symbolic index (``f // 3584 < n``) is one the verifier cannot prove in bounds, and
    it keeps its check in the inner loop."""
    symbolic = [k for k, rv in enumerate(loops) if _extent(sch.get(rv)) is None]
    start = symbolic[-1] + 1 if symbolic else 0
    const = loops[start:]
    if not const:
        return loops[-1]
    return sch.fuse(*const) if len(const) > 1 else const[0]


def _unit_stride(e: PrimExpr, v: Var) -> bool:
    """Whether ``e`` is ``v`` plus terms that do not use ``v`` (``x + rx - 1``)."""
    if e is v:
        return True
    if isinstance(e, Add):
        return (_unit_stride(e.a, v) and not _uses(e.b, v)) or \
            (_unit_stride(e.b, v) and not _uses(e.a, v))
    if isinstance(e, Sub):
        return _unit_stride(e.a, v) and not _uses(e.b, v)
    return False


def _uses(e: PrimExpr, v: Var) -> bool:
    found = []
    post_order_visit(e, lambda n: found.append(n) if n is v else None)
    return bool(found)


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
            if _uses(e, vj) and (k != len(idx) - 1 or not _unit_stride(e, vj)):
                return None
        if not any(_uses(e, vj) for e in idx):
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
    accumulators out of registers, so the tail is the last resort)."""
    if extent is not None:
        if extent <= lanes or (extent % lanes == 0 and extent <= 4 * lanes and
                               extent % (2 * lanes) != 0) or extent == 2 * lanes:
            return None, loop
        if extent % (2 * lanes) == 0:
            return tuple(sch.split(loop, [None, 2 * lanes]))
        return tuple(sch.split(loop, [None, lanes]))
    return tuple(sch.split(loop, [None, 2 * lanes]))


def _vector_inner(sch: Schedule, loop, lanes: int):
    """The loop to vectorize for an innermost spatial ``loop``: itself, or for a constant
    extent of a few odd-sized vectors (35), its vector-wide inner part (the code generator
    masks the tail of longer and symbolic loops itself)."""
    ext = _extent(sch.get(loop))
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
            if _uses(value, var):
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
    lanes = _lanes(blk, target)
    if gemv_rows is not None and li is not None and \
            _gemv_width(sch.get(li), sch.get(lj), lanes, gemv_rows) is not None:
        return _schedule_gemv(sch, block, spatial_loops, reduce_loops, li, lj, lanes,
                              _gemv_width(sch.get(li), sch.get(lj), lanes, gemv_rows))
    mr = MR if target.vector_width >= 512 or target.arch in ("aarch64", "arm") else 4
    ej = _extent(sch.get(lj))
    jo, ji = _split_lanes(sch, lj, ej, lanes)
    io = ii = None
    if li is not None:
        ei = _extent(sch.get(li))
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
    outer = [rv for rv in outer if _extent(sch.get(rv)) is not None] + \
        [rv for rv in outer if _extent(sch.get(rv)) is None]
    sch.reorder(*outer, *reduce_loops, *tile)
    # the accumulators of one tile live in a local buffer (registers once unrolled and
    # vectorized) written back after the reduction
    write_back = None
    if outer:
        write_back = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(write_back, outer[-1])
        _fuse_epilogue(sch, write_back)
    init = sch.decompose_reduction(block, reduce_loops[0])
    if ii is not None:
        sch.unroll(ii)
    sch.vectorize(ji)
    for b in (init, write_back):
        if b is None:
            continue
        own = sch.get_loops(b)[len(outer):]
        for rv in own[:-1]:
            if _extent(sch.get(rv)) is not None:
                sch.unroll(rv)
        if own:
            sch.vectorize(own[-1])
    if outer and _work(_loop_nodes(sch, outer + tile)) >= MIN_PARALLEL_WORK // 4:
        # Fuse only up to the first symbolic extent: a fused index ``f // (n // 6)`` is not
        # affine in a loop var, which keeps the code generator from shrinking the accumulator
        # tile to registers and from partitioning the tile loop on its ``i < n`` tail test.
        prefix = []
        for rv in outer:
            prefix.append(rv)
            if _extent(sch.get(rv)) is None:
                break
        fused = sch.fuse(*prefix) if len(prefix) > 1 and \
            all(_extent(sch.get(rv)) is not None for rv in prefix) else prefix[0]
        sch.parallel(fused)
    return True


GEMV_VECTORS = 16   # vectors per row of the row-vector micro-kernel (16 x 16 lanes: 256 floats)


def _gemv_width(li: For, lj: For, lanes: int, rows: PrimExpr) -> int | None:
    """Columns per row-vector micro-kernel for a tile with row loop ``li`` and column loop
    ``lj``: a multiple of ``2 * lanes`` dividing the column extent into at least two parallel
    parts, when the row extent is ``rows``; else None."""
    ej = _extent(lj)
    if _extent(li) is not None or not bool(li.extent == rows) or ej is None:
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
    outer = [rv for rv in outer if _extent(sch.get(rv)) is not None] + [jo] + \
        [rv for rv in outer if _extent(sch.get(rv)) is None] + [li]
    sch.reorder(*outer, *reduce_loops, jm, ji)
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, li)
    _fuse_epilogue(sch, write_back)
    init = sch.decompose_reduction(block, reduce_loops[0])
    sch.unroll(jm)
    sch.vectorize(ji)
    for b in (init, write_back):
        own = sch.get_loops(b)[len(outer):]
        for rv in own[:-1]:
            if _extent(sch.get(rv)) is not None:
                sch.unroll(rv)
        if own:
            sch.vectorize(own[-1])
    prefix = outer[:outer.index(jo) + 1]
    if _work(_loop_nodes(sch, prefix + [jm, ji] + reduce_loops)) >= 16 * MIN_PARALLEL_WORK:
        sch.parallel(sch.fuse(*prefix) if len(prefix) > 1 else prefix[0])
    return "gemv"


def _symbolic_rows(func: PrimFunc) -> PrimExpr | None:
    """The row extent of the first register tile of ``func`` (a scheduled kernel) whose rows
    are split from a symbolic extent: the ``n`` of ``for i_0 in range((n + 5) // 6)``."""
    for loop in _loops_of(func):
        ext = loop.extent
        # (n + MR - 1) // MR: the outer row loop of a symbolic split
        if isinstance(ext, FloorDiv) and isinstance(ext.b, IntImm) and \
                ext.b.value in (MR, 4) and isinstance(ext.a, Add) and \
                isinstance(ext.a.b, IntImm) and ext.a.b.value == ext.b.value - 1 and \
                isinstance(ext.a.a, Var):
            return ext.a.a
    return None


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


def _fuse_epilogue(sch: Schedule, write_back) -> None:
    """Compute an elementwise consumer of the tile's result (bias, activation) in the tile's
    write-back, from the accumulators, so the result never goes to memory before it: the
    consumer is inlined into the write-back (``reverse_compute_inline``) when it is the only
    reader of an intermediate result."""
    wb = sch.get(write_back)
    out = wb.writes[0].buffer
    if id(out) not in _intermediates(sch):
        return
    readers = [br for br in _root_children(sch) if br.block is not wb and
               any(r.buffer is out for r in br.block.reads)]
    if len(readers) != 1 or not _is_spatial(readers[0].block):
        return
    try:
        sch.reverse_compute_inline(sch.get_block(readers[0].block.name))
    except ScheduleError:
        pass  # not elementwise over the result: it is scheduled on its own


def _coeff(e: PrimExpr, v: Var) -> int | None:
    """``c`` when ``e`` is ``c * v`` plus terms free of ``v`` (``ow * 2 + rw``), else None."""
    if e is v:
        return 1
    if isinstance(e, Mul):
        for k, other in ((e.a, e.b), (e.b, e.a)):
            if isinstance(k, IntImm):
                c = _coeff(other, v)
                return None if c is None else c * k.value
        return None
    if isinstance(e, (Add, Sub)):
        ua, ub = _uses(e.a, v), _uses(e.b, v)
        if ua and ub:
            return None
        if ua:
            return _coeff(e.a, v)
        c = _coeff(e.b, v) if ub else None
        return None if c is None else (c if isinstance(e, Add) else -c)
    return None


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
            if _uses(e, vj) and (k != len(ld.indices) - 1 or
                                 _coeff(e, vj) not in VECTOR_STRIDES):
                return False   # a gather per step (see _strided_reads)
    loops = sch.get_loops(block)
    n_sp = len(spatial)
    if len(loops) != len(blk.iter_vars) or len(loops) == n_sp:
        return False
    lj = loops[n_sp - 1]
    ej = _extent(sch.get(lj))
    if ej is not None and ej < 2:
        return False
    lanes = _lanes(blk, target)
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
        _fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, reduce_loops[0])
    sch.vectorize(ji)
    # a small window (3 x 3) unrolled: straight-line code keeps the accumulator vector in a
    # register (a serial tap loop left it in memory, a store-to-load chain per tap)
    taps = 1
    for rv in reduce_loops:
        taps *= _extent(sch.get(rv)) or SYMBOLIC_EXTENT
    if taps <= 64:
        for rv in reduce_loops:
            sch.unroll(rv)
    for b in ([init, acc] if outer else [init]):
        _finish_tile_block(sch, b, len(outer))
    if outer and _work(_loop_nodes(sch, outer + [ji])) >= MIN_PARALLEL_WORK:
        sch.parallel(_parallel_outer(sch, outer[:-1] if len(outer) > 1 else outer))
    return True


def _schedule_reduction(sch: Schedule, name: str, target: Target) -> None:
    block = sch.get_block(name)
    blk = sch.get(block)
    loops = sch.get_loops(block)
    br = tree.find_block(sch.func, name)[0]
    spatial = []
    for rv in loops:
        var = sch.get(rv).loop_var
        kinds = {iv.kind for iv, v in zip(blk.iter_vars, br.iter_values) if _uses(v, var)}
        if kinds != {"spatial"}:
            break
        spatial.append(rv)
    if not spatial:
        return
    if _work(_loop_nodes(sch, loops)) < MIN_PARALLEL_WORK:
        return
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    sch.parallel(fused)


# ---------------------------------------------------------------------------------------------
# the kernels on packed weights (relax.transform.packed_kernels), by their "schedule_rule"

MAX_UNROLLED_FMAS = 256   # unroll a convolution's kernel rows too while the body stays this small


def _cores(target: Target) -> int:
    return target.num_cores or os.cpu_count() or 1


def _tile_tail(sch: Schedule, block_rv, outer_count: int) -> list:
    """The loops of ``block_rv`` below its first ``outer_count`` loops."""
    return sch.get_loops(block_rv)[outer_count:]


def _finish_tile_block(sch: Schedule, block_rv, outer_count: int) -> None:
    """Unroll the constant loops of an init or write-back block inside a tile and vectorize its
    innermost loop."""
    own = _tile_tail(sch, block_rv, outer_count)
    for rv in own[:-1]:
        if _extent(sch.get(rv)) is not None:
            sch.unroll(rv)
    if own:
        sch.vectorize(own[-1])


def _schedule_conv_nchw(sch: Schedule, name: str, target: Target) -> None:
    """The flat direct NCHW convolution (``benchmarks/schedules/conv2d.py``'s recipe):

    ``R`` output channels x ``V`` vectors of ``L`` flat positions accumulate in a ``local``
    tile (registers) over the reduction ``(rc, ry, rx)``, the taps, channels and vectors
    unrolled and the lanes vectorized, so the inner loop over input channels is
    ``KH * KW * R * V`` FMAs on registers; the (batch, position-tile) loops run in parallel
    (with the channel blocks too when there are few position tiles). When the block writes
    NCHW itself (no junk columns), its elementwise epilogue is computed in the write-back.
    """
    block = sch.get_block(name)
    blk = sch.get(block)
    r, v, lanes = (_ann_int(blk, k) for k in ("oc_block", "vectors", "lanes"))
    loops = sch.get_loops(block)
    direct = len(loops) == 7
    if direct:
        b, o, y, x, rc, ry, rx = loops
        p = sch.fuse(y, x)
    elif len(loops) == 6:
        b, o, p, rc, ry, rx = loops
    else:
        raise ScheduleError("conv2d_nchw", f"block {name}: unexpected loop nest", blk)
    o0, o1 = sch.split(o, [None, r])
    p0, p1, p2 = sch.split(p, [None, v, lanes])
    # Parallel over the position tiles when there are enough (each tile's input run is then
    # reused by all channel blocks in one core's cache), else over the channel blocks. Loops
    # are not fused: a fused index (f // P0) is not affine, which would keep the code
    # generator from shrinking the accumulators to one tile (registers).
    cores = _cores(target)
    tiles, blocks = _extent(sch.get(p0)), _extent(sch.get(o0))
    if tiles >= 4 * cores or tiles >= blocks:
        chunk = _position_chunk(tiles, v * lanes, target)
        if chunk > 1:
            # runs of ~256 positions: a channel block's output and residual rows are read
            # and written as runs of whole lines, not one line per channel and tile (a
            # 1x1 layer's fused residual read at 16 positions per channel and tile ran
            # 1.3x slower than through a separate copy; Zen 3)
            p00, p01 = sch.split(p0, [None, chunk])
            pos = [p00, o0, p01]
        else:
            pos = [p0, o0]
        if _balance(_extent(sch.get(pos[0])), cores) < 0.95 and blocks % cores == 0:
            # the position chunks split badly over the cores (7 on 2 cores: 7/8 of the time
            # in use): each core takes its share of the channel blocks instead, over all
            # positions (its copy of the input read once more; ResNet-50's 1x1 128 -> 512
            # layers at 28 x 28 and 256 -> 1024 at 14 x 14 ran 1.08-1.12x faster on two
            # cores, alone and in the model; Zen 3)
            oc, o0 = sch.split(o0, [cores, None])
            pos = [oc, pos[0], o0] + pos[2:]
        sch.reorder(b, *pos, rc, ry, rx, o1, p1, p2)
        sch.parallel(pos[0])
        tile = pos[-1]
        outer = 1 + len(pos)
    else:
        sch.reorder(b, o0, p0, rc, ry, rx, o1, p1, p2)
        sch.parallel(o0)
        tile = p0
        outer = 3
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tile)
    # the flat result without junk columns is the NCHW output reshaped: the epilogue's read
    # ``flat[o, y * W + x]`` inverts (``reverse_compute_inline``) and it fuses too
    _fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, rc)
    taps = (_extent(sch.get(ry)) or 1) * (_extent(sch.get(rx)) or 1)
    for loop in [rx, o1, p1] + ([ry] if taps * r * v <= MAX_UNROLLED_FMAS else []):
        sch.unroll(loop)
    sch.vectorize(p2)
    _finish_tile_block(sch, init, outer)
    # the write-back in the accumulation's (R, V, L) shape, so the tile stays in registers
    own = _tile_tail(sch, acc, outer)
    rows = [rv for rv in own if _extent(sch.get(rv)) != 1]
    if len(rows) > 2:
        rows = [rows[0], sch.fuse(*rows[1:])]
    if len(rows) == 2 and _extent(sch.get(rows[1])) == v * lanes:
        _, wl = sch.split(rows[1], [v, lanes])
        for rv in _tile_tail(sch, acc, outer)[:-1]:
            sch.unroll(rv)
        sch.vectorize(wl)
    else:
        _finish_tile_block(sch, acc, outer)


def _balance(extent: int, cores: int, last: float = 1.0) -> float:
    """The share of the cores' time in use when a parallel loop of ``extent`` iterations runs
    in even chunks on ``cores`` cores (7 on 2: 0.875), its last iteration ``last`` of the
    others' work (a ragged tile)."""
    if cores <= 1 or extent <= 0:
        return 1.0
    return (extent - 1 + last) / (cores * -(-extent // cores))


def _position_chunk(tiles: int, tile_len: int, target: Target) -> int:
    """Position tiles per parallel chunk of the flat convolution on a 16-register target:
    the most that divides ``tiles``, covers at most 256 positions and leaves two chunks per
    core; 1 (no chunks) on targets with 32 registers, whose tiles are wider."""
    if target.kind != "llvm" or cpu_tile_params(target)[1] >= 32:
        return 1
    fits = [d for d in range(1, tiles + 1) if tiles % d == 0 and d * tile_len <= 256 and
            tiles // d >= 2 * _cores(target)]
    return max(fits, default=1)


def _conv_tile_block(sch: Schedule, name: str, keys: tuple, count: int = 7):
    """(block, its integer annotations ``keys``, its ``count`` loops) of a packed 2-D
    convolution block (batch, three spatial loops, three reduction loops; two spatial loops
    over a flattened plane)."""
    block = sch.get_block(name)
    blk = sch.get(block)
    loops = sch.get_loops(block)
    if len(loops) != count:
        raise ScheduleError("conv2d", f"block {name}: unexpected loop nest", blk)
    return block, tuple(_ann_int(blk, k) for k in keys), loops


def _schedule_conv_nchw_cvec(sch: Schedule, name: str, target: Target) -> None:
    """The NCHW convolution with the output channels in the lanes (``conv2d_nchw_cvec``): a
    tile of ``rows`` output positions of one row x ``width`` channels accumulates in
    registers over ``(rc, ry, rx)`` -- per step ``rows`` broadcast inputs, ``width / lanes``
    vector loads of the packed weight, ``rows * width / lanes`` FMAs. The channel blocks run
    outermost and in parallel, so a block's weights stay in its core's cache while the tiles
    of the image stream by. The write-back (with the fused epilogue) runs per channel on a
    vector of the tile's positions, a run of one NCHW row: the accumulators (a vector of
    channels per position) are read across, which the code generator turns into a transpose
    in registers (``_lane_loads``). Storing each position's channels one by one instead (a
    few hundred scalar epilogues per tile) ran ResNet-50's channel-vector layers 5-7% slower
    on their own and the model's kernels 1.4% slower in all (one thread, Zen 4)."""
    if _ann_int(sch.get(sch.get_block(name)), "across_rows", 0):
        _schedule_conv_cvec_tiles(sch, name, target)
        return
    block, (rows, width, lanes), loops = _conv_tile_block(sch, name, ("rows", "width", "lanes"))
    b, o, y, x, rc, ry, rx = loops
    o0, o1 = sch.split(o, [None, width])
    x0, x1 = sch.split(x, [None, rows])
    sch.reorder(b, o0, y, x0, rc, ry, rx, x1, o1)
    par = o0 if (_extent(sch.get(o0)) or 0) >= 2 * _cores(target) else y
    sch.parallel(par)
    outer = 4
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, x0)
    _fuse_epilogue(sch, acc)
    # the accumulators channel-minor, so a vector of channels is one contiguous run (one
    # register); in the output's NCHW order its lanes would be a plane apart (a gather)
    sch.transform_layout(block, 0, lambda b_, o_, y_, x_: (b_, y_, x_, o_))
    init = sch.decompose_reduction(block, rc)
    _cvec_inner(sch, rc, ry, rx, x1, o1, rows, width, lanes)
    _finish_tile_block(sch, init, outer)
    _cvec_write_back(sch, acc, outer, rows)


def _cvec_write_back(sch: Schedule, acc, outer: int, rows: int) -> None:
    """The channel-vector tile's write-back: per channel (unrolled), a vector of the tile's
    positions -- a run of one NCHW row (or of the flattened plane), so the epilogue's loads
    (residual) and the store are vector accesses; the accumulators are read across (a
    transpose, lane extracts and shuffles in registers)."""
    *chans, positions = _tile_tail(sch, acc, outer)
    for rv in chans:
        sch.unroll(rv)
    if rows > 1:
        sch.vectorize(positions)
    else:
        sch.unroll(positions)


def _cvec_inner(sch: Schedule, rc, ry, rx, x1, o1, rows: int, width: int, lanes: int,
                broadcasts_live: bool = False) -> None:
    """The channel-vector tile's inner loops: positions and channel vectors unrolled, the
    lanes vectorized, the taps unrolled (the kernel rows too when the FMAs stay few).
    ``broadcasts_live``: with fewer positions than weight vectors, the weight vectors go
    outside the positions, so the broadcasts stay in registers and each weight vector is
    loaded for its FMAs and dropped (``rows + 1`` registers besides the accumulators instead
    of ``vectors + 1``: 3 x 32 on AVX2 fits 16 registers only so)."""
    ov, ol = sch.split(o1, [None, lanes])
    if broadcasts_live and rows < width // lanes:
        sch.reorder(ov, x1)
    sch.unroll(x1)
    sch.unroll(ov)
    sch.vectorize(ol)
    taps = (_extent(sch.get(ry)) or 1) * (_extent(sch.get(rx)) or 1)
    sch.unroll(rx)
    if taps * rows * (width // lanes) <= MAX_UNROLLED_FMAS:
        sch.unroll(ry)


def _schedule_conv_cvec_tiles(sch: Schedule, name: str, target: Target) -> None:
    """The channel-vector convolution over tiles of the flattened output plane
    (``conv2d_nchw_cvec`` with ``across_rows``): ``rows`` consecutive positions (any count:
    the last tile is padded) x ``width`` channels accumulate in registers, as in
    ``_schedule_conv_nchw_cvec``, into the padded plane of tiles; the copy from there to
    NCHW (with the fused epilogue) is a stage of its own.

    With ``k_chunk``, the reduction runs in chunks of that many input channels and each
    channel block's tiles all accumulate one chunk before the next: the chunk's weights
    stay in L1 while the tiles stream by, and each tile's accumulators are loaded from the
    tile buffer (channel-minor there, one vector per position and channel vector) before
    the chunk and stored after it. Without chunks, a long reduction reads its channel
    block's whole weight slice from L2 for every tile (Zen 3: the 7 x 7 1x1 layers of
    ResNet-50 ran 1.3-1.5x faster chunked). Chunks need channel blocks to run in parallel
    (two per core); with fewer, the tiles run in parallel unchunked."""
    block = sch.get_block(name)
    blk = sch.get(block)
    rows, width, lanes, k_chunk = (_ann_int(blk, k) for k in
                                   ("rows", "width", "lanes", "k_chunk"))
    loops = sch.get_loops(block)
    if len(loops) != 6:
        raise ScheduleError("conv2d", f"block {name}: unexpected loop nest", blk)
    b, o, p, rc, ry, rx = loops
    o0, o1 = sch.split(o, [None, width])
    x0, x1 = sch.split(p, [None, rows])
    blocks = _extent(sch.get(o0)) or 0
    if 0 < k_chunk < (_extent(sch.get(rc)) or 0) and blocks >= 2 * _cores(target):
        rc0, rc1 = sch.split(rc, [None, k_chunk])
        sch.reorder(b, o0, rc0, x0, rc1, ry, rx, x1, o1)
        sch.parallel(o0)
        # the tile buffer is the accumulator: LLVM keeps a tile's vectors in registers over
        # the chunk (their addresses do not change in it)
        sch.transform_layout(block, 0, lambda b_, o_, p_: (b_, o_ // width, p_, o_ % width))
        init = sch.decompose_reduction(block, rc0)
        _cvec_inner(sch, rc1, ry, rx, x1, o1, rows, width, lanes, broadcasts_live=True)
        sch.vectorize(sch.get_loops(init)[-1])
        return
    sch.reorder(b, o0, x0, rc, ry, rx, x1, o1)
    sch.parallel(o0 if blocks >= 2 * _cores(target) else x0)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, x0)
    sch.transform_layout(block, 0, lambda b_, o_, p_: (b_, p_, o_))
    init = sch.decompose_reduction(block, rc)
    _cvec_inner(sch, rc, ry, rx, x1, o1, rows, width, lanes, broadcasts_live=True)
    _finish_tile_block(sch, init, 3)
    _cvec_write_back(sch, acc, 3, rows)


def _schedule_pad(sch: Schedule, name: str, target: Target) -> None:
    """A padding / phase-plane copy: rows vectorized, the loops above them parallel."""
    block = sch.get_block(name)
    blk = sch.get(block)
    loops = sch.get_loops(block)
    ann = dict(blk.annotations or {})
    *outer, last = loops
    if "row_width" in ann:           # flat planes (n, c, [a, b,] q): split q into rows
        _, last = sch.split(last, [None, _ann_int(blk, "row_width")])
    width, lanes = _extent(sch.get(last)), _lanes(blk, target)
    # a row under two vectors with a ragged end (9 wide: a 7 x 7 plane padded by one) stays
    # scalar: LLVM's masked 9-lane vector of its border test ran ResNet-50's 3x3 512 -> 512
    # layer's padding at ~100 cycles a row, 40% of the layer (Zen 3); scalar, the layer ran
    # 1.16x faster (512 -> 128: 1.75x). Rows of whole vectors or two and more keep theirs.
    ragged = width is not None and width % lanes != 0 and width < 2 * lanes
    if not ragged and not _strided_reads(sch, block, last):   # phase planes: every s-th column
        sch.vectorize(last)
    if _work(_loop_nodes(sch, sch.get_loops(block))) >= MIN_PARALLEL_WORK:
        sch.parallel(_parallel_outer(sch, outer))


def _rows_per_output_row(sch: Schedule, block, rule: str, row_loops: list):
    """Run ``block``'s output rows (its ``row_loops``, fused) in parallel when the work pays
    for a launch, and compute its producer marked ``rule`` (the input rows one output row
    reads) inside that loop, so each output row's input rows are made just before they are
    read (from L1). Returns the producer."""
    producer = next(p for p in sch.get_producers(block) if _rule(sch.get(p)) == rule)
    par = _parallel_outer(sch, row_loops)
    if _work(_loop_nodes(sch, sch.get_loops(block))) >= MIN_PARALLEL_WORK:
        sch.parallel(par)
    sch.compute_at(producer, par)
    return producer


def _schedule_pool_separable(sch: Schedule, name: str, target: Target) -> None:
    """The two passes of ``pool2d_nchw_separable``: output rows ``(c, y)`` in parallel; per
    output row the row pass (``RULE_POOL_ROWS``) fills one padded row, then the column pass
    reads it back with the stride. In both, a vector of lanes is the register the window
    reduces into (the reduction loop outside the lanes, the init decomposed above it), so a
    window costs ``KH + KW`` vector operations and each output is stored once."""
    block = sch.get_block(name)
    *spatial, rx = sch.get_loops(block)
    lanes = _lanes(sch.get(block), target)
    # before the column split: one padded row's region
    producer = _rows_per_output_row(sch, block, RULE_POOL_ROWS, spatial[:-1])
    for blk in (block, producer):
        *_, col, red = sch.get_loops(blk)
        c0, c1 = sch.split(col, [None, lanes])
        sch.reorder(c0, red, c1)
        init = sch.decompose_reduction(blk, red)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(c1)


def _row_vector(width: int | None, lanes: int) -> int:
    """The vector length for a row of ``width`` outputs: the row itself when it fits in
    ``lanes``, else its largest divisor from ``lanes / 2`` to ``lanes`` (56 -> 14), else
    ``lanes``. A tail would be a predicated vector, and a masked accumulator goes through
    the stack on every tap (a store-forwarding stall each: 3x slower at 56 x 56)."""
    if width is None:
        return lanes
    if width <= lanes:
        return width
    fits = [d for d in range(lanes, lanes // 2 - 1, -1) if width % d == 0]
    return fits[0] if fits else lanes


def _schedule_depthwise_rows(sch: Schedule, name: str, target: Target) -> None:
    """``depthwise_conv2d_nchw_rows``: output rows ``(n, c, y)`` in parallel; per output row
    the ``KH`` padded input rows are filled (vectorized) right before the row is computed, so
    they are read from L1. A vector of output columns accumulates in a register over the
    unrolled ``KH x KW`` taps (one broadcast weight and one load each: unit stride, or every
    ``s``-th element of the row buffer), and the epilogue (bias, activation) is applied to it
    before the single store."""
    block = sch.get_block(name)
    b, o, y, x, ry, rx = sch.get_loops(block)
    lanes = _lanes(sch.get(block), target)
    producer = _rows_per_output_row(sch, block, RULE_DW_ROWS, [b, o, y])
    *_, q = sch.get_loops(producer)
    _, q1 = sch.split(q, [None, lanes])
    sch.vectorize(q1)
    x0, x1 = sch.split(x, [None, _row_vector(_extent(sch.get(x)), lanes)])
    sch.reorder(x0, ry, rx, x1)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, x0)
    _fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, ry)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.unroll(ry)
    sch.unroll(rx)
    sch.vectorize(x1)
    sch.vectorize(sch.get_loops(acc)[-1])


def _schedule_conv_nhwc(sch: Schedule, name: str, target: Target) -> None:
    """The NHWC convolution: a tile of ``rows`` output pixels x ``width`` channels (one packed
    panel) accumulates in registers over ``(ry, rx, rc)``: per step ``rows`` broadcast inputs,
    ``width / lanes`` vector loads of the panel, ``rows * width / lanes`` FMAs. Image rows
    (with the batch) run in parallel; the epilogue is computed in the write-back."""
    # ``flat``: tiles of the whole plane's pixels (a 1x1 unit-stride layer: output pixel p
    # reads input pixel p), so a 14 x 14 plane takes 32 tiles of 6 and one of 4 where each
    # row would split 6 + 6 + 2
    flat = _ann_int(sch.get(sch.get_block(name)), "flat", 0)
    block, (rows, width), loops = _conv_tile_block(sch, name, ("rows", "width"),
                                                   6 if flat else 7)
    if flat:
        (b, x, o, ry, rx, rc), rows_of = loops, []
    else:
        b, y, x, o, ry, rx, rc = loops
        rows_of = [y]
    pixels = _extent(sch.get(x))
    o0, o1 = sch.split(o, [None, width])
    x0, x1 = sch.split(x, [None, rows])
    # one parallel loop, not a fused one (see _schedule_conv_nchw): the image rows, or the
    # first of the loops below them with enough iterations that split evenly over the cores
    # (a 7 x 7 plane's 9 tiles of 6 pixels on two cores, one of them a single pixel, kept a
    # core idle for a ninth of the time: its 16-channel panels split instead)
    cores = _cores(target)
    candidates = rows_of + [x0, o0]

    def balance(rv) -> float:
        ragged = rv is x0 and pixels is not None and pixels % rows
        return _balance(_extent(sch.get(rv)), cores, (pixels % rows) / rows if ragged else 1.0)

    enough = [rv for rv in candidates if (_extent(sch.get(rv)) or 0) >= 2 * cores]
    par = next((rv for rv in enough if balance(rv) >= 0.95),
               enough[0] if enough else candidates[0])
    tiles = [o0, x0] if par is o0 else [x0, o0]
    sch.reorder(b, *rows_of, *tiles, ry, rx, rc, x1, o1)
    outer = len(rows_of) + 3
    sch.parallel(par)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tiles[1])
    _fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, ry)
    sch.unroll(x1)
    sch.vectorize(o1)
    if (_extent(sch.get(rx)) or 1) * rows * width // max(1, _lanes(sch.get(block), target)) <= \
            MAX_UNROLLED_FMAS:
        sch.unroll(rx)
    _finish_tile_block(sch, init, outer)
    _finish_tile_block(sch, acc, outer)


def _schedule_winograd_gemm(sch: Schedule, name: str, target: Target) -> None:
    """The 16 products of a Winograd convolution (``transform.winograd``), ``M[ab, n, t, o] =
    sum_c V[ab, n, t, c] * U[ab, o // NR, c, o % NR]``: a tile of ``rows`` tiles x ``NR``
    channels (one packed panel) accumulates in registers over the input channels, as in the
    NHWC 1x1 kernel. The (position, panel) pairs are fused and run in parallel: a core's run
    of them keeps one position's ``V`` in its L2 while the panels, each read once, stream by;
    the image's tiles (a multiple of ``rows``: no ragged tile) are inside."""
    block = sch.get_block(name)
    blk = sch.get(block)
    rows, width = _ann_int(blk, "rows"), _ann_int(blk, "width")
    loops = sch.get_loops(block)
    if len(loops) != 5:
        raise ScheduleError("winograd", f"block {name}: unexpected loop nest", blk)
    ab, b, t, o, k = loops
    o0, o1 = sch.split(o, [None, width])
    t0, t1 = sch.split(t, [None, rows])
    sch.reorder(ab, o0, b, t0, k, t1, o1)
    par = sch.fuse(ab, o0)
    sch.parallel(par)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, t0)
    init = sch.decompose_reduction(block, k)
    sch.unroll(t1)
    sch.vectorize(o1)
    _finish_tile_block(sch, init, 3)
    _finish_tile_block(sch, acc, 3)


def _schedule_dense(sch: Schedule, name: str, target: Target,
                    gemv_rows: PrimExpr | None = None) -> str:
    """``x @ W`` on panels ``[N/NR, K, NR]``: an ``MR x NR`` register tile (6 x 64 with
    AVX-512: 24 accumulators, four vector loads of one contiguous panel run and six broadcasts
    per step of ``k``), panels outermost and parallel so that a panel stays in cache while the
    row tiles stream over it, the epilogue computed in the write-back. Few rows (at most
    ``GEMV_MAX_ROWS``, static, or the symbolic ``gemv_rows`` of the small version) run a row
    at a time on a ``1 x NR`` tile with the rows outside the reduction, nothing masked."""
    block = sch.get_block(name)
    blk = sch.get(block)
    width = _ann_int(blk, "width")
    loops = sch.get_loops(block)
    *lead, i, j, k = loops
    ei = _extent(sch.get(i))
    gemv = gemv_rows is not None and ei is None and bool(sch.get(i).extent == gemv_rows)
    jo, ji = sch.split(j, [None, width])
    mr = MR if target.vector_width >= 512 or target.arch in ("aarch64", "arm") else 4
    if gemv:
        io, ii = None, i
        order = [jo] + lead + [i, k, ji]
        tile_loop = i
    else:
        if ei is None:
            io, ii = sch.split(i, [None, mr])
        elif ei > mr:
            d = max(f for f in range(1, mr + 1) if ei % f == 0)
            io, ii = sch.split(i, [None, d if d >= (mr + 1) // 2 else mr])
        else:
            io, ii = None, i
        order = [jo] + lead + ([io] if io is not None else []) + [k, ii, ji]
        tile_loop = io if io is not None else (lead[-1] if lead else jo)
    sch.reorder(*order)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tile_loop)
    _fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, k)
    if not gemv:
        sch.unroll(ii)
    sch.vectorize(ji)
    outer = len(sch.get_loops(init)) - (1 if gemv else 2)
    _finish_tile_block(sch, init, outer)
    _finish_tile_block(sch, acc, outer)
    # parallel: the panels when there are enough of them, else the row tiles
    panels = _extent(sch.get(jo)) or 1
    rows_work = _work(_loop_nodes(sch, lead + ([io] if io is not None else [])))
    if panels * rows_work * width * (_extent(sch.get(k)) or SYMBOLIC_EXTENT) < \
            16 * MIN_PARALLEL_WORK:
        return "gemv" if gemv else "tile"
    if panels >= 2 * _cores(target) or (io is None and not lead):
        sch.parallel(jo)
    elif io is not None:
        sch.parallel(io)
    else:
        sch.parallel(jo)
    return "gemv" if gemv else "tile"


__all__ = ["apply", "is_scheduled"]
