"""``LegalizeOps``: replace operator calls by the TensorIR that computes them.

Each operator call whose operator has a legalization becomes what ``legalize(bb, call)`` returns
(normally one ``R.call_tir`` of a kernel made with ``bb.call_te``; a legalization may also emit
several bindings, which are legalized again in turn). Operators without one (VM builtins such as
``shape_of``, and ``call_tir`` itself) stay. Identical kernels are shared.

Every kernel made here gets the PrimFunc attribute ``"op_pattern"`` that ``FuseOps`` reads: the
operator's pattern kind when the legalization made one kernel, else the kind that
``relax.analysis.infer_op_pattern`` reads off each kernel.

Examples
--------
>>> # lv = R.add(x, y)  becomes  lv = R.call_tir(cls.add, (x, y), out_sinfo=R.Tensor(...))
>>> # new_mod = LegalizeOps()(mod)
"""
from __future__ import annotations

from typing import Iterable

from tilecraft.tensorir.function import IRModule, PrimFunc

from ..analysis import infer_op_pattern, is_call_tir
from ..expr import Call, Expr, RelaxError, Tuple, Var
from ..op.base import Op
from .base import ExprMutator, Pass

__all__ = ["LegalizeOps"]


class LegalizeOps(Pass):
    """Legalize every operator call that has a legalization.

    Parameters
    ----------
    skip_ops : iterable of str, optional
        Operator names to leave as they are (``"relax.nn.conv2d"``).

    Examples
    --------
    >>> new_mod = LegalizeOps()(mod)   # doctest: +SKIP
    """

    name = "LegalizeOps"

    def __init__(self, skip_ops: Iterable[str] | None = None):
        self.skip_ops = frozenset(skip_ops or ())

    def transform_module(self, mod: IRModule) -> IRModule:
        return _Legalizer(mod, self.skip_ops).visit_module()


class _Legalizer(ExprMutator):
    def __init__(self, mod, skip_ops):
        super().__init__(mod)
        self.skip_ops = skip_ops
        self.depth = 0

    def visit_call_(self, call: Call) -> Expr:
        call = self._normalize_args(super().visit_call_(call))
        op = call.op
        if not isinstance(op, Op) or op.legalize is None or op.name in self.skip_ops:
            return call
        if self.depth > 32:
            raise RelaxError(f"LegalizeOps: the legalization of {op.name} keeps producing calls "
                             f"to be legalized (more than 32 levels deep)", call)
        b = self.builder
        b.begin_block(b.in_dataflow)
        try:
            result = op.legalize(b, call)
        except RelaxError:
            raise
        except Exception as err:
            raise RelaxError(f"LegalizeOps: legalizing {op.name} failed: {err}", call) from err
        finally:
            emitted = b.end_block()
        if not isinstance(result, Expr):
            raise RelaxError(f"LegalizeOps: the legalization of {op.name} returned "
                             f"{type(result).__name__}, not a Relax expression", call)
        self._annotate(op, emitted, result)
        # what the legalization emitted may use operators with legalizations of their own
        self.depth += 1
        try:
            for binding in emitted:
                self.visit_binding(binding)
            if not (isinstance(result, Call) and result.op is op):
                result = self.visit_expr(result)
        finally:
            self.depth -= 1
        return result

    def _normalize_args(self, call: Call) -> Call:
        """Bind nested calls (``relu(add(x, y))``) to variables first, so the result is in
        A-normal form and each kernel call has a binding of its own."""
        def bind(e):
            if isinstance(e, Call):
                return self.builder.emit(e)
            if isinstance(e, Tuple) and any(isinstance(f, (Call, Tuple)) for f in e.fields):
                return Tuple([bind(f) for f in e.fields])
            return e

        if not self.builder.building:
            return call
        args = [bind(a) for a in call.args]
        if all(a is b for a, b in zip(args, call.args)):
            return call
        if isinstance(call.op, Op):
            return Call(call.op, args, call.attrs, call.sinfo_args)
        return Call(call.op, args, call.attrs, call.sinfo_args, call.struct_info)

    def _annotate(self, op: Op, emitted, result: Expr) -> None:
        """Set "op_pattern" on the kernels the legalization calls (unless already set)."""
        calls = [b.value for b in emitted if is_call_tir(b.value)]
        final = result
        if isinstance(final, Var):
            final = next((b.value for b in emitted if b.var is final), final)
        if is_call_tir(final) and all(c is not final for c in calls):
            calls.append(final)
        names = [c.args[0].name_hint for c in calls]
        single = len(set(names)) == 1
        for name in dict.fromkeys(names):
            func = self.builder.get_func(name)
            if not isinstance(func, PrimFunc) or "op_pattern" in func.attr_dict:
                continue
            pattern = op.pattern if single else infer_op_pattern(func)
            self.builder.update_func(name, func.with_attr("op_pattern", int(pattern)))
