"""Hand-written CPU schedules for float32 GEMM, alone and with a fused elementwise epilogue.

``schedule_gemm(sch, block, target)`` turns the plain three-loop GEMM that ``te`` makes,
``C[i, j] += A[i, k] * B[k, j]``, into the structure of a BLAS kernel (``docs/gemm-tutorial.md``
walks through the steps with their measured speed):

1. **Register blocking**: ``i`` and ``j`` are split by the tile ``MR x NR`` (6 x 64 with
   AVX-512); the tile's accumulators are a ``cache_write(..., "local")`` buffer written back
   after the whole ``k`` loop (``reverse_compute_at``), zeroed before it
   (``decompose_reduction``). The ``MR`` rows are unrolled and the ``NR`` columns vectorized, so
   the ``k`` loop body is ``MR`` broadcasts of ``A``, ``NR / lanes`` vector loads of ``B`` and
   ``MR * NR / lanes`` fused multiply-adds on registers. (The LLVM back end allocates the tile
   in the loop that uses it, where LLVM keeps it in registers, and fuses ``acc + a * b``: see
   ``compact_local_allocations`` in ``tensorir/transform/compact_local.py`` and ``_accumulate``
   in ``targets/llvm/codegen.py``.)
2. **Packing B** into panels: a ``cache_read`` copy of ``B`` re-laid out by ``transform_layout``
   as ``B_global[j // NR, k, j % NR]``, so the micro-kernel streams the ``NR`` columns of each
   ``k`` as contiguous vectors. By default each panel is packed inside the panel loop, right
   before its row tiles use it (``pack_b="panel"``); ``pack_b="root"`` packs all of ``B`` first.
3. **Loop order**: panels of ``B`` outermost (``order="nm"``): a packed panel, ``K x NR`` floats,
   stays in L2 while every row tile streams over it. ``mc`` blocks the rows first,
   ``order="mn"`` puts row tiles outside panels, ``pack_a`` packs ``A`` too; none of them paid
   off for square GEMMs on this machine, but other shapes and caches may differ.
4. **Parallel**: the outermost loop (and the packing) runs on the thread pool.

Sizes come from the function: constant or symbolic ``M`` (``te.var``), any ``N`` and ``K``.
Tiles that do not divide the sizes leave tails: the split's predicates guard them (rows beyond
``M`` are skipped, columns beyond ``N`` are masked lanes), and lowering's ``LoopPartition``
runs every full tile without those tests.

``schedule_gemm_epilogue`` / ``schedule_gemm_bias_gelu`` do the same for ``D = f(C, ...)``
(bias, activation): the elementwise consumer is computed on each register tile right after its
``k`` loop, from the accumulators, so ``C`` never goes to memory.

``matmul_func`` and ``matmul_bias_gelu_func`` build the workloads.

Examples
--------
>>> from tilecraft import targets
>>> from tilecraft.tensorir import Schedule
>>> from benchmarks.schedules.gemm import matmul_func, schedule_gemm
>>> sch = Schedule(matmul_func(256, 256, 256))
>>> _ = schedule_gemm(sch, "C", "llvm")
>>> mod = targets.build(sch.mod, "llvm")
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import Add, BufferLoad, Cast, Mul, Var
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.schedule import BlockRV, LoopRV, Schedule
from tilecraft.tensorir.schedule.error import ScheduleError


def _vector_registers(target) -> int:
    """Architectural vector registers: 32 on AArch64 and with AVX-512, else 16 (SSE, AVX2,
    32-bit NEON's q registers)."""
    arch = str(getattr(target, "arch", ""))
    width = int(getattr(target, "vector_width", 128) or 128)
    if arch == "aarch64" or (arch in ("x86_64", "x86") and width >= 512):
        return 32
    return 16


@dataclass(frozen=True)
class GemmConfig:
    """Tile and loop-order choices of ``schedule_gemm``.

    Parameters
    ----------
    mr : int
        Rows of the register tile (unrolled).
    nr : int
        Columns of the register tile (vectorized; a multiple of the vector lanes) and the
        width of a packed B panel.
    mc : int or None
        Rows per cache block (a multiple of ``mr``), the outermost loop when set: a block of
        ``A`` stays in L2 while it meets every B panel. None: no row blocking.
    order : str
        ``"nm"``: panels of ``B`` outside row tiles (a packed panel stays in cache while all
        rows stream over it); ``"mn"``: row tiles outside panels.
    pack_a : bool
        Also pack ``A`` into ``MR``-row panels (``A_global[i // MR, k, i % MR]``), so a tile's
        broadcasts read one contiguous stream instead of ``MR`` rows ``K`` floats apart.
    pack_b : str, optional
        ``"panel"`` (the default for ``order="nm"``): pack each panel inside the panel loop,
        right before the row tiles that use it, so packing runs in parallel and leaves the
        panel in the cache that reads it next; ``"root"`` (the default for ``"mn"``): pack all
        of ``B`` first, in a parallel loop over panels.
    parallel : bool
        Run the outermost loop (and the packing) on the thread pool.
    """

    mr: int = 6
    nr: int = 64
    mc: int | None = None
    order: str = "nm"
    pack_a: bool = False
    pack_b: str | None = None
    parallel: bool = True

    def __post_init__(self):
        for name in ("mr", "nr"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GemmConfig.{name} must be a positive int, got {v!r}")
        if self.mc is not None and (not isinstance(self.mc, int) or self.mc < self.mr or
                                    self.mc % self.mr):
            raise ValueError(f"GemmConfig.mc must be a multiple of mr={self.mr}, got {self.mc!r}")
        if self.order not in ("nm", "mn"):
            raise ValueError(f"GemmConfig.order must be 'nm' or 'mn', got {self.order!r}")
        if self.pack_b is None:
            object.__setattr__(self, "pack_b", "panel" if self.order == "nm" else "root")
        if self.pack_b not in ("root", "panel"):
            raise ValueError(f"GemmConfig.pack_b must be 'root' or 'panel', got {self.pack_b!r}")
        if self.pack_b == "panel" and self.order != "nm":
            raise ValueError("GemmConfig.pack_b='panel' needs order='nm' (with the panels inside "
                             "the row tiles every panel would be packed once per row tile)")


def _target(target):
    if target is None or isinstance(target, str) or isinstance(target, dict):
        from tilecraft import targets  # the benchmarks sit above both packages
        return targets.Target(target or "llvm")
    return target


def default_config(target=None, dtype: str = "float32") -> GemmConfig:
    """The tile for ``target``'s vector unit: ``MR = 6`` rows of ``NR`` = 4 vectors (2 with 16
    vector registers), so the ``6 * NR / lanes`` accumulators, the ``NR / lanes`` vectors of
    B and one broadcast fill the register file (29 of 32 zmm on AVX-512, 15 of 16 ymm on
    AVX2). Measured on AVX-512 (Zen 4), 6 x 64 beat 4 x 64, 8 x 32 and 12 x 32: six rows of A
    ``K`` floats apart stay clear of L1 set conflicts, twelve do not.

    Examples
    --------
    >>> default_config("llvm -mtriple=x86_64-linux-gnu -mattr=+avx512f")
    GemmConfig(mr=6, nr=64, mc=None, order='nm', pack_a=False, pack_b='panel', parallel=True)
    >>> default_config("llvm -mtriple=x86_64-linux-gnu -mattr=+avx2")
    GemmConfig(mr=6, nr=16, mc=None, order='nm', pack_a=False, pack_b='panel', parallel=True)
    """
    t = _target(target)
    lanes = _lanes(t, dtype)
    vectors = 4 if _vector_registers(t) >= 32 else 2
    return GemmConfig(mr=6, nr=vectors * lanes)


# =============================================================================================
# workloads


def matmul_func(M, N, K, dtype: str = "float32", transpose_b: bool = False) -> PrimFunc:
    """``C[M, N] = A[M, K] @ B[K, N]`` (``B[N, K]`` with ``transpose_b``) as a te PrimFunc.

    ``M`` (or any size) may be a ``te.var`` for a symbolic dimension.

    Examples
    --------
    >>> f = matmul_func(te.var("m"), 64, 32)
    """
    A = te.placeholder((M, K), dtype, "A")
    B = te.placeholder((N, K) if transpose_b else (K, N), dtype, "B")
    k = te.reduce_axis((0, K), "k")
    if transpose_b:
        C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[j, k], axis=k), "C")
    else:
        C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


GELU_C = 0.7978845608028654   # sqrt(2 / pi)


def gelu_tanh(x):
    """GELU in its tanh form, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, on te exprs."""
    return 0.5 * x * (1.0 + te.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def matmul_bias_gelu_func(M, N, K, dtype: str = "float32") -> PrimFunc:
    """``D = gelu(A @ B + bias)`` as a te PrimFunc: blocks ``C`` (the GEMM) and ``D``.

    Examples
    --------
    >>> f = matmul_bias_gelu_func(128, 64, 32)
    """
    A = te.placeholder((M, K), dtype, "A")
    B = te.placeholder((K, N), dtype, "B")
    bias = te.placeholder((N,), dtype, "bias")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    D = te.compute((M, N), lambda i, j: gelu_tanh(C[i, j] + bias[j]), "D")
    return te.create_prim_func([A, B, bias, D])


# =============================================================================================
# the schedules


@dataclass
class GemmSchedule:
    """What ``schedule_gemm`` made: the blocks and the loops a caller may want next.

    ``tile`` is the loop whose body computes one ``MR x NR`` register tile (the accumulators
    live inside it); ``outer`` the outermost (parallel) loop.
    """

    block: BlockRV
    write_back: BlockRV
    init: BlockRV
    pack_b: BlockRV
    pack_a: BlockRV | None
    tile: LoopRV
    outer: LoopRV
    config: GemmConfig
    notes: list = field(default_factory=list)


@dataclass
class _Gemm:
    """The roles of a GEMM block: its loops and the reads of A and B."""

    i: LoopRV
    j: LoopRV
    k: LoopRV
    a_index: int        # index of A in block.reads
    b_index: int
    a_rows_first: bool  # A[i, k] (True) or A[k, i]
    b_k_first: bool     # B[k, j] (True) or B[j, k]
    dtype: str


def _analyze(sch: Schedule, block: BlockRV, prim: str) -> _Gemm:
    blk = sch.get(block)
    loops = sch.get_loops(block)
    fail = lambda why: ScheduleError(prim, f"block {blk.name}: {why}", blk)  # noqa: E731
    spatial = [iv for iv in blk.iter_vars if iv.kind == "spatial"]
    reduce = [iv for iv in blk.iter_vars if iv.kind == "reduce"]
    if len(spatial) != 2 or len(reduce) != 1 or len(loops) != 3:
        raise fail(f"expected a GEMM block with iter vars (i, j | k) under three loops, got "
                   f"{len(spatial)} spatial and {len(reduce)} reduce iter vars under "
                   f"{len(loops)} loops")
    vi, vj, vk = spatial[0].var, spatial[1].var, reduce[0].var
    # the loops in iter-var order (an unscheduled te block binds each to one loop)
    realize_values = _iter_values(sch, block)
    loop_vars = [sch.get(l).loop_var for l in loops]
    role = {}
    for iv, value in zip(blk.iter_vars, realize_values):
        at = [n for n, lv in enumerate(loop_vars) if lv is value]   # Vars: by identity
        if not isinstance(value, Var) or not at:
            raise fail(f"iter var {iv.var.name} is bound to {value!r}, not to one loop; "
                       f"schedule_gemm expects the unscheduled block")
        role[iv.var] = loops[at[0]]
    body = blk.body
    value = body.value
    if not (isinstance(value, Add) and isinstance(body.indices, tuple) and
            len(body.indices) == 2 and body.indices[0] is vi and body.indices[1] is vj):
        raise fail("expected the update C[i, j] = C[i, j] + A * B")
    prod = value.b if isinstance(value.b, Mul) else value.a
    if not isinstance(prod, Mul):
        raise fail("expected the update C[i, j] = C[i, j] + A * B")
    loads = [_strip_cast(prod.a), _strip_cast(prod.b)]
    if not all(isinstance(x, BufferLoad) and len(x.indices) == 2 for x in loads):
        raise fail("expected both factors to be loads of 2-D buffers")
    a = b = None
    a_rows_first = b_k_first = True
    for ld in loads:
        p, q = ld.indices
        if p is vi and q is vk:
            a, a_rows_first = ld, True
        elif p is vk and q is vi:
            a, a_rows_first = ld, False
        elif p is vk and q is vj:
            b, b_k_first = ld, True
        elif p is vj and q is vk:
            b, b_k_first = ld, False
    if a is None or b is None or a.buffer is b.buffer:
        raise fail("could not tell A[i, k] and B[k, j] apart in the product")
    reads = [r.buffer for r in blk.reads]
    try:
        ai, bi = reads.index(a.buffer), reads.index(b.buffer)
    except ValueError:
        raise fail("the block's read regions do not list A and B") from None
    return _Gemm(role[vi], role[vj], role[vk], ai, bi, a_rows_first, b_k_first,
                 body.buffer.dtype)


def _strip_cast(e):
    return e.value if isinstance(e, Cast) else e


def _iter_values(sch: Schedule, block: BlockRV):
    br, _ = sch._block(block, "schedule_gemm")
    return list(br.iter_values)


def _lanes(target, dtype: str) -> int:
    width = int(getattr(target, "vector_width", 128) or 128)
    bits = int(dtype[len("float"):]) if dtype.startswith("float") else 32
    return max(1, width // bits)


def _pack_b_layout(sch: Schedule, pack: BlockRV, g: _Gemm, nr: int) -> None:
    if g.b_k_first:
        sch.transform_layout(pack, ("write", 0), lambda k, n: [n // nr, k, n % nr])
    else:
        sch.transform_layout(pack, ("write", 0), lambda n, k: [n // nr, k, n % nr])


def _pack_b_at_root(sch: Schedule, pack: BlockRV, g: _Gemm, cfg: GemmConfig) -> None:
    """Pack all of B before the GEMM: a parallel loop over panels."""
    _pack_b_layout(sch, pack, g, cfg.nr)
    ax = sch.get_loops(pack)
    k_ax, n_ax = (ax[0], ax[1]) if g.b_k_first else (ax[1], ax[0])
    no, ni = sch.split(n_ax, [None, cfg.nr])
    # panel by panel, row by row: contiguous vector stores (and, for B[k, n], loads)
    sch.reorder(no, k_ax, ni)
    sch.vectorize(ni)
    if cfg.parallel:
        sch.parallel(no)


def _pack_b_per_panel(sch: Schedule, pack: BlockRV, g: _Gemm, cfg: GemmConfig,
                      panel_loop: LoopRV) -> None:
    """Pack each panel right before its row tiles use it (in the panel loop, so in parallel and
    into the cache that then reads it)."""
    sch.compute_at(pack, panel_loop)
    _pack_b_layout(sch, pack, g, cfg.nr)
    ax = sch.get_loops(pack)
    if g.b_k_first:
        sch.vectorize(ax[-1])
    else:
        sch.reorder(ax[-1], ax[-2])
        sch.vectorize(ax[-1])


def _pack_a(sch: Schedule, block: BlockRV, g: _Gemm, cfg: GemmConfig) -> BlockRV:
    mr = cfg.mr
    pack = sch.cache_read(block, g.a_index, "global")
    if g.a_rows_first:
        sch.transform_layout(pack, ("write", 0), lambda m, k: [m // mr, k, m % mr])
    else:
        sch.transform_layout(pack, ("write", 0), lambda k, m: [m // mr, k, m % mr])
    ax = sch.get_loops(pack)
    m_ax, k_ax = (ax[0], ax[1]) if g.a_rows_first else (ax[1], ax[0])
    mo, mi = sch.split(m_ax, [None, mr])
    sch.reorder(mo, k_ax, mi)
    sch.unroll(mi)
    if cfg.parallel:
        sch.parallel(mo)
    return pack


def schedule_gemm(sch: Schedule, block: BlockRV | str = "C", target=None,
                  config: GemmConfig | None = None) -> GemmSchedule:
    """Schedule the GEMM block ``block`` (``C[i, j] += A[i, k] * B[k, j]``) like a BLAS kernel.

    Parameters
    ----------
    sch : Schedule
        The schedule; ``block`` must still be the unscheduled three-loop block (``B`` may be
        ``B[k, j]`` or ``B[j, k]``, ``A`` ``A[i, k]`` or ``A[k, i]``).
    block : BlockRV | str
        The GEMM block (or its name).
    target : targets.Target | str, optional
        Where it will run (vector width for the tile); the host by default.
    config : GemmConfig, optional
        Tile and loop order; ``default_config(target)`` by default.

    Returns
    -------
    GemmSchedule
        The blocks and loops made (``tile`` is where an epilogue can be attached).

    Examples
    --------
    >>> sch = Schedule(matmul_func(te.var("m"), 96, 64))
    >>> gs = schedule_gemm(sch, "C", "llvm")
    >>> sch.get(gs.outer).kind
    'parallel'
    """
    prim = "schedule_gemm"
    if isinstance(block, str):
        block = sch.get_block(block)
    t = _target(target)
    g = _analyze(sch, block, prim)
    cfg = config or default_config(t, g.dtype)
    lanes = _lanes(t, g.dtype)
    notes = []
    if cfg.nr % lanes:
        notes.append(f"nr={cfg.nr} is not a multiple of the {lanes} vector lanes")
    pack_b = sch.cache_read(block, g.b_index, "global")
    pack_a = _pack_a(sch, block, g, cfg) if cfg.pack_a else None
    io, ii = sch.split(g.i, [None, cfg.mr])
    jo, ji = sch.split(g.j, [None, cfg.nr])
    if cfg.mc is not None:
        ioo, io = sch.split(io, [None, cfg.mc // cfg.mr])
        if cfg.order == "nm":
            sch.reorder(ioo, jo, io, g.k, ii, ji)
            tile, outer = io, ioo
        else:
            sch.reorder(ioo, io, jo, g.k, ii, ji)
            tile, outer = jo, ioo
    elif cfg.order == "nm":
        sch.reorder(jo, io, g.k, ii, ji)
        tile, outer = io, jo
    else:
        sch.reorder(io, jo, g.k, ii, ji)
        tile, outer = jo, io
    if cfg.pack_b == "panel":
        _pack_b_per_panel(sch, pack_b, g, cfg, jo)
    else:
        _pack_b_at_root(sch, pack_b, g, cfg)
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, tile)
    init = sch.decompose_reduction(block, g.k)
    sch.unroll(ii)
    sch.vectorize(ji)
    for b in (init, write_back):
        loops = sch.get_loops(b)
        sch.unroll(loops[-2])
        sch.vectorize(loops[-1])
    if cfg.parallel:
        sch.parallel(outer)
    return GemmSchedule(block, write_back, init, pack_b, pack_a, tile, outer, cfg, notes)


def schedule_gemm_epilogue(sch: Schedule, block: BlockRV | str = "C",
                           epilogue: list[BlockRV | str] | None = None, target=None,
                           config: GemmConfig | None = None) -> GemmSchedule:
    """Schedule a GEMM followed by elementwise blocks ``D = f(C, ...)`` (bias, activation):
    the epilogue runs on each register tile right after its ``k`` loop, reading the
    accumulators, so the GEMM's output never goes to memory.

    Every epilogue block but the last is inlined into its consumer (``compute_inline``). The
    tile's write-back is inlined into the last one, which then reads the ``local``
    accumulators, and that block moves into the tile (``reverse_compute_at``) with its rows
    unrolled and columns vectorized. It must be elementwise over ``C``'s ``(i, j)``.

    Parameters
    ----------
    sch, block, target, config
        As for ``schedule_gemm``.
    epilogue : list of BlockRV | str, optional
        The elementwise blocks after the GEMM, in order; by default the chain of single
        consumers starting at the GEMM block.

    Examples
    --------
    >>> sch = Schedule(matmul_bias_gelu_func(64, 64, 32))
    >>> gs = schedule_gemm_epilogue(sch, "C", ["D"], "llvm")
    """
    if isinstance(block, str):
        block = sch.get_block(block)
    if epilogue is None:
        epilogue = []
        cur = block
        while True:
            consumers = sch.get_consumers(cur)
            if len(consumers) != 1:
                break
            cur = consumers[0]
            epilogue.append(cur)
    epilogue = [sch.get_block(b) if isinstance(b, str) else b for b in epilogue]
    if not epilogue:
        raise ScheduleError("schedule_gemm_epilogue",
                            f"block {sch.get(block).name} has no elementwise consumer to fuse")
    for b in epilogue[:-1]:
        sch.compute_inline(b)
    last = epilogue[-1]
    gs = schedule_gemm(sch, block, target, config)
    # the epilogue reads the accumulators instead of C, then moves into the tile
    sch.compute_inline(gs.write_back)
    sch.reverse_compute_at(last, gs.tile)
    loops = sch.get_loops(last)
    sch.unroll(loops[-2])
    sch.vectorize(loops[-1])
    gs.write_back = last
    return gs


def schedule_gemm_bias_gelu(sch: Schedule, block: BlockRV | str = "C",
                            epilogue: BlockRV | str = "D", target=None,
                            config: GemmConfig | None = None) -> GemmSchedule:
    """``schedule_gemm_epilogue`` for ``matmul_bias_gelu_func``: ``D = gelu(C + bias)``.

    Examples
    --------
    >>> sch = Schedule(matmul_bias_gelu_func(te.var("m"), 64, 32))
    >>> gs = schedule_gemm_bias_gelu(sch, "C", "D", "llvm")
    """
    return schedule_gemm_epilogue(sch, block, [epilogue], target, config)
