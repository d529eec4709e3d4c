"""``Postproc``: verify and finish a schedule sampled from a design space.

A design space leaves some decisions to the end, when every tile size is known: which loops run
in parallel, which are vectorized or unrolled (``RewriteParallelVectorizeUnroll``), where a
reduction's init goes (``RewriteReductionBlock``), the layout of packed operands
(``RewritePackedLayout``), the tensor intrinsic of a register tile (``RewriteTensorize``), how
threads share a shared-memory copy (``RewriteCooperativeFetch``). Others only check
(``VerifyGPUCode``, ``DisallowDynamicLoop``). ``apply`` returns False to reject the schedule.

Postprocessors run after ``sch.enter_postproc()``: what they do is recorded in the trace after
that mark, so a stored trace replays to the finished program, and a tuner that mutates a trace
cuts it at the mark (``trace.without_postproc()``) and runs them again.
"""
from __future__ import annotations

from tilecraft.tensorir.schedule import Schedule

from ..schedule_rule.base import SpaceContext


class Postproc:
    """A postprocessor: ``apply(sch) -> bool`` (False rejects the schedule).

    Examples
    --------
    >>> class AcceptAll(Postproc):
    ...     def apply(self, sch):
    ...         return True
    """

    context: SpaceContext | None = None

    def __getstate__(self):
        # the context holds the task's function (IR does not pickle); initialize() sets it again
        state = dict(self.__dict__)
        state.pop("context", None)
        return state

    def initialize(self, context: SpaceContext) -> None:
        self.context = context

    @property
    def shape_hints(self) -> dict:
        return dict(self.context.shape_hints) if self.context else {}

    def apply(self, sch: Schedule) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
