"""ONNX network operators against onnxruntime: convolution and pooling attribute variants,
normalizations, Gemm / MatMul, softmax opsets."""
import numpy as np
import pytest

from onnx_testutil import check, one_node, rand


@pytest.mark.parametrize("attrs", [
    {"pads": [1, 1, 1, 1]},
    {"strides": [2, 2], "pads": [0, 1, 2, 1]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
    {"auto_pad": "VALID", "dilations": [2, 2]},
    {"group": 2, "pads": [1, 1, 1, 1]},
])
def test_conv2d_variants(attrs):
    rng = np.random.default_rng(0)
    g = attrs.get("group", 1)
    model = one_node("Conv", [("x", "float32", [1, 4, 9, 8])], [("y", "float32", None)],
                     dict(attrs, kernel_shape=[3, 3]),
                     initializers={"w": rand(rng, (6, 4 // g, 3, 3)), "b": rand(rng, (6,))},
                     node_inputs=["x", "w", "b"])
    check(model, [rand(rng, (1, 4, 9, 8))], rtol=1e-4, atol=1e-5)


def test_conv1d_conv3d_and_symbolic_batch():
    rng = np.random.default_rng(1)
    model = one_node("Conv", [("x", "float32", ["n", 3, 10])], [("y", "float32", None)],
                     {"pads": [1, 2], "strides": [2]}, initializers={"w": rand(rng, (4, 3, 3))},
                     node_inputs=["x", "w"])
    for n in (1, 3):
        check(model, [rand(rng, (n, 3, 10))], rtol=1e-4, atol=1e-5)
    model = one_node("Conv", [("x", "float32", [1, 2, 4, 5, 6])], [("y", "float32", None)],
                     {"pads": [1, 0, 1, 1, 0, 1]}, initializers={"w": rand(rng, (3, 2, 3, 2, 3))},
                     node_inputs=["x", "w"])
    check(model, [rand(rng, (1, 2, 4, 5, 6))], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    {"strides": [2, 2]},
    {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    {"strides": [3, 2], "output_shape": [10, 8]},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"group": 2, "dilations": [2, 1]},
])
def test_conv_transpose(attrs):
    rng = np.random.default_rng(2)
    g = attrs.get("group", 1)
    model = one_node("ConvTranspose", [("x", "float32", [1, 4, 3, 4])], [("y", "float32", None)],
                     attrs, initializers={"w": rand(rng, (4, 6 // g, 3, 3)), "b": rand(rng, (6,))},
                     node_inputs=["x", "w", "b"])
    check(model, [rand(rng, (1, 4, 3, 4))], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0], "dilations": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
])
def test_max_pool_variants_and_indices(attrs):
    rng = np.random.default_rng(3)
    x = rand(rng, (2, 3, 7, 8))
    check(one_node("MaxPool", [("x", "float32", [2, 3, 7, 8])], [("y", "float32", None)],
                   attrs, opset=12), [x])
    check(one_node("MaxPool", [("x", "float32", [2, 3, 7, 8])],
                   [("y", "float32", None), ("i", "int64", None)], attrs, opset=12), [x])


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1,
     "count_include_pad": 1},
])
def test_average_pool_variants(attrs):
    rng = np.random.default_rng(4)
    check(one_node("AveragePool", [("x", "float32", [1, 2, 7, 6])], [("y", "float32", None)],
                   attrs, opset=19), [rand(rng, (1, 2, 7, 6))], rtol=1e-5, atol=1e-6)


def test_global_and_lp_pools():
    rng = np.random.default_rng(5)
    x = rand(rng, (2, 3, 5, 4))
    for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        check(one_node(op, [("x", "float32", [2, 3, 5, 4])], [("y", "float32", None)]), [x],
              rtol=1e-5, atol=1e-6)
    check(one_node("LpPool", [("x", "float32", [2, 3, 5, 4])], [("y", "float32", None)],
                   {"kernel_shape": [2, 2], "p": 3}, opset=18), [x], rtol=1e-5, atol=1e-6)


def test_normalizations():
    rng = np.random.default_rng(6)
    x = rand(rng, (2, 4, 3, 5))
    c = {"s": rand(rng, (4,), lo=0.5, hi=1.5), "b": rand(rng, (4,)), "m": rand(rng, (4,)),
         "v": rand(rng, (4,), lo=0.5, hi=1.5)}
    check(one_node("BatchNormalization", [("x", "float32", [2, 4, 3, 5])],
                   [("y", "float32", None)], {"epsilon": 1e-3}, initializers=c,
                   node_inputs=["x", "s", "b", "m", "v"], opset=15), [x], rtol=1e-5, atol=1e-5)
    check(one_node("InstanceNormalization", [("x", "float32", [2, 4, 3, 5])],
                   [("y", "float32", None)], initializers={"s": c["s"], "b": c["b"]},
                   node_inputs=["x", "s", "b"]), [x], rtol=1e-4, atol=1e-5)
    check(one_node("LayerNormalization", [("x", "float32", [2, 4, 3, 5])],
                   [("y", "float32", None)], {"axis": -2},
                   initializers={"s": rand(rng, (3, 5)), "b": rand(rng, (3, 5))},
                   node_inputs=["x", "s", "b"]), [x], rtol=1e-4, atol=1e-5)
    check(one_node("GroupNormalization", [("x", "float32", [2, 4, 3, 5])],
                   [("y", "float32", None)], {"num_groups": 2},
                   initializers={"s": c["s"], "b": c["b"]}, node_inputs=["x", "s", "b"],
                   opset=21), [x], rtol=1e-4, atol=1e-5)
    check(one_node("LRN", [("x", "float32", [2, 4, 3, 5])], [("y", "float32", None)],
                   {"size": 3, "alpha": 1e-2, "beta": 0.7, "bias": 1.5}), [x], rtol=1e-5)
    check(one_node("LpNormalization", [("x", "float32", [2, 4, 3, 5])],
                   [("y", "float32", None)], {"axis": 1, "p": 2}), [x], rtol=1e-5)


def test_layer_norm_mean_and_inv_std_outputs():
    rng = np.random.default_rng(7)
    model = one_node("LayerNormalization", [("x", "float32", ["n", 6])],
                     [("y", "float32", None), ("m", "float32", None), ("r", "float32", None)],
                     initializers={"s": rand(rng, (6,)), "b": rand(rng, (6,))},
                     node_inputs=["x", "s", "b"])
    check(model, [rand(rng, (4, 6))], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [{}, {"transA": 1}, {"transB": 1, "alpha": 0.5, "beta": 2.0},
                                   {"transA": 1, "transB": 1}])
def test_gemm(attrs):
    rng = np.random.default_rng(8)
    a = rand(rng, (5, 4) if attrs.get("transA") else (4, 5))
    b = rand(rng, (3, 5) if attrs.get("transB") else (5, 3))
    model = one_node("Gemm", [("a", "float32", list(a.shape)), ("b", "float32", list(b.shape))],
                     [("y", "float32", None)], attrs, initializers={"c": rand(rng, (3,))},
                     node_inputs=["a", "b", "c"])
    check(model, [a, b], rtol=1e-5, atol=1e-5)


def test_matmul_batched_broadcast_and_einsum():
    rng = np.random.default_rng(9)
    model = one_node("MatMul", [("a", "float32", ["b", 1, 3, 4]), ("c", "float32", [2, 4, 5])],
                     [("y", "float32", None)])
    check(model, [rand(rng, (3, 1, 3, 4)), rand(rng, (2, 4, 5))], rtol=1e-5, atol=1e-5)
    model = one_node("Einsum", [("a", "float32", [2, 3, 4]), ("c", "float32", [2, 4, 5])],
                     [("y", "float32", None)], {"equation": "bij, bjk -> bik"}, opset=12)
    check(model, [rand(rng, (2, 3, 4)), rand(rng, (2, 4, 5))], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_family_by_opset(op, opset):
    rng = np.random.default_rng(10)
    # opset 11 coerces to 2-D at axis 1; opset 13 normalizes along axis 1 only
    model = one_node(op, [("x", "float32", [2, 3, 4])], [("y", "float32", None)], {"axis": 1},
                     opset=opset)
    check(model, [rand(rng, (2, 3, 4), lo=-3, hi=3)], rtol=1e-5, atol=1e-6)


def test_dropout_is_the_identity_at_inference():
    from onnx_testutil import run_tilecraft
    rng = np.random.default_rng(11)
    x = rand(rng, (3, 4))
    model = one_node("Dropout", [("x", "float32", [3, 4])],
                     [("y", "float32", None), ("m", "bool", None)], opset=13)
    check(model, [x])
    # Dropout-10 (ratio attribute): the ONNX reference gives an all-true mask at inference
    # (onnxruntime's legacy kernel gives all-false, so compare with the reference)
    model = one_node("Dropout", [("x", "float32", [3, 4])],
                     [("y", "float32", None), ("m", "bool", None)], {"ratio": 0.3}, opset=10)
    y, m = run_tilecraft(model, [x])
    np.testing.assert_array_equal(y, x)
    assert m.dtype == np.bool_ and m.all()
