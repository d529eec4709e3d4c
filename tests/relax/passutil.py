"""Test helpers for the Relax printer, well-formedness checker and graph passes.

- Private operators ``ptest.*`` (registered here with ``register_op``) with numpy references,
  so these tests do not depend on the real operator set: ``add`` / ``sub`` / ``div`` (BROADCAST,
  rhs broadcast along trailing dims), ``relu`` / ``exp`` (ELEMWISE), ``matmul``
  (OUT_EWISE_FUSABLE), ``rowmax`` / ``rowsum`` (COMM_REDUCE over the last axis, keepdims),
  ``cumsum`` (OPAQUE, last axis), ``transpose`` (INJECTIVE, 2-d), ``shape_of`` (no
  legalization: a "VM builtin").
- ``run_module(mod, *inputs)``: a tiny evaluator of a Relax module on numpy arrays: operator calls
  run their numpy reference, ``call_tir`` runs the PrimFunc compiled with ``targets.build``,
  calls of Relax functions recurse, ``match_cast`` checks and binds symbolic dims.
"""
from __future__ import annotations

import numpy as np

from tilecraft import targets
from tilecraft.relax import (Call, Constant, Function, GlobalVar, If, MatchCast, PrimValue, ShapeExpr,
                   ShapeStructInfo, TensorStructInfo, Tuple, TupleGetItem, TupleStructInfo, Var)
from tilecraft.relax.op.base import Op, OpPattern, call, register_op
from tilecraft.tensorir import arith, te
from tilecraft.tensorir.expr import IntImm, Var as TirVar
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import substitute


# ---------------------------------------------------------------------------------------------
# private operators


def _binary_infer(c):
    a, b = c.args[0].struct_info, c.args[1].struct_info
    return TensorStructInfo(a.shape, a.dtype)


def _bcast_index(b, idx):
    """numpy broadcasting: ``b`` aligned with the trailing dims; its size-1 dims read index 0."""
    nb = len(b.shape)
    tail = idx[len(idx) - nb:]
    return tuple(0 if isinstance(d, IntImm) and d.value == 1 else i for d, i in zip(b.shape, tail))


def _binary_legalize(name, fn):
    def legalize(bb, c):
        def f(x, y):
            return te.compute(x.shape, lambda *i: fn(x[i], y[_bcast_index(y, i)]), name)
        return bb.call_te(f, c.args[0], c.args[1], primfunc_name_hint=name)
    return legalize


def _unary_legalize(name, fn):
    def legalize(bb, c):
        return bb.call_te(lambda x: te.compute(x.shape, lambda *i: fn(x[i]), name), c.args[0],
                          primfunc_name_hint=name)
    return legalize


def _same_infer(c):
    return c.args[0].struct_info


def _matmul_infer(c):
    a, b = c.args[0].struct_info, c.args[1].struct_info
    return TensorStructInfo((a.shape[0], b.shape[1]), a.dtype)


def _matmul_legalize(bb, c):
    def f(x, y):
        k = te.reduce_axis((0, x.shape[1]), "k")
        return te.compute((x.shape[0], y.shape[1]),
                          lambda i, j: te.sum(x[i, k] * y[k, j], axis=k), "matmul")
    return bb.call_te(f, c.args[0], c.args[1], primfunc_name_hint="matmul")


def _reduce_infer(c):
    a = c.args[0].struct_info
    return TensorStructInfo(tuple(a.shape[:-1]) + (1,), a.dtype)


def _reduce_legalize(name, combiner):
    def legalize(bb, c):
        def f(x):
            k = te.reduce_axis((0, x.shape[-1]), "k")
            return te.compute(tuple(x.shape[:-1]) + (1,),
                              lambda *i: combiner(x[tuple(i[:-1]) + (k,)], axis=k), name)
        return bb.call_te(f, c.args[0], primfunc_name_hint=name)
    return legalize


def _cumsum_legalize(bb, c):
    def f(x):
        n = x.shape[-1]
        k = te.reduce_axis((0, n), "k")
        return te.compute(x.shape, lambda *i: te.sum(x[tuple(i[:-1]) + (k,)], axis=k,
                                                     where=k <= i[-1]), "cumsum")
    return bb.call_te(f, c.args[0], primfunc_name_hint="cumsum")


def _transpose_infer(c):
    a = c.args[0].struct_info
    return TensorStructInfo((a.shape[1], a.shape[0]), a.dtype)


def _transpose_legalize(bb, c):
    return bb.call_te(lambda x: te.compute((x.shape[1], x.shape[0]), lambda i, j: x[j, i],
                                           "transpose"), c.args[0], primfunc_name_hint="transpose")


def _shape_of_infer(c):
    a = c.args[0].struct_info
    return ShapeStructInfo(a.shape)


def _pad_last(a, b):
    return b.reshape((1,) * (a.ndim - b.ndim) + b.shape)


REFERENCE = {
    "ptest.add": lambda a, b: a + _pad_last(a, b),
    "ptest.sub": lambda a, b: a - _pad_last(a, b),
    "ptest.div": lambda a, b: a / _pad_last(a, b),
    "ptest.relu": lambda a: np.maximum(a, 0).astype(a.dtype),
    "ptest.exp": lambda a: np.exp(a),
    "ptest.matmul": lambda a, b: a @ b,
    "ptest.rowmax": lambda a: a.max(axis=-1, keepdims=True),
    "ptest.rowsum": lambda a: a.sum(axis=-1, keepdims=True),
    "ptest.cumsum": lambda a: np.cumsum(a, axis=-1).astype(a.dtype),
    "ptest.transpose": lambda a: np.ascontiguousarray(a.T),
    "ptest.shape_of": lambda a: tuple(a.shape),
}

register_op("ptest.add", _binary_infer, _binary_legalize("add", lambda a, b: a + b),
            OpPattern.BROADCAST)
register_op("ptest.sub", _binary_infer, _binary_legalize("sub", lambda a, b: a - b),
            OpPattern.BROADCAST)
register_op("ptest.div", _binary_infer, _binary_legalize("div", lambda a, b: a / b),
            OpPattern.BROADCAST)
register_op("ptest.relu", _same_infer, _unary_legalize("relu", lambda a: te.maximum(a, 0.0)),
            OpPattern.ELEMWISE)
register_op("ptest.exp", _same_infer, _unary_legalize("exp", te.exp), OpPattern.ELEMWISE)
register_op("ptest.matmul", _matmul_infer, _matmul_legalize, OpPattern.OUT_EWISE_FUSABLE)
register_op("ptest.rowmax", _reduce_infer, _reduce_legalize("rowmax", te.max),
            OpPattern.COMM_REDUCE)
register_op("ptest.rowsum", _reduce_infer, _reduce_legalize("rowsum", te.sum),
            OpPattern.COMM_REDUCE)
register_op("ptest.cumsum", _same_infer, _cumsum_legalize, OpPattern.OPAQUE)
register_op("ptest.transpose", _transpose_infer, _transpose_legalize, OpPattern.INJECTIVE)
register_op("ptest.shape_of", _shape_of_infer, None, OpPattern.OPAQUE)


def add(a, b): return call("ptest.add", [a, b])
def sub(a, b): return call("ptest.sub", [a, b])
def div(a, b): return call("ptest.div", [a, b])
def relu(a): return call("ptest.relu", [a])
def exp(a): return call("ptest.exp", [a])
def matmul(a, b): return call("ptest.matmul", [a, b])
def rowmax(a): return call("ptest.rowmax", [a])
def rowsum(a): return call("ptest.rowsum", [a])
def cumsum(a): return call("ptest.cumsum", [a])
def transpose(a): return call("ptest.transpose", [a])
def shape_of(a): return call("ptest.shape_of", [a])


# ---------------------------------------------------------------------------------------------
# the evaluator

_BUILT: dict[int, tuple] = {}
STATS = {"kernels_run": 0}


def _build(func: PrimFunc):
    hit = _BUILT.get(id(func))
    if hit is None or hit[0] is not func:
        hit = (func, targets.build(func, "llvm"), func.attr_dict.get("global_symbol", "main"))
        _BUILT[id(func)] = hit
    return hit[1][hit[2]]


def _dim(d, env) -> int:
    v = arith.simplify(substitute(d, {k: IntImm(x, "int64") for k, x in env.items()}))
    if not isinstance(v, IntImm):
        raise AssertionError(f"cannot evaluate the dim {d!r} with {env}")
    return v.value


def _match(si, value, env, what):
    """Check ``value`` against ``si``, binding symbolic dims into ``env``."""
    if isinstance(si, TensorStructInfo):
        assert isinstance(value, np.ndarray), f"{what}: expected a tensor, got {type(value)}"
        assert str(value.dtype) == si.dtype, f"{what}: dtype {value.dtype} != {si.dtype}"
        if si.shape is None:
            return
        assert value.ndim == len(si.shape), f"{what}: rank {value.ndim} != {len(si.shape)}"
        for d, s in zip(si.shape, value.shape):
            if isinstance(d, TirVar) and d not in env:
                env[d] = s
            assert _dim(d, env) == s, f"{what}: dim {d!r} = {_dim(d, env)} but the value has {s}"
    elif isinstance(si, TupleStructInfo):
        for k, (f, v) in enumerate(zip(si.fields, value)):
            _match(f, v, env, f"{what}[{k}]")


def run_module(mod, *inputs, func: str = "main"):
    """Evaluate ``mod[func]`` on numpy ``inputs``; returns an array (or a list for a tuple)."""
    return _Evaluator(mod).call(mod[func], list(inputs))


class _Evaluator:
    def __init__(self, mod):
        self.mod = mod

    def call(self, f: Function, args):
        env: dict = {}
        values: dict[int, object] = {}
        assert len(args) == len(f.params), f"{len(f.params)} parameters, {len(args)} arguments"
        for p, a in zip(f.params, args):
            _match(p.struct_info, a, env, f"parameter {p.name_hint}")
            values[id(p)] = a
        out = self.seq(f.body, values, env)
        _match(f.ret_struct_info, out, env, "result")
        return out

    def seq(self, seq, values, env):
        from tilecraft.relax import SeqExpr
        if not isinstance(seq, SeqExpr):
            return self.expr(seq, values, env)
        for blk in seq.blocks:
            for b in blk.bindings:
                v = self.expr(b.value, values, env)
                if isinstance(b, MatchCast):
                    _match(b.struct_info, v, env, f"match_cast {b.var.name_hint}")
                values[id(b.var)] = v
        return self.expr(seq.body, values, env)

    def expr(self, e, values, env):
        if isinstance(e, Var):
            return values[id(e)]
        if isinstance(e, Constant):
            return e.data
        if isinstance(e, Tuple):
            return [self.expr(f, values, env) for f in e.fields]
        if isinstance(e, TupleGetItem):
            return self.expr(e.tuple_value, values, env)[e.index]
        if isinstance(e, ShapeExpr):
            return tuple(_dim(d, env) for d in e.values)
        if isinstance(e, PrimValue):
            return _dim(e.value, env)
        if isinstance(e, If):
            cond = self.expr(e.cond, values, env)
            return self.seq(e.true_branch if bool(np.asarray(cond)) else e.false_branch,
                            values, env)
        if isinstance(e, Call):
            if isinstance(e.op, Op) and e.op.name == "relax.call_tir":
                return self.call_tir(e, values, env)
            if isinstance(e.op, Op):
                args = [self.expr(a, values, env) for a in e.args]
                return REFERENCE[e.op.name](*args)
            if isinstance(e.op, GlobalVar):
                args = [self.expr(a, values, env) for a in e.args]
                return self.call(self.mod[e.op.name_hint], args)
        raise AssertionError(f"run_module cannot evaluate {type(e).__name__}: {e!r}")

    def call_tir(self, e, values, env):
        func = self.mod[e.args[0].name_hint]
        assert isinstance(func, PrimFunc), e.args[0].name_hint
        ins = [np.array(self.expr(a, values, env), order="C") for a in e.args[1].fields]
        out_si = e.sinfo_args[0]
        outs_si = list(out_si.fields) if isinstance(out_si, TupleStructInfo) else [out_si]
        tir_vals = [_dim(d, env) for d in e.args[2].values] if len(e.args) == 3 else []
        outs = [np.full(tuple(_dim(d, env) for d in s.shape), np.nan, dtype=s.dtype)
                for s in outs_si]
        _build(func)(*ins, *outs, *tir_vals)
        STATS["kernels_run"] += 1
        return outs[0] if len(outs) == 1 else outs
