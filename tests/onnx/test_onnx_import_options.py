"""from_onnx options: keep_params_in_input with detach_params, the opset override, old opsets,
models given as bytes or paths, model-local functions."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tilecraft import relax
from tilecraft import relax
import tilecraft.relax.frontend
from tilecraft import targets
from onnx_testutil import TARGET, check, make_model, one_node, rand, run_onnxruntime


def _mlp(rng):
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["y"])]
    return make_model(nodes, [("x", "float32", ["n", 4])], [("y", "float32", None)],
                      {"w1": rand(rng, (4, 6)), "b1": rand(rng, (6,)),
                       "shape": np.array([-1, 3], np.int64)})


def test_keep_params_in_input_and_detach_params():
    rng = np.random.default_rng(0)
    model = _mlp(rng)
    mod = relax.frontend.from_onnx(model, keep_params_in_input=True)
    main = mod["main"]
    assert [p.name_hint for p in main.params] == ["x", "w1", "b1"]   # the int shape stays
    assert main.attr_dict["num_input"] == 1
    mod, params = relax.frontend.detach_params(mod)
    assert "params" not in mod["main"].attr_dict
    assert [p.shape for p in params["main"]] == [(4, 6), (6,)]
    vm = relax.VirtualMachine(relax.build(mod, TARGET), targets.cpu(0))
    x = rand(rng, (5, 4))
    (ref,) = run_onnxruntime(model, [x])
    np.testing.assert_allclose(vm["main"](x, *params["main"]).numpy(), ref, rtol=1e-5)
    # other weights of the same shapes: the same executable
    w1, b1 = rand(rng, (4, 6)), rand(rng, (6,))
    out = vm["main"](x, w1, b1).numpy()
    np.testing.assert_allclose(out, np.maximum(x @ w1 + b1, 0).reshape(-1, 3), rtol=1e-5)


def test_model_as_bytes_and_path(tmp_path):
    rng = np.random.default_rng(1)
    model = _mlp(rng)
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    x = rand(rng, (2, 4))
    (ref,) = run_onnxruntime(model, [x])
    for source in (model.SerializeToString(), str(path), path):
        mod = relax.frontend.from_onnx(source)
        vm = relax.VirtualMachine(relax.build(mod, TARGET), targets.cpu(0))
        np.testing.assert_allclose(vm["main"](x).numpy(), ref, rtol=1e-5)


def test_opset_override_and_old_opsets():
    rng = np.random.default_rng(2)
    x = rand(rng, (2, 3, 4))
    # Softmax of opset 11 (2-D coercion) read as opset 13 (one axis) gives another result
    model = one_node("Softmax", [("x", "float32", [2, 3, 4])], [("y", "float32", None)],
                     {"axis": 1}, opset=11)
    mod = relax.frontend.from_onnx(model, opset=13)
    vm = relax.VirtualMachine(relax.build(mod, TARGET), targets.cpu(0))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(vm["main"](x).numpy(), e / e.sum(axis=1, keepdims=True),
                               rtol=1e-5)
    # an opset-1 model whose operators are the same at opset 7 imports
    old = one_node("Not", [("b", "bool", [4])], [("y", "bool", None)], opset=1)
    check(old, [np.array([True, False, True, True])])
    # one whose operator changed does not, and the error says how to upgrade it
    older = one_node("Add", [("a", "float32", [4]), ("c", "float32", [4])],
                     [("y", "float32", None)], opset=5)
    with pytest.raises(relax.frontend.UnsupportedError, match="version_converter"):
        relax.frontend.from_onnx(older)


def test_model_local_functions_are_inlined():
    fn = helper.make_function("local", "Scale2", ["a"], ["b"],
                              [helper.make_node("Add", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("Scale2", ["x"], ["y"], domain="local")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, functions=[fn], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    mod = relax.frontend.from_onnx(model)
    vm = relax.VirtualMachine(relax.build(mod, TARGET), targets.cpu(0))
    x = np.arange(3, dtype="float32")
    np.testing.assert_allclose(vm["main"](x).numpy(), 2 * x)


def test_lowbit_types_at_the_vm_boundary(tmp_path):
    """bfloat16 / float8 / int4 values come in and go out as ml_dtypes arrays (their storage
    dtype is accepted too); the types survive export_library / load_executable."""
    import ml_dtypes
    rng = np.random.default_rng(3)
    model = one_node("Cast", [("x", "float32", [8])], [("y", "float32", None)],
                     {"to": TensorProto.FLOAT8E4M3FN})
    x = rand(rng, (8,), lo=-500, hi=500)
    mod = relax.frontend.from_onnx(model)
    vm = relax.VirtualMachine(relax.build(mod, TARGET), targets.cpu(0))
    y = vm["main"](x)
    assert y.dtype == "float8_e4m3fn"
    ref = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn)   # saturate=1
    np.testing.assert_array_equal(y.numpy().view(np.uint8), ref.view(np.uint8))

    # a bfloat16 input, a float32 and an int4 output (a tuple result)
    g = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["x", "x"], ["twice"]),
         helper.make_node("Cast", ["f"], ["q"], to=TensorProto.INT4)], "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [6])],
        [helper.make_tensor_value_info("f", TensorProto.FLOAT, [6]),
         helper.make_tensor_value_info("twice", TensorProto.BFLOAT16, [6]),
         helper.make_tensor_value_info("q", TensorProto.INT4, [6])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    exe = relax.build(relax.frontend.from_onnx(model), TARGET)
    path = str(tmp_path / "bf16.so")
    exe.export_library(path)
    xb = rng.integers(-8, 8, 6).astype(np.float32).astype(ml_dtypes.bfloat16)
    for e in (exe, relax.load_executable(path)):
        vm = relax.VirtualMachine(e, targets.cpu(0))
        for arg in (xb, xb.view(np.uint16)):      # ml_dtypes, or the storage as before
            f, twice, q = (o.numpy() for o in vm["main"](arg))
            assert (f.dtype, twice.dtype, q.dtype) == (np.float32, xb.dtype,
                                                       np.dtype(ml_dtypes.int4))
            np.testing.assert_array_equal(f, xb.astype(np.float32))
            np.testing.assert_array_equal(twice, (xb.astype(np.float32) * 2).astype(xb.dtype))
            np.testing.assert_array_equal(q.astype(np.int8), xb.astype(np.int8))
    with pytest.raises(relax.VMArgumentError, match="must be a bfloat16 array"):
        vm["main"](np.zeros(6, np.float32))
