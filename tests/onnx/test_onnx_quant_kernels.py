"""Quantized ONNX models compile to the int8 / int4 kernels: QDQ models from onnxruntime's
static quantizer, MatMulInteger models from its dynamic quantizer, and com.microsoft.MatMulNBits
(4-bit) models; each checked against onnxruntime running the same quantized model."""
from __future__ import annotations


import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx is not installed")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tilecraft import relax, targets  # noqa: E402
import tilecraft.relax.frontend  # noqa: E402,F401
from tilecraft.relax.frontend.onnx.lowbit import matmul_nbits_model  # noqa: E402

CPU = targets.cpu(0)


def convnet(rng):
    w1 = rng.normal(0, 0.3, (8, 4, 3, 3)).astype("float32")
    b1 = rng.normal(0, 0.1, (8,)).astype("float32")
    w2 = rng.normal(0, 0.1, (8 * 3 * 3, 10)).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "w2"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                          [numpy_helper.from_array(a, n) for a, n in
                           ((w1, "w1"), (b1, "b1"), (w2, "w2"))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def compare(path_or_model, feeds, kernel, exact=True):
    model = onnx.load(path_or_model) if isinstance(path_or_model, str) else path_or_model
    exe = relax.build(relax.frontend.from_onnx(model), "llvm")
    assert any(kernel in k for k in exe.kernel_names), exe.kernel_names
    vm = relax.VirtualMachine(exe, CPU)
    sess = ort.InferenceSession(model.SerializeToString())
    for x in feeds:
        got = vm["main"](x).numpy()
        want = sess.run(None, {"x": x})[0]
        if exact:
            # the same integer arithmetic and rounding: equal up to float32 reassociation
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        else:
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("activation", ["QUInt8", "QInt8"])
def test_qdq_static_model_runs_the_int8_kernels(tmp_path, activation):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    rng = np.random.default_rng(0)
    fp = str(tmp_path / "f.onnx")
    onnx.save(convnet(rng), fp)
    xs = [rng.normal(size=(1, 4, 6, 6)).astype("float32") for _ in range(6)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": x} for x in xs])

        def get_next(self):
            return next(self.it, None)
    qp = str(tmp_path / "q.onnx")
    quantize_static(fp, qp, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=getattr(QuantType, activation),
                    weight_type=QuantType.QInt8)
    compare(qp, xs[:3], "dense_u8i8")


def test_dynamic_quantized_model_runs_the_int8_kernels(tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic
    rng = np.random.default_rng(1)
    fp = str(tmp_path / "f.onnx")
    onnx.save(convnet(rng), fp)
    qp = str(tmp_path / "d.onnx")
    quantize_dynamic(fp, qp, weight_type=QuantType.QInt8)
    compare(qp, [rng.normal(size=(1, 4, 6, 6)).astype("float32") for _ in range(3)],
            "dense_u8i8")


def matmul_model(k, n, bias=False):
    rng = np.random.default_rng(k)
    w = rng.normal(0, 0.3, (k, n)).astype("float32")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y" if not bias else "h"])]
    inits = [numpy_helper.from_array(w, "w")]
    if bias:
        nodes.append(helper.make_node("Add", ["h", "b"], ["y"]))
        inits.append(numpy_helper.from_array(rng.normal(size=n).astype("float32"), "b"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     ["m", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("k,n,block,symmetric", [(96, 40, 32, True), (96, 40, 32, False),
                                                 (200, 17, 128, True), (256, 33, 16, False)])
def test_matmul_nbits_model(k, n, block, symmetric):
    q = matmul_nbits_model(matmul_model(k, n, bias=True), block, symmetric)
    assert [nd.op_type for nd in q.graph.node] == ["MatMulNBits", "Add"]
    rng = np.random.default_rng(2)
    compare(q, [rng.normal(size=(m, k)).astype("float32") for m in (1, 4)], "dense_q4",
            exact=False)


def test_matmul_nbits_errors():
    q = matmul_nbits_model(matmul_model(64, 8), 32)
    node = q.graph.node[0]
    for a in node.attribute:
        if a.name == "bits":
            a.i = 3
    with pytest.raises(Exception, match="bits=3 is not supported"):
        relax.frontend.from_onnx(q)
    q.graph.node[0].op_type = "MatMulFourBits"
    with pytest.raises(Exception, match="com.microsoft.MatMulFourBits is not supported"):
        relax.frontend.from_onnx(q)
