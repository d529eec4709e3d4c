"""``AutoInline``: inline cheap elementwise blocks into their consumers (or producers).

Inlining removes an intermediate buffer and a pass over memory. The rule inlines a block
into its consumers when it is spatial (injective), is not an output, contains none of the
``disallow_op`` intrinsics (on CPUs ``exp``: recomputing an exponential at every use costs more
than the buffer) and, with ``disallow_if_then_else``, no ``if_then_else`` / ``Select`` (padding
stays a block, for ``RandomComputeLocation`` to place). With ``into_producer`` it also tries
``reverse_compute_inline`` of a block into the block that produces its input (the GPU default:
an epilogue folds into an elementwise producer).
"""
from __future__ import annotations

from tilecraft.tensorir.schedule import BlockRV, Schedule, ScheduleError

from . import analysis as A
from .base import ScheduleRule


class AutoInline(ScheduleRule):
    """Inline elementwise blocks (TVM's ``AutoInline``).

    Parameters
    ----------
    into_producer : bool
        Also try ``reverse_compute_inline`` (a block into its producer).
    into_consumer : bool
        Try ``compute_inline`` (a block into its consumers).
    disallow_if_then_else : bool
        Keep blocks with conditionals (padding).
    require_injective : bool
        Only inline spatial blocks.
    disallow_op : tuple of str
        Intrinsics (``"exp"``) whose blocks are kept.

    Examples
    --------
    >>> rule = AutoInline(into_producer=False, disallow_op=("exp",))
    """

    def __init__(self, into_producer: bool = False, into_consumer: bool = True,
                 disallow_if_then_else: bool = True, require_injective: bool = True,
                 disallow_op: tuple = ("exp",)):
        self.into_producer = into_producer
        self.into_consumer = into_consumer
        self.disallow_if_then_else = disallow_if_then_else
        self.require_injective = require_injective
        self.disallow_op = tuple(disallow_op)

    def apply(self, sch: Schedule, block: BlockRV) -> list[Schedule]:
        info = A.block_info(sch, block)
        b = info.block
        if A.is_root(info) or not A.is_subroot(info) or b.annotations:
            return [sch]
        if self.require_injective and not A.is_spatial(b):
            return [sch]
        if self.disallow_op and A.contains_op(b, self.disallow_op):
            return [sch]
        if self.disallow_if_then_else and A.has_if_then_else(b):
            return [sch]
        if self.into_consumer and not A.is_output_block(sch.func, b) and A.consumers_of(sch, info):
            if _try(sch, lambda: sch.compute_inline(block)):
                return [sch]
        if self.into_producer and A.is_spatial(b):
            if _try(sch, lambda: sch.reverse_compute_inline(block)):
                return [sch]
        return [sch]

    def __repr__(self):
        return (f"AutoInline(into_producer={self.into_producer}, into_consumer="
                f"{self.into_consumer}, disallow_op={self.disallow_op})")


def _try(sch: Schedule, fn) -> bool:
    """Run a primitive; False (schedule and trace unchanged) if it is illegal."""
    n = len(sch.trace.instructions)
    try:
        fn()
        return True
    except ScheduleError:
        del sch.trace.instructions[n:]
        return False
