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
from tilecraft.tensorir.schedule import BlockRV, LoopRV, Schedule
from tilecraft.tensorir.schedule.intrinsics import target_isas
from tilecraft.tensorir.stmt import BufferStore

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

    Examples
    --------
    >>> rule = MultiLevelTilingDot4(lane_vectors=(1, 2))
    """

    def __init__(self, lane_vectors=(1, 2, 4), max_innermost_factor: int = 64):
        super().__init__("SSRSRS", max_innermost_factor=max_innermost_factor,
                         reuse_write=ReuseConfig("may", (1, 2), "local"))
        self.lane_vectors = tuple(int(v) for v in lane_vectors)
        if not self.lane_vectors or min(self.lane_vectors) < 1:
            raise ValueError(f"MultiLevelTilingDot4: lane_vectors must be positive ints, got "
                             f"{lane_vectors!r}")

    def __repr__(self):
        return f"MultiLevelTilingDot4(lane_vectors={self.lane_vectors})"

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
        width = sch.sample_categorical(widths, [1.0 / len(widths)] * len(widths))
        return {j_idx: (width, self.structure.count("S") - 1),
                k_idx: (4, self.structure.count("R") - 1)}
