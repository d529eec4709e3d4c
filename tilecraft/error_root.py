"""The root of every exception tilecraft defines: ``TilecraftError``.

Its public home is ``tilecraft.TilecraftError`` (also ``tilecraft.errors.TilecraftError``); it
lives in this module of its own, which imports nothing, because both ``tilecraft.optional``
(whose ``MissingDependencyError`` derives from it) and ``tilecraft.errors`` (whose ``require``
uses ``tilecraft.optional``) sit on top of it.

Examples
--------
>>> from tilecraft import TilecraftError
>>> class ShapeMismatch(TilecraftError, ValueError): ...
>>> isinstance(ShapeMismatch("x"), ValueError)
True
"""
from __future__ import annotations

__all__ = ["TilecraftError"]


class TilecraftError(Exception):
    """Base of every exception tilecraft defines.

    Each class keeps the standard base it would have alone (``ValueError``, ``RuntimeError``...)
    as a second base, so ``except ValueError`` and ``except tilecraft.TilecraftError`` both
    catch it: ``class TargetError(TilecraftError, ValueError)``.
    """
