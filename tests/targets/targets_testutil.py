"""Helpers for the targets tests: loop-kind rewriting, hand-built lowered functions, lowering."""
from __future__ import annotations

from capabilities import needs_lld  # noqa: F401  (the targets tests' mark)
from tilecraft.tensorir import IRMutator, PrimFunc, Var
from tilecraft.tensorir.stmt import Buffer


class SetLoopKinds(IRMutator):
    """Change the kind of loops by loop-variable name (no Schedule needed)."""

    def __init__(self, kinds: dict):
        super().__init__()
        self.kinds = kinds

    def visit_For(self, s):
        new = self.generic_visit(s)
        kind = self.kinds.get(s.loop_var.name)
        return new.replace(kind=kind) if kind else new


def with_loop_kinds(func, **kinds):
    """``with_loop_kinds(lowered, i="parallel", j="vectorized")``."""
    return SetLoopKinds(kinds).visit(func)


def lowered_func(buffers: list[Buffer], body, scalars=(), flat=None) -> PrimFunc:
    """A PrimFunc already in lowered form: ``buffers`` are the original (multi-dim) argument
    buffers; ``flat`` maps each to the 1-D buffer the body uses (default: the buffer itself)."""
    flat = flat or {}
    params, bmap = [], {}
    for b in buffers:
        h = Var(b.name + "_handle", "handle")
        params.append(h)
        bmap[h] = flat.get(b, b)
    params.extend(scalars)
    shape_vars = []
    for b in buffers:
        for d in b.shape:
            if isinstance(d, Var) and not any(d is v for v in shape_vars):
                shape_vars.append(d)
    return PrimFunc(params, body, bmap, {"arg_buffers": tuple(buffers),
                                         "shape_vars": tuple(shape_vars),
                                         "global_symbol": "main"})


def lower(func):
    from tilecraft.tensorir import transform
    return transform.lower(func)


def run_sub(code: str, timeout: int = 120):
    """Run Python ``code`` in a fresh interpreter with the repository on its path."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=timeout)
