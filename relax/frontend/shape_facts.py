"""What a frontend knows about a model's symbolic dims, and what it checks when the model runs.

Shape inference sometimes cannot prove what a model needs. HF encoders slice a table of 256
positions with the sequence length and add the result to the embeddings: the slice has
``min(seq, 256)`` rows, the embeddings ``seq``, and the two are equal only when
``seq <= 256``. Refusing such a model would be wrong (it runs for every ``seq`` up to 256), and
so would be assuming the fact silently (a longer sequence would give a wrong answer).
``ShapeFacts`` does what PyTorch does with its guards:

- **facts** are conditions taken as true while importing: the range of a
  ``torch.export.Dim``, and every condition checked at run time. ``analyzer`` is a
  ``tensorir.arith.Analyzer`` that assumes them (``arith.assume``), so ``min(seq, 256)``
  simplifies to ``seq`` where ``seq <= 256`` is a fact. A frontend proves with it that a shape
  equals the one the model needs, and continues with that shape (``match_cast``): the module
  it makes then needs no fact to be consistent, ``relax.build`` re-infers every shape as it is;
- **checks** are ``relax.op.assert_op`` calls the function makes first, one per condition that
  could not be proved: ``seq = 300 exceeds 256, the most this model supports (...)``.
  ``require_equal(a, b)`` finds the conditions under which two dims are equal (the bounds that
  make each ``min`` / ``max`` in them pick one side) and checks those, so the message names the
  input dim and its limit rather than two expressions.

``attach(func)`` puts the checks in a block of their own at the start of the function (outside
the dataflow block, whose bindings must be free of side effects), before any kernel runs.

Examples
--------
>>> from tilecraft import tensorir
>>> seq = tensorir.var("seq")
>>> facts = ShapeFacts()
>>> facts.assume(seq >= 0)
>>> facts.require_equal(tensorir.expr.min_(seq, 256), seq, "the position table")
True
>>> [c.attr_dict["format"] for c in facts.checks]
['seq = {} exceeds 256, the most this model supports (the position table)']
>>> facts.can_prove_equal(tensorir.expr.min_(seq, 256), seq)
True
"""
from __future__ import annotations

import itertools
from typing import Sequence

from tilecraft.errors import TilecraftError
from tilecraft.tensorir import arith
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import (EQ, GE, LE, And, IntImm, Max, Min, Not, PrimExpr, Var,
                                     convert)
from tilecraft.tensorir.functor import post_order_visit

from ..expr import BindingBlock, Function, SeqExpr, Var as RelaxVar, VarBinding
from ..op.check import assert_op

__all__ = ["ShapeFacts", "ShapeFactError"]

_MAX_CASE_ATOMS = 6     # min / max terms whose sides are tried (2 ** 6 choices at most)


class ShapeFactError(TilecraftError, ValueError):
    """A condition the model needs can never hold for the inputs it accepts."""


def _vars_of(e: PrimExpr) -> list[Var]:
    found: list[Var] = []
    post_order_visit(e, lambda n: found.append(n) if isinstance(n, Var) and n not in found
                     else None)
    return found


def _is_const(e) -> bool:
    return isinstance(e, IntImm)


class ShapeFacts:
    """Facts assumed while importing, and the run-time checks that back them (see the module
    docstring)."""

    def __init__(self):
        self.facts: list[PrimExpr] = []
        self.checks: list = []            # relax.assert_op calls, in order
        self._ana: arith.Analyzer | None = None

    def assume(self, cond) -> None:
        """Take ``cond`` (a bool expression of symbolic dims) as true from now on."""
        cond = convert(cond)
        if isinstance(cond, IntImm):
            return
        self.facts.append(cond)
        self._ana = None

    @property
    def analyzer(self) -> arith.Analyzer:
        """An ``Analyzer`` that knows every fact."""
        if self._ana is None:
            with arith.assume(*self.facts):
                self._ana = arith.Analyzer()
        return self._ana

    def can_prove(self, cond) -> bool:
        return self.analyzer.can_prove(cond)

    def can_prove_equal(self, a, b) -> bool:
        a, b = convert(a), convert(b)
        if _is_const(a) and _is_const(b):
            return a.value == b.value
        return self.analyzer.can_prove_equal(a, b)

    # -- run-time checks ------------------------------------------------------------------------
    def require(self, cond, format: str, format_args: Sequence = ()) -> bool:
        """Check ``cond`` when the function runs, unless it is proved; then assume it.

        Returns whether a check was added. Raises ``ShapeFactError`` when ``cond`` can never
        hold (``format`` with the arguments shown as names says which).
        """
        cond = convert(cond)
        if not dt.is_bool(cond.dtype):
            raise TypeError(f"ShapeFacts.require needs a bool condition, got {cond!r}")
        if self.can_prove(cond):
            return False
        if self.can_prove(Not(cond)):
            names = [str(a) for a in format_args]
            raise ShapeFactError(f"the model needs {cond}, which never holds for the inputs it "
                                 f"accepts: {format.format(*names)}")
        self.checks.append(assert_op(cond, list(format_args), format))
        self.assume(cond)
        return True

    def require_condition(self, cond, where: str = "") -> bool:
        """``require`` with a message made from ``cond`` (``seq = 300 exceeds 256, the most
        this model supports (where)``)."""
        cond = convert(cond)
        suffix = f" ({_escape(where)})" if where else ""
        return self.require(cond, *_describe(cond, suffix))

    def require_equal(self, a, b, where: str = "") -> bool:
        """Make ``a == b`` a fact: proved, or checked at run time through the bounds that make
        it hold (``seq <= 256`` for ``min(seq, 256) == seq``). Returns whether a check was
        added."""
        a, b = convert(a), convert(b)
        if self.can_prove_equal(a, b):
            return False
        suffix = f" ({_escape(where)})" if where else ""
        conds = self._conditions_for_equal(a, b)
        if conds is None:
            names = _vars_of(EQ(a, b))
            shown = ", ".join(f"{v.name} = {{}}" for v in names)
            return self.require(EQ(a, b), f"the model needs {_escape(str(EQ(a, b)))}, but "
                                f"{shown}{suffix}", names)
        added = False
        for c in conds:
            added |= self.require(c, *_describe(c, suffix))
        return added

    def _conditions_for_equal(self, a: PrimExpr, b: PrimExpr) -> list | None:
        """Bounds under which ``a == b`` is provable, or None. Each ``min(x, y)`` / ``max(x, y)``
        in the dims is taken at one of its sides (``x <= y`` makes ``min(x, y)`` be ``x``):
        the symbolic side first (``min(seq, 256)`` as ``seq``), then the other; the first
        choice that proves the equality, with the conditions it does not need dropped."""
        atoms: list = []

        def visit(n):
            if isinstance(n, (Min, Max)) and all(str(n) != str(m) for m in atoms):
                atoms.append(n)
        post_order_visit(a, visit)
        post_order_visit(b, visit)
        if not atoms or len(atoms) > _MAX_CASE_ATOMS:
            return None
        sides = []
        for n in atoms:
            x, y = (n.b, n.a) if _is_const(n.a) and not _is_const(n.b) else (n.a, n.b)
            first, second = (LE(x, y), LE(y, x)) if isinstance(n, Min) else \
                (GE(x, y), GE(y, x))
            sides.append([h for h in (first, second) if not self.can_prove(Not(h))])
        for choice in itertools.product(*sides):
            hyps = [h for h in choice if not self.can_prove(h)]
            if not hyps or not self._provable_with(hyps, EQ(a, b)):
                continue
            for h in list(hyps):
                rest = [g for g in hyps if g is not h]
                if rest and self._provable_with(rest, EQ(a, b)):
                    hyps = rest
            return hyps
        return None

    def _provable_with(self, hyps: list, cond) -> bool:
        ana = self.analyzer
        cond_all = hyps[0]
        for h in hyps[1:]:
            cond_all = And(cond_all, h)
        with ana.with_constraint(cond_all):
            return ana.can_prove(cond)

    # -- the function -------------------------------------------------------------------------
    def attach(self, func: Function) -> Function:
        """``func`` with the checks as the first bindings of its body."""
        if not self.checks:
            return func
        block = BindingBlock([VarBinding(RelaxVar("check", c.struct_info), c)
                              for c in self.checks])
        body = func.body
        if isinstance(body, SeqExpr):
            body = SeqExpr((block,) + tuple(body.blocks), body.body)
        else:
            body = SeqExpr([block], body)
        return func.replace(body=body)


def _escape(text: str) -> str:
    """``text`` inside a ``str.format`` format (source lines may hold braces)."""
    return text.replace("{", "{{").replace("}", "}}")


def _describe(cond: PrimExpr, suffix: str) -> tuple[str, list]:
    """A message format for a failed ``cond`` and its arguments."""
    if isinstance(cond, (LE, GE)) and _is_const(cond.a) and isinstance(cond.b, Var):
        cond = (GE if isinstance(cond, LE) else LE)(cond.b, cond.a)     # 1 <= seq: seq >= 1
    if isinstance(cond, LE) and isinstance(cond.a, Var) and _is_const(cond.b):
        v = cond.a
        return (f"{v.name} = {{}} exceeds {cond.b.value}, the most this model supports{suffix}",
                [v])
    if isinstance(cond, GE) and isinstance(cond.a, Var) and _is_const(cond.b):
        v = cond.a
        return (f"{v.name} = {{}} is below {cond.b.value}, the least this model supports"
                f"{suffix}", [v])
    names = _vars_of(cond)
    shown = ", ".join(f"{v.name} = {{}}" for v in names)
    return f"the model needs {_escape(str(cond))}, but {shown}{suffix}", names
