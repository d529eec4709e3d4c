"""``MultiLevelTiling``: tile a reduction block with data reuse (GEMM, conv, batch matmul)
into a multi-level loop nest, with caches, and ``MultiLevelTilingWithIntrin``: the same with
a register tile computed by a tensorized micro-kernel (``tensorir.schedule.intrinsics``).

The structure string names the tile levels from the outside in: ``S`` a level of every spatial
loop, ``R`` a level of every reduce loop. Each loop is split into as many tiles as its letter
occurs (``sample_tile``: the inner factors are sampled, the outermost inferred, so symbolic
extents tile too) and the tiles are reordered level by level:

* CPU ``"SSRSRS"``: ``S0 S1 R0 S2 R1 S3``; the innermost spatial tile ``S3`` is what
  ``RewriteParallelVectorizeUnroll`` vectorizes and unrolls, ``S0`` what it parallelizes. The
  output tile may be accumulated in a ``local`` write cache (``reuse_write``) written back after
  level 1 or 2 (``levels``), or an elementwise consumer (bias, activation) computed there
  instead. A read operand indexed by the innermost spatial variable and reduce variables only
  (``B[k, j]`` of a GEMM, the weight of an NHWC conv) may be *packed* (``pack="may"``): copied
  per ``S0`` panel into ``B_global[j // P, k, j % P]`` (``RewritePackedLayout`` fixes ``P`` to
  the final inner tile), so the inner loops stream contiguous vectors.
* GPU ``"SSSRRSRS"``: ``S0 S1 S2 R0 R1 S3 R2 S4``; ``S0`` is fused and bound to
  ``blockIdx.x``, ``S1`` to ``vthread.x``, ``S2`` to ``threadIdx.x`` (``tile_binds``); every
  input is read through a ``shared`` cache computed at ``R0`` (``reuse_read``) whose copy loops
  ``RewriteCooperativeFetch`` spreads over the threads, and the output tile accumulates in a
  ``local`` cache written back at ``S2``.

The micro-kernel rule keeps the CPU structure but fixes the innermost level: the register tile
``MR x NR`` (``sample_categorical`` over the intrinsic family's sizes for the target's vector
unit), packed ``B`` panels of width ``NR``, the accumulators in a ``local`` write cache after
level 2, and the block annotated for ``RewriteTensorize`` -- exactly the structure of the hand
GEMM schedule of ``docs/gemm-tutorial.md`` (``benchmarks/schedules/gemm.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

from tilecraft.tensorir.expr import Add, BufferLoad, Cast, FloorDiv, FloorMod, IntImm, Mul, Var
from tilecraft.tensorir.schedule import BlockRV, LoopRV, Schedule, ScheduleError
from tilecraft.tensorir.stmt import BufferStore

from ..feature import MachineModel
from . import analysis as A
from .base import (ANN_COOPERATIVE_FETCH, ANN_PACK, ANN_SHARED_LAYOUT, ANN_TENSORIZE, ANN_TILED,
                   SHARED_LAYOUTS, ScheduleRule)


@dataclass(frozen=True)
class ReuseConfig:
    """A cache level of ``MultiLevelTiling``: ``req`` "no" / "may" (branch with and without) /
    "must"; ``levels``: tile levels (1-based) after which the cache is computed; ``scope``."""

    req: str = "no"
    levels: tuple = ()
    scope: str = "global"

    def __post_init__(self):
        if self.req not in ("no", "may", "must"):
            raise ValueError(f"ReuseConfig.req must be 'no', 'may' or 'must', got {self.req!r}")
        object.__setattr__(self, "levels", tuple(int(x) for x in self.levels))
        if self.req != "no" and not self.levels:
            raise ValueError("ReuseConfig: a cache needs at least one level")


@dataclass
class _Operands:
    """The roles in ``C[...] = C[...] + X * Y`` of a block: X's read index, Y's read index, the
    spatial iter var ``j`` indexing Y (and the last dim of C), ``i`` indexing X."""

    x_index: int
    y_index: int
    y_dim: int
    i_var: Var | None
    j_var: Var
    panel: int | None = None     # Y is already packed: Y[..., j // panel, ..., j % panel]


class MultiLevelTiling(ScheduleRule):
    """Multi-level tiling of reduction blocks with data reuse (TVM's ``MultiLevelTiling``).

    Parameters
    ----------
    structure : str
        ``"SSRSRS"`` (CPU) or ``"SSSRRSRS"`` (GPU), or any string of S and R.
    tile_binds : tuple of str, optional
        Thread axes the first spatial levels are fused and bound to (GPU).
    max_innermost_factor : int
        Bound of the innermost tile of each loop.
    vector_load_lens : tuple of int, optional
        Vector lengths the cooperative fetch of shared caches samples from (GPU).
    reuse_read, reuse_write : ReuseConfig, optional
        The read caches (GPU: shared, "must", level 4) and write cache (CPU: local, "may",
        levels 1 and 2; GPU: local, "must", level 3).
    pack : str
        ``"no"``, ``"may"`` or ``"must"``: pack the operand indexed by the innermost spatial
        variable into panels (CPU).
    tile_caps : dict, optional
        ``{"S": (None, 1, 32, 8, 8), "R": (None, 32, 4)}``: a bound per tile level of every
        spatial / reduce loop (None: unbounded), given to ``sample_tile(max_factors=...)``,
        which then draws each inner level among the divisors its bound admits (GPU: threads
        and register tiles of the sizes fast SGEMMs use instead of the uniform spread of prime
        factors over the levels). Mutation keeps the bounds.
    shared_layouts : tuple of str, optional
        Layouts (of ``SHARED_LAYOUTS``) a 2-D shared cache samples from (GPU); the choice is
        an annotation ``RewriteCooperativeFetch`` applies. Default: the operand's own layout.

    Examples
    --------
    >>> rule = MultiLevelTiling("SSRSRS", reuse_write=ReuseConfig("may", (1, 2), "local"))
    """

    # a fixed register-tile recipe (the seeds of the subclasses with one), and its tile
    # decisions, one per loop in the order ``_tile`` splits them
    recipe: tuple[int, int] | None = None
    _recipe_tiles: list[list[int]] = []

    def __init__(self, structure: str = "SSRSRS", tile_binds=None, max_innermost_factor: int = 64,
                 vector_load_lens=None, reuse_read: ReuseConfig | None = None,
                 reuse_write: ReuseConfig | None = None, pack: str = "no",
                 tile_caps: dict | None = None, shared_layouts=None):
        if not structure or set(structure) - {"S", "R"} or "S" not in structure:
            raise ValueError(f"MultiLevelTiling: structure must be a string of S and R with at "
                             f"least one S, got {structure!r}")
        if pack not in ("no", "may", "must"):
            raise ValueError(f"MultiLevelTiling: pack must be 'no', 'may' or 'must', got {pack!r}")
        self.structure = structure
        self.tile_binds = tuple(tile_binds or ())
        if len(self.tile_binds) > structure.count("S"):
            raise ValueError("MultiLevelTiling: more tile_binds than spatial levels")
        self.max_innermost_factor = int(max_innermost_factor)
        self.vector_load_lens = tuple(vector_load_lens or ())
        self.reuse_read = reuse_read or ReuseConfig()
        self.reuse_write = reuse_write or ReuseConfig()
        self.pack = pack
        self.tile_caps = {}
        for letter, caps in (tile_caps or {}).items():
            if letter not in ("S", "R") or len(caps) != structure.count(letter):
                raise ValueError(f"MultiLevelTiling: tile_caps[{letter!r}] needs one bound per "
                                 f"{letter} level of {structure!r}, got {caps!r}")
            self.tile_caps[letter] = tuple(None if c is None else int(c) for c in caps)
        self.shared_layouts = tuple(shared_layouts or ())
        bad = [x for x in self.shared_layouts if x not in SHARED_LAYOUTS]
        if bad:
            raise ValueError(f"MultiLevelTiling: unknown shared layouts {bad}; choose from "
                             f"{SHARED_LAYOUTS}")

    def __repr__(self):
        return (f"{type(self).__name__}(structure={self.structure!r}, tile_binds="
                f"{self.tile_binds}, pack={self.pack!r})")

    # -- applicability ---------------------------------------------------------------------------
    def _applicable(self, sch: Schedule, block: BlockRV) -> A.BlockInfo | None:
        info = A.block_info(sch, block)
        b = info.block
        if A.is_root(info) or not A.is_subroot(info) or A.is_thread_bound(info):
            return None
        if dict(b.annotations).get(ANN_TILED) is not None:
            return None
        if not A.is_reduction(b) or not A.has_data_reuse(b):
            return None
        if A.trivial_binding(info) is None or len(info.loops) != len(b.iter_vars):
            return None
        kinds = A.loop_iter_kinds(info)
        if any(k not in ("S", "R") for k in kinds) or "S" not in kinds:
            return None
        return info

    def apply(self, sch: Schedule, block: BlockRV) -> list[Schedule]:
        info = self._applicable(sch, block)
        if info is None:
            return [sch]
        ops = _operands(info) if self.pack != "no" else None
        packs = {"no": [False], "may": [False, True], "must": [True]}[self.pack]
        if ops is None or ops.panel is not None:
            # nothing to pack, or packed already (a weight laid out at build time)
            packs = [False] if self.pack != "must" or (ops is not None) else []
        writes = {"no": [None], "may": [None, *self.reuse_write.levels],
                  "must": list(self.reuse_write.levels)}[self.reuse_write.req]
        out = []
        for pack in packs:
            for level in writes:
                s = sch.copy()
                try:
                    self._tile(s, block, level, ops if pack else None)
                except ScheduleError:
                    continue  # this branch is illegal for this block: drop it
                out.append(s)
        return out or [sch]

    # -- the transformation ------------------------------------------------------------------
    def _inner_tiles(self, sch: Schedule, info: A.BlockInfo, loops: list[LoopRV]) -> dict:
        """Hook of the micro-kernel rule: loop index -> (levels of the S tiles it fixes)."""
        return {}

    def _tile(self, sch: Schedule, block: BlockRV, write_level: int | None,
              pack_ops: _Operands | None) -> None:
        ctx = self.context
        hints = ctx.shape_hints if ctx else {}
        info = A.block_info(sch, block)
        name = info.block.name
        consumer = A.elementwise_consumer(sch, info) if write_level is not None else None
        pack = None
        if pack_ops is not None:
            pack = sch.cache_read(block, pack_ops.y_index, "global")
            sch.annotate(pack, ANN_PACK, [name, pack_ops.y_dim])
        write_back = None
        if write_level is not None:
            write_back = sch.cache_write(block, 0, self.reuse_write.scope)
            if consumer is not None:
                try:
                    sch.compute_inline(write_back)
                    write_back = sch.get_block(consumer)
                except ScheduleError:
                    pass
        loops = sch.get_loops(block)
        now = A.block_info(sch, block)
        kinds = A.loop_iter_kinds(now)
        by_loop = {id(f.loop_var): v for v, f in (A.trivial_binding(now) or {}).items()}
        loop_ivars = [by_loop.get(id(f.loop_var)) for f in now.loops]
        n_s, n_r = self.structure.count("S"), self.structure.count("R")
        fixed = self._inner_tiles(sch, now, loops)
        per_loop: list[list[LoopRV]] = []
        for idx, (loop, kind) in enumerate(zip(loops, kinds)):
            n = n_s if kind == "S" else n_r
            if idx in fixed:
                inner_rv, levels_left = fixed[idx]
                outer, inner = sch.split(loop, [None, inner_rv])
                tiles = self._split(sch, outer, levels_left, hints) + [inner]
                tiles += [None] * (n - len(tiles))
            elif kind == "S" and fixed:
                # the register tile is the whole innermost level: other spatial loops get none
                tiles = self._split(sch, loop, n - 1, hints) + [None]
            else:
                tiles = self._split(sch, loop, n, hints, self.tile_caps.get(kind))
            per_loop.append(tiles)
        # group the tiles by level: level t of the structure takes tile #(count of its letter so
        # far) of every loop of that kind
        levels: list[list[LoopRV]] = []
        seen = {"S": 0, "R": 0}
        for letter in self.structure:
            t = seen[letter]
            seen[letter] += 1
            levels.append([tiles[t] for tiles, kind in zip(per_loop, kinds)
                           if kind == letter and tiles[t] is not None])
        if fixed:
            # the register tile in (i, j) order: i's tile before j's whatever the loop order
            last_s = len(self.structure) - 1 - self.structure[::-1].index("S")
            levels[last_s] = self._register_tile_order(levels[last_s])
            # a fixed reduce tile (the 4 bytes of a dot4 step) goes last in the innermost R
            # level, right around the register tile it is tensorized with
            last_r = len(self.structure) - 1 - self.structure[::-1].index("R") \
                if "R" in self.structure else None
            for idx in fixed:
                if kinds[idx] == "R" and last_r is not None:
                    step = per_loop[idx][-1]
                    levels[last_r] = [l for l in levels[last_r] if l is not step] + [step]
        order = [l for lv in levels for l in lv]
        sch.reorder(*order)
        # bind the first spatial levels to thread axes (fused)
        s_levels = [i for i, c in enumerate(self.structure) if c == "S"]
        for axis, lv in zip(self.tile_binds, s_levels):
            group = levels[lv]
            fused = sch.fuse(*group) if len(group) > 1 else group[0]
            sch.bind(fused, axis)
            levels[lv] = [fused]
        if write_back is not None:
            at = levels[write_level - 1]
            sch.reverse_compute_at(write_back, at[-1], preserve_unit_loops=True)
        if self.reuse_read.req != "no":
            self._read_caches(sch, block, levels)
        if pack is not None:
            panel = next((tiles[0] for tiles, kind, v in zip(per_loop, kinds, loop_ivars)
                          if v is pack_ops.j_var and kind == "S"), None)
            if panel is not None:
                try:
                    sch.compute_at(pack, panel, preserve_unit_loops=True)
                except ScheduleError:
                    pass  # stays at the root: all of the operand is packed first
        sch.annotate(block, ANN_TILED, self.structure)

    def _register_tile_order(self, loops: list[LoopRV]) -> list[LoopRV]:
        return loops

    def _split(self, sch: Schedule, loop: LoopRV, n: int, hints: dict,
               caps: tuple | None = None) -> list[LoopRV]:
        if self.recipe is not None:
            # a seed (a subclass's fixed recipe): this loop's decision, in loop order as
            # ``_tile`` splits them
            decision = self._recipe_tiles.pop(0)
            if n <= 1:
                return [loop]
            inner = sch.sample_tile(loop, n, self.max_innermost_factor, hints or None,
                                    decision=decision)
            return sch.split(loop, [None, *inner])
        if n <= 1:
            return [loop]
        if caps is not None:
            inner = sch.sample_tile(loop, n, self.max_innermost_factor, hints or None,
                                    list(caps))
        else:
            inner = sch.sample_tile(loop, n, self.max_innermost_factor, hints or None)
        return sch.split(loop, [None, *inner])

    def _read_caches(self, sch: Schedule, block: BlockRV, levels) -> None:
        cfg = self.reuse_read
        level = cfg.levels[0]
        at = levels[level - 1][-1]
        b = sch.get(block)
        written = {id(w.buffer) for w in b.writes}
        buffers = [r.buffer for r in b.reads if id(r.buffer) not in written]
        for buf in buffers:
            idx = next(i for i, r in enumerate(sch.get(block).reads) if r.buffer is buf)
            cache = sch.cache_read(block, idx, cfg.scope)
            sch.compute_at(cache, at, preserve_unit_loops=True)
            if len(self.shared_layouts) > 1 and len(buf.shape) == 2:
                # which layout the tile takes in shared memory (transposed: the thread's
                # register rows of A contiguous; padded: no bank conflicts column-wise)
                ids = [SHARED_LAYOUTS.index(x) for x in self.shared_layouts]
                lay = sch.sample_categorical(ids, [1.0 / len(ids)] * len(ids))
                sch.annotate(cache, ANN_SHARED_LAYOUT, lay)
            own = _own_loops(sch, cache, at)
            if not own:
                continue
            fused = sch.fuse(*own) if len(own) > 1 else own[0]
            if self.vector_load_lens:
                lens = list(self.vector_load_lens)
                v = sch.sample_categorical(lens, [1.0 / len(lens)] * len(lens))
                sch.annotate(fused, ANN_COOPERATIVE_FETCH, v)
            else:
                sch.annotate(fused, ANN_COOPERATIVE_FETCH, 1)


def _own_loops(sch: Schedule, block: BlockRV, at: LoopRV) -> list[LoopRV]:
    """The loops of ``block`` below the loop ``at`` (those compute_at made)."""
    loops = sch.get_loops(block)
    at_var = sch.get(at).loop_var
    for i, l in enumerate(loops):
        if sch.get(l).loop_var is at_var:
            return loops[i + 1:]
    return loops


def _strip(e):
    return e.value if isinstance(e, Cast) else e


def _operands(info: A.BlockInfo) -> _Operands | None:
    """Recognize ``C[..., i, j] = C[..., i, j] + X * Y`` with ``j`` (the innermost spatial iter
    var) indexing one dim of Y exactly and absent from X, Y indexed by ``j`` and reduce vars
    only, and ``i`` (the next spatial var of C's indices) indexing X."""
    b = info.block
    body = b.body
    if not isinstance(body, BufferStore) or not isinstance(body.value, Add):
        return None
    prod = body.value.b if isinstance(body.value.b, Mul) else body.value.a
    rest = body.value.a if prod is body.value.b else body.value.b
    if not isinstance(prod, Mul) or not (isinstance(rest, BufferLoad) and rest.buffer is
                                         body.buffer):
        return None
    loads = [_strip(prod.a), _strip(prod.b)]
    if not all(isinstance(x, BufferLoad) for x in loads) or not body.indices:
        return None
    spatial = {id(iv.var): iv.var for iv in b.iter_vars if iv.kind == "spatial"}
    reduce_ = {id(iv.var) for iv in b.iter_vars if iv.kind == "reduce"}
    j = body.indices[-1]
    if not isinstance(j, Var) or id(j) not in spatial:
        return None
    i = body.indices[-2] if len(body.indices) >= 2 else None
    if i is not None and (not isinstance(i, Var) or id(i) not in spatial):
        i = None
    for y, x in ((loads[1], loads[0]), (loads[0], loads[1])):
        dims = [d for d, e in enumerate(y.indices) if e is j]
        panel = _prepacked(y.indices, j) if not dims else None
        if panel is not None:
            dims = [len(y.indices) - 1]
            others = [e for e in y.indices[:-1] if not _is_div(e, j, panel[0])]
        elif len(dims) != 1:
            continue
        else:
            others = [e for d, e in enumerate(y.indices) if d != dims[0]]
        if not all(isinstance(e, Var) and id(e) in reduce_ for e in others):
            continue
        if any(A.uses_var(e, j) for e in x.indices):
            continue
        if i is not None and not any(A.uses_var(e, i) for e in x.indices):
            i = None
        reads = [r.buffer for r in b.reads]
        xi = next((n for n, r in enumerate(reads) if r is x.buffer), None)
        yi = next((n for n, r in enumerate(reads) if r is y.buffer), None)
        if xi is None or yi is None or xi == yi:
            return None
        return _Operands(xi, yi, dims[0], i, j, panel[0] if panel else None)
    return None


def _is_div(e, j: Var, p: int) -> bool:
    return isinstance(e, FloorDiv) and e.a is j and isinstance(e.b, IntImm) and e.b.value == p


def _prepacked(indices, j: Var):
    """``(P,)`` when an operand is read as already packed by ``P`` along ``j``: one index
    ``j // P`` and the last one ``j % P`` (relax's AlterLayout weights ``W[j // 32, k, j % 32]``)."""
    last = indices[-1] if indices else None
    if not (isinstance(last, FloorMod) and last.a is j and isinstance(last.b, IntImm)):
        return None
    p = last.b.value
    if sum(_is_div(e, j, p) for e in indices[:-1]) != 1:
        return None
    return (p,)


class MultiLevelTilingWithIntrin(MultiLevelTiling):
    """``MultiLevelTiling`` whose innermost level is a register tile computed by a tensorized
    outer-product micro-kernel (``outer_product_f32_{isa}_{MR}x{NR}``), with packed panels of
    the ``B`` operand and the accumulators in a ``local`` cache: the BLAS kernel structure of
    ``benchmarks/schedules/gemm.py`` as a design space.

    ``MR`` (rows, unrolled) and ``NR`` (columns, a multiple of the vector lanes) are sampled
    with ``sample_categorical``; ``RewriteTensorize`` picks the intrinsic of the final sizes.

    Parameters
    ----------
    mr_candidates : tuple of int
        Register-tile rows to sample from.
    nr_vectors : tuple of int
        Register-tile columns to sample from, in vectors of the target's lanes.
    max_innermost_factor : int
        Bound of the other innermost tiles.

    Examples
    --------
    >>> rule = MultiLevelTilingWithIntrin(mr_candidates=(4, 6, 8), nr_vectors=(2, 4))
    """

    def __init__(self, mr_candidates=tuple(range(1, 9)), nr_vectors=(1, 2, 3, 4),
                 max_innermost_factor: int = 64, recipe: tuple[int, int] | None = None):
        super().__init__("SSRSRS", max_innermost_factor=max_innermost_factor,
                         reuse_write=ReuseConfig("must", (2,), "local"), pack="must")
        self.mr_candidates = tuple(int(m) for m in mr_candidates)
        self.nr_vectors = tuple(int(v) for v in nr_vectors)
        if recipe is not None:
            mr, nv = (int(x) for x in recipe)
            if mr not in self.mr_candidates or nv not in self.nr_vectors:
                raise ValueError(f"MultiLevelTilingWithIntrin: recipe {recipe!r} is not a "
                                 f"register tile of mr_candidates={self.mr_candidates} x "
                                 f"nr_vectors={self.nr_vectors}")
            recipe = (mr, nv)
        self.recipe = recipe
        self._swap = False
        self._recipe_tiles: list[list[int]] = []

    def __repr__(self):
        extra = f", recipe={self.recipe}" if self.recipe else ""
        return (f"MultiLevelTilingWithIntrin(mr_candidates={self.mr_candidates}, "
                f"nr_vectors={self.nr_vectors}{extra})")

    # -- seeds: the BLAS recipe at a few register tiles ----------------------------------------
    def seed_variants(self, count: int = 6) -> list["MultiLevelTilingWithIntrin"]:
        """The rule fixed to the hand GEMM recipe (``benchmarks/schedules/gemm.py``) at the
        ``count`` largest register tiles that fit the register file: the ``MR x NR``
        accumulators, one row of ``B`` (``NR / lanes`` vectors) and a broadcast of ``A``.
        A block whose column extent ``NR`` does not divide drops that tile's seed.

        A recipe point is a point of this rule's space (the same trace, its decisions fixed):
        panels of the packed operand outermost (the parallel level), every row tile in level
        1, the other spatial loops (batch, output rows of a conv) in level 0 beside the
        panels, each reduce loop whole in level 0 and unit tiles elsewhere. Randomly drawn
        points are rarely near it (the outer levels take uniform factorizations), and the
        evolution only improves on what it is shown.
        """
        if self.recipe is not None:
            return []
        regs = 16
        if self.context is not None:
            regs = MachineModel.for_target(self.context.target).vector_registers
        fits = [(mr, nv) for mr in self.mr_candidates for nv in self.nr_vectors
                if mr * nv + nv + 1 <= regs]
        fits.sort(key=lambda t: (-t[0] * t[1], -t[1]))
        out = []
        for mr, nv in fits[:count]:
            v = MultiLevelTilingWithIntrin(self.mr_candidates, self.nr_vectors,
                                           self.max_innermost_factor, recipe=(mr, nv))
            if self.context is not None:
                v.initialize(self.context)
            out.append(v)
        return out

    def _applicable(self, sch: Schedule, block: BlockRV):
        info = super()._applicable(sch, block)
        if info is None:
            return None
        ops = _operands(info)
        if ops is None or ops.i_var is None:
            return None
        return info

    def apply(self, sch: Schedule, block: BlockRV) -> list[Schedule]:
        if self._applicable(sch, block) is None:
            return [sch]
        out = [s for s in super().apply(sch, block) if s is not sch]
        for s in out:
            s.annotate(block, ANN_TENSORIZE, "outer_product")
        if self.recipe is not None:
            # a seed: the recipe or nothing (a block it does not fit drops the seed)
            self.seeded += bool(out)
            return out
        # the untouched schedule goes on too: MultiLevelTiling offers the plain tilings
        return out + [sch]

    def _inner_tiles(self, sch: Schedule, info: A.BlockInfo, loops):
        ops = _operands(info)
        binding = A.trivial_binding(info)
        pos = {id(f.loop_var): n for n, f in enumerate(info.loops)}
        i_idx, j_idx = pos[id(binding[ops.i_var].loop_var)], pos[id(binding[ops.j_var].loop_var)]
        hints = self.context.shape_hints if self.context else {}
        dtype = info.block.writes[0].buffer.dtype
        lanes = self.context.lanes(dtype) if self.context else 4
        ei = A.extent_value(info.loops[i_idx], hints)
        ej = A.extent_value(info.loops[j_idx], hints)
        mrs = [m for m in self.mr_candidates if ei is None or m <= max(ei, 1)] or [1]
        nrs = [lanes * v for v in self.nr_vectors if ej is None or lanes * v <= max(ej, lanes)]
        if ops.panel is not None:
            # an operand packed in panels of P: a register tile inside one panel
            nrs = [nr for nr in nrs if ops.panel % nr == 0] or \
                [d for d in range(min(ops.panel, 64), 0, -1) if ops.panel % d == 0][:1]
        nrs = nrs or [lanes]
        pick_mr = pick_nr = None
        if self.recipe is not None:
            want_mr, want_nr = self.recipe[0], self.recipe[1] * lanes
            if want_mr not in mrs or want_nr not in nrs or (ej is not None and ej % want_nr):
                # (a panel width that leaves a column tail is far slower: masked lanes)
                raise ScheduleError("MultiLevelTilingWithIntrin", f"recipe {self.recipe} does "
                                    f"not fit block {info.block.name}", info.block)
            pick_mr, pick_nr = mrs.index(want_mr), nrs.index(want_nr)
            self._recipe_tiles = self._recipe_decisions(info, i_idx, j_idx, want_mr, want_nr,
                                                        hints)
        mr = sch.sample_categorical(mrs, [1.0 / len(mrs)] * len(mrs), decision=pick_mr)
        nr = sch.sample_categorical(nrs, [1.0 / len(nrs)] * len(nrs), decision=pick_nr)
        self._swap = j_idx < i_idx
        n = self.structure.count("S") - 1
        return {i_idx: (mr, n), j_idx: (nr, n)}

    def _recipe_decisions(self, info: A.BlockInfo, i_idx: int, j_idx: int, mr: int, nr: int,
                          hints: dict) -> list[list[int]]:
        """The recipe's tile decisions, one per loop in loop order (the order ``_tile`` calls
        ``_split`` in): for ``j`` (outside its ``NR`` tile) the panels in level 0, for ``i``
        (outside ``MR``) the row tiles in level 1, other spatial loops in level 0, reduce
        loops whole in level 0."""
        n_s, n_r = self.structure.count("S"), self.structure.count("R")
        out = []
        for idx, (loop, kind) in enumerate(zip(info.loops, A.loop_iter_kinds(info))):
            ext = A.extent_value(loop, hints)
            if ext is None:
                raise ScheduleError("MultiLevelTilingWithIntrin", f"loop {loop.loop_var.name} "
                                    f"has no representative extent", loop)
            if idx == j_idx:
                out.append([-(-ext // nr)] + [1] * (n_s - 2))
            elif idx == i_idx:
                out.append([1, -(-ext // mr)] + [1] * (n_s - 3))
            elif kind == "S":
                out.append([ext] + [1] * (n_s - 2))
            else:
                out.append([ext] + [1] * (n_r - 1))
        return out

    def _register_tile_order(self, loops):
        return list(reversed(loops)) if self._swap else loops
