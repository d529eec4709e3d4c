"""ONNX elementwise operators, activations and casts against onnxruntime (random data)."""
import numpy as np
import pytest

from onnx_testutil import check, one_node, rand


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less",
                                "GreaterOrEqual"])
def test_binary_broadcast_with_symbolic_batch(op):
    rng = np.random.default_rng(0)
    model = one_node(op, [("a", "float32", ["n", 3, 4]), ("b", "float32", [4])],
                     [("y", "bool" if op in ("Equal", "Less", "GreaterOrEqual") else "float32",
                       None)])
    for n in (1, 5):
        a, b = rand(rng, (n, 3, 4)), rand(rng, (4,))
        if op == "Div":
            b = b + np.sign(b) * 0.5
        check(model, [a, b])


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8"])
def test_integer_arithmetic(dtype):
    rng = np.random.default_rng(1)
    lo = 0 if dtype == "uint8" else -50
    for op in ("Add", "Mul", "Div"):
        model = one_node(op, [("a", dtype, [3, 4]), ("b", dtype, [3, 4])], [("y", dtype, None)])
        a = rand(rng, (3, 4), dtype, lo, 50)
        b = rand(rng, (3, 4), dtype, 1, 9)
        check(model, [a, b])


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_mod(fmod, dtype):
    rng = np.random.default_rng(2)
    # floats with fmod=0 (floor semantics) are valid from Mod-28 on
    opset = 28 if dtype == "float32" and fmod == 0 else 13
    model = one_node("Mod", [("a", dtype, [12]), ("b", dtype, [12])], [("y", dtype, None)],
                     {"fmod": fmod}, opset=opset)
    a = rand(rng, (12,), dtype, -20, 20)
    b = rand(rng, (12,), dtype, 1, 7) * np.where(np.arange(12) % 2, 1, -1).astype(dtype)
    check(model, [a, b])


def test_pow_mixed_types():
    rng = np.random.default_rng(3)
    model = one_node("Pow", [("x", "float32", [6]), ("y", "int64", [6])], [("z", "float32", None)],
                     opset=15)
    check(model, [rand(rng, (6,), lo=0.5, hi=2.0), rand(rng, (6,), "int64", 0, 4)])


@pytest.mark.parametrize("op", ["Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Erf", "Sin", "Cos",
                                "Tan", "Atan", "Asin", "Acos", "Sinh", "Cosh", "Asinh", "Acosh",
                                "Atanh", "Floor", "Ceil", "Round", "Abs", "Neg", "Reciprocal",
                                "Sign", "Softsign", "Softplus"])
def test_unary_math(op):
    rng = np.random.default_rng(4)
    lo, hi = {"Log": (0.1, 3), "Sqrt": (0, 3), "Acosh": (1.01, 4), "Asin": (-0.99, 0.99),
              "Acos": (-0.99, 0.99), "Atanh": (-0.95, 0.95)}.get(op, (-3, 3))
    model = one_node(op, [("x", "float32", [4, "m"])], [("y", "float32", None)])
    check(model, [rand(rng, (4, 7), lo=lo, hi=hi)], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("op,attrs", [
    ("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Elu", {"alpha": 0.7}),
    ("Selu", {"alpha": 1.5, "gamma": 1.1}), ("Celu", {"alpha": 0.8}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}),
    ("ThresholdedRelu", {"alpha": 0.4}), ("Shrink", {"lambd": 0.3, "bias": 0.1}),
    ("Mish", {}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"})])
def test_activations(op, attrs):
    rng = np.random.default_rng(5)
    opset = 20 if op == "Gelu" else 18
    model = one_node(op, [("x", "float32", [2, 3, 5])], [("y", "float32", None)], attrs,
                     opset=opset)
    check(model, [rand(rng, (2, 3, 5), lo=-4, hi=4)], rtol=1e-5, atol=1e-5)


def test_prelu_per_channel_slope():
    rng = np.random.default_rng(6)
    model = one_node("PRelu", [("x", "float32", [2, 3, 4, 4])], [("y", "float32", None)],
                     initializers={"slope": rand(rng, (3, 1, 1))}, node_inputs=["x", "slope"])
    check(model, [rand(rng, (2, 3, 4, 4))])


@pytest.mark.parametrize("opset", [6, 13])
def test_clip_attribute_and_input_forms(opset):
    rng = np.random.default_rng(7)
    if opset == 6:
        model = one_node("Clip", [("x", "float32", [10])], [("y", "float32", None)],
                         {"min": -0.3, "max": 0.5}, opset=6)
        check(model, [rand(rng, (10,))])
    else:
        model = one_node("Clip", [("x", "float32", [10]), ("lo", "float32", []),
                                  ("hi", "float32", [])], [("y", "float32", None)], opset=13)
        check(model, [rand(rng, (10,)), np.array(-0.2, "float32"), np.array(0.4, "float32")])


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("int64", "float32"),
                                     ("float32", "bool"), ("bool", "float32"),
                                     ("float64", "float16"), ("int32", "uint8")])
def test_cast(src, dst):
    from onnx_testutil import NP_TO_ONNX
    rng = np.random.default_rng(8)
    model = one_node("Cast", [("x", src, [3, 4])], [("y", dst, None)],
                     {"to": NP_TO_ONNX[np.dtype(dst)]})
    x = rand(rng, (3, 4), src, 0 if dst == "uint8" else -5, 5)
    check(model, [x])


def test_where_isnan_isinf():
    rng = np.random.default_rng(9)
    x = rand(rng, (8,))
    x[1], x[3], x[5] = np.nan, np.inf, -np.inf
    for op, attrs in (("IsNaN", {}), ("IsInf", {}), ("IsInf", {"detect_negative": 0})):
        model = one_node(op, [("x", "float32", [8])], [("y", "bool", None)], attrs)
        check(model, [x])
    model = one_node("Where", [("c", "bool", [8]), ("a", "float32", [8]), ("b", "float32", [1])],
                     [("y", "float32", None)])
    check(model, [rand(rng, (8,), "bool"), rand(rng, (8,)), rand(rng, (1,))])


def test_bitwise_and_shifts():
    rng = np.random.default_rng(10)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        for dtype in ("int32", "uint8"):
            model = one_node(op, [("a", dtype, [9]), ("b", dtype, [9])], [("y", dtype, None)],
                             opset=18)
            lo = 0 if dtype == "uint8" else -1000
            check(model, [rand(rng, (9,), dtype, lo, 255), rand(rng, (9,), dtype, lo, 255)])
    model = one_node("BitwiseNot", [("a", "int16", [5])], [("y", "int16", None)], opset=18)
    check(model, [rand(rng, (5,), "int16", -300, 300)])
    for direction in ("LEFT", "RIGHT"):
        model = one_node("BitShift", [("a", "uint32", [6]), ("b", "uint32", [6])],
                         [("y", "uint32", None)], {"direction": direction}, opset=11)
        check(model, [rand(rng, (6,), "uint32", 0, 1 << 20), rand(rng, (6,), "uint32", 0, 8)])


def test_variadic_sum_mean():
    rng = np.random.default_rng(11)
    for op in ("Sum", "Mean", "Max"):
        model = one_node(op, [("a", "float32", [3, 1]), ("b", "float32", [4]),
                              ("c", "float32", [3, 4])], [("y", "float32", None)])
        check(model, [rand(rng, (3, 1)), rand(rng, (4,)), rand(rng, (3, 4))])
