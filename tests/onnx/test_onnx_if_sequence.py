"""``If`` on a condition computed at run time (a Relax ``If`` whose branches hold the converted
subgraphs) and sequences made inside the graph (tuples of a length known at import time),
against onnxruntime."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from tilecraft import relax
import tilecraft.relax.frontend
from tilecraft import targets
from onnx_testutil import TARGET, make_model, rand, run_onnxruntime


def _vm(model):
    mod = relax.frontend.from_onnx(model)
    return relax.VirtualMachine(relax.build(mod, TARGET), targets.cpu(0))


def _flat(v):
    if isinstance(v, (tuple, list)):
        return [x for e in v for x in _flat(e)]
    return [v.numpy() if hasattr(v, "numpy") else np.asarray(v)]


def _same(vm, model, feeds):
    ours = _flat(vm["main"](*feeds))
    ref = _flat(run_onnxruntime(model, feeds))
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape and a.dtype == b.dtype, (k, a.shape, b.shape, a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=f"output {k}")


def _branch(name, nodes, out, dtype=TensorProto.FLOAT):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, dtype, None)])


def test_if_on_a_run_time_condition_with_branches_of_other_shapes():
    # then: x * 2 ([3, 4]); else: x transposed ([4, 3]): the result's dims are fresh, set by
    # the branch taken
    then = _branch("then", [helper.make_node("Add", ["x", "x"], ["t"])], "t")
    other = _branch("else", [helper.make_node("Transpose", ["x"], ["e"], perm=[1, 0])], "e")
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Relu", ["y"], ["z"])]
    model = make_model(nodes, [("x", "float32", [3, 4])], [("z", "float32", None)],
                       {"zero": np.array(0.0, np.float32)}, opset=17)
    vm = _vm(model)
    rng = np.random.default_rng(3)
    for sign in (1.0, -1.0, 1.0):
        x = (sign * np.abs(rand(rng, (3, 4)))).astype(np.float32)
        _same(vm, model, [x])


def test_if_on_a_graph_input_with_two_results():
    then = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("Neg", ["x"], ["b"])],
        "then", [], [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 5]),
                     helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 5])])
    other = helper.make_graph(
        [helper.make_node("Sub", ["x", "x"], ["c"]), helper.make_node("Exp", ["x"], ["d"])],
        "else", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 5]),
                     helper.make_tensor_value_info("d", TensorProto.FLOAT, [2, 5])])
    model = make_model([helper.make_node("If", ["cond"], ["p", "q"], then_branch=then,
                                         else_branch=other)],
                       [("cond", "bool", []), ("x", "float32", [2, 5])],
                       [("p", "float32", [2, 5]), ("q", "float32", [2, 5])], opset=17)
    vm = _vm(model)
    x = rand(np.random.default_rng(4), (2, 5))
    for cond in (True, False):
        _same(vm, model, [np.array(cond), x])


def test_if_branches_of_other_ranks_are_refused():
    then = _branch("then", [helper.make_node("Identity", ["x"], ["t"])], "t")
    other = _branch("else", [helper.make_node("Flatten", ["x"], ["e"], axis=0)], "e")
    model = make_model([helper.make_node("If", ["cond"], ["y"], then_branch=then,
                                         else_branch=other)],
                       [("cond", "bool", []), ("x", "float32", [2, 3, 4])],
                       [("y", "float32", None)], opset=17)
    with pytest.raises(relax.frontend.UnsupportedError, match="the branches must agree on dtype and rank"):
        relax.frontend.from_onnx(model)


def test_split_to_sequence_at_insert_and_concat():
    # torch.split as torch.onnx.export writes it, then the sequence edited and concatenated
    seq = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)
    nodes = [helper.make_node("SplitToSequence", ["x", "sizes"], ["s"], axis=1),
             helper.make_node("SequenceAt", ["s", "one"], ["mid"]),
             helper.make_node("SequenceInsert", ["s", "y"], ["s2"]),
             helper.make_node("SequenceErase", ["s2", "zero"], ["s3"]),
             helper.make_node("ConcatFromSequence", ["s3"], ["cat"], axis=1),
             helper.make_node("SequenceLength", ["s3"], ["n"]),
             helper.make_node("SequenceConstruct", ["mid", "y"], ["seq"])]
    g = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cat", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("n", TensorProto.INT64, None), seq],
        [helper.make_tensor(k, TensorProto.INT64, np.shape(v), np.ravel(v))
         for k, v in {"sizes": [1, 3, 2], "one": 1, "zero": 0}.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    vm = _vm(model)
    rng = np.random.default_rng(5)
    _same(vm, model, [rand(rng, (2, 6)), rand(rng, (2, 3))])


def test_sequence_input_is_refused():
    g = helper.make_graph(
        [helper.make_node("SequenceLength", ["s"], ["n"])], "test",
        [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("n", TensorProto.INT64, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(relax.frontend.UnsupportedError, match="is a sequence input"):
        relax.frontend.from_onnx(model)
