"""``MultiLevelTilingDot4``: tile an 8-bit multiply-accumulate (uint8 x int8 -> int32) like
``MultiLevelTiling`` and compute its innermost step with the packed dot product ``dot4_u8i8``
(``vpdpbusd`` with AVX-512 VNNI, ``sdot`` with aarch64 ``+dotprod``, an exact widening
``vpmaddwd`` / ``smull`` sequence elsewhere; ``targets.llvm.dot4``).

The rule applies to a block ``C[..., j] += int32(X[...]) * int32(Y[...])`` whose operands are
uint8 and int8 (either way round), with

* ``j``, the innermost spatial iter var (the last index of ``C``), indexing one operand (the
  *vector* operand: one lane per ``j``) and not the other (the *broadcast* operand), and
* a reduce iter var ``k`` of constant extent divisible by 4 indexing one dim of each operand,
  before ``j``'s dim in the vector operand (``W[k, j]``, ``data[n, c, y, x]`` with ``k = c``).

It splits ``k`` by 4 and ``j`` by ``L`` (``sample_categorical`` over 1, 2 or 4 vectors of the
target's int32 lanes, those that divide ``j``'s extent where any does, else half or a
quarter vector if that divides it) and tiles the rest like the CPU ``MultiLevelTiling`` (``"SSRSRS"``, the
accumulators in a ``local`` write cache after level 1 or 2, or none): the innermost levels are
``... S2  R1 (k % 4 last)  S3 = j % L``. The block is annotated for ``RewriteTensorize``,
which tensorizes the ``4 x L`` step with ``dot4_u8i8_{L}`` / ``dot4_i8u8_{L}``
(``tensorir.schedule.intrinsics.dot4_funcs``): the broadcast operand's four bytes as one
int32 word, the vector operand's as one word per lane, ``acc + dot4_u8i8(u8 word, i8 word)``
per lane. A partial tile (``j``'s extent not a multiple of ``L``) runs the same loops without
the intrinsic: every schedule is finished and exact.

Reduction extents not divisible by 4 are left to the other rules (padding the reduction to a
multiple of 4 is not done here: the relax int8 kernels pack their operands into words with
zero padding at build time instead, ``relax.backend.cpu.dense_int8``).

Examples
--------
>>> from tilecraft.targets import Target
>>> rule = MultiLevelTilingDot4()
>>> has_dot_instruction(Target("llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod"))
True
>>> has_dot_instruction(Target("llvm -mtriple=aarch64-linux-gnu -mattr=+neon"))
False
"""
from __future__ import annotations

from dataclasses import dataclass

from tilecraft.tensorir.expr import Add, BufferLoad, Cast, Mul, Var
from tilecraft.tensorir.schedule import BlockRV, LoopRV, Schedule, ScheduleError
from tilecraft.tensorir.schedule.intrinsics import target_isas
from tilecraft.tensorir.stmt import BufferStore

from ..feature import MachineModel
from . import analysis as A
from .base import ANN_TENSORIZE
from .multi_level_tiling import MultiLevelTiling, ReuseConfig

# the ANN_TENSORIZE value of a block whose k-step of 4 x L lanes is a dot4 intrinsic
DOT4_FAMILY = "dot4_u8i8"


def has_dot_instruction(target) -> bool:
    """Whether ``target`` computes ``dot4_u8i8`` in a few vector instructions: x86 with AVX2 or
    AVX-512 (``vpmaddwd``, or ``vpdpbusd`` with VNNI) and aarch64 with ``+dotprod``
    (``sdot``). Elsewhere the widening sequence costs about what the plain loops do.

    Examples
    --------
    >>> from tilecraft.targets import Target
    >>> has_dot_instruction(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"))
    True
    """
    arch = str(getattr(target, "arch", ""))
    if arch in ("x86_64", "x86"):
        return bool(target_isas(target))
    if arch == "aarch64":
        return "+dotprod" in set(target.mattr or ())
    return False


@dataclass(frozen=True)
class Dot4Operands:
    """The roles in ``C[..., j] += int32(X) * int32(Y)`` of an 8-bit block: ``j`` (the lanes),
    ``k`` (the reduce var split by 4), the vector operand (indexed by ``j``) and the dtype of
    the broadcast one."""

    j_var: Var
    k_var: Var
    vector: BufferLoad
    broadcast: BufferLoad

    @property
    def order(self) -> str:
        """``"u8i8"`` when the broadcast operand is the uint8 one, else ``"i8u8"`` (the
        intrinsic family ``dot4_{order}_{L}``)."""
        return "u8i8" if self.broadcast.buffer.dtype == "uint8" else "i8u8"


def _widened(e) -> BufferLoad | None:
    """``X[...]`` of ``int32(X[...])`` with ``X`` 8-bit, else None."""
    if isinstance(e, Cast) and e.dtype == "int32" and isinstance(e.value, BufferLoad) and \
            e.value.buffer.dtype in ("uint8", "int8"):
        return e.value
    return None


def dot4_operands(info: A.BlockInfo) -> Dot4Operands | None:
    """Recognize the 8-bit multiply-accumulate the rule tensorizes (see the module's
    docstring); None for any other block."""
    b = info.block
    body = b.body
    if not isinstance(body, BufferStore) or body.buffer.dtype != "int32" or \
            not isinstance(body.value, Add) or not body.indices:
        return None
    v = body.value
    prod, acc = (v.b, v.a) if isinstance(v.b, Mul) else (v.a, v.b)
    if not isinstance(prod, Mul) or not isinstance(acc, BufferLoad) or acc.buffer is not \
            body.buffer:
        return None
    x, y = _widened(prod.a), _widened(prod.b)
    if x is None or y is None or {x.buffer.dtype, y.buffer.dtype} != {"uint8", "int8"}:
        return None
    j = body.indices[-1]
    kinds = {id(iv.var): iv for iv in b.iter_vars}
    if not isinstance(j, Var) or id(j) not in kinds or kinds[id(j)].kind != "spatial":
        return None
    x_j = any(A.uses_var(e, j) for e in x.indices)
    y_j = any(A.uses_var(e, j) for e in y.indices)
    if x_j == y_j:
        return None
    vec, bcast = (x, y) if x_j else (y, x)
    j_dim = next(d for d, e in enumerate(vec.indices) if A.uses_var(e, j))
    for iv in reversed(b.iter_vars):
        k = iv.var
        ext = A.as_int(iv.dom.extent)
        if iv.kind != "reduce" or ext is None or ext % 4:
            continue
        vk = [d for d, e in enumerate(vec.indices) if A.uses_var(e, k)]
        bk = [d for d, e in enumerate(bcast.indices) if A.uses_var(e, k)]
        # k exactly one index of each operand, alone (the four bytes of a step consecutive)
        if len(vk) != 1 or len(bk) != 1 or vec.indices[vk[0]] is not k or \
                bcast.indices[bk[0]] is not k or vk[0] >= j_dim:
            continue
        return Dot4Operands(j, k, vec, bcast)
    return None


class MultiLevelTilingDot4(MultiLevelTiling):
    """``MultiLevelTiling`` of an 8-bit multiply-accumulate whose innermost ``4 x L`` step
    (4 bytes of the reduction, ``L`` int32 lanes of the output) is the dot-product intrinsic
    ``dot4_u8i8`` (TVM's ``MultiLevelTilingWithIntrin`` with the VNNI / sdot intrinsics).

    Parameters
    ----------
    lane_vectors : tuple of int
        ``L`` to sample from, in vectors of the target's int32 lanes.
    max_innermost_factor : int
        Bound of the other innermost tiles.
    recipe : (int, int), optional
        ``(MR, lane vectors)``: fix the rule to that register tile (a seed variant,
        ``seed_variants``); a block it does not fit gets no schedule from the rule.

    Examples
    --------
    >>> rule = MultiLevelTilingDot4(lane_vectors=(1, 2))
    """

    def __init__(self, lane_vectors=(1, 2, 4), max_innermost_factor: int = 64,
                 recipe: tuple[int, int] | None = None):
        super().__init__("SSRSRS", max_innermost_factor=max_innermost_factor,
                         reuse_write=ReuseConfig("may", (1, 2), "local"))
        self.lane_vectors = tuple(int(v) for v in lane_vectors)
        if not self.lane_vectors or min(self.lane_vectors) < 1:
            raise ValueError(f"MultiLevelTilingDot4: lane_vectors must be positive ints, got "
                             f"{lane_vectors!r}")
        if recipe is not None:
            recipe = (int(recipe[0]), int(recipe[1]))
            if recipe[0] < 1 or recipe[1] not in self.lane_vectors:
                raise ValueError(f"MultiLevelTilingDot4: recipe {recipe!r} is not (rows >= 1, "
                                 f"one of lane_vectors={self.lane_vectors})")
        self.recipe = recipe
        self._recipe_tiles: list[list[int]] = []

    def __repr__(self):
        extra = f", recipe={self.recipe}" if self.recipe else ""
        return f"MultiLevelTilingDot4(lane_vectors={self.lane_vectors}{extra})"

    # -- seeds: the int8 kernels' register tile --------------------------------------------------
    def seed_variants(self) -> list["MultiLevelTilingDot4"]:
        """The rule fixed to the default int8 kernels' tile (``relax.backend.cpu.dense_int8``,
        the float dense kernel's schedule on int32 accumulators): ``MR`` rows of the broadcast
        operand x ``L`` lanes in registers (``MR * L / lanes`` accumulators, one vector of the
        other operand and a broadcast within the register file), the lane panels outermost
        (the parallel level), every row tile in level 1, each reduce loop whole in level 0.
        A block the tile does not divide drops the seed; the search measures the seeds first
        and evolves from them.

        Examples
        --------
        >>> [v.recipe for v in MultiLevelTilingDot4().seed_variants()][:2]   # doctest: +SKIP
        [(4, 4), (6, 2)]
        """
        if self.recipe is not None:
            return []
        regs = 16
        if self.context is not None:
            regs = MachineModel.for_target(self.context.target).vector_registers
        fits = [(mr, nv) for mr in (1, 2, 4, 6, 8) for nv in self.lane_vectors
                if mr * nv + nv + 1 <= regs]
        fits.sort(key=lambda t: (-t[0] * t[1], -t[1]))
        out = []
        for mr, nv in fits[:4]:
            v = MultiLevelTilingDot4(self.lane_vectors, self.max_innermost_factor, (mr, nv))
            if self.context is not None:
                v.initialize(self.context)
            out.append(v)
        return out

    def _applicable(self, sch: Schedule, block: BlockRV):
        info = super()._applicable(sch, block)
        if info is None or dot4_operands(info) is None:
            return None
        return info

    def apply(self, sch: Schedule, block: BlockRV) -> list[Schedule]:
        if self._applicable(sch, block) is None:
            return [sch]
        out = [s for s in super().apply(sch, block) if s is not sch]
        for s in out:
            s.annotate(block, ANN_TENSORIZE, DOT4_FAMILY)
        if self.recipe is not None:
            # a seed: the recipe or nothing (a block it does not fit drops the seed)
            self.seeded += bool(out)
            return out
        # the untouched schedule goes on too: MultiLevelTiling offers the plain tilings
        return out + [sch]

    def _inner_tiles(self, sch: Schedule, info: A.BlockInfo, loops: list[LoopRV]) -> dict:
        ops = dot4_operands(info)
        binding = A.trivial_binding(info)
        pos = {id(f.loop_var): n for n, f in enumerate(info.loops)}
        j_idx = pos[id(binding[ops.j_var].loop_var)]
        k_idx = pos[id(binding[ops.k_var].loop_var)]
        hints = self.context.shape_hints if self.context else {}
        lanes = self.context.lanes("int32") if self.context else 4
        ej = A.extent_value(info.loops[j_idx], hints)
        widths = [lanes * v for v in self.lane_vectors]
        # a width that divides j's extent: a tail tile has a predicate and is not tensorized
        # (else half or a quarter vector: vpdpbusd and sdot come in 128 and 256 bits too)
        fits = [w for w in widths if ej is None or ej % w == 0] or \
            [w for w in (lanes // 2, lanes // 4) if w >= 4 and ej % w == 0][:1]
        widths = fits or [w for w in widths if w <= max(ej, lanes)]
        pick = None
        if self.recipe is not None:
            mr, want = self.recipe[0], self.recipe[1] * lanes
            if want not in widths or ej is None or ej % want:
                raise ScheduleError("MultiLevelTilingDot4", f"recipe {self.recipe} does not "
                                    f"fit block {info.block.name}", info.block)
            pick = widths.index(want)
            self._recipe_tiles = self._recipe_decisions(info, ops, j_idx, k_idx, mr, want, hints)
        width = sch.sample_categorical(widths, [1.0 / len(widths)] * len(widths), decision=pick)
        return {j_idx: (width, self.structure.count("S") - 1),
                k_idx: (4, self.structure.count("R") - 1)}

    def _recipe_decisions(self, info: A.BlockInfo, ops: Dot4Operands, j_idx: int, k_idx: int,
                          mr: int, width: int, hints: dict) -> list[list[int]]:
        """The recipe's tile decisions, one per ``_split`` call in loop order: ``j`` (outside
        its ``L`` tile) in panels at level 0; the rows (the spatial loop of ``C``'s next-to-
        last index, read by the broadcast operand) ``MR`` at level 2, the rest at level 1;
        other spatial loops whole at level 0; ``k`` (outside its 4) and the other reduce
        loops whole at level 0."""
        n_s, n_r = self.structure.count("S"), self.structure.count("R")
        binding = A.trivial_binding(info)
        store = info.block.body
        rows = store.indices[-2] if len(store.indices) >= 2 else None
        i_idx = None
        row_loop = next((f for v, f in binding.items() if v is rows), None)
        if row_loop is not None and any(A.uses_var(e, rows) for e in ops.broadcast.indices):
            i_idx = [id(f.loop_var) for f in info.loops].index(id(row_loop.loop_var))
        out = []
        for idx, (loop, kind) in enumerate(zip(info.loops, A.loop_iter_kinds(info))):
            ext = A.extent_value(loop, hints)
            if ext is None:
                raise ScheduleError("MultiLevelTilingDot4", f"loop {loop.loop_var.name} has no "
                                    f"representative extent", loop)
            if idx == j_idx:
                out.append([ext // width] + [1] * (n_s - 2))   # S0 panels, S1, S2 (+ L)
            elif idx == i_idx:
                if ext % mr:
                    raise ScheduleError("MultiLevelTilingDot4", f"recipe rows {mr} do not "
                                        f"divide {ext}", loop)
                out.append([1, ext // mr] + [1] * (n_s - 4) + [mr])   # S0, S1, S2 = MR
            elif kind == "S":
                out.append([ext] + [1] * (n_s - 2))            # S0 whole
            elif idx != k_idx:
                out.append([ext] + [1] * (n_r - 1))            # R0 whole
            else:
                out.append([ext // 4] + [1] * (n_r - 2))       # k: R0 = k // 4 whole
        return out

