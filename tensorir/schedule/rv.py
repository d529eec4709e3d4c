"""Random variables that stand for blocks, loops and sampled integers, the ``traced``
decorator that records primitive calls in the trace, and the ``Instruction`` it records.

An ``Instruction`` is ``(kind, inputs, attrs, outputs, decision)``. Inputs and outputs refer to
random variables by name (``"b0"``, ``"l3"``, ``"v5"``); attrs are plain JSON values; a sampling
instruction's ``decision`` is what it drew.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any


@dataclass
class Instruction:
    kind: str
    inputs: list            # RV names (str starting with "$"), literals, nested lists
    attrs: dict
    outputs: list[str]      # RV names
    decision: Any = None

    def to_json(self) -> list:
        return [self.kind, self.inputs, self.attrs, self.outputs, self.decision]

    @staticmethod
    def from_json(data) -> "Instruction":
        if not isinstance(data, (list, tuple)) or len(data) != 5:
            raise ValueError(f"a trace instruction is [kind, inputs, attrs, outputs, decision], "
                             f"got {data!r}")
        kind, inputs, attrs, outputs, decision = data
        if not isinstance(kind, str) or not isinstance(outputs, list) or not isinstance(attrs, dict):
            raise ValueError(f"malformed trace instruction {data!r}")
        return Instruction(kind, list(inputs), dict(attrs), list(outputs), decision)


class _RV:
    __slots__ = ("name",)
    prefix = "?"

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"{type(self).__name__}({self.name})"


class BlockRV(_RV):
    """Stands for a block of the scheduled function."""
    __slots__ = ()
    prefix = "b"


class LoopRV(_RV):
    """Stands for a loop of the scheduled function."""
    __slots__ = ()
    prefix = "l"


class ExprRV(_RV):
    """Stands for a sampled integer (a tile size, an unroll depth, a location index)."""
    __slots__ = ()
    prefix = "v"


def traced(method):
    """Record a call of a public primitive in the trace (outermost call only).

    Every positional/keyword parameter except ``decision`` becomes an input; the returned RVs
    become outputs; a sampling primitive stores what it drew in ``self._decision``.
    """
    sig = inspect.signature(method)
    names = [p for p in sig.parameters if p not in ("self", "decision")]

    @functools.wraps(method)
    def wrapper(self: "Schedule", *args, **kwargs):
        if self._depth > 0:
            return method(self, *args, **kwargs)
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        inputs = [self._encode(bound.arguments[n], method.__name__) for n in names]
        self._depth += 1
        self._decision = None
        try:
            result = method(self, *args, **kwargs)
        finally:
            self._depth -= 1
        if isinstance(result, _RV):
            outputs, ret = [result.name], "single"
        elif isinstance(result, (list, tuple)) and all(isinstance(r, _RV) for r in result):
            outputs, ret = [r.name for r in result], "list"
        else:
            outputs, ret = [], "none"
        self.trace.instructions.append(
            Instruction(method.__name__, inputs, {"ret": ret}, outputs, self._decision))
        return result

    wrapper.traced = True
    return wrapper


