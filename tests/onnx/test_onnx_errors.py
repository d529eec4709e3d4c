"""ONNX frontend errors: every unsupported use listed at once, malformed models as ValueError,
never a bare KeyError."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilecraft import relax
import tilecraft.relax.frontend
from tilecraft.relax.frontend import UnsupportedError
from onnx_testutil import make_model, one_node


def _unsupported_model():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="ok_relu"),
             helper.make_node("Det", ["mats"], ["sel"], name="det"),
             helper.make_node("Cast", ["r"], ["s"], to=TensorProto.STRING, name="to_str"),
             helper.make_node("MyOp", ["r"], ["m"], domain="com.example", name="custom"),
             helper.make_node("Unique", ["r"], ["u"], name="uniq")]
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("mats", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("sel", "m", "u")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.example", 1)])


def test_every_unsupported_op_is_listed_at_once():
    with pytest.raises(UnsupportedError) as info:
        relax.frontend.from_onnx(_unsupported_model())
    err = info.value
    text = str(err)
    assert len(err.problems) == 4, err.problems
    for piece in ("'det' (Det, opset 17)", "'uniq' (Unique, opset 17)",
                  "'custom' (MyOp, opset 17)", "com.example", "'to_str' (Cast, opset 17)",
                  "STRING"):
        assert piece in text
    assert "ok_relu" not in text
    assert isinstance(err, NotImplementedError)


def test_input_that_must_be_constant_is_named():
    # a Loop's trip count is unrolled at import time: computed at run time, it is refused and
    # the graph input behind it named
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Add", ["y", "y"], ["y_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", TensorProto.FLOAT, [2])])
    model = one_node("Loop", [("m", "int64", []), ("y0", "float32", [2])],
                     [("y", "float32", None)], {"body": body}, opset=13,
                     node_inputs=["m", "", "y0"])
    with pytest.raises(UnsupportedError, match=r"input 0 \(M, the trip count\) must be known "
                                               r"when the model is imported") as info:
        relax.frontend.from_onnx(model)
    assert info.value.constant_inputs == ["m"]


def test_truncated_and_corrupt_bytes_are_value_errors(tmp_path):
    rng = np.random.default_rng(0)
    model = one_node("MatMul", [("x", "float32", [2, 64])], [("y", "float32", None)],
                     initializers={"w": rng.standard_normal((64, 64)).astype("float32")},
                     node_inputs=["x", "w"])
    data = model.SerializeToString()
    for cut in (len(data) // 3, len(data) // 2, len(data) - 7):
        with pytest.raises(ValueError, match="truncated|invalid|not a valid"):
            relax.frontend.from_onnx(data[:cut])
    with pytest.raises(ValueError, match="not a valid ONNX model"):
        relax.frontend.from_onnx(b"\x08\x07\xff\xff\xff\xff garbage")
    path = tmp_path / "model.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.onnx"):
        relax.frontend.from_onnx(str(path))
    path.write_text("this is not a model")
    with pytest.raises(ValueError):
        relax.frontend.from_onnx(path)
    with pytest.raises(TypeError, match="ModelProto"):
        relax.frontend.from_onnx(42)


def test_structurally_invalid_models():
    model = make_model([helper.make_node("Add", ["x", "missing"], ["y"], name="add")],
                       [("x", "float32", [3])], [("y", "float32", None)])
    with pytest.raises(ValueError, match="'missing'.*no earlier node"):
        relax.frontend.from_onnx(model)
    model = make_model([helper.make_node("Relu", ["x"], ["r"])], [("x", "float32", [3])],
                       [("y", "float32", None)])
    with pytest.raises(ValueError, match="graph output 'y' is not produced"):
        relax.frontend.from_onnx(model)
    # an initializer whose data is shorter than its dims
    t = numpy_helper.from_array(np.zeros((4, 4), "float32"), "w")
    t.raw_data = t.raw_data[:10]
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [t])
    with pytest.raises(ValueError, match="initializer 'w'"):
        relax.frontend.from_onnx(helper.make_model(g, opset_imports=[
            helper.make_opsetid("", 13)]))
    # shapes that cannot go together
    model = one_node("Add", [("a", "float32", [3]), ("b", "float32", [4])],
                     [("y", "float32", None)])
    with pytest.raises(ValueError, match=r"Add.*cannot broadcast"):
        relax.frontend.from_onnx(model)


def test_shape_dict_and_opset_errors():
    model = one_node("Relu", [("x", "float32", ["n", 3])], [("y", "float32", None)])
    with pytest.raises(ValueError, match="not inputs of the model"):
        relax.frontend.from_onnx(model, shape_dict={"nope": [1, 3]})
    with pytest.raises(ValueError, match="rank"):
        relax.frontend.from_onnx(model, shape_dict={"x": [1, 3, 4]})
    with pytest.raises(UnsupportedError, match="opset 99"):
        relax.frontend.from_onnx(model, opset=99)


def test_never_a_bare_key_error():
    """Missing attributes, wrong input counts and odd values come out as clear errors."""
    bad = [
        one_node("Conv", [("x", "float32", [1, 1, 4, 4])], [("y", "float32", None)]),
        one_node("Split", [("x", "float32", [4])], [("a", "float32", None),
                                                    ("b", "float32", None)],
                 {"split": [1, 2, 3]}, opset=11),
        one_node("Gather", [("x", "float32", [4])], [("y", "float32", None)],
                 initializers={"i": np.array([9])}, node_inputs=["x", "i"]),
        one_node("Transpose", [("x", "float32", [2, 3])], [("y", "float32", None)],
                 {"perm": [0, 0]}),
    ]
    for model in bad:
        with pytest.raises((ValueError, UnsupportedError)) as info:
            relax.frontend.from_onnx(model)
        assert not isinstance(info.value, KeyError)
        assert "from_onnx" in str(info.value)
