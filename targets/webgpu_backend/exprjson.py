"""Integer expressions of shape variables as JSON, and their evaluation.

Launch geometry (workgroup counts), workspace sizes and host-side checks of a WebGPU module are
expressions of the function's shape variables and scalar parameters. They are kept as small JSON
trees so an exported module (``export_library``) can be run by anything that reads JSON — the
runtime here, or the browser loader in ``docs/webgpu_browser`` — without tensorir::

    ["add", ["var", "n"], 1]        # n + 1
    ["floordiv", ["var", "n"], 64]  # n // 64

Nodes: an int, ``["var", name]``, ``[op, a, b]`` for op in add sub mul floordiv floormod div mod
min max eq ne lt le gt ge and or, ``["not", a]``, ``["select", c, t, f]``.
"""
from __future__ import annotations

from typing import Any, Mapping

from tilecraft.errors import TilecraftError
from tilecraft.tensorir import expr as E

_BINARY = {E.Add: "add", E.Sub: "sub", E.Mul: "mul", E.FloorDiv: "floordiv",
           E.FloorMod: "floormod", E.Div: "div", E.Mod: "mod", E.Min: "min", E.Max: "max",
           E.EQ: "eq", E.NE: "ne", E.LT: "lt", E.LE: "le", E.GT: "gt", E.GE: "ge",
           E.And: "and", E.Or: "or"}


class ExprJSONError(TilecraftError, ValueError):
    """An expression that cannot be evaluated on the host (a load, a float, an unknown var)."""


def to_json(e: Any) -> Any:
    """A tensorir integer expression as a JSON tree."""
    if isinstance(e, int):
        return int(e)
    if isinstance(e, E.IntImm):
        return int(e.value)
    if isinstance(e, E.Var):
        return ["var", e.name]
    if isinstance(e, E.Cast):
        return to_json(e.value)
    op = _BINARY.get(type(e))
    if op is not None:
        return [op, to_json(e.a), to_json(e.b)]
    if isinstance(e, E.Not):
        return ["not", to_json(e.a)]
    if isinstance(e, E.Select):
        return ["select", to_json(e.condition), to_json(e.true_value), to_json(e.false_value)]
    if isinstance(e, E.Call) and e.op == "if_then_else":
        return ["select", *(to_json(a) for a in e.args)]
    raise ExprJSONError(f"cannot evaluate {e!r} on the host: only integer arithmetic of shape "
                        f"variables and scalar parameters can")


def _floordiv(a: int, b: int) -> int:
    return a // b if b != 0 else 0


def _truncdiv(a: int, b: int) -> int:
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


_OPS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": _floordiv, "floormod": lambda a, b: a - _floordiv(a, b) * b if b else 0,
    "div": _truncdiv, "mod": lambda a, b: a - _truncdiv(a, b) * b if b else 0,
    "min": min, "max": max,
    "eq": lambda a, b: int(a == b), "ne": lambda a, b: int(a != b), "lt": lambda a, b: int(a < b),
    "le": lambda a, b: int(a <= b), "gt": lambda a, b: int(a > b), "ge": lambda a, b: int(a >= b),
    "and": lambda a, b: int(bool(a) and bool(b)), "or": lambda a, b: int(bool(a) or bool(b)),
}


def evaluate(tree: Any, env: Mapping[str, int]) -> int:
    """The value of a JSON expression tree given the variables' values."""
    if isinstance(tree, bool):
        return int(tree)
    if isinstance(tree, int):
        return tree
    if isinstance(tree, float):
        return tree  # scalar float params may appear in host checks
    head = tree[0]
    if head == "var":
        try:
            return env[tree[1]]
        except KeyError:
            raise ExprJSONError(f"no value for variable {tree[1]!r}") from None
    if head == "not":
        return int(not evaluate(tree[1], env))
    if head == "select":
        return evaluate(tree[2], env) if evaluate(tree[1], env) else evaluate(tree[3], env)
    fn = _OPS.get(head)
    if fn is None:
        raise ExprJSONError(f"unknown expression node {head!r}")
    return fn(evaluate(tree[1], env), evaluate(tree[2], env))
