"""``VerifyMemoryAccess``: prove every buffer access in bounds, reject the provably wrong ones,
and check the undecidable ones at run time.

For each ``BufferLoad`` / ``BufferStore`` and each dimension ``d`` with index ``idx`` and extent
``n`` the verifier works in the access's context: the ranges of the enclosing loops, block iter
vars replaced by their iter values, and the conditions that guard the access (enclosing
``IfThenElse`` branches, block predicates, a reduction init's "reduce vars at their min",
``if_then_else`` / ``Select`` branches). Then

* ``0 <= idx < n`` provable: nothing to do;
* some iteration *certainly* goes out of bounds: ``OutOfBoundsError``. "Certainly" means the
  verifier found a concrete iteration (each enclosing loop at its first or last value, every
  loop provably non-empty, no guard in the way) where ``idx >= n`` or ``idx < 0`` is provable;
* otherwise (e.g. symbolic dims that may disagree): an ``AssertStmt`` checking the access at
  run time, hoisted out of the loops over which the index is affine (the check then covers the
  loop's extreme values, and holds trivially when the loop is empty) or over which the check,
  simplified with the loop ranges known, does not depend on the loop variable (a clamped index
  ``max(min(i - 2, n - 1), 0) < n`` needs only ``0 < n``).

A ``Select`` whose condition was needed to keep a load of one of its branches in bounds is
turned into ``if_then_else``, which evaluates only the branch taken, so the guarded load is
really guarded in generated code (a ``Select`` evaluates both sides).
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field

from ..expr import AMX_U8I8, BufferLoad, Call, IntImm, Let, Not, Or, PrimExpr, Select, TIRError
from ..function import PrimFunc
from ..functor import IRMutator
from ..stmt import (Allocate, AssertStmt, Block, BlockRealize, BufferStore, Evaluate, For,
                    IfThenElse, LetStmt, Range, SeqStmt, Stmt, is_true, seq)
from ..structural import structural_equal
from ._common import (expr_vars, linear_coeff, prim_func_pass, scoped_bind, subst, to_int64,
                      uses_any)
from .convert_blocks import init_condition
from .simplify import make_analyzer

# More loop variables in one index than this and the verifier stops looking for a witness
# iteration (2**n corners) and falls back to a run-time check.
_MAX_WITNESS_VARS = 8


class OutOfBoundsError(TIRError, ValueError):
    """A buffer access that provably goes out of bounds.

    ``.buffer``, ``.dimension``, ``.index`` (the index expression in loop variables) and
    ``.node`` (the load or store) say which access.
    """

    def __init__(self, message: str, node=None, buffer=None, dimension: int | None = None,
                 index: PrimExpr | None = None):
        super().__init__(message, node)
        self.buffer = buffer
        self.dimension = dimension
        self.index = index


# ------------------------------------------------------------------------------------------
# context frames, outermost first


@dataclass
class _LoopFrame:
    loop: For                      # as written (its min/extent are in the form of this level)
    full_min: PrimExpr             # min / extent in loop variables only
    full_extent: PrimExpr
    pending: list = field(default_factory=list)   # checks hoisted to just before this loop


@dataclass
class _RealizeFrame:
    realize: BlockRealize
    vmap: dict                     # iter var -> iter value (in the form outside the block)
    pending: list = field(default_factory=list)


@dataclass
class _GuardFrame:
    """A condition the code below runs under (if branch, block predicate, init, LetStmt)."""


@dataclass
class _ExprGuard:
    local: PrimExpr                # the condition in the form of the enclosing statement
    full: PrimExpr                 # in loop variables
    select: bool                   # comes from a Select (which must become if_then_else if used)
    used: bool = False


@dataclass
class _Check:
    """A run-time check ``or(empties) or (lo_idx >= 0 and hi_idx < extent)``."""
    buffer: object
    dim: int
    shown_index: PrimExpr
    extent: PrimExpr
    lo_idx: PrimExpr | None        # None: the lower bound is proven
    hi_idx: PrimExpr | None        # None: the upper bound is proven
    empties: list                  # "loop is empty" conditions of the loops hoisted over
    guards: list                   # expression guards (local form) the access runs under
    invariant: PrimExpr | None = None  # replaces the bounds test once hoisted as loop-invariant

    def bounds_condition(self) -> PrimExpr:
        if self.invariant is not None:
            return self.invariant
        parts = []
        if self.lo_idx is not None:
            parts.append(self.lo_idx >= 0)
        if self.hi_idx is not None:
            parts.append(self.hi_idx < self.extent)
        cond = parts[0]
        for p in parts[1:]:
            cond = cond & p
        return cond

    def condition(self) -> PrimExpr:
        cond = self.bounds_condition()
        for g in self.guards:
            cond = Or(Not(g), cond)
        for e in self.empties:
            cond = Or(e, cond)
        return cond

    def message(self) -> str:
        return (f"index {self.shown_index} of dimension {self.dim} of buffer {self.buffer.name} "
                f"may be out of bounds [0, {_show(self.extent)})")

    def substituted(self, vmap: dict) -> "_Check":
        s = lambda e: None if e is None else subst(e, vmap)  # noqa: E731
        return _Check(self.buffer, self.dim, self.shown_index, s(self.extent), s(self.lo_idx),
                      s(self.hi_idx), [s(e) for e in self.empties], [s(g) for g in self.guards],
                      s(self.invariant))


def _show(e: PrimExpr) -> str:
    try:
        return e.script()
    except Exception:  # the printer is optional for error messages
        return repr(e)


class _Verifier(IRMutator):
    def __init__(self, func: PrimFunc):
        super().__init__()
        self.ana = make_analyzer(func)     # contextual: loop ranges, guards
        self.base = make_analyzer(func)    # only "shape vars >= 0": for witnesses and asserts
        self.frames: list = []
        self.vmap: dict = {}               # iter var / let var -> value in loop variables
        self.n_guards = 0
        # per statement being visited: its own leaf checks and its expression-level context
        self.leaf_checks: list = []
        self.expr_guards: list[_ExprGuard] = []
        self.expr_lets: dict = {}          # expression Let var -> value (local form)

    # ------------------------------------------------------------------ helpers
    def full(self, e: PrimExpr) -> PrimExpr:
        return subst(e, self.vmap)

    @contextlib.contextmanager
    def constraint(self, cond_full: PrimExpr):
        with self.ana.with_constraint(cond_full):
            yield

    def _statement_exprs(self, fn):
        """Run ``fn`` (which visits a statement's own expressions) with fresh leaf state; return
        its result and the leaf checks it produced."""
        saved = self.leaf_checks, self.expr_guards, self.expr_lets
        self.leaf_checks, self.expr_guards, self.expr_lets = [], [], {}
        try:
            return fn(), self.leaf_checks
        finally:
            self.leaf_checks, self.expr_guards, self.expr_lets = saved

    def _wrap(self, stmt: Stmt, checks: list) -> Stmt:
        kept: list = []
        for c in checks:
            cond = self.base.simplify(c.condition())
            if isinstance(cond, IntImm) and cond.value:
                continue
            if any(structural_equal(cond, k) for k, _ in kept):   # one check suffices
                continue
            kept.append((cond, c.message()))
        out = stmt
        for cond, msg in reversed(kept):
            out = AssertStmt(cond, msg, out)
        return out

    # ------------------------------------------------------------------ the check itself
    def check_access(self, node, buffer, indices):
        lets = self.expr_lets
        for d, (idx, extent) in enumerate(zip(indices, buffer.shape)):
            local = to_int64(subst(idx, lets))
            extent = to_int64(extent)
            full = self.ana.simplify(self.full(local))
            extent_full = self.full(extent)
            need_lo, need_hi = self._unproven(full, extent_full, [])
            if not (need_lo or need_hi):
                continue
            guards = self.expr_guards
            if guards:
                lo2, hi2 = self._unproven(full, extent_full, guards)
                for g in guards:
                    g.used = True
                if not (lo2 or hi2):
                    continue
                need_lo, need_hi = lo2, hi2
            elif self.n_guards == 0:
                self._raise_if_witness(node, buffer, d, full, extent_full, need_lo, need_hi)
            local = self.ana.simplify(local) if not guards else local
            check = _Check(buffer, d, _show(full), extent, local if need_lo else None,
                           local if need_hi else None, [], [g.local for g in guards])
            self._place(check)

    def _unproven(self, full, extent, guards):
        with contextlib.ExitStack() as stack:
            for g in guards:
                stack.enter_context(self.constraint(g.full))
            need_lo = not self.ana.can_prove(full >= 0)
            need_hi = not self.ana.can_prove(full < extent)
        return need_lo, need_hi

    def _raise_if_witness(self, node, buffer, d, full, extent, need_lo, need_hi):
        loops = [f for f in self.frames if isinstance(f, _LoopFrame)]
        used = expr_vars(full)
        involved = [f for f in loops if f.loop.loop_var in used]
        if len(involved) > _MAX_WITNESS_VARS:
            return
        for corner in itertools.product((False, True), repeat=len(involved)):
            at_max = {f.loop.loop_var: c for f, c in zip(involved, corner)}
            point: dict = {}
            for f in loops:
                mn = self.base.simplify(subst(f.full_min, point))
                ext = self.base.simplify(subst(f.full_extent, point))
                if not self.base.can_prove(ext >= 1):
                    point = None
                    break
                v = f.loop.loop_var
                point[v] = self.base.simplify(mn + ext - 1) if at_max.get(v) else mn
            if point is None:
                continue
            value = self.base.simplify(subst(full, point))
            if (need_hi and self.base.can_prove(value >= extent)) or \
                    (need_lo and self.base.can_prove(value < 0)):
                where = ", ".join(f"{v.name} = {_show(x)}" for v, x in point.items()
                                  if v in used)
                raise OutOfBoundsError(
                    f"buffer {buffer.name}: index {_show(full)} of dimension {d} is out of "
                    f"bounds [0, {_show(extent)}): it reaches {_show(value)} "
                    f"{'at ' + where if where else 'in every iteration'}",
                    node, buffer=buffer, dimension=d, index=full)

    def _place(self, check: _Check):
        """Hoist ``check`` outwards over loops where the index is affine in the loop var and
        over blocks without a predicate; stop at any guard."""
        target = None
        if not check.guards:
            for k in range(len(self.frames) - 1, -1, -1):
                f = self.frames[k]
                if isinstance(f, _RealizeFrame):
                    if not is_true(f.realize.predicate):
                        break
                    check = check.substituted(f.vmap)
                    target = f
                elif isinstance(f, _LoopFrame):
                    hoisted = self._eliminate(check, f.loop)
                    if hoisted is None:
                        break
                    check = hoisted
                    target = f
                else:
                    break
        (self.leaf_checks if target is None else target.pending).append(check)

    def _eliminate(self, check: _Check, loop: For) -> _Check | None:
        """The check that holds before ``loop`` iff ``check`` holds in every iteration."""
        v = loop.loop_var
        if any(uses_any(e, [v]) for e in check.empties) or uses_any(check.extent, [v]):
            return None
        if check.invariant is not None:
            return self._eliminate_invariant(check, loop)
        last = loop.min + loop.extent - 1

        def extreme(idx, want_max):
            if idx is None:
                return None, True
            lin = linear_coeff(idx, v)
            if lin is None:
                return None, False
            c, rest = lin
            if c == 0:
                return rest, True
            at = last if (c > 0) == want_max else loop.min
            return rest + at * c, True

        lo, ok_lo = extreme(check.lo_idx, False)
        hi, ok_hi = extreme(check.hi_idx, True)
        if not (ok_lo and ok_hi):
            return self._eliminate_invariant(check, loop)
        return _Check(check.buffer, check.dim, check.shown_index, check.extent, lo, hi,
                      self._empties(check, loop), check.guards)

    def _empties(self, check: _Check, loop: For) -> list:
        empties = list(check.empties)
        if not self.base.can_prove(loop.extent >= 1):
            empties.append(loop.extent <= 0)
        return empties

    def _eliminate_invariant(self, check: _Check, loop: For) -> _Check | None:
        """Hoist a check whose index is not affine in the loop var (a clamp such as
        ``max(min(i - 2, n - 1), 0)``) when, simplified with the loop ranges known, its bounds
        test no longer depends on the var (``n >= 1``): it holds in every iteration iff it
        holds before the loop."""
        cond = self.ana.simplify(check.bounds_condition())
        if uses_any(cond, [loop.loop_var]):
            return None
        return _Check(check.buffer, check.dim, check.shown_index, check.extent, None, None,
                      self._empties(check, loop), check.guards, cond)

    # ------------------------------------------------------------------ expressions
    def visit_BufferLoad(self, e: BufferLoad):
        e2 = self.generic_visit(e)
        self.check_access(e, e.buffer, e.indices)
        return e2

    def visit_Var(self, v):
        return v

    def visit_Buffer(self, buf):
        return buf

    def _guarded(self, cond, select, fn):
        local = subst(cond, self.expr_lets)    # checks sit outside the expression's Lets
        g = _ExprGuard(local, self.ana.simplify(self.full(local)), select)
        self.expr_guards = self.expr_guards + [g]
        try:
            return fn(), g.used
        finally:
            self.expr_guards = self.expr_guards[:-1]

    def visit_Select(self, e: Select):
        cond = self.visit(e.condition)
        t, used_t = self._guarded(cond, True, lambda: self.visit(e.true_value))
        f, used_f = self._guarded(Not(cond), True, lambda: self.visit(e.false_value))
        if used_t or used_f:
            return Call(e.dtype, "if_then_else", [cond, t, f])
        if cond is e.condition and t is e.true_value and f is e.false_value:
            return e
        return Select(cond, t, f)

    def visit_Call(self, e: Call):
        if e.op == AMX_U8I8:
            # the next-row elements only give the operands' row strides: never accessed (the
            # last block's next row may lie past the buffer), so not checked
            args = list(e.args[:3]) + [
                BufferLoad(a.buffer, [self.visit(i) for i in a.indices]) for a in e.args[3:6]] \
                + list(e.args[6:])
            args[:3] = [self.visit(a) for a in args[:3]]
            args[6:] = [self.visit(a) for a in args[6:]]
            return Call(e.dtype, e.op, args)
        if e.op != "if_then_else":
            return self.generic_visit(e)
        cond = self.visit(e.args[0])
        t, _ = self._guarded(cond, False, lambda: self.visit(e.args[1]))
        f, _ = self._guarded(Not(cond), False, lambda: self.visit(e.args[2]))
        if cond is e.args[0] and t is e.args[1] and f is e.args[2]:
            return e
        return Call(e.dtype, e.op, [cond, t, f])

    def visit_Let(self, e: Let):
        value = self.visit(e.value)
        saved = self.expr_lets
        self.expr_lets = {**saved, e.var: subst(value, saved)}
        try:
            body = self.visit(e.body)
        finally:
            self.expr_lets = saved
        if value is e.value and body is e.body:
            return e
        return Let(e.var, value, body)

    # ------------------------------------------------------------------ statements
    def visit_BufferStore(self, s: BufferStore):
        def exprs():
            value = self.visit(s.value)
            indices = tuple(self.visit(i) for i in s.indices)
            self.check_access(s, s.buffer, s.indices)
            if value is s.value and all(a is b for a, b in zip(indices, s.indices)):
                return s
            return BufferStore(s.buffer, value, indices)
        new, checks = self._statement_exprs(exprs)
        return self._wrap(new, checks)

    def visit_Evaluate(self, s: Evaluate):
        new, checks = self._statement_exprs(lambda: self.generic_visit(s))
        return self._wrap(new, checks)

    def visit_For(self, loop: For):
        (mn, ext), checks = self._statement_exprs(
            lambda: (self.visit(loop.min), self.visit(loop.extent)))
        fmin, fext = self.full(loop.min), self.full(loop.extent)
        frame = _LoopFrame(loop, fmin, fext)
        self.frames.append(frame)
        try:
            with scoped_bind(self.ana, loop.loop_var, Range(fmin, fext)):
                body = self.visit(loop.body)
        finally:
            self.frames.pop()
        new = loop if (mn is loop.min and ext is loop.extent and body is loop.body) else \
            loop.replace(min=mn, extent=ext, body=body)
        return self._wrap(new, frame.pending + checks)

    def visit_IfThenElse(self, s: IfThenElse):
        cond, checks = self._statement_exprs(lambda: self.visit(s.condition))
        cond_full = self.ana.simplify(self.full(s.condition))
        self.frames.append(_GuardFrame())
        self.n_guards += 1
        try:
            with self.constraint(cond_full):
                then_case = self.visit(s.then_case)
            else_case = None
            if s.else_case is not None:
                with self.constraint(Not(cond_full)):
                    else_case = self.visit(s.else_case)
        finally:
            self.frames.pop()
            self.n_guards -= 1
        new = s if (cond is s.condition and then_case is s.then_case
                    and else_case is s.else_case) else IfThenElse(cond, then_case, else_case)
        return self._wrap(new, checks)

    def visit_LetStmt(self, s: LetStmt):
        value, checks = self._statement_exprs(lambda: self.visit(s.value))
        self.vmap[s.var] = self.full(s.value)
        self.frames.append(_GuardFrame())   # checks using the let var must stay inside it
        try:
            body = self.visit(s.body)
        finally:
            self.frames.pop()
            del self.vmap[s.var]
        new = s if (value is s.value and body is s.body) else LetStmt(s.var, value, body)
        return self._wrap(new, checks)

    def visit_AssertStmt(self, s: AssertStmt):
        cond, checks = self._statement_exprs(lambda: self.visit(s.condition))
        # the body only runs once the assertion passed: its condition guards the body
        self.frames.append(_GuardFrame())
        self.n_guards += 1
        try:
            with self.constraint(self.ana.simplify(self.full(s.condition))):
                body = self.visit(s.body)
        finally:
            self.frames.pop()
            self.n_guards -= 1
        new = s if (cond is s.condition and body is s.body) else \
            AssertStmt(cond, s.message, body)
        return self._wrap(new, checks)

    def visit_Allocate(self, s: Allocate):
        body = self.visit(s.body)
        return s if body is s.body else Allocate(s.buffer, body)

    def visit_SeqStmt(self, s: SeqStmt):
        stmts = [self.visit(x) for x in s.seq]
        if all(a is b for a, b in zip(stmts, s.seq)):
            return s
        return seq(*stmts)

    def visit_BlockRealize(self, r: BlockRealize):
        def exprs():
            return (tuple(self.visit(v) for v in r.iter_values), self.visit(r.predicate))
        (values, pred), checks = self._statement_exprs(exprs)
        block = r.block
        vmap = dict(zip([iv.var for iv in block.iter_vars], r.iter_values))
        full_vals = {iv.var: self.ana.simplify(self.full(v))
                     for iv, v in zip(block.iter_vars, r.iter_values)}
        frame = _RealizeFrame(r, vmap)
        guarded = not is_true(r.predicate)
        pred_full = self.ana.simplify(self.full(r.predicate)) if guarded else None
        self.vmap.update(full_vals)
        self.frames.append(frame)
        self.n_guards += guarded
        try:
            with (self.constraint(pred_full) if guarded else contextlib.nullcontext()):
                new_block = self._visit_block(block)
        finally:
            self.frames.pop()
            self.n_guards -= guarded
            for iv in block.iter_vars:
                self.vmap.pop(iv.var, None)
        unchanged = new_block is block and pred is r.predicate and \
            all(a is b for a, b in zip(values, r.iter_values))
        new = r if unchanged else BlockRealize(values, pred, new_block)
        return self._wrap(new, frame.pending + checks)

    def _visit_block(self, block: Block) -> Block:
        body = self.visit(block.body)
        init = block.init
        if init is not None:
            cond = init_condition(block)
            self.frames.append(_GuardFrame())
            self.n_guards += 1
            try:
                with (self.constraint(self.ana.simplify(self.full(cond))) if cond is not None
                      else contextlib.nullcontext()):
                    init = self.visit(init)
            finally:
                self.frames.pop()
                self.n_guards -= 1
        if body is block.body and init is block.init:
            return block
        return block.replace(body=body, init=init)

    def visit_Block(self, block: Block):
        if block.iter_vars:
            raise TIRError(f"VerifyMemoryAccess: block {block.name} is not inside a "
                           f"BlockRealize", block)
        return self._visit_block(block)


@prim_func_pass
def VerifyMemoryAccess(func: PrimFunc) -> PrimFunc:
    """Check every buffer access of ``func`` against its buffer's shape.

    Raises ``OutOfBoundsError`` (a ``ValueError``) naming the buffer, dimension, index and
    range for an access that provably goes out of bounds; inserts an ``AssertStmt`` for one it
    can neither prove nor refute; returns ``func`` itself when every access is proven safe.
    Works on block form and on lowered loops, on every storage scope. Loops with a non-constant
    extent marked ``vectorized`` are left alone (code generators run them serially).

    Examples
    --------
    >>> from tilecraft.tensorir import te, transform
    >>> n, k = te.var("n"), te.var("k")
    >>> A = te.placeholder((n,), "float32", "A")
    >>> B = te.compute((n,), lambda i: A[i + k], "B")
    >>> f = transform.VerifyMemoryAccess(te.create_prim_func([A, B, k]))
    >>> # assert k >= 0 and (n <= 0 or n - 1 + k < n), "index i + k of dimension 0 of buffer A ..."
    """
    v = _Verifier(func)
    body = v.visit(func.body)
    return func if body is func.body else func.replace(body=body)

