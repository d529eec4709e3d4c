"""Helpers shared by the lowering passes: applying a pass to a module, small folds, var tests."""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterable

import numpy as np

from .. import dtype as dt
from ..expr import Cast, IntImm, PrimExpr, TIRError, Var, convert
from ..function import IRModule, PrimFunc
from ..functor import IRMutator, children, free_vars
from ..stmt import Buffer, Evaluate, Range, SeqStmt, Stmt
from ..arith.const_fold import fold_add, fold_mul  # noqa: F401  (used by the passes)
from ..arith.ramp import linear_coeff  # noqa: F401  (used by the passes)


def prim_func_pass(fn: Callable[[PrimFunc], PrimFunc]) -> Callable:
    """Make a ``PrimFunc -> PrimFunc`` function also accept an ``IRModule``.

    On a module the pass runs on every PrimFunc and leaves other functions (relax ones) alone.
    """

    @functools.wraps(fn)
    def wrapper(func_or_mod, *args, **kwargs):
        if isinstance(func_or_mod, IRModule):
            return IRModule({name: fn(f, *args, **kwargs) if isinstance(f, PrimFunc) else f
                             for name, f in func_or_mod.functions.items()})
        if isinstance(func_or_mod, PrimFunc):
            return fn(func_or_mod, *args, **kwargs)
        raise TIRError(f"{fn.__name__}: expected a PrimFunc or an IRModule, got "
                       f"{type(func_or_mod).__name__} {func_or_mod!r}", func_or_mod)

    return wrapper


class VarSubstituter(IRMutator):
    """``substitute`` as a reusable mutator, so that buffers rebuilt while substituting (a shape
    that mentions a substituted var) map to the same new buffer everywhere in one pass."""

    def __init__(self, vmap: dict):
        super().__init__()
        self.vmap = vmap

    def visit_Var(self, v):
        return self.vmap.get(v, v)


def subst(node, vmap: dict):
    """Substitute ``vmap`` (Var -> PrimExpr) in ``node``; the node itself when ``vmap`` is empty."""
    if not vmap:
        return node
    return VarSubstituter(vmap).visit(node)


def uses_any(node, variables: Iterable[Var]) -> bool:
    """True if ``node`` mentions one of ``variables``."""
    wanted = set(variables)
    if not wanted:
        return False
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Var):
            if n in wanted:
                return True
            continue
        stack.extend(children(n))
    return False


def expr_vars(node) -> set:
    """The free variables of ``node`` as a set."""
    return set(free_vars(node))


def no_op() -> Evaluate:
    """The statement that does nothing."""
    return Evaluate(IntImm(0, "int32"))


def is_no_op(s: Stmt | None) -> bool:
    return s is None or (isinstance(s, Evaluate) and isinstance(s.value, IntImm)) or \
        (isinstance(s, SeqStmt) and len(s.seq) == 0)


def to_int64(e) -> PrimExpr:
    """``e`` as an int64 expression (index arithmetic is int64 after lowering)."""
    e = convert(e)
    if e.dtype == "int64":
        return e
    if isinstance(e, IntImm):
        return IntImm(e.value, "int64")
    if not dt.is_integer(e.dtype):
        raise TIRError(f"index expression {e!r} has the non-integer dtype {e.dtype}", e)
    return Cast("int64", e)


def shape_vars_of(buffers: Iterable[Buffer], exclude: Iterable[Var] = ()) -> tuple:
    """Free Vars of the buffers' shapes and strides, in first-appearance order."""
    skip = set(exclude)
    out: dict = {}
    for buf in buffers:
        for e in tuple(buf.shape) + tuple(buf.strides or ()):
            for v in free_vars(e):
                if v not in skip:
                    out.setdefault(v, None)
    return tuple(out)


def func_shape_vars(func: PrimFunc) -> tuple:
    """The symbolic dims of a function: from ``arg_buffers`` when lowered, else its buffer map."""
    attrs = func.attr_dict
    if "shape_vars" in attrs:
        return tuple(attrs["shape_vars"])
    buffers = attrs.get("arg_buffers", func.buffers)
    return shape_vars_of(buffers, exclude=func.scalar_params)


def affine_coeffs(e: PrimExpr, variables):
    """``e == sum(c[v] * v) + rest`` with integer coefficients and ``rest`` free of
    ``variables``: ``({v: c} for c != 0, rest)``, or None."""
    coeffs = {}
    rest = e
    for v in variables:
        r = linear_coeff(rest, v)
        if r is None:
            return None
        c, rest = r
        if c:
            coeffs[v] = c
    return coeffs, rest


@contextlib.contextmanager
def scoped_bind(analyzer, var: Var, rng: Range):
    """Bind ``var`` to ``rng`` in ``analyzer`` for the duration of the context.

    ``Analyzer.bind`` is permanent, and a symbolic range leaves facts behind: ``i in [0, n)``
    gives ``n - 1 - i >= 0``, which with ``i >= 0`` proves ``n >= 1`` even after the loop,
    where ``n`` may be 0. On exit ``var`` is re-bound to (practically) every value of its
    dtype, which drops those facts.
    """
    analyzer.bind(var, rng)
    try:
        yield
    finally:
        info = np.iinfo(dt.to_numpy(var.dtype)) if dt.is_integer(var.dtype) else np.iinfo("int64")
        lo = int(info.min) // 2
        analyzer.bind(var, Range(IntImm(lo, var.dtype), IntImm(int(info.max) // 2 - lo,
                                                               var.dtype)))
