"""``DeadCodeElimination``: drop bindings nobody uses and functions nobody calls.

- A binding whose variable is not used is removed when its value is pure: everything in a
  dataflow block is; outside one, operator calls (``call_tir`` included), tuples, constants,
  shapes and variables are, while calls of other functions, ``call_packed`` and ``match_cast``
  (a run-time check) are kept. A ``match_cast`` that defines symbolic dims is kept anywhere.
- Empty blocks disappear.
- Functions not reachable from an entry function are removed: entries are the Relax functions
  with a ``global_symbol`` (what ``BlockBuilder.function`` makes) or named ``main``, plus those
  named in ``entry_functions``. A module without Relax functions is left as it is.

Examples
--------
>>> # lv = R.add(x, x)   # unused
>>> # gv = R.multiply(x, x); return gv        ->  only gv's binding stays
>>> # new_mod = DeadCodeElimination()(mod)
"""
from __future__ import annotations

from typing import Iterable

from tilecraft.tensorir.function import IRModule

from ..analysis import all_global_vars, free_vars, tir_vars_in
from ..expr import (Call, Constant, DataflowBlock, ExternFunc, Function, GlobalVar,
                    If, MatchCast, PrimValue, SeqExpr, ShapeExpr, StringImm, Tuple, TupleGetItem,
                    Var, VarBinding)
from ..op.base import Op
from .base import Pass

__all__ = ["DeadCodeElimination", "IMPURE_OPS"]

# operators with side effects: their unused results are still computed
IMPURE_OPS = {"relax.print", "relax.assert_op", "relax.call_packed", "relax.call_builtin_with_ctx"}


class DeadCodeElimination(Pass):
    """Remove unused pure bindings and unreachable functions.

    Parameters
    ----------
    entry_functions : iterable of str, optional
        More functions to keep (besides those with a ``global_symbol`` and ``main``).

    Examples
    --------
    >>> new_mod = DeadCodeElimination()(mod)   # doctest: +SKIP
    """

    name = "DeadCodeElimination"

    def __init__(self, entry_functions: Iterable[str] | None = None):
        self.entry_functions = list(entry_functions or ())

    def transform_module(self, mod: IRModule) -> IRModule:
        funcs = {}
        for name, f in mod.functions.items():
            funcs[name] = _dce_function(f) if isinstance(f, Function) else f
        relax_funcs = [n for n, f in funcs.items() if isinstance(f, Function)]
        if not relax_funcs:
            return IRModule(funcs) if any(funcs[n] is not mod.functions[n] for n in funcs) else mod
        entries = [n for n in relax_funcs if "global_symbol" in funcs[n].attr_dict or n == "main"]
        entries += [n for n in self.entry_functions if n in funcs]
        live: set[str] = set()
        work = list(entries)
        while work:
            name = work.pop()
            if name in live or name not in funcs:
                continue
            live.add(name)
            f = funcs[name]
            if isinstance(f, Function):
                work.extend(g.name_hint for g in all_global_vars(f))
        new = {n: f for n, f in funcs.items() if n in live}
        if len(new) == len(mod.functions) and all(new[n] is mod.functions[n] for n in new):
            return mod
        return IRModule(new)


def _dce_function(f: Function) -> Function:
    param_dims = {id(v) for p in f.params for v in tir_vars_in(p.struct_info)}
    body = _dce_expr(f.body, param_dims)
    return f if body is f.body else f.replace(body=body)


def _is_pure(value, in_dataflow: bool) -> bool:
    if in_dataflow:
        return True
    if isinstance(value, (Var, Constant, ShapeExpr, PrimValue, StringImm, GlobalVar, ExternFunc,
                          Function, Tuple, TupleGetItem)):
        return True
    if isinstance(value, Call):
        return isinstance(value.op, Op) and value.op.name not in IMPURE_OPS
    return False


def _dce_expr(e, param_dims: set):
    if isinstance(e, SeqExpr):
        return _dce_seq(e, param_dims)
    if isinstance(e, If):
        tb = _dce_expr(e.true_branch, param_dims)
        fb = _dce_expr(e.false_branch, param_dims)
        if tb is e.true_branch and fb is e.false_branch:
            return e
        return If(e.cond, tb, fb, e.struct_info)
    if isinstance(e, Function):
        return _dce_function(e)
    return e


def _dce_seq(seq: SeqExpr, param_dims: set) -> SeqExpr:
    live: set[int] = {id(v) for v in free_vars(seq.body)}
    keep_alive = list(free_vars(seq.body))
    new_blocks = []
    changed = False
    for blk in reversed(seq.blocks):
        in_df = isinstance(blk, DataflowBlock)
        kept = []
        for b in reversed(blk.bindings):
            used = id(b.var) in live
            defines_dims = isinstance(b, MatchCast) and any(
                id(v) not in param_dims for v in tir_vars_in(b.struct_info))
            removable = not used and not defines_dims and (
                in_df or (isinstance(b, VarBinding) and _is_pure(b.value, False)))
            if removable:
                changed = True
                continue
            value = _dce_expr(b.value, param_dims)
            if value is not b.value:
                changed = True
                b = VarBinding(b.var, value) if isinstance(b, VarBinding) else \
                    MatchCast(b.var, value, b.struct_info)
            for v in free_vars(value):
                live.add(id(v))
                keep_alive.append(v)
            kept.append(b)
        kept.reverse()
        if not kept:
            changed = True
            continue
        if len(kept) != len(blk.bindings) or any(a is not c for a, c in zip(kept, blk.bindings)):
            new_blocks.append(type(blk)(kept))
        else:
            new_blocks.append(blk)
    if not changed:
        return seq
    new_blocks.reverse()
    return SeqExpr(new_blocks, seq.body)
