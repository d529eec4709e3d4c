"""``ScheduleRule`` (what a design space is made of) and ``SpaceContext`` (what rules,
postprocessors and mutators know about the tuning task: target, shape hints, function).

A rule looks at one block of a schedule and returns the schedules it makes of it: ``[sch]``
unchanged when it does not apply, one transformed schedule, or several (branches of the design
space). Every random choice goes through a sampling primitive (``sample_tile``,
``sample_categorical``, ``sample_compute_location``), so the schedule's trace *is* the design
space: replaying it with its decisions dropped draws another point of the space.

Annotation keys the rules leave for the postprocessors are the ``ANN_*`` constants below.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.schedule import BlockRV, Schedule

# block annotation: the block was tiled by a MultiLevelTiling rule (value: the structure)
ANN_TILED = "meta_schedule.tiling_structure"
# root-block annotations of ParallelVectorizeUnroll, read by RewriteParallelVectorizeUnroll
ANN_PARALLEL = "meta_schedule.parallel"
ANN_VECTORIZE = "meta_schedule.vectorize"
ANN_UNROLL = "meta_schedule.unroll_explicit"
# a cache_read block to re-lay out as panels (value: [consumer block name, buffer dim])
ANN_PACK = "meta_schedule.pack"
# a block whose register tile is a tensor intrinsic (value: the intrinsic family)
ANN_TENSORIZE = "meta_schedule.auto_tensorize"
# a loop of a shared-memory cache block to spread over the threads (value: vector length)
ANN_COOPERATIVE_FETCH = "meta_schedule.cooperative_fetch"
# a shared-memory cache block's layout (value: an index into SHARED_LAYOUTS), applied by
# RewriteCooperativeFetch
ANN_SHARED_LAYOUT = "meta_schedule.shared_layout"
# the layouts a 2-D shared tile may take: as the operand, transposed, and each with its rows
# padded by 4 words (bank conflicts of column-wise access; 4 keeps 16-byte vector alignment);
# "permuted": columns interleaved by the consumer threads' width w, X[r, c % w, c // w] (the
# hand WebGPU GEMM's B tile: the threads of a warp read consecutive words)
SHARED_LAYOUTS = ("row", "transposed", "row_padded", "transposed_padded", "permuted")

GPU_KINDS = ("opencl", "webgpu")
CPU_KINDS = ("llvm",)


@dataclass
class SpaceContext:
    """What the design-space components know about the task.

    Attributes
    ----------
    target : targets.Target
    shape_hints : dict[str, int]
        Representative values of the symbolic shape variables (``{"n": 64}``).
    func : PrimFunc | None
        The unscheduled function (mutators replay traces on it).
    """

    target: object
    shape_hints: dict = field(default_factory=dict)
    func: PrimFunc | None = None

    @property
    def is_gpu(self) -> bool:
        return self.target.kind in GPU_KINDS

    @property
    def num_cores(self) -> int:
        """Cores a parallel loop spreads over (the target's, or this machine's for the host)."""
        n = self.target.num_cores
        if n:
            return int(n)
        return max(1, os.cpu_count() or 1) if self.target.is_host else 4

    def lanes(self, dtype: str = "float32") -> int:
        """Vector lanes of ``dtype`` in one vector register of the target."""
        bits = 32
        for prefix in ("float", "int", "uint", "bfloat"):
            if dtype.startswith(prefix) and dtype[len(prefix):].isdigit():
                bits = int(dtype[len(prefix):])
        return max(1, int(self.target.vector_width) // max(bits, 8))


class ScheduleRule:
    """A rule of the design space, applied to each block of a function in turn.

    Subclasses implement ``apply``; ``initialize`` gives them the task's context before a
    space is generated (``self.context``).

    Examples
    --------
    >>> class Noop(ScheduleRule):
    ...     def apply(self, sch, block):
    ...         return [sch]
    """

    context: SpaceContext | None = None
    seeded: int = 0   # a seed variant counts the blocks it fixed (``SpaceGenerator.seeds``)

    def __getstate__(self):
        # the context holds the task's function (IR does not pickle); initialize() sets it again
        state = dict(self.__dict__)
        state.pop("context", None)
        return state

    def initialize(self, context: SpaceContext) -> None:
        """Called by ``SpaceGenerator.generate`` before the rule is applied."""
        self.context = context

    def apply(self, sch: Schedule, block: BlockRV) -> list[Schedule]:
        """The schedules this rule makes of ``block`` in ``sch`` (``[sch]`` if it does not
        apply). ``sch`` may be modified in place when one schedule is returned; branches are
        ``sch.copy()``s."""
        raise NotImplementedError

    def seed_variants(self) -> list["ScheduleRule"]:
        """Copies of this rule that make known-good points of its space (their decisions
        fixed instead of drawn), for ``SpaceGenerator.seeds``: the search measures those
        points first and evolves from them. ``[]`` (the default): the rule has none, and
        seeds use the rule as it is. Called after ``initialize``.

        Examples
        --------
        >>> ParallelVectorizeUnroll().seed_variants()[0].seed_unroll    # doctest: +SKIP
        0
        """
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
