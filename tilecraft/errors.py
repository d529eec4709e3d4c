"""The root of tilecraft's exceptions.

Every exception class of the five packages (tensorir, targets, rpc, metaschedule, relax) derives
from ``TilecraftError``, and keeps the standard base it had (``ValueError``, ``TypeError``,
``RuntimeError``...), so ``except ValueError`` still catches a ``ScheduleError`` and
``except tilecraft.TilecraftError`` catches anything tilecraft raises on purpose::

    class TargetError(TilecraftError, ValueError): ...

This module needs only the standard library: every layer imports it, the board side included.

Examples
--------
>>> import tilecraft
>>> from tilecraft.targets import Target
>>> try:
...     Target("no-such-kind")
... except tilecraft.TilecraftError as err:
...     print(type(err).__name__, isinstance(err, ValueError))
TargetError True
"""

__all__ = ["TilecraftError"]


class TilecraftError(Exception):
    """Base of every exception tilecraft defines."""
