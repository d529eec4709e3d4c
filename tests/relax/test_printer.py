"""The Relax printer: TVMScript-like text of functions, mixed modules and loose expressions."""
import numpy as np

from tilecraft import relax
from tilecraft.relax import (BlockBuilder, Call, ExternFunc, Function, If, MatchCast,
                   PrimValue, SeqExpr, ShapeExpr, StringImm, TensorStructInfo, Tuple,
                   TupleGetItem, TupleStructInfo, Var, VarBinding, const)
from tilecraft.relax.op.base import call
from tilecraft.relax.printer import module_script, to_script
from tilecraft.relax.struct_info import (FuncStructInfo, ObjectStructInfo, PrimStructInfo,
                               ShapeStructInfo)
from tilecraft.relax.transform import FuseOps, LegalizeOps
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import Var as TirVar
from tilecraft.tensorir.function import IRModule
from tilecraft.tensorir.script import to_script as tir_to_script

from passutil import add, exp, matmul, relu


def T(shape, dtype="float32"):
    return TensorStructInfo(shape, dtype)


def _module():
    bb = BlockBuilder()
    x = Var("x", T(("n", 768)))
    y = Var("y", T((768,)))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            lv = bb.emit(add(x, y))
            gv = bb.emit_output(relu(lv))
        bb.emit_func_output(gv)
    return bb.get()


def test_function_text():
    text = to_script(_module()["main"])
    assert text == "\n".join([
        '@R.function',
        'def main(x: R.Tensor((n, 768), "float32"), y: R.Tensor((768,), "float32")) '
        '-> R.Tensor((n, 768), "float32"):',
        '    n = T.int64()',
        '    with R.dataflow():',
        '        lv: R.Tensor((n, 768), "float32") = ptest.add(x, y)',
        '        gv: R.Tensor((n, 768), "float32") = ptest.relu(lv)',
        '        R.output(gv)',
        '    return gv',
    ])
    # Expr.script() and repr go through the same printer
    assert _module()["main"].script() == text


def test_mixed_module_prints_primfuncs_and_call_tir():
    mod = LegalizeOps()(_module())
    text = to_script(mod)
    assert text.startswith("@I.ir_module\nclass Module:\n")
    assert ('lv: R.Tensor((n, 768), "float32") = R.call_tir(cls.add, (x, y), '
            'out_sinfo=R.Tensor((n, 768), "float32"))') in text
    # each PrimFunc is printed as tensorir prints it, indented into the class
    for name in ("add", "relu"):
        ptext = tir_to_script(mod[name])
        assert "\n".join("    " + line for line in ptext.splitlines()) in text
    assert module_script(mod) == text
    # the module's own script() (tensorir's printer) also shows the Relax function
    assert "R.call_tir(" in mod.script()


def test_fused_module_private_functions_and_attrs():
    bb = BlockBuilder()
    x = Var("x", T(("n", 16)))
    w = Var("w", T((16, 8)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            gv = bb.emit_output(relu(bb.emit(matmul(x, w))))
        bb.emit_func_output(gv)
    text = to_script(FuseOps()(LegalizeOps()(bb.get())))
    assert "    @R.function(private=True)\n    def fused_matmul_relu(x: R.Tensor((n, 16), " \
           "\"float32\"), w: R.Tensor((16, 8), \"float32\")) -> R.Tensor((n, 8), \"float32\"):" \
           "\n        n = T.int64()\n        R.func_attr({\"Primitive\": 1})" in text
    assert 'gv: R.Tensor((n, 8), "float32") = cls.fused_matmul_relu(x, w)' in text


def test_constants_metadata_and_scalars():
    c = np.arange(6, dtype="float32").reshape(2, 3)
    big = np.ones((16, 16), "float16")
    bb = BlockBuilder()
    x = Var("x", T((2, 3)))
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(add(x, const(c)))
            lv1 = bb.emit(add(lv, const(c)))       # an equal constant, another object
            lv2 = bb.emit(add(lv1, const(2.5)))
            gv = bb.emit_output(Tuple([lv2, const(big)]))
        bb.emit_func_output(gv)
    text = to_script(bb.get())
    assert 'ptest.add(x, metadata["relax.expr.Constant"][0])' in text
    assert 'ptest.add(lv, metadata["relax.expr.Constant"][1])' in text
    assert 'ptest.add(lv1, R.const(2.5, "float32"))' in text
    assert ('#   metadata["relax.expr.Constant"][0]: R.Tensor((2, 3), "float32") = '
            '[[0., 1., 2.], [3., 4., 5.]]') in text
    assert '#   metadata["relax.expr.Constant"][2]: R.Tensor((16, 16), "float16")\n' in text + "\n"
    assert len([ln for ln in text.splitlines() if ln.startswith("#   metadata")]) == 3
    # one constant used twice keeps one index
    k = const(c)
    e = Tuple([k, k])
    assert to_script(e).startswith('(metadata["relax.expr.Constant"][0], '
                                   'metadata["relax.expr.Constant"][0])')


def test_match_cast_tuple_if_shapes_and_calls():
    x = Var("x", TensorStructInfo(ndim=2))
    m = TirVar("m", "int64")
    cast = Var("lv", T((m, 4)))
    t = Var("t", TupleStructInfo([T((m, 4)), T((m, 4))]))
    item = Var("lv", T((m, 4)))
    cond = Var("c", T((), "bool"))
    tb = SeqExpr([], item)
    fb_var = Var("y", T((m, 4)))
    fb = SeqExpr([relax.BindingBlock([VarBinding(fb_var, relu(item))])], fb_var)
    res = Var("res", T((m, 4)))
    packed = Var("p", ObjectStructInfo())
    shp = Var("s", ShapeStructInfo([m, 4]))
    body = SeqExpr([relax.BindingBlock([
        MatchCast(cast, x, T((m, 4))),
        VarBinding(t, Tuple([cast, cast])),
        VarBinding(item, TupleGetItem(t, 1)),
        VarBinding(res, If(cond, tb, fb)),
        VarBinding(packed, Call(ExternFunc("vm.builtin.print"), [res, StringImm("hi")],
                                sinfo_args=[ObjectStructInfo()])),
        VarBinding(shp, ShapeExpr([m, 4])),
    ])], Tuple([res, shp, PrimValue(m)]))
    f = Function([x, cond], body, attrs={"global_symbol": "f"})
    text = to_script(f)
    assert 'def f(x: R.Tensor(ndim=2, dtype="float32"), c: R.Tensor((), "bool")) -> ' \
           'R.Tuple(R.Tensor((m, 4), "float32"), R.Shape([m, 4]), R.Prim(value=m)):' in text
    assert '    m = T.int64()' in text
    assert '    lv: R.Tensor((m, 4), "float32") = R.match_cast(x, R.Tensor((m, 4), "float32"))' \
        in text
    assert '    t: R.Tuple(R.Tensor((m, 4), "float32"), R.Tensor((m, 4), "float32")) = (lv, lv)' \
        in text
    # two variables named lv: the second is renamed
    assert '    lv_1: R.Tensor((m, 4), "float32") = t[1]' in text
    assert "\n".join([
        '    if c:',
        '        res: R.Tensor((m, 4), "float32") = lv_1',
        '    else:',
        '        y: R.Tensor((m, 4), "float32") = ptest.relu(lv_1)',
        '        res: R.Tensor((m, 4), "float32") = y',
    ]) in text
    assert 'p: R.Object = R.call_packed("vm.builtin.print", res, R.str("hi"), ' \
           'sinfo_args=(R.Object,))' in text
    assert 's: R.Shape([m, 4]) = R.shape([m, 4])' in text
    assert text.endswith("    return (res, s, R.prim_value(m))")


def test_call_tir_tir_vars_multiple_outputs_and_attrs():
    def two(a):
        return [te.compute((3,), lambda i: a[i], "lo"), te.compute((3,), lambda i: a[i + 3], "hi")]

    m = TirVar("m", "int64")

    def make_m(a):
        return te.compute((m,), lambda i: a[0] + 0.0, "bcast")

    bb = BlockBuilder()
    x = Var("x", T((6,)))
    with bb.function("main", [x], attrs={"num_input": 1}):
        t = bb.emit_te(two, x)
        w = bb.emit_te(make_m, x)
        a = bb.emit(call("ptest.relu", [x], {"alpha": 0.5, "axes": (1, 2), "mode": "fast"}))
        bb.emit_func_output(Tuple([t, w, a]))
    text = to_script(bb.get())
    assert ('R.call_tir(cls.two, (x,), out_sinfo=[R.Tensor((3,), "float32"), '
            'R.Tensor((3,), "float32")])') in text
    assert ('R.call_tir(cls.make_m, (x,), out_sinfo=R.Tensor((m,), "float32"), '
            'tir_vars=R.shape([m]))') in text
    assert 'ptest.relu(x, alpha=0.5, axes=[1, 2], mode="fast")' in text
    assert 'R.func_attr({"num_input": 1})' in text


def test_names_and_reserved_words():
    n = TirVar("n", "int64")
    p = Var("n", T((n,)))          # a parameter named like a dim
    q = Var("R", T((n,)))          # a reserved name
    f = Function([p, q], SeqExpr([], Tuple([p, q])), attrs={"global_symbol": "main"})
    text = to_script(f)
    assert 'def main(n_1: R.Tensor((n,), "float32"), R_1: R.Tensor((n,), "float32"))' in text
    assert text.endswith("return (n_1, R_1)")


def test_loose_expressions_struct_infos_and_repr():
    x = Var("x", T((2, 3)))
    assert to_script(Tuple([x, x])) == "(x, x)"
    assert repr(x) == "x"
    assert to_script(TupleGetItem(Tuple([x]), 0)) == "(x,)[0]"
    assert to_script(T(("n", 4))) == 'R.Tensor((n, 4), "float32")'
    assert to_script(TensorStructInfo(None, "int8")) == 'R.Tensor(dtype="int8")'
    assert to_script(ShapeStructInfo(ndim=3)) == "R.Shape(ndim=3)"
    assert to_script(PrimStructInfo("float32")) == 'R.Prim("float32")'
    assert to_script(FuncStructInfo([T((4,))], T((4,)))) == \
        'R.Callable((R.Tensor((4,), "float32"),), R.Tensor((4,), "float32"))'
    b = VarBinding(Var("y", T((2, 3))), exp(x))
    assert to_script(b) == 'y: R.Tensor((2, 3), "float32") = ptest.exp(x)'
    assert to_script(IRModule({})) == "@I.ir_module\nclass Module:\n    pass"
