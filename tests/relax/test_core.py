"""Relax core: struct info, expressions, the op registry, BlockBuilder and emit_te."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft.relax import (BlockBuilder, DataflowVar, RelaxError, ShapeExpr, TensorStructInfo,
                   TupleStructInfo, Var, const)
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import IntImm, Var as TirVar
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.structural import structural_equal


def test_struct_info_shapes():
    s = TensorStructInfo(("n", 768), "float32")
    assert s.ndim == 2 and isinstance(s.shape[0], TirVar) and s.shape[1].value == 768
    assert not s.is_static
    assert TensorStructInfo((2, 3)).static_shape() == (2, 3)
    assert TensorStructInfo(None, "int64", ndim=3).shape is None
    with pytest.raises(Exception, match="negative"):
        TensorStructInfo((-1, 3))
    assert TensorStructInfo((2, 3), "float32") == TensorStructInfo((2, 3), "float32")


def test_const_and_shape_expr():
    c = const(np.arange(6, dtype="int32").reshape(2, 3))
    assert c.struct_info == TensorStructInfo((2, 3), "int32")
    assert const(1.5).dtype == "float32"
    with pytest.raises(ValueError):
        c.data[0, 0] = 5  # constants are read-only
    s = ShapeExpr((4, "n"))
    assert s.struct_info.ndim == 2


def _double(a):
    return te.compute(a.shape, lambda *i: a[i] * 2.0, "double")


def test_block_builder_emit_te_and_dedup():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_te(_double, x)
            z = bb.emit_te(_double, y)
            assert isinstance(y, DataflowVar)
            gv = bb.emit_output(z)
        bb.emit_func_output(gv)
    mod = bb.get()
    prims = [n for n, f in mod.functions.items() if isinstance(f, PrimFunc)]
    assert prims == ["_double"]  # named after the te function; the identical kernel is shared
    assert mod["main"].ret_struct_info == x.struct_info
    assert mod["_double"].attr_dict["global_symbol"] == "_double"


def test_emit_te_tuple_outputs_and_tir_vars():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((6,), "float32"))
    m = TirVar("m", "int64")

    def two(a):
        b = te.compute((3,), lambda i: a[i], "lo")
        c = te.compute((3,), lambda i: a[i + 3], "hi")
        return [b, c]

    def make_m(a):
        return te.compute((m,), lambda i: a[0] + 0.0, "bcast")

    with bb.function("main", [x]):
        t = bb.emit_te(two, x)
        assert isinstance(t.struct_info, TupleStructInfo) and len(t.struct_info.fields) == 2
        w = bb.emit_te(make_m, x)
        call = bb.lookup_binding(w)
        assert len(call.args) == 3 and call.args[2].values[0] is m  # m passed as a tir var
        bb.emit_func_output(w)
    assert bb.get()["make_m"].scalar_params == [m]


def test_dataflow_var_escaping_is_an_error():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((4,), "float32"))
    with pytest.raises(RelaxError, match="outside its dataflow block"):
        with bb.function("main", [x]):
            with bb.dataflow():
                y = bb.emit_te(_double, x)
            bb.emit_func_output(y)


def test_builder_misuse_errors():
    bb = BlockBuilder()
    with pytest.raises(RelaxError, match="inside"):
        bb.emit(const(1.0))
    x = Var("x", TensorStructInfo((4,), "float32"))
    with pytest.raises(RelaxError, match="emit_func_output was not called"):
        with bb.function("f", [x]):
            pass
    with pytest.raises(RelaxError, match="not a relax.Var"):
        with bb.function("g", ["x"]):
            pass


def test_structural_equality_maps_bound_vars():
    def build(name):
        bb = BlockBuilder()
        x = Var(name, TensorStructInfo((4,), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                gv = bb.emit_output(bb.emit_te(_double, x))
            bb.emit_func_output(gv)
        return bb.get()["main"]
    assert structural_equal(build("x"), build("x"))
