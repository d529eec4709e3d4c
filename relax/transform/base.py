"""What the Relax passes share: ``ExprMutator`` (rewrite functions binding by binding, as TVM's
``ExprMutator``), the block builder it emits into, and ``Sequential``.

A pass is a callable ``IRModule -> IRModule`` that never changes its input (the IR is immutable;
functions and bindings that a pass leaves alone are the same objects in its result).

Examples
--------
>>> from tilecraft.relax.transform import Sequential, DeadCodeElimination, CanonicalizeBindings
>>> seq = Sequential([CanonicalizeBindings(), DeadCodeElimination()])
>>> # new_mod = seq(mod)
"""
from __future__ import annotations

from typing import Callable, Sequence

from tilecraft.tensorir.function import IRModule, PrimFunc

from ..analysis import bound_vars, check_well_formed, struct_info_base_check
from ..block_builder import BlockBuilder
from ..expr import (Binding, BindingBlock, Call, DataflowBlock, DataflowVar, Expr, Function,
                    GlobalVar, If, MatchCast, RelaxError, SeqExpr, Tuple, TupleGetItem, Var,
                    VarBinding)
from ..op.base import Op
from ..struct_info import StructInfo

__all__ = ["ExprMutator", "RewriteBuilder", "Sequential", "Pass", "check_module"]


def check_module(mod, pass_name: str) -> IRModule:
    if not isinstance(mod, IRModule):
        raise TypeError(f"{pass_name} expects an IRModule, got {type(mod).__name__}; wrap a "
                        f"function with IRModule({{'main': func}})")
    return mod


class Pass:
    """Base of the module passes: ``new_mod = SomePass(options)(mod)``."""

    name = "Pass"

    def __call__(self, mod: IRModule) -> IRModule:
        check_module(mod, self.name)
        return self.transform_module(mod)

    def transform_module(self, mod: IRModule) -> IRModule:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self):
        return f"{self.name}()"


class Sequential(Pass):
    """Run passes in order (TVM's ``tvm.transform.Sequential``).

    Parameters
    ----------
    passes : sequence of callables IRModule -> IRModule
    name : str
        Shown in error messages.
    check : bool
        Run ``relax.analysis.check_well_formed`` after every pass; an ill-formed result raises
        ``RelaxError`` naming the pass that made it.

    Examples
    --------
    >>> seq = Sequential([DeadCodeElimination()], check=True)   # doctest: +SKIP
    >>> new_mod = seq(mod)                                       # doctest: +SKIP
    """

    def __init__(self, passes: Sequence[Callable], name: str = "Sequential", check: bool = False):
        self.passes = list(passes)
        self.name = name
        self.check = check

    def transform_module(self, mod: IRModule) -> IRModule:
        for p in self.passes:
            mod = p(mod)
            if not isinstance(mod, IRModule):
                raise RelaxError(f"{self.name}: pass {_pass_name(p)} returned "
                                 f"{type(mod).__name__}, not an IRModule")
            if self.check:
                try:
                    check_well_formed(mod)
                except RelaxError as err:
                    raise RelaxError(f"{self.name}: the module is ill-formed after "
                                     f"{_pass_name(p)}: {err}", err.node) from err
        return mod

    def __repr__(self):
        return f"Sequential([{', '.join(repr(p) for p in self.passes)}])"


def _pass_name(p) -> str:
    return p.__name__ if hasattr(p, "__name__") else repr(p)


class _Frame:
    __slots__ = ("bindings", "is_dataflow", "defined")

    def __init__(self, is_dataflow: bool):
        self.bindings: list[Binding] = []
        self.is_dataflow = is_dataflow
        self.defined: set[int] = set()


class RewriteBuilder(BlockBuilder):
    """A ``BlockBuilder`` over an existing module whose ``emit`` appends to the block an
    ``ExprMutator`` is rebuilding, so an operator's ``legalize(bb, call)`` can emit bindings
    and ``call_te`` kernels while a function is rewritten in place.

    New variables get names unique in the function being rewritten (``lv``, ``lv1``, ...).
    """

    def __init__(self, mod: IRModule | None = None):
        super().__init__(mod)
        self._frames: list[_Frame] = []
        self._taken: set[str] = set()
        self._next_suffix: dict[str, int] = {}
        self._values: dict[int, Expr] = {}
        self._keep: list = []

    # -- frames ------------------------------------------------------------------------------
    def begin_names(self, func) -> None:
        """Names of ``func``'s variables are taken: new variables get other names."""
        self._taken = {v.name_hint for v in bound_vars(func)}
        self._next_suffix = {}

    def begin_block(self, is_dataflow: bool) -> None:
        self._frames.append(_Frame(is_dataflow))

    def end_block(self) -> list[Binding]:
        return self._frames.pop().bindings

    @property
    def building(self) -> bool:
        """Is a block being rebuilt (so ``emit`` has somewhere to go)?"""
        return bool(self._frames)

    @property
    def in_dataflow(self) -> bool:
        return bool(self._frames) and self._frames[-1].is_dataflow

    def _frame(self, what: str) -> _Frame:
        if not self._frames:
            raise RelaxError(f"RewriteBuilder.{what}: no block is being rebuilt")
        return self._frames[-1]

    def visible(self, e: Expr) -> bool:
        """Can ``e`` be used in the block being rebuilt? (A DataflowVar only in its own block.)"""
        if not isinstance(e, DataflowVar):
            return True
        return bool(self._frames) and id(e) in self._frames[-1].defined

    def fresh_name(self, hint: str) -> str:
        hint = hint or "lv"
        # names are only ever taken, so the first free suffix of a hint never moves back: start
        # from the last one (counting from 0 every time was quadratic in a function's bindings)
        k = self._next_suffix.get(hint, 0)
        name = f"{hint}{k}" if k else hint
        while name in self._taken:
            k += 1
            name = f"{hint}{k}"
        self._taken.add(name)
        self._next_suffix[hint] = k
        return name

    def append(self, binding: Binding) -> None:
        """Add a binding (kept as it is) to the block being rebuilt."""
        frame = self._frame("append")
        frame.bindings.append(binding)
        frame.defined.add(id(binding.var))
        self._values[id(binding.var)] = binding.value
        self._keep.append(binding.var)
        self._taken.add(binding.var.name_hint)

    # -- BlockBuilder API -----------------------------------------------------------------------
    def emit(self, expr: Expr, name_hint: str = "lv") -> Var:
        frame = self._frame("emit")
        expr = self.normalize(expr)
        cls = DataflowVar if frame.is_dataflow else Var
        var = cls(self.fresh_name(name_hint), expr.struct_info)
        self.append(VarBinding(var, expr))
        return var

    def emit_output(self, output, name_hint: str = "gv") -> Var:
        if isinstance(output, (list, tuple)):
            output = Tuple(output)
        output = self.normalize(output)
        var = Var(self.fresh_name(name_hint), output.struct_info)
        self.append(VarBinding(var, output))
        return var

    def match_cast(self, value: Expr, struct_info: StructInfo, name_hint: str = "lv") -> Var:
        frame = self._frame("match_cast")
        value = self.normalize(value)
        cls = DataflowVar if frame.is_dataflow else Var
        var = cls(self.fresh_name(name_hint), struct_info)
        self.append(MatchCast(var, value, struct_info))
        return var

    def lookup_binding(self, var: Var) -> Expr | None:
        v = self._values.get(id(var))
        return v if v is not None else super().lookup_binding(var)

    def get_func(self, name: str):
        """The function ``name`` of the module being built (None if there is none)."""
        return self._funcs.get(name)

    def remove_func(self, name: str) -> None:
        self._funcs.pop(name, None)
        self._forget_kernel(name)

    def call_te_kernel(self, te_func, *args, name: str, pattern: int, **kwargs) -> Call:
        """``call_te`` of ``te_func`` whose kernel carries ``"op_pattern"`` (``FuseOps`` reads
        it): for passes that add kernels after ``LegalizeOps`` (``AlterLayout``,
        ``GPUWinograd``, ``FuseExpandDepthwise``)."""
        c = self.call_te(te_func, *args, primfunc_name_hint=name, **kwargs)
        gname = c.args[0].name_hint
        func = self.get_func(gname)
        if isinstance(func, PrimFunc) and "op_pattern" not in func.attr_dict:
            self.update_func(gname, func.with_attr("op_pattern", int(pattern)))
        return c

    def note_binding(self, var: Var, value: Expr) -> None:
        """Record what ``var`` is bound to (for ``lookup_binding``) without emitting it."""
        self._values[id(var)] = value
        self._keep.append(var)


class ExprMutator:
    """Rewrite the Relax functions of a module binding by binding.

    Override ``visit_call_``, ``visit_var_``, ``visit_tuple_getitem_`` ... (the hooks return the
    new expression) or ``visit_var_binding`` / ``visit_match_cast`` (they append bindings to
    ``self.builder``; appending none drops the binding). Variables whose value keeps its struct
    info keep their identity; ``self.var_remap`` maps ``id(old var)`` to the expression that
    replaces it at every later use.
    """

    def __init__(self, mod: IRModule | None = None):
        self.mod = mod
        self.builder = RewriteBuilder(mod)
        self.var_remap: dict[int, Expr] = {}
        self._keep: list = []

    # -- module and functions ----------------------------------------------------------------------
    def visit_module(self) -> IRModule:
        """Rewrite every Relax function of ``self.mod``; the new module keeps the order."""
        for name, func in list(self.mod.functions.items()):
            if isinstance(func, Function):
                new = self.visit_function_root(name, func)
                if new is not func:
                    self.builder.update_func(name, new)
        return self.builder.get()

    def visit_function_root(self, name: str, func: Function) -> Function:
        self.builder.begin_names(func)
        return self.visit_function(func)

    def visit_function(self, func: Function) -> Function:
        params = [self.visit_param(p) for p in func.params]
        body = self.visit_body(func.body)
        if body is func.body and all(a is b for a, b in zip(params, func.params)):
            return func
        return Function(params, body, func.ret_struct_info, func.attrs)

    def visit_param(self, p: Var) -> Var:
        return p

    def visit_body(self, e: Expr) -> Expr:
        return self.visit_seq_expr(e) if isinstance(e, SeqExpr) else self.visit_expr(e)

    def visit_seq_expr(self, seq: SeqExpr) -> SeqExpr:
        blocks, changed = [], False
        for blk in seq.blocks:
            new = self.visit_block(blk)
            changed |= new is not blk
            if new.bindings:
                blocks.append(new)
            else:
                changed = True
        body = self.visit_expr(seq.body)
        if not changed and body is seq.body:
            return seq
        return SeqExpr(blocks, body)

    def visit_block(self, blk: BindingBlock) -> BindingBlock:
        self.builder.begin_block(isinstance(blk, DataflowBlock))
        try:
            for b in blk.bindings:
                self.visit_binding(b)
        finally:
            new = self.builder.end_block()
        if len(new) == len(blk.bindings) and all(a is b for a, b in zip(new, blk.bindings)):
            return blk
        return type(blk)(new)

    # -- bindings ---------------------------------------------------------------------------------
    def visit_binding(self, b: Binding) -> None:
        if isinstance(b, MatchCast):
            self.visit_match_cast(b)
        else:
            self.visit_var_binding(b)

    def visit_var_binding(self, b: VarBinding) -> None:
        value = self.visit_expr(b.value)
        self.emit_binding(b, value)

    def visit_match_cast(self, b: MatchCast) -> None:
        value = self.visit_expr(b.value)
        if value is b.value:
            self.builder.append(b)
        else:
            self.builder.append(MatchCast(b.var, value, b.struct_info))

    def emit_binding(self, b: VarBinding, value: Expr) -> Var:
        """Append ``b.var = value``, keeping ``b.var`` if ``value`` is at least as precise."""
        if value is b.value:
            self.builder.append(b)
            return b.var
        var = self.rebind_var(b.var, value.struct_info)
        self.builder.append(VarBinding(var, value))
        return var

    def rebind_var(self, var: Var, sinfo: StructInfo) -> Var:
        if sinfo is var.struct_info or struct_info_base_check(var.struct_info, sinfo) is True:
            return var
        new = type(var)(var.name_hint, sinfo)
        self.var_remap[id(var)] = new
        self._keep.append(var)
        return new

    # -- expressions ------------------------------------------------------------------------------
    def visit_expr(self, e: Expr) -> Expr:
        if isinstance(e, Var):
            return self.visit_var_(e)
        if isinstance(e, Call):
            return self.visit_call_(e)
        if isinstance(e, Tuple):
            return self.visit_tuple_(e)
        if isinstance(e, TupleGetItem):
            return self.visit_tuple_getitem_(e)
        if isinstance(e, If):
            return self.visit_if_(e)
        if isinstance(e, SeqExpr):
            return self.visit_seq_expr(e)
        if isinstance(e, Function):
            return self.visit_function(e)
        return self.visit_leaf_(e)

    def visit_var_(self, v: Var) -> Expr:
        return self.var_remap.get(id(v), v)

    def visit_leaf_(self, e: Expr) -> Expr:
        """Constants, GlobalVars, ShapeExprs, PrimValues, strings, ExternFuncs."""
        return e

    def visit_call_(self, call: Call) -> Expr:
        op = call.op
        new_op = self.visit_expr(op) if isinstance(op, (Var, GlobalVar, Function)) else op
        args = [self.visit_expr(a) for a in call.args]
        if new_op is op and all(a is b for a, b in zip(args, call.args)):
            return call
        if isinstance(new_op, Op):
            return Call(new_op, args, call.attrs, call.sinfo_args)  # re-inferred
        return Call(new_op, args, call.attrs, call.sinfo_args, call.struct_info)

    def visit_tuple_(self, t: Tuple) -> Expr:
        fields = [self.visit_expr(f) for f in t.fields]
        if all(a is b for a, b in zip(fields, t.fields)):
            return t
        return Tuple(fields)

    def visit_tuple_getitem_(self, t: TupleGetItem) -> Expr:
        value = self.visit_expr(t.tuple_value)
        if value is t.tuple_value:
            return t
        return TupleGetItem(value, t.index)

    def visit_if_(self, e: If) -> Expr:
        cond = self.visit_expr(e.cond)
        tb = self.visit_body(e.true_branch)
        fb = self.visit_body(e.false_branch)
        if cond is e.cond and tb is e.true_branch and fb is e.false_branch:
            return e
        return If(cond, tb, fb, e.struct_info)
