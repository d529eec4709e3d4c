"""The Relax well-formedness checker and the analysis helpers the passes use."""
import numpy as np
import pytest

from tilecraft.relax import (BindingBlock, BlockBuilder, Call, DataflowBlock, DataflowVar, Function,
                   GlobalVar, MatchCast, RelaxError, SeqExpr, ShapeExpr, TensorStructInfo, Var,
                   VarBinding, call_tir, const)
from tilecraft.relax.analysis import (all_global_vars, all_vars, bound_vars, check_well_formed,
                            derive_call_ret_struct_info, free_vars, get_var2val,
                            struct_info_base_check, udchain, well_formed)
from tilecraft.relax.op.base import Op
from tilecraft.relax.struct_info import FuncStructInfo, ObjectStructInfo, ShapeStructInfo
from tilecraft.relax.transform import LegalizeOps
from tilecraft.tensorir.expr import IntImm, Var as TirVar
from tilecraft.tensorir.function import IRModule

from passutil import exp, relu


def T(shape, dtype="float32"):
    return TensorStructInfo(shape, dtype)


def func(params, blocks, body, name="main"):
    return Function(params, SeqExpr(blocks, body), attrs={"global_symbol": name})


def legal_module():
    bb = BlockBuilder()
    x = Var("x", T(("n", 4)))
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(exp(x))
            gv = bb.emit_output(relu(lv))
        bb.emit_func_output(gv)
    return LegalizeOps()(bb.get())


def expect(mod_or_func, *patterns):
    assert not well_formed(mod_or_func)
    with pytest.raises(RelaxError) as info:
        check_well_formed(mod_or_func)
    for p in patterns:
        assert p in str(info.value), str(info.value)


def test_well_formed_modules():
    mod = legal_module()
    assert well_formed(mod)
    check_well_formed(mod["main"])      # a function alone (module checks skipped)


def test_use_before_definition():
    x = Var("x", T((4,)))
    lv, lv1 = Var("lv", T((4,))), Var("lv1", T((4,)))
    f = func([x], [BindingBlock([VarBinding(lv1, exp(lv)), VarBinding(lv, exp(x))])], lv1)
    expect(f, "function main", "variable lv is used before it is defined")
    expect(func([], [], Var("ghost", T((4,)))), "variable ghost is used before")


def test_defined_twice():
    x = Var("x", T((4,)))
    lv = Var("lv", T((4,)))
    f = func([x], [BindingBlock([VarBinding(lv, exp(x)), VarBinding(lv, exp(lv))])], lv)
    expect(f, "variable lv is defined twice")
    # the same Var in two functions of a module
    g = func([x], [], x, name="g")
    expect(IRModule({"main": func([x], [], x), "g": g}), "variable x is defined twice",
           "first in function main")


def test_dataflow_var_scoping():
    x = Var("x", T((4,)))
    lv = DataflowVar("lv", T((4,)))
    f = func([x], [DataflowBlock([VarBinding(lv, exp(x))])], lv)
    expect(f, "the dataflow variable lv is used outside its dataflow block")
    lv2 = DataflowVar("lv2", T((4,)))
    f2 = func([x], [BindingBlock([VarBinding(lv2, exp(x))])], lv2)
    expect(f2, "the DataflowVar lv2 is bound outside a dataflow block")
    p = DataflowVar("p", T((4,)))
    expect(func([p], [], p), "parameter p is a DataflowVar")


def test_call_tir_targets():
    mod = legal_module()
    main = mod["main"]
    # the callee is missing
    missing = IRModule({"main": main, "relu": mod["relu"]})
    expect(missing, "call_tir calls exp, which is not in the module")
    # the callee is a Relax function
    x = Var("x", T((4,)))
    gv = Var("gv", T((4,)))
    relax_callee = func([Var("y", T((4,)))], [], Var("z", T((4,))), name="f")
    f = func([x], [BindingBlock([VarBinding(gv, call_tir(GlobalVar("f"), [x], T((4,))))])], gv)
    expect(IRModule({"main": f, "f": relax_callee}), "call_tir calls f, which is a Function, "
           "not a PrimFunc")
    # wrong number of arguments for the kernel
    x2, gv2 = Var("x", T(("n", 4))), Var("gv", T(("n", 4)))
    bad = func([x2], [BindingBlock([VarBinding(gv2, call_tir(GlobalVar("exp"), [x2, x2],
                                                             T((x2.shape[0], 4))))])], gv2)
    expect(IRModule({"main": bad, "exp": mod["exp"]}),
           "call_tir of exp passes 2 arguments and 1 outputs, but the PrimFunc takes 2 buffers")
    # wrong dtype for a buffer
    x3 = Var("x", T(("n", 4), "float16"))
    gv3 = Var("gv", T(("n", 4)))
    bad = func([x3], [BindingBlock([VarBinding(gv3, call_tir(GlobalVar("exp"), [x3],
                                                             T((x3.shape[0], 4))))])], gv3)
    expect(IRModule({"main": bad, "exp": mod["exp"]}), "buffer x is 2-d float32 but gets")


def test_global_var_missing_and_direct_primfunc_call():
    x = Var("x", T((4,)))
    gv = Var("gv", T((4,)))
    f = func([x], [BindingBlock([VarBinding(gv, Call(GlobalVar("nowhere"), [x],
                                                     struct_info=T((4,))))])], gv)
    expect(IRModule({"main": f}), "refers to the function nowhere, which is not in the module")
    mod = legal_module()
    g = Var("g", T((4,)))
    direct = func([x], [BindingBlock([VarBinding(g, Call(GlobalVar("exp"), [x],
                                                         struct_info=T((4,))))])], g)
    expect(IRModule({"main": direct, "exp": mod["exp"]}), "the PrimFunc exp is called directly")


def test_struct_info_consistency():
    x = Var("x", T((4, 5)))
    # a call whose recorded struct info disagrees with what the operator infers
    wrong = Call(Op.get("ptest.exp"), [x], struct_info=T((4, 6)))
    lv = Var("lv", T((4, 6)))
    expect(func([x], [BindingBlock([VarBinding(lv, wrong)])], lv),
           "has struct info R.Tensor((4, 6), \"float32\") but ptest.exp infers "
           "R.Tensor((4, 5), \"float32\")")
    # a variable annotated with something its value is not
    lv2 = Var("lv2", T((4, 5), "float16"))
    expect(func([x], [BindingBlock([VarBinding(lv2, exp(x))])], lv2),
           "variable lv2 is annotated")
    # the body contradicts the declared return struct info
    f = Function([x], SeqExpr([], x), ret_struct_info=T((3,)), attrs={"global_symbol": "main"})
    expect(f, "contradicts the declared return struct info")


def test_match_cast_only_narrows():
    x = Var("x", TensorStructInfo(ndim=2, dtype="float32"))
    ok = Var("ok", T(("m", 4)))
    assert well_formed(func([x], [BindingBlock([MatchCast(ok, x, ok.struct_info)])], ok))
    bad = Var("bad", T(("m", 4), "int32"))
    expect(func([x], [BindingBlock([MatchCast(bad, x, bad.struct_info)])], bad),
           "match_cast of bad can never succeed")
    y = Var("y", T((4, 4)))
    bad2 = Var("bad2", T((4, 5)))
    expect(func([y], [BindingBlock([MatchCast(bad2, y, bad2.struct_info)])], bad2),
           "match_cast of bad2 can never succeed")
    rank = Var("rank", T((4,)))
    expect(func([y], [BindingBlock([MatchCast(rank, y, rank.struct_info)])], rank),
           "can never succeed")


def test_symbolic_vars_must_be_defined():
    x = Var("x", T(("n", 4)))
    k = TirVar("k", "int64")
    s = Var("s", ShapeStructInfo([k]))
    expect(func([x], [BindingBlock([VarBinding(s, ShapeExpr([k]))])], s),
           "the symbolic variable k is used", "no parameter or match_cast defines it")
    n = x.shape[0]
    s2 = Var("s2", ShapeStructInfo([n * 2]))
    assert well_formed(func([x], [BindingBlock([VarBinding(s2, ShapeExpr([n * 2]))])], s2))


def test_not_a_module():
    with pytest.raises(RelaxError, match="expects an IRModule or a relax Function"):
        check_well_formed(const(np.ones(3, "float32")))


# ---------------------------------------------------------------------------------------------
# helpers


def test_var_helpers_and_use_def():
    mod = legal_module()
    main = mod["main"]
    x = main.params[0]
    blk = main.body.blocks[0]
    lv, gv = blk.bindings[0].var, blk.bindings[1].var
    assert free_vars(main) == [] and free_vars(blk.bindings[1].value) == [lv]
    assert bound_vars(main) == [x, lv, gv]
    assert all_vars(main) == [x, lv, gv]
    assert [g.name_hint for g in all_global_vars(main)] == ["exp", "relu"]
    assert get_var2val(main)[lv] is blk.bindings[0].value
    chain = udchain(main)
    assert chain[x] == [lv] and chain[lv] == [gv] and chain[gv] == [None]
    assert udchain(blk)[gv] == []


def test_struct_info_base_check_and_derive():
    n = TirVar("n", "int64")
    assert struct_info_base_check(ObjectStructInfo(), T((4,))) is True
    assert struct_info_base_check(TensorStructInfo(ndim=2), T((n, 4))) is True
    assert struct_info_base_check(T((n, 4)), T((n, 4))) is True
    assert struct_info_base_check(T((4, 4)), T((4, 5))) is False
    assert struct_info_base_check(T((n, 4)), T((TirVar("m", "int64"), 4))) is None
    assert struct_info_base_check(T((n, 4)), TensorStructInfo(ndim=2)) is None
    assert struct_info_base_check(T((4,)), ShapeStructInfo([4])) is False
    # f(a: (n, 4)) -> (n * 2,), called on a (8, 4) tensor: (16,)
    fsi = FuncStructInfo([T((n, 4))], T((n * 2,)))
    arg = Var("a", T((8, 4)))
    c = Call(Var("f", fsi), [arg])
    ret = derive_call_ret_struct_info(fsi, c)
    assert isinstance(ret.shape[0], IntImm) and ret.shape[0].value == 16
    # a return dim no argument determines becomes unknown
    k = TirVar("k", "int64")
    fsi2 = FuncStructInfo([T((n, 4))], T((k,)))
    assert derive_call_ret_struct_info(fsi2, Call(Var("g", fsi2), [arg])).shape is None
    # operator calls: the operator's own inference
    assert derive_call_ret_struct_info(None, exp(arg)) == T((8, 4))
