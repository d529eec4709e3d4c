"""``AutoBind`` (GPU): give every block that no other rule put on the GPU's threads a thread
per iteration of its outer spatial loops: fused, split by a sampled thread count, bound to
``blockIdx.x`` and ``threadIdx.x``."""
from __future__ import annotations

from tilecraft.tensorir.schedule import BlockRV, Schedule, ScheduleError

from . import analysis as A
from .base import ScheduleRule

MAX_GRID = 65535          # WebGPU's workgroups per dimension (OpenCL takes more)


class AutoBind(ScheduleRule):
    """Bind unbound blocks to GPU threads (TVM's ``AutoBind``).

    Parameters
    ----------
    max_threadblocks : int
        Kept for TVM's signature; the grid is only capped at the target's limit.
    thread_extents : tuple of int
        Threads per block to sample from (those above the target's limit are dropped).

    Examples
    --------
    >>> rule = AutoBind(256, (32, 64, 128, 256))
    """

    def __init__(self, max_threadblocks: int = 256, thread_extents=(32, 64, 128, 256, 512, 1024)):
        self.max_threadblocks = int(max_threadblocks)
        self.thread_extents = tuple(int(t) for t in thread_extents)

    def __repr__(self):
        return f"AutoBind(thread_extents={self.thread_extents})"

    def apply(self, sch: Schedule, block: BlockRV) -> list[Schedule]:
        info = A.block_info(sch, block)
        if A.is_root(info) or not A.is_subroot(info) or A.is_thread_bound(info):
            return [sch]
        max_threads = self.context.target.max_threads_per_block if self.context else 256
        extents = [t for t in self.thread_extents if t <= max_threads] or [max_threads]
        n = len(sch.trace.instructions)
        try:
            bind_block(sch, block, extents, self.context.shape_hints if self.context else {},
                       sample=True)
        except ScheduleError:
            del sch.trace.instructions[n:]
        return [sch]


def bind_block(sch: Schedule, block: BlockRV, extents: list[int], hints: dict,
               sample: bool) -> None:
    """Fuse the outer spatial loops of ``block``, split them by a thread count (sampled from
    ``extents`` or, without ``sample``, the largest of them that the loop fills) and bind
    ``blockIdx.x`` / ``threadIdx.x``; a block with no spatial loop gets unit loops."""
    info = A.block_info(sch, block)
    kinds = A.loop_iter_kinds(info)
    loops = sch.get_loops(block)
    spatial = []
    for rv, kind, f in zip(loops, kinds, info.loops):
        if kind != "S" or f.kind != "serial" or f.annotations:
            break
        spatial.append(rv)
    if not spatial:
        u = sch.add_unit_loop(block)
        sch.bind(u, "blockIdx.x")
        t = sch.add_unit_loop(block)
        sch.bind(t, "threadIdx.x")
        return
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    ext = A.extent_value(sch.get(fused), hints)
    if sample:
        t = sch.sample_categorical(extents, [1.0 / len(extents)] * len(extents))
        tval = sch.get(t)
    else:
        fit = [e for e in extents if ext is None or e <= ext]
        tval = t = max(fit) if fit else min(extents)
    grid = None if ext is None else -(-ext // tval)
    if grid is not None and grid > MAX_GRID:
        bx, _, tx = sch.split(fused, [MAX_GRID, None, t])
    else:
        bx, tx = sch.split(fused, [None, t])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
