"""The dynamic-shape Relax operator the ONNX frontend added: relax.op.tensor_to_shape."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets
from tilecraft import tensorir
from tilecraft.relax import BlockBuilder, ShapeStructInfo, TensorStructInfo, Var, op


def _reshape_by_tensor():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n",), "float32"))
    s = Var("s", TensorStructInfo((2,), "int64"))
    a, b = tensorir.var("a"), tensorir.var("b")
    with bb.function("main", [x, s]):
        with bb.dataflow():
            shp = bb.emit(op.tensor_to_shape(s))
            assert shp.struct_info == ShapeStructInfo(ndim=2)
            shp = bb.match_cast(shp, ShapeStructInfo([a, b]))
            y = bb.emit(op.reshape(x, shp))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get()


def test_tensor_to_shape_reshapes_by_runtime_values():
    vm = relax.VirtualMachine(relax.build(_reshape_by_tensor(), "llvm"), targets.cpu(0))
    rng = np.random.default_rng(0)
    for rows, cols in ((3, 4), (6, 2), (1, 12)):
        x = rng.standard_normal(rows * cols).astype("float32")
        out = vm["main"](x, np.array([rows, cols], dtype="int64")).numpy()
        np.testing.assert_array_equal(out, x.reshape(rows, cols))


def test_tensor_to_shape_checks_its_argument():
    with pytest.raises(relax.RelaxError, match="1-D integer tensor"):
        op.tensor_to_shape(Var("f", TensorStructInfo((2,), "float32")))
    with pytest.raises(relax.RelaxError, match="1-D integer tensor"):
        op.tensor_to_shape(Var("m", TensorStructInfo((2, 2), "int64")))
    unknown = op.tensor_to_shape(Var("u", TensorStructInfo(("k",), "int32")))
    assert unknown.struct_info.ndim == -1


def test_element_count_mismatch_is_an_error_at_run_time():
    vm = relax.VirtualMachine(relax.build(_reshape_by_tensor(), "llvm"), targets.cpu(0))
    with pytest.raises(ValueError, match="element count"):
        vm["main"](np.zeros(12, "float32"), np.array([5, 2], dtype="int64"))
