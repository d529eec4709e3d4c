"""``RewritePackedLayout``: give each packed operand (a ``cache_read`` copy that
``MultiLevelTiling`` annotated with ``meta_schedule.pack``) its panel layout.

The copy ``B_global`` of ``B[k, j]`` becomes ``B_global[j // P, k, j % P]`` where ``P`` is the
extent of the consumer's innermost loop over ``j`` (its vectorized register tile): for a fixed
``k`` the tile reads ``P`` contiguous values, and consecutive ``k`` follow each other, so the
micro-kernel streams one contiguous panel. The copy's own loops are reordered to write the
panel in that order, with the ``P`` lanes vectorized. When the innermost loop is not over ``j``
(``P`` would be 1) the copy is pointless and is inlined back.

The layout is decided here, not in the rule, because ``P`` comes from sampled (and mutated) tile
sizes: the trace of the rule only says *that* the operand is packed.
"""
from __future__ import annotations

from tilecraft.tensorir import arith
from tilecraft.tensorir.expr import IntImm, Var
from tilecraft.tensorir.functor import free_vars, substitute
from tilecraft.tensorir.schedule import Schedule, ScheduleError, tree
from tilecraft.tensorir.schedule.index_map import IndexMap

from ..schedule_rule import analysis as A
from ..schedule_rule.base import ANN_PACK
from .base import Postproc

MAX_VECTOR_LANES = 64


class RewritePackedLayout(Postproc):
    """Lay out packed operands as panels of the consumer's inner tile width.

    Examples
    --------
    >>> RewritePackedLayout().apply(sch)                # doctest: +SKIP
    True
    """

    def apply(self, sch: Schedule) -> bool:
        packs = [br.block for br in A.all_blocks(sch.func)
                 if dict(br.block.annotations).get(ANN_PACK) is not None]
        for pack in packs:
            consumer, dim = dict(pack.annotations)[ANN_PACK]
            try:
                self._rewrite(sch, pack.name, str(consumer), int(dim))
            except ScheduleError:
                return False
        return True

    def _rewrite(self, sch: Schedule, pack_name: str, consumer: str, dim: int) -> None:
        pinfo = A.find_block_info(sch.func, pack_name)
        buf = pinfo.block.writes[0].buffer
        try:
            cinfo = A.find_block_info(sch.func, consumer)
        except KeyError:
            cinfo = None
        width = _panel_width(cinfo, buf, dim) if cinfo is not None else 1
        pack = sch.get_block(pack_name)
        if width <= 1:
            sch.compute_inline(pack)
            return
        ndim = len(buf.shape)
        idx = [Var(f"i{d}", "int64") for d in range(ndim)]
        final = [idx[dim] // width] + [idx[d] for d in range(ndim) if d != dim] + \
            [idx[dim] % width]
        sch.transform_layout(pack, ("write", 0), IndexMap(idx, final))
        # the copy's loops: the one over ``dim`` split by the panel width, panels outermost
        # (of the copy's own loops), lanes innermost
        pinfo = A.find_block_info(sch.func, pack_name)
        loops = sch.get_loops(pack)
        value = pinfo.realize.iter_values[dim] if dim < len(pinfo.realize.iter_values) else None
        own = _own_loop_positions(pinfo)
        pos = next((p for p in own if value is not None and
                    any(v is pinfo.loops[p].loop_var for v in free_vars(value))), None)
        if pos is None:
            return
        outer, inner = sch.split(loops[pos], [None, width])
        rest = [loops[p] for p in own if p != pos]
        sch.reorder(outer, *rest, inner)
        if width <= MAX_VECTOR_LANES:
            sch.vectorize(inner)


def _own_loop_positions(info: A.BlockInfo) -> list[int]:
    """Positions of the loops above the copy that only it uses (below its compute-at loop):
    the loops of its own nest, those whose body holds nothing but this block."""
    out = []
    for p in range(len(info.loops) - 1, -1, -1):
        loop = info.loops[p]
        inner = tree.child_block_realizes(loop)
        if len(inner) != 1 or inner[0] is not info.realize:
            break
        out.append(p)
    return sorted(out)


def _panel_width(info: A.BlockInfo, buf, dim: int) -> int:
    """Extent of the consumer's innermost non-unit loop when it walks ``dim`` of its read of
    ``buf`` with stride 1; else 1."""
    loads = [ld for ld in A.read_loads(info.block) if ld.buffer is buf]
    if not loads:
        return 1
    index = loads[0].indices[dim]
    binding = {id(iv.var): v for iv, v in zip(info.block.iter_vars, info.realize.iter_values)}
    loops = [l for l in info.loops if A.const_extent(l) != 1]
    if not loops:
        return 1
    inner = loops[-1]
    ext = A.const_extent(inner)
    if ext is None or inner.kind not in ("serial", "vectorized", "unrolled"):
        return 1
    # the index at ``dim`` must be an iter var whose binding ends in ``... + inner`` (stride 1)
    if not isinstance(index, Var) or id(index) not in binding:
        return 1
    value = binding[id(index)]
    probe = arith.simplify(_subst(value, inner.loop_var, 1) - _subst(value, inner.loop_var, 0))
    if not (isinstance(probe, IntImm) and probe.value == 1):
        return 1
    return ext


def _subst(expr, var, value: int):
    return substitute(expr, {var: IntImm(value, var.dtype)})
