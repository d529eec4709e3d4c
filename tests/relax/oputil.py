"""Test helper: run one Relax operator through its legalization, without the VM.

``run_op(make, inputs)`` builds ``make(*vars)`` on Vars of the inputs' struct infos (dims can be
given symbolic), legalizes the call with the operator's own ``legalize``, compiles every PrimFunc
it produced with ``targets.build`` (and checks it with ``tensorir.interpret``), and evaluates the
bindings on the numpy inputs. It returns numpy output(s) and the inferred struct info.
"""
from __future__ import annotations

import numpy as np

from tilecraft import targets
from tilecraft.relax import (BlockBuilder, Call, Constant, Expr, GlobalVar, ShapeExpr, TensorStructInfo,
                   Tuple, TupleGetItem, TupleStructInfo, Var)
from tilecraft.relax.op.base import Op
from tilecraft.tensorir.expr import IntImm, Var as TirVar
from tilecraft.tensorir.functor import substitute
from tilecraft.tensorir.interpret import interpret


def _bind_shape(dims, shape, env):
    for d, s in zip(dims, shape):
        if isinstance(d, TirVar) and d not in env:
            env[d] = s


def _eval_dim(d, env):
    from tilecraft.tensorir import arith
    v = arith.simplify(substitute(d, {k: IntImm(val, "int64") for k, val in env.items()}))
    if not isinstance(v, IntImm):
        raise AssertionError(f"cannot evaluate dim {d!r} with {env}")
    return v.value


def run_op(make, inputs, symbolic: bool | list = False, check_interpret: bool = True):
    """``make(*vars) -> Expr`` of one operator call; ``inputs`` numpy arrays (or Relax exprs such as
    constants, passed through). ``symbolic=True`` makes every dim of every input symbolic (a list
    of booleans chooses per input). Returns ``(outputs, struct_info)``; outputs is one array or a
    list for tuple results."""
    bb = BlockBuilder()
    params, env = [], {}
    flags = symbolic if isinstance(symbolic, list) else [symbolic] * len(inputs)
    args = []
    for k, (x, sym) in enumerate(zip(inputs, flags)):
        if isinstance(x, Expr):
            args.append(x)
            continue
        x = np.asarray(x)
        shape = tuple(f"d{k}_{i}" for i in range(x.ndim)) if sym else x.shape
        v = Var(f"x{k}", TensorStructInfo(shape, str(x.dtype)))
        _bind_shape(v.struct_info.shape, x.shape, env)
        params.append((v, x))
        args.append(v)
    with bb.function("main", [p for p, _ in params]):
        call = make(*args)
        sinfo = call.struct_info
        assert isinstance(call, Call) and isinstance(call.op, Op), call
        legal = call.op.legalize
        assert legal is not None, f"{call.op.name} has no legalization"
        result = legal(bb, call)
        out = bb.emit(result)
        bb.emit_func_output(out)
    mod = bb.get()
    values = {id(p): x for p, x in params}
    bindings = [b for blk in mod["main"].body.blocks for b in blk.bindings]
    for b in bindings:
        values[id(b.var)] = _eval(b.value, values, mod, env, check_interpret)
    res = _eval(mod["main"].body.body, values, mod, env, check_interpret)
    return res, sinfo


def _eval(e, values, mod, env, check_interpret):
    if isinstance(e, Var):
        return values[id(e)]
    if isinstance(e, Constant):
        return e.data
    if isinstance(e, Tuple):
        return [_eval(f, values, mod, env, check_interpret) for f in e.fields]
    if isinstance(e, TupleGetItem):
        return _eval(e.tuple_value, values, mod, env, check_interpret)[e.index]
    if isinstance(e, Call) and isinstance(e.op, Op) and e.op.name == "relax.call_tir":
        gvar, tup = e.args[0], e.args[1]
        ins = [np.require(_eval(a, values, mod, env, check_interpret), requirements='C')
               for a in tup.fields]
        func = mod[gvar.name_hint]
        # bind symbolic dims from the argument shapes of this PrimFunc's own buffers
        local = dict(env)
        for buf, x in zip(func.buffers, ins):
            _bind_shape(buf.shape, x.shape, local)
        out_si = e.sinfo_args[0]
        outs_si = list(out_si.fields) if isinstance(out_si, TupleStructInfo) else [out_si]
        tir_vals = []
        if len(e.args) == 3:
            tir_vals = [_eval_dim(d, local) for d in e.args[2].values]
        for p, v in zip(func.scalar_params, tir_vals):
            local[p] = v
        outs = [np.full(tuple(_eval_dim(d, local) for d in s.shape),
                        np.nan if s.dtype.startswith("float") else 0, dtype=s.dtype)
                for s in outs_si]
        targets.build(func, "llvm")[gvar.name_hint](*ins, *outs, *tir_vals)
        if check_interpret:
            ref = [np.full_like(o, 0) for o in outs]
            interpret(func, *ins, *ref, *tir_vals)
            for a, b in zip(outs, ref):
                if a.dtype.kind == "f":
                    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
                else:
                    np.testing.assert_array_equal(a, b)
        return outs[0] if len(outs) == 1 else outs
    raise AssertionError(f"run_op cannot evaluate {type(e).__name__}: {e!r}")
