"""Errors of the tuner."""
from __future__ import annotations

from tilecraft.errors import TilecraftError

__all__ = ["TuneError"]


class TuneError(TilecraftError, RuntimeError):
    """A tuning request the tuner cannot serve.

    Raised for a target the schedule rules do not support, a function the search cannot tune,
    an unreachable builder / runner, and similar problems. The message names the offending
    target, function or component.

    Examples
    --------
    >>> from tilecraft.metaschedule import TuneError
    >>> raise TuneError("no schedule rules for target kind 'cuda'")
    Traceback (most recent call last):
    ...
    metaschedule.errors.TuneError: no schedule rules for target kind 'cuda'
    """
