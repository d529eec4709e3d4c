"""ONNX recurrent layers, control flow and quantization against onnxruntime."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_testutil import check, make_model, one_node, rand


def _rnn_weights(rng, gates, dirs, hidden, inp):
    return {"W": rand(rng, (dirs, gates * hidden, inp), lo=-0.5, hi=0.5),
            "R": rand(rng, (dirs, gates * hidden, hidden), lo=-0.5, hi=0.5),
            "B": rand(rng, (dirs, 2 * gates * hidden), lo=-0.5, hi=0.5)}


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm(direction):
    rng = np.random.default_rng(0)
    dirs = 2 if direction == "bidirectional" else 1
    w = _rnn_weights(rng, 4, dirs, 5, 3)
    w["P"] = rand(rng, (dirs, 15), lo=-0.5, hi=0.5)
    model = one_node("LSTM", [("x", "float32", [6, 2, 3])],
                     [("y", "float32", None), ("h", "float32", None), ("c", "float32", None)],
                     {"hidden_size": 5, "direction": direction}, initializers=w,
                     node_inputs=["x", "W", "R", "B", "", "", "", "P"], opset=14)
    check(model, [rand(rng, (6, 2, 3))], rtol=1e-4, atol=1e-5)


def test_lstm_sequence_lens_initial_state_and_layout():
    from onnx_testutil import run_onnxruntime, run_tilecraft
    rng = np.random.default_rng(1)
    w = _rnn_weights(rng, 4, 2, 4, 3)

    def model(layout):
        xs = [2, 5, 3] if layout else [5, 2, 3]
        return one_node("LSTM", [("x", "float32", xs), ("lens", "int32", [2]),
                                 ("h0", "float32", [2, 2, 4]), ("c0", "float32", [2, 2, 4])],
                        [("y", "float32", None), ("h", "float32", None)],
                        {"hidden_size": 4, "direction": "bidirectional", "layout": layout},
                        initializers=w, node_inputs=["x", "W", "R", "B", "lens", "h0", "c0"],
                        opset=14)
    x = rand(rng, (5, 2, 3))
    lens = np.array([5, 3], "int32")
    h0, c0 = rand(rng, (2, 2, 4)), rand(rng, (2, 2, 4))
    ref = check(model(0), [x, lens, h0, c0], rtol=1e-4, atol=1e-5)
    # layout 1 (batch-major; onnxruntime has no kernel for it): the same result, transposed
    y, h = run_tilecraft(model(1), [x.transpose(1, 0, 2), lens, h0.transpose(1, 0, 2),
                                    c0.transpose(1, 0, 2)])
    np.testing.assert_allclose(y, ref[0].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h, ref[1].transpose(1, 0, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru(lbr):
    rng = np.random.default_rng(2)
    w = _rnn_weights(rng, 3, 1, 4, 3)
    model = one_node("GRU", [("x", "float32", [5, 2, 3])],
                     [("y", "float32", None), ("h", "float32", None)],
                     {"hidden_size": 4, "linear_before_reset": lbr}, initializers=w,
                     node_inputs=["x", "W", "R", "B"], opset=14)
    check(model, [rand(rng, (5, 2, 3))], rtol=1e-4, atol=1e-5)


def test_rnn_with_activations_and_clip():
    rng = np.random.default_rng(3)
    w = _rnn_weights(rng, 1, 1, 4, 3)
    model = one_node("RNN", [("x", "float32", [4, 2, 3])],
                     [("y", "float32", None), ("h", "float32", None)],
                     {"hidden_size": 4, "activations": ["Relu"], "clip": 0.6}, initializers=w,
                     node_inputs=["x", "W", "R", "B"], opset=14)
    check(model, [rand(rng, (4, 2, 3))], rtol=1e-4, atol=1e-5)


def _graph(nodes, inputs, outputs, inits=None):
    return helper.make_graph(nodes, "body", inputs, outputs, inits or [])


def test_if_with_constant_condition():
    then_g = _graph([helper.make_node("Mul", ["x", "two"], ["t"])], [],
                    [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
                    [numpy_helper.from_array(np.array(2.0, "float32"), "two")])
    else_g = _graph([helper.make_node("Neg", ["x"], ["e"])], [],
                    [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    rng = np.random.default_rng(4)
    for cond in (True, False):
        model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then_g,
                                             else_branch=else_g)],
                           [("x", "float32", ["n"])], [("y", "float32", None)],
                           {"c": np.array(cond)}, opset=13)
        check(model, [rand(rng, (5,))])


def test_loop_with_static_trip_count_and_scan_output():
    body = _graph([helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
                   helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                   helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
                   helper.make_node("Mul", ["acc_out", "fi"], ["scan"])],
                  [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                   helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                   helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3])],
                  [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                   helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3]),
                   helper.make_tensor_value_info("scan", TensorProto.FLOAT, [3])])
    model = make_model([helper.make_node("Loop", ["M", "cond", "a0"], ["a", "s"], body=body)],
                       [("x", "float32", [3]), ("a0", "float32", [3])],
                       [("a", "float32", None), ("s", "float32", None)],
                       {"M": np.array(4), "cond": np.array(True)}, opset=13)
    rng = np.random.default_rng(5)
    check(model, [rand(rng, (3,)), rand(rng, (3,))])


def test_scan_running_sum():
    body = _graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                   helper.make_node("Identity", ["s_out"], ["y_t"])],
                  [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2]),
                   helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [2])],
                  [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2]),
                   helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [2])])
    model = make_model([helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body,
                                         num_scan_inputs=1, scan_input_directions=[1])],
                       [("s0", "float32", [2]), ("xs", "float32", [5, 2])],
                       [("s", "float32", None), ("ys", "float32", None)], opset=16)
    rng = np.random.default_rng(6)
    check(model, [rand(rng, (2,)), rand(rng, (5, 2))])


@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_dequantize(per_axis):
    rng = np.random.default_rng(7)
    scale = rand(rng, (3,) if per_axis else (), lo=0.01, hi=0.05)
    zp = np.array([3, 128, 200] if per_axis else 100, dtype="uint8")
    x = rand(rng, (2, 3, 4), lo=-4, hi=4)
    check(one_node("QuantizeLinear", [("x", "float32", [2, 3, 4])], [("y", "uint8", None)],
                   {"axis": 1}, initializers={"s": scale, "z": zp},
                   node_inputs=["x", "s", "z"], opset=13), [x])
    q = rng.integers(0, 255, (2, 3, 4)).astype("uint8")
    check(one_node("DequantizeLinear", [("q", "uint8", [2, 3, 4])], [("y", "float32", None)],
                   {"axis": 1}, initializers={"s": scale, "z": zp},
                   node_inputs=["q", "s", "z"], opset=13), [q])


def test_int8_matmuls_and_convs():
    rng = np.random.default_rng(8)
    a = rng.integers(-128, 127, (4, 6)).astype("int8")
    b = rng.integers(-128, 127, (6, 3)).astype("int8")
    check(one_node("MatMulInteger", [("a", "int8", [4, 6]), ("b", "int8", [6, 3])],
                   [("y", "int32", None)], initializers={"za": np.array(3, "int8"),
                                                         "zb": np.array(-2, "int8")},
                   node_inputs=["a", "b", "za", "zb"], opset=10), [a, b])
    au = rng.integers(0, 255, (4, 6)).astype("uint8")
    bu = rng.integers(0, 255, (6, 3)).astype("uint8")
    inits = {"as": np.array(0.02, "float32"), "az": np.array(120, "uint8"),
             "bs": np.array(0.03, "float32"), "bz": np.array(110, "uint8"),
             "ys": np.array(0.5, "float32"), "yz": np.array(128, "uint8")}
    check(one_node("QLinearMatMul", [("a", "uint8", [4, 6]), ("b", "uint8", [6, 3])],
                   [("y", "uint8", None)], initializers=inits,
                   node_inputs=["a", "as", "az", "b", "bs", "bz", "ys", "yz"], opset=10),
          [au, bu])
    x = rng.integers(0, 255, (1, 2, 5, 5)).astype("uint8")
    w = rng.integers(0, 255, (3, 2, 3, 3)).astype("uint8")
    inits = {"xs": np.array(0.02, "float32"), "xz": np.array(120, "uint8"),
             "w": w, "ws": np.array(0.01, "float32"), "wz": np.array(100, "uint8"),
             "ys": np.array(0.3, "float32"), "yz": np.array(90, "uint8"),
             "b": rng.integers(-50, 50, (3,)).astype("int32")}
    check(one_node("QLinearConv", [("x", "uint8", [1, 2, 5, 5])], [("y", "uint8", None)],
                   {"pads": [1, 1, 1, 1]}, initializers=inits,
                   node_inputs=["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], opset=10),
          [x])
    check(one_node("ConvInteger", [("x", "uint8", [1, 2, 5, 5])], [("y", "int32", None)],
                   initializers={"w": w, "xz": np.array(120, "uint8")},
                   node_inputs=["x", "w", "xz"], opset=10), [x])


def test_dynamic_quantize_linear():
    rng = np.random.default_rng(9)
    model = one_node("DynamicQuantizeLinear", [("x", "float32", [3, 4])],
                     [("y", "uint8", None), ("s", "float32", None), ("z", "uint8", None)],
                     opset=11)
    check(model, [rand(rng, (3, 4), lo=-2, hi=5)])
