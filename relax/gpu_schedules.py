"""Default GPU schedules: what ``relax.build`` applies, for an ``opencl`` or ``webgpu`` target, to
every kernel no tuning record covers — every nest bound to work-groups and threads, so an
untuned GPU build runs at a sensible speed (``relax/default_schedules.py`` is the CPU one).

Rules, tried in order on a ``te.create_prim_func``-style kernel (a root block whose children
are loop nests of one block each):

1. **Inline** cheap spatial producers into their consumers (``compute_inline``) and
   elementwise epilogues into their producers (``reverse_compute_inline``) — except a
   convolution's padding, which stays its own kernel (its window tile then stays inside the
   padded tensor and needs no halo test).
2. **GEMM-like reductions** (two inputs read with the reduction variable: matmul, batch
   matmul, dense, convolution) as an (implicit) GEMM. The output loops are grouped by the
   input that reads them: rows (the largest loop of the first input's group: a matmul's ``i``,
   a convolution's output channels), columns (the innermost loop's group: a matmul's ``j``, a
   convolution's output image as a 2-D ``h x w`` tile) and batch (loops both inputs read, the
   other loops of a group, a symbolic outer loop such as a convolution's batch:
   ``blockIdx.z``). A block tile of ``BM x BN`` outputs per work-group — 128 x 128 from
   16 x 16 threads of 8 x 8 registers — accumulated in registers (``cache_write`` local); the
   reduction split by ``BK`` (16, WebGPU 8; a convolution steps over whole input channels
   times its window) with both input tiles staged in shared memory (``cache_read`` shared + a
   cooperative fetch over all threads, OpenCL's as float4 loads). Each step of the inner
   reduction reads a thread's rows of the row tile and columns of the column tile into
   register fragments (``cache_read`` local at the inner reduction loop) as 4-element vector
   reads: the row tile stored transposed (rows padded by 4 words where the tiles fit), the
   column tile in runs of 4 columns per thread. The k-step loop is annotated
   ``register_prefetch`` (``tensorir.transform.register_prefetch``: the next tiles are loaded
   into registers while the current ones are multiplied). Init decomposed out of the
   reduction, the register tile unrolled;
   epilogues (bias, activation, residual add) inlined into the register write-back. Where the
   tiles do not fit the target (WebGPU's 16 KiB of workgroup storage), a quarter-size tile,
   then only the inputs read at plain indices (a convolution's weights) in shared memory, then
   registers only.
3. **Row reductions** (softmax, layer / RMS norm, sums and maxima): one work-group per row,
   ``T`` threads sharing each reduction (a cross-thread reduction: partials per thread, a tree
   in shared memory), every reduction of the kernel ``compute_at`` the output's row loop with
   its result in a register, the output written by the same threads — one pass over a row that
   stays in cache. A lone reduction over a short window (max / average pooling) is one thread
   per output instead, its window (and padding) read directly.
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
>>> from tilecraft.tensorir import te
>>> A = te.placeholder((1024,), "float32", "A")
>>> B = te.compute((1024,), lambda i: A[i] * 2.0, "B")
>>> f = apply(te.create_prim_func([A, B]), Target("opencl"))
>>> sorted({l.thread_tag for l in _loops_of(f) if l.kind == "thread_binding"})
['blockIdx.x', 'threadIdx.x']
"""
from __future__ import annotations

import os
import warnings

from tilecraft.targets import Target
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import Call as TCall, IntImm, TIRError, Var as TVar
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.schedule.index_map import IndexMap
from tilecraft.tensorir.stmt import Block, BlockRealize, For
from tilecraft.tensorir.transform import lower_device
from tilecraft.tensorir.transform.register_prefetch import ANN_REGISTER_PREFETCH
from tilecraft.tensorir.transform._common import uses_any

GPU_KINDS = ("opencl", "webgpu")
THREADS = 256          # threads per work-group of injective kernels and row reductions
VECTOR = 4             # elements per thread of injective kernels (one float4)
# threads x register elements per GEMM output dimension: a 128 x 128 block tile of 16 x 16
# threads, each 8 rows x 8 columns in registers, k-step 16. On the H200 (OpenCL, 4096^3 fp32,
# benchmarks/gpu_gemm_variants.py) with the register fragments and the register prefetch below:
# 45 TFLOP/s, 0.88x cuBLAS (8 x 16 threads of 16 x 8: 0.82x; without the prefetch 0.82x,
# without the fragments 0.78x; before the shared tiles were declared 16-byte aligned 0.55x).
GEMM_TILE = (16, 8)    # rows
GEMM_TILE_J = (16, 8)  # columns
# For a CPU OpenCL driver (``Target("opencl -device=cpu")``, e.g. PoCL): a small tile with the
# reduction step not unrolled. PoCL compiles the GPU tile's 2048 unrolled multiply-adds per
# work-item for minutes. 8 x 8 work-items: with 16 x 16 and this serial step, PoCL computed a
# (n, 2, 24, 16) x (n, 2, 16, 24) batch matmul wrong (garbage in the second column tile) where
# the interpreter, lavapipe and PoCL with 8 x 8 or with the GPU tile agree with numpy.
GEMM_TILE_CPU = (8, 4)
GEMM_BK_CPU = 8
GEMM_BK = 16           # reduction step staged in shared memory (H200: 16 beats 8 by 3%, 32 by 20%)
# WebGPU (within the spec's 256 invocations and 16 KiB of workgroup storage): 16 x 16 threads of
# 8 x 8, k-step 8 (so that the transposed A tile's rows can be padded: two 128 x 16 tiles fill
# the 16 KiB exactly). On the H200 through Vulkan (4096^3 fp32) with fragments and prefetch:
# 0.62x cuBLAS (k-step 16 unpadded: 0.55x; the former scalar schedule with B stored
# ``(k, j % 8, j // 8)``: 0.48x).
GEMM_TILE_WEBGPU = (16, 8)
GEMM_BK_WEBGPU = 8
GEMM_FETCH_VECTOR = 1  # elements per thread and step of the shared-memory fetch without fragments
# GPU GEMM tiles read through register fragments: each reduction step's slice of the shared
# tiles a thread multiplies (its rows of A, its columns of B) copied into registers first, as
# 4-element vector reads — A's tile stored transposed ``(k, i)`` (rows padded by 4 words where
# the tiles still fit), B's in runs of 4 columns per thread ``(k, (j % rj) // 4, j // rj,
# j % 4)``. OpenCL C reads them as aligned float4, WGSL from array<vec4<f32>> workgroup arrays.
GEMM_FRAGMENTS = True
GEMM_FRAGMENT_VECTOR = 4
GEMM_FRAGMENTS_WEBGPU = True
GEMM_FETCH_VECTOR_FRAGMENTS = 4   # OpenCL's global -> shared fetch with fragments: float4 loads
# the k-step loop annotated for tensorir.transform.register_prefetch: the next step's tiles
# are loaded into registers during this step's multiply-adds (OpenCL 0.82x -> 0.88x cuBLAS)
GEMM_REGISTER_PREFETCH = True
WEBGPU_SHARED_BYTES = 16384       # the WebGPU spec's default maxComputeWorkgroupStorageSize
SYMBOLIC = 1 << 20     # what a symbolic extent counts as when sizing tiles
# Work-groups a GEMM-like kernel should have at least (at batch 1): smaller register tiles
# until it does (the H200 has 132 multiprocessors).
GEMM_MIN_GROUPS = 128


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
    for strategy in _STRATEGIES:
        try:
            sch = Schedule(func)
            strategy(sch, target)
            out = sch.mod[sch._func_name] if hasattr(sch, "_func_name") else sch.func
            lower_device(out, target)      # over a limit -> try the next strategy
            return out
        except (ScheduleError, ValueError, TIRError) as err:   # does not apply / over a limit
            if os.environ.get("TILECRAFT_DEBUG_SCHEDULES"):
                warnings.warn(f"{_name_of(strategy)} of {name}: {type(err).__name__}: {err}")
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
    """Inline spatial producers into consumers, then elementwise epilogues into producers.

    A padding (a producer with a conditional) read through a window by a GEMM-like block (a
    convolution) stays its own kernel: the convolution's shared-memory tile of the padded
    tensor then has a constant size inside its bounds (a halo past the unpadded input's edge
    would not), and each element of the tile is one plain load."""
    keep = _paddings_of_convolutions(sch)
    changed = True
    while changed:
        changed = False
        blocks = _blocks(sch)
        if len(blocks) <= 1:
            return
        for b in blocks[:-1]:
            if _node(sch, b).name in keep:
                continue
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


def _paddings_of_convolutions(sch: Schedule) -> set:
    """Names of the spatial blocks with a conditional (``if_then_else``: a padding) whose
    output a GEMM-like block reads at computed indices (a sliding window)."""
    blocks = _blocks(sch)
    keep = set()
    for b in blocks:
        node = _node(sch, b)
        if not (_is_reduction(node) and _is_gemm_like(node)):
            continue
        for i in _reduce_inputs(node):
            if _compact(node, i):
                continue
            buf = node.reads[i].buffer
            for p in blocks:
                pn = _node(sch, p)
                if not _is_spatial(pn) or not any(w.buffer is buf for w in pn.writes):
                    continue
                found = []
                post_order_visit(pn.body, lambda n: found.append(n) if isinstance(n, TCall)
                                 and n.op == "if_then_else" else None)
                if found:
                    keep.add(pn.name)
    return keep


def _schedule_best(sch: Schedule, target: Target, shared: str = "all",
                   small: bool = False) -> None:
    """Rules 1-4. ``shared``: which GEMM inputs are staged in shared memory (``"all"``,
    ``"compact"``: those read at plain indices, e.g. a convolution's weights but not its
    sliding-window input, ``"none"``); ``small``: a quarter-size GEMM block tile."""
    _inline(sch)
    blocks = _blocks(sch)
    reductions = [b for b in blocks if _is_reduction(_node(sch, b))]
    gemms = [b for b in reductions if _is_gemm_like(_node(sch, b)) and _big_output(sch, b)]
    if gemms:
        done = set()
        for g in gemms:
            done |= _schedule_gemm(sch, g, target, shared, small)
        for b in _blocks(sch):
            name = _node(sch, b).name
            if name not in done and not _bound(sch, b):
                _schedule_block(sch, b)
        return
    if reductions and _schedule_rows(sch, reductions):
        return
    for b in _blocks(sch):
        _schedule_block(sch, b)


def _schedule_simple(sch: Schedule, target: Target, inline: bool = True) -> None:
    """One thread per output element; reductions serial (padding inlined first)."""
    if inline:
        _inline(sch)
    for b in _blocks(sch):
        _thread_per_output(sch, b, 64)


def _strategy(fn, label: str, **kw):
    def run(sch: Schedule, target: Target) -> None:
        fn(sch, target, **kw)
    run.label = label
    return run


def _name_of(strategy) -> str:
    return getattr(strategy, "label", getattr(strategy, "__name__", "strategy"))


# Tried in order until one schedules and lowers within the target's limits: a convolution's
# window tile may not fit shared memory (WebGPU: 16 KiB), a small one or its weights alone do.
_STRATEGIES = (
    _strategy(_schedule_best, "best"),
    _strategy(_schedule_best, "best (small GEMM tile)", small=True),
    _strategy(_schedule_best, "best (GEMM: compact inputs in shared memory)", shared="compact"),
    _strategy(_schedule_best, "best (GEMM: compact inputs, small tile)", shared="compact",
              small=True),
    _strategy(_schedule_best, "best (GEMM: registers only)", shared="none"),
    _strategy(_schedule_simple, "thread per output"),
    _strategy(_schedule_simple, "thread per output (nothing inlined)", inline=False),
)


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
    if reduce and not sch.get_consumers(block):
        # the thread's accumulator in a register, one store at the end (not one per step)
        local = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(local, tx)


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
            _schedule_block(sch, out)   # a long row shared by threads, a window per thread
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


def _gemm_groups(sch: Schedule, block, spatial):
    """Split a GEMM-like block's spatial loops into (batch, rows, columns): loops read by both
    tiled inputs (or by neither) are batch; the others belong to the input that reads them.
    The columns are the group of the innermost loop (the output's contiguous dim): that loop,
    or the innermost two when both are constant (a convolution's output image); the rows one
    loop of the other group (the largest constant one of at least 16, else the largest). All
    other loops are batch, so a tile never spans two images or sequences."""
    node = _node(sch, block)
    values = _iter_values(sch, block)
    inputs = _reduce_inputs(node)
    users = []
    for lp in spatial:
        var = _node(sch, lp).loop_var
        ivs = [iv.var for iv, v in zip(node.iter_vars, values)
               if iv.kind == "spatial" and uses_any(v, [var])]
        users.append({i for i in inputs
                      if any(uses_any(r.min, ivs) for r in node.reads[i].region)})
    last = users[-1]
    if len(last) != 1:
        raise ScheduleError("default GPU schedule", "the innermost output loop is read by "
                            "both GEMM inputs", None)
    col_input = next(iter(last))
    batch, rows, cols = [], [], []
    for lp, u in zip(spatial, users):
        if len(u) != 1:
            batch.append(lp)
        elif u == last:
            cols.append(lp)
        else:
            rows.append(lp)
    if not rows:
        raise ScheduleError("default GPU schedule", "no row loop (not an outer product)", None)
    # rows: one loop, the largest constant one when it fills a tile's threads (a sequence of
    # 128 beside a symbolic batch: at batch 1 a symbolic row loop would leave the tile
    # empty), else the largest (a symbolic one counts as large); the others are batch
    consts = [lp for lp in rows if _extent(_node(sch, lp)) < SYMBOLIC]
    big = [lp for lp in consts if _extent(_node(sch, lp)) >= 16]
    row = max(big or rows, key=lambda lp: _extent(_node(sch, lp)))
    batch += [lp for lp in rows if lp is not row]
    rows = [row]
    # columns: the innermost loop, or the innermost two when both are constant (a convolution's
    # output rows and columns: a 2-D tile of the image); the others are batch
    if len(cols) > 1 and all(_extent(_node(sch, lp)) != SYMBOLIC for lp in cols[-2:]):
        batch += cols[:-2]
        cols = cols[-2:]
    else:
        batch += cols[:-1]
        cols = cols[-1:]
    batch.sort(key=spatial.index)
    row_input = next(i for i in inputs if i != col_input)
    return batch, rows, cols, row_input, col_input


def _split_reduction(sch: Schedule, reduce, step: int):
    """(outer, inner) reduction loops, about ``step`` iterations inside. Several loops (a
    convolution's channels x window): the outer loop steps over whole channels — the inner
    loop covers ``c`` channels times the window — so each step's input tiles have a constant
    size (a fused loop split by 16 would cross channel boundaries at varying points)."""
    window = 1
    for lp in reduce[1:]:
        window *= _extent(_node(sch, lp))
    if len(reduce) > 1 and window < SYMBOLIC and _extent(_node(sch, reduce[0])) < SYMBOLIC:
        channels = _extent(_node(sch, reduce[0]))
        c = max(1, min(channels, step // window))
        while channels % c:
            c -= 1
        k0, c1 = sch.split(reduce[0], [None, c])
        return k0, sch.fuse(c1, *reduce[1:])
    k = sch.fuse(*reduce) if len(reduce) > 1 else reduce[0]
    bk = step if _extent(_node(sch, k)) >= step else _extent(_node(sch, k))
    return sch.split(k, [None, bk])


def _image_tile(H: int, W: int, config: tuple[int, int]) -> tuple[int, int, int]:
    """A 2-D tile over a convolution's output rows ``H`` and columns ``W``: ``(th, tw, rw)``
    with ``rw`` columns per thread in registers (a divisor of ``W`` when one is close to the
    register count, so the tile has no tail), ``tw`` threads across a row and ``th`` down the
    image, ``th * tw`` at most the column threads of ``config``."""
    threads, regs = config
    divisors = [d for d in range(1, min(regs, W) + 1) if W % d == 0]
    rw = divisors[-1] if divisors[-1] * 2 > min(regs, W) else min(regs, W)
    tw = min(threads, -(-W // rw))
    th = max(1, min(threads // tw, H))
    return th, tw, rw


def _split_image(sch: Schedule, cols, th: int, tw: int, rw: int):
    """The image tile's fused (work-group, thread, register) loops."""
    hl, wl = cols
    h0, h1 = sch.split(hl, [None, th])
    w0, w1, w2 = sch.split(wl, [None, tw, rw])
    sch.reorder(h0, w0, h1, w1, w2)
    return sch.fuse(h0, w0), sch.fuse(h1, w1), w2


def _const_groups(sch: Schedule, batch) -> int:
    n = 1
    for lp in batch:
        e = _extent(_node(sch, lp))
        n *= 1 if e == SYMBOLIC else e    # a symbolic batch counts as 1: size for batch 1
    return n


def _fill(I: int, ti: int, ri: int, jgroups, rj: int, batch_groups: int,
          shrink_cols: bool) -> tuple[int, int]:
    """Register counts ``(ri, rj)``, halved (the larger first) until the kernel has at least
    ``GEMM_MIN_GROUPS`` work-groups: a BERT dense layer at batch 1 (128 x 768) or a 7 x 7
    convolution with 512 channels has only 4-6 full-size tiles, which leaves most of a GPU's
    multiprocessors idle; a smaller tile per thread is slower per work-group but fills them."""
    def groups(a, b):
        return -(-I // (ti * a)) * jgroups(b) * batch_groups
    while groups(ri, rj) < GEMM_MIN_GROUPS:
        if ri >= rj and ri > 1 or (ri > 1 and not shrink_cols):
            ri //= 2
        elif shrink_cols and rj > 1:
            rj //= 2
        else:
            break
    return ri, rj


def _compact(block: Block, idx: int) -> bool:
    """Whether ``block`` reads input ``idx`` at plain indices (each a single iter var or a
    constant): its tile is a dense box, e.g. a weight, not a sliding window."""
    for rng in block.reads[idx].region:
        m = rng.min
        if not isinstance(m, (TVar, IntImm)):
            return False
    return True


def _schedule_gemm(sch: Schedule, block, target: Target, shared: str = "all",
                   small: bool = False) -> set:
    """Rule 2 on one GEMM-like block; the names of the blocks it scheduled."""
    node = _node(sch, block)
    spatial, reduce = _spatial_loops(sch, block)
    if len(spatial) < 2 or not reduce:
        raise ScheduleError("default GPU schedule", "not a 2-D tiled reduction", None)
    batch, rows, cols, row_input, col_input = _gemm_groups(sch, block, spatial)
    # the block's iter var of a single column loop (the dim of the column input to permute)
    col_var = None
    if len(cols) == 1:
        cvar = _node(sch, cols[0]).loop_var
        found = [iv.var for iv, v in zip(node.iter_vars, _iter_values(sch, block))
                 if iv.kind == "spatial" and uses_any(v, [cvar])]
        col_var = found[0] if len(found) == 1 else None
    row_var = None
    rvar = _node(sch, rows[0]).loop_var
    found = [iv.var for iv, v in zip(node.iter_vars, _iter_values(sch, block))
             if iv.kind == "spatial" and uses_any(v, [rvar])]
    row_var = found[0] if len(found) == 1 else None
    sch.reorder(*batch, *rows, *cols)
    il = rows[0]
    cpu = _for_cpu(target)
    webgpu = target.kind == "webgpu" and not cpu
    # register fragments read as float4 from shared tiles laid out for it (OpenCL on a GPU)
    fragments = GEMM_FRAGMENTS and not cpu and (target.kind == "opencl" or
                                                (webgpu and GEMM_FRAGMENTS_WEBGPU))
    cfg_i = GEMM_TILE_CPU if cpu else GEMM_TILE_WEBGPU if webgpu else GEMM_TILE
    cfg_j = GEMM_TILE_CPU if cpu else GEMM_TILE_WEBGPU if webgpu else GEMM_TILE_J
    if small:      # half the threads and half the registers per dimension
        cfg_i = (max(1, cfg_i[0] // 2), max(1, cfg_i[1] // 2))
        cfg_j = (max(1, cfg_j[0] // 2), max(1, cfg_j[1] // 2))
    I = _extent(_node(sch, il))
    if len(cols) == 2:
        H, W = (_extent(_node(sch, lp)) for lp in cols)
        th, tw, rw = _image_tile(H, W, cfg_j)
        tj, rj, jcols = th * tw, rw, -(-H // th)
        jgroups = lambda r: jcols * -(-W // (tw * r))   # noqa: E731
    else:
        J = _extent(_node(sch, cols[0]))
        tj, rj = _tile(J, cfg_j)
        jgroups = lambda r: -(-J // (tj * r))           # noqa: E731
    # threads the columns leave unused (a 7 x 7 image) go to the rows
    ti_cfg = cfg_i[0]
    while ti_cfg * 2 * tj <= cfg_i[0] * cfg_j[0]:
        ti_cfg *= 2
    ti, ri = _tile(I, (ti_cfg, cfg_i[1]))
    if not cpu:
        ri, rj = _fill(I, ti, ri, jgroups, rj, batch_groups=_const_groups(sch, batch),
                       shrink_cols=len(cols) == 1)
    i0, i1, i2 = sch.split(il, [None, ti, ri])
    if len(cols) == 2:
        j0, j1, j2 = _split_image(sch, cols, th, tw, rj)
    else:
        j0, j1, j2 = sch.split(cols[0], [None, tj, rj])
    step = GEMM_BK_CPU if cpu else GEMM_BK_WEBGPU if webgpu else GEMM_BK
    k0, k1 = _split_reduction(sch, reduce, step)
    # a symbolic batch alone on blockIdx.z; constant batch loops (attention heads) fused
    # with the row tiles on blockIdx.y: fused with a symbolic loop, their index (b // 12)
    # could not be proven in bounds and every tile would get a guard
    sym = [lp for lp in batch if _extent(_node(sch, lp)) == SYMBOLIC]
    const = [lp for lp in batch if lp not in sym]
    sch.reorder(*sym, *const, i0, j0, i1, j1, k0, k1, i2, j2)
    if sym:
        b = sch.fuse(*sym) if len(sym) > 1 else sym[0]
        sch.bind(b, "blockIdx.z")
        if const:
            i0 = sch.fuse(*const, i0)
    elif const:
        b = sch.fuse(*const) if len(const) > 1 else const[0]
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
    cached = [i for i in (row_input, col_input)
              if shared == "all" or (shared == "compact" and _compact(node, i))]
    # cache_read shifts nothing in ``block.reads`` (the cache replaces the buffer in place)
    for idx in cached:
        sh = sch.cache_read(block, idx, "shared")
        names.add(_node(sch, sh).name)
        sch.compute_at(sh, k0)
        inner = [lp for lp in sch.get_loops(sh) if _node(sch, lp).kind == "serial" and
                 _is_under(sch, lp, k0)]
        last = _extent(_node(sch, inner[-1]))
        # (WGSL has no vector loads of storage buffers of scalars: WebGPU fetches by element)
        vec = GEMM_FETCH_VECTOR_FRAGMENTS if fragments and not webgpu else GEMM_FETCH_VECTOR
        fv = None
        if vec > 1 and last % vec == 0 and last != SYMBOLIC:
            # each thread copies `vec` consecutive elements of a row: one vector load / store
            lo, fv = sch.split(inner[-1], [None, vec])
            inner = inner[:-1] + [lo]
        f = sch.fuse(*inner) if len(inner) > 1 else inner[0]
        f0, fy, fx = sch.split(f, [None, ti, tj])
        if fv is not None:
            sch.vectorize(fv)
        sch.bind(fy, "threadIdx.y")
        sch.bind(fx, "threadIdx.x")
        if webgpu and _extent(_node(sch, f0)) <= 16:
            sch.unroll(f0)
        if idx == col_input and col_var is not None and (fragments or webgpu and rj > 1):
            _permute_columns(sch, sh, node, idx, col_var, rj,
                             GEMM_FRAGMENT_VECTOR if fragments else 1)
        if fragments and idx == row_input and row_var is not None:
            # padded rows where the tiles still fit (WebGPU's 16 KiB of workgroup storage
            # hold two 128 x 16 tiles exactly)
            pad = not webgpu or 4 * step * (ti * ri + 4 + tj * rj) <= WEBGPU_SHARED_BYTES
            _transpose_rows(sch, sh, node, idx, row_var, pad=pad)
    if fragments and cached:
        _register_fragments(sch, block, cached, k1, GEMM_FRAGMENT_VECTOR)
    if fragments and GEMM_REGISTER_PREFETCH and cached:
        # the next step's tiles loaded into registers during this step's multiply-adds
        sch.annotate(k0, ANN_REGISTER_PREFETCH, 1)
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


def _permute_columns(sch: Schedule, shared_block, node: Block, idx: int, col_var,
                     rj: int, vector: int = 1) -> None:
    """Store the column input's shared tile as ``(.., c % rj, c // rj, ..)`` along its column
    dim: thread ``t`` reads columns ``t*rj .. t*rj+rj-1``, so without it neighbouring threads
    read words ``rj`` apart (bank conflicts, no vector reads); with it neighbouring words. Only
    when exactly one dim of the input is indexed by the column iter var alone and its extent
    divides by ``rj``.

    ``vector > 1`` (dividing ``rj``): ``(.., (c % rj) // vector, c // rj, c % vector, ..)`` —
    each thread's ``rj`` columns are ``rj / vector`` runs of ``vector`` neighbouring words, the
    runs of neighbouring threads side by side: one aligned vector read per run, the threads of
    a warp reading consecutive vectors (no bank conflicts)."""
    if vector > 1 and rj % vector:
        return
    read = node.reads[idx]
    dims = [d for d, r in enumerate(read.region) if r.min is col_var]
    if len(dims) != 1:
        return
    d = dims[0]
    ext = read.buffer.shape[d]
    if not isinstance(ext, IntImm) or ext.value % rj:
        return

    def permute(*ix):
        if vector > 1:
            c = ix[d]
            return tuple(ix[:d]) + ((c % rj) // vector, c // rj, c % vector) + tuple(ix[d + 1:])
        return tuple(ix[:d]) + (ix[d] % rj, ix[d] // rj) + tuple(ix[d + 1:])
    sch.transform_layout(shared_block, 0, IndexMap.from_func(permute, ndim=len(read.buffer.shape)),
                         "write")


def _transpose_rows(sch: Schedule, shared_block, node: Block, idx: int, row_var,
                    pad: bool = True) -> None:
    """Store the row input's shared tile with its row dim innermost (``A[i, k]`` as
    ``(k, i)``): a thread's register rows at one ``k`` are then neighbouring words, read as
    vectors (``_register_fragments``). Only when exactly one dim is indexed by the row iter var
    alone."""
    read = node.reads[idx]
    dims = [d for d, r in enumerate(read.region) if r.min is row_var]
    nd = len(read.buffer.shape)
    if len(dims) != 1 or dims[0] == nd - 1:
        return
    d = dims[0]

    def move_last(*ix):
        return tuple(ix[:d]) + tuple(ix[d + 1:]) + (ix[d],)
    sch.transform_layout(shared_block, 0, IndexMap.from_func(move_last, ndim=nd), "write")
    # the fetch writes a column of the transposed tile per warp: rows 4 words (one float4)
    # longer than a multiple of the 32 banks spread its stores over the banks (2-way conflicts
    # instead of 4- to 16-way) and keep every row 16-byte aligned
    if pad:
        sch.storage_align(shared_block, 0, nd - 2, 32, 4)


def _register_fragments(sch: Schedule, block, cached, k1, vec: int) -> None:
    """Per reduction step ``k1``, copy each thread's slice of the shared tiles (its register
    rows of the row input, its register columns of the column input) into registers first
    (``cache_read`` local at ``k1``), the innermost copy loop vectorized by
    ``vec``: the multiply-adds then read registers, and the shared memory is read once per
    element, as 128-bit loads (with the tiles laid out by ``_transpose_rows`` /
    ``_permute_columns``), instead of once per multiply-add."""
    for idx in cached:
        frag = sch.cache_read(block, idx, "local")
        sch.compute_at(frag, k1)
        loops = [lp for lp in sch.get_loops(frag) if _is_under(sch, lp, k1)]
        if not loops:
            continue
        inner = loops[-1]
        ext = _extent(_node(sch, inner))
        if vec > 1 and ext % vec == 0 and ext != SYMBOLIC:
            lo, vi = sch.split(inner, [None, vec])
            sch.vectorize(vi)
            loops = loops[:-1] + [lo]
        for lp in loops:
            if _extent(_node(sch, lp)) <= 64:
                sch.unroll(lp)


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
    """(threads, elements per thread) of one GEMM output dimension: the configured threads
    and as many registers (a power of two, at most the configured) as the extent fills."""
    threads, regs = config
    if extent >= threads:
        r = regs
        while r > 1 and threads * r > extent:
            r //= 2
        return threads, r
    t = 1
    while t * 2 <= extent:
        t *= 2
    return t, 1


__all__ = ["apply", "is_scheduled", "GPU_KINDS"]
