"""``DisallowDynamicLoop``: reject schedules with a symbolic extent where it cannot work.

Symbolic extents are welcome in serial and parallel loops (that is how one kernel serves every
batch size) and in ``blockIdx`` loops (the launch grid is computed from the shape). They are
rejected for ``threadIdx`` / ``vthread`` loops (a thread block has a fixed size), and for
vectorized and unrolled loops (the code generator would silently fall back to a scalar loop).
"""
from __future__ import annotations

from tilecraft.tensorir.schedule import Schedule, tree
from tilecraft.tensorir.stmt import For

from ..schedule_rule import analysis as A
from .base import Postproc


class DisallowDynamicLoop(Postproc):
    """Reject symbolic thread, vector and unroll extents (TVM's ``DisallowDynamicLoop``,
    relaxed for the symbolic loops this compiler supports).

    Examples
    --------
    >>> DisallowDynamicLoop().apply(sch)                # doctest: +SKIP
    True
    """

    def apply(self, sch: Schedule) -> bool:
        for node, _ in tree.walk(sch.func.body):
            if not isinstance(node, For) or A.const_extent(node) is not None:
                continue
            if node.kind in ("vectorized", "unrolled"):
                return False
            if node.kind == "thread_binding" and not node.thread_tag.startswith("blockIdx"):
                return False
        return True
