"""Random variables that stand for blocks, loops and sampled integers, and the ``traced``
decorator that records primitive calls in the trace."""
from __future__ import annotations

import functools
import inspect

from .trace import Instruction


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


