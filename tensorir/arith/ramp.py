"""How an index moves across the lanes of a vectorized loop: the analysis every code generator's
vector loads and stores rest on.

In a ``vectorized`` loop over ``v``, lane ``k`` runs the body with ``v = min + k``. An access
``buf[index]`` is then

* a *broadcast* when ``index`` does not change from lane to lane (stride 0): one scalar access;
* a *ramp* when it moves by one element per lane (stride 1): one contiguous vector access at
  ``base = index - v`` (``ramp_base``), aligned to the vector when ``base`` is a provable
  multiple of the lanes (``is_aligned``);
* strided (another constant stride) or irregular (None) otherwise: lane by lane, a strided load,
  or a gather, as the target allows.

``lane_stride`` is the general question (the LLVM back end asks it of every index);
``ramp_base`` the one the C-style generators ask before a ``vloadN`` / ``vec4`` access;
``lane_index`` is lane ``k``'s scalar index (for accesses done lane by lane).

Examples
--------
>>> from tilecraft.tensorir import var
>>> i, v = var("i"), var("v")
>>> lane_stride(i * 8 + v * 2, v), lane_stride(i * 8, v), lane_stride(i * v, v)
(2, 0, None)
>>> ramp_base(i * 8 + v, v)
i * 8
"""
from __future__ import annotations

from .. import dtype as dt
from ..expr import EQ, Add, FloorMod, IntImm, Mul, PrimExpr, Sub, Var
from ..functor import IRFunctor, children, substitute
from .analyzer import Analyzer
from .const_fold import fold_add, fold_mul


def linear_coeff(e: PrimExpr, v: Var):
    """``e == c * v + rest`` with an integer ``c`` and ``rest`` free of ``v``: ``(c, rest)``,
    or None when ``e`` is not of that form (``v`` under a division, times a symbol, ...)."""
    if not _mentions(e, v):
        return 0, e
    if e is v:
        return 1, IntImm(0, v.dtype)
    if isinstance(e, (Add, Sub)):
        a, b = linear_coeff(e.a, v), linear_coeff(e.b, v)
        if a is None or b is None:
            return None
        if isinstance(e, Add):
            return a[0] + b[0], fold_add(a[1], b[1])
        return a[0] - b[0], a[1] - b[1]
    if isinstance(e, Mul):
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(y, IntImm):
                lx = linear_coeff(x, v)
                if lx is None:
                    return None
                return lx[0] * y.value, fold_mul(lx[1], y)
    return None


def ramp_base(index: PrimExpr, v: Var) -> PrimExpr | None:
    """``index == base + v`` with ``base`` free of ``v`` (a contiguous access across the lanes of
    a loop over ``v``): ``base``; else None."""
    r = linear_coeff(index, v)
    if r is None or r[0] != 1:
        return None
    return r[1]


def lane_stride(e: PrimExpr, v: Var, lets: dict | None = None) -> int | None:
    """How ``e`` changes from one lane of a vectorized loop over ``v`` to the next: 0 (the same
    in every lane), a constant, or None (not affine in ``v`` with a constant coefficient).

    ``lets`` maps let-bound variables of the loop body to their values (a variable bound to a
    lane-varying value varies with it); the ``Let`` expressions inside ``e`` whose value varies
    across the lanes are added to it.
    """
    return _LaneStride(v, {} if lets is None else lets).visit(e)


def lane_index(index: PrimExpr, v: Var, value: PrimExpr, analyzer: Analyzer) -> PrimExpr:
    """``index`` at the lane where ``v == value``, simplified under ``analyzer``'s facts."""
    return analyzer.simplify(substitute(index, {v: value}))


def is_aligned(base: PrimExpr, lanes: int, analyzer: Analyzer) -> bool:
    """Whether ``base`` is a provable multiple of ``lanes`` (a vector access at ``base`` of a
    vector-aligned array is then aligned)."""
    return analyzer.can_prove(EQ(FloorMod(base, IntImm(lanes, base.dtype)),
                                 IntImm(0, base.dtype)))


class _LaneStride(IRFunctor):
    def __init__(self, v: Var, lets: dict):
        self.v = v
        self.lets = lets

    def visit_Var(self, e):
        if e is self.v:
            return 1
        if e in self.lets:
            return self.visit(self.lets[e])
        return 0

    def visit_IntImm(self, e):
        return 0

    visit_FloatImm = visit_StringImm = visit_IntImm

    def visit_Add(self, e):
        sa, sb = self.visit(e.a), self.visit(e.b)
        if sa is None or sb is None:
            return None
        return sa + sb if isinstance(e, Add) else sa - sb

    visit_Sub = visit_Add

    def visit_Mul(self, e):
        sa, sb = self.visit(e.a), self.visit(e.b)
        if sa == 0 and sb == 0:
            return 0
        if sa == 0 and isinstance(e.a, IntImm) and sb is not None:
            return e.a.value * sb
        if sb == 0 and isinstance(e.b, IntImm) and sa is not None:
            return e.b.value * sa
        return None

    def visit_Cast(self, e):
        sv = self.visit(e.value)
        if sv == 0:
            return 0
        # a widening integer cast keeps the steps; a narrowing one may wrap between lanes
        if dt.is_integer(e.dtype) and dt.is_integer(e.value.dtype) and \
                dt.bits(e.dtype) >= dt.bits(e.value.dtype):
            return sv
        return None

    def visit_Let(self, e):
        if self.visit(e.value) != 0:
            self.lets[e.var] = e.value
        return self.visit(e.body)

    def visit_BufferLoad(self, e):
        return 0 if all(self.visit(i) == 0 for i in e.indices) else None

    def visit_default(self, e):
        # any other expression is lane-invariant exactly when all its operands are
        subs = [c for c in children(e) if isinstance(c, PrimExpr)]
        return 0 if all(self.visit(x) == 0 for x in subs) else None


def _mentions(e, v: Var) -> bool:
    stack = [e]
    while stack:
        n = stack.pop()
        if n is v:
            return True
        if not isinstance(n, Var):
            stack.extend(children(n))
    return False


__all__ = ["linear_coeff", "ramp_base", "lane_stride", "lane_index", "is_aligned"]
