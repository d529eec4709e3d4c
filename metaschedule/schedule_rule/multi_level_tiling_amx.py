"""``MultiLevelTilingAMX``: tile an int8 dense on packed words around the Intel AMX block
product (the tensor intrinsic ``amx_u8s8s32_{M}x{N}x{K}``, ``tensorir.schedule.intrinsics``),
where the target has AMX (``Target.amx_int8``).

The rule applies to a block ``C[..., i, j] += dot4_u8i8(A[..., i, kw], B[..., kw, j])`` (the
``dense_u8i8`` kernels of ``relax.backend.cpu.dense_int8``): ``A`` the uint8 activations as
int32 words (four bytes of a row each), ``B`` the int8 weight as words in the VNNI layout,
either ``B[kw, j]`` or in panels ``B[j // W, kw, j % W]``, ``C`` int32; ``kw`` of constant
extent, a multiple of 16 words (whole 64-byte tiles), ``j`` of constant extent. The rows may be
symbolic: the last block of rows is a partial tile of the intrinsic (its row count).

It samples the tile (``sample_categorical``, so the search and its mutators move them): ``M``
rows (16 or 32: one or two A tiles), ``N`` columns (16, 32 or 64: C tiles of 16 int32 columns,
dividing ``j``'s extent; the panel width where the weight is in panels) and ``KT`` words of the reduction per call (the
whole reduction, or half or a quarter of it in whole tiles: the C tiles are loaded and stored
once per call). The schedule: ``j`` panels outermost, then the rows, then the reduction steps;
the accumulators in a ``local`` cache written back (and the epilogue fused, ``AutoInline``)
after each block of rows; the init separate (``decompose_reduction``); the block annotated
for ``RewriteTensorize``, which tensorizes the ``M x N x KT`` tile once its sizes are known.

Examples
--------
>>> from tilecraft.targets import Target
>>> has_amx(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids"))
True
"""
from __future__ import annotations

from dataclasses import dataclass

from tilecraft.tensorir.expr import DOT4_U8I8, Add, BufferLoad, Call, FloorDiv, FloorMod, Var
from tilecraft.tensorir.schedule import BlockRV, Schedule, ScheduleError
from tilecraft.tensorir.stmt import BufferStore

from . import analysis as A
from .base import ANN_TENSORIZE, ANN_TILED, ScheduleRule

# the ANN_TENSORIZE value of a block whose tile is the AMX block product
AMX_FAMILY = "amx_u8s8s32"
AMX_ROWS = (16, 32)
AMX_COLS = (16, 32, 64)
AMX_K_PARTS = (1, 2, 4)


def has_amx(target) -> bool:
    """Whether ``target`` has Intel AMX int8 tiles (``Target.amx_int8``)."""
    return bool(getattr(target, "amx_int8", False))


@dataclass(frozen=True)
class AMXOperands:
    """The roles in an int8 dense block on words: loop positions of the rows ``i``, the
    columns ``j`` and the reduction ``kw`` (in ``info.loops``), their extents (``m`` None when
    symbolic) and the weight's panel width (None for ``B[kw, j]``)."""

    i_idx: int
    j_idx: int
    k_idx: int
    m: int | None
    n: int
    k_words: int
    panel: int | None


def _is_var(e, v) -> bool:
    return isinstance(e, Var) and e is v


def amx_operands(info: A.BlockInfo) -> AMXOperands | None:
    """Recognize the block the rule tiles (see the module's docstring); None for any other."""
    b = info.block
    body = b.body
    if not isinstance(body, BufferStore) or body.buffer.dtype != "int32" or \
            len(body.indices) < 2 or not isinstance(body.value, Add):
        return None
    v = body.value
    acc, dot = (v.a, v.b) if isinstance(v.b, Call) else (v.b, v.a)
    if not isinstance(acc, BufferLoad) or acc.buffer is not body.buffer or \
            not isinstance(dot, Call) or dot.op != DOT4_U8I8:
        return None
    a, w = dot.args
    if not (isinstance(a, BufferLoad) and isinstance(w, BufferLoad)) or \
            a.buffer.dtype != "int32" or w.buffer.dtype != "int32" or len(a.indices) < 2:
        return None
    i, j = body.indices[-2], body.indices[-1]
    kw = a.indices[-1]
    ivs = {id(iv.var): iv for iv in b.iter_vars}
    for x, kind in ((i, "spatial"), (j, "spatial"), (kw, "reduce")):
        if not isinstance(x, Var) or id(x) not in ivs or ivs[id(x)].kind != kind:
            return None
    if not _is_var(a.indices[-2], i):
        return None
    # the weight: B[kw, j] or panels B[j // W, kw, j % W]
    panel = None
    if len(w.indices) >= 2 and _is_var(w.indices[-2], kw) and _is_var(w.indices[-1], j):
        panel = 0
    elif len(w.indices) >= 3 and _is_var(w.indices[-2], kw) and \
            isinstance(w.indices[-1], FloorMod) and _is_var(w.indices[-1].a, j) and \
            isinstance(w.indices[-3], FloorDiv) and _is_var(w.indices[-3].a, j) and \
            A.as_int(w.indices[-1].b) is not None and \
            A.as_int(w.indices[-1].b) == A.as_int(w.indices[-3].b):
        panel = A.as_int(w.indices[-1].b)
    if panel is None:
        return None
    binding = A.trivial_binding(info)
    if binding is None:
        return None
    pos = {id(f.loop_var): n for n, f in enumerate(info.loops)}
    i_idx, j_idx, k_idx = (pos[id(binding[x].loop_var)] for x in (i, j, kw))
    n, k_words = A.const_extent(info.loops[j_idx]), A.const_extent(info.loops[k_idx])
    if n is None or k_words is None or k_words % 16 or not i_idx < j_idx < k_idx or \
            k_idx != len(info.loops) - 1:
        return None
    return AMXOperands(i_idx, j_idx, k_idx, A.const_extent(info.loops[i_idx]), n, k_words,
                       panel or None)


class MultiLevelTilingAMX(ScheduleRule):
    """Tile an int8 dense on words around the AMX block product (see the module docstring;
    TVM's ``MultiLevelTilingWithIntrin`` with its AMX intrinsic).

    Parameters
    ----------
    rows, cols : tuple of int
        The tile's ``M`` and ``N`` to sample from (``N`` multiples of 16).
    k_parts : tuple of int
        Into how many calls the reduction is cut (whole tiles of 16 words each).

    Examples
    --------
    >>> rule = MultiLevelTilingAMX(rows=(32,), cols=(64,))
    """

    def __init__(self, rows=AMX_ROWS, cols=AMX_COLS, k_parts=AMX_K_PARTS):
        self.rows = tuple(int(r) for r in rows)
        self.cols = tuple(int(c) for c in cols)
        self.k_parts = tuple(int(p) for p in k_parts)
        if not self.rows or not all(1 <= r <= 32 for r in self.rows):
            raise ValueError(f"MultiLevelTilingAMX: rows must be 1..32, got {rows!r}")
        if not self.cols or any(c < 16 or c % 16 for c in self.cols):
            raise ValueError(f"MultiLevelTilingAMX: cols must be multiples of 16, got {cols!r}")
        if not self.k_parts or min(self.k_parts) < 1:
            raise ValueError(f"MultiLevelTilingAMX: k_parts must be positive, got {k_parts!r}")

    def __repr__(self):
        return f"MultiLevelTilingAMX(rows={self.rows}, cols={self.cols}, k_parts={self.k_parts})"

    def _applicable(self, sch: Schedule, block: BlockRV):
        if self.context is None or not has_amx(self.context.target):
            return None
        info = A.block_info(sch, block)
        b = info.block
        if A.is_root(info) or not A.is_subroot(info) or \
                dict(b.annotations).get(ANN_TILED) is not None or not A.is_reduction(b):
            return None
        ops = amx_operands(info)
        if ops is None or not self._cols(ops):
            return None
        return ops

    def _cols(self, ops: AMXOperands) -> list[int]:
        if ops.panel is not None:
            # a tile narrower than a panel would index the weight by (16 j_o + j_i) // W,
            # which tensorize cannot see as one panel: the tile is the panel
            return [ops.panel] if ops.panel % 16 == 0 and ops.n % ops.panel == 0 else []
        return [c for c in self.cols if ops.n % c == 0]

    def _k_tiles(self, ops: AMXOperands) -> list[int]:
        out = []
        for p in self.k_parts:
            kt = ops.k_words // p
            if ops.k_words % p == 0 and kt % 16 == 0 and kt not in out:
                out.append(kt)
        return out

    def apply(self, sch: Schedule, block: BlockRV) -> list[Schedule]:
        ops = self._applicable(sch, block)
        if ops is None:
            return [sch]
        s = sch.copy()
        try:
            self._tile(s, block, ops)
        except ScheduleError:
            return [sch]
        # the untouched schedule goes on too: MultiLevelTiling offers the plain tilings
        return [s, sch]

    def _tile(self, sch: Schedule, block: BlockRV, ops: AMXOperands) -> None:
        def pick(values):
            return sch.sample_categorical(values, [1.0 / len(values)] * len(values))
        rows = [r for r in self.rows if ops.m is None or r <= max(ops.m, min(self.rows))]
        m = pick(rows)
        n = pick(self._cols(ops))
        kt = pick(self._k_tiles(ops))
        loops = sch.get_loops(block)
        li, lj, lk = loops[ops.i_idx], loops[ops.j_idx], loops[ops.k_idx]
        others = [lp for x, lp in enumerate(loops) if x not in (ops.i_idx, ops.j_idx, ops.k_idx)]
        jo, ji = sch.split(lj, [None, n])
        io, ii = sch.split(li, [None, m])
        ko, ki = sch.split(lk, [None, kt])
        sch.reorder(jo, *others, io, ko, ii, ji, ki)
        acc = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(acc, io)
        sch.decompose_reduction(block, ko)
        sch.annotate(block, ANN_TILED, AMX_FAMILY)
        sch.annotate(block, ANN_TENSORIZE, AMX_FAMILY)


__all__ = ["AMX_FAMILY", "AMXOperands", "MultiLevelTilingAMX", "amx_operands", "has_amx"]
