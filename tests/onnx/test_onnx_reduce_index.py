"""ONNX reductions and indexing operators against onnxruntime (opset variants of the axes)."""
import numpy as np
import pytest

from onnx_testutil import check, one_node, rand


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                                "ReduceLogSumExp"])
@pytest.mark.parametrize("opset", [11, 18])
def test_reductions_axes_attribute_and_input(op, opset):
    rng = np.random.default_rng(0)
    x = rand(rng, (3, 4, 5), lo=0.2, hi=1.5)
    if opset >= 18 or (op == "ReduceSum" and opset >= 13):
        model = one_node(op, [("x", "float32", [3, "n", 5])], [("y", "float32", None)],
                         {"keepdims": 0}, initializers={"a": np.array([0, -1])},
                         node_inputs=["x", "a"], opset=opset)
    else:
        model = one_node(op, [("x", "float32", [3, "n", 5])], [("y", "float32", None)],
                         {"axes": [0, -1], "keepdims": 0}, opset=opset)
    check(model, [x], rtol=1e-5, atol=1e-6)


def test_reduce_all_axes_keepdims_and_noop():
    rng = np.random.default_rng(1)
    x = rand(rng, (2, 3))
    check(one_node("ReduceMean", [("x", "float32", [2, 3])], [("y", "float32", None)],
                   opset=13), [x])
    check(one_node("ReduceSum", [("x", "float32", [2, 3])], [("y", "float32", None)],
                   {"noop_with_empty_axes": 1}, opset=13), [x])


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_reductions(op, last):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 3, (4, 5)).astype("float32")   # ties
    check(one_node(op, [("x", "float32", [4, 5])], [("y", "int64", None)],
                   {"axis": 1, "keepdims": 0, "select_last_index": last}, opset=13), [x])


def test_topk_cumsum_cumprod():
    rng = np.random.default_rng(3)
    x = rand(rng, (3, 6))
    for largest in (0, 1):
        check(one_node("TopK", [("x", "float32", [3, 6])],
                       [("v", "float32", None), ("i", "int64", None)], {"largest": largest},
                       initializers={"k": np.array([3])}, node_inputs=["x", "k"], opset=11), [x])
    for excl, rev in ((0, 0), (1, 0), (0, 1), (1, 1)):
        check(one_node("CumSum", [("x", "float32", [3, 6])], [("y", "float32", None)],
                       {"exclusive": excl, "reverse": rev}, initializers={"a": np.array(1)},
                       node_inputs=["x", "a"], opset=14), [x], rtol=1e-5, atol=1e-6)


def test_gather_negative_indices_and_gather_elements_nd():
    rng = np.random.default_rng(4)
    x = rand(rng, (5, 4, 3))
    check(one_node("Gather", [("x", "float32", [5, 4, 3]), ("i", "int64", [2, 2])],
                   [("y", "float32", None)], {"axis": 1}), [x, np.array([[0, -1], [-4, 2]])])
    check(one_node("GatherElements", [("x", "float32", [5, 4, 3]), ("i", "int64", [5, 2, 3])],
                   [("y", "float32", None)], {"axis": 1}),
          [x, rng.integers(-4, 4, (5, 2, 3))])
    check(one_node("GatherND", [("x", "float32", [5, 4, 3]), ("i", "int64", [5, 2, 1])],
                   [("y", "float32", None)], {"batch_dims": 1}, opset=13),
          [x, rng.integers(0, 4, (5, 2, 1))])
    check(one_node("GatherND", [("x", "float32", [5, 4, 3]), ("i", "int64", [2, 2])],
                   [("y", "float32", None)], opset=13), [x, np.array([[1, -1], [4, 0]])])


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max"])
def test_scatter_elements_and_nd(reduction):
    rng = np.random.default_rng(5)
    opset = 18
    x = rand(rng, (4, 5))
    idx = np.array([[0, 3, -1], [2, 1, 4]])
    check(one_node("ScatterElements", [("x", "float32", [4, 5]), ("i", "int64", [2, 3]),
                                       ("u", "float32", [2, 3])], [("y", "float32", None)],
                   {"axis": 1, "reduction": reduction}, opset=opset),
          [x, idx, rand(rng, (2, 3))])
    check(one_node("ScatterND", [("x", "float32", [4, 5]), ("i", "int64", [2, 1]),
                                 ("u", "float32", [2, 5])], [("y", "float32", None)],
                   {"reduction": reduction}, opset=opset),
          [x, np.array([[3], [0]]), rand(rng, (2, 5))])


def test_one_hot_compress_reverse_sequence():
    rng = np.random.default_rng(6)
    check(one_node("OneHot", [("i", "int64", [2, 3])], [("y", "float32", None)], {"axis": 1},
                   initializers={"d": np.array(4), "v": np.array([-1.0, 2.0], "float32")},
                   node_inputs=["i", "d", "v"], opset=11), [np.array([[0, 3, -1], [2, 1, -4]])])
    x = rand(rng, (4, 3))
    check(one_node("Compress", [("x", "float32", [4, 3])], [("y", "float32", None)], {"axis": 0},
                   initializers={"c": np.array([True, False, True, True])},
                   node_inputs=["x", "c"]), [x])
    check(one_node("ReverseSequence", [("x", "float32", [4, 3, 2]), ("l", "int64", [3])],
                   [("y", "float32", None)], {"batch_axis": 1, "time_axis": 0}),
          [rand(rng, (4, 3, 2)), np.array([4, 1, 3])])
