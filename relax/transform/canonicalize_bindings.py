"""``CanonicalizeBindings``: remove variable copies and trivial ``match_cast``s.

- ``y = x`` (``x`` a variable at least as precise as ``y``): later uses of ``y`` use ``x``.
- ``y = R.match_cast(x, sinfo)`` where ``x`` provably already has ``sinfo``: the same.
- ``gv = lv`` where ``gv`` leaves a dataflow block and ``lv`` is a DataflowVar of that block
  (``lv`` cannot be used after the block): ``lv``'s own binding binds ``gv`` instead, and uses of
  ``lv`` use ``gv``.

Examples
--------
>>> # with R.dataflow():                       with R.dataflow():
>>> #     lv = R.add(x, x)                         gv = R.add(x, x)
>>> #     lv1 = lv                        ->       R.output(gv)
>>> #     gv = lv1                             return gv
>>> #     R.output(gv)
>>> # new_mod = CanonicalizeBindings()(mod)
"""
from __future__ import annotations

from tilecraft.tensorir import arith
from tilecraft.tensorir.function import IRModule

from ..analysis import struct_info_base_check
from ..expr import (DataflowBlock, DataflowVar, Expr, MatchCast, Var, VarBinding)
from .base import ExprMutator, Pass

__all__ = ["CanonicalizeBindings"]


class CanonicalizeBindings(Pass):
    """Replace copies and no-op ``match_cast``s by their source.

    Examples
    --------
    >>> new_mod = CanonicalizeBindings()(mod)   # doctest: +SKIP
    """

    name = "CanonicalizeBindings"

    def transform_module(self, mod: IRModule) -> IRModule:
        return _Canonicalizer(mod).visit_module()


def _source(b, ana) -> Expr | None:
    """The variable a binding copies, if it is a copy (or a match_cast that changes nothing)."""
    if isinstance(b, VarBinding) and isinstance(b.value, Var):
        return b.value
    if isinstance(b, MatchCast) and isinstance(b.value, Var):
        si = b.value.struct_info
        if struct_info_base_check(si, b.struct_info, ana) is True and \
                struct_info_base_check(b.struct_info, si, ana) is True:
            return b.value
    return None


def _precise_enough(var: Var, src: Var, ana) -> bool:
    """``src`` can stand for ``var``: it is known at least as precisely."""
    return struct_info_base_check(var.struct_info, src.struct_info, ana) is True


class _Canonicalizer(ExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.ana = arith.Analyzer()
        self.rename_def: dict[int, Var] = {}    # id(DataflowVar) -> output Var that takes its place
        self.drop: set[int] = set()             # ids of `gv = lv` bindings made redundant

    def visit_block(self, blk):
        if isinstance(blk, DataflowBlock):
            self._plan_output_renames(blk)
        return super().visit_block(blk)

    def _plan_output_renames(self, blk: DataflowBlock):
        """Find ``gv = lv`` with ``lv`` a DataflowVar of this block (following copy chains)."""
        local = {}
        for b in blk.bindings:
            if isinstance(b.var, DataflowVar):
                local[id(b.var)] = b
        for b in blk.bindings:
            if isinstance(b.var, DataflowVar):
                continue
            src = _source(b, self.ana)
            # follow lv1 = lv chains inside the block to the binding that computes the value
            while isinstance(src, DataflowVar) and id(src) in local:
                inner = _source(local[id(src)], self.ana)
                if not isinstance(inner, DataflowVar) or id(inner) not in local:
                    break
                src = inner
            if not isinstance(src, DataflowVar) or id(src) not in local or \
                    id(src) in self.rename_def or not _precise_enough(b.var, src, self.ana):
                continue
            self.rename_def[id(src)] = b.var
            self.var_remap[id(src)] = b.var
            self.drop.add(id(b))

    def visit_binding(self, b) -> None:
        if id(b) in self.drop:
            return
        target = self.rename_def.get(id(b.var))
        if target is not None:
            value = self.visit_expr(b.value)
            if isinstance(b, MatchCast):
                self.builder.append(MatchCast(target, value, b.struct_info))
            else:
                self.builder.append(VarBinding(target, value))
            return
        src = _source(b, self.ana)
        if src is not None:
            new_src = self.visit_expr(src)
            if isinstance(new_src, Var) and _precise_enough(b.var, new_src, self.ana) and \
                    (not isinstance(new_src, DataflowVar) or isinstance(b.var, DataflowVar)):
                self.var_remap[id(b.var)] = new_src
                return
        super().visit_binding(b)
