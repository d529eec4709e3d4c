"""The error every illegal schedule request raises."""
from __future__ import annotations

from ..expr import TIRError


class ScheduleError(TIRError):
    """An illegal schedule request.

    The message names the primitive, the block or loop, and the rule broken; ``.primitive`` and
    ``.node`` carry the first two. The schedule is unchanged after the error.
    """

    def __init__(self, primitive: str, message: str, node=None):
        super().__init__(f"{primitive}: {message}", node)
        self.primitive = primitive
