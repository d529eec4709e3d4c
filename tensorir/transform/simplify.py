"""``Simplify``: arithmetic simplification of a function with loop ranges and conditions known."""
from __future__ import annotations

import contextlib

from .. import arith
from .. import dtype as dt
from ..expr import (Add, And, BufferLoad, Call, Cast, Div, EQ, FloorDiv, FloorMod, GE,
                    GT, IntImm, LE, LT, Let, Max, Min, Mod, Mul, NE, Not, Or, PrimExpr, Select,
                    Sub, Var)
from ..function import PrimFunc
from ..functor import IRMutator, children
from ..stmt import (AssertStmt, Block, BlockRealize, Buffer, Evaluate, For, IfThenElse, LetStmt,
                    Range, SeqStmt, seq)
from ..structural import structural_equal
from ._common import func_shape_vars, is_no_op, no_op, prim_func_pass, scoped_bind, subst

# Nodes tensorir.arith reasons about; an integer/bool expression built only of these goes to
# the analyzer whole, anything else (loads, calls, floats) is simplified piecewise.
_ARITH_NODES = (Var, IntImm, Add, Sub, Mul, Div, Mod, FloorDiv, FloorMod, Min, Max, EQ, NE, LT,
                LE, GT, GE, And, Or, Not)


def _is_int_or_bool(d: str) -> bool:
    return dt.lanes(d) == 1 and (dt.is_integer(d) or dt.is_bool(d))


def is_index_expr(e: PrimExpr) -> bool:
    """True if ``e`` is pure integer/bool arithmetic over variables and constants."""
    stack = [e]
    while stack:
        n = stack.pop()
        if not isinstance(n, _ARITH_NODES) or not _is_int_or_bool(n.dtype):
            return False
        if not isinstance(n, (Var, IntImm)):
            stack.extend(children(n))
    return True


def cannot_fault(e: PrimExpr) -> bool:
    """True if evaluating ``e`` can never fault, however its operands are rewritten: pure
    index arithmetic (no loads, no calls) whose divisions are by non-zero constants."""
    if not is_index_expr(e):
        return False
    stack = [e]
    while stack:
        n = stack.pop()
        if isinstance(n, (Div, Mod, FloorDiv, FloorMod)) and \
                not (isinstance(n.b, IntImm) and n.b.value != 0):
            return False
        if not isinstance(n, (Var, IntImm)):
            stack.extend(children(n))
    return True


def _const_bool(e: PrimExpr) -> bool | None:
    if isinstance(e, IntImm) and dt.is_bool(e.dtype):
        return bool(e.value)
    return None


class StmtSimplifier(IRMutator):
    """Simplify statements and expressions with an ``arith.Analyzer`` that knows the ranges of
    the enclosing loops and the conditions of the enclosing ``IfThenElse``s."""

    def __init__(self, analyzer):
        super().__init__()
        self.ana = analyzer

    # Buffers keep their identity: a shape simplified under one loop's knowledge would be wrong
    # elsewhere, and the parameters' buffers must stay those of the buffer map.
    def visit_Buffer(self, buf: Buffer):
        return buf

    # ---------------------------------------------------------------- expressions
    def visit(self, node):
        if isinstance(node, PrimExpr) and not isinstance(node, (Var, IntImm)) \
                and is_index_expr(node):
            new = self.ana.simplify(node)
            # keep the node itself when nothing changed, so an unchanged function is returned
            # as the same object
            return node if structural_equal(new, node) else new
        return super().visit(node)

    def visit_Select(self, e: Select):
        cond = self.visit(e.condition)
        c = _const_bool(cond)
        if c is not None:
            return self.visit(e.true_value if c else e.false_value)
        # A Select evaluates both operands (LLVM's select, vector lanes, OpenCL / WGSL
        # select()), so what its condition proves may rewrite a branch only where the result
        # cannot fault whatever the condition: Select(i < n, A[min(i, n - 1)], 0) keeps its
        # clamp, else the load runs out of bounds where i >= n. Lazy if_then_else and
        # IfThenElse do use their condition.
        t = self._select_branch(cond, e.true_value)
        f = self._select_branch(Not(cond), e.false_value)
        if cond is e.condition and t is e.true_value and f is e.false_value:
            return e
        return Select(cond, t, f)

    def _select_branch(self, cond: PrimExpr, branch: PrimExpr) -> PrimExpr:
        if not cannot_fault(branch):
            return self.visit(branch)
        with self.ana.with_constraint(cond):
            return self.visit(branch)

    def visit_Call(self, e: Call):
        if e.op != "if_then_else":
            return self.generic_visit(e)
        cond = self.visit(e.args[0])
        c = _const_bool(cond)
        if c is not None:
            return self.visit(e.args[1] if c else e.args[2])
        with self.ana.with_constraint(cond):
            t = self.visit(e.args[1])
        with self.ana.with_constraint(Not(cond)):
            f = self.visit(e.args[2])
        if cond is e.args[0] and t is e.args[1] and f is e.args[2]:
            return e
        return Call(e.dtype, e.op, [cond, t, f])

    def visit_Cast(self, e: Cast):
        value = self.visit(e.value)
        folded = arith.fold_cast(e.dtype, value)
        if folded is not None:
            return folded
        if value.dtype == e.dtype:
            return value
        return e if value is e.value else Cast(e.dtype, value)

    def visit_Let(self, e: Let):
        value = self.visit(e.value)
        if isinstance(value, (IntImm, Var)):
            return self.visit(subst(e.body, {e.var: value}))
        self._bound_like(e.var, value)
        body = self.visit(e.body)
        if value is e.value and body is e.body:
            return e
        return Let(e.var, value, body)

    def visit_BufferLoad(self, e: BufferLoad):
        indices = tuple(self.visit(i) for i in e.indices)
        if all(a is b for a, b in zip(indices, e.indices)):
            return e
        return BufferLoad(e.buffer, indices)

    def _bound_like(self, var: Var, value: PrimExpr):
        """Tell the analyzer ``var``'s bounds are those of ``value`` (a let binding)."""
        if _is_int_or_bool(var.dtype) and dt.is_integer(var.dtype) and is_index_expr(value):
            b = self.ana.const_int_bound(value)
            self.ana.update_bound(var, b.min_value, b.max_value)

    # ---------------------------------------------------------------- statements
    def visit_For(self, loop: For):
        mn = self.visit(loop.min)
        ext = self.visit(loop.extent)
        # thread-bound loops stay even at extent 1: they say where a GPU kernel is
        if loop.kind != "thread_binding":
            if isinstance(ext, IntImm) and ext.value == 1:
                return self.visit(subst(loop.body, {loop.loop_var: mn}))
            if self.ana.can_prove(ext <= 0):
                return no_op()
        with scoped_bind(self.ana, loop.loop_var, Range(mn, ext)):
            body = self.visit(loop.body)
        if is_no_op(body) and loop.kind != "thread_binding":
            return no_op()
        if mn is loop.min and ext is loop.extent and body is loop.body:
            return loop
        return loop.replace(min=mn, extent=ext, body=body)

    def visit_IfThenElse(self, s: IfThenElse):
        cond = self.visit(s.condition)
        c = _const_bool(cond)
        if c is None and self.ana.can_prove(cond):
            c = True
        elif c is None and self.ana.can_prove(Not(cond)):
            c = False
        if c is True:
            return self.visit(s.then_case)
        if c is False:
            return no_op() if s.else_case is None else self.visit(s.else_case)
        with self.ana.with_constraint(cond):
            then_case = self.visit(s.then_case)
        else_case = None
        if s.else_case is not None:
            with self.ana.with_constraint(Not(cond)):
                else_case = self.visit(s.else_case)
            if is_no_op(else_case):
                else_case = None
        if is_no_op(then_case):
            if else_case is None:
                return no_op()
            return IfThenElse(self.visit(Not(cond)), else_case)
        if cond is s.condition and then_case is s.then_case and else_case is s.else_case:
            return s
        return IfThenElse(cond, then_case, else_case)

    def visit_LetStmt(self, s: LetStmt):
        value = self.visit(s.value)
        if isinstance(value, (IntImm, Var)):
            return self.visit(subst(s.body, {s.var: value}))
        self._bound_like(s.var, value)
        body = self.visit(s.body)
        if value is s.value and body is s.body:
            return s
        return LetStmt(s.var, value, body)

    def visit_AssertStmt(self, s: AssertStmt):
        cond = self.visit(s.condition)
        if _const_bool(cond) is True or (_const_bool(cond) is None and self.ana.can_prove(cond)):
            return self.visit(s.body)
        with self.ana.with_constraint(cond):
            body = self.visit(s.body)
        if cond is s.condition and body is s.body:
            return s
        return AssertStmt(cond, s.message, body)

    def visit_SeqStmt(self, s: SeqStmt):
        stmts = [self.visit(x) for x in s.seq]
        if all(a is b for a, b in zip(stmts, s.seq)):
            return s
        kept = [x for x in stmts if not is_no_op(x)]
        return seq(*kept) if kept else no_op()

    def visit_Evaluate(self, s: Evaluate):
        value = self.visit(s.value)
        if isinstance(value, IntImm) and not (isinstance(s.value, IntImm)):
            return no_op()
        return s if value is s.value else Evaluate(value)

    def visit_Block(self, block: Block):
        # in block form the iter vars range over their domains
        with contextlib.ExitStack() as stack:
            for iv in block.iter_vars:
                dom = Range(self.visit(iv.dom.min), self.visit(iv.dom.extent))
                stack.enter_context(scoped_bind(self.ana, iv.var, dom))
            return self.generic_visit(block)

    def visit_BlockRealize(self, s: BlockRealize):
        pred = self.visit(s.predicate)
        if _const_bool(pred) is False:
            return no_op()
        values = tuple(self.visit(v) for v in s.iter_values)
        if _const_bool(pred) is None:
            with self.ana.with_constraint(pred):
                block = self.visit(s.block)
        else:
            block = self.visit(s.block)
        if pred is s.predicate and block is s.block and \
                all(a is b for a, b in zip(values, s.iter_values)):
            return s
        return BlockRealize(values, pred, block)


def make_analyzer(func: PrimFunc):
    """An Analyzer that knows the function's symbolic dims are non-negative."""
    ana = arith.Analyzer()
    for v in func_shape_vars(func):
        if dt.is_integer(v.dtype):
            ana.update_bound(v, 0, None)
    return ana


@prim_func_pass
def Simplify(func: PrimFunc) -> PrimFunc:
    """Simplify every expression of ``func`` using what the context proves.

    An ``arith.Analyzer`` learns each loop's range while descending (symbolic dims are known
    to be >= 0) and each ``IfThenElse`` / ``if_then_else`` condition inside its branches.
    A ``Select`` evaluates both operands, so its condition is used only in a branch that
    cannot fault (index arithmetic without loads or divisions by a variable): a clamped load
    ``Select(i < n, A[min(i, n - 1)], 0)`` keeps its clamp. Loops of extent 1 are replaced
    by their body with the loop var set to the min (thread-bound loops excepted: they mark
    GPU kernels); loops of extent <= 0 and statements
    that do nothing are removed; conditions the analyzer decides select their branch; asserts
    it proves disappear. Buffers are left as they are.

    Examples
    --------
    >>> from tilecraft.tensorir import te, transform
    >>> A = te.placeholder((1, 8), "float32", "A")
    >>> B = te.compute((1, 8), lambda i, j: A[i, j] * 2.0, "B")
    >>> f = transform.Simplify(transform.ConvertBlocksToLoops(te.create_prim_func([A, B])))
    >>> # for j in range(8): B[0, j] = A[0, j] * 2.0
    """
    body = StmtSimplifier(make_analyzer(func)).visit(func.body)
    return func if body is func.body else func.replace(body=body)
