"""``RewriteTensorize``: compute the register tile of a block annotated by
``MultiLevelTilingWithIntrin`` with a tensor intrinsic, now that its size is known.

The update ``C[i, j] += A[i, k] * B[k, j]`` over the ``MR x NR`` tile becomes
``outer_product_f32_{isa}_{MR}x{NR}`` and its init (after ``RewriteReductionBlock``)
``fill_zero_f32_{isa}_{MR}x{NR}``; an 8-bit block of ``MultiLevelTilingDot4`` has its
``4 x L`` step (4 bytes of the reduction, ``L`` lanes) tensorized with ``dot4_u8i8_{L}`` or
``dot4_i8u8_{L}`` (whichever operand is broadcast) and its init vectorized; the blocks that read the tile's accumulators back (the write
cache, or a fused epilogue) get their rows unrolled and columns vectorized.

A tile that cannot be tensorized -- a partial tile at the edge of the iteration space (its block
has a predicate), an operand whose layout does not match the intrinsic's, a dtype or an ISA
without a family member -- is computed by the same loops the intrinsic's implementation is made
of: rows unrolled, columns vectorized. So the schedule is always finished, and on full tiles it
runs the micro-kernel.
"""
from __future__ import annotations

from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.schedule.intrinsics import (DOT4_DTYPES, ISA_LANES, TensorIntrin,
                                                     amx_name, target_isas)

from ..schedule_rule import analysis as A
from ..schedule_rule.base import ANN_TENSORIZE
from ..schedule_rule.multi_level_tiling_amx import AMX_FAMILY
from ..schedule_rule.multi_level_tiling_dot4 import DOT4_FAMILY
from .base import Postproc

MAX_VECTOR_LANES = 64


class RewriteTensorize(Postproc):
    """Tensorize annotated register tiles (TVM's ``RewriteTensorize``).

    Examples
    --------
    >>> RewriteTensorize().apply(sch)                   # doctest: +SKIP
    True
    """

    def apply(self, sch: Schedule) -> bool:
        isas = target_isas(self.context.target) if self.context else []
        self.reason = None
        for br in list(A.all_blocks(sch.func)):
            family = dict(br.block.annotations).get(ANN_TENSORIZE)
            if family is None or not A.is_reduction(br.block):
                continue  # (decompose_reduction copies the annotation to the init block)
            name = br.block.name
            try:
                if str(family) == AMX_FAMILY:
                    self._rewrite_amx(sch, name)
                else:
                    self._rewrite(sch, name, str(family), isas)
            except ScheduleError as err:
                self.reason = str(err)
                return False
        return True

    def _rewrite_amx(self, sch: Schedule, name: str) -> None:
        """The ``M x N x KT`` tile of ``MultiLevelTilingAMX`` (its three innermost loops)
        becomes one AMX block product (``amx_u8s8s32_{M}x{N}x{4 KT}``); the init and the
        write-back of the accumulators get their columns vectorized. A tile the intrinsic
        does not match rejects the schedule (its plain loops would be a slow scalar GEMM)."""
        info = A.find_block_info(sch.func, name)
        acc = info.block.writes[0].buffer
        m, n, kt = (A.const_extent(f) for f in info.loops[-3:])
        if None in (m, n, kt):
            raise ScheduleError("RewriteTensorize", f"block {name}: the AMX tile's loops have "
                                f"no constant extents", info.block)
        loops = sch.get_loops(sch.get_block(name))
        sch.tensorize(loops[-3], amx_name(m, n, 4 * kt))
        for br in list(A.all_blocks(sch.func)):
            b = br.block
            if b.name == name + "_init" or (b.name != name + "_o" and
                                            any(r.buffer is acc for r in b.reads)):
                _unroll_rows_vectorize_columns(sch, b.name)

    def _rewrite(self, sch: Schedule, name: str, family: str, isas: list[str]) -> None:
        info = A.find_block_info(sch.func, name)
        acc = info.block.writes[0].buffer
        blocks = [(name, "outer_product")]
        init = name + "_init"
        if any(br.block.name == init for br in A.all_blocks(sch.func)):
            blocks.append((init, "fill_zero"))
        for bname, kind in blocks:
            binfo = A.find_block_info(sch.func, bname)
            if len(binfo.loops) < 2:
                continue
            mr, nr = (A.const_extent(binfo.loops[-2]), A.const_extent(binfo.loops[-1]))
            done = False
            dtype = acc.dtype
            if family == DOT4_FAMILY and kind == "outer_product":
                # the 4-byte k step around L lanes: uint8 or int8 the broadcast operand
                done = mr == 4 and nr is not None and \
                    any(_try_tensorize(sch, bname, f"dot4_{order}_{nr}") for order in DOT4_DTYPES)
            if mr and nr and dtype == "float32" and family == "outer_product":
                for isa in isas:
                    if nr % ISA_LANES[isa]:
                        continue
                    intrin = f"{kind}_f32_{isa}_{mr}x{nr}"
                    TensorIntrin.get(intrin)
                    block = sch.get_block(bname)
                    loops = sch.get_loops(block)
                    try:
                        sch.tensorize(loops[-2], intrin)
                        done = True
                        break
                    except ScheduleError:
                        continue
            if not done:
                _unroll_rows_vectorize_columns(sch, bname)
        # the write-back of the accumulators (the cache block or a fused epilogue)
        for br in list(A.all_blocks(sch.func)):
            if br.block.name in (name, init):
                continue
            if any(r.buffer is acc for r in br.block.reads):
                _unroll_rows_vectorize_columns(sch, br.block.name)


def _try_tensorize(sch: Schedule, name: str, intrin: str) -> bool:
    """Tensorize the two innermost loops of block ``name`` with ``intrin``; False (nothing
    changed) where they do not match it."""
    loops = sch.get_loops(sch.get_block(name))
    try:
        sch.tensorize(loops[-2], intrin)
    except ScheduleError:
        return False
    return True


def _unroll_rows_vectorize_columns(sch: Schedule, name: str) -> None:
    info = A.find_block_info(sch.func, name)
    if len(info.loops) < 2:
        return
    rows, cols = info.loops[-2], info.loops[-1]
    if rows.kind != "serial" or cols.kind != "serial":
        return
    block = sch.get_block(name)
    loops = sch.get_loops(block)
    if A.const_extent(cols) is not None and A.const_extent(cols) <= MAX_VECTOR_LANES:
        try:
            sch.vectorize(loops[-1])
        except ScheduleError:
            pass
    if A.const_extent(rows) is not None and A.const_extent(rows) <= 16:
        sch.unroll(loops[-2])
